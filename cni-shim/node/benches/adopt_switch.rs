//! What taking a node over from Istio costs (`ADOPT_ISTIO=replace`), and what a pod's traffic
//! sees meanwhile: `PODS` pods in fresh network namespaces, each holding Istio's CNI rules for a
//! pod of plugin defaults (its `cni/basic` golden, loaded with `iptables-nft-restore` as
//! Istio's plugin loads it), adopted one after the other as the agent's worker does
//! (`cni_node::adopt::adopt_with`: the plugin's decision from the pod object, Istio's rules
//! read, ours applied, Istio's removed, ours read back). Meanwhile an app (UID 1000) in each of
//! the first `LOOPED` pods connects out 20 times a second; Istio's rules and ours both send it
//! to the pod's port 15001, where a listener counts what arrives: a connection that fails or
//! lands elsewhere is lost.
//!
//! Then the way back: every pod handed back to Istio (`cni_node::hand_back::hand_back_with`:
//! the same decision, Istio's rules written in place of ours in one batch, read back), the first
//! half in Istio's iptables form as iptables-nft keeps it, the second in its native nftables
//! tables, the loop still running. Last, `PODS` ambient pods holding our in-pod rules (as our
//! agent enrolled them), each handed back to the in-pod rules Istio's agent writes (half in
//! its iptables form, half in its nftables tables).
//!
//! `cargo bench -p cni-node --bench adopt_switch` (root; 110 pods, a full node). `cargo test`
//! runs it with 3 pods. Prints the per-pod times (median, 90th percentile, max), each whole
//! switch, and the loop's connections made and lost through both. Istio's golden is read from
//! `../shared/testdata/istio`; without it, it fails naming the folder.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_node::adopt::{adopt_with, AdoptIstio, Adopted};
use cni_node::hand_back::{hand_back_with, Bases, HandedBackPod};
use cni_node::repair::in_place::Reach;
use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{AmbientConfig, Capture, IstioForm, Namespace, Netns};
use redirect_testkit::istio::{iptables_restore_with, istio_testdata_dir};
use redirect_testkit::{kernel_available, TestNetns};

/// Pods whose app connects in a loop during the switch.
const LOOPED: usize = 3;
/// Where the app connects: outside the pod, captured to 15001 either way.
const OUTSIDE: &str = "10.99.0.1:80";

