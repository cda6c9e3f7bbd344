//! Ambient mode end to end, against a real API server (kube-apiserver and etcd, with the RBAC
//! of `deploy/kubernetes/redirect-cni.yaml` and `ambient.yaml` as written), the agent as the
//! DaemonSet runs it, pods in real network namespaces found through a stand-in of the host's
//! `/proc`, and a ztunnel of our own (`TestZtunnel`) that speaks ZDS and binds its listeners
//! inside each pod through the descriptor it receives, as ztunnel does:
//!
//! - a namespace labelled `istio.io/dataplane-mode=ambient` enrolls its running pod: the in-pod
//!   rules, the pod handed to ztunnel, `ambient.istio.io/redirection` pending then enabled, and
//!   the pod's outbound connection lands on ztunnel's listener bound through the descriptor;
//! - the agent restarts: the pod stays enrolled, its rules untouched, ztunnel gets it again in
//!   the new agent's snapshot;
//! - ztunnel restarts (its listeners gone): the snapshot hands the pod over again, and
//!   connections land again;
//! - the plugin's ADD of a new pod: enrolled before ADD answers; deleting the pod releases it;
//! - the pod labelled `none`: released, its rules gone, ztunnel told, the annotation removed.

use cni_testkit as common;

mod support;

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use common::ambient::{add_ipv6, create_pod, pod_netns, running_with, Node, KUBELET_UID};
use common::cni_env;
use common::host_proc::cgroupfs;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType, UnixAddr};
use redirect_testkit::{kernel_test, TestNetns};
use serde_json::json;
use support::ztunnel::{TestZtunnel, OUTSIDE};
use support::{has_rules, probe_members, redirection};

const WAIT: Duration = Duration::from_secs(30);
/// The agent's endpoints on 15014 in the node's namespace (the harness turns them off).
const MONITORED: &[&str] = &["--monitoring-port=15014"];

