//! What an operator installs, on a real node: kubelet 1.20 and containerd 1.6 start pods
//! through the CNI config the node agent writes, the agent itself a DaemonSet pod rendered by the
//! Helm chart (`cni_testkit::node`: the whole cluster in namespaces of the test's own). Each
//! pod has Istio's injected shape: the `istio-validation` init container running
//! `redirect-validate` as 1337 with Istio's arguments, an `istio-proxy` container (testpod,
//! listening on 15001 and 15006 as 1337), and an app that connects to 10.96.0.99:80 every
//! second and logs where it landed. Captured means the app's log says `landed 15001
//! 10.96.0.99:80`: real traffic, from inside the pod.
//!
//! Two nodes run at a time (`REDIRECT_REAL_NODES`, 1 to 4; each takes about 700 MiB), and
//! they start one at a time (a start takes both cores for about 20 s): most of a scenario
//! is waiting on kubelet (a crash loop's back-off, a rollout), which another node's start or
//! scenario can fill. Pods are told apart by their node ([`Node::runs`]).

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use cni_testkit::node::{Node, Options};
use redirect_istio::iptables_form::{restore_file, IstioIptables};
use redirect_testkit::kernel_test;
use serde_json::{json, Value};

/// Nodes running, and a start under way.
static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());
static STARTING: Mutex<()> = Mutex::new(());

const TAINT: &str = "cni.istio.io/not-ready";
const CAPTURED: &str = "landed 15001 10.96.0.99:80";
const CONFLIST: &str = "/etc/cni/net.d/10-podnet.conflist";

fn lanes() -> usize {
    match std::env::var("REDIRECT_REAL_NODES") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| (1..=4).contains(n))
            .unwrap_or_else(|| panic!("REDIRECT_REAL_NODES={v:?}: a number from 1 to 4")),
        Err(_) => 2,
    }
}

/// A lane taken: freed when dropped, a failed start's panic included.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let (n, freed) = &RUNNING;
        let mut running = n.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= lanes() {
            running = freed.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (n, freed) = &RUNNING;
        *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

/// A node of a scenario, and its lane: dropping it stops the node, then frees the lane.
struct Lane {
    node: Option<Node>,
    _slot: Slot,
}

impl Deref for Lane {
    type Target = Node;
    fn deref(&self) -> &Node {
        self.node.as_ref().expect("the lane's node")
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // A node's stop (which keeps its logs when the test failed) and another's start (which
        // sweeps dead nodes' folders) must not overlap. The slot is freed after this.
        let _starting = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.node.take());
    }
}

fn node(name: &str, opts: Options) -> Lane {
    let slot = Slot::take();
    let _starting = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    Lane {
        node: Some(Node::start(name, &opts)),
        _slot: slot,
    }
}

fn eventually<T>(node: &Node, what: &str, secs: u64, f: impl FnMut() -> Option<T>) -> T {
    cni_testkit::eventually_or(what, Duration::from_secs(secs), || pods_summary(node), f)
}

/// Every pod and its containers' states, for a failure's message.
fn pods_summary(node: &Node) -> String {
    let out = node.kubectl_output(&["get", "pods", "-A", "-o", "wide"], None);
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    let agent = node.kubectl_output(
        &[
            "-n",
            "kube-system",
            "logs",
            "ds/redirect-cni-node",
            "--tail=30",
        ],
        None,
    );
    s.push_str("\nthe node agent's log:\n");
    s.push_str(&String::from_utf8_lossy(&agent.stdout));
    s
}

/// The chart with its default values, but for the image (the one the suite built, imported
/// into containerd, never pulled) and `flags` (helm's: `--set`, `-f`).
fn install(node: &Node, flags: &[&str]) {
    install_chart(node, flags);
    agent_ready(node);
}

/// `helm install` of the chart as [`install`] does it, without waiting for the agent.
fn install_chart(node: &Node, flags: &[&str]) {
    helm_chart(node, "install", flags);
}

/// `helm <verb>` (install, upgrade) of the chart with the suite's image and `flags`.
fn helm_chart(node: &Node, verb: &str, flags: &[&str]) {
    let mut args = vec![
        verb,
        "redirect-cni",
        "deploy/helm/redirect-cni",
        "-n",
        "kube-system",
        "--set",
        "global.hub=localhost",
        "--set",
        "global.tag=test",
        "--set",
        "global.imagePullPolicy=Never",
    ];
    args.extend_from_slice(flags);
    node.helm(&args);
}

fn agent_ready(node: &Node) {
    let out = node.kubectl_output(
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "ds/redirect-cni-node",
            "--timeout=120s",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "the DaemonSet is not ready: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        pods_summary(node)
    );
}

/// A pod as Istio's injector renders it (with the CNI plugin: a validation container, no
/// istio-init), with our images.
fn injected_pod_spec() -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "initContainers": [{
            "name": "istio-validation",
            "image": "localhost/redirect:test",
            "imagePullPolicy": "Never",
            "command": ["/usr/local/bin/redirect-validate"],
            "args": ["--run-validation", "--skip-rule-apply", "-p", "15001", "-z", "15006",
                "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*",
                "-d", "15090,15021,15020", "--log_output_level=default:info"],
            "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]}}
        }],
        "containers": [
            {"name": "app", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["connect", "10.96.0.99:80", "--every", "1"]},
            {"name": "istio-proxy", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["listen", "15001,15006"],
             "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
        ]
    })
}

fn injected_annotations() -> Value {
    json!({"sidecar.istio.io/status":
        r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#})
}

fn injected_pod(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": injected_annotations()},
        "spec": injected_pod_spec()})
    .to_string()
}

fn injected_deployment(name: &str, replicas: u32) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}, "annotations": injected_annotations()},
                "spec": injected_pod_spec()}}})
    .to_string()
}

fn pod(node: &Node, name: &str) -> Value {
    node.get(&["pod", "-n", "default", name])
        .unwrap_or_else(|| panic!("pod {name} is gone\n{}", pods_summary(node)))
}

fn pods_of(node: &Node, app: &str) -> Vec<Value> {
    let list = node
        .get(&["pods", "-n", "default", "-l", &format!("app={app}")])
        .unwrap();
    list["items"].as_array().unwrap().clone()
}

fn name_of(pod: &Value) -> String {
    pod["metadata"]["name"].as_str().unwrap().to_string()
}

fn validation_status(pod: &Value) -> Value {
    pod["status"]["initContainerStatuses"][0].clone()
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true))
}

