//! Ambient's probe SNAT in a host's namespace, through the library's handle
//! (`Namespace::apply`, `read` and `remove` of a `Capture::HostProbe`, `add_members`,
//! `remove_members`, `members`), in fresh namespaces: a "host" and a "pod" joined
//! by a veth pair. Connections from the host as kubelet's UID reach a listener in the pod from
//! the SNAT address exactly while the pod's address is in the set; other UIDs, and everyone
//! once the address is removed, arrive from the host's own address. The rendered script loaded
//! by `nft -f` holds the same table; bad addresses change nothing.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use redirect_core::view::text;
use redirect_core::Netns;
use redirect_core::TableState;
use redirect_core::{render, Capture, HostProbeConfig, Namespace};
use redirect_model::table::HOST_PROBE_TABLE;
use redirect_testkit::netns::become_ids;
use redirect_testkit::{kernel_test, TestNetns};

const KUBELET: u32 = 4242;
const OTHER: u32 = 4343;
const HOST4: &str = "10.88.0.1";
const POD4: &str = "10.88.0.2";
const HOST6: &str = "fd88::1";
const POD6: &str = "fd88::2";
const SNAT4: &str = "169.254.7.127";
const SNAT6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A host and a pod namespace, a veth pair between them, and listeners on the pod's 8080.
struct Pair {
    host: TestNetns,
    pod: TestNetns,
    v4: TcpListener,
    v6: TcpListener,
}

impl Pair {
    fn new() -> Pair {
        let host = TestNetns::with_prefix("rdt-host");
        let pod = TestNetns::with_prefix("rdt-hpod");
        // No duplicate address detection: a tentative link-local address lost the first IPv6
        // connection's handshake (as the test kit's topology avoids too).
        for ns in [&host, &pod] {
            ns.sh("sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0");
        }
        host.sh(&format!(
            "ip link add vh0 type veth peer name eth0 netns {}",
            pod.name()
        ));
        host.sh(&format!(
            "ip addr add {HOST4}/24 dev vh0 && ip addr add {HOST6}/64 dev vh0 nodad && ip link set vh0 up"
        ));
        // The pod answers the SNAT address through the host, whose conntrack undoes the SNAT.
        pod.sh(&format!(
            "ip addr add {POD4}/24 dev eth0 && ip addr add {POD6}/64 dev eth0 nodad && \
             ip link set eth0 up && ip link set lo up && \
             ip route add default via {HOST4} && ip -6 route add default via {HOST6}"
        ));
        let listen = |a: &str| {
            let l = pod.run(|| TcpListener::bind(a)).unwrap();
            l.set_nonblocking(true).unwrap();
            l
        };
        let (v4, v6) = (
            listen(&format!("{POD4}:8080")),
            listen(&format!("[{POD6}]:8080")),
        );
        Pair { host, pod, v4, v6 }
    }

    /// Connect from the host as `uid` to the pod's `to`:8080; the source the pod saw.
    fn source_seen(&self, uid: u32, to: &str) -> IpAddr {
        let dst = SocketAddr::new(ip(to), 8080);
        let client = self.host.run(move || {
            become_ids(uid, uid).unwrap();
            TcpStream::connect_timeout(&dst, Duration::from_secs(2))
        });
        let client = client.unwrap_or_else(|e| panic!("uid {uid} to {dst}: {e}"));
        let listener = if dst.is_ipv4() { &self.v4 } else { &self.v6 };
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match listener.accept() {
                Ok((_, from)) => {
                    drop(client);
                    return from.ip();
                }
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("uid {uid} to {dst}: nothing accepted: {e}"),
            }
        }
    }

    fn ns(&self) -> Namespace {
        Namespace::open(self.host.path()).unwrap()
    }
}

