//! What N node agents cost one API server (issue 48, "a node agent for a 5,000-node cluster"):
//! one real control plane (kube-apiserver 1.20 and etcd, `cni_testkit::apiserver`) with an audit
//! log of the agents' requests, and N agents (`redirect-cni-node`, the release build), each its
//! own node (`NODE_NAME=node-<i>`, its Node object), folders, ztunnel socket folder and an empty
//! host `/proc` (`FakeProc`: no kubelet is found, so no agent programs the host's probe SNAT and
//! N agents on one machine share no kernel state), ambient mode on (`AMBIENT_ENABLED=true`, as
//! Istio's ambient profile), repair on (the default), in the machine's network namespace. The
//! cluster: 20 namespaces (one in four labelled `istio.io/dataplane-mode=ambient`), 10 pods per
//! node, Running with an address (Istio's sidecar pod, the sidecar taken off in the ambient
//! namespaces). It reports, one row per metric:
//!
//! - the watches open per agent, by resource (`apiserver_longrunning_gauge` or
//!   `apiserver_longrunning_requests`, verb WATCH, less what was open before the agents; and
//!   `apiserver_registered_watchers` by kind);
//! - the bytes each agent receives from the API server per minute, idle and under churn (a pod
//!   created on a random node every second, made Running, and one deleted every second; a
//!   namespace label changed every 10 s): the `bytes_received` of every TCP socket of an agent
//!   to the API server's port (`ss -tinp`, polled every 2 s; a socket first seen during a window
//!   counts from 0, one closed between two polls loses what came after the last), i.e. the API
//!   traffic as it crosses the wire (TLS records, HTTP framing); the API server's
//!   `apiserver_watch_events_sizes` by kind says which watch the bytes come from;
//! - the bytes per agent of one namespace label change (idle, a plain label: no pod changes);
//! - the API server's CPU (utime + stime) per minute and RSS, idle, before the agents and with
//!   them;
//! - how long after an API server restart every agent watches again, one watch per kind;
//! - the LIST requests of the agents after an API server restart (SIGTERM, the same arguments,
//!   etcd kept), counted in the audit log over the 2 minutes after it answered ready again:
//!   their spread (per 10 s) and how many carry no `resourceVersion` (quorum reads, from
//!   etcd) or `resourceVersion=0` (the watch cache); and the API server's own etcd list calls
//!   (`etcd_request_duration_seconds_count{operation="list"}`) over the same minutes.
//!
//! `cargo build --release -p cni-node -p cni-plugin --bins && AGENTS=50 cargo bench -p cni-node
//! --bench apiserver_cost` (root; `AGENTS` 50 unless set). `cargo test` runs it with 3 agents and
//! windows of a few seconds, the debug build, to keep it working.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use cni_testkit::agent::{Agent, AgentSpec};
use cni_testkit::apiserver::{ControlPlane, SYSTEM};
use cni_testkit::host_proc::FakeProc;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use redirect_testkit::kernel_available;
use serde_json::{json, Value};

/// The agents' service account, as the audit log names it.
const AGENT_USER: &str = "system:serviceaccount:redirect-system:redirect-cni";

struct Scale {
    agents: usize,
    pods_per_node: usize,
    namespaces: usize,
    /// The idle and churn windows (and the base's).
    window: Duration,
    /// How long the LISTs are counted after the restart.
    after_restart: Duration,
    quick: bool,
}

impl Scale {
    fn new(quick: bool) -> Scale {
        let agents = std::env::var("AGENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if quick { 3 } else { 50 });
        if quick {
            Scale {
                agents,
                pods_per_node: 2,
                namespaces: 4,
                window: Duration::from_secs(3),
                // Past the relist spread (a random part of 10 s after a 410) and a retry or two
                // in the backoff; the watches are then waited for (`watches_back`).
                after_restart: Duration::from_secs(40),
                quick,
            }
        } else {
            Scale {
                agents,
                pods_per_node: 10,
                namespaces: 20,
                window: Duration::from_secs(60),
                after_restart: Duration::from_secs(120),
                quick,
            }
        }
    }
}

fn main() {
    if !kernel_available("apiserver_cost") {
        return;
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let s = Scale::new(quick);
    let fds = raise_nofile();
    raise_inotify(s.agents);
    println!(
        "apiserver_cost: {} agents, {} pods per node, {} namespaces; open files up to {fds}",
        s.agents, s.pods_per_node, s.namespaces
    );
    run(&s);
}

/// The open-file limit raised to its hard limit (the API server and the agents inherit it).
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on a struct of ours.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_max
}

/// Each agent's installer holds inotify instances, of which a user may have 128 by default
/// (`fs.inotify.max_user_instances`): raised to 128 + 4 per agent when below, said when done.
fn raise_inotify(agents: usize) {
    let path = "/proc/sys/fs/inotify/max_user_instances";
    let now: usize = std::fs::read_to_string(path)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let want = 128 + 4 * agents;
    if now < want {
        std::fs::write(path, want.to_string()).expect("raise fs.inotify.max_user_instances");
        println!("fs.inotify.max_user_instances raised from {now} to {want}");
    }
}

/// The audit policy: every request of the agents at Metadata level (its URI, verb, resource,
/// times, code), nothing of anyone else.
fn audit_args(dir: &Path) -> Vec<String> {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\n\
             rules:\n- level: Metadata\n  users: [\"{AGENT_USER}\"]\n- level: None\n"
        ),
    )
    .unwrap();
    vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", dir.join("audit.log").display()),
        "--audit-log-maxsize=100000".into(),
    ]
}

