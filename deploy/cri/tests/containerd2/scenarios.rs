//! The scenarios, each on a containerd of its own.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cni_protocol::events::Readiness;
use cri_client::v1::{
    PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StopPodSandboxRequest,
};
use serde_json::Value;

use crate::containerd::{log, Call, Containerd};

/// Istio's injector's status annotation for a pod with the CNI plugin: the sidecar's
/// annotations as the runtime passes them.
const STATUS: &str = "sidecar.istio.io/status";

fn annotations() -> Vec<(&'static str, &'static str)> {
    vec![(STATUS, cni_testkit::STATUS_CNI)]
}

/// `redirect-validate inspect --json` of the namespace at `netns`, compared with the pod's
/// annotations when given (`-u 1337`: the plugin's `proxy_uid`).
fn inspect(c: &Containerd, netns: &Path, annotations: Option<&[(&str, &str)]>) -> Value {
    let mut cmd = Command::new(cni_testkit::validate_bin());
    cmd.args(["inspect", "--json", "--netns"]).arg(netns);
    if let Some(a) = annotations {
        let file = c.dir().join("annotations.json");
        let map: serde_json::Map<String, Value> = a
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        std::fs::write(&file, serde_json::to_string(&map).unwrap()).unwrap();
        cmd.arg("--annotations").arg(file).args(["-u", "1337"]);
    }
    let out = cmd.output().expect("redirect-validate runs");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "inspect of {} ({}): {e}: {}{}",
            netns.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A sandbox's network namespace, held open: it outlives StopPodSandbox, so the test can look
/// inside after DEL.
struct Netns {
    _file: File,
    path: PathBuf,
}

/// The sandbox's network namespace, from its verbose status (the runtime spec's path, in
/// containerd's mount namespace), opened.
fn netns_of(c: &Containerd, id: &str) -> Netns {
    let mut rt = c.cri.runtime.clone();
    let s = c.rpc(
        "PodSandboxStatus",
        rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        }),
    );
    let ip = s
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    log(format!("sandbox {} has address {ip}", &id[..12]));
    let info: Value = serde_json::from_str(s.info.get("info").expect("verbose info")).unwrap();
    let path = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .unwrap_or_else(|| panic!("no network namespace path in the sandbox's info: {info}"));
    let file = File::open(c.host_path(path))
        .unwrap_or_else(|e| panic!("opening the sandbox's namespace {path}: {e}"));
    let path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        file.as_raw_fd()
    ));
    Netns { _file: file, path }
}

fn run_sandbox(c: &Containerd, pod: &str) -> Result<String, tonic::Status> {
    let mut rt = c.cri.runtime.clone();
    c.try_rpc(
        &format!("RunPodSandbox {pod}"),
        rt.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(c.sandbox_config(pod, &annotations())),
            runtime_handler: String::new(),
        }),
    )
    .map(|r| r.pod_sandbox_id)
}

fn stop_and_remove(c: &Containerd, id: &str) {
    let mut rt = c.cri.runtime.clone();
    c.rpc(
        "StopPodSandbox",
        rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        }),
    );
    c.rpc(
        "RemovePodSandbox",
        rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        }),
    );
}

/// Our plugin's calls of `command` for the container `id` (all containers when `None`).
fn calls_of(c: &Containerd, command: &str, id: Option<&str>) -> Vec<Call> {
    c.calls()
        .into_iter()
        .filter(|k| k.command == command && id.is_none_or(|id| k.container == id))
        .collect()
}

/// The sandbox's namespace holds our table, equal to what its annotations ask.
fn assert_captured(c: &Containerd, ns: &Netns, id: &str) {
    let adds = calls_of(c, "ADD", Some(id));
    assert!(
        adds.len() == 1 && adds[0].code == 0,
        "containerd ran our plugin's ADD for the sandbox once, successfully: {adds:?}\n{}",
        c.tail()
    );
    let seen = inspect(c, &ns.path, Some(&annotations()));
    assert!(
        seen["table"].as_array().is_some_and(|t| !t.is_empty()),
        "our table is in the sandbox's network namespace: {seen:#}\n{}",
        c.tail()
    );
    assert_eq!(
        seen["equal"],
        Value::Bool(true),
        "the sandbox's rules equal what its annotations ask: {:#}",
        seen["differences"]
    );
}

/// Every GC containerd ran (none, with 2.1.9): each must have succeeded. Says what was seen.
fn gc_seen(c: &Containerd) {
    let gcs = calls_of(c, "GC", None);
    for g in &gcs {
        assert_eq!(
            g.code,
            0,
            "our plugin's answer to GC ({}): {}",
            std::fs::read_to_string(&g.stdin).unwrap_or_default(),
            c.tail()
        );
    }
    log(format!(
        "CNI GC calls over {:.0} s: {} {:?}",
        c.started.elapsed().as_secs_f64(),
        gcs.len(),
        gcs.iter().map(|g| g.at).collect::<Vec<_>>()
    ));
}

