//! The repair controller on real namespaces: finding a pod's network namespace, repairing a
//! broken pod in place, and the controller acting on pods from the API stand-in. The host's `/proc` is stood in for by a folder laid out like
//! it (`<pid>/cgroup`, `<pid>/stat`, `<pid>/ns/net` as a link to a real namespace file), as the
//! agent reads a mounted `/host/proc`; the namespaces and the addresses in them are real.

use cni_testkit as common;
use cni_testkit::eventually;

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_node::adopt::AdoptIstio;
use cni_node::pods::queue::Backoff;
use cni_node::pods::search::{find, FindError};
use cni_node::repair::controller::Controller;
use cni_node::repair::detect::{Action, Filter};
use cni_node::repair::in_place::{repair, Outcome, Places, RepairError};
use cni_node::repair::RepairSettings;
use cni_node::telemetry::Metrics;
use cni_protocol::cni::conf::NetConf;
use common::cluster::Cluster;
use common::host_proc::{cgroupfs, FakeProc};
use common::static_bin;
use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::{self, Decision, MeshDefaults};
use redirect_core::netns_id_of;
use redirect_core::CaptureConfig;
use redirect_core::Netns;
use redirect_testkit::binary::{self, Run};
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, TestNetns};

use cni_testkit::fixtures::ISTIO_POD;

const UID: &str = "8f7c1a52-3b1e-4d2a-9c6e-0a1b2c3d4e5f";
const OTHER_UID: &str = "11111111-2222-3333-4444-555555555555";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A namespace holding `addrs` on a veth, as a pod does.
fn pod_ns(addrs: &[&str]) -> TestNetns {
    let ns = TestNetns::with_prefix("rdrep");
    let mut lines = vec![
        "link add eth0 type veth peer name eth1".to_string(),
        "link set eth0 up".into(),
    ];
    lines.extend(addrs.iter().map(|a| format!("addr add {a}/32 dev eth0")));
    ns.ip_batch(false, &lines);
    ns
}

fn same_ns(found: &Netns, ns: &TestNetns) -> bool {
    found.id() == netns_id_of(ns.path()).unwrap()
}

#[kernel_test]
fn the_oldest_process_of_the_pod_whose_namespace_holds_its_ip_wins() {
    let (a, b, c) = (
        pod_ns(&["10.55.0.2"]),
        pod_ns(&["10.55.0.2"]),
        pod_ns(&["10.55.0.3"]),
    );
    let other = pod_ns(&["10.55.0.2"]);
    let proc = FakeProc::new();
    proc.add(10, &cgroupfs(UID), 900, b.path());
    proc.add(11, &cgroupfs(UID), 300, a.path());
    // Older, but its namespace does not hold the IP.
    proc.add(12, &cgroupfs(UID), 50, c.path());
    // The oldest of all holds the IP, but belongs to another pod.
    proc.add(13, &cgroupfs(OTHER_UID), 10, other.path());
    fs::create_dir_all(proc.path().join("self")).unwrap();

    let found = find(proc.path(), Path::new("/nonexistent"), UID, ip("10.55.0.2")).unwrap();
    assert!(same_ns(&found, &a), "found {}", found.path().display());
    assert_eq!(found.path(), proc.path().join("11/ns/net"));
}

#[kernel_test]
fn the_systemd_cgroup_driver_spells_the_uid_with_underscores() {
    let a = pod_ns(&["10.55.1.2"]);
    let proc = FakeProc::new();
    let slice = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-1.scope",
        UID.replace('-', "_")
    );
    proc.add(42, &slice, 100, a.path());
    let found = find(proc.path(), Path::new("/nonexistent"), UID, ip("10.55.1.2")).unwrap();
    assert!(same_ns(&found, &a));
}