fn main() {
    if !kernel_available("the adopt_switch benchmark") {
        return;
    }
    let quick = !std::env::args().any(|a| a == "--bench");
    let pods: usize = if quick { 3 } else { 110 };
    let golden = istio_testdata_dir().join("cni").join("basic.restore");
    let namespaces: Vec<TestNetns> = (0..pods)
        .map(|i| {
            let ns = TestNetns::with_prefix("rdadopt");
            ns.sh(&format!(
                "ip link set lo up && ip link add eth0 type veth peer name eth1 && \
                 ip addr add 10.58.{}.{}/32 dev eth0 && ip link set eth0 up && \
                 ip route add default dev eth0",
                i / 200,
                i % 200 + 2
            ));
            iptables_restore_with(&ns, false, &golden, Some("nft"));
            ns
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<Loop> = namespaces
        .iter()
        .take(LOOPED)
        .map(|ns| Loop::start(ns, stop.clone()))
        .collect();
    // The loops run on Istio's rules first.
    std::thread::sleep(Duration::from_millis(500));

    let defaults = MeshDefaults::default();
    // The first half with the node's iptables binaries on PATH (the library reads and removes
    // iptables-nft's rules with them), the second without, as in the agent's image (over
    // netlink).
    let saved_path = std::env::var_os("PATH").unwrap_or_default();
    let empty = std::env::temp_dir().join(format!("adopt-switch-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let mut each = Vec::new();
    let mut with_binaries = Vec::new();
    let switch = Instant::now();
    for (i, ns) in namespaces.iter().enumerate() {
        if i == pods / 2 {
            with_binaries = std::mem::take(&mut each);
            std::env::set_var("PATH", &empty);
        }
        let pod = pod_object(i, &format!("10.58.{}.{}", i / 200, i % 200 + 2));
        let (adopted, took) = timed(ns, |reach| {
            adopt_with(&pod, &defaults, reach, AdoptIstio::Replace)
        });
        each.push(took);
        match adopted {
            Ok(Adopted::Replaced { .. }) => {}
            other => panic!("pod {i}: {other:?}"),
        }
    }
    let whole = switch.elapsed();
    std::env::set_var("PATH", saved_path);
    let _ = std::fs::remove_dir(&empty);
    // The loops run on ours for a while.
    std::thread::sleep(Duration::from_millis(500));
    let (mut back_xt, mut back, back_whole) = hand_back_all(&namespaces, &defaults);
    // And on Istio's tables for a while.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (mut made, mut lost) = (0, 0);
    for l in loops {
        let (m, x) = l.finish();
        made += m;
        lost += x;
    }
    let (mut ambient_xt, mut ambient, ambient_whole) = ambient_hand_back(pods);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (what, times) in [
        ("over netlink (no binary, as the agent)", &mut each),
        ("with the node's iptables-nft binaries", &mut with_binaries),
        (
            "handed back in Istio's iptables form (iptables-nft)",
            &mut back_xt,
        ),
        ("handed back in Istio's nftables tables", &mut back),
        (
            "of an ambient pod handed back in Istio's in-pod rules (iptables-nft)",
            &mut ambient_xt,
        ),
        (
            "of an ambient pod handed back in Istio's in-pod tables (nftables)",
            &mut ambient,
        ),
    ] {
        if times.is_empty() {
            continue;
        }
        times.sort();
        println!(
            "adopt_switch: per pod {what}, {} pods: median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
            times.len(),
            ms(times[times.len() / 2]),
            ms(times[times.len() * 9 / 10]),
            ms(*times.last().unwrap()),
        );
    }
    println!(
        "adopt_switch: {pods} pods held Istio's iptables-nft rules (cni/basic); the whole switch, \
         one pod after the other: {:.0} ms",
        ms(whole)
    );
    println!(
        "adopt_switch: the hand-back of the {pods} pods, one after the other: {:.0} ms",
        ms(back_whole)
    );
    println!(
        "adopt_switch: the hand-back of {pods} ambient pods, one after the other: {:.0} ms",
        ms(ambient_whole)
    );
    println!(
        "adopt_switch: the loop of {LOOPED} pods at 20/s through both switches: {made} \
         connections, {lost} lost"
    );
    assert!(made > 0, "the loop made no connection");
    assert_eq!(lost, 0, "connections lost during the switch");
}

/// Every pod handed back, one after the other, the first half in iptables-nft's form and the
/// second in nftables': each one's time (per form), and the whole.
fn hand_back_all(
    namespaces: &[TestNetns],
    defaults: &MeshDefaults,
) -> (Vec<Duration>, Vec<Duration>, Duration) {
    let (mut xt, mut times) = (Vec::new(), Vec::new());
    let whole = Instant::now();
    for (i, ns) in namespaces.iter().enumerate() {
        if i == namespaces.len() / 2 {
            xt = std::mem::take(&mut times);
        }
        let form = match i < namespaces.len() / 2 {
            true => IstioForm::IptablesNft,
            false => IstioForm::Nftables,
        };
        let pod = pod_object(i, &format!("10.58.{}.{}", i / 200, i % 200 + 2));
        let ambient = AmbientConfig::default();
        let bases = Bases {
            mesh: defaults,
            ambient: &ambient,
        };
        let (done, took) = timed(ns, |reach| hand_back_with(&pod, bases, reach, form));
        times.push(took);
        match done {
            Ok(HandedBackPod::Done { .. }) => {}
            other => panic!("pod {i}: {other:?}"),
        }
    }
    (xt, times, whole.elapsed())
}

/// `n` ambient pods holding our in-pod rules, each handed back (Istio's agent's in-pod rules,
/// the first half in its iptables form, the second in its nftables tables): each one's time
/// (per form), and the whole.
fn ambient_hand_back(n: usize) -> (Vec<Duration>, Vec<Duration>, Duration) {
    let base = AmbientConfig::default();
    let namespaces: Vec<TestNetns> = (0..n)
        .map(|_| {
            let ns = TestNetns::with_prefix("rdamb");
            let pod = Namespace::open(ns.path()).expect("the pod's namespace");
            pod.apply(&Capture::Ambient(base.clone()))
                .expect("our in-pod rules");
            ns
        })
        .collect();
    let defaults = MeshDefaults::default();
    let bases = Bases {
        mesh: &defaults,
        ambient: &base,
    };
    let (mut xt, mut times) = (Vec::new(), Vec::new());
    let whole = Instant::now();
    for (i, ns) in namespaces.iter().enumerate() {
        if i == n / 2 {
            xt = std::mem::take(&mut times);
        }
        let form = match i < n / 2 {
            true => IstioForm::IptablesNft,
            false => IstioForm::Nftables,
        };
        let mut pod = pod_object(i, &format!("10.59.{}.{}", i / 200, i % 200 + 2));
        pod.metadata.annotations = Some(
            [(
                "ambient.istio.io/redirection".to_string(),
                "enabled".to_string(),
            )]
            .into(),
        );
        let (done, took) = timed(ns, |reach| hand_back_with(&pod, bases, reach, form));
        times.push(took);
        match done {
            Ok(HandedBackPod::Done { .. }) => {}
            other => panic!("ambient pod {i}: {other:?}"),
        }
    }
    (xt, times, whole.elapsed())
}

/// `f` given the reach of the pod in `ns` (its namespace found by path, as the agent's search
/// finds it by the pod's UID), and how long it took.
fn timed<T>(ns: &TestNetns, f: impl FnOnce(&Reach) -> T) -> (T, Duration) {
    let path = ns.path().to_owned();
    let find = move |_: &str, _: IpAddr| -> Result<Netns, cni_node::pods::search::FindError> {
        Ok(Netns::open(&path).expect("the pod's namespace"))
    };
    let reach = Reach {
        find: &find,
        open: &Namespace::open_in,
    };
    let t = Instant::now();
    let out = f(&reach);
    (out, t.elapsed())
}

/// A sidecar pod as the API would show it: Istio's injection annotation, running.
fn pod_object(i: usize, ip: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("web-{i}"), "namespace": "shop",
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "annotations": {"sidecar.istio.io/status": "{\"initContainers\":[\"istio-validation\"],\"containers\":[\"istio-proxy\"]}"}
        },
        "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}],
                 "initContainers": [{"name": "istio-validation"}]},
        "status": {"phase": "Running", "podIP": ip}
    }))
    .unwrap()
}

