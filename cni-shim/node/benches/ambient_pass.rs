//! What the ambient controller's pass costs at a full node, and what a restart writes, whole
//! processes against a real API server (`cni_testkit::ambient`), ztunnel's stand-in
//! (`testpod ztunnel`) acking every pod:
//!
//! - `PODS` pods enrolled (each its own namespace, in the host's `/proc` by its cgroup);
//! - with a pass every second, over a window: the agent's CPU time per pass (its `/proc` stat,
//!   all threads), the pass's own duration (`redirect_cni_ambient_reconcile_pass_seconds`), and
//!   the API server's requests per pass for pods and namespaces other than the watches, from
//!   JSON clients (`apiserver_request_total`; kube-apiserver's own loops speak protobuf): the
//!   pass reads the watch's cache, never the server;
//! - the agent restarted with every pod enrolled and nothing changed: the status writes
//!   (`PATCH pods/status`) the API server counts from its stop to two passes after ztunnel's
//!   snapshot.
//!
//! `cargo bench -p cni-node --bench ambient_pass` (root; `cargo test` runs it with 3 pods and
//! a short window). With `BRANCH_ENI=1`, every pod is laid out as aws-vpc-cni lays out a pod
//! behind a branch ENI (its host route in a table of its own, an `iif` rule into it, the node's
//! `tcp_early_demux` 0): the pass then also reads back two ip rules per pod. With
//! `CHECK_LISTENERS=0`, the agent does not read ztunnel's listeners in each pod
//! (`AMBIENT_CHECK_LISTENERS=false`): the difference is that read's cost. With
//! `CAPTURE_COUNTERS=pod` (or `node`), the pods' rules carry counters and each pass reads them
//! (one dump of a pod's rules, at most every `CAPTURE_COUNTERS_INTERVAL`, 15 s unless set):
//! the difference is the counters' cost to the pass. With `SYNTHETIC=1`,
//! the agent runs the synthetic check (`AMBIENT_SYNTHETIC_CHECK=rotate`: one pod a pass, a
//! connection to 192.0.2.1:9 landing on the stand-in's 15001): the difference is its cost, and
//! the checks' own time is read from the node view.

use std::time::{Duration, Instant};

use cni_testkit::ambient::{create_pod, pod_netns, running, Launch, Node, ZtunnelProcess};
use cni_testkit::host_proc::cgroupfs;
use redirect_testkit::kernel_available;

const PORT: u16 = 15014;