/// The app container's log (empty while it has not started).
fn app_log(node: &Node, pod: &str) -> String {
    let out = node.kubectl_output(&["-n", "default", "logs", pod, "-c", "app"], None);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod is Running and its app's first connection, like every later one, landed on the
/// proxy with its original destination: it was captured from its start.
fn captured_from_start(node: &Node, pod: &str) {
    eventually(node, &format!("pod {pod} Running"), 90, || {
        running(&self::pod(node, pod)).then_some(())
    });
    let log = eventually(node, &format!("pod {pod}'s app connected"), 30, || {
        let log = app_log(node, pod);
        log.lines()
            .filter(|l| l.ends_with(CAPTURED))
            .nth(1)
            .is_some()
            .then_some(log)
    });
    // Before the proxy listens (its container starts with the app's), a captured connection is
    // refused at 15001; one not captured would find no host at 10.96.0.99.
    let first = log
        .lines()
        .position(|l| l.ends_with(CAPTURED))
        .unwrap_or(usize::MAX);
    assert!(
        log.lines().enumerate().all(|(i, l)| {
            l.ends_with(CAPTURED) || (i < first && l.contains("Connection refused"))
        }),
        "pod {pod}: not every connection of its app landed on the proxy:\n{log}"
    );
}

/// The pod crash-loops in its validation container: it failed at least twice (a restart, and
/// kubelet backing off), each time with our validator's 126.
fn crash_looping(node: &Node, name: &str) -> Value {
    let p = eventually(
        node,
        &format!("pod {name} in Init:CrashLoopBackOff"),
        90,
        || {
            let p = pod(node, name);
            let v = validation_status(&p);
            (v["restartCount"].as_u64() >= Some(1)
                && v["state"]["waiting"]["reason"] == "CrashLoopBackOff")
                .then_some(p)
        },
    );
    let v = validation_status(&p);
    assert_eq!(v["lastState"]["terminated"]["exitCode"], 126, "{v}");
    // The failed container's log: kubelet may be removing that instance while a restart
    // waits (then `logs` is empty), so the previous instance's too, for a while.
    let logs = |previous: bool| {
        let mut args = vec!["-n", "default", "logs", name, "-c", "istio-validation"];
        if previous {
            args.push("--previous");
        }
        let out = node.kubectl_output(&args, None);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    eventually(
        node,
        &format!("pod {name}'s validation log naming no_rules"),
        30,
        || {
            [logs(false), logs(true)]
                .into_iter()
                .find(|l| l.contains("no_rules"))
        },
    );
    assert!(
        app_log(node, name).is_empty(),
        "the app ran before the validation passed"
    );
    p
}

/// The host PID of a process of the pod (a sidecar pod's proxy, an ambient pod's server),
/// found by the pod's name (kubelet sets HOSTNAME) and the process's command line.
fn proxy_pid(node: &Node, pod: &str) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        // A sidecar pod's proxy, or an ambient pod's server.
        let ours = [
            &b"/testpod\0listen\x0015001,15006\0"[..],
            b"/testpod\0listen\x008080\0",
        ];
        if !ours.contains(&cmdline.as_slice()) || !node.runs(pid) {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ
            .split(|b| *b == 0)
            .any(|kv| kv == format!("HOSTNAME={pod}").as_bytes())
        {
            return pid;
        }
    }
    panic!(
        "no proxy process of pod {pod} on node {}",
        node.dir().display()
    );
}

/// The nftables tables of the namespace `ns` (a descriptor this process holds).
fn tables_in(ns: &std::fs::File) -> String {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd());
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={path}"))
        .args(["nft", "list", "tables"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nft list tables: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Each record of the recording plugin: (CNI_ variables, the config it got).
fn cni_records(node: &Node) -> Vec<(String, Value)> {
    let dir = node.dir().join("varlog/cni-record");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "env"));
    names.sort();
    names
        .iter()
        .map(|env| {
            let json = std::fs::read_to_string(env.with_extension("json")).unwrap_or_default();
            (
                std::fs::read_to_string(env).unwrap(),
                serde_json::from_str(&json).unwrap_or(Value::Null),
            )
        })
        .collect()
}

fn env_value<'a>(env: &'a str, key: &str) -> &'a str {
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or("")
}

/// Prevention, install, capture, what kubelet passes, DEL, uninstall: the node registers
/// tainted, as Istio's docs set it up, with a recorder in its chain.
#[kernel_test]
fn tainted_node_install_capture_and_uninstall() {
    let node = node(
        "install",
        Options {
            taint: Some(TAINT.into()),
            record_cni: true,
        },
    );
    let conflist_before = node.read(CONFLIST).expect("the node's conflist");

    // Prevention: with the taint on, the pod waits unscheduled.
    node.apply(&injected_pod("app"));
    std::thread::sleep(Duration::from_secs(3));
    let p = pod(&node, "app");
    assert_eq!(p["status"]["phase"], "Pending", "{p}");
    assert!(
        p["spec"]["nodeName"].is_null(),
        "scheduled on a tainted node: {p}"
    );

    install_untainting(&node);
    // The pod is scheduled once the taint is gone and captured from its start.
    captured_from_start(&node, "app");
    let p = pod(&node, "app");
    assert_eq!(validation_status(&p)["restartCount"], 0, "{p}");
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", proxy_pid(&node, "app"))).unwrap();
    assert!(
        tables_in(&ns).contains(redirect_core::view::TABLE),
        "{}",
        tables_in(&ns)
    );

    what_kubelet_passed(&node, &p);
    deleting_calls_del(&node, &ns);
    uninstall_restores(&node, &conflist_before);
}

