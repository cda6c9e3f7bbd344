//! The node agent at a node's scale: a real API server (kube-apiserver 1.20 and etcd) holding
//! 5,000 of Istio's sidecar pods, 110 of them on the agent's node (kubelet's default maximum),
//! and the agent (`redirect-cni-node`, the static release build, the RBAC of `deploy/`) in its
//! default mode, repair in place. It reports:
//!
//! - RSS after the first list, after the idle window and at its peak (`VmHWM`);
//! - CPU while idle (a minute with nothing to do: the watch open, the installer's files
//!   guarded);
//! - CPU during a burst of 50 pod changes on its node (50 annotations at once), and during 50
//!   pods created on it and deleted;
//! - the repair latency: a pod's status written broken (its validation exited 126) to the
//!   agent's table in that pod's network namespace, one pod at a time, polled every millisecond.
//!
//! Budget (the process exits non-zero beyond it): RSS under 40 MB, idle CPU under 1 % of a core.
//!
//! `cargo bench -p cni-node --bench agent_scale` runs it at that scale (about 3 minutes; build the
//! static binaries first: `bash scripts/build-static.sh`; `REDIRECT_STATIC_DIR` picks another
//! build). `cargo test --all-targets` runs it small (60 pods, 12 on the node, a 3 s idle window,
//! the debug build) to keep it working, with no budget: the repairs must still happen.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use cni_testkit::apiserver::{ControlPlane, SYSTEM};
use cni_testkit::host_proc::{cgroupfs, FakeProc};
use redirect_testkit::{kernel_available, TestNetns};
use serde_json::{json, Value};

const NODE: &str = "worker-1";
const RSS_BUDGET_KB: u64 = 40 * 1024;
const IDLE_CPU_BUDGET: f64 = 1.0;

struct Scale {
    cluster_pods: usize,
    node_pods: usize,
    namespaces: usize,
    idle: Duration,
    burst: usize,
    repairs: usize,
    budget: bool,
}

const FULL: Scale = Scale {
    cluster_pods: 5000,
    node_pods: 110,
    namespaces: 10,
    idle: Duration::from_secs(60),
    burst: 50,
    repairs: 12,
    budget: true,
};

const SMOKE: Scale = Scale {
    cluster_pods: 60,
    node_pods: 12,
    namespaces: 3,
    idle: Duration::from_secs(3),
    burst: 5,
    repairs: 2,
    budget: false,
};

fn main() {
    // `cargo bench` passes --bench; `cargo test` runs the target without it.
    let full = std::env::args().any(|a| a == "--bench");
    if !kernel_available("the agent_scale benchmark") {
        return;
    }
    let scale = if full { FULL } else { SMOKE };
    let (agent_bin, plugin_bin) = if full {
        (
            cni_testkit::static_bin("redirect-cni-node"),
            cni_testkit::static_bin("redirect-cni"),
        )
    } else {
        (
            PathBuf::from(cni_testkit::node_bin()),
            PathBuf::from(cni_testkit::plugin_bin()),
        )
    };
    let failed = run(&scale, &agent_bin, &plugin_bin);
    if !failed.is_empty() {
        eprintln!("over budget: {}", failed.join("; "));
        std::process::exit(1);
    }
}