struct Row(Vec<(String, String)>);

impl Row {
    fn add(&mut self, metric: &str, value: String) {
        println!("| {metric} | {value} |");
        self.0.push((metric.into(), value));
    }
}

fn run(s: &Scale) {
    let work = tempfile::tempdir().unwrap();
    let mut cp = ControlPlane::start_with(&audit_args(work.path()));
    let audit = work.path().join("audit.log");
    cp.namespace(SYSTEM);
    cp.install("kubernetes/redirect-cni.yaml");
    cp.install("kubernetes/ambient.yaml");
    let sa = cp.service_account_dir(SYSTEM, "redirect-cni");
    let admin = Admin::new(&cp);
    let t = Instant::now();
    let ambient = admin.cluster(s);
    println!(
        "cluster: {} nodes, {} namespaces ({} ambient), {} pods Running, in {:.1} s",
        s.agents,
        s.namespaces,
        ambient.len(),
        s.agents * s.pods_per_node,
        t.elapsed().as_secs_f64()
    );
    let mut rows = Row(Vec::new());
    println!("| metric (N = {}) | value |\n| --- | --- |", s.agents);

    // The base: the API server idle with the cluster in it, no agent.
    std::thread::sleep(Duration::from_secs(if s.quick { 1 } else { 10 }));
    let base = ApiUsage::over(&cp, s.window);
    let base_metrics = admin.metrics();
    let base_heap = heap_mb(&base_metrics);
    rows.add(
        "API server idle, no agent: CPU per minute, RSS, Go heap in use",
        format!(
            "{:.2} s, {:.0} MB, {base_heap:.0} MB",
            base.cpu_per_min, base.rss_mb
        ),
    );

    let started = Instant::now();
    let agents = start_agents(&cp, sa.path(), s);
    println!(
        "{} agents up (both controllers listed, no probe SNAT: no kubelet) in {:.1} s; \
         agent RSS mean {:.1} MB",
        agents.len(),
        started.elapsed().as_secs_f64(),
        agents.iter().map(|a| rss_kb(a.agent.pid())).sum::<u64>() as f64
            / agents.len() as f64
            / 1024.0
    );
    let pids: HashSet<u32> = agents.iter().map(|a| a.agent.pid()).collect();
    settle(&admin, s);
    let n = s.agents as f64;

    watches(&mut rows, &base_metrics, &admin.metrics(), n, "");

    // Idle.
    let idle_start = SystemTime::now();
    let before = admin.metrics();
    let usage = std::cell::Cell::new(None);
    let idle = Traffic::over(cp.port(), &pids, || {
        usage.set(Some(ApiUsage::over(&cp, s.window)))
    });
    let usage = usage.take().unwrap();
    let per_min = 60.0 / s.window.as_secs_f64();
    let idle_per_min = idle.total as f64 / n * per_min;
    rows.add(
        "bytes received per agent per minute, idle",
        format!(
            "{} (per agent min {} / max {})",
            bytes(idle_per_min),
            bytes(idle.min as f64 * per_min),
            bytes(idle.max as f64 * per_min)
        ),
    );
    let idle_metrics = admin.metrics();
    rows.add(
        "watch event bytes sent by the API server, idle, by kind (per minute)",
        event_bytes(&before, &idle_metrics, per_min),
    );
    let heap = heap_mb(&idle_metrics);
    rows.add(
        "API server idle with the agents: CPU per minute, RSS, Go heap in use",
        format!(
            "{:.2} s, {:.0} MB, {heap:.0} MB",
            usage.cpu_per_min, usage.rss_mb
        ),
    );
    rows.add(
        "API server per agent: CPU per minute, RSS ((RSS(N) - RSS(base)) / N), heap in use",
        format!(
            "{:.1} ms, {:.2} MB, {:.2} MB",
            (usage.cpu_per_min - base.cpu_per_min) / n * 1000.0,
            (usage.rss_mb - base.rss_mb) / n,
            (heap - base_heap) / n
        ),
    );

    // One namespace label change, idle.
    let label_window = Duration::from_secs(if s.quick { 2 } else { 10 });
    let one = Traffic::over(cp.port(), &pids, || {
        admin.label_namespace("ns-1", "bench/rev", "once");
        std::thread::sleep(label_window);
    });
    let background = idle_per_min * n * label_window.as_secs_f64() / 60.0;
    rows.add(
        "bytes per agent per namespace label change (idle)",
        format!(
            "{} ({} in {} s less the idle rate)",
            bytes((one.total as f64 - background).max(0.0) / n),
            bytes(one.total as f64 / n),
            label_window.as_secs()
        ),
    );

    // Churn.
    let before = admin.metrics();
    let cpu = cni_testkit::process_cpu_seconds(cp.apiserver_pid());
    let churn = Traffic::over(cp.port(), &pids, || admin.churn(s));
    let churn_cpu = (cni_testkit::process_cpu_seconds(cp.apiserver_pid()) - cpu) * per_min;
    rows.add(
        "bytes received per agent per minute, churn (1 pod/s created, 1/s deleted, a namespace label every 10 s)",
        format!(
            "{} (per agent min {} / max {})",
            bytes(churn.total as f64 / n * per_min),
            bytes(churn.min as f64 * per_min),
            bytes(churn.max as f64 * per_min)
        ),
    );
    rows.add(
        "watch event bytes sent by the API server, churn, by kind (per minute)",
        event_bytes(&before, &admin.metrics(), per_min),
    );
    rows.add(
        "API server CPU per minute under churn (the bench's writes included)",
        format!("{churn_cpu:.2} s"),
    );
    let rewatches = audit_after(&audit, 0)
        .iter()
        .filter(|e| e.verb == "watch" && e.at >= idle_start)
        .count();
    let minutes = SystemTime::now()
        .duration_since(idle_start)
        .unwrap_or_default()
        .as_secs_f64()
        / 60.0;
    rows.add(
        "agents' WATCH requests ended from the idle window to the restart (the 1.20 audit log records a watch when it ends), per agent per minute",
        format!(
            "{:.2} (over {minutes:.1} min)",
            rewatches as f64 / n / minutes
        ),
    );

    let all_back = || one_watch_per_kind(&base_metrics, &admin.metrics(), n).is_ok();
    let (ready, back) = restart(&mut rows, &mut cp, &admin, &audit, &pids, s, &all_back);
    let (now, late) = watches_back(&admin, &base_metrics, n, ready, &agents);
    let when = format!(" {:.0} s after the restart", late.as_secs_f64());
    watches(&mut rows, &base_metrics, &now, n, &when);
    rows.add(
        "every agent's watches back, one per kind, after the API server's return (polled every second)",
        format!("{:.1} s", back.unwrap_or(late).as_secs_f64()),
    );
    for a in &agents {
        assert!(
            a.agent.log().contains("no probe SNAT on this node"),
            "agent {} found a kubelet:\n{}",
            a.node,
            a.agent.log()
        );
    }
    drop(agents);
    drop(rows);
}