#[kernel_test]
fn kubelets_connections_to_members_come_from_the_snat_address() {
    let p = Pair::new();
    let host = p.ns();
    let cfg = HostProbeConfig::new(KUBELET);
    host.apply(&Capture::HostProbe {
        config: cfg.clone(),
        members: vec![],
    })
    .unwrap();
    assert_eq!(host.members().unwrap(), Some(vec![]));
    assert_eq!(p.source_seen(KUBELET, POD4), ip(HOST4), "no member yet");

    host.add_members(&cfg, &[ip(POD4), ip(POD6)]).unwrap();
    host.add_members(&cfg, &[ip(POD4)]).unwrap(); // again: fine
    assert_eq!(host.members().unwrap(), Some(vec![ip(POD4), ip(POD6)]));
    assert_eq!(p.source_seen(KUBELET, POD4), ip(SNAT4));
    assert_eq!(p.source_seen(KUBELET, POD6), ip(SNAT6));
    assert_eq!(p.source_seen(OTHER, POD4), ip(HOST4), "another UID");
    assert_eq!(p.source_seen(0, POD6), ip(HOST6), "root");

    assert_eq!(host.remove_members(&cfg, &[ip(POD4)]).unwrap(), 1);
    assert_eq!(host.remove_members(&cfg, &[ip(POD4)]).unwrap(), 0, "gone");
    assert_eq!(p.source_seen(KUBELET, POD4), ip(HOST4), "removed");
    assert_eq!(p.source_seen(KUBELET, POD6), ip(SNAT6), "still a member");

    // Applied again at start: the table stays ours, its sets emptied, a new UID in place.
    let moved = HostProbeConfig::new(OTHER);
    host.apply(&Capture::HostProbe {
        config: moved.clone(),
        members: vec![],
    })
    .unwrap();
    assert_eq!(host.members().unwrap(), Some(vec![]));
    host.add_members(&moved, &[ip(POD6)]).unwrap();
    assert_eq!(p.source_seen(OTHER, POD6), ip(SNAT6));
    assert_eq!(p.source_seen(KUBELET, POD6), ip(HOST6));

    let table = |cfg: &HostProbeConfig| Capture::HostProbe {
        config: cfg.clone(),
        members: vec![],
    };
    assert!(host.read(&table(&moved)).unwrap().is_some());
    host.remove(&table(&moved)).unwrap();
    assert!(host.read(&table(&moved)).unwrap().is_none());
    host.remove(&table(&moved)).unwrap();
    assert_eq!(host.members().unwrap(), None);
    assert_eq!(p.host.sh("nft list ruleset").trim(), "", "nothing left");
    assert_eq!(p.source_seen(OTHER, POD6), ip(HOST6));
    drop(p.pod);
}