/// The whole measure; returns what went over budget.
fn run(s: &Scale, agent_bin: &Path, plugin_bin: &Path) -> Vec<String> {
    let cp = ControlPlane::start();
    cp.namespace(SYSTEM);
    cp.install("kubernetes/redirect-cni.yaml");
    let sa = cp.service_account_dir(SYSTEM, "redirect-cni");
    cp.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}).to_string());

    let t = Instant::now();
    let pods = create_cluster(&cp, s);
    println!(
        "cluster: {} pods in {} namespaces, {} on {NODE}, created in {:.1} s",
        s.cluster_pods,
        s.namespaces,
        pods.len(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let healthy = json!({"phase": "Running", "initContainerStatuses": validation(0)});
    parallel(&pods, |(ns, name, _)| cp.set_pod_status(ns, name, &healthy));
    println!(
        "{} node pods' status written (validation passed) in {:.1} s",
        pods.len(),
        t.elapsed().as_secs_f64()
    );

    // /proc as the agent sees it: one process per node pod in a namespace of its own, except
    // the pods the repair round breaks (they get theirs then).
    let proc = FakeProc::new();
    let shared = TestNetns::with_prefix("rdscale");
    let (to_repair, rest) = pods.split_at(s.repairs);
    for (i, (_, _, uid)) in rest.iter().enumerate() {
        proc.add(10_000 + i as u32, &cgroupfs(uid), 1, shared.path());
    }

    let node = tempfile::tempdir().unwrap();
    let agent = Agent::start(
        &cp,
        sa.path(),
        proc.path(),
        node.path(),
        agent_bin,
        plugin_bin,
    );
    let t = Instant::now();
    agent.wait_for(&["starting the repair controller"]);
    // The first list is done when the process stops working: no tick for a second.
    let synced = agent.quiet(Duration::from_secs(1), Duration::from_secs(60));
    let rss_synced = agent.status_kb("VmRSS");
    println!(
        "agent: started, listed and quiet for 1 s in {:.1} s ({synced} ms CPU); RSS {}",
        t.elapsed().as_secs_f64(),
        mb(rss_synced)
    );

    let before = agent.cpu_ms();
    std::thread::sleep(s.idle);
    let idle_ms = agent.cpu_ms() - before;
    let idle_pct = 100.0 * idle_ms as f64 / s.idle.as_millis() as f64;
    let rss_idle = agent.status_kb("VmRSS");
    println!(
        "idle {} s: {idle_ms} ms CPU ({idle_pct:.2} % of a core, in {} ms ticks); RSS {}",
        s.idle.as_secs(),
        agent.tick_ms(),
        mb(rss_idle)
    );

    burst_annotate(&cp, &agent, &pods[..s.burst.min(pods.len())]);
    burst_create_delete(&cp, &agent, s);
    repair_round(&cp, &agent, &proc, to_repair);

    let peak = agent.status_kb("VmHWM");
    println!(
        "agent: RSS {} now, peak {}; {} threads",
        mb(agent.status_kb("VmRSS")),
        mb(peak),
        agent.status_kb("Threads")
    );
    let mut over = Vec::new();
    if s.budget && peak > RSS_BUDGET_KB {
        over.push(format!("peak RSS {} > {}", mb(peak), mb(RSS_BUDGET_KB)));
    }
    if s.budget && idle_pct > IDLE_CPU_BUDGET {
        over.push(format!("idle CPU {idle_pct:.2} % > {IDLE_CPU_BUDGET} %"));
    }
    over
}

/// `s.cluster_pods` pods over `s.namespaces` namespaces, the first `s.node_pods` on [`NODE`],
/// the others on 40 other nodes; returns the node's as (namespace, name, uid).
fn create_cluster(cp: &ControlPlane, s: &Scale) -> Vec<(String, String, String)> {
    for n in 0..s.namespaces {
        cp.namespace(&format!("app-{n}"));
    }
    let all: Vec<Value> = (0..s.cluster_pods)
        .map(|i| {
            let node = if i < s.node_pods {
                NODE.to_owned()
            } else {
                format!("worker-{}", 2 + i % 40)
            };
            pod(
                &format!("app-{}", i % s.namespaces),
                &format!("web-{i}"),
                &node,
            )
        })
        .collect();
    for chunk in all.chunks(500) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": chunk});
        kubectl_with(cp, &["create", "-o", "name", "-f", "-"], &list);
    }
    let field = format!("spec.nodeName={NODE}");
    let listed = cp.get(&["pods", "-A", "--field-selector", &field]);
    let mine: Vec<_> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let m = &p["metadata"];
            let s = |k: &str| m[k].as_str().unwrap().to_owned();
            (s("namespace"), s("name"), s("uid"))
        })
        .collect();
    assert_eq!(mine.len(), s.node_pods, "the node's pods as created");
    mine
}

/// Istio's sidecar pod (the fixture) as a user creates it, named and placed.
fn pod(namespace: &str, name: &str, node: &str) -> Value {
    cni_testkit::fixtures::istio_pod_to_create(namespace, name, node)
}

