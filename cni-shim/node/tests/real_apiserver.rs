//! The Kubernetes-facing parts against a real API server (kube-apiserver 1.20 and etcd,
//! `common::apiserver`), with the RBAC of `deploy/` applied as written and the agent's
//! token from the TokenRequest API:
//!
//! - the plugin's pod read: a real pod object (annotations, containers, the proxy's
//!   `runAsUser`), a pod that does not exist (bounded by `kube_deadline_ms`), a token whose
//!   account may not read pods;
//! - the node agent (`redirect-cni-node`) in each repair mode: repair in place; delete and
//!   label, each failing clearly without its extra RBAC file and acting once it is applied;
//!   untaint of a real Node, likewise; the Events as `kubectl get events` shows them;
//!
//! (The manifests and the Helm chart against the same server: `deploy/tests/real_apiserver.rs`.)
//!
//! What the stand-in (`common::cluster`) still covers, because a real server cannot be made to
//! do it: a silent server, 410 Gone on a watch, injected faults (`kube_api.rs`, `repair.rs`).
//! The API is 1.20: native sidecars (an init container's `restartPolicy: Always`, 1.28) do not
//! exist there, so the pod read of a native-sidecar pod stays tested on the stand-in.

use cni_testkit as common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::apiserver::{ControlPlane, SYSTEM};
use common::host_proc::{cgroupfs, FakeProc};
use common::{cni_env, node_bin, plugin};
use redirect_testkit::{kernel_test, TestNetns};
use serde_json::{json, Value};

const NODE: &str = "worker-2";
const WAIT: Duration = Duration::from_secs(30);
/// OpenShift gives each namespace its own UID range; the proxy runs as one of them.
const OPENSHIFT_UID: u32 = 1_000_770_000;

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    cni_testkit::eventually(what, WAIT, f)
}

/// [`eventually`], whose failure also shows `context()` as it is then (an agent's log).
fn eventually_or<T>(what: &str, context: impl Fn() -> String, f: impl FnMut() -> Option<T>) -> T {
    cni_testkit::eventually_or(what, WAIT, context, f)
}

/// Istio's sidecar pod (the fixture) as a user creates it: in `namespace`, on this node, its
/// proxy running as `uid`; the server fills in uid, resourceVersion and the rest.
fn new_pod(namespace: &str, name: &str, uid: Option<u32>) -> Value {
    let mut pod = cni_testkit::fixtures::istio_pod_to_create(namespace, name, NODE);
    if let Some(uid) = uid {
        for c in pod["spec"]["containers"].as_array_mut().unwrap() {
            if c["name"] == "istio-proxy" {
                c["securityContext"]["runAsUser"] = uid.into();
                c["securityContext"]["runAsGroup"] = uid.into();
            }
        }
    }
    pod
}

