//! config → plan → netlink messages, no kernel: what a pod's apply computes before it talks
//! to the kernel.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use redirect_benches::configs;
use redirect_kernel::nft;
use redirect_testkit::plan;
use std::hint::black_box;

fn pipeline(c: &mut Criterion) {
    for (name, cfg) in configs() {
        let rs = plan(&cfg).expect("plan");
        let encoded = nft::testing::encode_running(&rs);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(encoded.messages() as u64));
        g.bench_function("plan", |b| b.iter(|| plan(black_box(&cfg)).unwrap()));
        g.bench_function("encode", |b| {
            b.iter(|| nft::testing::encode_running(black_box(&rs)))
        });
        g.bench_function("config-to-batch", |b| {
            b.iter_batched(
                || cfg.clone(),
                |cfg| {
                    nft::testing::encode_running(&plan(&cfg).unwrap())
                        .bytes()
                        .len()
                },
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
