//! The opt-in counters (`CaptureConfig::counters`, `AmbientConfig::counters`) read back per
//! path (`Namespace::path_counts`) in fresh namespaces: a known number of real connections on
//! each path reads back as that number (the nat stage sees a connection's first packet only),
//! and the same configs without counters carry none.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use redirect_core::{AmbientConfig, Capture, CaptureConfig, CountedPath, Namespace, PathCounts};
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

/// Runs `probe` `n` times, each landing as `want`.
fn times(topo: &Topology, n: usize, probe: Probe, want: Outcome) {
    for _ in 0..n {
        assert_eq!(run_probe(topo, &probe), want, "{probe}");
    }
}

fn packets(c: &PathCounts) -> [u64; 4] {
    CountedPath::ALL.map(|p| c.get(p).packets)
}

fn sidecar(counters: bool) -> Capture {
    let cfg = CaptureConfig {
        outbound_exclude_ports: vec![15020],
        counters,
        ..CaptureConfig::istio_sidecar_default()
    };
    Capture::Sidecar(cfg.validated().unwrap())
}

#[kernel_test]
fn sidecar_connections_on_each_path_read_back_as_their_number() {
    let topo = Topology::basic();
    let pod = Namespace::open(topo.pod.path()).unwrap();
    pod.apply(&sidecar(true)).unwrap();
    assert_eq!(pod.check(&sidecar(true)).unwrap(), []);
    assert_eq!(
        packets(&pod.path_counts(&sidecar(true)).unwrap().unwrap()),
        [0; 4]
    );

    let to_app = Probe::tcp(From::Peer, sa("10.77.0.2:8080"));
    times(
        &topo,
        3,
        to_app,
        Outcome::landed(Side::Pod, 15006, Some(sa("10.77.0.2:8080"))),
    );
    let out = Probe::tcp(APP, sa("10.77.0.1:80"));
    times(
        &topo,
        4,
        out,
        Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80"))),
    );
    let proxy = Probe::tcp(PROXY, sa("10.77.0.1:80"));
    times(&topo, 2, proxy, Outcome::landed(Side::Peer, 80, None));
    // Excluded: an outbound port (-o) twice, an inbound one (-d's 15021) three times.
    let excluded_out = Probe::tcp(APP, sa("10.77.0.1:15020"));
    times(
        &topo,
        2,
        excluded_out,
        Outcome::landed(Side::Peer, 15020, None),
    );
    let excluded_in = Probe::tcp(From::Peer, sa("10.77.0.2:15021"));
    times(
        &topo,
        3,
        excluded_in,
        Outcome::landed(Side::Pod, 15021, None),
    );

    let counts = pod.path_counts(&sidecar(true)).unwrap().unwrap();
    assert_eq!(packets(&counts), [3, 4, 2, 5], "{counts:?}");
    for (path, c) in counts.iter() {
        // A TCP SYN over IPv4 is at least 40 bytes (IP and TCP headers).
        assert!(c.bytes >= 40 * c.packets, "{} {c:?}", path.name());
    }
    // The table still reads back equal to the plan: counting changes nothing else.
    assert_eq!(pod.check(&sidecar(true)).unwrap(), []);
}

#[kernel_test]
fn without_counters_the_table_has_none_and_counters_on_is_a_difference() {
    let topo = Topology::basic();
    let pod = Namespace::open(topo.pod.path()).unwrap();
    pod.apply(&sidecar(false)).unwrap();
    let out = Probe::tcp(APP, sa("10.77.0.1:80"));
    times(
        &topo,
        2,
        out,
        Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80"))),
    );
    // Without counters there is nothing to read: no count is made up.
    assert_eq!(pod.path_counts(&sidecar(true)).unwrap(), None);
    let listing = topo.pod.sh("nft list ruleset");
    assert!(!listing.contains("counter"), "{listing}");
    // A table without counters is not the plan with counters: a pass puts them on.
    assert_ne!(pod.check(&sidecar(true)).unwrap(), []);
    pod.apply(&sidecar(true)).unwrap();
    assert_eq!(pod.check(&sidecar(true)).unwrap(), []);
    // Read with another config's plan (one more counted rule): not attributed, not read.
    let other = CaptureConfig {
        bypass_uids: vec![4000],
        counters: true,
        ..CaptureConfig::istio_sidecar_default()
    };
    let other = Capture::Sidecar(other.validated().unwrap());
    assert_eq!(pod.path_counts(&other).unwrap(), None);
}

/// A connection from ztunnel's side of the pod: a socket marked 0x539, as ztunnel's are.
fn ztunnel_connect(topo: &Topology, to: SocketAddr) {
    topo.pod.run(move || {
        use nix::sys::socket::{connect, setsockopt, socket, sockopt, SockFlag, SockaddrStorage};
        use nix::sys::socket::{AddressFamily, SockType};
        let s = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        );
        let s = s.unwrap();
        setsockopt(&s, sockopt::Mark, &0x539).unwrap();
        connect(s.as_raw_fd(), &SockaddrStorage::from(to)).unwrap();
    });
}

#[kernel_test]
fn ambient_connections_on_each_path_read_back_as_their_number() {
    let topo = Topology::basic();
    let pod = Namespace::open(topo.pod.path()).unwrap();
    let cfg = AmbientConfig {
        dns_capture: false,
        ipv6: false,
        counters: true,
        ..AmbientConfig::default()
    };
    let capture = Capture::Ambient(cfg);
    pod.apply(&capture).unwrap();
    assert_eq!(pod.check(&capture).unwrap(), []);

    let to_app = Probe::tcp(From::Peer, sa("10.77.0.2:8080"));
    times(
        &topo,
        2,
        to_app,
        Outcome::landed(Side::Pod, 15006, Some(sa("10.77.0.2:8080"))),
    );
    let out = Probe::tcp(APP, sa("10.77.0.1:80"));
    times(
        &topo,
        5,
        out,
        Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80"))),
    );
    for _ in 0..3 {
        ztunnel_connect(&topo, sa("10.77.0.1:80"));
    }
    let counts = pod.path_counts(&capture).unwrap().unwrap();
    assert_eq!(packets(&counts), [2, 5, 3, 0], "{counts:?}");
}
