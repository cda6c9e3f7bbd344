//! One informer per kind (issue 48): no controller opens its own watch.
//!
//! - In the sources: outside `src/informers/`, nothing in the agent calls kube's watchers or a
//!   watch request.
//! - Against a real API server: the agent with repair, adoption, ambient mode and the sidecar
//!   counters all on holds one watch of pods and one of namespaces, whatever the controllers.

use cni_testkit as common;

use std::path::Path;
use std::time::Duration;

use common::ambient::{Launch, Node};
use redirect_testkit::kernel_test;

const WATCHES: [&str; 5] = [
    "watcher::watcher(",
    "metadata_watcher(",
    "watch_object(",
    "WatchParams",
    ".watch(&",
];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_controller_opens_a_watch_of_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for f in files
        .iter()
        .filter(|f| !f.starts_with(src.join("informers")))
    {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if WATCHES.iter().any(|w| line.contains(w)) {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(files.len() > 20, "{files:?}");
    assert!(
        found.is_empty(),
        "watches opened outside the informers (subscribe to crate::informers instead):\n{}",
        found.join("\n")
    );
}

/// The API server's registered watchers of `kind` (its `apiserver_registered_watchers`).
fn watchers(n: &Node, kind: &str) -> Option<u64> {
    let out = n.cp.kubectl_in(&["get", "--raw", "/metrics"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix =
        format!("apiserver_registered_watchers{{group=\"\",kind=\"{kind}\",version=\"v1\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The API server's list calls to etcd of `ty` (`*[]core.Pod`): a list served from the watch
/// cache makes none.
fn etcd_lists(n: &Node, ty: &str) -> u64 {
    let out = n.cp.kubectl_in(&["get", "--raw", "/metrics"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.starts_with("etcd_request_duration_seconds_count{"))
        .filter(|l| l.contains("operation=\"list\"") && l.contains(&format!("type=\"{ty}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[kernel_test]
fn the_agent_holds_one_watch_per_kind_with_every_controller_on() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let env = [
        ("CAPTURE_COUNTERS", "node"),
        ("ADOPT_ISTIO", "keep"),
        ("HAND_BACK_ON_UNINSTALL", "iptables-nft"),
    ];
    let launch = Launch {
        args: &["--monitoring-port=15014"],
        env: &env,
        ..Launch::default()
    };
    // The API server's own (its admission informers) before the agent: on main before issue
    // 48 the agent added 2 of pods (repair's and ambient's) and 1 of namespaces.
    let count = || {
        (
            watchers(&n, "Pod").unwrap_or(0),
            watchers(&n, "Namespace").unwrap_or(0),
        )
    };
    let before = count();
    let kinds = ["*[]core.Pod", "*[]core.Namespace"];
    let etcd_before = kinds.map(|k| etcd_lists(&n, k));
    // The server's own watch cache listed each kind once at its start: the metric is there.
    assert!(
        etcd_before.iter().all(|c| *c > 0),
        "{kinds:?}: {etcd_before:?}"
    );
    let agent = n.agent_as(&launch);
    common::eventually_or(
        "the agent's watches registered",
        Duration::from_secs(30),
        || agent.log(),
        || {
            let now = count();
            (now.0 > before.0 && now.1 > before.1).then_some(())
        },
    );
    // A moment more: a controller that opened its own would show by now.
    std::thread::sleep(Duration::from_secs(2));
    let now = count();
    let added = (now.0 - before.0, now.1 - before.1);
    assert_eq!(
        added,
        (1, 1),
        "watches of pods and namespaces the agent added\n{}",
        agent.log()
    );
    // Its lists came from the watch cache: the API server read etcd for none of them (kube
    // made each list with its default page a quorum read before issue 48).
    assert_eq!(
        kinds.map(|k| etcd_lists(&n, k)),
        etcd_before,
        "the API server's etcd lists of {kinds:?} before and after the agent listed"
    );
}

/// A watch that comes back quiet after the API server crashed is reported back: one line for
/// the outage, one for its end, within `STAYED_UP` of the server's return. The pods' watch is
/// made the quiet one: a pod created on the node is the last write before the crash, so the
/// restarted server resumes that watch (no 410, no relist) and, nothing changing, sends it
/// nothing; the namespaces' watch, older, gets a 410 and lists again. Before the agent's
/// client noted accepted watches (`informers::started`), the pods' outage never ended in the
/// log, and their watch gauge stayed 0, until a pod of the node changed.
#[kernel_test]
fn a_quiet_watch_is_reported_back_after_the_api_server_crashes() {
    let mut n = Node::new();
    let agent = n.agent_as(&Launch::default());
    agent.line_with(&["watching this node's pods"]);
    common::ambient::create_pod(&n.cp, "default", "last-write");
    // The ADDED event reaches the agent's watch over loopback in milliseconds; nothing in the
    // agent shows it for a pod of no ambient namespace, hence a pause rather than a wait.
    std::thread::sleep(Duration::from_secs(2));
    n.cp.crash_apiserver();
    agent.line_with(&["watching this node's pods failed"]);
    agent.line_with(&["watching this node's pods again, after"]);
    agent.line_with(&["watching the namespaces again, after"]);
    let log = agent.log();
    for what in ["this node's pods", "the namespaces"] {
        assert_eq!(
            log.matches(&format!("watching {what} failed")).count(),
            1,
            "one line for the outage of {what}\n{log}"
        );
    }
}

/// A watch answered with an error over many lines is dropped at its first line and the kind
/// listed again: the 403 the API server (1.20) answers to a metadata watch is a pretty-printed
/// Status, and kube read it line by line, one error and one doubled backoff delay per line (a
/// restarted server answers it until its RBAC cache is filled: in CI the namespaces came back
/// minutes later). Here the agent's permission on namespaces is taken away and the server
/// crashed, so that its namespace watch is made again and refused; once allowed again, the
/// namespaces are back within a retry or two, not after the 10 lines' delays (15 s at the
/// least, more than a minute at most).
#[kernel_test]
fn a_watch_refused_over_many_lines_is_listed_again_once_allowed() {
    let mut n = Node::new();
    let env = [("LOG_OUTPUT_LEVEL", "default:debug")];
    let agent = n.agent_as(&Launch {
        env: &env,
        ..Launch::default()
    });
    agent.line_with(&["watching this node's pods"]);
    let binding = n.cp.kubectl(&[
        "get",
        "clusterrolebinding",
        "redirect-cni-ambient",
        "-o",
        "json",
    ]);
    assert!(binding.status.success(), "{binding:?}");
    let deleted =
        n.cp.kubectl(&["delete", "clusterrolebinding", "redirect-cni-ambient"]);
    assert!(deleted.status.success(), "{deleted:?}");
    n.cp.crash_apiserver();
    // The 403's second line, as kube reads it: the answer holds more than one line.
    agent.line_with(&["Error deserializing response", "\"kind\""]);
    let binding = String::from_utf8(binding.stdout).unwrap();
    let created = n.cp.kubectl_in(&["create", "-f", "-"], Some(&binding));
    assert!(created.status.success(), "{created:?}");
    let allowed = std::time::Instant::now();
    agent.line_with(&["watching the namespaces again, after"]);
    println!(
        "the namespaces back {:?} after they were allowed again",
        allowed.elapsed()
    );
}

/// A server that refuses the streaming list asked for (Kubernetes before 1.27, or with the
/// WatchList feature off: the test's 1.20 answers `sendInitialEvents` with 400 or 422) gets a
/// list and a watch instead, and the informer fills: without the fallback it retried the same
/// refused request forever, blind.
#[kernel_test]
fn a_refused_streaming_list_falls_back_to_list_and_watch() {
    use cni_node::informers::{self, Informers};
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::watcher::InitialListStrategy;

    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let cp = common::apiserver::ControlPlane::start();
    let pod = |name: &str| {
        format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{name}\",\
             \"namespace\":\"default\"}},\"spec\":{{\"nodeName\":\"node-a\",\"containers\":\
             [{{\"name\":\"c\",\"image\":\"i\"}}]}}}}"
        )
    };
    cp.kubectl_in(&["apply", "-f", "-"], Some(&pod("before")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let names = |i: &Informers| -> Vec<String> {
        let mut v: Vec<String> = i
            .pods
            .snapshot()
            .into_iter()
            .filter_map(|p: Pod| p.metadata.name)
            .collect();
        v.sort();
        v
    };
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&cp.admin).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        // As the agent asks a server of 1.32 or later.
        let cfg = informers::config(Some((1, 32)));
        assert_eq!(
            cfg.initial_list_strategy,
            InitialListStrategy::StreamingList
        );
        let i = Informers::default();
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        let backoff = informers::health::WATCH_BACKOFF;
        informers::start(
            &client,
            "node-a",
            (&i, false),
            (cfg, backoff, None),
            &mut tasks,
            &stop,
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while names(&i) != ["before"] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the informer did not list the node's pod: {:?}",
                names(&i)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // And it watches: a pod created now arrives.
        cp.kubectl_in(&["apply", "-f", "-"], Some(&pod("after")));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while names(&i) != ["after", "before"] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the informer did not see the new pod: {:?}",
                names(&i)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}
