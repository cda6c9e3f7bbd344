//! What operators see of the plugin through the node agent: the installer binary runs the
//! agent, the plugin binary tells it each call (a datagram in the run directory), and
//! `/metrics` counts them (`redirect_cni_plugin_calls_total`, the ADD histograms,
//! `istio_cni_installs_total`); the plugin's STATUS follows the agent's readiness; the
//! plugin's start and end lines name the pod and the outcome. Real ADDs in namespaces.

use cni_testkit as common;

use std::fs;
use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cni_env, node_bin, plugin, pod_ns, Out, STATUS_CNI};
use redirect_testkit::{kernel_test, TestNetns};
use serde_json::{json, Value};

const PORT: u16 = 15014;
const WAIT: Duration = Duration::from_secs(20);

fn conf(run: &Path, annotations: Value) -> String {
    json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
        "cni_agent_run_dir": run,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": annotations}})
    .to_string()
}

fn mesh() -> Value {
    json!({"sidecar.istio.io/status": STATUS_CNI})
}

fn args(name: &str) -> String {
    format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};K8S_POD_UID=u-{name}")
}

/// STATUS, which the CNI spec has from 1.1.0 on.
fn status(run: &Path) -> Out {
    let mut c: Value = serde_json::from_str(&conf(run, json!({}))).unwrap();
    c["cniVersion"] = "1.1.0".into();
    plugin(
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")],
        &c.to_string(),
    )
}

fn eventually<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    cni_testkit::eventually(what, WAIT, f)
}

/// `GET /metrics` in the agent's namespace.
fn scrape(node: &TestNetns) -> Option<String> {
    cni_testkit::http_get(node, PORT, "/metrics").map(|(_, body)| body)
}

/// The value of the sample `name` (with its labels, as exposed), 0 when absent.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.split(' ').next().unwrap().parse().unwrap())
        .unwrap_or(0.0)
}

fn requests(text: &str, command: &str, code: u32) -> f64 {
    sample(
        text,
        &format!(
            "redirect_cni_plugin_calls_total{{command=\"{command}\",response_code=\"{code}\"}}"
        ),
    )
}

/// The installer binary (and so the agent) in `node`, standalone config, no repair.
fn start_agent(node: &TestNetns, dirs: &Path) -> Child {
    start_agent_with(node, dirs, &[])
}

/// [`start_agent`] with more flags.
fn start_agent_with(node: &TestNetns, dirs: &Path, more: &[&str]) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", node.name(), node_bin()])
        .args(common::install_args(dirs))
        .args(more)
        .arg("--repair-enabled=false")
        .arg("--service-account-dir")
        .arg(dirs.join("sa"))
        .args(["--monitoring-port", &PORT.to_string()])
        .env_clear()
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd.spawn().expect("spawn redirect-cni install")
}

fn stop(mut child: Child) -> String {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    err
}

fn dirs() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for sub in ["net", "bin", "run", "sa"] {
        fs::create_dir(d.path().join(sub)).unwrap();
    }
    d
}

