//! Istio parity on Istio's own test data: for every case of `testdata/istio/iptables/`, Istio's
//! restore files go into one pod namespace and our rules (from the same configuration, over
//! netlink) into another, identical one; the same matrix of real connections runs through both,
//! and every probe must end in the same place.

use redirect_model::CaptureConfig;

mod common;

use common::config_of;
use redirect_testkit::istio::{
    self, group_gid, list_cases, load_istio_case, probe_matrix, IstioCase,
};
use redirect_testkit::{kernel_test, run_probes};
use redirect_testkit::{run_probe_with, Outcome, Timing};

#[kernel_test]
fn every_istio_case_sends_every_probe_to_the_same_place() {
    let cases = list_cases();
    assert_eq!(cases.len(), 27, "Istio's iptables test data has 27 cases");
    let resolver = |n: &str| group_gid(n);
    let mut mismatches = Vec::new();
    let mut probes_run = 0;
    for name in &cases {
        let case = IstioCase::load(name);
        let cfg = config_of(&case);
        let probes = probe_matrix(&case);
        assert!(!probes.is_empty(), "{name}: empty probe matrix");

        let theirs = istio::case_topology(&case);
        load_istio_case(&theirs.pod, &case);
        let ours = istio::case_topology(&case);
        let rs = redirect_testkit::plan_with(&cfg, &resolver)
            .unwrap_or_else(|e| panic!("{name}: plan: {e}"));
        redirect_kernel::capture::apply_in(
            &redirect_kernel::testing::live_in(ours.pod.path()),
            redirect_model::table::TABLE,
            &redirect_model::sidecar_routes(&cfg),
            &rs,
        )
        .unwrap_or_else(|e| panic!("{name}: apply: {e}"));

        let want = run_probes(&theirs, &probes);
        let got = run_probes(&ours, &probes);
        for ((p, w), g) in probes.iter().zip(&want).zip(&got) {
            probes_run += 1;
            assert!(
                w.is_definite(),
                "{name}: Istio's side gave no definite outcome for {p:?}: {w:?}"
            );
            if w != g {
                // A timeout on one side only gets a second, patient look on both sides: on a
                // loaded machine a connect can outlast the default 300 ms.
                let timed_out = matches!(w, Outcome::Timeout) || matches!(g, Outcome::Timeout);
                let again = timed_out.then(|| {
                    let slow = Timing::patient();
                    (
                        run_probe_with(&theirs, p, slow),
                        run_probe_with(&ours, p, slow),
                    )
                });
                match again {
                    Some((w2, g2)) if w2 == g2 => {
                        eprintln!("{name}: {p:?}: {w} vs {g} at first, {w2} on both sides again")
                    }
                    _ => mismatches.push(format!("{name}: {p:?}\n    istio: {w}\n    ours:  {g}")),
                }
            }
        }
        eprintln!("{name}: {} probes compared", probes.len());
    }
    eprintln!(
        "{} probes over {} cases, {} mismatches",
        probes_run,
        cases.len(),
        mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    let _ = istio::APP_ID;
}

/// Istio's CNI `basic` golden (the real sidecar default) line for line, but for the
/// one-rule-per-port order of the outbound port excludes, which is the same here.
#[test]
fn iptables_rendering_of_the_sidecar_default_matches_istio_cni_basic() {
    let cfg = CaptureConfig {
        outbound_exclude_ports: vec![15020],
        inbound_exclude_ports: vec![15020, 15021, 15090],
        ..CaptureConfig::istio_sidecar_default()
    };
    let rs = redirect_testkit::plan(&cfg).unwrap();
    let ours = redirect_model::render::iptables_restore(&rs, redirect_model::Family::V4);
    let path = redirect_testkit::istio::istio_testdata_dir().join("cni/basic.restore");
    let istio = std::fs::read_to_string(path).unwrap();
    let sorted = |s: &str| {
        let mut v: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        v.sort();
        v.join("\n")
    };
    assert_eq!(sorted(&ours), sorted(&istio));
}