/// Install: the chart's defaults, but for untaintNode and the proxy UID pinned in the plugin's
/// config, which lets it take the pod from the runtime's annotations alone.
fn install_untainting(node: &Node) {
    let values = node.dir().join("values.yaml");
    std::fs::write(
        &values,
        "untaintNode: true\nenv:\n  PLUGIN_CONFIG_JSON: '{\"proxy_uid\":1337}'\n",
    )
    .unwrap();
    let started = Instant::now();
    install(node, &["-f", values.to_str().unwrap()]);
    eprintln!(
        "the DaemonSet was ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let conflist = node.read(CONFLIST).unwrap();
    let chain: Value = serde_json::from_str(&conflist).unwrap();
    let types: Vec<&str> = chain["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["bridge", "portmap", "record", "redirect-cni"],
        "{conflist}"
    );
    assert!(
        node.dir().join("opt/cni/bin/redirect-cni").is_file(),
        "the plugin's binary is not in the node's /opt/cni/bin"
    );
    eventually(node, "the taint removed", 30, || {
        let n = node.get(&["node", "node-1"]).unwrap();
        let tainted = n["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == TAINT));
        (!tainted).then_some(())
    });
}

/// What kubelet and containerd passed: the pod's identity in CNI_ARGS, its annotations in
/// runtimeConfig; so our plugin never read the pod from the API server.
fn what_kubelet_passed(node: &Node, p: &Value) {
    let records = cni_records(node);
    let (env, conf) = records
        .iter()
        .find(|(env, _)| {
            // CNI_ARGS's order varies (containerd builds it from a map): by element.
            env_value(env, "CNI_COMMAND") == "ADD"
                && env_value(env, "CNI_ARGS")
                    .split(';')
                    .any(|a| a == "K8S_POD_NAME=app")
        })
        .unwrap_or_else(|| panic!("no ADD of pod app recorded: {records:?}"));
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let args = env_value(env, "CNI_ARGS");
    for want in [
        "K8S_POD_NAMESPACE=default",
        "K8S_POD_NAME=app",
        "K8S_POD_INFRA_CONTAINER_ID=",
        &format!("K8S_POD_UID={uid}"),
    ] {
        assert!(
            args.split(';').any(|a| a.starts_with(want)),
            "CNI_ARGS {args} lacks {want}"
        );
    }
    assert_eq!(
        conf["runtimeConfig"]["io.kubernetes.cri.pod-annotations"]["sidecar.istio.io/status"],
        injected_annotations()["sidecar.istio.io/status"],
        "{conf}"
    );
    assert!(
        node.metric(
            "redirect_cni_add_phase_duration_seconds_count",
            &[r#"phase="apply""#]
        ) >= 1.0
    );
    assert_eq!(
        node.metric(
            "redirect_cni_add_phase_duration_seconds_count",
            &[r#"phase="pod_read""#]
        ),
        0.0,
        "an ADD read its pod from the API server\n{}",
        node.metrics()
    );
}

/// Deleting the pod: kubelet's DELs (each answered 0), our table gone from the namespace, which
/// this test still holds.
fn deleting_calls_del(node: &Node, ns: &std::fs::File) {
    node.kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        "app",
        "--wait=true",
        "--timeout=60s",
    ]);
    assert!(
        !tables_in(ns).contains(redirect_core::view::TABLE),
        "our table outlived the pod: {}",
        tables_in(ns)
    );
    let dels: Vec<String> = cni_records(node)
        .into_iter()
        .filter(|(env, _)| env_value(env, "CNI_COMMAND") == "DEL")
        .map(|(env, _)| env)
        .collect();
    assert!(!dels.is_empty(), "no DEL recorded");
    let answered = node.metric(
        "redirect_cni_plugin_calls_total",
        &[r#"command="DEL""#, r#"response_code="0""#],
    );
    assert_eq!(
        answered,
        dels.len() as f64,
        "DELs recorded: {dels:?}\n{}",
        node.metrics()
    );
    let empty_netns = dels
        .iter()
        .filter(|e| env_value(e, "CNI_NETNS").is_empty())
        .count();
    eprintln!(
        "kubelet's DELs: {} ({empty_netns} with no namespace), each answered 0",
        dels.len()
    );
}

/// Uninstall: the conflist as it was, our binary gone.
fn uninstall_restores(node: &Node, conflist_before: &str) {
    node.helm(&["uninstall", "redirect-cni", "-n", "kube-system"]);
    eventually(
        node,
        "the node agent gone and the conflist restored",
        60,
        || {
            let gone = node.get(&["pods", "-n", "kube-system"]).unwrap()["items"]
                .as_array()
                .unwrap()
                .is_empty();
            (gone && node.read(CONFLIST).as_deref() == Some(conflist_before)).then_some(())
        },
    );
    assert!(
        !node.dir().join("opt/cni/bin/redirect-cni").exists(),
        "the plugin's binary is left"
    );
}

fn uid(pod: &Value) -> &str {
    pod["metadata"]["uid"].as_str().unwrap()
}

/// The repair controller's count of `kind` results `result`.
fn repaired(node: &Node, kind: &str, result: &str) -> f64 {
    node.metric(
        "istio_cni_repair_pods_repaired_total",
        &[
            &format!(r#"type="{kind}""#),
            &format!(r#"result="{result}""#),
        ],
    )
}

/// The seeds' race, repaired in place (the chart's default): a pod started while the node had
/// no plugin in its chain crash-loops; once the agent is installed it programs the pod's
/// namespace, and kubelet's next restart of the validation passes. Same pod, captured.
#[kernel_test]
fn seeds_race_repaired_in_place() {
    let node = node("in-place", Options::default());
    node.apply(&injected_pod("early"));
    let before = crash_looping(&node, "early");

    install(&node, &[]);
    eventually(&node, "the pod repaired in place", 30, || {
        (repaired(&node, "repair", "success") >= 1.0).then_some(())
    });
    captured_from_start(&node, "early");
    let after = pod(&node, "early");
    assert_eq!(
        uid(&after),
        uid(&before),
        "the pod was replaced, not repaired"
    );
    assert!(
        validation_status(&after)["restartCount"].as_u64() >= Some(1),
        "{after}"
    );
    // The agent read it: with the chart's defaults the plugin's ADD of a new pod also reads the
    // pod (the proxy UID comes from its spec).
    node.apply(&injected_pod("later"));
    captured_from_start(&node, "later");
    assert_eq!(validation_status(&pod(&node, "later"))["restartCount"], 0);
    assert!(
        node.metric(
            "redirect_cni_add_phase_duration_seconds_count",
            &[r#"phase="pod_read""#]
        ) >= 1.0
    );
}

/// Delete mode: the crash-looping pod is deleted, and its ReplicaSet's new pod is captured
/// from its start.
#[kernel_test]
fn seeds_race_delete_mode() {
    let node = node("delete", Options::default());
    node.apply(&injected_deployment("web", 1));
    let early = eventually(&node, "the Deployment's pod", 60, || {
        pods_of(&node, "web").first().map(name_of)
    });
    let before = crash_looping(&node, &early);

    install(
        &node,
        &[
            "--set",
            "repair.repairPods=false",
            "--set",
            "repair.deletePods=true",
        ],
    );
    let new = eventually(&node, "the crash-looping pod replaced", 60, || {
        let pods = pods_of(&node, "web");
        let old_gone = pods.iter().all(|p| uid(p) != uid(&before));
        pods.first()
            .filter(|_| old_gone && pods.len() == 1)
            .map(name_of)
    });
    captured_from_start(&node, &new);
    assert_eq!(validation_status(&pod(&node, &new))["restartCount"], 0);
    assert!(
        repaired(&node, "delete", "success") >= 1.0,
        "{}",
        node.metrics()
    );
}

/// Label mode: the crash-looping pod gets the label, and nothing else changes.
#[kernel_test]
fn seeds_race_label_mode() {
    let node = node("label", Options::default());
    node.apply(&injected_pod("early"));
    let before = crash_looping(&node, "early");

    install(
        &node,
        &[
            "--set",
            "repair.repairPods=false",
            "--set",
            "repair.labelPods=true",
        ],
    );
    let labelled = eventually(&node, "the pod labelled", 60, || {
        let p = pod(&node, "early");
        (p["metadata"]["labels"]["cni.istio.io/uninitialized"] == "true").then_some(p)
    });
    assert_eq!(uid(&labelled), uid(&before));
    // Still the same pod, still failing: kubelet's next restart of the validation fails again.
    let restarts = validation_status(&labelled)["restartCount"]
        .as_u64()
        .unwrap();
    let later = eventually(
        &node,
        "kubelet's next restart of the validation",
        90,
        || {
            let p = pod(&node, "early");
            (validation_status(&p)["restartCount"].as_u64() > Some(restarts)).then_some(p)
        },
    );
    assert_eq!(uid(&later), uid(&before));
    assert_ne!(later["status"]["phase"], "Running", "{later}");
    assert!(app_log(&node, "early").is_empty(), "the app ran uncaptured");
    assert_eq!(
        repaired(&node, "repair", "success") + repaired(&node, "delete", "success"),
        0.0
    );
    assert!(
        repaired(&node, "label", "success") >= 1.0,
        "{}",
        node.metrics()
    );
}

/// A rollout of the DaemonSet (a new image tag) while pods are being created: every pod
/// reaches Running captured from its start, none crash-looping: the old agent saw its
/// DaemonSet stay (SAFE_UPGRADE) and left the plugin in place for the gap (3 to 12 s) until
/// the new agent ran.
#[kernel_test]
fn daemonset_rollout_while_pods_start() {
    let node = node("rollout", Options::default());
    install(&node, &[]);
    let old = node.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-o",
        "jsonpath={.items[0].metadata.uid}",
    ]);
    let tag = node.sh(
        "ctr -a /run/containerd/containerd.sock -n k8s.io images tag localhost/redirect:test localhost/redirect:test2",
    );
    assert!(
        tag.status.success(),
        "retagging the image: {}",
        String::from_utf8_lossy(&tag.stderr)
    );
    node.apply(&injected_deployment("churn", 0));

    const PODS: u32 = 10;
    let without_agent = AtomicU32::new(0);
    let entry_missing = AtomicU32::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for n in 1..=PODS {
                node.kubectl(&[
                    "-n",
                    "default",
                    "scale",
                    "deployment/churn",
                    &format!("--replicas={n}"),
                ]);
                if !agent_running(&node) {
                    without_agent.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
        });
        // The conflist containerd reads, every 100 ms: does it lose our entry?
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if !node
                    .read(CONFLIST)
                    .is_some_and(|c| c.contains("redirect-cni"))
                {
                    entry_missing.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        std::thread::sleep(Duration::from_secs(3));
        node.helm(&[
            "upgrade",
            "redirect-cni",
            "deploy/helm/redirect-cni",
            "-n",
            "kube-system",
            "--reuse-values",
            "--set",
            "global.tag=test2",
        ]);
        agent_ready(&node);
        std::thread::sleep(Duration::from_secs(12));
        done.store(true, Ordering::Relaxed);
    });
    let without_agent = without_agent.into_inner();
    assert!(
        without_agent >= 1,
        "no pod was created while no agent ran: the rollout's gap was missed"
    );
    let new = node.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image} {.items[*].metadata.uid}",
    ]);
    assert!(
        new.starts_with("localhost/redirect:test2 ") && !new.contains(&old),
        "not rolled out: {new}"
    );

    let pods = eventually(&node, "every pod of the Deployment Running", 150, || {
        let pods = pods_of(&node, "churn");
        (pods.len() == PODS as usize && pods.iter().all(running)).then_some(pods)
    });
    let mut restarted = Vec::new();
    for p in &pods {
        captured_from_start(&node, &name_of(p));
        if validation_status(p)["restartCount"].as_u64() > Some(0) {
            restarted.push(name_of(p));
        }
    }
    eprintln!(
        "{PODS} pods created during the rollout ({without_agent} while no agent ran), all \
         captured from their start; {} crash-looped first",
        restarted.len()
    );
    // SAFE_UPGRADE: the old agent left the plugin for the new one, so no pod missed it.
    assert_eq!(
        entry_missing.into_inner(),
        0,
        "our entry left the conflist during the rollout"
    );
    assert!(
        restarted.is_empty(),
        "pods started without the plugin: {restarted:?}"
    );
}

