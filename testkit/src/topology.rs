//! A pod namespace and a peer namespace joined by veth pairs, with listeners on both sides.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::flow::{Side, Timing};
use super::listeners::{self, dedup, ListenerSet, ListenerSpec};
use super::netns::TestNetns;

/// The pod's address on `eth0`.
pub const POD4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
/// The peer's address on the `eth0` link (the pod's IPv4 default gateway).
pub const PEER4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
/// The pod's IPv6 address on `eth0`.
pub const POD6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
/// The peer's IPv6 address on the `eth0` link (the pod's IPv6 default gateway).
pub const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1);

/// One veth pair between pod and peer. Link `i` (0 = `eth0`) uses 10.77.i.0/24 and
/// fd77:i::/64, the pod end `.2`/`::2`, the peer end `.1`/`::1`. In the peer, sockets bound to
/// `peer_if` use routing table `table`, whose default route points at the pod end, so traffic
/// sent that way arrives on the pod's `pod_if` whatever its destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The pod end's interface (`eth0` for link 0).
    pub pod_if: String,
    /// The peer end's interface, `peer<i>`.
    pub peer_if: String,
    /// The pod end's IPv4 address, `10.77.i.2`.
    pub pod4: Ipv4Addr,
    /// The peer end's IPv4 address, `10.77.i.1`.
    pub peer4: Ipv4Addr,
    /// The pod end's IPv6 address, `fd77:i::2`.
    pub pod6: Ipv6Addr,
    /// The peer end's IPv6 address, `fd77:i::1`.
    pub peer6: Ipv6Addr,
    /// The peer's routing table for sockets bound to `peer_if`, `100 + i`.
    pub table: u32,
}

impl Link {
    /// The addressing of link number `index` (0 is `eth0`).
    pub fn nth(index: usize, pod_if: &str) -> Link {
        assert!(index < 200, "too many links");
        let i = index as u8;
        Link {
            pod_if: pod_if.to_string(),
            peer_if: format!("peer{index}"),
            pod4: Ipv4Addr::new(10, 77, i, 2),
            peer4: Ipv4Addr::new(10, 77, i, 1),
            pod6: Ipv6Addr::new(0xfd77, i as u16, 0, 0, 0, 0, 0, 2),
            peer6: Ipv6Addr::new(0xfd77, i as u16, 0, 0, 0, 0, 0, 1),
            table: 100 + index as u32,
        }
    }

    /// The pod end's address of a family (`v6`: IPv6).
    pub fn pod_addr(&self, v6: bool) -> IpAddr {
        if v6 {
            self.pod6.into()
        } else {
            self.pod4.into()
        }
    }

    /// The peer end's address of a family (`v6`: IPv6).
    pub fn peer_addr(&self, v6: bool) -> IpAddr {
        if v6 {
            self.peer6.into()
        } else {
            self.peer4.into()
        }
    }
}

/// What to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologySpec {
    /// Pod-side names of veth pairs besides `eth0` (e.g. `eth1`, `not-istio-nic`), in order:
    /// the first is link 1.
    pub extra_ifaces: Vec<String>,
    /// Addresses the peer owns on its `lo`, reached from the pod through its default routes.
    pub remote_addrs: Vec<IpAddr>,
    /// Addresses the peer owns on its `lo` that the pod routes through the given pod interface
    /// (a host route via that link's peer end).
    pub remote_via: Vec<(IpAddr, String)>,
    /// Extra addresses on the pod's `lo` (e.g. a resolver address like `::127.0.0.53`).
    pub pod_lo_addrs: Vec<IpAddr>,
    /// The listeners of the pod's namespace.
    pub pod_listeners: ListenerSpec,
    /// The listeners of the peer's namespace.
    pub peer_listeners: ListenerSpec,
}

impl Default for TopologySpec {
    /// Just `eth0`; pod listeners on the capture ports, 53, 8080, 15020, 15021 and 15090; peer
    /// listeners on 80, 15020 and 53.
    fn default() -> Self {
        TopologySpec {
            extra_ifaces: Vec::new(),
            remote_addrs: Vec::new(),
            remote_via: Vec::new(),
            pod_lo_addrs: Vec::new(),
            pod_listeners: ListenerSpec::pod(&[8080, 15020, 15021, 15090]),
            peer_listeners: ListenerSpec::peer(&[80, 15020]),
        }
    }
}

/// Two namespaces, `pod` and `peer`, joined by `eth0` (and any extra links), with default routes
/// from the pod to the peer (v4 and v6) and listeners on both sides. Everything is torn down on
/// drop: the listener threads stop, then the namespaces go.
pub struct Topology {
    // Declared first, so dropped first.
    listeners: Vec<ListenerSet>,
    /// The pod's namespace, where the rules under test go.
    pub pod: TestNetns,
    /// The peer's namespace: the pod's default gateway and every remote address.
    pub peer: TestNetns,
    links: Vec<Link>,
    /// Probe timeouts used by `run_probe` on this topology.
    pub timing: Timing,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("pod", &self.pod.name())
            .field("peer", &self.peer.name())
            .field("links", &self.links)
            .finish()
    }
}

