//! Istio's enablement selectors end to end (a real API server, the agent as the DaemonSet runs
//! it, pods in real network namespaces, ztunnel's stand-in): the cluster-wide opt-out
//! (istio#53578) enrolls a pod of an unlabelled namespace and not one of a namespace labelled
//! `none`; a restart with Istio's default releases the first; back to the opt-out enrolls it
//! again; and the plugin, with no agent listening, decides by the same terms.

use cni_testkit as common;

mod support;

use std::time::Duration;

use common::ambient::{create_pod, pod_netns, running, Node};
use redirect_testkit::kernel_test;
use support::ztunnel::TestZtunnel;
use support::{has_rules, redirection};

const WAIT: Duration = Duration::from_secs(30);

/// Every pod unless it or its namespace is labelled `none`, as Istio's chart renders it
/// (`toYaml`).
const OPT_OUT: &str = "\
- namespaceSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
  podSelector:
    matchExpressions:
    - key: istio.io/dataplane-mode
      operator: NotIn
      values:
      - none
";

/// A node with namespace `plain` (no label) and `legacy` (labelled `none`).
fn node() -> Node {
    let n = Node::new();
    n.cp.namespace("plain");
    n.cp.namespace("legacy");
    let label = "istio.io/dataplane-mode=none";
    n.cp.kubectl_ok(&["label", "namespace", "legacy", label]);
    n
}

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::eventually(what, WAIT, f)
}

#[kernel_test]
fn a_cluster_wide_opt_out_enrolls_unlabelled_namespaces_and_a_changed_selector_converges() {
    let n = node();
    let (web_uid, old_uid) = (
        create_pod(&n.cp, "plain", "web"),
        create_pod(&n.cp, "legacy", "old"),
    );
    let (web, old) = (
        pod_netns(&n.host, "10.77.0.2", "vweb"),
        pod_netns(&n.host, "10.77.0.3", "vold"),
    );
    n.proc.add(
        4100,
        &common::host_proc::cgroupfs(&web_uid),
        100,
        web.path(),
    );
    n.proc.add(
        4200,
        &common::host_proc::cgroupfs(&old_uid),
        100,
        old.path(),
    );
    running(&n.cp, "plain", "web", "10.77.0.2");
    running(&n.cp, "legacy", "old", "10.77.0.3");
    let z = TestZtunnel::start(&n.socket);
    let opt_out = format!("--ambient-enablement-selector={OPT_OUT}");

    // The opt-out: web (no label anywhere) enrolled and served; old (namespace none) not.
    let agent = n.agent_with(&[&opt_out]);
    eventually("web enrolled by the opt-out", || {
        (redirection(&n.cp, "plain", "web").as_deref() == Some("enabled")).then_some(())
    });
    assert!(has_rules(&web) && z.serves(&web_uid), "{:?}", z.seen());
    assert!(
        z.lands(&web, &web_uid),
        "web's traffic does not reach ztunnel"
    );
    assert!(
        !has_rules(&old) && !z.serves(&old_uid),
        "a pod of a namespace labelled none was enrolled"
    );
    assert_eq!(redirection(&n.cp, "legacy", "old"), None);

    // Istio's default after a restart: web is selected by nothing now, and is released.
    drop(agent);
    let agent = n.agent();
    eventually("web released under Istio's default", || {
        (!z.serves(&web_uid) && !has_rules(&web)).then_some(())
    });
    eventually("web's annotation removed", || {
        redirection(&n.cp, "plain", "web").is_none().then_some(())
    });
    assert!(!has_rules(&old));

    // Back to the opt-out: web enrolled again, old still not.
    drop(agent);
    let _agent = n.agent_with(&[&opt_out, "--cleanup-on-exit=false"]);
    eventually("web enrolled again", || {
        (redirection(&n.cp, "plain", "web").as_deref() == Some("enabled")).then_some(())
    });
    assert!(has_rules(&web) && z.serves(&web_uid));
    assert!(!has_rules(&old) && !z.serves(&old_uid));
}

/// The installer puts the terms in the plugin's entry; with no agent listening, the plugin
/// decides by them: a new pod of an unlabelled namespace is ambient (waits, code 11), one of a
/// namespace labelled `none` starts uncaptured.
#[kernel_test]
fn without_the_agent_the_plugin_decides_by_the_same_terms() {
    let n = node();
    let opt_out = format!("--ambient-enablement-selector={OPT_OUT}");
    drop(n.agent_with(&[&opt_out, "--cleanup-on-exit=false"]));

    let web_uid = create_pod(&n.cp, "plain", "web");
    let web = pod_netns(&n.host, "10.77.0.5", "vweb");
    let before = web.sh("nft list ruleset; ip rule");
    let out = n.add(&web, "plain", "web", &web_uid);
    let err = out.json();
    assert_eq!(
        err["code"], 11,
        "an unlabelled namespace's pod started: {err}"
    );
    assert!(
        err["msg"].as_str().unwrap().contains("the pod is ambient"),
        "{err}"
    );
    assert_eq!(web.sh("nft list ruleset; ip rule"), before);

    let old_uid = create_pod(&n.cp, "legacy", "old");
    let old = pod_netns(&n.host, "10.77.0.6", "vold");
    let out = n.add(&old, "legacy", "old", &old_uid);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("no enablement selector matches"),
        "{}",
        out.stderr
    );
    assert!(!has_rules(&old));
}
