//! A read-back is one state of the table, never a mix of two: while another writer switches
//! our table between two configurations, every read (the one CNI CHECK, inspect, reconcile and
//! the repair controller make) equals one configuration or the other, or fails saying the
//! ruleset kept changing. `REDIRECT_RACE_RUNS` sets the number of reads (default 1000).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redirect_kernel::nft::{self, TableState};
use redirect_model::{CaptureConfig, DnsCapture, Selection};
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, netns::TestNetns};

fn reads() -> usize {
    redirect_testkit::race_runs(1000)
}

/// Two configurations whose chains, rules and sets all differ: a read that mixes them differs
/// from both.
fn pair() -> (CaptureConfig, CaptureConfig) {
    let a = CaptureConfig {
        inbound_exclude_ports: (20000..20200).collect(),
        outbound_exclude_cidrs: (0..64u32)
            .map(|i| format!("10.{i}.0.0/16").parse().unwrap())
            .collect(),
        ..CaptureConfig::istio_sidecar_default()
    };
    let b = CaptureConfig {
        inbound_exclude_ports: (30000..30300).collect(),
        outbound_include_cidrs: Selection::List(vec!["192.168.0.0/16".parse().unwrap()]),
        outbound_exclude_cidrs: (0..48u32)
            .map(|i| format!("172.{}.0.0/16", 16 + i % 16).parse().unwrap())
            .collect(),
        dns: DnsCapture::All,
        bypass_uids: vec![4000],
        ..CaptureConfig::istio_sidecar_default()
    };
    (a, b)
}

#[kernel_test]
fn reads_while_another_writer_switches_configs_are_never_a_mix() {
    let ns = TestNetns::new();
    let (a, b) = pair();
    let (ra, rb) = (plan(&a).unwrap(), plan(&b).unwrap());
    let (ea, eb): (TableState, TableState) = (nft::expected(&ra), nft::expected(&rb));
    assert_ne!(ea, eb);
    ns.run(|| redirect_kernel::nft::Nft::open().and_then(|n| n.apply(&ra)))
        .unwrap();
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let (mut as_a, mut as_b, mut unsettled) = (0, 0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.run(|| {
                while !stop.load(Ordering::Relaxed) {
                    for rs in [&rb, &ra] {
                        redirect_kernel::nft::Nft::open()
                            .and_then(|n| n.apply(rs))
                            .expect("the writer's apply");
                        writes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        });
        ns.run(|| {
            for i in 0..reads() {
                match redirect_kernel::nft::Nft::open().and_then(|n| n.read()) {
                    Ok(Some(t)) if t == ea => as_a += 1,
                    Ok(Some(t)) if t == eb => as_b += 1,
                    Ok(Some(t)) => {
                        stop.store(true, Ordering::Relaxed);
                        let first = |rs| {
                            let d = nft::compare(rs, Some(&t));
                            let mut s = d.first().map(|d| d.to_string()).unwrap_or_default();
                            s.truncate(160);
                            format!("{} differences, first: {s}", d.len())
                        };
                        panic!(
                            "read {i} is a mix of the two configurations: against A {}; against B {}",
                            first(&ra),
                            first(&rb)
                        );
                    }
                    Ok(None) => {
                        stop.store(true, Ordering::Relaxed);
                        panic!("read {i}: no table, though it was never deleted");
                    }
                    Err(nft::Error::ReadUnsettled { .. }) => unsettled += 1,
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        panic!("read {i}: {e}");
                    }
                }
            }
        });
        stop.store(true, Ordering::Relaxed);
    });
    eprintln!(
        "{} reads: {as_a} as A, {as_b} as B, {unsettled} gave up (the ruleset kept changing); {} writes",
        reads(),
        writes.load(Ordering::Relaxed)
    );
    assert!(
        as_a > 0 && as_b > 0,
        "both states should be seen: {as_a} A, {as_b} B"
    );
}