/// Whether the DaemonSet has a pod Running and not being deleted.
fn agent_running(node: &Node) -> bool {
    let pods = node.get(&["pods", "-n", "kube-system"]).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
}

/// ztunnel's stand-in (`testpod ztunnel`), privileged, on the node's `/var/run/ztunnel`.
fn ztunnel_pod() -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ztunnel", "namespace": "istio-system", "labels": {"app": "ztunnel"}},
        "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "ztunnel", "image": "localhost/testpod:test",
                "imagePullPolicy": "Never", "args": ["ztunnel", "/var/run/ztunnel/ztunnel.sock"],
                "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "zds", "mountPath": "/var/run/ztunnel"}]}],
            "volumes": [{"name": "zds",
                "hostPath": {"path": "/var/run/ztunnel", "type": "DirectoryOrCreate"}}]}})
    .to_string()
}

/// An ambient pod (no sidecar): the app connecting out every second, and a server on 8080
/// that kubelet probes (ready only when the probe reaches it: the stand-in does not listen on
/// 15006, so a probe the rules captured would be refused).
fn ambient_pod(name: &str) -> String {
    ambient_pod_in("shop", name)
}

/// [`ambient_pod`] in `namespace`.
fn ambient_pod_in(namespace: &str, name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "app", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["connect", "10.96.0.99:80", "--every", "1"]},
            {"name": "server", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["listen", "8080"],
             "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}})
    .to_string()
}

fn shop_pod(node: &Node, name: &str) -> Value {
    node.get(&["pod", "-n", "shop", name])
        .unwrap_or_else(|| panic!("pod shop/{name} is gone\n{}", pods_summary(node)))
}

fn log_of(node: &Node, namespace: &str, pod: &str, container: &str) -> String {
    let out = node.kubectl_output(&["-n", namespace, "logs", pod, "-c", container], None);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many of the app's connections landed on ztunnel's outbound listener so far.
fn landed(node: &Node, pod: &str) -> usize {
    landed_in(node, "shop", pod)
}

/// [`landed`] for a pod of `namespace`.
fn landed_in(node: &Node, namespace: &str, pod: &str) -> usize {
    let log = log_of(node, namespace, pod, "app");
    log.lines().filter(|l| l.ends_with(CAPTURED)).count()
}

/// Waits for more captured connections than `before`.
fn lands_again(node: &Node, pod: &str, before: usize, what: &str) -> usize {
    eventually(node, what, 60, || {
        let n = landed(node, pod);
        (n > before + 1).then_some(n)
    })
}

fn ztunnel_log(node: &Node) -> String {
    log_of(node, "istio-system", "ztunnel", "ztunnel")
}

/// Ambient mode on a real node, with the chart's `ambient.enabled`: a pod of a namespace
/// labelled ambient is enrolled at its ADD (its app's connections land on ztunnel's listener,
/// bound through the descriptor ztunnel got, from the first one; kubelet's readiness probe
/// reaches it through the host's probe SNAT; `ambient.istio.io/redirection: enabled`); the
/// agent's restart and ztunnel's restart lose nothing; the pod labelled `none` is released.
#[kernel_test]
fn ambient_pod_enrolled_by_label_survives_restarts_and_is_released() {
    let node = node("ambient", Options::default());
    install(&node, &["--set", "ambient.enabled=true"]);
    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "istio-system"}})
        .to_string(),
    );
    node.apply(&ztunnel_pod());
    eventually(
        &node,
        "ztunnel connected and given its snapshot",
        90,
        || {
            ztunnel_log(&node)
                .contains("snapshot received")
                .then_some(())
        },
    );
    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}})
        .to_string(),
    );
    node.apply(&ambient_pod("web"));
    let web = eventually(&node, "shop/web Running and ready", 90, || {
        let p = shop_pod(&node, "web");
        running(&p).then_some(p)
    });
    assert_eq!(
        web["metadata"]["annotations"]["ambient.istio.io/redirection"],
        "enabled"
    );
    let n = lands_again(&node, "web", 0, "web's connections landing on ztunnel");
    let app = log_of(&node, "shop", "web", "app");
    assert!(
        app.lines().all(|l| l.ends_with(CAPTURED)),
        "not every connection of web's app landed on ztunnel:\n{app}"
    );
    assert!(node.metric("redirect_cni_ambient_pods", &["stage=\"enabled\""]) >= 1.0);
    assert_eq!(
        node.metric("redirect_cni_ambient_ztunnel_connected", &[]),
        1.0
    );

    // The agent restarts (its pod deleted, the DaemonSet makes another).
    node.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "pods",
        "--all",
        "--wait=false",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    agent_ready(&node);
    eventually(&node, "ztunnel's second snapshot", 60, || {
        let log = ztunnel_log(&node);
        let snapshots: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("snapshot received"))
            .collect();
        (snapshots.len() >= 2 && snapshots.last()?.contains("serving 1 pod")).then_some(())
    });
    let n = lands_again(&node, "web", n, "web captured after the agent's restart");

    // ztunnel restarts: the new one gets web with its snapshot.
    node.kubectl(&["-n", "istio-system", "delete", "pod", "ztunnel"]);
    node.apply(&ztunnel_pod());
    eventually(&node, "the new ztunnel serving web", 90, || {
        ztunnel_log(&node)
            .contains("snapshot received, serving 1 pod")
            .then_some(())
    });
    lands_again(&node, "web", n, "web captured after ztunnel's restart");
    assert!(running(&shop_pod(&node, "web")), "web not ready any more");

    // Labelled none: released.
    node.kubectl(&[
        "-n",
        "shop",
        "label",
        "pod",
        "web",
        "istio.io/dataplane-mode=none",
    ]);
    eventually(&node, "web's annotation removed", 30, || {
        shop_pod(&node, "web")["metadata"]["annotations"]["ambient.istio.io/redirection"]
            .is_null()
            .then_some(())
    });
    assert!(
        ztunnel_log(&node).contains("del "),
        "{}",
        ztunnel_log(&node)
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = landed(&node, "web");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(landed(&node, "web"), after, "released, but still captured");
}