/// STATUS before any agent (ready), while the agent waits for its service account (not
/// ready, code 50, saying why), and once installed (ready); then 50 ADDs in namespaces, a
/// refused ADD, CHECKs and DELs, counted and timed on `/metrics`.
#[kernel_test]
fn the_agent_counts_and_times_the_plugins_calls() {
    let d = dirs();
    let run = d.path().join("run");
    assert_eq!(
        status(&run).code,
        0,
        "no agent on the node: STATUS asks nf_tables alone"
    );

    // The installer's fatal error at start (no service account token): the agent exits and
    // leaves its verdict; the DaemonSet would restart it.
    let node = TestNetns::new();
    let failed = start_agent(&node, d.path()).wait_with_output().unwrap();
    assert_eq!(
        failed.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&failed.stderr)
    );
    let out = status(&run);
    assert_eq!(out.json()["code"], 50, "{}", out.stdout);
    let msg = out.json()["msg"].as_str().unwrap().to_owned();
    assert!(
        msg.starts_with("the node agent is not ready: the node agent exited: ")
            && msg.contains("service account token"),
        "STATUS should say why: {msg}"
    );

    let token = d.path().join("sa/token");
    fs::write(&token, "t0k3n").unwrap();
    fs::write(d.path().join("sa/ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let agent = start_agent(&node, d.path());
    eventually("STATUS ready", || (status(&run).code == 0).then_some(()));
    let text = scrape(&node).unwrap();
    assert_eq!(sample(&text, "istio_cni_install_ready"), 1.0, "{text}");
    assert_eq!(
        sample(&text, "istio_cni_installs_total{result=\"SUCCESS\"}"),
        1.0,
        "{text}"
    );

    // 50 ADDs, each in its own pod namespace, timed from outside.
    let adds = 50;
    let pods: Vec<TestNetns> = (0..adds).map(|_| pod_ns()).collect();
    let mut wall = Duration::ZERO;
    for (i, ns) in pods.iter().enumerate() {
        let netns = ns.path().to_str().unwrap();
        let a = args(&format!("web-{i}"));
        let t = Instant::now();
        let out = plugin(&cni_env("ADD", netns, &a), &conf(&run, mesh()));
        wall += t.elapsed();
        assert_eq!(out.code, 0, "ADD {i}: {}{}", out.stdout, out.stderr);
    }
    // One refused by its annotation, three CHECKs and two DELs.
    let bad = json!({"sidecar.istio.io/status": STATUS_CNI,
        "traffic.sidecar.istio.io/includeInboundPorts": "http"});
    let out = plugin(
        &cni_env("ADD", "/nonexistent", &args("bad")),
        &conf(&run, bad),
    );
    assert_eq!(out.json()["code"], 101, "{}", out.stdout);
    for (i, ns) in pods.iter().enumerate().take(3) {
        let netns = ns.path().to_str().unwrap();
        let out = plugin(
            &cni_env("CHECK", netns, &args(&format!("web-{i}"))),
            &conf(&run, mesh()),
        );
        assert_eq!(out.code, 0, "CHECK: {}{}", out.stdout, out.stderr);
    }
    for (i, ns) in pods.iter().enumerate().take(2) {
        let netns = ns.path().to_str().unwrap();
        let out = plugin(
            &cni_env("DEL", netns, &args(&format!("web-{i}"))),
            &conf(&run, mesh()),
        );
        assert_eq!(out.code, 0, "DEL: {}{}", out.stdout, out.stderr);
    }

    let text = eventually("every call counted", || {
        let t = scrape(&node)?;
        (requests(&t, "DEL", 0) == 2.0).then_some(t)
    });
    assert_eq!(requests(&text, "ADD", 0), adds as f64, "{text}");
    assert_eq!(requests(&text, "ADD", 101), 1.0, "{text}");
    assert_eq!(requests(&text, "CHECK", 0), 3.0, "{text}");
    assert_eq!(
        requests(&text, "STATUS", 0),
        0.0,
        "STATUS is not an event: {text}"
    );
    check_histograms(&text, adds + 1, adds, wall);

    // The token gone while the agent runs: not ready, counted, and ready again once back.
    fs::remove_file(&token).unwrap();
    let out = eventually("STATUS naming the kubeconfig", || {
        let out = status(&run);
        out.stdout.contains("kubeconfig").then_some(out)
    });
    assert_eq!(out.json()["code"], 50, "{}", out.stdout);
    let text = scrape(&node).unwrap();
    assert!(
        sample(
            &text,
            "istio_cni_installs_total{result=\"READ_SERVICE_ACCOUNT_FAILURE\"}"
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(sample(&text, "istio_cni_install_ready"), 0.0, "{text}");
    fs::write(&token, "t0k3n").unwrap();
    eventually("STATUS ready again", || {
        (status(&run).code == 0).then_some(())
    });

    let err = stop(agent);
    assert!(
        !run.join("plugin-events.sock").exists(),
        "the socket outlives the agent:\n{err}"
    );
    assert!(
        !run.join("agent-ready").exists(),
        "the status file outlives the agent:\n{err}"
    );
    assert_eq!(
        status(&run).code,
        0,
        "no agent any more: STATUS asks nf_tables alone"
    );
}

/// The whole-ADD histogram holds every ADD (`all`), the apply phase the `applied` ones; the
/// buckets are cumulative and reach from 0.5 ms to 10 s; the plugin's own times are within
/// what the test measured from outside (`wall`, the successful ADDs' processes).
fn check_histograms(text: &str, all: usize, applied: usize, wall: Duration) {
    let total = "redirect_cni_add_duration_seconds";
    assert_eq!(
        sample(text, &format!("{total}_count")),
        all as f64,
        "{text}"
    );
    let mut last = 0.0;
    for le in [
        "0.0005", "0.001", "0.005", "0.01", "0.1", "1.0", "10.0", "+Inf",
    ] {
        let n = sample(text, &format!("{total}_bucket{{le=\"{le}\"}}"));
        assert!(
            n >= last,
            "buckets are cumulative: le={le} has {n} < {last}\n{text}"
        );
        last = n;
    }
    assert_eq!(last, all as f64, "{text}");
    let phase = |p: &str, what: &str| {
        sample(
            text,
            &format!("redirect_cni_add_phase_duration_seconds_{what}{{phase=\"{p}\"}}"),
        )
    };
    assert_eq!(phase("config", "count"), all as f64, "{text}");
    assert_eq!(phase("apply", "count"), applied as f64, "{text}");
    assert_eq!(
        phase("pod_read", "count"),
        0.0,
        "the runtime gave the annotations: {text}"
    );
    let sum = sample(text, &format!("{total}_sum"));
    let apply = phase("apply", "sum");
    assert!(
        apply > 0.0 && apply < sum,
        "apply {apply} s within ADD {sum} s\n{text}"
    );
    assert!(
        sum < wall.as_secs_f64() + 0.5,
        "the plugin says its ADDs took {sum} s, the test measured {wall:?} for them\n{text}"
    );
}

/// An agent that does not read (its socket bound, its queue full) costs the plugin nothing:
/// every call answers as before.
#[kernel_test]
fn a_hung_agent_changes_nothing_for_the_plugin() {
    let d = dirs();
    let run = d.path().join("run");
    let hung = UnixDatagram::bind(run.join("plugin-events.sock")).unwrap();
    let sender = UnixDatagram::unbound().unwrap();
    sender.set_nonblocking(true).unwrap();
    let mut queued = 0;
    while sender
        .send_to(&[b'x'; 512], run.join("plugin-events.sock"))
        .is_ok()
    {
        queued += 1;
    }
    assert!(queued > 0, "the queue should have taken some datagrams");
    let ns = pod_ns();
    let netns = ns.path().to_str().unwrap();
    for cmd in ["ADD", "CHECK", "DEL"] {
        let out = common::plugin_within(
            Duration::from_secs(10),
            &cni_env(cmd, netns, &args("web-0")),
            &conf(&run, mesh()),
        );
        assert_eq!(out.code, 0, "{cmd}: {}{}", out.stdout, out.stderr);
    }
    drop(hung);
}

/// The start and end lines an operator greps for: `ADD <namespace>/<name>: start` and
/// `ADD <namespace>/<name>: end: <outcome> (<time> ms)`, for a captured pod, one left alone,
/// and a refused one.
#[kernel_test]
fn start_and_end_lines_name_the_pod_and_the_outcome() {
    let d = dirs();
    let run = d.path().join("run");
    let ns = pod_ns();
    let netns = ns.path().to_str().unwrap();
    let cases = [
        (mesh(), "web-0", "end: captured ("),
        (json!({}), "plain-0", "end: not captured ("),
        (
            json!({"sidecar.istio.io/status": STATUS_CNI, "traffic.sidecar.istio.io/includeInboundPorts": "http"}),
            "bad-0",
            "end: failed with code 101 (",
        ),
    ];
    for (annotations, name, end) in cases {
        let out = plugin(
            &cni_env("ADD", netns, &args(name)),
            &conf(&run, annotations),
        );
        let lines: Vec<&str> = out.stderr.lines().collect();
        let start =
            format!("info\tredirect-cni\tADD shop/{name}: start (netns {netns}, interface eth0)");
        let first = lines.iter().position(|l| *l == start);
        let last = lines
            .iter()
            .position(|l| l.contains(&format!("\tADD shop/{name}: {end}")) && l.ends_with(" ms)"));
        assert!(
            matches!((first, last), (Some(a), Some(b)) if a < b && b == lines.len() - 1),
            "{name}: a start line, then the end line last ({end}):\n{}",
            out.stderr
        );
    }
}

/// Datagrams no plugin sends add no label value and no time: 300 codes the plugin never
/// answers are counted under `other`, a call of u64::MAX µs and an overlong pod are dropped.
#[kernel_test]
fn forged_datagrams_add_no_label_values() {
    let d = dirs();
    fs::write(d.path().join("sa/token"), "t0k3n").unwrap();
    fs::write(d.path().join("sa/ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let node = TestNetns::new();
    let agent = start_agent(&node, d.path());
    let run = d.path().join("run");
    eventually("the agent's socket", || {
        run.join(cni_protocol::events::SOCKET_NAME)
            .exists()
            .then_some(())
    });
    let sock = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let to = run.join(cni_protocol::events::SOCKET_NAME);
    for code in 1000..1300 {
        let e = format!(r#"{{"command":"ADD","code":{code},"total_us":1000}}"#);
        sock.send_to(e.as_bytes(), &to).unwrap();
    }
    for forged in [
        format!(r#"{{"command":"ADD","code":0,"total_us":{}}}"#, u64::MAX),
        format!(
            r#"{{"command":"ADD","code":0,"total_us":1,"pod":"{}"}}"#,
            "x".repeat(600)
        ),
    ] {
        sock.send_to(forged.as_bytes(), &to).unwrap();
    }
    let text = eventually("300 events counted", || {
        let text = scrape(&node)?;
        let other = "redirect_cni_plugin_calls_total{command=\"ADD\",response_code=\"other\"}";
        (sample(&text, other) == 300.0).then_some(text)
    });
    let series = text
        .lines()
        .filter(|l| l.starts_with("redirect_cni_plugin_calls_total{"))
        .count();
    assert_eq!(series, 1, "{text}");
    assert_eq!(
        sample(&text, "redirect_cni_add_duration_seconds_count"),
        300.0,
        "the two forged events were counted: {text}"
    );
    stop(agent);
}

/// `kubectl logs` of the agent shows the plugin's lines: each line the plugin logs for a pod's
/// ADD is printed by the agent with the command and the pod, in text and, with `LOG_AS_JSON`
/// (the agent) and `log_as_json` (the plugin), as JSON lines that parse one by one; a forged
/// line stays one line.
#[kernel_test]
fn the_plugins_lines_reach_the_agents_log_as_text_and_as_json() {
    for json in [false, true] {
        let d = dirs();
        let run = d.path().join("run");
        fs::write(d.path().join("sa/token"), "t0k3n").unwrap();
        fs::write(d.path().join("sa/ca.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let node = TestNetns::new();
        let as_json = format!("--log_as_json={json}");
        let agent = start_agent_with(&node, d.path(), &[&as_json]);
        let to = run.join(cni_protocol::events::SOCKET_NAME);
        eventually("the agent's socket", || to.exists().then_some(()));
        let ns = pod_ns();
        let mut c: Value = serde_json::from_str(&conf(&run, mesh())).unwrap();
        c["log_as_json"] = json.into();
        let out = plugin(
            &cni_env("ADD", ns.path().to_str().unwrap(), &args("web-0")),
            &c.to_string(),
        );
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        // A forged line: its line break must not start a line of its own.
        let forged =
            r#"{"log":{"level":"error","command":"ADD","pod":"shop/x","line":"a\nerror\tFORGED"}}"#;
        let sent = UnixDatagram::unbound()
            .unwrap()
            .send_to(forged.as_bytes(), &to);
        std::thread::sleep(Duration::from_millis(300));
        let log = stop(agent);
        assert!(sent.is_ok(), "json={json}: {sent:?}\n{log}");
        let end = "plugin ADD shop/web-0: ADD shop/web-0: end: captured (";
        assert!(
            log.contains(end),
            "json={json}: no forwarded end line:\n{log}"
        );
        assert!(
            !log.lines().any(|l| l.starts_with("error\tFORGED")),
            "{log}"
        );
        if json {
            for text in [&log, &out.stderr] {
                for l in text.lines() {
                    let v: Value = serde_json::from_str(l)
                        .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\n{text}"));
                    assert!(v["level"].is_string() && v["msg"].is_string(), "{l}");
                }
            }
            let forwarded: Value = log
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|v| v["msg"].as_str().is_some_and(|m| m.contains(end)))
                .unwrap();
            assert_eq!(forwarded["scope"], "cni-plugin", "{forwarded}");
        }
    }
}
