//! Capture rules we did not write, as a policy of the one apply (`Namespace::apply_with`):
//! refused (nothing changed, the rules named), kept, or replaced (ours in first, theirs gone
//! after). On a fake namespace, every policy's decision; in fresh network namespaces, Istio's
//! own rules loaded the way Istio's programs load them (its native nftables golden with
//! `nft -f`, its iptables golden with `iptables-nft-restore` and `iptables-legacy-restore`),
//! with a real connection to tell whose rules capture. Istio's goldens are read from
//! `../shared/testdata/istio`; without it, the kernel tests fail naming the folder.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use redirect_core::foreign::{ForeignRules, Leftover, Ours, OursBefore, Variant};
use redirect_core::testing::{Fake, FakeForeign};
use redirect_core::{Apply, Capture, CaptureConfig, Error, Family, Foreign, Mismatch, Namespace};
use redirect_testkit::istio::{iptables_restore_with, istio_testdata_dir};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};

fn sidecar(envoy_port: u16) -> Capture {
    let mut cfg = CaptureConfig::istio_sidecar_default();
    cfg.envoy_port = envoy_port;
    Capture::Sidecar(cfg.validated().unwrap())
}

fn istio_chain() -> Leftover {
    Leftover {
        family: Family::V4,
        variant: Variant::Nft,
        table: "nat".into(),
        chain: "ISTIO_OUTPUT".into(),
        rules: 3,
        jumps: 1,
    }
}

fn fake_with_istio() -> (Fake, FakeForeign, Namespace) {
    let fake = Fake::with_addresses(&["10.44.0.7".parse::<IpAddr>().unwrap()]);
    let istio = FakeForeign::new(ForeignRules {
        nft_tables: vec!["istio-proxy-nat".into()],
        chains: vec![istio_chain()],
        unread: Vec::new(),
    });
    let ns = Namespace::with_backend(Box::new(fake.clone())).with_foreign(istio.clone());
    (fake, istio, ns)
}

#[test]
fn refuse_changes_nothing_and_names_what_it_found() {
    let (fake, istio, ns) = fake_with_istio();
    let e = ns.apply(&sidecar(15001)).unwrap_err();
    let Error::Refused(r) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(r.foreign(), Some(&istio.rules()));
    let msg = e.to_string();
    assert!(
        msg.contains("istio-proxy-nat") && msg.contains("ISTIO_OUTPUT"),
        "{msg}"
    );
    assert!(msg.contains("Foreign::Replace"), "names the way out: {msg}");
    assert_eq!(fake.state().batches, 0, "nothing programmed");
    assert!(fake.state().table.is_none());
    assert!(!istio.rules().is_empty(), "theirs left alone");
}

#[test]
fn keep_applies_ours_and_reads_nothing_of_theirs() {
    let (fake, istio, ns) = fake_with_istio();
    let done = ns
        .apply_with(&sidecar(15001), Apply::foreign(Foreign::Keep))
        .unwrap();
    assert_eq!(done.foreign_found, None, "Keep reads nothing");
    assert!(done.foreign_removed.is_empty());
    assert!(fake.state().table.is_some());
    assert!(!istio.rules().is_empty(), "theirs kept");
}

#[test]
fn replace_applies_ours_then_removes_theirs() {
    let (fake, istio, ns) = fake_with_istio();
    let before = istio.rules();
    let done = ns
        .apply_with(&sidecar(15001), Apply::foreign(Foreign::Replace))
        .unwrap();
    assert_eq!(done.foreign_found.as_ref(), Some(&before));
    assert_eq!(done.foreign_removed, before);
    assert!(istio.rules().is_empty());
    assert!(ns.check(&sidecar(15001)).unwrap().is_empty());
    assert_eq!(fake.state().batches, 1);
}

#[test]
fn ours_for_another_capture_are_refused_or_replaced_as_asked() {
    let fake = Fake::with_addresses(&["10.44.0.7".parse::<IpAddr>().unwrap()]);
    let ns = Namespace::with_backend(Box::new(fake.clone()));
    let strict = Apply {
        foreign: Foreign::Refuse,
        ours: Ours::RefuseOther,
    };
    assert_eq!(
        ns.apply_with(&sidecar(15001), strict).unwrap().ours_before,
        OursBefore::Absent
    );
    assert_eq!(
        ns.apply_with(&sidecar(15001), strict).unwrap().ours_before,
        OursBefore::Equal
    );
    let e = ns.apply_with(&sidecar(15002), strict).unwrap_err();
    assert!(
        matches!(&e, Error::Refused(r) if r.ours_differ().is_some_and(|d| !d.is_empty())),
        "{e:?}"
    );
    assert!(ns.check(&sidecar(15001)).unwrap().is_empty(), "unchanged");
    ns.apply_with(&sidecar(15002), Apply::default()).unwrap();
    assert!(ns.check(&sidecar(15002)).unwrap().is_empty(), "replaced");
}