/// RunPodSandbox with Istio's sidecar annotations: ADD through containerd 2, our table in the
/// sandbox equal to the annotations'; StopPodSandbox: DEL, no table; RemovePodSandbox.
#[redirect_testkit::kernel_test]
fn a_sandbox_is_captured_and_released() {
    let t = Instant::now();
    let c = Containerd::start("capture");
    c.set_agent(&Readiness::Ready);
    let (ready, _, msg) = c.network_ready();
    assert!(
        ready,
        "NetworkReady with the agent ready: {msg}\n{}",
        c.tail()
    );

    let id =
        run_sandbox(&c, "web-0").unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", c.tail()));
    let ns = netns_of(&c, &id);
    assert_captured(&c, &ns, &id);

    let mut rt = c.cri.runtime.clone();
    c.rpc(
        "StopPodSandbox",
        rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        }),
    );
    let dels = calls_of(&c, "DEL", Some(&id));
    assert!(
        !dels.is_empty() && dels.iter().all(|d| d.code == 0),
        "StopPodSandbox ran our plugin's DEL, successfully: {dels:?}\n{}",
        c.tail()
    );
    let seen = inspect(&c, &ns.path, None);
    assert_eq!(
        seen["table"],
        Value::Null,
        "DEL removed our table: {seen:#}"
    );
    c.rpc(
        "RemovePodSandbox",
        rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        }),
    );
    gc_seen(&c);
    log(format!(
        "the capture scenario took {:.1} s",
        t.elapsed().as_secs_f64()
    ));
}

/// How often containerd runs our STATUS on its own (idle, nobody asking), then per CRI
/// `Status`; NetworkReady follows the agent's readiness file; a sandbox started while it is
/// not ready is not held by containerd and runs captured.
#[redirect_testkit::kernel_test]
fn network_ready_follows_the_agent() {
    let t = Instant::now();
    let c = Containerd::start("status");
    c.set_agent(&Readiness::Ready);
    // Idle: containerd alone, no kubelet asking.
    let idle = Duration::from_secs(12);
    std::thread::sleep(idle);
    let on_its_own = calls_of(&c, "STATUS", None);
    log(format!(
        "CNI STATUS calls in {} s with no CRI client asking: {} {:?}",
        idle.as_secs(),
        on_its_own.len(),
        on_its_own.iter().map(|s| s.at).collect::<Vec<_>>()
    ));

    // Asked, as kubelet asks (every 5 s on a node): one STATUS per CRI Status.
    let before = calls_of(&c, "STATUS", None).len();
    for _ in 0..3 {
        let (ready, reason, msg) = c.network_ready();
        assert!(
            ready,
            "NetworkReady with the agent ready: {reason} {msg}\n{}",
            c.tail()
        );
    }
    let asked = calls_of(&c, "STATUS", None);
    assert!(
        asked.len() >= before + 3,
        "each CRI Status ran our plugin's STATUS: {} before, {} after\n{}",
        before,
        asked.len(),
        c.tail()
    );
    let gaps: Vec<String> = asked
        .windows(2)
        .map(|w| format!("{:.3}", w[1].at - w[0].at))
        .collect();
    log(format!("STATUS calls' gaps (s): {gaps:?}"));

    not_ready_then_ready(&c);
    gc_seen(&c);
    log(format!(
        "the status scenario took {:.1} s",
        t.elapsed().as_secs_f64()
    ));
}

fn not_ready_then_ready(c: &Containerd) {
    let why = "the node agent is starting";
    c.set_agent(&Readiness::NotReady(why.into()));
    let (ready, reason, msg) = c.network_ready();
    assert!(
        !ready,
        "NetworkReady is false while the agent is not ready (our STATUS answers 50)\n{}",
        c.tail()
    );
    assert_eq!(reason, "NetworkPluginNotReady");
    assert!(
        msg.contains(why),
        "the condition's message carries the agent's reason: {msg}"
    );
    let last = calls_of(c, "STATUS", None).pop().expect("a STATUS call");
    assert_eq!(
        last.answer()["code"],
        50,
        "our STATUS answered code 50 (NOT_AVAILABLE): {last:?}"
    );

    // kubelet would start no pod now; containerd itself does not hold one.
    match run_sandbox(c, "early-0") {
        Ok(id) => {
            log("containerd ran the sandbox while NetworkReady was false: it must be captured");
            let ns = netns_of(c, &id);
            assert_captured(c, &ns, &id);
            stop_and_remove(c, &id);
        }
        Err(e) => {
            log(format!(
                "containerd refused the sandbox while not ready: {e}"
            ));
            let mut rt = c.cri.runtime.clone();
            let left = c.rpc(
                "ListPodSandbox",
                rt.list_pod_sandbox(cri_client::v1::ListPodSandboxRequest { filter: None }),
            );
            assert!(
                left.items.iter().all(|s| s.state != 0),
                "a refused sandbox is not left running: {:?}",
                left.items
            );
        }
    }

    c.set_agent(&Readiness::Ready);
    let (ready, reason, msg) = c.network_ready();
    assert!(
        ready,
        "NetworkReady is true again once the agent is ready: {reason} {msg}\n{}",
        c.tail()
    );
}
