//! The examples a Rust user copies (`redirect-core/examples/`) run and do what they say:
//! `plan` prints Istio's default rules and refuses a bad config by name; `capture` applies,
//! proves and removes capture in a fresh namespace; `ambient` does the same with ambient's
//! in-pod rules in a pod's namespace and the probe SNAT in a host's (kernel tests).

use std::path::PathBuf;
use std::process::{Command, Output};

use redirect_testkit::{kernel_test, TestNetns};

/// The example's binary, built by `cargo test` beside this test's (built here when missing).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let bin = profile_dir.join("examples").join(name);
    if !bin.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo)
            .args(["build", "-p", "redirect-core", "--example", name])
            .status()
            .unwrap();
        assert!(built.success(), "cargo build --example {name}");
    }
    bin
}

fn run(name: &str, args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(example(name)).args(args).output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn plan_prints_istios_default_rules() {
    let (code, out, err) = run("plan", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("table inet redirect_capture {"), "{out}");
    assert!(out.contains("15020, 15021, 15090"), "{out}");
    assert!(out.contains("redirect to :15001"), "{out}");
    let (code, out, _) = run("plan", &["--iptables"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("-A ISTIO_OUTPUT") && out.contains("COMMIT"),
        "{out}"
    );
}

#[test]
fn plan_refuses_a_bad_config_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("redirect-plan-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.json");
    std::fs::write(&file, r#"{"envoy_port": 0}"#).unwrap();
    let (code, out, err) = run("plan", &[file.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.starts_with("plan: ") && err.contains("envoy_port"),
        "{err}"
    );
}

#[kernel_test]
fn capture_applies_proves_and_removes_in_a_namespace() {
    let ns = TestNetns::new();
    ns.sh("ip link add d0 type veth peer name d1 && ip addr add 10.99.0.1/24 dev d0 && ip link set d0 up && ip link set d1 up");
    let (code, out, err) = run("capture", &[ns.path().to_str().unwrap()]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("check: 0 differences"), "{out}");
    assert!(
        out.contains("landed on 15001, original destination 10.99.0.2:80"),
        "{out}"
    );
    assert!(
        out.contains("removed; check now finds: table inet redirect_capture is missing"),
        "{out}"
    );
    assert!(
        !ns.sh("nft list tables").contains("redirect_capture"),
        "the example left its table"
    );
}

#[test]
fn capture_names_a_missing_namespace() {
    let (code, _, err) = run("capture", &["/run/netns/no-such-namespace-here"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot open network namespace /run/netns/no-such-namespace-here"),
        "{err}"
    );
}

#[kernel_test]
fn ambient_applies_proves_and_removes_in_a_pod_and_a_host() {
    let (host, pod) = (TestNetns::new(), TestNetns::new());
    pod.sh("ip link set lo up");
    host.sh(&format!(
        "ip link add h0 type veth peer name eth0 netns {} && ip addr add 10.77.0.1/24 dev h0 && \
         ip link set h0 up",
        pod.name()
    ));
    pod.sh(
        "ip addr add 10.77.0.2/24 dev eth0 && ip link set eth0 up && \
            ip route add default via 10.77.0.1",
    );
    let (code, out, err) = run(
        "ambient",
        &[host.path().to_str().unwrap(), pod.path().to_str().unwrap()],
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for line in [
        "pod: check finds 0 differences",
        "original destination 10.99.0.2:80",
        "host: probe SNAT for Some([10.77.0.2])",
        "host: check finds 0 differences",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    assert!(
        !pod.sh("nft list ruleset").contains("redirect_capture")
            && !host
                .sh("nft list ruleset")
                .contains("redirect_ambient_host"),
        "tables left behind"
    );
}
