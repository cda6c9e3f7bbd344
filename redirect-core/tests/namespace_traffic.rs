//! A [`Namespace`]'s capture (`redirect_core::Namespace::apply`, `remove`): our rules alone, against stated expectations, with real connections in fresh namespaces:
//! REDIRECT and TPROXY, IPv4 and IPv6, for Istio's default sidecar settings plus DNS capture.

use std::net::SocketAddr;

use redirect_core::{Capture, CaptureConfig, DnsCapture, InterceptionMode, Namespace};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}
const APP: From = From::Pod {
    uid: 1000,
    gid: 1000,
};
const PROXY: From = From::Pod {
    uid: 1337,
    gid: 1337,
};
const PROXY_GID_ONLY: From = From::Pod {
    uid: 1000,
    gid: 1337,
};

fn landed(side: Side, port: u16, orig: Option<&str>) -> Outcome {
    Outcome::landed(side, port, orig.map(sa))
}

fn config(mode: InterceptionMode) -> CaptureConfig {
    CaptureConfig {
        mode,
        ipv6: true,
        dns: DnsCapture::All,
        outbound_exclude_ports: vec![15020],
        ..CaptureConfig::istio_sidecar_default()
    }
}

fn check(mode: InterceptionMode) {
    let topo = Topology::basic();
    Namespace::open(topo.pod.path())
        .and_then(|pod| pod.apply(&Capture::Sidecar(config(mode).validated()?)))
        .unwrap();
    // REDIRECT: the NATed connection's original destination. TPROXY: no NAT, so conntrack's
    // original destination is the address the transparent socket accepted on: the same.
    let inbound = |orig: &str| landed(Side::Pod, 15006, Some(orig));
    let cases: Vec<(Probe, Outcome)> = vec![
        // Inbound to a captured port lands on 15006.
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
            inbound("10.77.0.2:8080"),
        ),
        (
            Probe::tcp(From::Peer, sa("[fd77::2]:8080")),
            inbound("[fd77::2]:8080"),
        ),
        // Excluded inbound ports reach the application.
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:15021")),
            landed(Side::Pod, 15021, None),
        ),
        (
            Probe::tcp(From::Peer, sa("[fd77::2]:15090")),
            landed(Side::Pod, 15090, None),
        ),
        // Outbound from an application UID lands on 15001.
        (
            Probe::tcp(APP, sa("10.77.0.1:80")),
            landed(Side::Pod, 15001, Some("10.77.0.1:80")),
        ),
        (
            Probe::tcp(APP, sa("[fd77::1]:80")),
            landed(Side::Pod, 15001, Some("[fd77::1]:80")),
        ),
        // The proxy's UID and GID are never captured.
        (
            Probe::tcp(PROXY, sa("10.77.0.1:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::tcp(PROXY_GID_ONLY, sa("[fd77::1]:80")),
            landed(Side::Peer, 80, None),
        ),
        // Excluded outbound port.
        (
            Probe::tcp(APP, sa("10.77.0.1:15020")),
            landed(Side::Peer, 15020, None),
        ),
        // DNS, UDP and TCP, lands on the agent's 15053; the proxy's own DNS goes out.
        (
            Probe::udp(APP, sa("10.77.0.1:53")),
            landed(Side::Pod, 15053, None),
        ),
        (
            Probe::udp(APP, sa("[fd77::1]:53")),
            landed(Side::Pod, 15053, None),
        ),
        (
            Probe::tcp(APP, sa("10.77.0.1:53")),
            landed(Side::Pod, 15053, Some("10.77.0.1:53")),
        ),
        (
            Probe::udp(PROXY, sa("10.77.0.1:53")),
            landed(Side::Peer, 53, None),
        ),
        // The validation path: the proxy UID connecting to 127.0.0.6:15002 lands on 15006.
        (
            Probe::tcp(PROXY, sa("127.0.0.6:15002")).bound("127.0.0.1".parse().unwrap()),
            landed(Side::Pod, 15006, Some("127.0.0.6:15002")),
        ),
        (
            Probe::tcp(PROXY, sa("[::6]:15002")).bound("::1".parse().unwrap()),
            landed(Side::Pod, 15006, Some("[::6]:15002")),
        ),
        // ...and an application UID does not.
        (
            Probe::tcp(APP, sa("127.0.0.6:15002")).bound("127.0.0.1".parse().unwrap()),
            Outcome::Refused,
        ),
    ];
    let mut failures = Vec::new();
    for (probe, want) in &cases {
        let got = run_probe(&topo, probe);
        if &got != want {
            failures.push(format!("{mode:?} {probe}: want {want}, got {got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Removing leaves the pod as it was: nothing is diverted any more.
    Namespace::open(topo.pod.path())
        .and_then(|pod| pod.remove(&Capture::Sidecar(config(mode).validated()?)))
        .unwrap();
    assert_eq!(
        run_probe(&topo, &Probe::tcp(APP, sa("10.77.0.1:80"))),
        landed(Side::Peer, 80, None)
    );
    assert_eq!(
        run_probe(&topo, &Probe::tcp(From::Peer, sa("10.77.0.2:8080"))),
        landed(Side::Pod, 8080, None)
    );
}

#[kernel_test]
fn redirect_mode_captures_as_istio_says() {
    check(InterceptionMode::Redirect);
}

#[kernel_test]
fn tproxy_mode_captures_as_istio_says() {
    check(InterceptionMode::Tproxy);
}

/// An init container's IDs, for the bypass test.
const INIT: From = From::Pod {
    uid: 4000,
    gid: 4000,
};
const INIT_GID_ONLY: From = From::Pod {
    uid: 4100,
    gid: 4200,
};

/// The init-container story (docs/init-containers.md): with DNS capture on, an init container
/// running as a bypass UID (or GID) reaches DNS and services directly, both families, and the
/// DNS answers come back through the conntrack zones the DNS rules set; the application's
/// traffic and inbound traffic are still captured.
#[kernel_test]
fn bypass_ids_reach_dns_and_services_directly_while_the_app_is_captured() {
    let cfg = CaptureConfig {
        bypass_uids: vec![4000],
        bypass_gids: vec![4200],
        ..config(InterceptionMode::Redirect)
    };
    let topo = Topology::basic();
    Namespace::open(topo.pod.path())
        .and_then(|pod| pod.apply(&Capture::Sidecar(cfg.clone().validated()?)))
        .unwrap();
    let cases: Vec<(Probe, Outcome)> = vec![
        (
            Probe::udp(INIT, sa("10.77.0.1:53")),
            landed(Side::Peer, 53, None),
        ),
        (
            Probe::udp(INIT, sa("[fd77::1]:53")),
            landed(Side::Peer, 53, None),
        ),
        (
            Probe::tcp(INIT, sa("10.77.0.1:53")),
            landed(Side::Peer, 53, None),
        ),
        (
            Probe::tcp(INIT, sa("10.77.0.1:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::udp(INIT_GID_ONLY, sa("10.77.0.1:53")),
            landed(Side::Peer, 53, None),
        ),
        (
            Probe::tcp(INIT_GID_ONLY, sa("[fd77::1]:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::udp(APP, sa("10.77.0.1:53")),
            landed(Side::Pod, 15053, None),
        ),
        (
            Probe::tcp(APP, sa("10.77.0.1:80")),
            landed(Side::Pod, 15001, Some("10.77.0.1:80")),
        ),
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
            landed(Side::Pod, 15006, Some("10.77.0.2:8080")),
        ),
    ];
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(probe, want)| {
            let got = run_probe(&topo, probe);
            (&got != want).then(|| format!("{probe}: want {want}, got {got}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