/// The API server's restart, and what the agents asked of it in the minutes after.
fn restart(
    rows: &mut Row,
    cp: &mut ControlPlane,
    admin: &Admin,
    audit: &Path,
    pids: &HashSet<u32>,
    s: &Scale,
    all_back: &dyn Fn() -> bool,
) -> (SystemTime, Option<Duration>) {
    let n = s.agents as f64;
    std::thread::sleep(Duration::from_secs(1));
    let offset = std::fs::metadata(audit).map(|m| m.len()).unwrap_or(0);
    let stopped = SystemTime::now();
    let mut down = (Duration::ZERO, Duration::ZERO);
    let mut back = None;
    let after = Traffic::over(cp.port(), pids, || {
        down = cp.restart_apiserver();
        let t = Instant::now();
        while t.elapsed() < s.after_restart {
            if back.is_none() && all_back() {
                back = Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let ready = stopped + down.0 + down.1;
    let events = audit_after(audit, offset);
    let lists: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.verb == "list" && e.at >= stopped)
        .collect();
    let within: Vec<&&AuditEvent> = lists
        .iter()
        .filter(|e| e.at <= ready + s.after_restart)
        .collect();
    rows.add(
        "API server restart: SIGTERM to exit, start to ready",
        format!(
            "{:.1} s, {:.1} s",
            down.0.as_secs_f64(),
            down.1.as_secs_f64()
        ),
    );
    let rel = |e: &AuditEvent| {
        e.at.duration_since(ready)
            .map(|d| d.as_secs_f64())
            .unwrap_or_else(|e| -e.duration().as_secs_f64())
    };
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut buckets: BTreeMap<i64, usize> = BTreeMap::new();
    for e in &within {
        *by_kind
            .entry(format!("{} {}", e.resource, e.rv_class()))
            .or_default() += 1;
        *buckets
            .entry((rel(e) / 10.0).floor() as i64 * 10)
            .or_default() += 1;
    }
    let quorum = within.iter().filter(|e| e.rv.is_none()).count();
    // The agents list from the watch cache (issue 48): a quorum read is a regression.
    assert_eq!(
        quorum, 0,
        "agents' LISTs after the restart read etcd (no resourceVersion)"
    );
    rows.add(
        &format!(
            "agents' LIST requests within {} s of the API server's return",
            s.after_restart.as_secs()
        ),
        format!(
            "{} ({:.2} per agent), {} without resourceVersion (quorum reads from etcd); {}",
            within.len(),
            within.len() as f64 / n,
            quorum,
            by_kind
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let (first, last) = within.iter().fold((f64::MAX, f64::MIN), |(a, b), e| {
        (a.min(rel(e)), b.max(rel(e)))
    });
    let spread = if within.is_empty() {
        "none".to_string()
    } else {
        format!("{first:.1} s / {last:.1} s")
    };
    rows.add(
        "their spread: first / last second after ready; per 10 s from ready",
        format!(
            "{spread}; {}",
            buckets
                .iter()
                .map(|(k, v)| format!("[{k},{}): {v}", k + 10))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    let mut watch_calls: BTreeMap<String, usize> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.verb == "watch" && e.at >= stopped && e.at <= ready + s.after_restart)
    {
        *watch_calls
            .entry(format!("{} {}", e.resource, e.rv_class()))
            .or_default() += 1;
    }
    let total: usize = watch_calls.values().sum();
    rows.add(
        "agents' WATCH requests ended in the same minutes (so made again)",
        format!(
            "{total} ({:.2} per agent): {}",
            total as f64 / n,
            watch_calls
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let pages = within
        .iter()
        .filter(|e| e.uri.contains("continue="))
        .count();
    rows.add(
        "of those LISTs, continuation pages (limit=500)",
        pages.to_string(),
    );
    rows.add(
        "bytes received per agent from the restart to the end of the window",
        bytes(after.total as f64 / n),
    );
    let m = admin.metrics();
    rows.add(
        "API server's own list calls to etcd since its restart, by type",
        series(&m, "etcd_request_duration_seconds_count")
            .into_iter()
            .filter(|(l, _)| label(l, "operation") == Some("list"))
            .filter(|(l, _)| {
                label(l, "type").is_some_and(|t| t.contains("Pod") || t.contains("Namespace"))
            })
            .map(|(l, v)| format!("{}: {v}", label(&l, "type").unwrap_or("?")))
            .collect::<Vec<_>>()
            .join(", "),
    );
    (ready, back)
}

/// How long after the API server's return (`ready`) every agent watches its pods and the
/// namespaces again, one watch each (none blind, none doubled), and the metrics then. An agent
/// may be in its watch backoff when the server comes back (1 s doubling to 60 s from the
/// first failure, `informers::health::WATCH_BACKOFF`) and lists after a 410 within
/// `RELIST_SPREAD` (10 s): past the cap and the spread, with a margin, a missing watch is a
/// controller gone blind, and the failure shows what each agent logged of its watches.
fn watches_back(
    admin: &Admin,
    base: &str,
    n: f64,
    ready: SystemTime,
    agents: &[Running],
) -> (String, Duration) {
    let deadline = Duration::from_secs(60 + 10 + 20);
    loop {
        let m = admin.metrics();
        let since = SystemTime::now().duration_since(ready).unwrap_or_default();
        let Err(counts) = one_watch_per_kind(base, &m, n) else {
            return (m, since);
        };
        if since > deadline {
            let logs: Vec<String> = agents
                .iter()
                .map(|a| {
                    let log = a.agent.log();
                    let watch_lines: Vec<&str> =
                        log.lines().filter(|l| l.contains("watch")).collect();
                    format!("agent {}:\n{}", a.node, watch_lines.join("\n"))
                })
                .collect();
            panic!(
                "{:.0} s after the API server's return, watches per agent by kind: {counts:?} \
                 (each should be 1)\n{}",
                since.as_secs_f64(),
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `Ok` when the agents hold one watch per kind each (the server's own, in `base`, taken
/// out); else the watches per agent by kind.
fn one_watch_per_kind(base: &str, now: &str, n: f64) -> Result<(), Vec<(&'static str, f64)>> {
    let (b, a) = (watches_by_resource(base), watches_by_resource(now));
    let counts: Vec<(&'static str, f64)> = ["pods", "namespaces"]
        .into_iter()
        .map(|k| (k, (a.get(k).unwrap_or(&0.0) - b.get(k).unwrap_or(&0.0)) / n))
        .collect();
    if counts.iter().all(|(_, c)| (c - 1.0).abs() < 1e-9) {
        Ok(())
    } else {
        Err(counts)
    }
}

/// One agent and what it owns (removed when dropped: the agent first).
struct Running {
    agent: Agent,
    node: String,
    _proc: FakeProc,
    _dir: tempfile::TempDir,
}

/// The agents, started 25 at a time, each waited for until both its controllers listed.
fn start_agents(cp: &ControlPlane, sa: &Path, s: &Scale) -> Vec<Running> {
    let bin = PathBuf::from(cni_testkit::node_bin());
    let plugin = PathBuf::from(cni_testkit::plugin_bin());
    let mut out: Vec<Running> = Vec::new();
    for i in 0..s.agents {
        let dir = tempfile::tempdir().unwrap();
        let zt = dir.path().join("ztunnel");
        std::fs::create_dir(&zt).unwrap();
        std::fs::set_permissions(&zt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let socket = zt.join("ztunnel.sock");
        let socket = socket.to_str().unwrap();
        let proc = FakeProc::new();
        let node = format!("node-{i}");
        let agent = Agent::start(&AgentSpec {
            cp,
            sa,
            proc: proc.path(),
            node: dir.path(),
            node_name: &node,
            bin: &bin,
            plugin: &plugin,
            extra: &[],
            api_port: None,
            netns: None,
            env: &[("AMBIENT_ENABLED", "true"), ("ZTUNNEL_UDS_ADDRESS", socket)],
            umask: None,
        });
        out.push(Running {
            agent,
            node,
            _proc: proc,
            _dir: dir,
        });
        if out.len().is_multiple_of(25) || out.len() == s.agents {
            let from = out.len().saturating_sub(25);
            wait_ready(&mut out[from..]);
        }
    }
    out
}

/// Waits (5 minutes at most) until every agent of `agents` says both controllers started and
/// that it found no kubelet.
fn wait_ready(agents: &mut [Running]) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let ready = |a: &Running| {
        let log = a.agent.log();
        log.contains("enrolled at start; ztunnel may connect")
            && log.contains("starting the repair controller")
            && log.contains("no probe SNAT on this node")
    };
    loop {
        if agents.iter().all(ready) {
            return;
        }
        for a in agents.iter_mut() {
            if let Some(status) = a.agent.exited() {
                panic!("agent {} exited ({status}):\n{}", a.node, a.agent.log());
            }
        }
        if Instant::now() > deadline {
            let a = agents.iter().find(|a| !ready(a)).unwrap();
            panic!(
                "agent {} not ready in 5 minutes:\n{}",
                a.node,
                a.agent.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the agents' first writes (pods annotated pending in the ambient namespaces) are
/// done: the watch count steady and the agents' request count still for 5 s.
fn settle(admin: &Admin, s: &Scale) {
    let count = |m: &str| -> f64 {
        series(m, "apiserver_request_total")
            .iter()
            .filter(|(l, _)| label(l, "verb") != Some("WATCH"))
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    let still = Duration::from_secs(if s.quick { 1 } else { 5 });
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = (count(&admin.metrics()), Instant::now());
    let mut watches = watch_total(&admin.metrics());
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        let m = admin.metrics();
        // The bench's own metrics reads count too: one a second is still.
        let c = count(&m);
        let w = watch_total(&m);
        if c - last.0 > 2.0 || w != watches {
            last = (c, Instant::now());
            watches = w;
        } else if last.1.elapsed() >= still {
            return;
        }
    }
    eprintln!("the agents did not settle in 5 minutes; measuring anyway");
}

fn watch_total(m: &str) -> f64 {
    watches_by_resource(m).values().sum()
}

/// The WATCH requests open, by resource (1.20 calls it `apiserver_longrunning_gauge`, later
/// versions `apiserver_longrunning_requests`).
fn watches_by_resource(m: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for name in [
        "apiserver_longrunning_gauge",
        "apiserver_longrunning_requests",
    ] {
        for (l, v) in series(m, name) {
            if label(&l, "verb") == Some("WATCH") {
                *out.entry(label(&l, "resource").unwrap_or("?").to_owned())
                    .or_default() += v;
            }
        }
    }
    out
}

/// The watch rows: open WATCH requests and registered watchers, per agent, by resource.
fn watches(rows: &mut Row, base: &str, now: &str, n: f64, when: &str) {
    let (b, a) = (watches_by_resource(base), watches_by_resource(now));
    let total: f64 = a.values().sum::<f64>() - b.values().sum::<f64>();
    rows.add(
        &format!("watches open per agent{when} (WATCH requests, by resource)"),
        format!(
            "{:.2}: {}",
            total / n,
            a.iter()
                .map(|(k, v)| format!("{k} {:.2}", (v - b.get(k).unwrap_or(&0.0)) / n))
                .filter(|s| !s.ends_with(" 0.00"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let by_kind = |m: &str| -> BTreeMap<String, f64> {
        series(m, "apiserver_registered_watchers")
            .into_iter()
            .map(|(l, v)| (label(&l, "kind").unwrap_or("?").to_owned(), v))
            .collect()
    };
    let (b, a) = (by_kind(base), by_kind(now));
    rows.add(
        &format!("registered watchers per agent{when} (watch cache, by kind)"),
        a.iter()
            .map(|(k, v)| format!("{k} {:.2}", (v - b.get(k).unwrap_or(&0.0)) / n))
            .filter(|s| !s.ends_with(" 0.00"))
            .collect::<Vec<_>>()
            .join(", "),
    );
}

/// `apiserver_watch_events_sizes_sum` by kind between two reads, scaled by `per_min`.
fn event_bytes(before: &str, after: &str, per_min: f64) -> String {
    let sum = |m: &str| -> BTreeMap<String, (f64, f64)> {
        let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (l, v) in series(m, "apiserver_watch_events_sizes_sum") {
            out.entry(label(&l, "kind").unwrap_or("?").to_owned())
                .or_default()
                .0 += v;
        }
        for (l, v) in series(m, "apiserver_watch_events_total") {
            out.entry(label(&l, "kind").unwrap_or("?").to_owned())
                .or_default()
                .1 += v;
        }
        out
    };
    let (b, a) = (sum(before), sum(after));
    let mut parts: Vec<(f64, String)> = a
        .iter()
        .map(|(k, (bytes_now, events_now))| {
            let (bb, be) = b.get(k).copied().unwrap_or_default();
            let d = (bytes_now - bb) * per_min;
            (
                d,
                format!(
                    "{k} {} in {:.0} events",
                    bytes(d),
                    (events_now - be) * per_min
                ),
            )
        })
        .filter(|(d, _)| *d > 0.0)
        .collect();
    parts.sort_by(|x, y| y.0.total_cmp(&x.0));
    parts
        .into_iter()
        .map(|(_, s)| s)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The series of metric `name` in Prometheus text: (labels, value).
fn series(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(s, v)| {
            let (n, rest) = s.split_once('{').unwrap_or((s, ""));
            (n == name).then(|| (rest.to_owned(), v.parse().unwrap_or(0.0)))
        })
        .collect()
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

fn bytes(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// The API server's Go heap in use (`go_memstats_heap_inuse_bytes`), in MB.
fn heap_mb(m: &str) -> f64 {
    series(m, "go_memstats_heap_inuse_bytes")
        .first()
        .map(|(_, v)| v / 1024.0 / 1024.0)
        .unwrap_or(0.0)
}

fn rss_kb(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The API server's CPU per minute (utime + stime over a window) and its RSS at the end.
struct ApiUsage {
    cpu_per_min: f64,
    rss_mb: f64,
}

impl ApiUsage {
    fn over(cp: &ControlPlane, window: Duration) -> ApiUsage {
        let pid = cp.apiserver_pid();
        let before = cni_testkit::process_cpu_seconds(pid);
        std::thread::sleep(window);
        ApiUsage {
            cpu_per_min: (cni_testkit::process_cpu_seconds(pid) - before) * 60.0
                / window.as_secs_f64(),
            rss_mb: rss_kb(pid) as f64 / 1024.0,
        }
    }
}

/// The bytes the agents received from the API server over a window, from their sockets.
struct Traffic {
    total: u64,
    /// The least and most one agent received.
    min: u64,
    max: u64,
}

impl Traffic {
    /// `during` run while the agents' sockets to `port` are polled every 2 s (and once more
    /// when it returns): a socket seen at the first poll counts from its bytes then, a socket
    /// first seen later from 0.
    fn over(port: u16, pids: &HashSet<u32>, during: impl FnOnce()) -> Traffic {
        let stop = AtomicBool::new(false);
        let mut first: HashMap<String, (u32, u64, u64)> = HashMap::new();
        for (key, pid, b) in sockets(port, pids) {
            first.insert(key, (pid, b, b));
        }
        let seen = std::thread::scope(|scope| {
            let poller = scope.spawn(|| {
                let mut seen = first;
                loop {
                    let last = stop.load(Ordering::SeqCst);
                    for (key, pid, b) in sockets(port, pids) {
                        let e = seen.entry(key).or_insert((pid, 0, 0));
                        e.2 = e.2.max(b);
                    }
                    if last {
                        return seen;
                    }
                    for _ in 0..20 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            });
            during();
            stop.store(true, Ordering::SeqCst);
            poller.join().unwrap()
        });
        let mut per: HashMap<u32, u64> = pids.iter().map(|p| (*p, 0)).collect();
        for (pid, first, last) in seen.values() {
            *per.entry(*pid).or_default() += last.saturating_sub(*first);
        }
        Traffic {
            total: per.values().sum(),
            min: per.values().copied().min().unwrap_or(0),
            max: per.values().copied().max().unwrap_or(0),
        }
    }
}

/// The TCP sockets to 127.0.0.1:`port` owned by one of `pids`: (local address, pid,
/// bytes_received), from `ss -tinp`.
fn sockets(port: u16, pids: &HashSet<u32>) -> Vec<(String, u32, u64)> {
    let out = Command::new("ss")
        .args(["-tinpH", "state", "established", "dst"])
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .expect("ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    let mut current: Option<(String, u32)> = None;
    let peer = format!("127.0.0.1:{port}");
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let local = words
                .iter()
                .position(|w| *w == peer)
                .and_then(|i| i.checked_sub(1))
                .map(|i| words[i].to_owned());
            let pid = line
                .split("pid=")
                .nth(1)
                .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse().ok());
            current = local.zip(pid).filter(|(_, p)| pids.contains(p));
        } else if let Some((local, pid)) = current.take() {
            let received = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("bytes_received:"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            found.push((local, pid, received));
        }
    }
    found
}

/// One audit event of an agent's request.
struct AuditEvent {
    verb: String,
    resource: String,
    uri: String,
    at: SystemTime,
    /// The `resourceVersion` asked for, if any.
    rv: Option<String>,
}

impl AuditEvent {
    fn rv_class(&self) -> &'static str {
        match self.rv.as_deref() {
            None => "(no RV: etcd)",
            Some("0") => "(RV=0: cache)",
            Some(_) => "(RV=n: from the cache)",
        }
    }
}

/// The agents' completed requests in the audit log from byte `offset` on.
fn audit_after(path: &Path, offset: u64) -> Vec<AuditEvent> {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text[(offset as usize).min(text.len())..]).into_owned();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == AGENT_USER)
        // A watch counted once (its ResponseStarted; 1.20 logs it only as the watch ends, with
        // its ResponseComplete), the rest when answered.
        .filter(|e| {
            let watch = e["verb"] == "watch";
            e["stage"]
                == if watch {
                    "ResponseStarted"
                } else {
                    "ResponseComplete"
                }
        })
        .filter_map(|e| {
            let uri = e["requestURI"].as_str()?.to_owned();
            let rv = uri
                .split_once('?')
                .map(|(_, q)| q)
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            Some(AuditEvent {
                verb: e["verb"].as_str()?.to_owned(),
                resource: e["objectRef"]["resource"].as_str().unwrap_or("").to_owned(),
                at: humantime::parse_rfc3339_weak(e["requestReceivedTimestamp"].as_str()?).ok()?,
                uri,
                rv,
            })
        })
        .collect()
}

/// The admin's client, on a runtime of its own, for the cluster's objects and the churn.
struct Admin {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Admin {
    fn new(cp: &ControlPlane) -> Admin {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&cp.admin).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(cfg).unwrap()
        });
        Admin { rt, client }
    }

    fn metrics(&self) -> String {
        self.rt.block_on(async {
            let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
            self.client.request_text(req).await.unwrap()
        })
    }

    fn label_namespace(&self, ns: &str, key: &str, value: &str) {
        self.rt.block_on(async {
            Api::<Namespace>::all(self.client.clone())
                .patch(
                    ns,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
                )
                .await
                .unwrap();
        });
    }

    /// The nodes, the namespaces (every fourth ambient) and the pods, Running; returns the
    /// ambient namespaces.
    fn cluster(&self, s: &Scale) -> Vec<String> {
        self.rt.block_on(async {
            let c = &self.client;
            let nodes = (0..s.agents).map(|i| async move {
                let node: Node =
                    serde_json::from_value(json!({"metadata": {"name": format!("node-{i}")}}))
                        .unwrap();
                Api::<Node>::all(c.clone())
                    .create(&PostParams::default(), &node)
                    .await
                    .unwrap();
            });
            futures_util::stream::iter(nodes)
                .for_each_concurrent(16, |f| f)
                .await;
            let mut ambient = Vec::new();
            for i in 0..s.namespaces {
                let name = format!("ns-{i}");
                let mut labels = json!({"team": format!("team-{}", i % 5)});
                if i.is_multiple_of(4) {
                    labels["istio.io/dataplane-mode"] = "ambient".into();
                    ambient.push(name.clone());
                }
                let ns: Namespace =
                    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                        .unwrap();
                Api::<Namespace>::all(c.clone())
                    .create(&PostParams::default(), &ns)
                    .await
                    .unwrap();
            }
            let total = s.agents * s.pods_per_node;
            let pods = (0..total).map(|i| {
                let ns = format!("ns-{}", i % s.namespaces);
                let amb = ambient.contains(&ns);
                async move {
                    create_running(
                        c,
                        &ns,
                        &format!("app-{i}"),
                        &format!("node-{}", i % s.agents),
                        i,
                        amb,
                    )
                    .await
                }
            });
            futures_util::stream::iter(pods)
                .for_each_concurrent(16, |f| f)
                .await;
            ambient
        })
    }

    /// One minute (the window) of churn: every 500 ms a pod created on a random node and made
    /// Running, or the oldest pod of the churn deleted, alternately; a namespace label changed
    /// every 10 s.
    fn churn(&self, s: &Scale) {
        let mut rng = cni_testkit::Rng::new("apiserver_cost churn");
        let start = Instant::now();
        let mut made: std::collections::VecDeque<(String, String)> = Default::default();
        let mut tick = 0u64;
        while start.elapsed() < s.window {
            let due = start + Duration::from_millis(500 * tick);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if tick.is_multiple_of(20) {
                let ns = format!("ns-{}", rng.below(s.namespaces as u64));
                self.label_namespace(&ns, "bench/churn", &tick.to_string());
            }
            if tick.is_multiple_of(2) {
                let i = 1_000_000 + tick as usize;
                let ns_i = rng.below(s.namespaces as u64) as usize;
                let ns = format!("ns-{ns_i}");
                let node = format!("node-{}", rng.below(s.agents as u64));
                let name = format!("churn-{tick}");
                self.rt.block_on(create_running(
                    &self.client,
                    &ns,
                    &name,
                    &node,
                    i,
                    ns_i.is_multiple_of(4),
                ));
                made.push_back((ns, name));
            } else if let Some((ns, name)) = made.pop_front() {
                self.rt.block_on(async {
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    };
                    Api::<Pod>::namespaced(self.client.clone(), &ns)
                        .delete(&name, &dp)
                        .await
                        .unwrap();
                });
            }
            tick += 1;
        }
    }
}

/// Pod `ns/name` created on `node` (Istio's sidecar pod, or the same without its sidecar in an
/// ambient namespace) and made Running with address number `i`, as kubelet reports it.
async fn create_running(
    c: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    i: usize,
    ambient: bool,
) {
    let mut spec = cni_testkit::fixtures::istio_pod_to_create(ns, name, node);
    if ambient {
        strip_sidecar(&mut spec);
    }
    let api = Api::<Pod>::namespaced(c.clone(), ns);
    let pod: Pod = serde_json::from_value(spec.clone()).unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    let ip = format!("10.{}.{}.{}", 64 + (i >> 16) % 64, (i >> 8) & 255, i & 255);
    let host = format!("192.168.{}.{}", 1 + (i % 50_000) / 250, 1 + i % 250);
    let status = running_status(&spec, &ip, &host);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

/// Istio's sidecar taken off the pod: what an ambient namespace's pod looks like.
fn strip_sidecar(pod: &mut Value) {
    for kind in ["containers", "initContainers"] {
        if let Some(list) = pod["spec"][kind].as_array_mut() {
            list.retain(|c| c["name"] != "istio-proxy" && c["name"] != "istio-validation");
        }
    }
    if let Some(a) = pod["metadata"]["annotations"].as_object_mut() {
        a.retain(|k, _| !k.contains("istio.io"));
    }
    if let Some(l) = pod["metadata"]["labels"].as_object_mut() {
        l.retain(|k, _| !k.contains("istio.io"));
    }
}

/// The status kubelet writes for a pod started: Running, the addresses, the conditions, each
/// container running (the init containers exited 0).
fn running_status(spec: &Value, ip: &str, host: &str) -> Value {
    let now = "2026-01-01T00:00:00Z";
    let status_of = |c: &Value, init: bool| {
        let state = if init {
            json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
        } else {
            json!({"running": {"startedAt": now}})
        };
        json!({"name": c["name"], "ready": !init, "restartCount": 0, "started": !init,
               "image": c["image"], "imageID": format!("docker.io/{}@sha256:0123", c["image"].as_str().unwrap_or("")),
               "containerID": "containerd://0123456789abcdef0123456789abcdef", "state": state})
    };
    let list = |kind: &str, init: bool| -> Vec<Value> {
        spec["spec"][kind]
            .as_array()
            .map(|v| v.iter().map(|c| status_of(c, init)).collect())
            .unwrap_or_default()
    };
    let condition = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let conditions = ["Initialized", "Ready", "ContainersReady", "PodScheduled"].map(condition);
    json!({
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host, "startTime": now,
        "conditions": conditions,
        "containerStatuses": list("containers", false),
        "initContainerStatuses": list("initContainers", true),
        "qosClass": "Burstable",
    })
}
