//! Ambient capture through the library's handle (`Namespace::apply`, `check` and
//! `remove` of a `Capture::Ambient`) in fresh namespaces: the rules and the reply routing together, proven by
//! connections delivered as ztunnel delivers them (a transparent socket spoofing the client),
//! which complete only while both are there.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

use redirect_core::Mismatch;
use redirect_core::{AmbientConfig, Capture, Family, Namespace};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// What ztunnel does to deliver an inbound connection: a transparent socket in the pod,
/// marked 0x539, bound to the remote client's address (`from`), connects to the app at `to`.
/// The app's replies go to `from`: only the reply routing brings them back to this socket.
/// Returns the app listener's landing line (`side=pod port=8080`), or the error.
fn deliver(topo: &Topology, from: SocketAddr, to: SocketAddr) -> Result<String, String> {
    topo.pod.run(move || {
        use nix::sys::socket::{
            bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType,
            SockaddrStorage,
        };
        let fam = if to.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let s = socket(fam, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
        setsockopt(&s, sockopt::Mark, &0x539).unwrap();
        // IP_TRANSPARENT sets the socket's flag for IPv6 sockets too.
        setsockopt(&s, sockopt::IpTransparent, &true).unwrap();
        let timeout = nix::sys::time::TimeVal::new(1, 0);
        setsockopt(&s, sockopt::SendTimeout, &timeout).unwrap();
        setsockopt(&s, sockopt::ReceiveTimeout, &timeout).unwrap();
        bind(s.as_raw_fd(), &SockaddrStorage::from(from)).map_err(|e| format!("bind: {e}"))?;
        connect(s.as_raw_fd(), &SockaddrStorage::from(to)).map_err(|e| format!("connect: {e}"))?;
        // SAFETY: a connected socket this closure owns, handed to TcpStream.
        let stream = unsafe { TcpStream::from_raw_fd(s.into_raw_fd()) };
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .map_err(|e| format!("read: {e}"))?;
        Ok(line
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" "))
    })
}

#[kernel_test]
fn apply_check_and_remove_with_the_reply_routing() {
    let topo = Topology::basic();
    let pod = Namespace::open(topo.pod.path()).unwrap();
    let cfg = AmbientConfig::default();
    // Before: the app's replies to a delivered connection leave by eth0 and never come back.
    let client4 = sa("10.77.0.1:40001");
    assert!(deliver(&topo, client4, sa("10.77.0.2:8080")).is_err());

    pod.apply(&Capture::Ambient(cfg.clone())).unwrap();
    assert_eq!(pod.check(&Capture::Ambient(cfg.clone())).unwrap(), []);
    // Again: nothing changes, nothing is added twice.
    pod.apply(&Capture::Ambient(cfg.clone())).unwrap();
    assert_eq!(pod.check(&Capture::Ambient(cfg.clone())).unwrap(), []);
    let rules = topo.pod.sh("ip rule show");
    assert_eq!(
        rules.matches("fwmark 0x111/0xfff lookup 100").count(),
        1,
        "{rules}"
    );
    assert!(rules.contains("32764:"), "the priority Istio uses: {rules}");
    assert!(topo
        .pod
        .sh("ip -6 rule show")
        .contains("fwmark 0x111/0xfff lookup 100"));

    // The reply routing: ztunnel's delivered connections get their replies, in both
    // families (the connection mark 0x111 restored on the app's replies, table 100 routes them
    // to lo).
    assert_eq!(
        deliver(&topo, sa("10.77.0.1:40002"), sa("10.77.0.2:8080")).unwrap(),
        "side=pod port=8080"
    );
    assert_eq!(
        deliver(&topo, sa("[fd77::1]:40003"), sa("[fd77::2]:8080")).unwrap(),
        "side=pod port=8080"
    );
    let app = From::Pod {
        uid: 1000,
        gid: 1000,
    };
    assert_eq!(
        run_probe(&topo, &Probe::tcp(app.clone(), sa("10.77.0.1:80"))),
        Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80")))
    );

    // The routing gone, check names it; apply puts it back.
    topo.pod.sh("ip rule del fwmark 0x111/0xfff lookup 100");
    assert_eq!(
        pod.check(&Capture::Ambient(cfg.clone())).unwrap(),
        [Mismatch::TproxyRouting(Family::V4)]
    );
    assert!(
        deliver(&topo, sa("10.77.0.1:40005"), sa("10.77.0.2:8080")).is_err(),
        "no reply routing, no delivered connection"
    );
    pod.apply(&Capture::Ambient(cfg.clone())).unwrap();
    assert_eq!(pod.check(&Capture::Ambient(cfg.clone())).unwrap(), []);

    pod.remove(&Capture::Ambient(cfg.clone())).unwrap();
    assert!(pod.read(&Capture::Ambient(cfg.clone())).unwrap().is_none());
    assert!(!topo.pod.sh("ip rule show").contains("lookup 100"));
    assert!(!topo.pod.sh("ip -6 rule show").contains("lookup 100"));
    assert!(deliver(&topo, sa("10.77.0.1:40004"), sa("10.77.0.2:8080")).is_err());
    assert_eq!(
        run_probe(&topo, &Probe::tcp(app, sa("10.77.0.1:80"))),
        Outcome::landed(Side::Peer, 80, None)
    );
    // Removing twice is fine.
    pod.remove(&Capture::Ambient(cfg.clone())).unwrap();
}