/// Creates `pod`; returns it as stored (with the server's uid).
fn create(cp: &ControlPlane, pod: &Value) -> Value {
    let out = cp.kubectl_in(&["create", "-o", "json", "-f", "-"], Some(&pod.to_string()));
    assert!(
        out.status.success(),
        "kubectl create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Writes the pod's `status` (merged) as kubelet would.
fn patch_status(cp: &ControlPlane, namespace: &str, name: &str, status: Value) {
    cp.set_pod_status(namespace, name, &status);
}

/// The validation init container's status: in `state`, last terminated with 126.
fn validation(ready: bool, restarts: u32, state: Value) -> Value {
    json!([{
        "name": "istio-validation", "image": "proxyv2", "imageID": "", "ready": ready,
        "restartCount": restarts, "state": state,
        "lastState": {"terminated": {"exitCode": 126, "reason": "Error"}},
    }])
}

/// The pod's validation crash-looping with 126, and its IP.
fn break_pod(cp: &ControlPlane, namespace: &str, name: &str, ip: &str) {
    let waiting = json!({"waiting": {"reason": "CrashLoopBackOff"}});
    patch_status(
        cp,
        namespace,
        name,
        json!({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
            "initContainerStatuses": validation(false, 1, waiting)}),
    );
}

/// The pod's validation passed at its restart (the capture was there).
fn heal_pod(cp: &ControlPlane, namespace: &str, name: &str) {
    let done = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
    patch_status(
        cp,
        namespace,
        name,
        json!({"initContainerStatuses": validation(true, 2, done)}),
    );
}

/// A change to the pod (an annotation) that makes the controller look at it again.
fn touch(cp: &ControlPlane, namespace: &str, name: &str, n: u32) {
    cp.kubectl_ok(&[
        "annotate",
        "--overwrite",
        "pod",
        name,
        "-n",
        namespace,
        &format!("test/touched={n}"),
    ]);
}

/// A pod namespace holding `ip` on a veth.
fn pod_ns(ip: &str) -> TestNetns {
    let ns = TestNetns::with_prefix("rdapi");
    ns.ip_batch(
        false,
        &[
            "link add eth0 type veth peer name eth1".to_string(),
            "link set eth0 up".into(),
            format!("addr add {ip}/32 dev eth0"),
        ],
    );
    ns
}

fn has_rules(ns: &TestNetns) -> bool {
    redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .is_some()
}

/// The agent (`cni_testkit::agent`) on temporary node folders, against the real API server
/// with the service account in `sa`.
struct Agent {
    inner: common::agent::Agent,
    _node: tempfile::TempDir,
}

impl Agent {
    fn start(cp: &ControlPlane, sa: &Path, proc: &Path, extra: &[&str]) -> Agent {
        let node = tempfile::tempdir().unwrap();
        let inner = common::agent::Agent::start(&common::agent::AgentSpec {
            cp,
            sa,
            proc,
            node: node.path(),
            node_name: NODE,
            bin: Path::new(node_bin()),
            plugin: Path::new(common::plugin_bin()),
            extra,
            api_port: None,
            netns: None,
            env: &[],
            umask: None,
        });
        Agent { inner, _node: node }
    }

    fn log(&self) -> String {
        self.inner.log()
    }

    /// Waits for a log line holding every one of `words`; returns it.
    fn line_with(&self, words: &[&str]) -> String {
        self.inner.line_with(words)
    }
}

/// The control plane with `deploy/kubernetes/redirect-cni.yaml` applied as written, and
/// the agent's service account folder.
fn deployed() -> (ControlPlane, tempfile::TempDir) {
    let cp = ControlPlane::start();
    cp.namespace(SYSTEM);
    cp.install("kubernetes/redirect-cni.yaml");
    let sa = cp.service_account_dir(SYSTEM, "redirect-cni");
    (cp, sa)
}

#[kernel_test]
fn the_agent_repairs_deletes_labels_and_untaints_with_the_rbac_of_deploy() {
    let t0 = Instant::now();
    let (cp, sa) = deployed();
    cp.namespace("shop");
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
            "spec": {"taints": [
                {"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "mesh", "effect": "NoSchedule"}]}})
        .to_string(),
    );

    // Repair in place (the default mode, the base RBAC) and untaint (refused until
    // untaint-node.yaml is applied).
    let proc = FakeProc::new();
    let stored = create(&cp, &new_pod("shop", "web-0", None));
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let ns = pod_ns("10.58.0.2");
    proc.add(1, &cgroupfs(&uid), 1, ns.path());
    let agent = Agent::start(&cp, sa.path(), proc.path(), &["--untaint-node"]);
    let refused = agent.line_with(&["taint", "forbidden"]);
    assert!(refused.contains(NODE), "{refused}");
    break_pod(&cp, "shop", "web-0", "10.58.0.2");
    eventually_or(
        "web-0 repaired in place",
        || agent.log(),
        || has_rules(&ns).then_some(()),
    );
    agent.line_with(&["pod shop/web-0 repaired"]);
    cp.install("kubernetes/untaint-node.yaml");
    // The server's own admission (TaintNodesByCondition) adds node.kubernetes.io/not-ready to
    // a new node: ours goes, every other taint stays.
    let keys = |node: Value| -> Vec<String> {
        node["spec"]["taints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let left = eventually_or(
        "the taint removed",
        || agent.log(),
        || {
            let k = keys(cp.get(&["node", NODE]));
            (!k.iter().any(|k| k == "cni.istio.io/not-ready")).then_some(k)
        },
    );
    assert_eq!(left, ["dedicated", "node.kubernetes.io/not-ready"]);
    agent.line_with(&["removed the taint cni.istio.io/not-ready from node worker-2"]);
    drop(agent);
    heal_pod(&cp, "shop", "web-0");

    // Delete: forbidden without repair-delete-pods.yaml, then done, with its Event. Beside it,
    // broken pods that are not this agent's: one on another node (the server's field selector
    // keeps it from the watch) and one without a sidecar (the agent's filter).
    create(&cp, &new_pod("shop", "web-1", None));
    break_pod(&cp, "shop", "web-1", "10.58.0.3");
    let mut elsewhere = new_pod("shop", "elsewhere-0", None);
    elsewhere["spec"]["nodeName"] = "worker-9".into();
    create(&cp, &elsewhere);
    break_pod(&cp, "shop", "elsewhere-0", "10.58.0.5");
    let mut plain = new_pod("shop", "plain-0", None);
    plain["metadata"]["annotations"] = json!({});
    create(&cp, &plain);
    break_pod(&cp, "shop", "plain-0", "10.58.0.6");
    let agent = Agent::start(
        &cp,
        sa.path(),
        proc.path(),
        &["--repair-repair-pods=false", "--repair-delete-pods=true"],
    );
    let line = agent.line_with(&["shop/web-1", "forbidden"]);
    assert!(
        line.contains("delete"),
        "the refusal names what was refused: {line}"
    );
    assert!(
        cp.get(&["pod", "web-1", "-n", "shop"])["metadata"]["deletionTimestamp"].is_null(),
        "deleted without the RBAC"
    );
    cp.install("kubernetes/repair-delete-pods.yaml");
    touch(&cp, "shop", "web-1", 1);
    // Bound to this node and no kubelet to confirm: the deletion is graceful and stays pending.
    eventually_or(
        "web-1 deleted",
        || agent.log(),
        || {
            let pod = cp.get(&["pod", "web-1", "-n", "shop"]);
            (!pod["metadata"]["deletionTimestamp"].is_null()).then_some(())
        },
    );
    let events = eventually("the DeleteBrokenPod event", || {
        let e = cp.get(&[
            "events",
            "-n",
            "shop",
            "--field-selector",
            "reason=DeleteBrokenPod,involvedObject.name=web-1",
        ]);
        (!e["items"].as_array().unwrap().is_empty()).then_some(e)
    });
    let event = &events["items"][0];
    assert_eq!(event["involvedObject"]["name"], "web-1", "{event}");
    // Gone for good (as kubelet would confirm) and created again under the same name: a new
    // pod (a new uid), broken again, deleted again.
    let first_uid = cp.get(&["pod", "web-1", "-n", "shop"])["metadata"]["uid"].clone();
    cp.kubectl_ok(&[
        "delete",
        "pod",
        "web-1",
        "-n",
        "shop",
        "--grace-period=0",
        "--force",
    ]);
    let again = create(&cp, &new_pod("shop", "web-1", None));
    assert_ne!(again["metadata"]["uid"], first_uid);
    break_pod(&cp, "shop", "web-1", "10.58.0.3");
    eventually_or(
        "web-1 deleted again",
        || agent.log(),
        || {
            let pod = cp.get(&["pod", "web-1", "-n", "shop"]);
            (!pod["metadata"]["deletionTimestamp"].is_null()).then_some(())
        },
    );
    for other in ["elsewhere-0", "plain-0"] {
        let pod = cp.get(&["pod", other, "-n", "shop"]);
        assert!(
            pod["metadata"]["deletionTimestamp"].is_null(),
            "{other} deleted"
        );
        assert!(
            !agent.log().contains(&format!("shop/{other}")),
            "{other} acted on:\n{}",
            agent.log()
        );
    }
    assert_eq!(event["type"], "Warning", "{event}");
    drop(agent);

    // Label: forbidden without repair-label-pods.yaml, then the label on the pod.
    create(&cp, &new_pod("shop", "web-2", None));
    break_pod(&cp, "shop", "web-2", "10.58.0.4");
    let agent = Agent::start(
        &cp,
        sa.path(),
        proc.path(),
        &["--repair-repair-pods=false", "--repair-label-pods=true"],
    );
    agent.line_with(&["shop/web-2", "forbidden"]);
    cp.install("kubernetes/repair-label-pods.yaml");
    touch(&cp, "shop", "web-2", 1);
    eventually_or(
        "web-2 labelled",
        || agent.log(),
        || {
            let pod = cp.get(&["pod", "web-2", "-n", "shop"]);
            (pod["metadata"]["labels"]["cni.istio.io/uninitialized"] == "true").then_some(())
        },
    );
    // Once labelled, a change to the pod is not another label: skipped, as in Istio.
    touch(&cp, "shop", "web-2", 2);
    agent.line_with(&["pod shop/web-2 already has the label cni.istio.io/uninitialized: skipped"]);
    drop(agent);
    eprintln!(
        "control plane {:.1} s, the whole test {:.1} s",
        cp.started_in.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// The plugin's config with no annotations from the runtime (so it reads the pod) and the
/// kubeconfig at `kubeconfig`.
fn conf(kubeconfig: &Path, extra: Value) -> String {
    let mut c = json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "kubeconfig": kubeconfig, "kube_attempts": 3, "kube_interval_ms": 200});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string()
}

fn args(name: &str) -> String {
    format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};K8S_POD_UID=u-{name}")
}

#[kernel_test]
fn the_plugin_reads_real_pods_with_the_agents_rbac() {
    let t0 = Instant::now();
    let (cp, _sa) = deployed();
    cp.namespace("shop");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cp.write_kubeconfig(
        &kubeconfig,
        "redirect-cni",
        &cp.token(SYSTEM, "redirect-cni"),
    );

    // A mesh pod whose proxy runs as OpenShift's UID: read from the API, captured with it.
    create(&cp, &new_pod("shop", "web-0", Some(OPENSHIFT_UID)));
    let ns = pod_ns("10.59.0.2");
    let netns = ns.path().to_str().unwrap();
    let out = plugin(
        &cni_env("ADD", netns, &args("web-0")),
        &conf(&kubeconfig, json!({})),
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("reading the pod from the Kubernetes API"),
        "{}",
        out.stderr
    );
    let rules = ns.sh("nft list table inet redirect_capture");
    assert!(
        rules.contains(&OPENSHIFT_UID.to_string()),
        "the proxy's UID from the pod's spec:\n{rules}"
    );

    // The client's view of the real object: what `kubectl get -o json` gives, read the way an
    // operator's file is read (`pod_info_from_json`), field for field.
    let policy = cni_plugin::kube::FetchPolicy {
        attempts: 1,
        ..Default::default()
    };
    let pod = cni_plugin::kube::fetch_pod(&kubeconfig, "shop", "web-0", &policy).unwrap();
    let json = cp.kubectl_ok(&["get", "pod", "web-0", "-n", "shop", "-o", "json"]);
    assert_eq!(pod, cni_protocol::pod::pod_info_from_json(&json).unwrap());
    let proxy = pod.spec.as_ref().unwrap().container("istio-proxy").unwrap();
    assert_eq!(proxy.run_as_user, Some(i64::from(OPENSHIFT_UID)));
    assert_eq!(proxy.env["ISTIO_META_INTERCEPTION_MODE"], "REDIRECT");
    assert!(!proxy.env.contains_key("POD_NAME"), "valueFrom is skipped");
    assert_eq!(pod.labels["security.istio.io/tlsMode"], "istio");

    // A pod outside the mesh (no injection): read, and left alone.
    let mut plain = new_pod("shop", "plain-0", None);
    plain["metadata"]["annotations"] = json!({});
    create(&cp, &plain);
    let out = plugin(
        &cni_env("ADD", netns, &args("plain-0")),
        &conf(&kubeconfig, json!({})),
    );
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("ADD shop/plain-0: end: not captured"),
        "{}",
        out.stderr
    );

    // A pod that does not exist: 102 naming it, within kube_deadline_ms.
    let t = Instant::now();
    let out = plugin(
        &cni_env("ADD", netns, &args("ghost")),
        &conf(
            &kubeconfig,
            json!({"kube_attempts": 30, "kube_deadline_ms": 1500}),
        ),
    );
    let took = t.elapsed();
    let err = out.json();
    assert_eq!(err["code"], 102, "{}", out.stdout);
    let msg = err["msg"].as_str().unwrap();
    assert!(
        msg.contains("shop/ghost") && msg.contains("not found"),
        "{msg}"
    );
    assert!(
        took < Duration::from_secs(6),
        "the deadline bounds the read: {took:?}"
    );

    // An account the RBAC does not let read pods: 102 naming the refusal.
    cp.kubectl_ok(&["create", "serviceaccount", "nobody", "-n", "shop"]);
    let nobody = dir.path().join("nobody");
    cp.write_kubeconfig(&nobody, "nobody", &cp.token("shop", "nobody"));
    let out = plugin(
        &cni_env("ADD", netns, &args("web-0")),
        &conf(&nobody, json!({})),
    );
    let err = out.json();
    assert_eq!(err["code"], 102, "{}", out.stdout);
    assert!(
        err["msg"].as_str().unwrap().contains("forbidden"),
        "{}",
        out.stdout
    );

    // A token the server does not know: 102 naming the 401 and the token.
    let stranger = dir.path().join("stranger");
    cp.write_kubeconfig(&stranger, "stranger", "not-a-token-of-this-cluster");
    let out = plugin(
        &cni_env("ADD", netns, &args("web-0")),
        &conf(&stranger, json!({})),
    );
    let err = out.json();
    assert_eq!(err["code"], 102, "{}", out.stdout);
    let msg = err["msg"].as_str().unwrap();
    assert!(msg.contains("401") && msg.contains("token"), "{msg}");
    eprintln!(
        "control plane {:.1} s, the whole test {:.1} s",
        cp.started_in.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// A pod running on `ip` as kubelet reports it.
fn run_pod(cp: &ControlPlane, namespace: &str, name: &str, ip: &str) {
    patch_status(
        cp,
        namespace,
        name,
        json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
    );
}

/// `redirect-cni-node hand-back` with the agent's flags and variables (as `kubectl exec` in
/// the agent's container gives them), against the real API server: (exit code, stderr).
fn hand_back_cmd(
    cp: &ControlPlane,
    (sa, proc, run): (&Path, &Path, &Path),
    extra: &[&str],
) -> (i32, String) {
    let node = tempfile::tempdir().unwrap();
    let dir = |d: &str| {
        let p = node.path().join(d);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let out = std::process::Command::new(node_bin())
        .arg("hand-back")
        .args(extra)
        .arg("--chained-cni-plugin=false")
        .arg("--mounted-cni-net-dir")
        .arg(dir("net"))
        .arg("--cni-bin-dir")
        .arg(dir("bin"))
        .arg("--cni-agent-run-dir")
        .arg(run)
        .arg("--service-account-dir")
        .arg(sa)
        .arg("--repair-host-proc")
        .arg(proc)
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", cp.port().to_string())
        .env("NODE_NAME", NODE)
        .env("POD_NAMESPACE", SYSTEM)
        .env("REPAIR_NETNS_DIR", "/nonexistent")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn istio_tables(ns: &TestNetns) -> Vec<String> {
    ns.sh("nft list tables")
        .lines()
        .filter(|l| l.contains("istio-proxy-"))
        .map(str::to_owned)
        .collect()
}

/// The hand-back command on a node: each running sidecar pod our capture holds (from the API
/// server, this node's only) gets Istio's rules in place of our table and passes Istio's
/// validation probe; an ambient pod our agent enrolled gets the in-pod rules Istio's agent
/// writes, its routing kept; a pod without a sidecar and a pod of another node are not touched;
/// a form that cannot be written is refused first, naming what to do, with nothing changed.
#[kernel_test]
fn the_hand_back_command_gives_each_pod_of_the_node_back_to_istio() {
    let (cp, sa) = deployed();
    cp.namespace("shop");
    let proc = FakeProc::new();
    let places = cni_node::pods::Places {
        proc: proc.path().to_owned(),
        pins: "/nonexistent".into(),
    };
    let (mut pods, mut uids) = (Vec::new(), Vec::new());
    for (i, name) in ["web-0", "web-1"].iter().enumerate() {
        let ip = format!("10.58.1.{}", i + 2);
        let stored = create(&cp, &new_pod("shop", name, None));
        let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
        let ns = pod_ns(&ip);
        proc.add(i as u32 + 1, &cgroupfs(&uid), 1, ns.path());
        run_pod(&cp, "shop", name, &ip);
        // Ours in place, as our plugin's ADD would have written it.
        let pod = serde_json::from_value(cp.get(&["pod", name, "-n", "shop"])).unwrap();
        let defaults = redirect_core::mesh::MeshDefaults::default();
        cni_node::repair::in_place::repair(&pod, &defaults, &places).unwrap();
        assert!(has_rules(&ns), "{name}: ours is not in place");
        pods.push(ns);
        uids.push(uid);
    }
    // An ambient pod our agent enrolled: our in-pod rules, and the annotation the agent set.
    let mut amb = new_pod("shop", "amb-0", None);
    amb["metadata"]["annotations"] = json!({"ambient.istio.io/redirection": "enabled"});
    amb["metadata"]["labels"] = json!({"istio.io/dataplane-mode": "ambient"});
    let stored = create(&cp, &amb);
    let amb_uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let amb_ns = pod_ns("10.58.1.5");
    proc.add(3, &cgroupfs(&amb_uid), 1, amb_ns.path());
    run_pod(&cp, "shop", "amb-0", "10.58.1.5");
    let ambient = redirect_core::Capture::Ambient(redirect_core::AmbientConfig::default());
    redirect_core::Namespace::open(amb_ns.path())
        .unwrap()
        .apply(&ambient)
        .unwrap();
    assert!(has_rules(&amb_ns), "amb-0: ours is not in place");
    let mut plain = new_pod("shop", "plain-0", None);
    plain["metadata"]["annotations"] = json!({"sidecar.istio.io/inject": "false"});
    create(&cp, &plain);
    run_pod(&cp, "shop", "plain-0", "10.58.1.9");
    let mut elsewhere = new_pod("shop", "elsewhere-0", None);
    elsewhere["spec"]["nodeName"] = "worker-9".into();
    create(&cp, &elsewhere);
    run_pod(&cp, "shop", "elsewhere-0", "10.58.1.8");

    let run = tempfile::tempdir().unwrap();
    let dirs = (sa.path(), proc.path(), run.path());
    let (code, err) = hand_back_cmd(&cp, dirs, &["--hand-back-form", "iptables-legacy"]);
    assert_eq!(code, 2, "{err}");
    for want in ["hand-back-form", "iptables-legacy", "nativeNftables=true"] {
        assert!(
            err.contains(want),
            "the refusal does not name {want:?}: {err}"
        );
    }
    assert!(
        pods.iter().all(has_rules),
        "a refused hand-back changed a pod"
    );

    // As adopted (the default): web-0 was adopted from Istio's native nftables tables and
    // web-1 from its iptables rules (the records the agent keeps when it adopts a pod), so each
    // goes back in its own form; the ambient pod, adopted from Istio's nftables tables, in
    // those.
    let records = run.path().join("adopted");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(records.join(&uids[0]), "nftables").unwrap();
    std::fs::write(records.join(&uids[1]), "iptables-nft").unwrap();
    std::fs::write(records.join(&amb_uid), "nftables").unwrap();
    let (code, err) = hand_back_cmd(&cp, dirs, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("as-adopted form; 3 pods recorded as adopted"),
        "{err}"
    );
    for (ns, native) in pods.iter().zip([true, false]) {
        assert!(!has_rules(ns), "ours is still there:\n{err}");
        let saved = ns.sh("iptables-nft-save");
        for chain in [
            "-A ISTIO_OUTPUT ",
            "-A ISTIO_OUTPUT_DNS ",
            "-A ISTIO_INBOUND ",
        ] {
            assert_eq!(saved.contains(chain), !native, "{chain}:\n{saved}\n{err}");
        }
        assert_eq!(!istio_tables(ns).is_empty(), native, "{err}");
        let validate = common::static_bin("redirect-validate");
        let run = redirect_testkit::binary::Run::args(&[]).user(1337, 1337);
        let probe = redirect_testkit::binary::run_in(validate.to_str().unwrap(), ns, &run);
        assert_eq!(
            probe.code, 0,
            "Istio's probe in a handed-back pod: {probe:?}"
        );
    }
    for line in [
        "pod shop/web-0 handed back: Istio's tables istio-proxy-nat",
        "pod shop/web-1 handed back: Istio's tables ip nat",
    ] {
        assert!(err.contains(line), "no line {line:?}:\n{err}");
    }
    assert!(err.contains("(nftables form, "), "{err}");
    let left = std::fs::read_dir(&records).unwrap().count();
    assert_eq!(left, 0, "the records of pods handed back are done with");
    // The ambient pod: Istio's in-pod tables (its agent's nftables form), ztunnel's routing
    // kept.
    assert!(!has_rules(&amb_ns), "amb-0: ours is still there:\n{err}");
    let listed = amb_ns.sh("nft list ruleset");
    for rule in [
        "meta mark & 0x00000fff == 0x00000539 counter packets 0 bytes 0 ct mark set ct mark & 0xfffff111 | 0x00000111",
        "meta l4proto tcp ip daddr != 127.0.0.1 meta mark & 0x00000fff != 0x00000539 counter packets 0 bytes 0 redirect to :15001",
    ] {
        assert!(listed.contains(rule), "amb-0: no {rule:?}:\n{listed}\n{err}");
    }
    assert!(
        !amb_ns.sh("iptables-nft-save").contains("ISTIO_"),
        "amb-0: Istio's rules in both forms"
    );
    assert!(amb_ns
        .sh("ip rule list")
        .contains("fwmark 0x111/0xfff lookup 100"));
    let line = "pod shop/amb-0 handed back: Istio's tables istio-ambient-nat, istio-ambient-mangle, istio-ambient-raw";
    assert!(err.contains(line), "no line {line:?}:\n{err}");
    assert!(err.contains("3 handed back"), "{err}");
    assert!(
        !err.contains("elsewhere-0"),
        "a pod of another node was looked at:\n{err}"
    );
    assert!(err.contains("shop/plain-0 left alone"), "{err}");

    // Run again: nothing of ours is left, nothing changes.
    let (code, again) = hand_back_cmd(&cp, dirs, &[]);
    assert_eq!(code, 0, "{again}");
    assert!(
        again.contains("0 handed back, 3 held nothing of ours"),
        "{again}"
    );

    // At an uninstall (no POD_NAME: the stop cannot be told from one, so it is one), the agent
    // with HAND_BACK_ON_UNINSTALL hands back what it holds before its entry goes, here in
    // Istio's native nftables form.
    let pod = serde_json::from_value(cp.get(&["pod", "web-0", "-n", "shop"])).unwrap();
    let defaults = redirect_core::mesh::MeshDefaults::default();
    // (web-0 went back in Istio's nftables form above: its tables removed, ours put back.)
    for table in istio_tables(&pods[0]) {
        pods[0].sh(&format!("nft delete {table}"));
    }
    cni_node::repair::in_place::repair(&pod, &defaults, &places).unwrap();
    assert!(has_rules(&pods[0]));
    let node = tempfile::tempdir().unwrap();
    let mut agent = common::agent::Agent::start(&common::agent::AgentSpec {
        cp: &cp,
        sa: sa.path(),
        proc: proc.path(),
        node: node.path(),
        node_name: NODE,
        bin: Path::new(node_bin()),
        plugin: Path::new(common::plugin_bin()),
        extra: &["--adopt-istio=off"],
        api_port: None,
        netns: None,
        env: &[("HAND_BACK_ON_UNINSTALL", "nftables")],
        umask: None,
    });
    agent.line_with(&["wrote the CNI config"]);
    // The watch has listed the node's pods; then `helm uninstall` takes the RBAC with the
    // DaemonSet, so the stop's own list is refused and the hand-back falls back on the watch's.
    agent.line_with(&["starting the repair controller"]);
    std::thread::sleep(Duration::from_secs(2));
    cp.kubectl_ok(&["delete", "clusterrolebinding", "redirect-cni"]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.pid() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    eventually("the agent stopped", || agent.exited());
    let log = agent.log();
    assert!(log.contains("pod shop/web-0 handed back"), "{log}");
    assert!(
        log.contains("pods the agent's watch last listed"),
        "the fallback: {log}"
    );
    assert!(
        log.contains("1 handed back, 2 held nothing of ours"),
        "{log}"
    );
    assert!(
        !has_rules(&pods[0]),
        "ours is still there after the uninstall:\n{log}"
    );
    assert!(log.contains("removing what was installed"), "{log}");
    let want = ["table inet istio-proxy-nat", "table inet istio-proxy-raw"];
    assert_eq!(istio_tables(&pods[0]), want, "{log}");
}