#[kernel_test]
fn bad_addresses_are_refused_and_change_nothing() {
    let ns = TestNetns::with_prefix("rdt-host");
    let host = Namespace::open(ns.path()).unwrap();
    let v4_only = HostProbeConfig {
        snat_v6: None,
        ..HostProbeConfig::new(KUBELET)
    };
    host.apply(&Capture::HostProbe {
        config: v4_only.clone(),
        members: vec![],
    })
    .unwrap();
    host.add_members(&v4_only, &[ip(POD4)]).unwrap();
    let before = ns.sh(&format!("nft list table inet {HOST_PROBE_TABLE}"));
    for bad in [
        vec![ip(POD6)],
        vec![ip("10.88.0.3"), ip(POD6)],
        vec![ip("0.0.0.0")],
    ] {
        let e = host.add_members(&v4_only, &bad).unwrap_err().to_string();
        let named = bad.last().unwrap().to_string();
        assert!(e.contains(&named), "{e}");
        assert!(host.remove_members(&v4_only, &bad).is_err());
    }
    let e = host.add_members(&v4_only, &[ip(POD6)]).unwrap_err();
    assert!(e.to_string().contains("IPv6 is off"), "{e}");
    assert_eq!(host.members().unwrap(), Some(vec![ip(POD4)]));
    let after = ns.sh(&format!("nft list table inet {HOST_PROBE_TABLE}"));
    assert_eq!(before, after, "nothing changed");

    // A table applied without IPv6 refuses an IPv6 member even from an IPv6 config: the kernel
    // refuses the whole batch, so the IPv4 address sent with it is not added either.
    let both = HostProbeConfig::new(KUBELET);
    let e = host
        .add_members(&both, &[ip("10.88.0.3"), ip(POD6)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ip6-inpod-probes"), "{e}");
    assert_eq!(host.members().unwrap(), Some(vec![ip(POD4)]));

    // No table (a firewall reload flushed the ruleset): removing has nothing to do; a refused
    // address leaves no table behind; adding creates the table with the address, one batch.
    host.remove(&Capture::HostProbe {
        config: v4_only.clone(),
        members: vec![],
    })
    .unwrap();
    assert_eq!(host.remove_members(&v4_only, &[ip(POD4)]).unwrap(), 0);
    assert!(host.add_members(&v4_only, &[ip(POD6)]).is_err());
    assert_eq!(host.members().unwrap(), None, "an empty table left behind");
    host.add_members(&v4_only, &[ip(POD4)]).unwrap();
    assert_eq!(host.members().unwrap(), Some(vec![ip(POD4)]));
}

/// Each chain's rules as nft text (nft's own family check of an `ip`/`ip6` match dropped: our
/// base chain dispatches by family already), and each set with its members.
fn shape(t: &TableState) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let chains = t
        .chains
        .iter()
        .map(|c| {
            let rules = c.rules.iter().map(|r| {
                text::exprs(r)
                    .replace("meta nfproto ipv4 ip ", "ip ")
                    .replace("meta nfproto ipv6 ip6 ", "ip6 ")
            });
            (format!("{} {:?}", c.name, c.base), rules.collect())
        })
        .collect();
    let sets = t
        .sets
        .iter()
        .map(|s| format!("{} {} {:?}", s.name, s.spec(), text::set_elements(s)))
        .collect();
    (chains, sets)
}

#[kernel_test]
fn the_rendered_script_loads_as_the_same_table() {
    for cfg in [
        HostProbeConfig::new(KUBELET),
        HostProbeConfig {
            snat_v6: None,
            ..HostProbeConfig::new(0)
        },
    ] {
        let pods: Vec<IpAddr> = [POD4, "10.88.0.9", POD6]
            .iter()
            .map(|a| ip(a))
            .filter(|a| cfg.family_of(*a).is_ok())
            .collect();
        let ours = TestNetns::with_prefix("rdt-host");
        let host = Namespace::open(ours.path()).unwrap();
        host.apply(&Capture::HostProbe {
            config: cfg.clone(),
            members: vec![],
        })
        .unwrap();
        host.add_members(&cfg, &pods).unwrap();
        let rs = cfg.plan_with(&pods).unwrap();
        let script = render::nft_script_named(&rs, HOST_PROBE_TABLE, "ambient's host probe SNAT");
        let loaded = TestNetns::with_prefix("rdt-host");
        loaded.run(|| {
            use std::io::Write;
            let mut nft = std::process::Command::new("nft")
                .args(["-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            nft.stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            assert!(nft.wait().unwrap().success(), "nft -f\n{script}");
        });
        let read = |ns: &TestNetns| {
            let netns = Netns::open(ns.path()).unwrap();
            Namespace::from_netns(netns)
                .unwrap()
                .read(&Capture::HostProbe {
                    config: cfg.clone(),
                    members: vec![],
                })
                .unwrap()
                .unwrap()
        };
        let (a, b) = (read(&ours), read(&loaded));
        assert_eq!(shape(&a), shape(&b), "nft -f differs\n{script}");
        assert!(shape(&a)
            .0
            .iter()
            .any(|(_, r)| r.iter().any(|r| r.contains("snat ip to"))));
        assert_eq!(
            a,
            redirect_kernel::nft::expected(&rs),
            "read back as planned"
        );
    }
}