/// The value of the sample `series` (name and labels as exposed) on the agent's `/metrics`; 0
/// when absent.
fn metric(n: &Node, series: &str) -> f64 {
    let text = common::http_get(&n.host, 15014, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    common::eventually(what, WAIT, f)
}

/// The app's listener on 8080 in `pod`.
fn app(pod: &TestNetns) -> TcpListener {
    let l = pod.run(|| TcpListener::bind("0.0.0.0:8080")).unwrap();
    l.set_nonblocking(true).unwrap();
    l
}

/// Connects from the node as `uid` to `ip`:8080: where it landed, as "app from <source>",
/// "ztunnel's inbound port" or "nowhere".
fn probe(
    node: &TestNetns,
    uid: u32,
    ip: &str,
    app: &TcpListener,
    z: &TestZtunnel,
    pod: &str,
) -> String {
    if let Err(e) = support::connect_as(node, uid, ip) {
        return e;
    }
    for _ in 0..100 {
        if let Some(from) = support::accepted(app) {
            return from;
        }
        let state = z.state.lock().unwrap();
        if let Some(l) = state.pods.get(pod).map(|s| &s.listeners[1]) {
            l.set_nonblocking(true).unwrap();
            if l.accept().is_ok() {
                return "ztunnel's inbound port".into();
            }
        }
        drop(state);
        std::thread::sleep(Duration::from_millis(20));
    }
    "nowhere".into()
}

#[kernel_test]
fn label_enrolls_restarts_lose_nothing_the_plugin_enrolls_at_add_and_none_releases() {
    let n = Node::new();
    n.cp.namespace("shop");
    let web_uid = create_pod(&n.cp, "shop", "web");
    let web = pod_netns(&n.host, "10.77.0.2", "vweb");
    let web_app = app(&web);
    n.proc.add(4100, &cgroupfs(&web_uid), 100, web.path());
    // Dual stack: both addresses in the status, as kubelet reports them.
    add_ipv6(&n.host, &web, "fd77::2", "vweb");
    let web_app6 = web.run(|| TcpListener::bind("[fd77::2]:8080")).unwrap();
    web_app6.set_nonblocking(true).unwrap();
    running_with(&n.cp, "shop", "web", &["10.77.0.2", "fd77::2"]);

    // The agent first, ztunnel not there yet: the pod is not ambient.
    let agent = n.agent_with(MONITORED);
    assert!(!has_rules(&web), "no label yet, but rules in the pod");

    // The namespace's label enrolls the running pod: rules, then pending (no ztunnel).
    n.cp.kubectl_ok(&[
        "label",
        "namespace",
        "shop",
        "istio.io/dataplane-mode=ambient",
    ]);
    agent.line_with(&["ambient: pod shop/web enrolled"]);
    assert!(has_rules(&web), "enrolled without its in-pod rules");
    assert_eq!(
        probe_members(&n.host),
        ["10.77.0.2", "fd77::2"],
        "web's addresses not in the probe SNAT sets"
    );
    eventually("the annotation pending", || {
        (redirection(&n.cp, "shop", "web").as_deref() == Some("pending")).then_some(())
    });

    // ztunnel connects: the snapshot hands it the pod, connections land on its listener.
    let z = TestZtunnel::start(&n.socket);
    eventually("ztunnel serving web", || z.serves(&web_uid).then_some(()));
    assert!(
        z.lands(&web, &web_uid),
        "web's connection did not land on ztunnel's listener"
    );
    // Istio's node agent metrics: one ztunnel connected; the watch's events by Istio's type.
    eventually("ztunnel_connected 1", || {
        (metric(&n, "ztunnel_connected") == 1.0).then_some(())
    });
    let events = |t: &str| {
        metric(
            &n,
            &format!("nodeagent_reconcile_events_total{{type=\"{t}\"}}"),
        )
    };
    assert!(events("add") >= 2.0, "the pod and the namespace were added");
    assert!(
        events("update") >= 1.0,
        "the namespace's label was an update"
    );
    // kubelet's probe reaches the app, from the address the rules let through; any other
    // process of the node is captured to ztunnel's inbound port.
    let (probed, other) = (
        probe(&n.host, KUBELET_UID, "10.77.0.2", &web_app, &z, &web_uid),
        probe(&n.host, 4000, "10.77.0.2", &web_app, &z, &web_uid),
    );
    assert_eq!(probed, "app from 169.254.7.127");
    assert_eq!(other, "ztunnel's inbound port");
    // IPv6 too: the probe SNATed to Istio's IPv6 probe address, let through by the rules.
    assert_eq!(
        probe(&n.host, KUBELET_UID, "fd77::2", &web_app6, &z, &web_uid),
        "app from fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
    );
    eventually("the annotation enabled", || {
        (redirection(&n.cp, "shop", "web").as_deref() == Some("enabled")).then_some(())
    });

    // The agent restarts: the new one finds the pod's namespace, keeps its rules, and its
    // snapshot names the pod (ztunnel would drop a pod it leaves out).
    let before = redirect_kernel::testing::nft_in(web.path()).read().unwrap();
    drop(agent);
    let agent = n.agent_with(MONITORED);
    eventually("a second snapshot", || {
        (z.state.lock().unwrap().snapshots >= 2).then_some(())
    });
    assert!(
        z.serves(&web_uid),
        "the agent's restart lost web: {:?}",
        z.seen()
    );
    assert_eq!(
        redirect_kernel::testing::nft_in(web.path()).read().unwrap(),
        before,
        "the rules were touched"
    );
    assert!(z.lands(&web, &web_uid));
    assert!(!agent.log().contains("leaves the mesh"), "{}", agent.log());

    // ztunnel restarts, its listeners gone: the next snapshot hands the pod over again.
    drop(z);
    assert!(!web.run(|| TcpStream::connect_timeout(
        &OUTSIDE.parse().unwrap(),
        Duration::from_millis(500)
    )
    .is_ok()));
    // Meanwhile a new ambient pod cannot start: its ADD fails and leaves nothing behind.
    let late_uid = create_pod(&n.cp, "shop", "late");
    let late = pod_netns(&n.host, "10.77.0.4", "vlate");
    let out = n.add(&late, "shop", "late", &late_uid);
    assert_eq!(out.json()["code"], 11, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("ztunnel is not connected"),
        "{}",
        out.stdout
    );
    assert!(!has_rules(&late), "a failed ADD left rules in the pod");
    let requests = |code: &str| {
        metric(
            &n,
            &format!("istio_cni_plugin_requests_total{{response_code=\"{code}\"}}"),
        )
    };
    assert_eq!(
        requests("500"),
        1.0,
        "the failed ambient ADD, as Istio counts it"
    );
    assert_eq!(metric(&n, "ztunnel_connected"), 0.0);
    assert_eq!(probe_members(&n.host), ["10.77.0.2", "fd77::2"]);
    let z = TestZtunnel::start(&n.socket);
    eventually("the new ztunnel serving web", || {
        z.serves(&web_uid).then_some(())
    });
    assert!(z.lands(&web, &web_uid), "after ztunnel's restart");

    // A new pod: the plugin's ADD enrolls it before answering.
    let api_uid = create_pod(&n.cp, "shop", "api");
    let api = pod_netns(&n.host, "10.77.0.3", "vapi");
    let out = n.add(&api, "shop", "api", &api_uid);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    assert!(
        has_rules(&api) && z.serves(&api_uid),
        "ADD answered before the pod was enrolled: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(z.lands(&api, &api_uid));
    assert_eq!(requests("200"), 1.0, "the enrolled ADD, as Istio counts it");
    eventually("api annotated", || {
        (redirection(&n.cp, "shop", "api").as_deref() == Some("enabled")).then_some(())
    });
    // Deleted: released (ztunnel told).
    n.cp.kubectl_ok(&["delete", "pod", "api", "-n", "shop", "--wait=false"]);
    eventually("api released", || (!z.serves(&api_uid)).then_some(()));
    // Gone for good (no kubelet here to finish a graceful deletion): Istio's delete event.
    n.cp.kubectl_ok(&[
        "delete",
        "pod",
        "api",
        "-n",
        "shop",
        "--grace-period=0",
        "--force",
    ]);
    eventually("a delete event counted", || {
        (events("delete") >= 1.0).then_some(())
    });

    // web labelled none: released, its rules gone, the annotation removed.
    support::opt_out(&n.cp, "shop", "web");
    eventually("web released", || (!z.serves(&web_uid)).then_some(()));
    eventually("web's rules removed", || (!has_rules(&web)).then_some(()));
    assert!(
        probe_members(&n.host).is_empty(),
        "web's address left in the probe set"
    );
    assert_eq!(
        probe(&n.host, 4000, "10.77.0.2", &web_app, &z, &web_uid),
        "app from 10.77.0.1",
        "released, but still captured"
    );
    eventually("the annotation removed", || {
        redirection(&n.cp, "shop", "web").is_none().then_some(())
    });
    assert!(z.seen().contains(&format!("del {web_uid}")));
}

/// With `ambient_enabled` and no agent listening (none at all, or a socket left by a dead
/// one), ADD of a pod without a sidecar fails with "try again later", naming the socket, and
/// leaves the pod's namespace as it was: an ambient pod must not start uncaptured.
#[kernel_test]
fn without_the_agent_an_ambient_add_fails_naming_the_socket_and_changes_nothing() {
    let run = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "ambient_enabled": true, "cni_agent_run_dir": run.path(),
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"app": "web"}}})
    .to_string();
    let pod = common::pod_ns();
    let ruleset = || pod.sh("nft list ruleset; ip rule; ip route show table all");
    let before = ruleset();
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web;K8S_POD_UID=u1";
    let env = cni_env("ADD", pod.path().to_str().unwrap(), args);
    let socket = run.path().join(cni_protocol::ambient::SOCKET_NAME);
    for left in ["no socket", "a dead agent's socket"] {
        if left != "no socket" {
            // Bound, never listened on: connect() is refused.
            let s = socket_at(&socket);
            std::mem::forget(s);
        }
        let out = common::plugin(&env, &conf);
        assert_ne!(out.code, 0, "{left}: ADD succeeded: {}", out.stdout);
        let err = out.json();
        assert_eq!(err["code"], 11, "{left}: {err}");
        let msg = err["msg"].as_str().unwrap();
        assert!(
            msg.contains(socket.to_str().unwrap()) && msg.contains("node agent"),
            "{left}: {msg}"
        );
        assert_eq!(ruleset(), before, "{left}: the pod's namespace changed");
    }
}

