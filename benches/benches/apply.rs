//! Apply into a fresh network namespace (kernel; root). Each iteration gets a new namespace
//! (made before the clock starts) and a thread inside it; only the apply is timed.
//!
//! - `rules`: `nft::apply` of a planned ruleset: socket, one batch, the ACKs.
//! - `capture`: `redirect_core::Namespace::apply`: validate, plan, rules and routes (TPROXY
//!   policy routing, `::6` on lo), what the CNI plugin and redirect-init run once inside the
//!   pod's namespace.
//! - `replace`: `nft::apply` of the same ruleset again (a repeated ADD, `--force-apply`): the
//!   table is read back, found equal, and nothing is sent.
//! - `update`: `nft::apply` over the table of Istio's sidecar default (another config before):
//!   one batch that updates the table in place.
//! - `read_back`: the dump of our table into its typed form (CNI CHECK, `inspect`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use redirect_benches::configs;
use redirect_testkit::plan;
use redirect_testkit::{kernel_available, TestNetns};

/// Sum of `iters` timings of `f`, each in a fresh namespace where `setup` ran first.
fn in_fresh_namespaces(
    iters: u64,
    setup: impl Fn() + Sync,
    f: impl Fn() -> Duration + Sync,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let ns = TestNetns::with_prefix("rdbench");
        total += ns.run(|| {
            setup();
            f()
        });
    }
    total
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn apply(c: &mut Criterion) {
    if !kernel_available("the apply benchmark") {
        return;
    }
    for (name, cfg) in configs() {
        let rs = plan(&cfg).expect("plan");
        let mut g = c.benchmark_group(name);
        g.sample_size(20);
        g.bench_function("rules", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {},
                    || {
                        timed(|| {
                            redirect_kernel::nft::Nft::open()
                                .and_then(|n| n.apply(&rs))
                                .map(drop)
                                .expect("apply")
                        })
                    },
                )
            })
        });
        g.bench_function("capture", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {},
                    || {
                        timed(|| {
                            let config = cfg.clone().validated().expect("valid");
                            drop(
                                redirect_core::Namespace::current()
                                    .and_then(|ns| {
                                        ns.apply(&redirect_core::Capture::Sidecar(config.clone()))
                                    })
                                    .expect("capture"),
                            )
                        })
                    },
                )
            })
        });
        g.bench_function("replace", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {
                        redirect_kernel::nft::Nft::open()
                            .and_then(|n| n.apply(&rs))
                            .map(drop)
                            .expect("first apply")
                    },
                    || {
                        timed(|| {
                            redirect_kernel::nft::Nft::open()
                                .and_then(|n| n.apply(&rs))
                                .map(drop)
                                .expect("replace")
                        })
                    },
                )
            })
        });
        let before = plan(&configs()[0].1).expect("plan");
        g.bench_function("update", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {
                        redirect_kernel::nft::Nft::open()
                            .and_then(|n| n.apply(&before))
                            .map(drop)
                            .expect("first apply")
                    },
                    || {
                        timed(|| {
                            redirect_kernel::nft::Nft::open()
                                .and_then(|n| n.apply(&rs))
                                .map(drop)
                                .expect("update")
                        })
                    },
                )
            })
        });
        g.bench_function("read_back", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {
                        redirect_kernel::nft::Nft::open()
                            .and_then(|n| n.apply(&rs))
                            .map(drop)
                            .expect("apply")
                    },
                    || {
                        timed(|| {
                            drop(
                                redirect_kernel::nft::Nft::open()
                                    .and_then(|n| n.read())
                                    .expect("read back"),
                            )
                        })
                    },
                )
            })
        });
        g.finish();
    }
}

criterion_group!(benches, apply);
criterion_main!(benches);