// ---- issue 45: a node Istio's plugin set up, switched to ours with no pod restarted ----

/// Istio's plugin on the node, as its installer leaves it: an `istio-cni` entry at the end of
/// the chain, and the plugin itself. The plugin is a stand-in that loads Istio's own rules for
/// a pod of plugin defaults the way Istio's programs load them: its CNI golden `cni/basic`
/// with `iptables-<form>-restore` (pods named `nft-*` and `legacy-*`), or its native nftables
/// golden with `nft -f` (`native-*`; Istio 1.28+). The goldens are read from
/// `../shared/testdata/istio`.
fn istio_on(node: &Node) {
    let data = redirect_testkit::istio::istio_testdata_dir();
    let dir = node.dir().join("opt/istio");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(data.join("cni/basic.restore"), dir.join("basic.restore")).unwrap();
    std::fs::copy(
        data.join("nftables/kube-virt-interfaces.golden"),
        dir.join("native.nft"),
    )
    .unwrap();
    // An ambient pod's in-pod rules, as Istio's agent writes them for the chart's defaults.
    let ambient = IstioIptables::ambient(&redirect_core::AmbientConfig::default());
    std::fs::write(dir.join("ambient.restore"), restore_file(&ambient.v4)).unwrap();
    let v6 = ambient.v6.expect("IPv6 is on by default");
    std::fs::write(dir.join("ambient6.restore"), restore_file(&v6)).unwrap();
    let plugin = node.dir().join("opt/cni/bin/istio-cni");
    std::fs::write(
        &plugin,
        r#"#!/bin/sh
# Istio's plugin, stood in: Istio's golden rules into the pod, then the result passed on.
conf=$(cat)
case $CNI_COMMAND in
ADD)
  case "$CNI_ARGS" in
  *K8S_POD_NAME=native-*) nsenter --net="$CNI_NETNS" nft -f /opt/istio/native.nft || exit 1 ;;
  *K8S_POD_NAME=legacy-*) nsenter --net="$CNI_NETNS" iptables-legacy-restore --noflush /opt/istio/basic.restore || exit 1 ;;
  *K8S_POD_NAME=amb-*) nsenter --net="$CNI_NETNS" sh -ec '
    iptables-nft-restore --noflush /opt/istio/ambient.restore
    ip6tables-nft-restore --noflush /opt/istio/ambient6.restore
    for f in -4 -6; do
      ip $f rule add fwmark 0x111/0xfff pref 32764 lookup 100
    done
    ip -4 route add local 0.0.0.0/0 dev lo table 100
    ip -6 route add local ::/0 dev lo table 100' || exit 1
    # The pod's addresses into the host's probe sets, as Istio's agent adds them.
    for a in $(echo "$conf" | python3 -c 'import json, sys
r = json.load(sys.stdin).get("prevResult") or {}
print(" ".join(i["address"].split("/")[0] for i in r.get("ips", [])))'); do
      case $a in
      *:*) ipset add istio-inpod-probes-v6 "$a" ;;
      *) ipset add istio-inpod-probes-v4 "$a" ;;
      esac || exit 1
    done ;;
  *K8S_POD_NAMESPACE=kube-system*) ;;
  *) nsenter --net="$CNI_NETNS" iptables-nft-restore --noflush /opt/istio/basic.restore || exit 1 ;;
  esac
  echo "$conf" | python3 -c 'import json, sys