// ---- the kernel, with Istio's own rules ----

fn golden(dir: &str, file: &str) -> PathBuf {
    istio_testdata_dir().join(dir).join(file)
}

/// The whole ruleset as `nft` lists it (both iptables-nft's and everyone's tables).
fn ruleset(topo: &Topology) -> String {
    topo.pod.sh("nft list ruleset")
}

/// Where an app's (UID 1000) connection to the peer's port 80 lands.
fn outbound(topo: &Topology) -> Outcome {
    let peer = SocketAddr::new(topo.peer_addr(false), 80);
    run_probe(
        topo,
        &Probe::tcp(
            From::Pod {
                uid: 1000,
                gid: 1000,
            },
            peer,
        ),
    )
}

/// Istio's sidecar rules in `form` for its case `kube-virt-interfaces` (every outbound
/// address captured; eth1 and eth2 are KubeVirt's), loaded into a fresh pod.
fn pod_with_istio(form: &str) -> Topology {
    let topo = Topology::basic();
    match form {
        "native" => {
            let path = golden("nftables", "kube-virt-interfaces.golden");
            topo.pod.sh(&format!("nft -f {}", path.display()));
        }
        variant => iptables_restore_with(
            &topo.pod,
            false,
            &golden("iptables", "kube-virt-interfaces.restore"),
            Some(variant),
        ),
    }
    topo
}

/// That connection, redirected to the pod's `port` with its original destination.
fn captured_to(topo: &Topology, port: u16) -> Outcome {
    Outcome::landed(
        Side::Pod,
        port,
        Some(SocketAddr::new(topo.peer_addr(false), 80)),
    )
}

fn istio_captures_outbound(topo: &Topology) {
    assert_eq!(
        outbound(topo),
        captured_to(topo, 15001),
        "Istio's rules capture the app's outbound connection"
    );
}

#[kernel_test]
fn istios_rules_in_each_form_are_found_refused_and_replaced() {
    for form in ["native", "nft", "legacy"] {
        let topo = pod_with_istio(form);
        istio_captures_outbound(&topo);
        let ns = Namespace::open(topo.pod.path()).unwrap();
        let found = ns.foreign().unwrap();
        match form {
            "native" => assert_eq!(found.nft_tables, ["istio-proxy-nat"], "{form}"),
            _ => assert!(
                found
                    .chains
                    .iter()
                    .any(|c| c.chain == "ISTIO_OUTPUT" && c.variant.to_string() == form),
                "{form}: {found:?}"
            ),
        }

        // Refused: the kernel exactly as it was, Istio's rules still capturing.
        let before = ruleset(&topo);
        let ours = sidecar(15020);
        let e = ns.apply(&ours).unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "{form}: {e:?}");
        assert_eq!(ruleset(&topo), before, "{form}: refused, nothing changed");
        istio_captures_outbound(&topo);

        // Replaced: ours capture (to 15020, where a listener tells them apart), theirs gone.
        let done = ns
            .apply_with(&ours, Apply::foreign(Foreign::Replace))
            .unwrap();
        assert_eq!(done.foreign_removed, found, "{form}");
        assert!(ns.foreign().unwrap().is_empty(), "{form}: theirs gone");
        assert!(ns.check(&ours).unwrap().is_empty(), "{form}: ours in place");
        let after = ruleset(&topo);
        assert!(
            !after.contains("istio-") && !after.contains("ISTIO_"),
            "{form}: {after}"
        );
        assert_eq!(
            outbound(&topo),
            captured_to(&topo, 15020),
            "{form}: our rules capture now"
        );
    }
}

#[kernel_test]
fn kept_rules_stay_and_are_reported() {
    let topo = pod_with_istio("native");
    let ns = Namespace::open(topo.pod.path()).unwrap();
    ns.apply_with(&sidecar(15020), Apply::foreign(Foreign::Keep))
        .unwrap();
    assert_eq!(ns.foreign().unwrap().nft_tables, ["istio-proxy-nat"]);
    // Ours are in place; check says the other capture is there too.
    let found = ns.check(&sidecar(15020)).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        matches!(&found[0], Mismatch::Foreign(what) if what.contains("istio-proxy-nat")),
        "{found:?}"
    );
    assert!(found[0].to_string().contains("both act on every packet"));
    // Once they go, check is clean.
    ns.remove_foreign().unwrap();
    assert!(ns.check(&sidecar(15020)).unwrap().is_empty());
}
