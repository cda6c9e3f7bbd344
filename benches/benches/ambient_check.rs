//! What the node agent's pass costs per enrolled pod (kernel; root): one namespace with
//! ambient's in-pod rules (Istio's defaults), read back from the agent's own namespace as the
//! pass does it.
//!
//! - `open+check`: a `Namespace` opened on the held descriptor (a thread enters the namespace
//!   and opens the netlink sockets there), then `check` of a `Capture::Ambient` (the table's dump, the reply
//!   routing of both families);
//! - `check`: `check` on a `Namespace` kept open;
//! - `check since, unchanged`: `check_since` on a kept `Namespace` with the
//!   generation its last read returned (what the agent's pass does per pod): the table's dump
//!   skipped, the reply routing read;
//! - `generation`: only the ruleset's generation, on a kept socket.

use criterion::{criterion_group, criterion_main, Criterion};
use redirect_core::{AmbientConfig, Capture, Namespace, Netns};
use redirect_testkit::{kernel_available, TestNetns};

fn ambient_check(c: &mut Criterion) {
    if !kernel_available("the ambient_check benchmark") {
        return;
    }
    let pod = TestNetns::with_prefix("rdbenchamb");
    pod.sh("ip link set lo up");
    let cfg = AmbientConfig::default();
    let capture = Capture::Ambient(cfg.clone());
    Namespace::open(pod.path())
        .and_then(|ns| ns.apply(&cfg.clone().into()))
        .expect("apply");
    let held = Netns::open(pod.path()).expect("open");
    let mut g = c.benchmark_group("ambient pass, per pod");
    g.bench_function("open+check", |b| {
        b.iter(|| {
            let fd = held.try_clone_fd().expect("dup");
            let netns = Netns::from_file(std::fs::File::from(fd), held.path()).expect("netns");
            let ns = Namespace::from_netns(netns).expect("namespace");
            assert!(ns.check(&capture).expect("check").is_empty());
        })
    });
    let kept = Namespace::open(pod.path()).expect("namespace");
    g.bench_function("check", |b| {
        b.iter(|| assert!(kept.check(&capture).expect("check").is_empty()))
    });
    let (_, seen) = kept.check_since(&capture, None).expect("check");
    assert!(seen.is_some());
    g.bench_function("check since, unchanged", |b| {
        b.iter(|| {
            let (d, again) = kept.check_since(&capture, seen).expect("check");
            assert!(d.is_empty() && again == seen);
        })
    });
    let nft = pod.run(redirect_kernel::nft::Nft::open).expect("socket");
    g.bench_function("generation", |b| {
        b.iter(|| nft.generation().expect("generation"))
    });
    g.finish();
}

criterion_group!(benches, ambient_check);
criterion_main!(benches);