c = json.load(sys.stdin)
r = c.get("prevResult") or {}
r["cniVersion"] = c["cniVersion"]
print(json.dumps(r))' ;;
VERSION) echo '{"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}' ;;
esac
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut list: Value = serde_json::from_str(&node.read(CONFLIST).unwrap()).unwrap();
    list["plugins"].as_array_mut().unwrap().push(json!({
        "type": "istio-cni", "log_level": "info", "cni_agent_run_dir": "/var/run/istio-cni",
        "ambient_enabled": false, "exclude_namespaces": ["kube-system"],
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-istio-cni-kubeconfig",
            "cni_bin_dir": "/opt/cni/bin", "exclude_namespaces": ["kube-system"]}
    }));
    let out = node.sh(&format!(
        "cat > {CONFLIST}.tmp <<'EOF'\n{}\nEOF\nmv {CONFLIST}.tmp {CONFLIST}",
        serde_json::to_string_pretty(&list).unwrap()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    istio_host_probe(node);
}

/// Istio's host probe SNAT on the node, as its agent writes it at start (Istio's
/// `hostprobe_ipv6` golden, loaded with `iptables-nft-restore` as the agent loads it): the
/// probe sets, then `ISTIO_POSTRT` in `nat`, jumped to first from `POSTROUTING`.
fn istio_host_probe(node: &Node) {
    let rules = |family: &str, snat: &str| {
        format!(
            "*nat\n-N ISTIO_POSTRT\n-I POSTROUTING 1 -j ISTIO_POSTRT\n-A ISTIO_POSTRT -m owner \
             --socket-exists -p tcp -m set --match-set istio-inpod-probes-{family} dst -j SNAT \
             --to-source {snat}\nCOMMIT\n"
        )
    };
    let out = node.sh(&format!(
        "set -e
ipset create istio-inpod-probes-v4 hash:ip comment
ipset create istio-inpod-probes-v6 hash:ip family inet6 comment
iptables-nft-restore --noflush <<'EOF'
{}EOF
ip6tables-nft-restore --noflush <<'EOF'
{}EOF",
        rules("v4", "169.254.7.127"),
        rules("v6", "fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
    ));
    assert!(
        out.status.success(),
        "Istio's host probe rules: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Istio's host probe rules and sets as the node holds them now: `nat` of both families as
/// iptables-nft lists it, and the IP sets with their members.
fn host_probe_rules(node: &Node) -> String {
    let out = node.sh("iptables-nft-save -t nat; ip6tables-nft-save -t nat; ipset list");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The agent's view of the node's pods (`/debug/node`), read as the node's root reads it: on the
/// agent's socket in its run directory (the node's mount namespace). Its monitoring port
/// answers 404 there.
fn node_view(node: &Node) -> Value {
    let out = node.sh(
        "curl -fsS --max-time 5 --unix-socket /var/run/redirect-cni/debug.sock \
         http://agent/debug/node",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = node
        .command("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("http://{}:15014/debug/node", cni_testkit::node::NODE_IP),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&port.stdout),
        "404",
        "the monitoring port serves the node view: {}",
        String::from_utf8_lossy(&port.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An injected pod whose app connects 20 times a second.
fn looping_pod(name: &str) -> String {
    let mut spec = injected_pod_spec();
    spec["containers"][0]["args"] = json!(["connect", "10.96.0.99:80", "--every", "0.05"]);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": injected_annotations()},
        "spec": spec})
    .to_string()
}

/// An ambient pod as Istio's agent left it: labelled ambient and annotated `enabled`, its app
/// connecting 20 times a second, a server on 8080 (no readiness probe: kubelet's probes need
/// the host's probe rules, which the switch moves).
fn ambient_looping_pod(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
            "labels": {"istio.io/dataplane-mode": "ambient"},
            "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "app", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["connect", "10.96.0.99:80", "--every", "0.05"]},
            {"name": "server", "image": "localhost/testpod:test", "imagePullPolicy": "Never",
             "args": ["listen", "8080"]}]}})
    .to_string()
}

/// How many of the pod's app's connections landed on 15001 so far.
fn captured_count(node: &Node, pod: &str) -> usize {
    app_log(node, pod)
        .lines()
        .filter(|l| l.ends_with(CAPTURED))
        .count()
}

/// What the pod's namespace holds, as `nft list tables` and each iptables variant's save print it.
fn rules_in(node: &Node, pod: &str) -> String {
    let net = format!("--net=/proc/{}/ns/net", proxy_pid(node, pod));
    let mut all = String::new();
    for cmd in [
        &["nft", "list", "tables"][..],
        &["iptables-nft-save"],
        &["iptables-legacy-save"],
    ] {
        let out = std::process::Command::new("nsenter")
            .arg(&net)
            .args(cmd)
            .output()
            .unwrap();
        all.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    all
}

fn holds_istios(rules: &str) -> bool {
    rules.contains("ISTIO_") || rules.contains("istio-proxy")
}

/// Every container's restart count of the pod, and its UID: the same sandbox, nothing restarted.
fn restarts(p: &Value) -> (String, Vec<u64>) {
    let counts = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| p["status"][k].as_array().cloned().unwrap_or_default())
        .map(|c| c["restartCount"].as_u64().unwrap_or(u64::MAX))
        .collect();
    (uid(p).to_string(), counts)
}

/// Every connection of the app since its first captured one landed on the proxy.
fn never_lost(node: &Node, pod: &str) -> usize {
    let log = app_log(node, pod);
    let first = log
        .lines()
        .position(|l| l.ends_with(CAPTURED))
        .unwrap_or(usize::MAX);
    let after: Vec<&str> = log.lines().skip(first).collect();
    let lost: Vec<&&str> = after.iter().filter(|l| !l.ends_with(CAPTURED)).collect();
    assert!(
        lost.is_empty(),
        "pod {pod}: {} of {} connections not captured through the switch: {:?}",
        lost.len(),
        after.len(),
        &lost[..lost.len().min(5)]
    );
    after.len()
}

/// Istio set the node up (its config entry, sidecar pods holding its rules in each form, an
/// ambient pod holding its agent's in-pod rules with ztunnel running, its host probe SNAT and
/// IP sets, apps connecting 20 times a second); installing the chart (ambient on) switches it:
/// the config entry taken over, the iptables-nft and native nftables pods captured by our
/// table with Istio's rules gone, the iptables-legacy pod kept (the agent's image has no
/// iptables-legacy-save) and shown, the ambient pod adopted and given to ztunnel (never a
/// delete), Istio's host rules gone with the pod's address in our probe set, no container
/// restarted, no connection lost, and a pod created during the switch captured by ours. Then
/// handed back to Istio on the same node ([`hand_back`]).
///
/// Seen failing on a deliberately broken agent (each a build of its own): with Istio's host
/// rules never removed, "Istio's host probe rules left"; with an ambient pod's in-pod rules
/// kept beside ours, "amb-0 adopted and served by ztunnel: not within 60s"; with ambient pods
/// handed back as sidecar pods, "amb-0: no \"-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j
/// CONNMARK --set-xmark 0x111/0xfff\"".
#[kernel_test]
fn a_node_istio_set_up_is_switched_to_ours_with_no_pod_restarted() {
    let node = node("switch", Options::default());
    istio_on(&node);
    // ztunnel, and an ambient pod holding the in-pod rules Istio's agent wrote: no agent
    // serves ztunnel yet, so the app's connections are refused at 15001 until the switch.
    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "istio-system"}})
        .to_string(),
    );
    node.apply(&ztunnel_pod());
    node.apply(&ambient_looping_pod("amb-0"));
    let forms = ["nft-0", "legacy-0", "native-0"];
    for p in forms {
        node.apply(&looping_pod(p));
    }
    for p in forms {
        captured_from_start(&node, p);
        assert!(
            holds_istios(&rules_in(&node, p)),
            "{p}: Istio's rules: {}",
            rules_in(&node, p)
        );
        assert!(
            !rules_in(&node, p).contains(redirect_core::view::TABLE),
            "{p}"
        );
    }
    eventually(&node, "pod amb-0 Running", 90, || {
        running(&pod(&node, "amb-0")).then_some(())
    });
    let amb = rules_in(&node, "amb-0");
    assert!(
        amb.contains("-A ISTIO_PRERT ") && !amb.contains(redirect_core::view::TABLE),
        "{amb}"
    );
    let amb_ip = pod(&node, "amb-0")["status"]["podIP"]
        .as_str()
        .expect("amb-0's address")
        .to_string();
    let host = host_probe_rules(&node);
    assert!(
        host.contains("-A ISTIO_POSTRT ") && host.contains(&amb_ip),
        "Istio's host probe rules, amb-0 ({amb_ip}) in its set: {host}"
    );
    let amb_before = restarts(&pod(&node, "amb-0"));
    let before: Vec<(String, Vec<u64>)> = forms.iter().map(|p| restarts(&pod(&node, p))).collect();

    let switch = Instant::now();
    install_chart(&node, &["--set", "ambient.enabled=true"]);
    // A pod created while the agent starts: whichever plugin sets it up, it ends with ours.
    node.apply(&looping_pod("during-0"));
    agent_ready(&node);
    eventually(
        &node,
        "the iptables-nft and native pods adopted",
        60,
        || {
            let replaced = |form| {
                node.metric(
                    "redirect_cni_adopted_pods_total",
                    &[r#"result="replaced""#, &format!(r#"form="{form}""#)],
                )
            };
            (replaced("iptables-nft") >= 1.0 && replaced("nftables") >= 1.0).then_some(())
        },
    );
    eprintln!(
        "the switch: helm install to both pods adopted in {:.1} s",
        switch.elapsed().as_secs_f64()
    );
    // Let the loops run on our rules.
    std::thread::sleep(Duration::from_secs(3));

    let list: Value = serde_json::from_str(&node.read(CONFLIST).unwrap()).unwrap();
    let types: Vec<&str> = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert!(types.contains(&"redirect-cni"), "{types:?}");
    assert!(
        !types.contains(&"istio-cni"),
        "Istio's entry taken over: {types:?}"
    );
    for p in ["nft-0", "native-0", "during-0"] {
        let rules = rules_in(&node, p);
        assert!(
            rules.contains(redirect_core::view::TABLE),
            "{p}: our table: {rules}"
        );
        assert!(!holds_istios(&rules), "{p}: Istio's rules gone: {rules}");
    }
    // iptables-legacy with no binary in the agent's image: kept, capturing, counted.
    assert!(
        holds_istios(&rules_in(&node, "legacy-0")),
        "{}",
        rules_in(&node, "legacy-0")
    );
    assert!(
        node.metric(
            "redirect_cni_adopted_pods_total",
            &[r#"result="kept""#, r#"form="iptables-legacy""#]
        ) >= 1.0
    );
    // The node view says what each pod held and what became of it.
    let view = node_view(&node);
    let entry = |name: &str| {
        view["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in the node view: {view:#}"))
    };
    for p in ["nft-0", "native-0"] {
        let e = entry(p);
        assert_eq!(e["state"], "adopted", "{e:#}");
        assert_eq!(e["last_repair"]["kind"], "adopted", "{e:#}");
    }
    let legacy = entry("legacy-0");
    assert_eq!(legacy["state"], "istio", "{legacy:#}");
    assert!(
        legacy["attention"]
            .as_str()
            .is_some_and(|a| a.contains("iptables-legacy")),
        "{legacy:#}"
    );
    for (p, was) in forms.iter().zip(&before) {
        assert_eq!(
            &restarts(&pod(&node, p)),
            was,
            "{p}: same pod, nothing restarted"
        );
        let made = never_lost(&node, p);
        eprintln!("pod {p}: {made} connections through the switch, none lost");
    }
    captured_from_start(&node, "during-0");
    never_lost(&node, "during-0");
    // The ambient pod: ours in place of Istio's in-pod rules, ztunnel given it in a snapshot
    // (never a delete), its app's connections landing on ztunnel's listener.
    let landed = eventually(&node, "amb-0 adopted and served by ztunnel", 60, || {
        let rules = rules_in(&node, "amb-0");
        let ours = rules.contains(redirect_core::view::TABLE) && !holds_istios(&rules);
        let n = captured_count(&node, "amb-0");
        (ours && n >= 2).then_some(n)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        captured_count(&node, "amb-0") > landed,
        "amb-0's app stopped landing"
    );
    assert_eq!(
        restarts(&pod(&node, "amb-0")),
        amb_before,
        "amb-0 restarted"
    );
    let made = never_lost(&node, "amb-0");
    eprintln!("pod amb-0: {made} connections since ztunnel got it, none lost");
    assert!(
        !ztunnel_log(&node).contains("ztunnel: del "),
        "{}",
        ztunnel_log(&node)
    );
    // Istio's host probe SNAT gone (ours holds: its table, amb-0 in its set), chain and sets.
    let host = host_probe_rules(&node);
    assert!(
        !host.contains("ISTIO_POSTRT") && !host.contains("istio-inpod-probes"),
        "Istio's host probe rules left: {host}"
    );
    let ours = node.sh("nft list table inet redirect_ambient_host");
    assert!(
        String::from_utf8_lossy(&ours.stdout).contains(&amb_ip),
        "our probe table, amb-0 ({amb_ip}) in its set: {}{}",
        String::from_utf8_lossy(&ours.stdout),
        String::from_utf8_lossy(&ours.stderr)
    );
    hand_back(&node);
}

/// The way back on the same node (after the switch above): adoption off and the hand-back
/// asked for in the form each pod held before (`as-adopted`, the default of the command), the
/// agent restarted (an upgrade: it keeps the plugin and hands nothing back), then `helm
/// uninstall`: each pod ours held now holds Istio's rules in the form it held when adopted
/// (nft-0 and the ambient pod Istio's iptables rules as iptables-nft keeps them, native-0
/// Istio's nftables tables; during-0, never adopted, the form most adopted pods held), written
/// by the agent with no binary, and not ours; the ambient pod the in-pod rules Istio's agent
/// writes (ztunnel still serving it); the iptables-legacy pod still Istio's; no container
/// restarted, no connection lost. Seen failing with the hand-back left off
/// (`cni.handBackOnUninstall=off`): "nft-0: Istio's rules" (the pod still held ours).
fn hand_back(node: &Node) {
    let pods = ["nft-0", "legacy-0", "native-0", "during-0", "amb-0"];
    let before: Vec<(String, Vec<u64>)> = pods.iter().map(|p| restarts(&pod(node, p))).collect();
    node.helm(&[
        "upgrade",
        "redirect-cni",
        "deploy/helm/redirect-cni",
        "-n",
        "kube-system",
        "--reuse-values",
        "--set",
        "cni.adoptIstio=off",
        "--set",
        "cni.handBackOnUninstall=as-adopted",
    ]);
    node.kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        "ds/redirect-cni-node",
    ]);
    agent_ready(node);
    for p in ["nft-0", "native-0", "during-0"] {
        assert!(
            rules_in(node, p).contains(redirect_core::view::TABLE),
            "{p}: a restart handed back: {}",
            rules_in(node, p)
        );
    }
    let back = Instant::now();
    node.helm(&["uninstall", "redirect-cni", "-n", "kube-system"]);
    eventually(node, "the node agent gone", 60, || {
        node.get(&["pods", "-n", "kube-system"]).unwrap()["items"]
            .as_array()
            .unwrap()
            .is_empty()
            .then_some(())
    });
    eprintln!(
        "the hand-back: helm uninstall to the agent gone in {:.1} s",
        back.elapsed().as_secs_f64()
    );
    for p in ["nft-0", "native-0", "during-0"] {
        let rules = rules_in(node, p);
        let iptables = rules.contains("-A ISTIO_OUTPUT ") && rules.contains("-A ISTIO_REDIRECT ");
        let nftables = rules.contains("table inet istio-proxy-nat");
        // Each in the form it held: native-0 in Istio's nftables tables, the others (during-0
        // as most adopted pods) in its iptables rules.
        let want = if p == "native-0" { nftables } else { iptables };
        assert!(
            want && !(iptables && nftables),
            "{p}: Istio's rules in its form: {rules}"
        );
        assert!(
            !rules.contains(redirect_core::view::TABLE),
            "{p}: ours gone: {rules}"
        );
    }
    assert!(
        holds_istios(&rules_in(node, "legacy-0")),
        "{}",
        rules_in(node, "legacy-0")
    );
    // The ambient pod: the in-pod rules Istio's agent writes, ztunnel still serving it (it
    // waits for Istio's agent on the same socket path), never sent a delete.
    let amb = rules_in(node, "amb-0");
    for rule in [
        "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
        "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
    ] {
        assert!(amb.contains(rule), "amb-0: no {rule:?}: {amb}");
    }
    assert!(
        !amb.contains(redirect_core::view::TABLE),
        "amb-0: ours gone: {amb}"
    );
    assert!(
        !ztunnel_log(node).contains("ztunnel: del "),
        "{}",
        ztunnel_log(node)
    );
    // Let the loops run on Istio's tables.
    std::thread::sleep(Duration::from_secs(3));
    for (p, was) in pods.iter().zip(&before) {
        assert_eq!(
            &restarts(&pod(node, p)),
            was,
            "{p}: same pod, nothing restarted"
        );
        let made = never_lost(node, p);
        eprintln!("pod {p}: {made} connections through both switches, none lost");
    }
}

