//! Apply into a fresh network namespace (kernel; root). Each iteration gets a new namespace
//! (made before the clock starts) and a thread inside it; only the apply is timed.
//!
//! - `rules`: `nft::apply` of a planned ruleset: socket, one batch, the ACKs.
//! - `capture`: `capture::apply`: plan, rules and routes (TPROXY policy routing, `::6` on lo),
//!   what the CNI plugin and redirect-init run once inside the pod's namespace.
//! - `replace`: `nft::apply` over our existing table (an atomic replace in one batch).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use redirect_benches::configs;
use redirect_core::plan::SystemGroups;
use redirect_core::testkit::{kernel_tests_enabled, TestNetns};
use redirect_core::{capture, nft, plan};

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
    if !kernel_tests_enabled() {
        return;
    }
    for (name, cfg) in configs() {
        let rs = plan(&cfg).expect("plan");
        let mut g = c.benchmark_group(name);
        g.sample_size(20);
        g.bench_function("rules", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(iters, || {}, || timed(|| nft::apply(&rs).expect("apply")))
            })
        });
        g.bench_function("capture", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || {},
                    || timed(|| drop(capture::apply(&cfg, &SystemGroups).expect("capture"))),
                )
            })
        });
        g.bench_function("replace", |b| {
            b.iter_custom(|iters| {
                in_fresh_namespaces(
                    iters,
                    || nft::apply(&rs).expect("first apply"),
                    || timed(|| nft::apply(&rs).expect("replace")),
                )
            })
        });
        g.finish();
    }
}

criterion_group!(benches, apply);
criterion_main!(benches);
