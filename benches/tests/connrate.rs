//! The connection-rate tool counts only redirected connections: it succeeds through our rules
//! and fails loudly without them (kernel; root).

use std::process::Command;

use redirect_benches::{sidecar_default, with_excluded};
use redirect_testkit::{kernel_test, TestNetns};

const BIN: &str = env!("CARGO_BIN_EXE_connrate");

/// A pod namespace where 10.0.0.0/8 is routable, as `benches/connrate.sh` makes it.
fn pod() -> TestNetns {
    let ns = TestNetns::new();
    ns.sh("ip link add v0 type veth peer name v1 && ip addr add 10.99.0.2/24 dev v0 \
           && ip link set v0 up && ip link set v1 up && ip route add 10.0.0.0/8 via 10.99.0.1 dev v0");
    ns
}

fn connrate(ns: &TestNetns) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(["--netns", ns.path().to_str().unwrap(), "--seconds", "0.3"])
        .output()
        .expect("run connrate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn field(json: &str, key: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("one JSON line");
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {json}"))
}

#[kernel_test]
fn counts_redirected_connections_and_fails_without_rules() {
    for cfg in [sidecar_default(), with_excluded(10_000)] {
        let ns = pod();
        let config = cfg.validated().expect("valid");
        redirect_core::Namespace::open(ns.path())
            .and_then(|pod| pod.apply(&redirect_core::Capture::Sidecar(config.clone())))
            .expect("apply");
        let (code, out, err) = connrate(&ns);
        assert_eq!(code, 0, "stdout {out} stderr {err}");
        let n = field(&out, "connections");
        assert!(n > 10, "only {n} connections: {out}");
        assert_eq!(field(&out, "failures"), 0, "{out}");
        assert_eq!(field(&out, "accepted"), n, "{out}");
    }

    let bare = pod();
    let (code, out, err) = connrate(&bare);
    assert_eq!(code, 1, "without rules: stdout {out} stderr {err}");
    assert!(err.contains("are the capture rules loaded?"), "{err}");
}

#[test]
fn bad_arguments_name_the_value() {
    let out = Command::new(BIN)
        .args(["--netns", "/run/netns/x", "--seconds", "soon"])
        .output()
        .expect("run connrate");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--seconds") && err.contains("\"soon\""),
        "{err}"
    );
}