// ---- issue 46: Istio 1.31's values on a node ----

/// The owned config file Istio 1.31's `istioOwnedCNIConfig` writes, as the node sees it.
const OWNED: &str = "/etc/cni/net.d/02-istio-cni.conflist";

/// Istio 1.31's values for a cluster-wide ambient rollout with an owned config file, as an
/// operator writes them for Istio's chart.
const VALUES_131: &str = "\
profile: ambient
istioOwnedCNIConfig: true
ambient:
  enablementSelectors:
  - podSelector:
      matchExpressions:
      - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}
    namespaceSelector:
      matchExpressions:
      - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}
";

/// The annotation `ambient.istio.io/redirection` of a pod, `None` when absent.
fn redirection_of(node: &Node, namespace: &str, name: &str) -> Option<String> {
    let p = node.get(&["pod", "-n", namespace, name])?;
    p["metadata"]["annotations"]["ambient.istio.io/redirection"]
        .as_str()
        .map(String::from)
}

/// Istio 1.31's values on a real node: with an owned config file the node's primary CNI file
/// stays byte for byte through the install, its owner's rewrite (our copy follows) and the
/// uninstall; the cluster-wide opt-out enrolls a pod of an unlabelled namespace and not one of
/// a namespace labelled `none` (nor ztunnel); `kubectl logs` of the agent shows the plugin's
/// line for the pod's ADD; Istio's metric names are scraped with their meaning; and a helm
/// upgrade back to Istio's default selectors releases the pod.
#[kernel_test]
fn istio_131_values_owned_config_opt_out_selectors_plugin_logs_and_metrics() {
    let node = node("values131", Options::default());
    let primary = node.read(CONFLIST).expect("the node's conflist");
    let values = node.dir().join("values-131.yaml");
    std::fs::write(&values, VALUES_131).unwrap();
    let values = values.to_str().unwrap().to_string();
    install(&node, &["-f", &values]);
    assert_eq!(
        node.read(CONFLIST).as_deref(),
        Some(primary.as_str()),
        "the primary was written"
    );
    let owned: Value = serde_json::from_str(&node.read(OWNED).expect("no owned file")).unwrap();
    let types: Vec<&str> = owned["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(types.last(), Some(&"redirect-cni"), "{owned}");

    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}})
            .to_string(),
    );
    node.apply(&ztunnel_pod());
    eventually(&node, "ztunnel connected", 90, || {
        ztunnel_log(&node)
            .contains("snapshot received")
            .then_some(())
    });
    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}})
            .to_string(),
    );
    node.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "legacy", "labels": {"istio.io/dataplane-mode": "none"}}})
        .to_string(),
    );
    node.apply(&ambient_pod_in("plain", "web"));
    node.apply(&ambient_pod_in("legacy", "old"));
    for (ns, name) in [("plain", "web"), ("legacy", "old")] {
        eventually(&node, &format!("{ns}/{name} running"), 90, || {
            node.get(&["pod", "-n", ns, name])
                .filter(running)
                .map(|_| ())
        });
    }
    assert_eq!(
        redirection_of(&node, "plain", "web").as_deref(),
        Some("enabled")
    );
    eventually(&node, "web's connections landing on ztunnel", 60, || {
        (landed_in(&node, "plain", "web") > 1).then_some(())
    });
    assert_eq!(
        redirection_of(&node, "legacy", "old"),
        None,
        "a pod of a namespace labelled none was enrolled"
    );
    assert_eq!(
        redirection_of(&node, "istio-system", "ztunnel"),
        None,
        "ztunnel was enrolled"
    );
    assert_eq!(
        landed_in(&node, "legacy", "old"),
        0,
        "old's traffic was captured"
    );

    // The plugin's line for web's ADD, where operators look.
    let logs = node.kubectl(&["-n", "kube-system", "logs", "ds/redirect-cni-node"]);
    assert!(
        logs.contains("plugin ADD plain/web: ADD plain/web: end: enrolled in ambient mode"),
        "{logs}"
    );

    // Istio's metric names, with their meaning.
    assert_eq!(node.metric("ztunnel_connected", &[]), 1.0);
    assert!(
        node.metric(
            "istio_cni_plugin_requests_total",
            &[r#"response_code="200""#]
        ) >= 1.0,
        "{}",
        node.metrics()
    );
    assert!(
        node.metric("nodeagent_reconcile_events_total", &[r#"type="add""#]) >= 3.0,
        "{}",
        node.metrics()
    );

    // The primary's owner rewrites its file: our copy follows, theirs is left as they wrote it.
    let rewritten = primary.replacen("{", "{\"redirect-test\": \"rewritten\",", 1);
    let script = format!("cat > /etc/cni/net.d/.podnet.tmp <<'EOF'\n{rewritten}EOF\nmv /etc/cni/net.d/.podnet.tmp {CONFLIST}");
    assert!(node.sh(&script).status.success());
    eventually(&node, "the owned copy following the primary", 30, || {
        node.read(OWNED)?.contains("redirect-test").then_some(())
    });
    assert_eq!(node.read(CONFLIST).as_deref(), Some(rewritten.as_str()));

    // Back to Istio's default selectors (a values change and the DaemonSet's rollout): web,
    // in a namespace no longer selected, is released.
    let defaults = values.replace("values-131.yaml", "values-default.yaml");
    std::fs::write(&defaults, "profile: ambient\nistioOwnedCNIConfig: true\n").unwrap();
    helm_chart(&node, "upgrade", &["-f", &defaults]);
    node.kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        "ds/redirect-cni-node",
    ]);
    eventually(
        &node,
        "web released by Istio's default selectors",
        120,
        || {
            redirection_of(&node, "plain", "web")
                .is_none()
                .then_some(())
        },
    );
    let after = landed_in(&node, "plain", "web");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        landed_in(&node, "plain", "web"),
        after,
        "released, but still captured"
    );

    // The uninstall: the owned file goes, the primary stays as its owner left it.
    node.helm(&["uninstall", "redirect-cni", "-n", "kube-system"]);
    eventually(&node, "the owned file removed", 60, || {
        node.read(OWNED).is_none().then_some(())
    });
    assert_eq!(node.read(CONFLIST).as_deref(), Some(rewritten.as_str()));
}