#[kernel_test]
fn the_agents_own_namespace_is_never_the_pods() {
    let agent = pod_ns(&["10.55.2.2"]);
    let proc = FakeProc::new();
    proc.add(7, &cgroupfs(UID), 100, agent.path());
    let pins = tempfile::tempdir().unwrap();
    symlink(agent.path(), pins.path().join("agent")).unwrap();
    // Seen from another namespace, the pod's process and its namespace are found...
    let found = find(proc.path(), pins.path(), UID, ip("10.55.2.2")).unwrap();
    assert!(same_ns(&found, &agent));
    // ...seen from inside it (the agent's own namespace holds the IP), nothing is.
    let inside = agent.run(|| find(proc.path(), pins.path(), UID, ip("10.55.2.2")));
    match inside {
        Err(FindError::NotFound {
            processes, pins, ..
        }) => assert_eq!((processes, pins), (1, 1)),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[kernel_test]
fn without_a_process_the_pinned_namespaces_are_searched() {
    let (a, b) = (pod_ns(&["10.55.3.9"]), pod_ns(&["10.55.3.2"]));
    let proc = FakeProc::new();
    let pins = tempfile::tempdir().unwrap();
    symlink(a.path(), pins.path().join("cni-aaaa")).unwrap();
    symlink(b.path(), pins.path().join("cni-bbbb")).unwrap();
    let found = find(proc.path(), pins.path(), UID, ip("10.55.3.2")).unwrap();
    assert!(same_ns(&found, &b));
    assert_eq!(found.path(), pins.path().join("cni-bbbb"));

    let err = find(proc.path(), pins.path(), UID, ip("10.55.3.77")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(UID) && text.contains("10.55.3.77") && text.contains("2 pinned"),
        "{text}"
    );
}

/// Istio's sidecar pod (the fixture), running on `ip`, with `uid`.
fn sidecar_pod(uid: &str, ip: &str) -> Pod {
    let mut pod: Pod = serde_json::from_str(ISTIO_POD).unwrap();
    pod.metadata.uid = Some(uid.into());
    pod.status.get_or_insert_with(Default::default).pod_ip = Some(ip.into());
    pod
}

/// A pod's namespace holding `ip`, and a `/proc` whose one process (the pause) belongs to the
/// pod and lives in it.
fn running_pod(ip: &str) -> (TestNetns, FakeProc) {
    let ns = pod_ns(&[ip]);
    let proc = FakeProc::new();
    proc.add(1, &cgroupfs(UID), 5, ns.path());
    (ns, proc)
}

fn places(proc: &FakeProc) -> Places {
    Places {
        proc: proc.path().to_owned(),
        pins: "/nonexistent".into(),
    }
}

#[kernel_test]
fn a_broken_pod_gets_the_plugins_capture_and_then_passes_the_real_probe() {
    let validate = static_bin("redirect-validate");
    let validate = validate.to_str().unwrap();
    let (ns, proc) = running_pod("10.55.5.2");
    let probe = || binary::run_in(validate, &ns, &Run::args(&[]).user(1337, 1337));
    // Broken: no rules, and the probe says so as istio-validation does.
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path()).read().unwrap(),
        None
    );
    assert_eq!(probe().code, 126, "the probe must fail before the repair");

    let out = repair(
        &sidecar_pod(UID, "10.55.5.2"),
        &MeshDefaults::default(),
        &places(&proc),
    );
    assert_eq!(
        out.unwrap(),
        Outcome::Repaired {
            netns: proc.path().join("1/ns/net")
        }
    );
    // The table is the one ADD writes for this pod: the plugin's decision from the pod object
    // (this one captures DNS, from its istio-proxy's environment).
    let pod = sidecar_pod(UID, "10.55.5.2");
    let info = cni_protocol::pod::pod_info(pod, String::new(), String::new());
    let Decision::Capture { config, .. } = mesh::decide(&info, &MeshDefaults::default()).unwrap()
    else {
        panic!("the fixture is a captured pod")
    };
    assert!(
        config.dns != CaptureConfig::istio_sidecar_default().dns,
        "the fixture's DNS capture"
    );
    let expected = redirect_kernel::nft::expected(&plan(&config).unwrap());
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path()).read().unwrap(),
        Some(expected)
    );
    let ran = probe();
    assert_eq!(ran.code, 0, "the probe after the repair: {ran:?}");
}

#[kernel_test]
fn a_pod_the_plugin_would_not_capture_is_left_alone() {
    let (ns, proc) = running_pod("10.55.6.2");
    let mut pod = sidecar_pod(UID, "10.55.6.2");
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("sidecar.istio.io/inject".into(), "false".into());
    let out = repair(&pod, &MeshDefaults::default(), &places(&proc)).unwrap();
    assert!(matches!(out, Outcome::NotCaptured(_)), "{out:?}");
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path()).read().unwrap(),
        None
    );
}

#[kernel_test]
fn a_pod_whose_namespace_is_not_found_is_a_failure_with_nothing_applied() {
    // The pod's process is there, but its namespace does not hold the pod's IP.
    let (ns, proc) = running_pod("10.55.7.2");
    let err = repair(
        &sidecar_pod(UID, "10.55.7.9"),
        &MeshDefaults::default(),
        &places(&proc),
    )
    .unwrap_err();
    assert!(matches!(err, RepairError::Netns { .. }), "{err:?}");
    let text = redirect_program::errors::chain(&err);
    assert!(text.contains("10.55.7.9"), "{text}");
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path()).read().unwrap(),
        None
    );
}

// ---------------------------------------------------------------------------------------------
// The controller, against the API stand-in (`common::cluster`), on real namespaces. The agent
// and the stand-in run in a namespace of their own ("home"), so that "the agent's own
// namespace" is one the test made, never the host's.

/// The node the agent runs on.
const NODE: &str = "worker-2";

/// What the validation init container shows.
#[derive(Clone, Copy)]
enum Validation {
    /// Crash-looping: waiting, last terminated with this code.
    Looping(i32),
    /// Just passed (0, Completed), its last failure still showing 126.
    Completed,
    /// Never failed: running.
    Running,
    /// Terminated with 126 and never restarted (no last state).
    FirstFailure,
}

/// Istio's sidecar pod (the fixture) as the API server shows it: on `node`, with `uid`, `ip`
/// and its validation container in state `v`.
fn pod_object(name: &str, uid: &str, ip: &str, node: &str, v: Validation) -> serde_json::Value {
    let mut pod: serde_json::Value = serde_json::from_str(ISTIO_POD).unwrap();
    pod["metadata"]["name"] = name.into();
    pod["metadata"]["uid"] = uid.into();
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    pod["spec"]["nodeName"] = node.into();
    let terminated = |code: i32| serde_json::json!({"terminated": {"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"}}});
    let (state, last) = match v {
        Validation::Looping(code) => (
            serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            terminated(code),
        ),
        Validation::Completed => (terminated(0), terminated(126)),
        Validation::Running => (
            serde_json::json!({"running": {"startedAt": "2025-03-11T09:14:30Z"}}),
            serde_json::json!({}),
        ),
        Validation::FirstFailure => (terminated(126), serde_json::json!({})),
    };
    pod["status"]["podIP"] = ip.into();
    pod["status"]["phase"] = "Pending".into();
    pod["status"]["initContainerStatuses"] = serde_json::json!([{
        "name": "istio-validation", "image": "proxyv2", "imageID": "", "ready": false,
        "restartCount": 1, "state": state, "lastState": last,
    }]);
    pod
}

/// The plugin's config entry as the installer writes it with its defaults.
fn plugin_conf() -> Arc<NetConf> {
    Arc::new(
        cni_protocol::cni::conf::parse(
            br#"{"cniVersion": "1.0.0", "name": "redirect-cni", "type": "redirect-cni"}"#,
        )
        .unwrap(),
    )
}