fn main() {
    if !kernel_available("the ambient_pass benchmark") {
        return;
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let (pods, window) = if quick {
        (3, Duration::from_secs(4))
    } else {
        (110, Duration::from_secs(60))
    };
    let branch_eni = std::env::var("BRANCH_ENI").is_ok_and(|v| v == "1");
    let n = Node::new();
    n.ambient_namespace("shop");
    if branch_eni {
        n.host.sh("echo 0 > /proc/sys/net/ipv4/tcp_early_demux");
    }
    let mut netns = Vec::new();
    for i in 0..pods {
        let name = format!("web-{i}");
        let uid = create_pod(&n.cp, "shop", &name);
        let ip = format!("10.77.{}.{}", 1 + i / 200, 2 + i % 200);
        let ns = pod_netns(&n.host, &ip, &format!("vp{i}"));
        if branch_eni {
            let table = 100 + i;
            n.host.sh(&format!(
                "ip route del {ip}/32 dev vp{i} && \
                 ip route add {ip} dev vp{i} scope link table {table} && \
                 ip rule add iif vp{i} lookup {table} pref 10"
            ));
        }
        n.proc.add(5000 + i as u32, &cgroupfs(&uid), 100, ns.path());
        running(&n.cp, "shop", &name, &ip);
        netns.push(ns);
    }
    // CHECK_LISTENERS=0: the pass without the read of ztunnel's listeners in each pod.
    let listeners = if std::env::var("CHECK_LISTENERS").is_ok_and(|v| v == "0") {
        "false"
    } else {
        "true"
    };
    let counters = std::env::var("CAPTURE_COUNTERS").unwrap_or_else(|_| "off".into());
    let every = std::env::var("CAPTURE_COUNTERS_INTERVAL").unwrap_or_else(|_| "15s".into());
    // SYNTHETIC=1: the pass with the synthetic check of one pod.
    let synthetic = if std::env::var("SYNTHETIC").is_ok_and(|v| v == "1") {
        "rotate"
    } else {
        "off"
    };
    let env = [
        ("CAPTURE_COUNTERS_INTERVAL", every.as_str()),
        ("AMBIENT_RECONCILE_INTERVAL", "1s"),
        ("AMBIENT_CHECK_LISTENERS", listeners),
        ("CAPTURE_COUNTERS", counters.as_str()),
        ("AMBIENT_SYNTHETIC_CHECK", synthetic),
    ];
    let launch = Launch {
        args: &["--monitoring-port=15014"],
        env: &env,
        ..Launch::default()
    };
    let agent = n.agent_as(&launch);
    let _ztunnel = ZtunnelProcess::start(&n.socket);
    let enrolled = Instant::now();
    cni_testkit::eventually("every pod enabled", Duration::from_secs(300), || {
        (metric(&n, "redirect_cni_ambient_pods", &["stage=\"enabled\""]) == pods as f64)
            .then_some(())
    });
    println!(
        "{pods} pods enrolled and acked {} ms after the agent let ztunnel in",
        enrolled.elapsed().as_millis()
    );
    if branch_eni {
        cni_testkit::eventually("two rules per pod", Duration::from_secs(60), || {
            (n.host.sh("ip -4 rule show").matches("proto 157").count() == 2 * pods).then_some(())
        });
        println!(
            "every pod behind a branch ENI: {} ip rules of ours",
            2 * pods
        );
    }
    // Their annotations written (pending at enrollment, before ztunnel connected, then
    // enabled), so that the window sees the passes alone.
    cni_testkit::eventually(
        "every pod annotated enabled",
        Duration::from_secs(300),
        || (annotated_enabled(&n) == pods).then_some(()),
    );

    // The pass, over the window.
    let before = Sample::take(&n, agent.pid());
    std::thread::sleep(window);
    let after = Sample::take(&n, agent.pid());
    let passes = after.passes - before.passes;
    assert!(passes > 0.0, "no pass in {window:?}");
    println!(
        "pass over {pods} enrolled pods ({passes} passes in {} s): {:.2} ms of the agent's CPU \
         per pass ({:.2}% of a core at one pass every 5 s), {:.2} ms per pass (wall), {:.1} \
         API requests per pass for pods and namespaces besides the watches",
        window.as_secs(),
        (after.cpu_ms - before.cpu_ms) / passes,
        (after.cpu_ms - before.cpu_ms) / passes / 5000.0 * 100.0,
        (after.pass_seconds - before.pass_seconds) / passes * 1000.0,
        (after.api_reads - before.api_reads) / passes,
    );

    if synthetic == "rotate" {
        synthetic_report(&n);
    }

    // The restart, nothing changed.
    let writes = status_writes(&n);
    drop(agent);
    let t = Instant::now();
    let agent = n.agent_as(&launch);
    agent.line_with(&[&format!("got {pods} pod(s) and the end of the snapshot")]);
    let snapshot = t.elapsed();
    let passes = metric(&n, "redirect_cni_ambient_reconcile_passes_total", &[]);
    cni_testkit::eventually(
        "two passes after the snapshot",
        Duration::from_secs(30),
        || {
            (metric(&n, "redirect_cni_ambient_reconcile_passes_total", &[]) >= passes + 2.0)
                .then_some(())
        },
    );
    println!(
        "agent restart with {pods} unchanged pods: snapshot acked after {} ms; {} pod status \
         write(s) (PATCH pods/status) from its stop to two passes later",
        snapshot.as_millis(),
        status_writes(&n) - writes
    );
    drop(netns);
}

/// The synthetic checks over the window: how many, how many failed, and the last one's time
/// per pod (the node view's `took_ms`), as a median and the largest.
fn synthetic_report(n: &Node) {
    let ok = metric(n, "redirect_cni_synthetic_checks_total", &["result=\"ok\""]);
    let failed = metric(
        n,
        "redirect_cni_synthetic_checks_total",
        &["result=\"failed\""],
    );
    let socket = n.plugin_socket().with_file_name("debug.sock");
    let body = cni_testkit::unix_get(&socket, "/debug/node")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let view: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut took: Vec<f64> = view["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["synthetic_check"]["took_ms"].as_f64())
        .collect();
    took.sort_by(f64::total_cmp);
    // A failure's last word, if it is still a pod's last check.
    for p in view["pods"].as_array().into_iter().flatten() {
        if p["synthetic_check"]["ok"] == false {
            println!(
                "synthetic check of {}: {}",
                p["name"], p["synthetic_check"]["detail"]
            );
        }
    }
    println!(
        "synthetic checks: {ok} ok, {failed} failed; one check took {:.3} ms (median of the \
         last check of {} pods), {:.3} ms at most",
        took.get(took.len() / 2).copied().unwrap_or(f64::NAN),
        took.len(),
        took.last().copied().unwrap_or(f64::NAN),
    );
}

/// What is read at each end of the window.
struct Sample {
    cpu_ms: f64,
    passes: f64,
    pass_seconds: f64,
    api_reads: f64,
}

impl Sample {
    fn take(n: &Node, pid: u32) -> Sample {
        Sample {
            cpu_ms: cni_testkit::process_cpu_seconds(pid) * 1000.0,
            passes: metric(n, "redirect_cni_ambient_reconcile_passes_total", &[]),
            pass_seconds: metric(n, "redirect_cni_ambient_reconcile_pass_seconds_sum", &[]),
            // JSON: the agent's client (kube-apiserver's own loops, which GET namespaces and
            // services every few seconds, speak protobuf).
            api_reads: api_requests(n, |series| {
                (series.contains("resource=\"pods\"") || series.contains("resource=\"namespaces\""))
                    && series.contains("contentType=\"application/json\"")
                    && !series.contains("verb=\"WATCH\"")
            }),
        }
    }
}

fn metric(n: &Node, name: &str, labels: &[&str]) -> f64 {
    let body = cni_testkit::http_get(&n.host, PORT, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    cni_testkit::metric(&body, name, labels)
}

/// The API server's `apiserver_request_total` summed over the series `keep` takes.
fn api_requests(n: &Node, keep: impl Fn(&str) -> bool) -> f64 {
    let text = n.cp.kubectl_ok(&["get", "--raw", "/metrics"]);
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| keep(series))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// The pods of `shop` the API shows with `ambient.istio.io/redirection: enabled`.
fn annotated_enabled(n: &Node) -> usize {
    let list = n.cp.get(&["pods", "-n", "shop"]);
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|p| {
                    p["metadata"]["annotations"]["ambient.istio.io/redirection"] == "enabled"
                })
                .count()
        })
        .unwrap_or(0)
}

fn status_writes(n: &Node) -> f64 {
    api_requests(n, |s| {
        s.contains("resource=\"pods\"")
            && s.contains("subresource=\"status\"")
            && s.contains("verb=\"PATCH\"")
    })
}
