//! `CAPTURE_COUNTERS`: the capture counters read per pod and exported on the metrics port.
//!
//! - The sidecar pods' reader (`counters::sidecar`) in a real namespace: it finds the pod's
//!   capture as ADD applied it, and known numbers of connections on each path read back as
//!   those numbers; a pod set up without counters is not reported.
//! - The agent as the DaemonSet runs it, with an ambient pod and ztunnel's stand-in: its
//!   connections on each path show on `/metrics` per pod (`pod`) or summed (`node`, no pod
//!   named).

use cni_testkit as common;

mod support;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use cni_node::counters::SidecarReader;
use cni_node::pods::capture::Reach;
use cni_node::pods::search::FindError;
use common::ambient::{Launch, Node};
use redirect_core::mesh::{self, Decision, MeshDefaults};
use redirect_core::{Capture, CountedPath, Namespace, Netns, PathCounts};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};
use serde_json::json;
use support::ztunnel::TestZtunnel;

const STATUS: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}"#;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Istio's sidecar pod `shop/web-1`, running on the topology's pod address.
fn sidecar_pod() -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1",
                     "resourceVersion": "7",
                     "annotations": {"sidecar.istio.io/status": STATUS}},
        "spec": {"containers": [
            {"name": "app", "image": "app"},
            {"name": "istio-proxy", "image": "proxyv2",
             "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
        ]},
        "status": {"phase": "Running", "podIP": "10.77.0.2", "podIPs": [{"ip": "10.77.0.2"}]},
    }))
    .unwrap()
}

/// What the plugin's ADD does for the pod with `defaults`: its capture in the namespace.
fn plugin_add(topo: &Topology, defaults: &MeshDefaults) {
    let info = cni_protocol::pod::pod_info(sidecar_pod(), String::new(), String::new());
    let Ok(Decision::Capture {
        config, dual_stack, ..
    }) = mesh::decide(&info, defaults)
    else {
        panic!("the plugin captures the pod");
    };
    let ns = Namespace::open(topo.pod.path()).unwrap();
    let ips: [IpAddr; 1] = ["10.77.0.2".parse().unwrap()];
    let cfg = ns.for_pod(*config, dual_stack, Some(&ips)).unwrap();
    ns.apply(&Capture::Sidecar(cfg)).unwrap();
}

fn read(reader: &mut SidecarReader, topo: &Topology) -> (Vec<PathCounts>, Vec<String>) {
    let path = topo.pod.path().to_owned();
    let find =
        move |_: &str, _: IpAddr| -> Result<Netns, FindError> { Ok(Netns::open(&path).unwrap()) };
    let reach = Reach {
        find: &find,
        open: &Namespace::open_in,
    };
    let (counts, problems) = reader.read(&[sidecar_pod()], &reach);
    (counts.into_iter().map(|(_, c)| c).collect(), problems)
}

fn packets(c: &PathCounts) -> [u64; 4] {
    CountedPath::ALL.map(|p| c.get(p).packets)
}

fn times(topo: &Topology, n: usize, probe: Probe, want: Outcome) {
    for _ in 0..n {
        assert_eq!(run_probe(topo, &probe), want, "{probe}");
    }
}

#[kernel_test]
fn the_sidecar_reader_reads_each_paths_connections_as_their_number() {
    let topo = Topology::basic();
    let defaults = MeshDefaults {
        counters: true,
        ..MeshDefaults::default()
    };
    plugin_add(&topo, &defaults);
    let mut reader = SidecarReader::new(defaults);
    let (counts, problems) = read(&mut reader, &topo);
    assert_eq!(problems, Vec::<String>::new());
    assert_eq!(counts.iter().map(packets).collect::<Vec<_>>(), [[0; 4]]);

    let app = From::Pod {
        uid: 1000,
        gid: 1000,
    };
    let proxy = From::Pod {
        uid: 1337,
        gid: 1337,
    };
    let inbound = Outcome::landed(Side::Pod, 15006, Some(sa("10.77.0.2:8080")));
    times(
        &topo,
        2,
        Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
        inbound,
    );
    let outbound = Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80")));
    times(
        &topo,
        3,
        Probe::tcp(app.clone(), sa("10.77.0.1:80")),
        outbound,
    );
    let passed = Outcome::landed(Side::Peer, 80, None);
    times(&topo, 1, Probe::tcp(proxy, sa("10.77.0.1:80")), passed);
    // istio-cni's default outbound exclusion: 15020.
    let excluded = Outcome::landed(Side::Peer, 15020, None);
    times(&topo, 4, Probe::tcp(app, sa("10.77.0.1:15020")), excluded);

    let (counts, _) = read(&mut reader, &topo);
    assert_eq!(
        counts.iter().map(packets).collect::<Vec<_>>(),
        [[2, 3, 1, 4]]
    );
    assert_eq!(reader.held(), 1);
    // The pod no longer listed: let go.
    let find = |_: &str, _: IpAddr| -> Result<Netns, FindError> { unreachable!() };
    let reach = Reach {
        find: &find,
        open: &Namespace::open_in,
    };
    assert_eq!(reader.read(&[], &reach).0.len(), 0);
    assert_eq!(reader.held(), 0);
}

#[kernel_test]
fn a_sidecar_pod_set_up_without_counters_is_not_reported() {
    let topo = Topology::basic();
    plugin_add(&topo, &MeshDefaults::default());
    let mut reader = SidecarReader::new(MeshDefaults {
        counters: true,
        ..MeshDefaults::default()
    });
    let (counts, problems) = read(&mut reader, &topo);
    assert_eq!((counts.len(), problems.len()), (0, 0), "{problems:?}");
}

const PORT: u16 = 15014;