fn repair_settings(action: Action, proc: &Path) -> RepairSettings {
    RepairSettings {
        enabled: true,
        action: Some(action),
        node_name: NODE.into(),
        filter: Filter::default(),
        label_key: "cni.istio.io/uninitialized".into(),
        label_value: "true".into(),
        label_selectors: String::new(),
        field_selectors: String::new(),
        max_attempts: 3,
        adopt_istio: AdoptIstio::Off,
        places: Places {
            proc: proc.to_owned(),
            pins: "/nonexistent".into(),
        },
        adopted_forms: None,
    }
}

/// The agent's home namespace (loopback up, and an address of its own), with the API stand-in
/// listening in it.
struct Home {
    ns: TestNetns,
    stand_in: Option<Cluster>,
}

impl Home {
    fn cluster(&self) -> &Cluster {
        self.stand_in.as_ref().expect("the stand-in runs")
    }
}

impl Drop for Home {
    /// The stand-in stops by connecting to itself: from inside its namespace.
    fn drop(&mut self) {
        if let Some(c) = self.stand_in.take() {
            self.ns.run(move || drop(c));
        }
    }
}

fn home(own_ip: &str) -> Home {
    let ns = pod_ns(&[own_ip]);
    ns.ip_batch(false, &["link set lo up".to_string()]);
    let stand_in = Some(ns.run(Cluster::start));
    Home { ns, stand_in }
}

/// A controller running in `home` until dropped.
struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    metrics: Metrics,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn start_controller(home: &Home, settings: RepairSettings) -> Running {
    let kubeconfig = home.cluster().kubeconfig().to_owned();
    let watch_backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_millis(400),
    };
    start_controller_with(home, settings, kubeconfig, watch_backoff, None)
}

/// What a controller logs, line by line.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
    fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

/// A controller in `home` until dropped, reaching the API through `kubeconfig`, its watch
/// retried with `watch_backoff`, its lines (info and up) into `logs` when given.
fn start_controller_with(
    home: &Home,
    settings: RepairSettings,
    kubeconfig: std::path::PathBuf,
    watch_backoff: Backoff,
    logs: Option<Logs>,
) -> Running {
    let (stop, rx) = tokio::sync::watch::channel(false);
    let metrics = Metrics::new(settings.action.map(|a| a.metric_type()), true);
    let m = metrics.clone();
    let thread = home.ns.run(move || {
        std::thread::spawn(move || {
            let subscriber = logs.map(|logs| {
                tracing_subscriber::fmt()
                    .with_writer(move || logs.clone())
                    .with_ansi(false)
                    .without_time()
                    .with_max_level(tracing::Level::INFO)
                    .finish()
            });
            let _guard = subscriber.map(tracing::subscriber::set_default);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .unwrap();
                let client = kube::Client::try_from(config).unwrap();
                // The agent's pod informer, as the agent starts it, the controller subscribed.
                let informers = cni_node::informers::Informers::default();
                let mut tasks = tokio::task::JoinSet::new();
                let watching = (
                    cni_node::informers::config(None),
                    watch_backoff,
                    Some(m.watch_gauges()),
                );
                let node = settings.node_name.clone();
                cni_node::informers::start(
                    &client,
                    &node,
                    (&informers, false),
                    watching,
                    &mut tasks,
                    &rx,
                );
                let controller = Controller {
                    pods: informers.pods.clone(),
                    client,
                    settings,
                    plugin: plugin_conf(),
                    metrics: m,
                    backoff: Backoff {
                        base: Duration::from_millis(50),
                        cap: Duration::from_millis(200),
                    },
                    view: Default::default(),
                };
                controller.run(rx).await;
            });
        })
    });
    Running {
        stop,
        thread: Some(thread),
        metrics,
    }
}