fn host_prefix(a: &IpAddr) -> String {
    match a {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

fn write_sysctl(key: &str, value: &str) {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    // IPv6 may be absent from the kernel; everything else must work.
    if let Err(e) = std::fs::write(&path, value) {
        if !(key.starts_with("net.ipv6") && e.kind() == std::io::ErrorKind::NotFound) {
            panic!("cannot set {key}={value}: {e}");
        }
    }
}

impl Topology {
    /// The default topology: see [`TopologySpec::default`].
    pub fn basic() -> Topology {
        Topology::new(&TopologySpec::default())
    }

    /// Builds the namespaces, links, addresses, routes and listeners of `spec`.
    pub fn new(spec: &TopologySpec) -> Topology {
        let pod = TestNetns::with_prefix("rdt-pod");
        let peer = TestNetns::with_prefix("rdt-peer");
        let mut links = vec![Link::nth(0, "eth0")];
        for (i, name) in spec.extra_ifaces.iter().enumerate() {
            assert!(
                !name.is_empty() && name.len() <= 15 && name != "lo",
                "bad pod interface name {name:?}"
            );
            assert!(
                links.iter().all(|l| &l.pod_if != name),
                "pod interface {name:?} given twice"
            );
            links.push(Link::nth(i + 1, name));
        }
        for ns in [&pod, &peer] {
            ns.run(|| {
                // Reverse-path filtering would drop the asymmetric replies of `PeerVia` probes;
                // DAD would leave IPv6 addresses tentative for a second.
                write_sysctl("net.ipv4.conf.all.rp_filter", "0");
                write_sysctl("net.ipv4.conf.default.rp_filter", "0");
                write_sysctl("net.ipv6.conf.all.accept_dad", "0");
                write_sysctl("net.ipv6.conf.default.accept_dad", "0");
            });
        }

        let mut pod_cmds = Vec::new();
        let mut peer_cmds = Vec::new();
        let mut peer_rules6 = Vec::new();
        let mut pod_routes = Vec::new();
        for l in &links {
            pod_cmds.push(format!(
                "link add {} type veth peer name {} netns {}",
                l.pod_if,
                l.peer_if,
                peer.name()
            ));
            pod_cmds.push(format!("addr add {}/24 dev {}", l.pod4, l.pod_if));
            pod_cmds.push(format!("addr add {}/64 dev {} nodad", l.pod6, l.pod_if));
            pod_cmds.push(format!("link set {} up", l.pod_if));
            peer_cmds.push(format!("addr add {}/24 dev {}", l.peer4, l.peer_if));
            peer_cmds.push(format!("addr add {}/64 dev {} nodad", l.peer6, l.peer_if));
            peer_cmds.push(format!("link set {} up", l.peer_if));
            peer_cmds.push(format!("rule add oif {} lookup {}", l.peer_if, l.table));
            // `ip rule` takes its family from the command line only: these go in a `-6` batch.
            peer_rules6.push(format!("rule add oif {} lookup {}", l.peer_if, l.table));
        }
        for a in dedup(spec.pod_lo_addrs.iter().copied()) {
            pod_cmds.push(format!("addr add {} dev lo", host_prefix(&a)));
        }
        let mut remotes: Vec<IpAddr> = spec.remote_addrs.clone();
        remotes.extend(spec.remote_via.iter().map(|(a, _)| *a));
        for a in dedup(remotes) {
            assert!(!a.is_loopback(), "remote address {a} is a loopback address");
            peer_cmds.push(format!("addr add {} dev lo", host_prefix(&a)));
        }
        // Routes go in once both ends of every link are up.
        for l in &links {
            peer_cmds.push(format!(
                "route add 0.0.0.0/0 via {} dev {} table {}",
                l.pod4, l.peer_if, l.table
            ));
            peer_cmds.push(format!(
                "route add ::/0 via {} dev {} table {}",
                l.pod6, l.peer_if, l.table
            ));
        }
        pod_routes.push(format!("route add 0.0.0.0/0 via {PEER4} dev eth0"));
        pod_routes.push(format!("route add ::/0 via {PEER6} dev eth0"));
        for (a, iface) in &spec.remote_via {
            let l = links
                .iter()
                .find(|l| &l.pod_if == iface)
                .unwrap_or_else(|| panic!("remote_via {a}: no pod interface {iface:?}"));
            pod_routes.push(format!(
                "route add {} via {} dev {}",
                host_prefix(a),
                l.peer_addr(a.is_ipv6()),
                iface
            ));
        }
        pod.ip_batch(false, &pod_cmds);
        peer.ip_batch(false, &peer_cmds);
        peer.ip_batch(true, &peer_rules6);
        pod.ip_batch(false, &pod_routes);
        for ns in [&pod, &peer] {
            wait_ipv6_ready(ns);
        }

        let mut topo = Topology {
            listeners: Vec::new(),
            pod,
            peer,
            links,
            timing: Timing::default(),
        };
        topo.start_listeners(Side::Pod, &spec.pod_listeners);
        topo.start_listeners(Side::Peer, &spec.peer_listeners);
        topo
    }

    /// Opens more listeners on one side (ports must not be taken already); they run until the
    /// topology drops.
    pub fn start_listeners(&mut self, side: Side, spec: &ListenerSpec) {
        let ns = match side {
            Side::Pod => &self.pod,
            Side::Peer => &self.peer,
        };
        let set = listeners::start(ns, side, spec);
        self.listeners.push(set);
    }

    /// All links, `eth0` first.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// The link whose pod end is `pod_if`.
    pub fn link(&self, pod_if: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.pod_if == pod_if)
    }

    /// The pod's `eth0` address of a family.
    pub fn pod_addr(&self, v6: bool) -> IpAddr {
        self.links[0].pod_addr(v6)
    }

    /// The peer's address on the `eth0` link.
    pub fn peer_addr(&self, v6: bool) -> IpAddr {
        self.links[0].peer_addr(v6)
    }
}

/// Waits (polling) until no IPv6 address of `ns` is tentative.
fn wait_ipv6_ready(ns: &TestNetns) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = super::netns::run_command(
            std::process::Command::new("ip").args([
                "-n",
                ns.name(),
                "-6",
                "addr",
                "show",
                "tentative",
            ]),
            None,
            "ip -6 addr show tentative",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        if out.trim().is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "IPv6 addresses still tentative in {}:\n{out}",
            ns.name()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
