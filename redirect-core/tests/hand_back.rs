//! The hand-back through the door (`Namespace::hand_back`): a pod's capture of ours replaced by
//! Istio's native nftables tables for the same config, in fresh network namespaces. What is
//! written equals what `nft -f` makes of the rules as Istio writes them; ours is gone; a
//! config Istio has no rule for is refused and the namespace is left as it was. (Equality with
//! Istio's own goldens, case by case, is redirect-istio's `tests/nft_form.rs`.)

use redirect_core::{Capture, CaptureConfig, InterceptionMode, Namespace};
use redirect_istio::nft_form::IstioNft;
use redirect_testkit::{kernel_tests_enabled, TestNetns};

/// The script Istio would pipe to `nft -f` for `cfg`: tables, chains, then every rule in its
/// final place.
fn istio_script(cfg: &CaptureConfig) -> String {
    let nft = IstioNft::build(cfg).unwrap();
    let mut out = Vec::new();
    for t in &nft.tables {
        out.push(format!("add table inet {}", t.table.name()));
        for c in &t.chains {
            let decl = match c.base {
                Some(b) => format!(
                    " {{ type {} hook {} priority {} ; }}",
                    b.kind.name(),
                    if b.hook == redirect_model::Hook::Output {
                        "output"
                    } else {
                        "prerouting"
                    },
                    b.priority
                ),
                None => String::new(),
            };
            out.push(format!(
                "add chain inet {} {}{decl}",
                t.table.name(),
                c.name
            ));
        }
    }
    out.extend(nft.rule_lines());
    out.join("\n") + "\n"
}

fn listing(ns: &TestNetns) -> String {
    ns.sh("nft list ruleset")
}

#[test]
fn a_pod_is_handed_back_in_istios_form_or_refused_unchanged() {
    if !kernel_tests_enabled() {
        return;
    }
    let mut cfg = CaptureConfig::istio_sidecar_default();
    for mode in [InterceptionMode::Redirect, InterceptionMode::Tproxy] {
        cfg.mode = mode;
        cfg.ipv6 = mode == InterceptionMode::Tproxy;
        let istio = TestNetns::new();
        let script = std::env::temp_dir().join(format!("rdt-handback-{}.nft", std::process::id()));
        std::fs::write(&script, istio_script(&cfg)).unwrap();
        istio.sh(&format!("nft -f {}", script.display()));
        let _ = std::fs::remove_file(&script);

        let ns = TestNetns::new();
        let pod = Namespace::open(ns.path()).unwrap();
        pod.apply(&Capture::Sidecar(cfg.clone().validated().unwrap()))
            .unwrap();
        let before = listing(&ns);
        assert!(before.contains("table inet redirect_capture"), "{before}");
        let mut bypass = cfg.clone();
        bypass.bypass_uids = vec![4000];
        let refused = pod.hand_back(&bypass).unwrap_err().to_string();
        assert!(refused.contains("bypass"), "{refused}");
        assert_eq!(
            listing(&ns),
            before,
            "a refused hand-back changed the namespace"
        );

        let done = pod.hand_back(&cfg).unwrap();
        assert!(done.had_ours, "{mode:?}");
        let after = listing(&ns);
        assert!(
            !after.contains("table inet redirect_capture"),
            "ours is still there:\n{after}"
        );
        assert_eq!(after, listing(&istio), "{mode:?}: not Istio's tables");
        assert_eq!(done.tables, IstioNft::build(&cfg).unwrap().table_names());
    }
}