/// `istio_cni_repair_pods_repaired_total{type,result}` in the metrics' text (0 when absent).
fn repaired_total(text: &str, kind: &str, result: &str) -> u64 {
    let prefix =
        format!("istio_cni_repair_pods_repaired_total{{type=\"{kind}\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

const WAIT: Duration = Duration::from_secs(20);

fn has_rules(ns: &TestNetns) -> bool {
    redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .is_some()
}

/// Puts a pod on this node whose validation is crash-looping with 126; returns what is stored.
fn put_broken(home: &Home, name: &str, uid: &str, ip: &str) -> serde_json::Value {
    home.cluster()
        .put_pod(pod_object(name, uid, ip, NODE, Validation::Looping(126)))
}

/// A broken pod's namespace, its process in `proc`, and its object in the stand-in.
fn broken_pod(
    home: &Home,
    proc: &FakeProc,
    pid: u32,
    name: &str,
    uid: &str,
    ip: &str,
) -> TestNetns {
    let ns = pod_ns(&[ip]);
    proc.add(pid, &cgroupfs(uid), u64::from(pid), ns.path());
    put_broken(home, name, uid, ip);
    ns
}

#[kernel_test]
fn the_controller_repairs_a_broken_pod_and_the_real_probe_then_passes() {
    let validate = static_bin("redirect-validate");
    let home = home("10.56.0.1");
    let proc = FakeProc::new();
    let ns = pod_ns(&["10.56.0.2"]);
    proc.add(1, &cgroupfs(UID), 5, ns.path());
    let probe = || {
        binary::run_in(
            validate.to_str().unwrap(),
            &ns,
            &Run::args(&[]).user(1337, 1337),
        )
    };
    assert_eq!(probe().code, 126, "the probe fails before the repair");
    let running = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    // The pod's validation fails after the agent started: the status update is the event.
    std::thread::sleep(Duration::from_millis(300));
    put_broken(&home, "web-0", UID, "10.56.0.2");
    let updated = Instant::now();
    eventually("the rules in the pod's namespace", WAIT, || {
        has_rules(&ns).then_some(())
    });
    eprintln!(
        "status update to rules in the namespace: {:.1} ms",
        updated.elapsed().as_secs_f64() * 1000.0
    );
    let ran = probe();
    assert_eq!(ran.code, 0, "the probe after the repair: {ran:?}");
    eventually("the success counted", WAIT, || {
        (repaired_total(&running.metrics.encode(), "repair", "success") == 1).then_some(())
    });
    // Repaired once: further status updates of the same pod (kubelet's restarts) change nothing.
    let mut again = pod_object("web-0", UID, "10.56.0.2", NODE, Validation::Looping(126));
    again["status"]["initContainerStatuses"][0]["restartCount"] = 2.into();
    home.cluster().put_pod(again);
    std::thread::sleep(Duration::from_millis(500));
    let text = running.metrics.encode();
    assert_eq!(repaired_total(&text, "repair", "success"), 1, "{text}");
    assert_eq!(repaired_total(&text, "repair", "fail"), 0, "{text}");
}

/// A sidecar pod with `hostUsers: false` (issue 46): its network namespace belongs to a user
/// namespace of its own (root mapped to 100000, as a runtime maps it). The controller finds it
/// by its cgroup in the host's `/proc` and repairs it there as any pod.
#[kernel_test]
fn a_broken_pod_in_a_user_namespace_is_found_and_repaired() {
    const USERNS_UID: &str = "6a0e3b1c-5d7f-4c2e-8b9a-1f2e3d4c5b6a";
    let home = home("10.56.3.1");
    let proc = FakeProc::new();
    let pod = common::user_ns::UserNsPod::start();
    pod.sh(
        "ip link set lo up && ip link add eth0 type veth peer name eth1 && \
         ip link set eth0 up && ip addr add 10.56.3.2/32 dev eth0",
    );
    let netns = std::path::PathBuf::from(pod.ns("net"));
    proc.add(7, &cgroupfs(USERNS_UID), 7, &netns);
    let in_pod = || {
        redirect_kernel::testing::nft_in(&netns)
            .read()
            .unwrap()
            .is_some()
    };
    assert!(!in_pod());
    let running = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    put_broken(&home, "web-u", USERNS_UID, "10.56.3.2");
    eventually("the rules in the user-namespace pod", WAIT, || {
        in_pod().then_some(())
    });
    eventually("the repair counted", WAIT, || {
        (repaired_total(&running.metrics.encode(), "repair", "success") == 1).then_some(())
    });
}

#[kernel_test]
fn pods_that_are_not_broken_or_not_ours_are_left_alone() {
    let home = home("10.56.1.99");
    let proc = FakeProc::new();
    let uid = |i: u32| format!("00000000-0000-0000-0000-0000000001{i:02}");
    let cases: Vec<(&str, Validation, &str, bool)> = vec![
        ("working", Validation::Running, NODE, true),
        ("just-completed", Validation::Completed, NODE, true),
        ("exit-55", Validation::Looping(55), NODE, true),
        ("no-annotation", Validation::Looping(126), NODE, false),
        ("other-node", Validation::Looping(126), "worker-9", true),
    ];
    let mut namespaces = Vec::new();
    for (i, (name, v, node, annotated)) in cases.iter().enumerate() {
        let i = i as u32 + 1;
        let ip = format!("10.56.1.{i}");
        let ns = pod_ns(&[&ip]);
        proc.add(i, &cgroupfs(&uid(i)), u64::from(i), ns.path());
        let mut pod = pod_object(name, &uid(i), &ip, node, *v);
        if !annotated {
            pod["metadata"]["annotations"]
                .as_object_mut()
                .unwrap()
                .remove("sidecar.istio.io/status");
        }
        home.cluster().put_pod(pod);
        namespaces.push((name.to_string(), ns));
    }
    // A broken pod whose IP is held by the agent's own namespace: never repaired there.
    let own_uid = uid(50);
    proc.add(50, &cgroupfs(&own_uid), 1, home.ns.path());
    put_broken(&home, "own-ip", &own_uid, "10.56.1.99");
    // A broken pod beside them, so that the controller is seen to have worked meanwhile.
    let control = broken_pod(&home, &proc, 60, "control", &uid(60), "10.56.1.60");

    let running = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    eventually("the control pod repaired", WAIT, || {
        has_rules(&control).then_some(())
    });
    // The own-IP pod fails (its namespace is not found) until the bound of 3 attempts.
    eventually("the own-IP pod given up", WAIT, || {
        (repaired_total(&running.metrics.encode(), "repair", "fail") == 3).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    for (name, ns) in &namespaces {
        assert!(!has_rules(ns), "{name}: rules were applied");
    }
    assert!(!has_rules(&home.ns), "rules in the agent's own namespace");
    let text = running.metrics.encode();
    assert_eq!(repaired_total(&text, "repair", "success"), 1, "{text}");
    assert_eq!(repaired_total(&text, "repair", "fail"), 3, "{text}");
    let writes: Vec<_> = home
        .cluster()
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.is_empty(),
        "repair mode writes nothing to the API: {writes:?}"
    );
}

#[kernel_test]
fn delete_mode_deletes_with_preconditions_and_a_warning_event() {
    let home = home("10.56.2.99");
    let proc = FakeProc::new();
    let stored = put_broken(&home, "web-0", UID, "10.56.2.2");
    // A Job's pod never restarts: broken at its first failure in delete mode (istio#49210).
    let mut job = pod_object(
        "job-0",
        OTHER_UID,
        "10.56.2.3",
        NODE,
        Validation::FirstFailure,
    );
    job["spec"]["restartPolicy"] = "Never".into();
    home.cluster().put_pod(job);
    let running = start_controller(&home, repair_settings(Action::Delete, proc.path()));
    eventually("both pods deleted", WAIT, || {
        (home.cluster().pod("bookinfo", "web-0").is_none()
            && home.cluster().pod("bookinfo", "job-0").is_none())
        .then_some(())
    });
    let delete = home
        .cluster()
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE" && r.path.ends_with("/pods/web-0"))
        .expect("a DELETE of web-0");
    let body: serde_json::Value = serde_json::from_str(&delete.body).unwrap();
    assert_eq!(body["preconditions"]["uid"], UID, "{body}");
    assert_eq!(
        body["preconditions"]["resourceVersion"], stored["metadata"]["resourceVersion"],
        "{body}"
    );
    let events = eventually("two events", WAIT, || {
        let e = home.cluster().events();
        (e.len() >= 2).then_some(e)
    });
    let web = events
        .iter()
        .find(|e| e["involvedObject"]["name"] == "web-0")
        .expect("an Event on web-0");
    assert_eq!(web["reason"], "DeleteBrokenPod");
    assert_eq!(web["type"], "Warning");
    assert_eq!(web["involvedObject"]["uid"], UID);
    assert_eq!(
        repaired_total(&running.metrics.encode(), "delete", "success"),
        2
    );
}

#[kernel_test]
fn label_mode_patches_the_status_once_and_then_skips() {
    let home = home("10.56.3.99");
    let proc = FakeProc::new();
    put_broken(&home, "web-0", UID, "10.56.3.2");
    let running = start_controller(&home, repair_settings(Action::Label, proc.path()));
    eventually("the label", WAIT, || {
        let pod = home.cluster().pod("bookinfo", "web-0")?;
        (pod["metadata"]["labels"]["cni.istio.io/uninitialized"] == "true").then_some(())
    });
    // The patch is the next status update: the second pass sees the label and skips.
    eventually("the skip counted", WAIT, || {
        (repaired_total(&running.metrics.encode(), "label", "skip") >= 1).then_some(())
    });
    let patches: Vec<_> = home
        .cluster()
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 1, "one patch: {patches:?}");
    assert!(
        patches[0]
            .path
            .ends_with("/namespaces/bookinfo/pods/web-0/status"),
        "{}",
        patches[0].path
    );
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let events = home.cluster().events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reason"], "LabelBrokenPod");
    assert_eq!(
        repaired_total(&running.metrics.encode(), "label", "success"),
        1
    );
}

#[kernel_test]
fn a_pod_recreated_under_the_same_name_is_a_new_pod() {
    let home = home("10.56.4.99");
    let proc = FakeProc::new();
    let first = broken_pod(&home, &proc, 1, "web-0", UID, "10.56.4.2");
    let _running = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    eventually("the first pod repaired", WAIT, || {
        has_rules(&first).then_some(())
    });
    home.cluster().remove_pod("bookinfo", "web-0");
    let second = broken_pod(&home, &proc, 2, "web-0", OTHER_UID, "10.56.4.3");
    eventually("the second pod repaired", WAIT, || {
        has_rules(&second).then_some(())
    });
}

#[kernel_test]
fn pods_already_broken_when_the_agent_starts_are_repaired() {
    let home = home("10.56.5.99");
    let proc = FakeProc::new();
    let first = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    drop(first);
    // Broken while no agent runs; a new agent finds it in its first listing.
    let ns = broken_pod(&home, &proc, 1, "web-0", UID, "10.56.5.2");
    let _second = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    eventually("the pod repaired", WAIT, || has_rules(&ns).then_some(()));
}

#[kernel_test]
fn retries_stop_at_the_bound_until_the_pod_changes() {
    let home = home("10.56.6.99");
    // No process of the pod anywhere: every attempt fails.
    let proc = FakeProc::new();
    put_broken(&home, "web-0", UID, "10.56.6.2");
    let running = start_controller(&home, repair_settings(Action::Repair, proc.path()));
    let fails = || repaired_total(&running.metrics.encode(), "repair", "fail");
    eventually("3 failures", WAIT, || (fails() == 3).then_some(()));
    // 50 + 100 ms of backoff fit many times in this: no fourth attempt.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(fails(), 3, "retried past the bound");
    // The pod's next change (kubelet restarted its validation) brings it back, with its
    // namespace found this time.
    let ns = pod_ns(&["10.56.6.2"]);
    proc.add(1, &cgroupfs(UID), 5, ns.path());
    let mut again = pod_object("web-0", UID, "10.56.6.2", NODE, Validation::Looping(126));
    again["status"]["initContainerStatuses"][0]["restartCount"] = 2.into();
    home.cluster().put_pod(again);
    eventually("the pod repaired at its next change", WAIT, || {
        has_rules(&ns).then_some(())
    });
    assert_eq!(fails(), 3);
}

// ---------------------------------------------------------------------------------------------
// The whole agent (`agent::Agent`, as `redirect-cni install` starts it): its endpoints, and the
// untaint of its node.

/// A free TCP port in `ns`.
fn free_port(ns: &TestNetns) -> u16 {
    ns.run(|| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    })
}

/// `GET path` on the agent's port from inside `ns`: status code and body.
fn http_get(ns: &TestNetns, port: u16, path: &str) -> (u16, String) {
    cni_testkit::http_get(ns, port, path)
        .unwrap_or_else(|| panic!("GET {path} on port {port} failed"))
}

/// The agent's settings as `redirect-cni install` parses them, for the stand-in's API server
/// (its CA and token in a service-account folder) and this node.
fn agent_settings(
    home: &Home,
    sa: &Path,
    proc: &Path,
    port: u16,
    extra: &[&str],
) -> cni_node::Settings {
    fs::write(sa.join("ca.crt"), home.cluster().ca_pem()).unwrap();
    fs::write(sa.join("token"), common::pki::TOKEN).unwrap();
    let url = home.cluster().url();
    let hostport = url.trim_start_matches("https://").to_owned();
    let (host, api_port) = hostport.rsplit_once(':').unwrap();
    let mut args: Vec<String> = [
        "--service-account-dir",
        sa.to_str().unwrap(),
        "--kubernetes-service-host",
        host,
        "--kubernetes-service-port",
        api_port,
        "--node-name",
        NODE,
        "--repair-host-proc",
        proc.to_str().unwrap(),
        "--repair-netns-dir",
        "/nonexistent",
    ]
    .map(String::from)
    .to_vec();
    args.extend(["--monitoring-port".into(), port.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    match cni_node::settings::parse(args.iter().map(Into::into), &|_| None).unwrap() {
        cni_node::Parsed::Run(s) => *s,
        cni_node::Parsed::Info(i) => panic!("{i}"),
    }
}

#[kernel_test]
fn the_agent_serves_metrics_that_count_its_repairs_and_its_readiness() {
    let home = home("10.56.7.99");
    let proc = FakeProc::new();
    let sa = tempfile::tempdir().unwrap();
    let port = free_port(&home.ns);
    let settings = agent_settings(&home, sa.path(), proc.path(), port, &[]);
    let ns = broken_pod(&home, &proc, 1, "web-0", UID, "10.56.7.2");
    // A second broken pod whose namespace is not found: it fails up to the bound.
    put_broken(&home, "lost-0", OTHER_UID, "10.56.7.3");
    let agent = home
        .ns
        .run(|| cni_node::agent::Agent::start(&settings))
        .unwrap();
    assert_eq!(http_get(&home.ns, port, "/healthz").0, 200);
    let (code, body) = http_get(&home.ns, port, "/readyz");
    assert_eq!(code, 503, "not ready before the installer says so: {body}");
    eventually("the pod repaired", WAIT, || has_rules(&ns).then_some(()));
    let text = eventually(
        "5 failures of the lost pod",
        Duration::from_secs(30),
        || {
            let (_, text) = http_get(&home.ns, port, "/metrics");
            (repaired_total(&text, "repair", "fail") == 5).then_some(text)
        },
    );
    assert_eq!(repaired_total(&text, "repair", "success"), 1, "{text}");
    assert!(
        text.lines().any(|l| l == "istio_cni_install_ready 0"),
        "{text}"
    );
    agent.set_ready(&cni_protocol::events::Readiness::Ready);
    assert_eq!(http_get(&home.ns, port, "/readyz").0, 200);
    let (_, text) = http_get(&home.ns, port, "/metrics");
    assert!(
        text.lines().any(|l| l == "istio_cni_install_ready 1"),
        "{text}"
    );
    assert_eq!(http_get(&home.ns, port, "/nothing").0, 404);
    agent.stop();
}

#[kernel_test]
fn untaint_removes_only_our_taint_and_only_once_ready() {
    let home = home("10.56.8.99");
    let proc = FakeProc::new();
    let sa = tempfile::tempdir().unwrap();
    let taints = serde_json::json!([
        {"key": "cni.istio.io/not-ready", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "mesh", "effect": "NoSchedule"},
        {"key": "cni.istio.io/not-ready", "effect": "NoExecute"},
    ]);
    home.cluster().put_node(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"taints": taints},
    }));
    let port = free_port(&home.ns);
    let settings = agent_settings(
        &home,
        sa.path(),
        proc.path(),
        port,
        &["--untaint-node", "--repair-enabled=false"],
    );
    let agent = home
        .ns
        .run(|| cni_node::agent::Agent::start(&settings))
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        home.cluster().node(NODE).unwrap()["spec"]["taints"],
        taints,
        "untainted before the plugin was installed"
    );
    agent.set_ready(&cni_protocol::events::Readiness::Ready);
    let left = eventually("the taint removed", WAIT, || {
        let t = home.cluster().node(NODE).unwrap()["spec"]["taints"].clone();
        (t.as_array().unwrap().len() < 3).then_some(t)
    });
    assert_eq!(
        left,
        serde_json::json!([{"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}])
    );
    agent.stop();
}

/// The installer binary runs the agent: ready once installed, repairs, stops on SIGTERM. Its
/// idle RSS and CPU are printed (`REDIRECT_IDLE_SECS`, default 3, sets how long it idles;
/// `REDIRECT_AGENT_BIN` runs another build, e.g. the static release binary, for measuring).
#[kernel_test]
fn the_installer_binary_runs_the_agent_until_sigterm() {
    let home = home("10.56.9.99");
    let proc = FakeProc::new();
    let sa = tempfile::tempdir().unwrap();
    let node = tempfile::tempdir().unwrap();
    for d in ["net", "bin", "run"] {
        fs::create_dir(node.path().join(d)).unwrap();
    }
    fs::write(node.path().join("plugin"), b"\x7fELF plugin").unwrap();
    let port = free_port(&home.ns);
    let settings = agent_settings(&home, sa.path(), proc.path(), port, &[]);
    let ns = pod_ns(&["10.56.9.2"]);
    proc.add(1, &cgroupfs(UID), 1, ns.path());
    let p = |d: &str| node.path().join(d).to_str().unwrap().to_owned();
    let args = [
        "--chained-cni-plugin=false".to_string(),
        "--mounted-cni-net-dir".into(),
        p("net"),
        "--cni-bin-dir".into(),
        p("bin"),
        "--cni-agent-run-dir".into(),
        p("run"),
        "--binary".into(),
        p("plugin"),
        "--service-account-dir".into(),
        sa.path().to_str().unwrap().into(),
        "--repair-host-proc".into(),
        proc.path().to_str().unwrap().into(),
        "--monitoring-port".into(),
        port.to_string(),
    ];
    let host = settings.kubernetes_service_host.clone().unwrap();
    let api_port = settings.kubernetes_service_port.clone();
    let child = home.ns.run(move || {
        let bin = std::env::var("REDIRECT_AGENT_BIN")
            .unwrap_or_else(|_| cni_testkit::node_bin().to_owned());
        std::process::Command::new(bin)
            .args(&args)
            .env_clear()
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", api_port)
            .env("NODE_NAME", NODE)
            .env("REPAIR_NETNS_DIR", "/nonexistent")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    });
    let pid = child.id();
    eventually("/readyz 200", WAIT, || {
        (cni_testkit::http_get(&home.ns, port, "/readyz").map(|r| r.0) == Some(200)).then_some(())
    });
    assert!(node.path().join("net/redirect-cni.conf").is_file());
    // The pod's validation fails once the agent runs: from that status update to the rules.
    put_broken(&home, "web-0", UID, "10.56.9.2");
    let updated = Instant::now();
    while !has_rules(&ns) {
        assert!(
            updated.elapsed() < WAIT,
            "the pod was not repaired within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "status update to rules in the pod's namespace: {:.1} ms",
        updated.elapsed().as_secs_f64() * 1000.0
    );
    // Counted once read back, just after the rules are in.
    eventually("the repair counted", WAIT, || {
        let (_, text) = http_get(&home.ns, port, "/metrics");
        (repaired_total(&text, "repair", "success") == 1).then_some(())
    });
    // Idle: nothing changes for a while.
    let idle: u64 = std::env::var("REDIRECT_IDLE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let ticks = || {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = stat.rsplit_once(") ").unwrap().1;
        let f: Vec<u64> = after
            .split(' ')
            .skip(11)
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        f[0] + f[1]
    };
    let before = ticks();
    std::thread::sleep(Duration::from_secs(idle));
    let used = ticks() - before;
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap()
        .to_owned();
    eprintln!(
        "agent idle for {idle} s: {used} CPU ticks ({:.3}% of a core), {rss}",
        used as f64 / (idle as f64 * 100.0) * 100.0
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("pod bookinfo/web-0 repaired"),
        "the log names the pod and the result:\n{stderr}"
    );
    assert!(
        !node.path().join("net/redirect-cni.conf").exists(),
        "uninstalled"
    );
    assert!(!stderr.contains(common::pki::TOKEN), "the token was logged");
}

/// An API server that cannot be reached (every connection closed at once, as a restarting
/// server or a broken network does): one line when the watch fails, none while it keeps
/// failing, and the tries spaced by a doubling delay up to the cap (before: a try every
/// 0.8 s and two lines each: kube's backoff was reset by the watcher's own start of a
/// listing, which also counted as "the watch is back").
#[kernel_test]
fn a_refused_watch_backs_off_and_is_logged_once() {
    let home = home("10.56.8.99");
    let proc = FakeProc::new();
    let closer = home
        .ns
        .run(|| std::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = closer.local_addr().unwrap().port();
    let tries = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
    {
        let tries = tries.clone();
        std::thread::spawn(move || {
            for conn in closer.incoming() {
                tries.lock().unwrap().push(Instant::now());
                drop(conn);
            }
        });
    }
    let kc_text = fs::read_to_string(home.cluster().kubeconfig()).unwrap();
    let server = kc_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    fs::write(
        &kubeconfig,
        kc_text.replace(&server, &format!("https://127.0.0.1:{port}")),
    )
    .unwrap();
    let logs = Logs::default();
    let backoff = Backoff {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(2),
    };
    let running = start_controller_with(
        &home,
        repair_settings(Action::Repair, proc.path()),
        kubeconfig,
        backoff,
        Some(logs.clone()),
    );
    eventually("six tries", Duration::from_secs(30), || {
        (tries.lock().unwrap().len() >= 6).then_some(())
    });
    let text = running.metrics.encode();
    drop(running);
    let at = tries.lock().unwrap().clone();
    for (i, w) in at.windows(2).enumerate().take(5) {
        let gap = w[1] - w[0];
        // Jittered between half and all of the delay (agents that failed together retry
        // apart), less a margin for the scheduler.
        let want = backoff.delay(i as u32).mul_f64(0.45);
        assert!(
            gap >= want,
            "try {}: {gap:?} after the one before, want {want:?} or more ({at:?})",
            i + 2
        );
    }
    assert_eq!(
        logs.count("watching this node's pods failed"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("watching this node's pods again"),
        0,
        "{}",
        logs.text()
    );
    assert!(
        text.lines().any(|l| l == "redirect_cni_repair_watch_up 0"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "redirect_cni_repair_watch_last_list_timestamp_seconds 0.0"),
        "{text}"
    );
}

/// A watch the API server forbids (RBAC) and then allows: one line naming the missing
/// permission, one line when it works again with how long it was down and how many retries,
/// and the gauges say so.
#[kernel_test]
fn a_forbidden_watch_is_logged_once_and_its_end_once() {
    let home = home("10.56.9.99");
    let proc = FakeProc::new();
    home.cluster().fail_next("GET", "/api/v1/pods", 403, 6);
    let logs = Logs::default();
    let kubeconfig = home.cluster().kubeconfig().to_owned();
    let running = start_controller_with(
        &home,
        repair_settings(Action::Repair, proc.path()),
        kubeconfig,
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(400),
        },
        Some(logs.clone()),
    );
    let text = eventually("the watch up", Duration::from_secs(30), || {
        let text = running.metrics.encode();
        text.lines()
            .any(|l| l == "redirect_cni_repair_watch_up 1")
            .then_some(text)
    });
    let listed: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("redirect_cni_repair_watch_last_list_timestamp_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(listed > now - 60.0 && listed <= now + 1.0, "{listed} {now}");
    drop(running);
    let log = logs.text();
    assert_eq!(logs.count("watching this node's pods failed"), 1, "{log}");
    assert_eq!(logs.count("needs list and watch on pods"), 1, "{log}");
    let again: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("watching this node's pods again, after"))
        .collect();
    assert_eq!(again.len(), 1, "{log}");
    assert!(again[0].contains("and 6 retries"), "{log}");
}

// ---- adoption: pods Istio's plugin set up, taken over in place (ADOPT_ISTIO) ----

/// A running sidecar pod on this node, as Istio's plugin left it (its validation passed).
fn running_object(name: &str, uid: &str, ip: &str) -> serde_json::Value {
    let mut pod = pod_object(name, uid, ip, NODE, Validation::Running);
    pod["status"]["phase"] = "Running".into();
    pod
}

/// `redirect_cni_adopted_pods_total{result,form}` (0 when absent).
fn adopted_total(text: &str, result: &str, form: &str) -> u64 {
    let prefix = format!("redirect_cni_adopted_pods_total{{result=\"{result}\",form=\"{form}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

/// Istio's CNI rules for a pod of plugin defaults (its `cni/basic` golden), in `form`:
/// `nft` or `legacy` through that iptables-restore, `native` as Istio 1.27+'s nftables table.
fn with_istios_rules(ns: &TestNetns, form: &str) {
    let data = redirect_testkit::istio::istio_testdata_dir();
    match form {
        "native" => {
            let path = data.join("nftables").join("basic-exclude-nic.golden");
            ns.sh(&format!("nft -f {}", path.display()));
        }
        variant => redirect_testkit::istio::iptables_restore_with(
            ns,
            false,
            &data.join("cni").join("basic.restore"),
            Some(variant),
        ),
    }
}

fn istios_rules_left(ns: &TestNetns) -> String {
    let all = ns.sh("iptables-nft-save; iptables-legacy-save; nft list ruleset");
    all.lines()
        .filter(|l| l.contains("ISTIO_") || l.contains("istio-"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn adopting(mode: AdoptIstio, proc: &Path) -> RepairSettings {
    let mut s = repair_settings(Action::Repair, proc);
    s.enabled = false;
    s.action = None;
    s.adopt_istio = mode;
    s
}

/// Three pods Istio's plugin set up (iptables-nft, iptables-legacy, native nftables) and one
/// with no rule at all: with `replace`, each of the three gets the capture our ADD would apply
/// and loses Istio's rules, counted by form, and the form it held is recorded for a hand-back
/// (iptables-nft and nftables; iptables-legacy, which cannot be handed back to, is not); the
/// fourth is left alone. With `keep`, nothing changes, the pods are counted as kept and nothing
/// is recorded.
#[kernel_test]
fn the_controller_adopts_running_pods_holding_istios_rules_in_place() {
    for mode in [AdoptIstio::Replace, AdoptIstio::Keep] {
        let home = home("10.57.0.1");
        let proc = FakeProc::new();
        let forms = ["nft", "legacy", "native", "none"];
        let uids: Vec<String> = (0..forms.len())
            .map(|i| format!("aaaaaaaa-0000-0000-0000-00000000000{i}"))
            .collect();
        let pods: Vec<TestNetns> = forms
            .iter()
            .enumerate()
            .map(|(i, form)| {
                let ip = format!("10.57.0.{}", i + 10);
                let ns = pod_ns(&[&ip]);
                if *form != "none" {
                    with_istios_rules(&ns, form);
                }
                proc.add(i as u32 + 1, &cgroupfs(&uids[i]), 5 + i as u64, ns.path());
                home.cluster()
                    .put_pod(running_object(&format!("web-{i}"), &uids[i], &ip));
                ns
            })
            .collect();
        let before: Vec<String> = pods.iter().map(istios_rules_left).collect();
        let run_dir = tempfile::tempdir().unwrap();
        let mut settings = adopting(mode, proc.path());
        settings.adopted_forms = Some(run_dir.path().to_owned());
        let running = start_controller(&home, settings);
        let recorded = || cni_node::adopted_forms::all(run_dir.path());
        let counted = |result: &str| {
            let text = running.metrics.encode();
            ["iptables-nft", "iptables-legacy", "nftables"]
                .iter()
                .map(|f| adopted_total(&text, result, f))
                .collect::<Vec<_>>()
        };
        match mode {
            AdoptIstio::Replace => {
                eventually("three pods adopted", WAIT, || {
                    (counted("replaced") == [1, 1, 1]).then_some(())
                });
                for (i, ns) in pods.iter().enumerate().take(3) {
                    assert!(has_rules(ns), "{}: our table", forms[i]);
                    assert_eq!(
                        istios_rules_left(ns),
                        "",
                        "{}: Istio's rules gone",
                        forms[i]
                    );
                }
                let want = [
                    (uids[0].clone(), redirect_core::IstioForm::IptablesNft),
                    (uids[2].clone(), redirect_core::IstioForm::Nftables),
                ];
                assert_eq!(recorded(), want.into_iter().collect());
            }
            _ => {
                eventually("three pods kept", WAIT, || {
                    (counted("kept") == [1, 1, 1]).then_some(())
                });
                for (i, ns) in pods.iter().enumerate().take(3) {
                    assert!(!has_rules(ns), "{}: no table of ours", forms[i]);
                    assert_eq!(istios_rules_left(ns), before[i], "{}: untouched", forms[i]);
                }
                assert!(recorded().is_empty(), "kept pods are not recorded");
            }
        }
        assert!(
            !has_rules(&pods[3]),
            "a pod holding nothing of Istio's is left alone"
        );
        let text = running.metrics.encode();
        assert_eq!(adopted_total(&text, "failed", "unknown"), 0, "{text}");
        assert!(
            text.contains("redirect_cni_adopted_pods_total{result=\"failed\",form=\"unknown\"} 0"),
            "the series is there at zero: {text}"
        );
    }
}
