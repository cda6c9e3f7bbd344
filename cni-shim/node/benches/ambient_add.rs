//! What ambient mode costs, whole processes against a real API server (`cni_testkit::ambient`):
//!
//! - ADD of an ambient pod (the plugin asks the agent, which programs the probe SNAT and the
//!   in-pod rules and waits for ztunnel's ack: `testpod ztunnel`, the real node's stand-in)
//!   beside ADD of a sidecar pod (the plugin programs the namespace itself), each a fresh
//!   process as the runtime runs it, `PODS` pods each;
//! - the agent's restart with `PODS` enrolled pods: from its start to ztunnel's snapshot acked
//!   (every pod's namespace found again, its rules read back, the pod sent with its namespace);
//! - ztunnel's restart: from its start to its snapshot acked.
//!
//! `cargo bench -p cni-node --bench ambient_add` (root; `cargo test` runs it with 3 pods).
//! Prints medians and the 90th percentiles in ms.

use std::time::{Duration, Instant};

use cni_testkit::ambient::{create_pod, pod_netns, running, Node, ZtunnelProcess};
use cni_testkit::host_proc::cgroupfs;
use cni_testkit::{cni_env, plugin_in};
use redirect_testkit::{kernel_available, TestNetns};
use serde_json::{json, Value};

fn main() {
    if !kernel_available("the ambient_add benchmark") {
        return;
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let pods: usize = if quick { 3 } else { 20 };
    let n = Node::new();
    n.ambient_namespace("shop");
    let agent = n.agent();
    let mut ztunnel = ZtunnelProcess::start(&n.socket);
    agent.line_with(&["ZDS connection 1:", "end of the snapshot"]);

    let mut ambient = Vec::new();
    let mut netns = Vec::new();
    for i in 0..pods {
        let name = format!("web-{i}");
        let uid = create_pod(&n.cp, "shop", &name);
        let ip = format!("10.77.1.{}", i + 2);
        let ns = pod_netns(&n.host, &ip, &format!("vb{i}"));
        n.proc.add(5000 + i as u32, &cgroupfs(&uid), 100, ns.path());
        let conf = with_result(&installed_conf(&n), &ip);
        let t = Instant::now();
        let out = add(&n.host, &ns, &name, &uid, &conf);
        ambient.push(t.elapsed());
        assert_eq!(out.code, 0, "ADD {name}: {}{}", out.stdout, out.stderr);
        running(&n.cp, "shop", &name, &ip);
        netns.push(ns);
    }
    let mut sidecar = Vec::new();
    for i in 0..pods {
        let ns = pod_netns(&n.host, &format!("10.77.2.{}", i + 2), &format!("vs{i}"));
        let conf = with_result(&cni_testkit::mesh_conf(), &format!("10.77.2.{}", i + 2));
        let t = Instant::now();
        let out = add(&n.host, &ns, "side", "u-side", &conf);
        sidecar.push(t.elapsed());
        assert_eq!(out.code, 0, "sidecar ADD: {}{}", out.stdout, out.stderr);
    }
    report(&format!("ADD, ambient pod ({pods} pods)"), &mut ambient);
    report(&format!("ADD, sidecar pod ({pods} pods)"), &mut sidecar);

    // The agent restarts with every pod enrolled.
    drop(agent);
    let t = Instant::now();
    let agent = n.agent();
    let started = t.elapsed();
    agent.line_with(&[&format!("got {pods} pod(s) and the end of the snapshot")]);
    println!(
        "agent restart, {pods} pods: {} ms to let ztunnel in, {} ms to ztunnel's snapshot acked",
        started.as_millis(),
        t.elapsed().as_millis()
    );

    // ztunnel restarts.
    ztunnel.stop();
    let t = Instant::now();
    let _ztunnel = ZtunnelProcess::start(&n.socket);
    agent.line_with(&["ZDS connection 2:", &format!("got {pods} pod(s)")]);
    println!(
        "ztunnel restart, {pods} pods: {} ms to its snapshot acked",
        t.elapsed().as_millis()
    );
    drop(netns);
}

/// The config the agent installed, with the pod's annotations as the runtime passes them
/// (none: not a sidecar pod), so that the plugin does not read the pod from the API.
fn installed_conf(n: &Node) -> String {
    let text = std::fs::read_to_string(n.node.path().join("net/redirect-cni.conf")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["runtimeConfig"] = json!({"io.kubernetes.cri.pod-annotations": {}});
    v.to_string()
}

/// `conf` with the previous plugin's result holding `ip` (as a chain's first plugin gives it).
fn with_result(conf: &str, ip: &str) -> String {
    let mut v: Value = serde_json::from_str(conf).unwrap();
    v["prevResult"] = json!({"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0"}], "ips": [{"address": format!("{ip}/32"), "interface": 0}]});
    v.to_string()
}

fn add(node: &TestNetns, ns: &TestNetns, name: &str, uid: &str, conf: &str) -> cni_testkit::Out {
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};K8S_POD_UID={uid}");
    plugin_in(
        node,
        &cni_env("ADD", ns.path().to_str().unwrap(), &args),
        conf,
    )
}

fn report(what: &str, times: &mut [Duration]) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p90 = times[(times.len() * 9 / 10).min(times.len() - 1)];
    println!(
        "{what}: median {:.2} ms, p90 {:.2} ms, min {:.2} ms",
        ms(times[times.len() / 2]),
        ms(p90),
        ms(times[0])
    );
}
