//! The test pods' binary, as the real node's pods run it: a bad command line is refused with
//! its usage, and in a fresh network namespace the app's connection to the proxy stand-in
//! lands and says so (`landed <port> direct`: not redirected). Being an integration test, it
//! also makes `cargo test` build the binary itself beside the other test binaries, where the
//! real node's and the agent's tests look for it (else they build it alone, with other
//! features: minutes).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redirect_testkit::{kernel_test, TestNetns};

const BIN: &str = env!("CARGO_BIN_EXE_testpod");

#[test]
fn a_bad_command_line_is_refused_with_the_usage() {
    let out = Command::new(BIN).arg("dance").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("usage: testpod listen"), "{err}");
}

#[kernel_test]
fn the_app_reaches_the_proxy_stand_in_and_prints_where_it_landed() {
    let ns = TestNetns::new();
    ns.sh("ip link set lo up");
    let mut proxy = Command::new("ip")
        .args(["netns", "exec", ns.name(), BIN, "listen", "15001"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let answer = loop {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns.name(),
                BIN,
                "connect",
                "127.0.0.1:15001",
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() || started.elapsed() > Duration::from_secs(10) {
            break said;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(answer.contains("landed 15001 direct"), "{answer:?}");
}