/// An app connecting out 20 times a second, and the proxy's listener on 15001 counting.
struct Loop {
    client: std::thread::JoinHandle<(u64, u64)>,
    accepted: Arc<AtomicU64>,
    server: std::thread::JoinHandle<()>,
}

impl Loop {
    fn start(ns: &TestNetns, stop: Arc<AtomicBool>) -> Loop {
        let listener = ns.run(|| TcpListener::bind("0.0.0.0:15001")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let (a, s) = (accepted.clone(), stop.clone());
        let server = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok(_) => {
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            // What is still queued was captured too.
            while listener.accept().is_ok() {
                a.fetch_add(1, Ordering::Relaxed);
            }
        });
        let path = ns.path().to_owned();
        let client = std::thread::spawn(move || {
            redirect_testkit::run_in(&path, move || {
                redirect_testkit::netns::become_ids(1000, 1000).unwrap();
                let to: SocketAddr = OUTSIDE.parse().unwrap();
                let (mut made, mut failed) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                        Ok(_) => made += 1,
                        Err(_) => failed += 1,
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                (made, failed)
            })
        });
        Loop {
            client,
            accepted,
            server,
        }
    }

    /// Connections made, and lost (failed, or not arrived at the listener).
    fn finish(self) -> (u64, u64) {
        let (made, failed) = self.client.join().unwrap();
        self.server.join().unwrap();
        let arrived = self.accepted.load(Ordering::Relaxed);
        (made + failed, failed + made.saturating_sub(arrived))
    }
}
