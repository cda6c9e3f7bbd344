//! `redirect-validate trace`, the real binary, against real packets in fresh namespaces (a pod
//! and its peer, `redirect_testkit::Topology`):
//!
//! - a sidecar pod (Istio's default capture) and an ambient pod (`AmbientConfig::default()`):
//!   an inbound flow, an outbound flow, an excluded port and a bypassed flow each take, in the
//!   kernel, the path `explain` predicts (exit 0, the same steps, at least one);
//! - a rule of our table deleted by hand: the paths differ (exit 2), and the output names the
//!   first step that differs;
//! - `trace` killed with SIGKILL while it waits: its table is gone (owner table);
//! - SIGTERM while it waits: exit 1, its table removed;
//! - bad input (--to, --proto, --netns): exit 1 naming the value, the namespace unchanged.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redirect_core::{AmbientConfig, Capture, CaptureConfig, Namespace};
use redirect_testkit::binary::{run_in, snapshot, Ran, Run};
use redirect_testkit::istio::SIDECAR_ARGS;
use redirect_testkit::{kernel_test, TestNetns, Topology};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_redirect-validate");

fn sidecar_pod() -> Topology {
    let topo = Topology::basic();
    let cfg = CaptureConfig::istio_sidecar_default()
        .validated()
        .expect("Istio's default config");
    Namespace::open(topo.pod.path())
        .and_then(|ns| ns.apply(&Capture::Sidecar(cfg)))
        .unwrap_or_else(|e| panic!("apply: {e}"));
    topo
}

fn ambient_pod() -> Topology {
    let topo = Topology::basic();
    Namespace::open(topo.pod.path())
        .and_then(|ns| ns.apply(&Capture::Ambient(AmbientConfig::default())))
        .unwrap_or_else(|e| panic!("apply: {e}"));
    topo
}

/// `trace` run from the peer's namespace (inbound packets come from there), on the pod's.
fn trace(topo: &Topology, extra: &[&str]) -> Ran {
    let pod = topo.pod.path().to_string_lossy().into_owned();
    let mut args = vec!["trace", "--netns", pod.as_str()];
    args.extend_from_slice(extra);
    run_in(BIN, &topo.peer, &Run::args(&args))
}

fn sidecar_args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    v.extend(SIDECAR_ARGS.iter().map(|s| s.to_string()));
    v
}

fn json(r: &Ran) -> Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr:\n{}", r.stdout, r.stderr))
}

fn chains(path: &Value) -> Vec<String> {
    path.as_array()
        .expect("a path")
        .iter()
        .map(|s| format!("{} {} #{}", s["hook"], s["chain"], s["position"]))
        .collect()
}

/// `trace --json` with these arguments agrees with explain: exit 0, the same steps, and the
/// path has `at_least` steps; returns the traced chains.
fn agrees(topo: &Topology, args: &[String], at_least: usize) -> Vec<String> {
    let mut a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    a.push("--json");
    let r = trace(topo, &a);
    let v = json(&r);
    let (traced, expected) = (chains(&v["traced"]), chains(&v["expected"]));
    assert_eq!(
        r.code,
        0,
        "{args:?}: exit {}\ntraced {traced:#?}\nexpected {expected:#?}\n{}\nevents {}",
        r.code,
        r.stderr,
        serde_json::to_string(&v["events"]).unwrap_or_default()
    );
    assert_eq!(traced, expected, "{args:?}");
    assert!(
        traced.len() >= at_least,
        "{args:?}: only {traced:?}: the packet's path was not seen"
    );
    assert_eq!(v["equal"], true);
    traced
}

#[kernel_test]
fn sidecar_flows_take_the_path_explain_predicts() {
    let topo = sidecar_pod();
    // Inbound to the app: ISTIO_INBOUND, ISTIO_IN_REDIRECT, to 15006.
    let inbound = agrees(
        &topo,
        &sidecar_args(&["--to", "10.77.0.2:8080", "--send"]),
        2,
    );
    assert!(
        inbound.iter().any(|c| c.contains("istio_in_redirect")),
        "{inbound:?}"
    );
    // Outbound from the app: ISTIO_OUTPUT, ISTIO_REDIRECT, to 15001.
    let outbound = agrees(
        &topo,
        &sidecar_args(&["--to", "10.77.0.1:80", "--uid", "1000", "--send"]),
        2,
    );
    assert!(
        outbound.iter().any(|c| c.contains("istio_redirect")),
        "{outbound:?}"
    );
    // An excluded inbound port (15090, Istio's -d): returns before the redirect.
    let excluded = agrees(
        &topo,
        &sidecar_args(&["--to", "10.77.0.2:15090", "--send"]),
        1,
    );
    assert!(
        !excluded.iter().any(|c| c.contains("istio_in_redirect")),
        "{excluded:?}"
    );
    // The proxy's own traffic (UID 1337): bypassed.
    let bypassed = agrees(
        &topo,
        &sidecar_args(&["--to", "10.77.0.1:80", "--uid", "1337", "--send"]),
        1,
    );
    assert!(
        !bypassed.iter().any(|c| c.contains("istio_redirect")),
        "{bypassed:?}"
    );
}

