//! Issue 47: an ambient pod is `enabled` only while ztunnel's listeners are in its namespace,
//! read from the kernel each pass (sock_diag), not taken from ztunnel's ack. Against a real API
//! server, the agent as the DaemonSet runs it, pods in real network namespaces and ztunnel's
//! stand-in (`support::ztunnel`), which can lose a pod's listeners while it goes on acking
//! (a proxy that died, istio#57285) or ack a pod without ever making them (`hollow`).

use cni_testkit as common;

mod support;

use std::time::{Duration, Instant};

use common::ambient::{running, Launch, Node};
use redirect_testkit::kernel_test;
use support::ztunnel::TestZtunnel;
use support::{pod, TestPod};

const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 15014;
/// A pass every second, the metrics on 15014.
const EVERY_SECOND: &[(&str, &str)] = &[("AMBIENT_RECONCILE_INTERVAL", "1s")];

fn launch<'a>(env: &'a [(&'a str, &'a str)]) -> Launch<'a> {
    Launch {
        args: &["--monitoring-port=15014"],
        env,
        ..Launch::default()
    }
}

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::eventually(what, WAIT, f)
}

/// Waits for `p`'s annotation to read `value`.
fn wait_for(p: &TestPod, n: &Node, value: &str) {
    eventually(&format!("{} {value}", p.name), || {
        (p.annotation(n).as_deref() == Some(value)).then_some(())
    });
}

fn metric(n: &Node, line: &str) -> Option<u64> {
    let (_, text) = common::http_get(&n.host, PORT, "/metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

fn listener_repairs(n: &Node) -> u64 {
    metric(n, "redirect_cni_ambient_repairs_total{kind=\"listeners\"}").unwrap_or(0)
}

/// The stand-in closes one pod's listeners while it goes on acking: that pod is `pending`
/// within a pass (the other stays `enabled`), its add is sent again (`del`, `add`), and it is
/// `enabled` again once the listeners are back. When the resend brings them back at once (a
/// ztunnel that starts the pod's proxy anew), the pod is repaired in the same pass.
#[kernel_test]
fn a_pod_whose_listeners_close_is_pending_within_a_pass_and_enabled_when_they_return() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent_as(&launch(EVERY_SECOND));
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    let api = pod(&n, "api", "10.77.0.3", 4101, true);
    for p in [&web, &api] {
        let out = p.cni(&n, "ADD");
        assert_eq!(out.code, 0, "ADD {}: {}{}", p.name, out.stdout, out.stderr);
        wait_for(p, &n, "enabled");
    }
    assert_eq!(listener_repairs(&n), 0, "{}", agent.log());

    // web's proxy dies and a new add does not bring it back.
    z.hollow(&web.uid);
    z.close_listeners(&web.uid);
    let lost = Instant::now();
    wait_for(&web, &n, "pending");
    let took = lost.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "pending after {took:?}, more than a pass (1 s) and the API's round trip"
    );
    assert_eq!(api.annotation(&n).as_deref(), Some("enabled"));
    let seen = z.seen();
    let del = seen.iter().rposition(|s| *s == format!("del {}", web.uid));
    let add = seen.iter().rposition(|s| *s == format!("add {}", web.uid));
    assert!(
        matches!((del, add), (Some(d), Some(a)) if d < a),
        "web was not sent again (del, add): {seen:?}"
    );
    eventually("the repair counted", || {
        (listener_repairs(&n) >= 1).then_some(())
    });
    // The operator's table says it: the listeners missing, since when.
    let socket = n.plugin_socket().with_file_name("debug.sock");
    let table = eventually("the node view with web's listeners missing", || {
        let out = std::process::Command::new(common::validate_bin())
            .args(["node", "--socket", socket.to_str().unwrap()])
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&out.stdout).into_owned();
        t.lines()
            .any(|l| l.contains("shop/web") && l.contains("MISSING 15001/tcp"))
            .then_some(t)
    });
    let api_row = table.lines().find(|l| l.contains("shop/api")).unwrap_or("");
    assert!(api_row.contains("seen since"), "{table}");
    assert!(
        table.contains("! shop/web: ztunnel acked it but its listeners"),
        "{table}"
    );
    // CHECK says why.
    let out = web.cni(&n, "CHECK");
    assert_ne!(out.code, 0, "CHECK passed: {}", out.stdout);
    assert!(
        out.stdout.contains("15001/tcp") || out.stderr.contains("15001/tcp"),
        "CHECK did not name the listener: {}{}",
        out.stdout,
        out.stderr
    );
    // The backoff: no resend every pass (10 s before the second).
    std::thread::sleep(Duration::from_secs(3));
    let seen = z.seen();
    let first_del = seen
        .iter()
        .position(|s| *s == format!("del {}", web.uid))
        .expect("a del");
    let resent = seen[first_del..]
        .iter()
        .filter(|s| **s == format!("add {}", web.uid))
        .count();
    assert_eq!(resent, 1, "web sent again more than once in 3 s: {seen:?}");
    assert_eq!(web.annotation(&n).as_deref(), Some("pending"));

    // The listeners return: enabled at the next pass.
    z.whole(&web.uid);
    z.open_listeners(&web.uid);
    wait_for(&web, &n, "enabled");
    let out = web.cni(&n, "CHECK");
    assert_eq!(out.code, 0, "CHECK: {}{}", out.stdout, out.stderr);

    // api's proxy dies, and the resend starts it anew: repaired in the same pass.
    let before = listener_repairs(&n);
    z.close_listeners(&api.uid);
    eventually("api repaired", || {
        (listener_repairs(&n) > before && z.listeners_of(&api.uid) == 4).then_some(())
    });
    assert_eq!(api.annotation(&n).as_deref(), Some("enabled"));
    let log = agent.log();
    assert!(
        log.contains("repaired (listeners)") && log.contains("its listeners are back"),
        "{log}"
    );
}

/// The stand-in acks a pod but never makes its listeners: the ADD fails naming them, and the
/// pod is never `enabled`. With `AMBIENT_CHECK_LISTENERS=false`, the ack alone enables it (as
/// before).
#[kernel_test]
fn a_pod_whose_listeners_were_never_made_is_never_enabled() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent_as(&launch(EVERY_SECOND));
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, false);
    z.hollow(&web.uid);
    let out = web.cni(&n, "ADD");
    assert_ne!(out.code, 0, "ADD passed: {}", out.stdout);
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("listeners") && text.contains("15001/tcp"),
        "the ADD's error does not name the listeners: {text}"
    );
    // kubelet writes its status (the watch enrolls it, found by its cgroup): still never
    // enabled.
    running(&n.cp, "shop", "web", "10.77.0.2");
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert_ne!(
            web.annotation(&n).as_deref(),
            Some("enabled"),
            "enabled without listeners: {}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent);

    let _agent = n.agent_as(&launch(&[
        ("AMBIENT_RECONCILE_INTERVAL", "1s"),
        ("AMBIENT_CHECK_LISTENERS", "false"),
    ]));
    wait_for(&web, &n, "enabled");
}