fn metrics(n: &Node) -> String {
    common::http_get(&n.host, PORT, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default()
}

/// A connection from ztunnel's side of the pod (mark 0x539), as ztunnel's own are.
fn ztunnel_connect(p: &support::TestPod, to: SocketAddr) {
    p.netns.run(move || {
        use nix::sys::socket::{connect, setsockopt, socket, sockopt, SockFlag, SockaddrStorage};
        use nix::sys::socket::{AddressFamily, SockType};
        let s = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        );
        let s = s.unwrap();
        setsockopt(&s, sockopt::Mark, &0x539).unwrap();
        let _ = connect(s.as_raw_fd(), &SockaddrStorage::from(to));
    });
}

fn ambient_counts(mode: &str) -> (String, String) {
    let n = Node::new();
    n.ambient_namespace("shop");
    let env = [
        ("AMBIENT_RECONCILE_INTERVAL", "1s"),
        ("CAPTURE_COUNTERS", mode),
        ("CAPTURE_COUNTERS_INTERVAL", "1s"),
    ];
    let launch = Launch {
        args: &["--monitoring-port=15014"],
        env: &env,
        ..Launch::default()
    };
    let agent = n.agent_as(&launch);
    let z = TestZtunnel::start(&n.socket);
    common::eventually("ztunnel connected", Duration::from_secs(30), || {
        (z.snapshots() >= 1).then_some(())
    });
    let web = support::pod(&n, "web", "10.77.0.2", 4100, true);
    let out = web.add(&n);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    // Outbound from the app (to 15001), inbound from the node (to 15006), ztunnel's own.
    for _ in 0..3 {
        let _ = support::connect_as(&web.netns, 1000, "10.77.0.1");
    }
    for _ in 0..2 {
        let _ = support::connect_as(&n.host, 4000, "10.77.0.2");
    }
    ztunnel_connect(&web, sa("10.77.0.1:8080"));
    let want = if mode == "pod" {
        "capture=\"ambient\",path=\"bypassed\"} 1"
    } else {
        "redirect_cni_capture_packets_total{path=\"bypassed\"} 1"
    };
    let text = common::eventually("the counts on /metrics", Duration::from_secs(30), || {
        let t = metrics(&n);
        t.contains(want).then_some(t)
    });
    (text, agent.log())
}

#[kernel_test]
fn an_ambient_pods_connections_show_per_pod_on_the_metrics_port() {
    let (text, log) = ambient_counts("pod");
    let pod = "redirect_cni_capture_packets_total{namespace=\"shop\",pod=\"web\"";
    let line = |path: &str| {
        text.lines()
            .find(|l| l.starts_with(pod) && l.contains(&format!("path=\"{path}\"")))
            .map(|l| l.rsplit(' ').next().unwrap_or("").to_string())
    };
    let got = [
        "inbound_captured",
        "outbound_captured",
        "bypassed",
        "excluded",
    ]
    .map(line);
    let want = ["2", "3", "1", "0"].map(|s| Some(s.to_string()));
    assert_eq!(got, want, "{text}\n{log}");
}

#[kernel_test]
fn summed_over_the_node_the_metrics_port_names_no_pod() {
    let (text, _) = ambient_counts("node");
    for (path, n) in [("inbound_captured", 2), ("outbound_captured", 3)] {
        let line = format!("redirect_cni_capture_packets_total{{path=\"{path}\"}} {n}");
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    assert!(!text.contains("web"), "a pod named:\n{text}");
}

/// A sidecar pod set up by the plugin's ADD with the installer's `counters`: the agent's reader
/// finds its namespace (by its cgroup under the host's `/proc`, as repair does) and its
/// connections show on `/metrics`, summed over the node.
#[kernel_test]
fn a_sidecar_pods_connections_show_on_the_metrics_port() {
    let n = Node::new();
    let env = [
        ("CAPTURE_COUNTERS", "node"),
        ("CAPTURE_COUNTERS_INTERVAL", "1s"),
    ];
    let launch = Launch {
        args: &["--monitoring-port=15014"],
        env: &env,
        ..Launch::default()
    };
    let agent = n.agent_as(&launch);
    n.cp.namespace("shop");
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop",
                     "annotations": {"sidecar.istio.io/status": STATUS}},
        "spec": {"nodeName": common::ambient::NODE, "containers": [
            {"name": "app", "image": "app"},
            {"name": "istio-proxy", "image": "proxyv2",
             "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}]}});
    let out =
        n.cp.kubectl_in(&["create", "-o", "json", "-f", "-"], Some(&pod.to_string()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_owned();
    let netns = common::ambient::pod_netns(&n.host, "10.77.0.2", "vweb");
    let cgroup = cni_testkit::host_proc::cgroupfs(&uid);
    n.proc.add(4100, &cgroup, 100, netns.path());
    common::ambient::running(&n.cp, "shop", "web", "10.77.0.2");
    let out = n.cni("ADD", &netns, "shop", "web", &uid, &["10.77.0.2"]);
    assert_eq!(out.code, 0, "ADD: {}{}", out.stdout, out.stderr);
    // The app's connections go to 15001 (no proxy listens: counted all the same), the proxy's
    // pass.
    for _ in 0..3 {
        let _ = support::connect_as(&netns, 1000, "10.77.0.1");
    }
    let _ = support::connect_as(&netns, 1337, "10.77.0.1");
    let want = [
        "redirect_cni_capture_packets_total{path=\"outbound_captured\"} 3",
        "redirect_cni_capture_packets_total{path=\"bypassed\"} 1",
    ];
    common::eventually_or(
        "the sidecar pod's counts on /metrics",
        Duration::from_secs(30),
        || format!("{}\n{}", metrics(&n), agent.log()),
        || {
            let t = metrics(&n);
            want.iter().all(|w| t.contains(w)).then_some(())
        },
    );
}