#[kernel_test]
fn ambient_flows_take_the_path_explain_predicts() {
    let topo = ambient_pod();
    let args = |extra: &[&str]| {
        let mut v: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        v.push("--ambient".into());
        v
    };
    agrees(&topo, &args(&["--to", "10.77.0.2:8080", "--send"]), 1);
    agrees(
        &topo,
        &args(&["--to", "10.77.0.1:80", "--uid", "1000", "--send"]),
        1,
    );
    // ztunnel's own inbound port (15008) and DNS over UDP.
    agrees(&topo, &args(&["--to", "10.77.0.2:15008", "--send"]), 1);
    agrees(
        &topo,
        &args(&["--to", "10.77.0.1:53", "--proto", "udp", "--send"]),
        1,
    );
}

#[kernel_test]
fn an_altered_rule_makes_the_paths_differ_and_says_where() {
    let topo = sidecar_pod();
    let args = sidecar_args(&["--to", "10.77.0.1:80", "--uid", "1000", "--send"]);
    agrees(&topo, &args, 2);
    // Delete the rule of ISTIO_OUTPUT that jumps to ISTIO_REDIRECT (its last).
    let listing = topo
        .pod
        .sh("nft -a list chain inet redirect_capture nat_ip_istio_output");
    let handle = listing
        .lines()
        .filter(|l| l.contains("jump nat_ip_istio_redirect"))
        .filter_map(|l| l.rsplit("# handle ").next())
        .next_back()
        .unwrap_or_else(|| panic!("no jump to istio_redirect in\n{listing}"))
        .trim()
        .to_string();
    topo.pod.sh(&format!(
        "nft delete rule inet redirect_capture nat_ip_istio_output handle {handle}"
    ));
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let r = trace(&topo, &a);
    assert_eq!(r.code, 2, "{}\n{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("DIFFERENT from step") && r.stdout.contains("nat_ip_istio_redirect"),
        "the output names where:\n{}",
        r.stdout
    );
    let mut j = a.clone();
    j.push("--json");
    let v = json(&trace(&topo, &j));
    let d = &v["first_difference"];
    assert!(d["step"].as_u64().unwrap_or(0) >= 1, "{v:#}");
    assert_eq!(d["expected"]["chain"], "nat_ip_istio_output", "{v:#}");
}

fn tables(ns: &TestNetns) -> String {
    ns.sh("nft list tables")
}

/// Wait until `cond` holds, up to 10 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `trace` waiting for traffic in the pod's namespace, as a child we can signal.
fn spawn_waiting(topo: &Topology) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", topo.peer.name(), BIN, "trace", "--netns"])
        .arg(topo.pod.path())
        .args(["--to", "10.77.0.2:8080", "--timeout", "60s"])
        .args(SIDECAR_ARGS)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn trace")
}

#[kernel_test]
fn no_trace_table_is_left_after_sigkill() {
    let topo = sidecar_pod();
    let mut child = spawn_waiting(&topo);
    wait_for("the trace table", || {
        tables(&topo.pod).contains("redirect_trace_")
    });
    // `ip netns exec` execs the binary: the child is trace itself.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let status = child.wait().expect("wait");
    assert!(status.code().is_none(), "killed by a signal: {status:?}");
    wait_for("the kernel to remove the owned table", || {
        !tables(&topo.pod).contains("redirect_trace_")
    });
    assert!(tables(&topo.pod).contains("redirect_capture"));
}

#[kernel_test]
fn sigterm_ends_the_wait_and_removes_the_table() {
    let topo = sidecar_pod();
    let child = spawn_waiting(&topo);
    wait_for("the trace table", || {
        tables(&topo.pod).contains("redirect_trace_")
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("kill");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!tables(&topo.pod).contains("redirect_trace_"));
}

#[kernel_test]
fn bad_input_exits_1_naming_the_value_and_changes_nothing() {
    let topo = sidecar_pod();
    let before = snapshot(&topo.pod);
    let pod = topo.pod.path().to_string_lossy().into_owned();
    let dir = std::env::temp_dir();
    let dir = dir.to_string_lossy();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--netns", &pod, "--to", "10.0.0.1"], "10.0.0.1"),
        (vec!["--netns", &pod, "--to", "nowhere:80"], "nowhere:80"),
        (
            vec!["--netns", &pod, "--to", "10.0.0.1:80", "--proto", "sctp"],
            "sctp",
        ),
        (
            vec!["--netns", &pod, "--to", "10.0.0.1:80", "--timeout", "soon"],
            "soon",
        ),
        (vec!["--netns", &dir, "--to", "10.0.0.1:80"], &dir),
        (
            vec!["--netns", "/nonexistent/ns", "--to", "10.0.0.1:80"],
            "/nonexistent/ns",
        ),
    ];
    for (args, named) in cases {
        let mut a = vec!["trace"];
        a.extend_from_slice(&args);
        let r = run_in(BIN, &topo.peer, &Run::args(&a));
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(named), "{args:?}: {}", r.stderr);
        assert_eq!(
            snapshot(&topo.pod),
            before,
            "{args:?} changed the namespace"
        );
    }
}