fn socket_at(path: &Path) -> OwnedFd {
    let s = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    nix::sys::socket::bind(s.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    s
}

/// With no agent listening (stopped, or during its upgrade), the plugin decides from the pod's
/// and its namespace's labels itself, as Istio's plugin does: a pod that is not ambient starts
/// (uncaptured, as without ambient mode), an ambient one fails with code 11 and its namespace
/// unchanged until the agent is back.
#[kernel_test]
fn without_the_agent_only_ambient_pods_wait() {
    let n = Node::new();
    n.cp.namespace("plain");
    n.ambient_namespace("shop");
    // The agent installs the plugin's config and kubeconfig and stops, leaving them.
    drop(n.agent_with(&["--cleanup-on-exit=false"]));
    let socket = n
        .node
        .path()
        .join("run")
        .join(cni_protocol::ambient::SOCKET_NAME);
    assert!(!socket.exists(), "the stopped agent left its socket");

    let plain_uid = create_pod(&n.cp, "plain", "app");
    let plain = pod_netns(&n.host, "10.77.0.5", "vplain");
    let out = n.add(&plain, "plain", "app", &plain_uid);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("not ambient") && out.stderr.contains("does not answer"),
        "{}",
        out.stderr
    );
    assert!(!has_rules(&plain));

    let web_uid = create_pod(&n.cp, "shop", "web");
    let web = pod_netns(&n.host, "10.77.0.6", "vshop");
    let before = web.sh("nft list ruleset; ip rule");
    let out = n.add(&web, "shop", "web", &web_uid);
    let err = out.json();
    assert_eq!(err["code"], 11, "{err}");
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains("the pod is ambient") && msg.contains(socket.to_str().unwrap()),
        "{msg}"
    );
    assert_eq!(web.sh("nft list ruleset; ip rule"), before);
}