#[kernel_test]
fn ipv4_only_adds_no_ipv6_routing() {
    let topo = Topology::basic();
    let pod = Namespace::open(topo.pod.path()).unwrap();
    let cfg = AmbientConfig {
        ipv6: false,
        ..AmbientConfig::default()
    };
    pod.apply(&Capture::Ambient(cfg.clone())).unwrap();
    assert_eq!(pod.check(&Capture::Ambient(cfg.clone())).unwrap(), []);
    assert!(topo
        .pod
        .sh("ip rule show")
        .contains("fwmark 0x111/0xfff lookup 100"));
    assert!(!topo.pod.sh("ip -6 rule show").contains("lookup 100"));
    pod.remove(&Capture::Ambient(cfg.clone())).unwrap();
}

/// `check_since` trusts the generation only while nothing was committed: the table
/// read back equal returns a generation; passed back, the dump is skipped and the answer is
/// the same; a commit anywhere in the namespace (another table) moves it and the table is
/// read again; a deleted table and deleted reply routing are each found (the routing is read
/// every time, whatever the generation says).
#[kernel_test]
fn check_since_skips_the_dump_only_while_nothing_was_committed() {
    let pod = redirect_testkit::TestNetns::with_prefix("rdambsince");
    pod.sh("ip link set lo up");
    let ns = Namespace::open(pod.path()).unwrap();
    let cfg = AmbientConfig::default();
    ns.apply(&Capture::Ambient(cfg.clone())).unwrap();
    let (d, seen) = ns
        .check_since(&Capture::Ambient(cfg.clone()), None)
        .unwrap();
    assert!(d.is_empty(), "{d:?}");
    let seen = seen.expect("a generation for a table that read back equal");
    assert_eq!(
        ns.check_since(&Capture::Ambient(cfg.clone()), Some(seen))
            .unwrap(),
        (vec![], Some(seen))
    );

    // Another tool's table: the generation moves, the table is read again (still equal).
    pod.sh("nft add table inet someone_else");
    let (d, again) = ns
        .check_since(&Capture::Ambient(cfg.clone()), Some(seen))
        .unwrap();
    assert!(d.is_empty(), "{d:?}");
    assert_ne!(again, Some(seen), "the generation moved");

    // The reply routing deleted: no nf_tables commit, found all the same.
    pod.sh("ip rule del fwmark 0x111/0xfff table 100");
    let (d, _) = ns
        .check_since(&Capture::Ambient(cfg.clone()), again)
        .unwrap();
    assert!(
        d.contains(&Mismatch::TproxyRouting(Family::V4)),
        "the deleted routing not seen: {d:?}"
    );

    // Our table deleted: found although a generation is passed.
    ns.apply(&Capture::Ambient(cfg.clone())).unwrap();
    let (_, seen) = ns
        .check_since(&Capture::Ambient(cfg.clone()), None)
        .unwrap();
    pod.sh("nft delete table inet redirect_capture");
    let (d, gone) = ns
        .check_since(&Capture::Ambient(cfg.clone()), seen)
        .unwrap();
    assert!(!d.is_empty(), "the deleted table not seen");
    assert_eq!(gone, None, "no generation for a table that differs");
}
