//! Foreign rules on a node with no iptables binary, as the node agent's image is: Istio's rules
//! loaded with the binaries, then read, refused and replaced with `PATH` pointing at an empty
//! folder. iptables-nft's chains are nf_tables chains, read and removed over netlink;
//! iptables-legacy's tables cannot be read without `iptables-legacy-save`, so they are named
//! as unread, refused by default, and a replace is refused up front with nothing changed.
//!
//! The only test of its binary: it changes the process's `PATH`. Istio's golden is read from
//! `../shared/testdata/istio`; without it, the test fails naming the folder.

use std::net::SocketAddr;

use redirect_core::{Apply, Capture, CaptureConfig, Error, Foreign, Namespace};
use redirect_testkit::istio::{iptables_restore_with, istio_testdata_dir};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};

fn sidecar(envoy_port: u16) -> Capture {
    let mut cfg = CaptureConfig::istio_sidecar_default();
    cfg.envoy_port = envoy_port;
    Capture::Sidecar(cfg.validated().unwrap())
}

fn lands(topo: &Topology) -> Outcome {
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

fn captured_to(topo: &Topology, port: u16) -> Outcome {
    Outcome::landed(
        Side::Pod,
        port,
        Some(SocketAddr::new(topo.peer_addr(false), 80)),
    )
}

/// Runs `f` with `PATH` naming only an empty folder: no binary can be found.
fn without_binaries<T>(f: impl FnOnce() -> T) -> T {
    let empty = std::env::temp_dir().join(format!("no-binaries-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let saved = std::env::var_os("PATH");
    std::env::set_var("PATH", &empty);
    let out = f();
    match saved {
        Some(p) => std::env::set_var("PATH", p),
        None => std::env::remove_var("PATH"),
    }
    let _ = std::fs::remove_dir(&empty);
    out
}

#[kernel_test]
fn without_binaries_nft_chains_are_replaced_and_legacy_tables_refused_up_front() {
    let golden = istio_testdata_dir()
        .join("iptables")
        .join("kube-virt-interfaces.restore");
    for variant in ["nft", "legacy"] {
        let topo = Topology::basic();
        iptables_restore_with(&topo.pod, false, &golden, Some(variant));
        assert_eq!(
            lands(&topo),
            captured_to(&topo, 15001),
            "{variant}: Istio's capture"
        );
        let ns = Namespace::open(topo.pod.path()).unwrap();
        let before = topo
            .pod
            .sh(&format!("iptables-{variant}-save | grep -v '^#'"));
        let ours = sidecar(15020);

        let found = without_binaries(|| ns.foreign()).unwrap();
        let refused = without_binaries(|| ns.apply(&ours)).unwrap_err();
        assert!(
            matches!(refused, Error::Refused(_)),
            "{variant}: {refused:?}"
        );
        let replaced = without_binaries(|| ns.apply_with(&ours, Apply::foreign(Foreign::Replace)));
        let after = topo
            .pod
            .sh(&format!("iptables-{variant}-save | grep -v '^#'"));
        match variant {
            "nft" => {
                assert!(found.unread.is_empty(), "{found:?}");
                assert!(
                    found.chains.iter().any(|c| c.chain == "ISTIO_OUTPUT"),
                    "read over netlink: {found:?}"
                );
                let done = replaced.unwrap();
                assert_eq!(
                    done.foreign_removed.chains, found.chains,
                    "removed what was found"
                );
                assert!(!after.contains("ISTIO_"), "{after}");
                assert!(
                    !after.contains("-i eth1 -j RETURN"),
                    "Istio's exclusions go: {after}"
                );
                assert_eq!(lands(&topo), captured_to(&topo, 15020), "ours capture now");
            }
            _ => {
                assert!(found.chains.is_empty(), "{found:?}");
                assert_eq!(found.unread.len(), 1, "{found:?}");
                assert!(found.unread[0].contains("iptables-legacy"), "{found:?}");
                assert!(
                    found.unread[0].contains("nat"),
                    "names the table: {found:?}"
                );
                let e = replaced.unwrap_err().to_string();
                assert!(e.contains("cannot be replaced here"), "{e}");
                assert!(e.contains("iptables-legacy-save"), "says what to do: {e}");
                assert_eq!(after, before, "refused up front: Istio's rules untouched");
                assert!(ns.read(&ours).unwrap().is_none(), "ours not applied");
                assert_eq!(
                    lands(&topo),
                    captured_to(&topo, 15001),
                    "still Istio's capture"
                );
            }
        }
    }
}