/// The validation init container's status, terminated with `code` (the repair round turns it
/// into a crash loop).
fn validation(code: i32) -> Value {
    let state = json!({"terminated": {"exitCode": code, "reason": "Completed"}});
    json!([{
        "name": "istio-validation", "image": "proxyv2", "imageID": "", "ready": code == 0,
        "restartCount": 0, "state": state, "lastState": {},
    }])
}

fn kubectl_with(cp: &ControlPlane, args: &[&str], input: &Value) {
    let out = cp.kubectl_in(args, Some(&input.to_string()));
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `f` over `items` on four threads (kubectl processes, mostly waiting).
fn parallel<T: Sync>(items: &[T], f: impl Fn(&T) + Sync) {
    let per = items.len().div_ceil(4).max(1);
    std::thread::scope(|scope| {
        for chunk in items.chunks(per) {
            let f = &f;
            scope.spawn(move || chunk.iter().for_each(f));
        }
    });
}

/// 50 of the node's pods annotated at once (one kubectl per namespace, all started together).
fn burst_annotate(cp: &ControlPlane, agent: &Agent, pods: &[(String, String, String)]) {
    let mut by_ns: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for (ns, name, _) in pods {
        by_ns.entry(ns).or_default().push(name);
    }
    let before = agent.cpu_ms();
    let t = Instant::now();
    let children: Vec<Child> = by_ns
        .iter()
        .map(|(ns, names)| {
            cp.kubectl_command()
                .args(["annotate", "--overwrite", "pods", "-n", ns])
                .args(names)
                .arg("bench/burst=1")
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "kubectl annotate");
    }
    let sent = t.elapsed();
    let settle = agent.quiet(Duration::from_secs(1), Duration::from_secs(30));
    println!(
        "burst: {} pods annotated in {} ms: the agent used {} ms CPU ({} ms of it after the \
         last write)",
        pods.len(),
        sent.as_millis(),
        agent.cpu_ms() - before,
        settle
    );
}

/// `s.burst` pods created on the node (one request list), then deleted at once.
fn burst_create_delete(cp: &ControlPlane, agent: &Agent, s: &Scale) {
    let items: Vec<Value> = (0..s.burst)
        .map(|i| pod("app-0", &format!("burst-{i}"), NODE))
        .collect();
    let before = agent.cpu_ms();
    let t = Instant::now();
    kubectl_with(
        cp,
        &["create", "-o", "name", "-f", "-"],
        &json!({"apiVersion": "v1", "kind": "List", "items": items}),
    );
    let created = t.elapsed();
    let names: Vec<String> = (0..s.burst).map(|i| format!("burst-{i}")).collect();
    // --wait=false: kubectl would otherwise poll until each object is gone.
    let mut args = vec![
        "delete",
        "pods",
        "-n",
        "app-0",
        "--grace-period=0",
        "--force",
        "--wait=false",
    ];
    args.extend(names.iter().map(String::as_str));
    cp.kubectl_ok(&args);
    let sent = t.elapsed();
    agent.quiet(Duration::from_secs(1), Duration::from_secs(30));
    println!(
        "burst: {} pods created on the node in {} ms and deleted, all in {} ms: the agent \
         used {} ms CPU",
        s.burst,
        created.as_millis(),
        sent.as_millis(),
        agent.cpu_ms() - before
    );
}

/// Each pod of `pods` broken in turn: from its status write to our table in its namespace.
fn repair_round(
    cp: &ControlPlane,
    agent: &Agent,
    proc: &FakeProc,
    pods: &[(String, String, String)],
) {
    let mut after_write = Vec::new();
    let mut from_start = Vec::new();
    let mut own = Vec::new();
    for (i, (ns, name, uid)) in pods.iter().enumerate() {
        let ip = format!("10.60.{}.{}", i / 200, 2 + i % 200);
        let netns = TestNetns::with_prefix("rdscale");
        netns.ip_batch(
            false,
            &[
                "link add eth0 type veth peer name eth1".to_string(),
                "link set eth0 up".into(),
                format!("addr add {ip}/32 dev eth0"),
            ],
        );
        proc.add(20_000 + i as u32, &cgroupfs(uid), 1, netns.path());
        let mut stored = cp.get(&["pod", name, "-n", ns]);
        stored["status"]["podIP"] = ip.clone().into();
        stored["status"]["podIPs"] = json!([{"ip": ip}]);
        stored["status"]["initContainerStatuses"] = validation(126);
        let status = &mut stored["status"]["initContainerStatuses"][0];
        status["state"] = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        status["lastState"] = json!({"terminated": {"exitCode": 126, "reason": "Error"}});
        status["restartCount"] = 1.into();
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
        let t0 = Instant::now();
        let out = cp.kubectl_in(
            &["replace", "--raw", &path, "-f", "-"],
            Some(&stored.to_string()),
        );
        let t1 = Instant::now();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = t0 + Duration::from_secs(30);
        while redirect_kernel::testing::nft_in(netns.path())
            .read()
            .unwrap()
            .is_none()
        {
            assert!(
                Instant::now() < deadline,
                "{ns}/{name} not repaired within 30 s:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let t2 = Instant::now();
        after_write.push((t2.saturating_duration_since(t1)).as_secs_f64() * 1e3);
        from_start.push((t2 - t0).as_secs_f64() * 1e3);
        let line = agent.wait_for(&[&format!("pod {ns}/{name} repaired")]);
        if let Some(ms) = line
            .rsplit_once(" (")
            .and_then(|(_, r)| r.split_once(" ms)"))
            .and_then(|(n, _)| n.parse::<f64>().ok())
        {
            own.push(ms);
        }
    }
    println!(
        "repair: {} pods, status write to table in the pod's namespace: median {:.1} ms after \
         kubectl returned, {:.1} ms from its start (max {:.1}); the agent's own apply and \
         read-back: median {:.1} ms",
        pods.len(),
        median(&mut after_write),
        median(&mut from_start),
        from_start.iter().cloned().fold(0.0, f64::max),
        median(&mut own)
    );
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mb(kb: u64) -> String {
    format!("{:.1} MB", kb as f64 / 1024.0)
}

/// The agent process, as the DaemonSet runs it (standalone install, repair in place):
/// `cni_testkit::agent`, with what this bench reads of its `/proc` entries.
struct Agent(cni_testkit::agent::Agent);

impl Agent {
    fn start(
        cp: &ControlPlane,
        sa: &Path,
        proc: &Path,
        node: &Path,
        bin: &Path,
        plugin: &Path,
    ) -> Agent {
        Agent(cni_testkit::agent::Agent::start(
            &cni_testkit::agent::AgentSpec {
                cp,
                sa,
                proc,
                node,
                node_name: NODE,
                bin,
                plugin,
                extra: &[],
                api_port: None,
                netns: None,
                env: &[],
                umask: None,
            },
        ))
    }

    fn log(&self) -> String {
        self.0.log()
    }

    /// Waits (30 s at most) for a log line holding every one of `words`.
    fn wait_for(&self, words: &[&str]) -> String {
        self.0.line_with(words)
    }

    fn stat(&self) -> Vec<String> {
        let text = fs::read_to_string(format!("/proc/{}/stat", self.0.pid())).unwrap();
        // Fields after the command name, which may hold spaces: state is field 3.
        let rest = &text[text.rfind(')').unwrap() + 2..];
        rest.split_whitespace().map(str::to_owned).collect()
    }

    fn tick_ms(&self) -> u64 {
        1000 / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .unwrap()
            .unwrap() as u64
    }

    /// User and system CPU of every thread so far, in ms (clock-tick resolution).
    fn cpu_ms(&self) -> u64 {
        let f = self.stat();
        // utime and stime are fields 14 and 15; `f` starts at field 3.
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks * self.tick_ms()
    }

    /// A `/proc/<pid>/status` value in kB (or a count).
    fn status_kb(&self, key: &str) -> u64 {
        let text = fs::read_to_string(format!("/proc/{}/status", self.0.pid())).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{key} in /proc/<agent>/status"))
    }

    /// Waits until the agent used no CPU for `still`; returns the CPU ms used meanwhile.
    fn quiet(&self, still: Duration, within: Duration) -> u64 {
        let start = self.cpu_ms();
        let deadline = Instant::now() + within;
        let mut last = start;
        let mut since = Instant::now();
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.cpu_ms();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= still {
                break;
            }
        }
        last - start
    }
}
