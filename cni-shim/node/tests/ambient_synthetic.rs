//! The synthetic check (`AMBIENT_SYNTHETIC_CHECK`): against a real API server, the agent as
//! the DaemonSet runs it, pods in real network namespaces and ztunnel's stand-in
//! (`support::ztunnel`, its listeners bound in each pod). Each pass, a connection to
//! `192.0.2.1:9` in one pod's namespace is proved to land on the stand-in's 15001; when the
//! stand-in closes the pod's listeners, the check fails naming why, and the pod's state is
//! unchanged (observational). Off, no check runs.

use cni_testkit as common;

mod support;

use std::time::Duration;

use common::ambient::{Launch, Node};
use redirect_testkit::kernel_test;
use serde_json::Value;
use support::ztunnel::TestZtunnel;
use support::{pod, TestPod};

const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 15014;
const CHECKS: &str = "redirect_cni_synthetic_checks_total";

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

fn metrics(n: &Node) -> String {
    common::http_get(&n.host, PORT, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default()
}

fn checks(n: &Node, result: &str) -> f64 {
    common::metric(&metrics(n), CHECKS, &[&format!("result=\"{result}\"")])
}

/// The pod's last synthetic check in the agent's view (`/debug/node`), if any.
fn synthetic_of(n: &Node, p: &TestPod) -> Option<Value> {
    let socket = n.plugin_socket().with_file_name("debug.sock");
    let (code, body) = common::unix_get(&socket, "/debug/node")?;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let entry = v["pods"].as_array()?.iter().find(|e| e["uid"] == p.uid)?;
    let s = entry["synthetic_check"].clone();
    (!s.is_null()).then_some(s)
}

fn enabled(p: &TestPod, n: &Node) {
    let out = p.cni(n, "ADD");
    assert_eq!(out.code, 0, "ADD {}: {}{}", p.name, out.stdout, out.stderr);
    eventually(&format!("{} enabled", p.name), || {
        (p.annotation(n).as_deref() == Some("enabled")).then_some(())
    });
}

/// `rotate`: the check lands on the stand-in's 15001 and counts ok; the stand-in closes the
/// pod's listeners (with `AMBIENT_CHECK_LISTENERS=false`, so the ack alone keeps it
/// `enabled`): the check fails as refused, logged with the pod, and the pod stays `enabled`;
/// the listeners back, it recovers.
#[kernel_test]
fn synthetic_rotate_lands_on_15001_and_fails_naming_why_when_the_listeners_close() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent_as(&launch(&[
        ("AMBIENT_RECONCILE_INTERVAL", "1s"),
        ("AMBIENT_SYNTHETIC_CHECK", "rotate"),
        ("AMBIENT_CHECK_LISTENERS", "false"),
    ]));
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    enabled(&web, &n);

    eventually("a check counted ok", || {
        (checks(&n, "ok") >= 1.0).then_some(())
    });
    let s = eventually("the view's check", || synthetic_of(&n, &web));
    assert_eq!(s["ok"], true, "{s}");
    assert_eq!(s["result"], "ok", "{s}");
    let detail = s["detail"].as_str().unwrap();
    assert!(
        detail.contains("192.0.2.1:9") && detail.contains(":15001"),
        "{s}"
    );
    assert!(!s["at"].is_null(), "{s}");
    assert_eq!(checks(&n, "failed"), 0.0, "{}", agent.log());

    // ztunnel loses the pod's listeners: refused, said, counted; the pod's state unchanged.
    z.close_listeners(&web.uid);
    eventually("a check counted failed", || {
        (checks(&n, "failed") >= 1.0).then_some(())
    });
    let s = eventually("the view's failed check", || {
        synthetic_of(&n, &web).filter(|s| s["ok"] == false)
    });
    assert_eq!(s["result"], "refused", "{s}");
    assert!(
        s["detail"]
            .as_str()
            .unwrap()
            .contains("no listener on 15001"),
        "{s}"
    );
    let line = agent.line_with(&["synthetic check failed", "shop/web"]);
    assert!(line.contains("refused"), "{line}");
    assert_eq!(
        web.annotation(&n).as_deref(),
        Some("enabled"),
        "observational"
    );
    // The operator's table says it too.
    let socket = n.plugin_socket().with_file_name("debug.sock");
    let out = std::process::Command::new(common::validate_bin())
        .args(["node", "--socket", socket.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("synthetic check shop/web at") && table.contains(": FAILED: refused"),
        "{table}"
    );

    z.open_listeners(&web.uid);
    agent.line_with(&["synthetic check recovered", "shop/web"]);
    eventually("the view's check ok again", || {
        synthetic_of(&n, &web).filter(|s| s["ok"] == true)
    });
}

/// `off` (the default): no check runs, no series, nothing in the view.
#[kernel_test]
fn synthetic_off_runs_no_check() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let _agent = n.agent_as(&launch(&[("AMBIENT_RECONCILE_INTERVAL", "1s")]));
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel connected", || (z.snapshots() >= 1).then_some(()));
    let web = pod(&n, "web", "10.77.0.2", 4100, true);
    enabled(&web, &n);
    let passes = |n: &Node| {
        common::metric(
            &metrics(n),
            "redirect_cni_ambient_reconcile_passes_total",
            &[],
        )
    };
    let start = passes(&n);
    eventually("three passes", || (passes(&n) >= start + 3.0).then_some(()));
    let text = metrics(&n);
    assert!(!text.contains(CHECKS), "{text}");
    assert_eq!(synthetic_of(&n, &web), None);
}
