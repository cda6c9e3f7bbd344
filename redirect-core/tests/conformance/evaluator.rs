//! The evaluator against the kernel: random configs and random flows; every flow is sent as a
//! real connection (TCP) or datagram (UDP) through a pod namespace programmed with our rules, and
//! where it lands must be what `eval::evaluate`'s verdict says.
//!
//! One proptest case is one `CaptureConfig` and [`FLOWS_PER_CONFIG`] flows: a fresh `Topology`
//! (pod and peer joined by `eth0` and `eth1`), `kernel::capture::apply` in the pod (rules and
//! routes), then each flow is evaluated on the planned `Ruleset` and probed (in parallel,
//! `run_probes_report`), and the landing is compared with [`expected_outcome`].
//!
//! Run it:
//!
//! ```text
//! cargo test -p redirect-istio --test eval_kernel -- --nocapture
//! ```
//!
//! Environment:
//!
//! - `REDIRECT_EVAL_CASES=N`: about N flow cases (rounded up to whole configs of 16 flows);
//!   the default is 512 (32 configs), which CI runs. `REDIRECT_EVAL_CASES=5000` is a long run.
//! - `REDIRECT_EVAL_SEED=S`: the run's seed (a u64). Every run prints its seed; the same seed
//!   draws the same configs and flows, so a failure can be run again exactly.
//! - `REDIRECT_EVAL_SHRINK=N`: how many shrink steps proptest may take after a failure
//!   (default 24; each step builds a topology). `0` reports the first failing case as drawn.
//! - `REDIRECT_EVAL_VERBOSE=1`: prints every flow with its verdict and the kernel's outcome.
//! - The kernel test is a `#[kernel_test]`: ignored with its reason unless run with
//!   `--include-ignored`, as root.
//!
//! A failure prints the seed to run it again and, for the failing case as drawn and again after
//! shrinking, every flow that disagreed: the flow, the probe that carried it, the evaluator's
//! verdict, path (the rules that matched) and notes, the expected and the kernel's outcome, the
//! listener's raw report, and what the same flow did when sent again alone in a fresh pod; then
//! the config (`to_json`).
//!
//! The topology (see `testkit`): the pod owns 10.77.0.2/fd77::2 on `eth0` and 10.77.1.2/fd77:1::2
//! on `eth1`, plus `::6` on `lo`; the peer (10.77.0.1/fd77::1 and 10.77.1.1/fd77:1::1) owns the
//! "remote" addresses below; 10.88.0.8/fd88::8 is remote and routed through `eth1`; the foreign
//! addresses are owned by nobody (neither namespace forwards, and the peer has an IPv6
//! blackhole default route, so a packet for them that is not diverted is dropped silently:
//! `Timeout`); 127.0.0.53/::127.0.0.53 is a resolver address on the pod's `lo`. Listeners
//! answer on both sides with where the connection landed (incl. `SO_ORIGINAL_DST`); every pod
//! TCP listener is transparent; the agent's DNS socket (15053) belongs to the first proxy
//! UID/GID, as the conntrack-zone rules expect.
//!
//! Besides the outcome, a diverted connection's local address is checked ([`expected_local`]):
//! it tells NAT from TPROXY, and checks the REDIRECT target. What the verdict alone does not
//! say, and the test takes from the kernel's rules instead: REDIRECT at PREROUTING goes to the
//! input interface's primary address (the verdict's `to` is the destination address); and
//! with TPROXY and a reroute interface a packet is both tproxied (mangle) and redirected
//! (nat): it lands on the tproxy listener, as the verdict says, but with the NAT's local
//! address, which only the path shows.
//!
//! Flows deliberately left out of the generator (their outcome depends on more than the verdict):
//!
//! - UDP across the veth to a port nobody listens on: the answer is an ICMP port unreachable,
//!   which the kernel rate-limits per destination (a burst of 6), so the outcome flips between
//!   `Refused` and `Timeout` with the number of such probes, whatever the rules. No rule looks
//!   at UDP ports other than 53 and 15053, so UDP to listened ports loses nothing.
//! - TCP from `::1` to one of the pod's own global addresses (`fd77::2`): to a closed port the
//!   kernel's RST is lost (the reply to a loopback address is routed strictly through the
//!   interface the SYN was received on, which for a local address is its device, `eth0`, not
//!   `lo`), so it times out instead of being refused, whatever the rules. No rule tells `::1`
//!   from the pod's address as a source (only `::6` is matched), so nothing is lost; `::1`
//!   to `::1`/`::6`, `::6` to anything local, and IPv4 `127.0.0.1` to the pod address are drawn.
//! - Connections with a loopback source to a non-local destination (the kernel refuses the
//!   route, `EINVAL`), and `ct state established/invalid` packets (a probe only makes new
//!   connections): the `Drop` verdict (`drop_invalid`) is never drawn.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ipnet::{IpNet, Ipv4Net};
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use redirect_core::eval::{evaluate, CtState, Direction, Evaluation, Flow, Verdict};
use redirect_core::Ruleset;
use redirect_core::{CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection};
use redirect_model::{Action, Stage, L4};
use redirect_testkit::plan_with;
use redirect_testkit::{
    kernel_test, run_probes_report, From, Link, ListenerSpec, Outcome, Probe, ProbeReport, Side,
    Topology, TopologySpec,
};

/// Flows per config (per topology).
const FLOWS_PER_CONFIG: usize = 16;
/// Flow cases of the default run.
const DEFAULT_CASES: usize = 512;
/// Shrink steps after a failure, by default.
const DEFAULT_SHRINK: u32 = 24;

// ---- The topology -------------------------------------------------------------------------

/// Remote addresses the peer owns, reached through the pod's default route (`eth0`). The first
/// is the DNS server of `DnsCapture::Servers`.
const REMOTES4: [Ipv4Addr; 5] = [
    Ipv4Addr::new(10, 96, 0, 10),
    Ipv4Addr::new(10, 1, 2, 3),
    Ipv4Addr::new(192, 168, 10, 20),
    Ipv4Addr::new(172, 16, 5, 5),
    Ipv4Addr::new(10, 77, 0, 1),
];
const REMOTES6: [Ipv6Addr; 4] = [
    Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 0, 0x10),
    Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 2, 3),
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x20),
    Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1),
];
const DNS4: Ipv4Addr = REMOTES4[0];
const DNS6: Ipv6Addr = REMOTES6[0];
/// Remote addresses the peer owns, routed from the pod through `eth1`.
const VIA1_4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 8);
const VIA1_6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 8);
/// Addresses nobody owns (destinations of traffic arriving at the pod, e.g. KubeVirt's).
const FOREIGN4: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 96, 7, 7), Ipv4Addr::new(192, 0, 2, 9)];
const FOREIGN6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 7, 7),
    Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 9),
];
/// A resolver address on the pod's `lo`.
const LO_DNS4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
const LO_DNS6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0x7f00, 0x35);
/// An owner group given by name, which [`groups`] resolves to 3001.
const GROUP_NAME: &str = "mesh-apps";
const SIX4: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
const SIX6: Ipv6Addr = Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6);

/// Pod listeners besides Istio's capture ports (15001, 15006, 15008, 15053) and 53: the
/// application's, Istio's excluded ones, and the other capture ports some configs use.
const POD_APP_PORTS: [u16; 8] = [8080, 9080, 15020, 15021, 15090, 15101, 15106, 15009];
const PEER_TCP: [u16; 8] = [80, 443, 5432, 8443, 15008, 15020, 15021, 53];
const PEER_UDP: [u16; 2] = [53, 5353];

/// Destination ports per situation. Some have no listener on purpose (9080 and 15001 on the
/// peer, 15002 and 7777 in the pod).
const OUT_REMOTE_TCP: [u16; 10] = [80, 443, 5432, 8443, 53, 15008, 15020, 15021, 9080, 15001];
const OUT_REMOTE_UDP: [u16; 3] = [53, 53, 5353];
const OUT_LOCAL_TCP: [u16; 11] = [
    8080, 9080, 15002, 15008, 15021, 15006, 53, 7777, 15001, 15020, 15009,
];
const OUT_SIX_TCP: [u16; 6] = [15002, 15002, 15002, 8080, 15008, 53];
const OUT_RESOLVER: [u16; 4] = [53, 53, 53, 15053];
const OUT_LOCAL_UDP: [u16; 4] = [53, 53, 15053, 7777];
const IN_TCP: [u16; 12] = [
    8080, 9080, 15008, 15020, 15021, 15090, 7777, 53, 15001, 15006, 15009, 15106,
];
const IN_UDP: [u16; 2] = [53, 15053];

/// Who listens where (the same lists the topology opens).
struct Listeners {
    pod: ListenerSpec,
    peer: ListenerSpec,
}

impl Listeners {
    fn for_config(cfg: &CaptureConfig) -> Listeners {
        let mut pod = ListenerSpec::pod(&POD_APP_PORTS);
        // The agent's DNS socket belongs to the proxy: the raw-table rules put its replies into
        // the app's conntrack zone by owner, and only then are they un-NATed.
        pod.dns_proxy_owner = Some((cfg.proxy_uids[0], cfg.proxy_gids[0]));
        let peer = ListenerSpec {
            tcp: PEER_TCP.to_vec(),
            udp: PEER_UDP.to_vec(),
            transparent: false,
            dns_proxy_owner: None,
        };
        Listeners { pod, peer }
    }

    fn spec(&self) -> TopologySpec {
        let mut remote_addrs: Vec<IpAddr> = REMOTES4.iter().map(|a| IpAddr::V4(*a)).collect();
        remote_addrs.extend(REMOTES6.iter().map(|a| IpAddr::V6(*a)));
        // The peer's own link addresses are its already.
        remote_addrs.retain(|a| *a != IpAddr::V4(REMOTES4[4]) && *a != IpAddr::V6(REMOTES6[3]));
        TopologySpec {
            extra_ifaces: vec!["eth1".into()],
            remote_addrs,
            remote_via: vec![
                (VIA1_4.into(), "eth1".into()),
                (VIA1_6.into(), "eth1".into()),
            ],
            // `kernel::capture::apply` adds `::6` with IPv6 capture only; having it always lets the
            // generator bind to it and send to it whatever the config.
            pod_lo_addrs: vec![SIX6.into(), LO_DNS6.into()],
            pod_listeners: self.pod.clone(),
            peer_listeners: self.peer.clone(),
        }
    }

    fn listens(&self, side: Side, proto: L4, port: u16) -> bool {
        let spec = match side {
            Side::Pod => &self.pod,
            Side::Peer => &self.peer,
        };
        match proto {
            L4::Tcp => spec.tcp.contains(&port),
            L4::Udp => spec.udp.contains(&port),
        }
    }

    /// TPROXY hands connections only to transparent TCP sockets.
    fn transparent(&self, port: u16) -> bool {
        self.pod.transparent && self.pod.tcp.contains(&port)
    }
}

/// Where a packet that nothing diverts ends up: the namespace owning its destination, or
/// nowhere (a foreign address: neither namespace forwards; it is dropped silently).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Owner(Side),
    Nowhere,
}

fn place_of(dst: IpAddr) -> Place {
    let pod_owned = dst.is_loopback()
        || dst == IpAddr::V6(SIX6)
        || dst == IpAddr::V6(LO_DNS6)
        || ["eth0", "eth1"]
            .iter()
            .any(|i| [false, true].iter().any(|&v6| dst == iface_addr(i, v6)));
    let peer_owned = REMOTES4.iter().any(|a| dst == IpAddr::V4(*a))
        || REMOTES6.iter().any(|a| dst == IpAddr::V6(*a))
        || dst == IpAddr::V4(VIA1_4)
        || dst == IpAddr::V6(VIA1_6)
        || ["eth0", "eth1"]
            .iter()
            .any(|i| [false, true].iter().any(|&v6| dst == peer_end(i, v6)));
    if pod_owned {
        Place::Owner(Side::Pod)
    } else if peer_owned {
        Place::Owner(Side::Peer)
    } else {
        Place::Nowhere
    }
}

/// The link of a pod interface (`eth0` is link 0, `eth1` link 1).
fn link(iface: &str) -> Link {
    match iface {
        "eth0" => Link::nth(0, "eth0"),
        "eth1" => Link::nth(1, "eth1"),
        other => panic!("no pod interface {other}"),
    }
}

/// The pod's address on `iface`: the one the kernel's REDIRECT at PREROUTING picks (the
/// primary address of the input interface, of the packet's family).
fn iface_addr(iface: &str, v6: bool) -> IpAddr {
    link(iface).pod_addr(v6)
}

/// The peer's end of the link of a pod interface: the source of what it sends that way.
fn peer_end(iface: &str, v6: bool) -> IpAddr {
    link(iface).peer_addr(v6)
}

// ---- What the verdict predicts ------------------------------------------------------------

/// The local address the accepted socket should have where the flow lands:
///
/// - `Redirect` at OUTPUT: `to` (the loopback address); at PREROUTING the kernel NATs to the
///   primary address of the input interface, which is not the destination when the packet
///   arrives on another interface than the one owning it, or is for a foreign address (the
///   evaluator's `to` says the destination address then).
/// - `Tproxy`: the original destination, as TPROXY only assigns the socket; but when a nat
///   REDIRECT matched on the same path (a reroute interface in TPROXY mode: mangle tproxies,
///   then nat redirects to the outbound port), the kernel does both: the connection lands on
///   the tproxy listener (the verdict) with the NAT's address, which the verdict does not
///   carry; the path does.
/// - `Pass`, `Drop`: the destination.
fn expected_local(e: &Evaluation, rs: &Ruleset) -> SocketAddr {
    let flow = &e.flow;
    let nat = |to: SocketAddr| match (flow.direction, flow.iif.as_deref()) {
        (Direction::In, Some(iif)) => SocketAddr::new(iface_addr(iif, to.is_ipv6()), to.port()),
        _ => to,
    };
    match &e.verdict {
        Verdict::Redirect { to, .. } => nat(*to),
        Verdict::Tproxy { .. } => match nat_redirect_on_path(rs, e) {
            Some(port) => nat(SocketAddr::new(flow.dst.ip(), port)),
            None => flow.dst,
        },
        Verdict::Pass | Verdict::Drop => flow.dst,
    }
}

/// The port of a nat REDIRECT rule the packet matched on its way, if any.
fn nat_redirect_on_path(rs: &Ruleset, e: &Evaluation) -> Option<u16> {
    e.path().filter(|s| s.stage == Stage::Nat).find_map(|s| {
        let rule = rs
            .chain(s.family, s.stage, &s.chain)?
            .rules
            .get(s.position - 1)?;
        match rule.action {
            Action::Redirect(port) => Some(port),
            _ => None,
        }
    })
}

/// `Outcome::Landed` as the probe normalises it: TCP carries the original destination when
/// `SO_ORIGINAL_DST` (conntrack's original tuple: what the client asked for) differs from the
/// accepted socket's local address, or else the local address when its port is not the
/// listener's (TPROXY); UDP reports no original destination.
fn landed(side: Side, proto: L4, port: u16, asked: SocketAddr, local: SocketAddr) -> Outcome {
    let orig = match proto {
        L4::Udp => None,
        L4::Tcp if asked != local => Some(asked),
        L4::Tcp if local.port() != port => Some(local),
        L4::Tcp => None,
    };
    Outcome::landed(side, port, orig)
}

/// Where the kernel should put `flow` given the evaluator's `verdict`:
///
/// - `Redirect{port}`: on the pod's listener on `port` (of the flow's protocol), with the
///   original destination; refused without one.
/// - `Tproxy{port}`: on the pod's transparent TCP listener on `port`; dropped (timeout)
///   without one.
/// - `Pass`: where the destination is owned: the listener on the destination port of that side,
///   refused without one; a timeout for a foreign address.
/// - `Drop`: a timeout.
///
/// `local` is the accepted socket's expected local address ([`expected_local`]), which decides
/// the `orig` the probe reports.
fn expected_outcome(
    verdict: &Verdict,
    flow: &Flow,
    local: SocketAddr,
    listeners: &Listeners,
) -> Outcome {
    let asked = flow.dst;
    match verdict {
        Verdict::Redirect { port, .. } => {
            if !listeners.listens(Side::Pod, flow.proto, *port) {
                return Outcome::Refused;
            }
            landed(Side::Pod, flow.proto, *port, asked, local)
        }
        Verdict::Tproxy { port, .. } => {
            if flow.proto == L4::Tcp && listeners.transparent(*port) {
                landed(Side::Pod, flow.proto, *port, asked, local)
            } else {
                Outcome::Timeout
            }
        }
        Verdict::Pass => match place_of(asked.ip()) {
            Place::Owner(side) if listeners.listens(side, flow.proto, asked.port()) => {
                landed(side, flow.proto, asked.port(), asked, asked)
            }
            Place::Owner(_) => Outcome::Refused,
            Place::Nowhere => Outcome::Timeout,
        },
        Verdict::Drop => Outcome::Timeout,
    }
}

// ---- Random configs -----------------------------------------------------------------------

/// The group database of the tests: [`GROUP_NAME`] is 3001, nothing else has a name.
fn groups(name: &str) -> Option<u32> {
    (name == GROUP_NAME).then_some(3001)
}

fn cidr(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// CIDRs for include and exclude lists: around the remote, foreign and pod addresses, and some
/// that hold none of them. Lists of several become sets.
fn cidr_pool() -> Vec<IpNet> {
    [
        "10.0.0.0/8",
        "10.96.0.0/12",
        "10.96.0.10/32",
        "10.1.0.0/16",
        "192.168.0.0/16",
        "172.16.0.0/12",
        "10.77.0.0/16",
        "10.88.0.0/16",
        "192.0.2.0/24",
        "198.51.100.0/24",
        "fd00::/8",
        "fd96::/16",
        "fd01::/16",
        "2001:db8::/32",
        "fd88::/16",
        "fd77::/16",
        "fd99::/16",
        "2001:db8:ffff::/48",
    ]
    .iter()
    .map(|s| cidr(s))
    .collect()
}

/// `list` plus 300 CIDRs per family that hold no address of the topology (100.64.0.0/10,
/// fd42::/16): long enough that the lists are lowered to hash sets per prefix length
/// (`nft::MASKED_MIN_CIDRS`), so the pool's CIDRs are matched through them.
fn with_filler(mut list: Vec<IpNet>) -> Vec<IpNet> {
    for i in 0..300u32 {
        // Every other /24 and /32, so nothing merges into one range.
        list.push(IpNet::new(Ipv4Addr::from(0x6440_0000 + (i << 9)).into(), 24).unwrap());
        list.push(
            IpNet::new(
                Ipv6Addr::from((0xfd42u128 << 112) + (u128::from(i) << 97)).into(),
                32,
            )
            .unwrap(),
        );
    }
    list
}

/// A port list made long enough for the nft backend's long forms (see `table::port_form`):
/// each listed port opens a run of the next three (so a tested port is the first port of a
/// range, and some of its neighbours join it), then 300 more ports from 40000: every other
/// port (`merging` false: nothing merges, the hashed form) or runs of three with a gap
/// (`merging` true: the interval form).
fn with_port_filler(list: Vec<u16>, merging: bool) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::new();
    let runs = list
        .iter()
        .flat_map(|&p| (0..4).map(move |i| p.saturating_add(i)));
    let filler = (0..300u16).map(move |i| match merging {
        false => 40000 + 2 * i,
        true => 40000 + 4 * (i / 3) + i % 3,
    });
    for p in runs.chain(filler) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// Ports from `pool`, sometimes padded into a long list (`with_port_filler`).
fn port_list(
    pool: &'static [u16],
    len: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<u16>> {
    prop_oneof![
        4 => subsequence(pool, len.clone()),
        1 => (subsequence(pool, len), any::<bool>())
            .prop_map(|(list, merging)| with_port_filler(list, merging)),
    ]
}

fn port_selection(pool: &'static [u16]) -> impl Strategy<Value = Selection<u16>> {
    prop_oneof![
        3 => Just(Selection::All),
        2 => subsequence(pool, 1..=pool.len()).prop_map(Selection::List),
        1 => (subsequence(pool, 1..=pool.len()), any::<bool>())
            .prop_map(|(l, merging)| Selection::List(with_port_filler(l, merging))),
        1 => Just(Selection::List(Vec::new())),
    ]
}

fn id_list(options: Vec<Vec<u32>>) -> impl Strategy<Value = Vec<u32>> {
    select(options)
}

fn config() -> impl Strategy<Value = CaptureConfig> {
    static INBOUND: [u16; 7] = [8080, 9080, 15008, 15020, 7777, 53, 15001];
    static INBOUND_EXCLUDE: [u16; 5] = [15090, 15021, 15020, 9080, 8080];
    static OUT_INCLUDE_PORTS: [u16; 4] = [5432, 8443, 443, 15021];
    static OUT_EXCLUDE_PORTS: [u16; 6] = [15020, 443, 53, 5353, 8443, 15008];
    let pool = cidr_pool();
    let include = prop_oneof![
        4 => Just(Selection::All),
        3 => subsequence(pool.clone(), 1..=6).prop_map(Selection::List),
        1 => subsequence(pool.clone(), 1..=4).prop_map(|l| Selection::List(with_filler(l))),
        1 => Just(Selection::List(Vec::new())),
        // An include CIDR that is a loopback address drops the "app on loopback" RETURN.
        1 => subsequence(pool.clone(), 0..=2).prop_map(|mut l| {
            l.push(cidr("127.0.0.6/32"));
            Selection::List(l)
        }),
    ];
    let exclude = prop_oneof![
        3 => Just(Vec::new()),
        2 => subsequence(pool.clone(), 1..=3),
        1 => subsequence(pool.clone(), 4..=10),
        1 => subsequence(pool.clone(), 1..=4).prop_map(with_filler),
    ];
    let ports = (
        prop_oneof![
            Just(InterceptionMode::Redirect),
            Just(InterceptionMode::Tproxy)
        ],
        port_selection(&INBOUND),
        port_list(&INBOUND_EXCLUDE, 0..=INBOUND_EXCLUDE.len()),
        port_list(&OUT_INCLUDE_PORTS, 0..=OUT_INCLUDE_PORTS.len()),
        port_list(&OUT_EXCLUDE_PORTS, 0..=3),
    );
    let ids = (
        // Root (0) owns the pod's listeners: as the proxy, their replies are "the proxy's".
        id_list(vec![
            vec![1337],
            vec![1337, 1500],
            vec![1500, 1337],
            vec![1500],
            vec![0],
        ]),
        id_list(vec![
            vec![1337],
            vec![1337, 1600],
            vec![1600],
            vec![1500],
            vec![0],
        ]),
        id_list(vec![vec![], vec![4000]]),
        id_list(vec![vec![], vec![4100]]),
        prop_oneof![
            4 => Just((Selection::All, Vec::new())),
            1 => Just((Selection::All, vec![GroupRef::Id(3001)])),
            1 => Just((Selection::All, vec![GroupRef::Name(GROUP_NAME.into())])),
            1 => Just((Selection::List(vec![GroupRef::Id(3001)]), Vec::new())),
            1 => Just((Selection::List(vec![GroupRef::Name(GROUP_NAME.into())]), Vec::new())),
            1 => Just((Selection::List(vec![GroupRef::Id(3001), GroupRef::Id(1000)]), Vec::new())),
        ],
    );
    let dns = prop_oneof![
        2 => Just(DnsCapture::Off),
        2 => Just(DnsCapture::All),
        1 => Just(DnsCapture::Servers { v4: vec![DNS4], v6: vec![] }),
        1 => Just(DnsCapture::Servers { v4: vec![DNS4], v6: vec![DNS6] }),
        1 => Just(DnsCapture::Servers { v4: vec![], v6: vec![DNS6] }),
        1 => Just(DnsCapture::Servers { v4: vec![], v6: vec![] }),
        // A resolver on the pod's loopback (systemd-resolved style).
        1 => Just(DnsCapture::Servers { v4: vec![LO_DNS4], v6: vec![LO_DNS6] }),
        1 => Just(DnsCapture::Servers { v4: vec![DNS4, LO_DNS4], v6: vec![] }),
    ];
    // (exclude_interfaces, reroute_interfaces)
    let ifaces = prop_oneof![
        3 => Just((vec![], vec![])),
        2 => Just((vec!["eth1"], vec![])),
        2 => Just((vec![], vec!["eth1"])),
        1 => Just((vec!["eth0"], vec![])),
        1 => Just((vec!["eth1"], vec!["eth1"])),
        1 => Just((vec!["lo"], vec![])),
        1 => Just((vec![], vec!["eth0"])),
    ];
    // (envoy_port, inbound_capture_port, inbound_tunnel_port, tproxy_mark, tproxy_route_table)
    let capture = prop_oneof![
        3 => Just((15001, 15006, 15008, 1337, 133)),
        1 => Just((15101, 15106, 15009, 0x400, 150)),
    ];
    let misc = (
        capture,
        dns,
        any::<bool>(),
        any::<bool>(),
        ifaces,
        prop_oneof![
            4 => Just(Ipv4Net::new(Ipv4Addr::LOCALHOST, 32).unwrap()),
            1 => Just(Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).unwrap()),
        ],
    );
    (ports, (include, exclude), ids, misc).prop_map(
        |(
            (mode, inbound, inbound_exclude, out_include_ports, out_exclude_ports),
            (include, exclude),
            (uids, gids, bypass_uids, bypass_gids, (groups_include, groups_exclude)),
            (
                (envoy_port, inbound_capture_port, inbound_tunnel_port, tproxy_mark, table),
                dns,
                drop_invalid,
                ipv6,
                (exclude_ifaces, reroute_ifaces),
                lo_cidr,
            ),
        )| {
            let cfg = CaptureConfig {
                envoy_port,
                inbound_capture_port,
                inbound_tunnel_port,
                tproxy_mark,
                tproxy_route_table: table,
                mode,
                inbound_ports: inbound,
                inbound_exclude_ports: inbound_exclude,
                outbound_include_cidrs: include,
                outbound_exclude_cidrs: exclude,
                outbound_include_ports: out_include_ports,
                outbound_exclude_ports: out_exclude_ports,
                proxy_uids: uids,
                proxy_gids: gids,
                bypass_uids,
                bypass_gids,
                owner_groups_include: groups_include,
                owner_groups_exclude: groups_exclude,
                dns,
                drop_invalid,
                ipv6,
                exclude_interfaces: exclude_ifaces.iter().map(|s| s.to_string()).collect(),
                reroute_interfaces: reroute_ifaces.iter().map(|s| s.to_string()).collect(),
                ipv4_loopback_cidr: lo_cidr,
                // About half the draws count (counters change no verdict), from two drawn bits.
                counters: drop_invalid != ipv6,
            };
            cfg.validate().unwrap_or_else(|e| {
                panic!(
                    "the generator drew an invalid config: {e}\n{}",
                    cfg.to_json()
                )
            });
            cfg
        },
    )
}

// ---- Random flows -------------------------------------------------------------------------

/// Where an `out` flow goes.
#[derive(Clone, Copy, Debug)]
enum OutDst {
    /// A remote address the peer owns (index into the family's list; 0 is the DNS server).
    Remote(usize),
    /// The remote address routed through `eth1`.
    Via1,
    /// The pod's own `eth0` / `eth1` address (over `lo`).
    PodEth0,
    PodEth1,
    /// 127.0.0.1 / ::1.
    Loopback,
    /// 127.0.0.6 / ::6 (the validation probe's target).
    Six,
    /// The resolver on the pod's `lo`: 127.0.0.53 / ::127.0.0.53.
    LoResolver,
    /// An address nobody owns (routed to the peer, which drops it).
    Foreign(usize),
}

/// The source an `out` flow binds to (local destinations only).
#[derive(Clone, Copy, Debug)]
enum Bind {
    Kernel,
    Loopback,
    Six,
}

/// Where an `in` flow goes.
#[derive(Clone, Copy, Debug)]
enum InDst {
    PodEth0,
    PodEth1,
    Foreign(usize),
}

/// A flow before it is tied to addresses: shrinks field by field.
#[derive(Clone, Debug)]
enum FlowSpec {
    Out {
        udp: bool,
        v6: bool,
        uid: u32,
        /// `None`: the same as the uid.
        gid: Option<u32>,
        dst: OutDst,
        port: usize,
        bind: Bind,
    },
    In {
        udp: bool,
        v6: bool,
        via_eth1: bool,
        dst: InDst,
        port: usize,
    },
}

fn flow_spec() -> impl Strategy<Value = FlowSpec> {
    let out_dst = prop_oneof![
        5 => (0..REMOTES4.len()).prop_map(OutDst::Remote),
        2 => Just(OutDst::Remote(0)),
        1 => Just(OutDst::Via1),
        3 => Just(OutDst::PodEth0),
        1 => Just(OutDst::PodEth1),
        2 => Just(OutDst::Loopback),
        3 => Just(OutDst::Six),
        1 => Just(OutDst::LoResolver),
        1 => (0..2usize).prop_map(OutDst::Foreign),
    ];
    let bind =
        prop_oneof![3 => Just(Bind::Kernel), 1 => Just(Bind::Loopback), 1 => Just(Bind::Six)];
    // Proxy UIDs 1337, 1500 and 0, GIDs 1337, 1600, 1500 and 0 (see `config`), the app 1000,
    // bypass UID 4000 and GID 4100, owner group 3001.
    let uid = select(vec![1337u32, 1500, 1000, 1000, 1000, 0, 4000]);
    let gid = prop_oneof![
        3 => Just(None),
        2 => select(vec![1337u32, 1600, 1000, 0, 4100, 3001]).prop_map(Some),
    ];
    let out = (
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.3),
        uid,
        gid,
        out_dst,
        0..64usize,
        bind,
    )
        .prop_map(|(udp, v6, uid, gid, dst, port, bind)| FlowSpec::Out {
            udp,
            v6,
            uid,
            gid,
            dst,
            port,
            bind,
        });
    let in_dst = prop_oneof![
        3 => Just(InDst::PodEth0),
        1 => Just(InDst::PodEth1),
        1 => (0..2usize).prop_map(InDst::Foreign),
    ];
    let inbound = (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.35),
        in_dst,
        0..64usize,
    )
        .prop_map(|(udp, v6, via_eth1, dst, port)| FlowSpec::In {
            udp,
            v6,
            via_eth1,
            dst,
            port,
        });
    prop_oneof![3 => out, 2 => inbound]
}

/// One flow tied to the topology: what the evaluator gets and what the probe does.
struct Case {
    flow: Flow,
    probe: Probe,
}

fn pick(pool: &[u16], i: usize) -> u16 {
    pool[i % pool.len()]
}

/// The source address the kernel picks for a socket bound to `bind` (or unbound) connecting to
/// `dst` inside the pod: a connected UDP socket takes the same route lookup as a TCP connect.
fn kernel_source(topo: &Topology, dst: SocketAddr, bind: Option<IpAddr>) -> IpAddr {
    topo.pod.run(|| {
        let local = bind.unwrap_or(if dst.is_ipv6() {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        });
        let s = UdpSocket::bind(SocketAddr::new(local, 0))
            .unwrap_or_else(|e| panic!("bind {local} in the pod: {e}"));
        s.connect(dst)
            .unwrap_or_else(|e| panic!("route from {local} to {dst} in the pod: {e}"));
        s.local_addr().expect("local address").ip()
    })
}

fn resolve(spec: &FlowSpec, topo: &Topology) -> Case {
    let ip = |v6: bool, a4: Ipv4Addr, a6: Ipv6Addr| -> IpAddr {
        if v6 {
            a6.into()
        } else {
            a4.into()
        }
    };
    match *spec {
        FlowSpec::Out {
            udp,
            v6,
            uid,
            gid,
            dst,
            port,
            bind,
        } => {
            let gid = gid.unwrap_or(uid);
            let via1 = matches!(dst, OutDst::Via1);
            let addr = match dst {
                OutDst::Remote(i) => {
                    if v6 {
                        IpAddr::V6(REMOTES6[i % REMOTES6.len()])
                    } else {
                        IpAddr::V4(REMOTES4[i % REMOTES4.len()])
                    }
                }
                OutDst::Via1 => ip(v6, VIA1_4, VIA1_6),
                OutDst::PodEth0 => iface_addr("eth0", v6),
                OutDst::PodEth1 => iface_addr("eth1", v6),
                OutDst::Loopback => ip(v6, Ipv4Addr::LOCALHOST, Ipv6Addr::LOCALHOST),
                OutDst::Six => ip(v6, SIX4, SIX6),
                OutDst::LoResolver => ip(v6, LO_DNS4, LO_DNS6),
                OutDst::Foreign(i) => ip(v6, FOREIGN4[i % 2], FOREIGN6[i % 2]),
            };
            let local_dst = place_of(addr) == Place::Owner(Side::Pod);
            let port = match (udp, local_dst) {
                // Mostly the validation probe's port, to the validation probe's target.
                (false, true) if matches!(dst, OutDst::Six) => pick(&OUT_SIX_TCP, port),
                (_, true) if matches!(dst, OutDst::LoResolver) => pick(&OUT_RESOLVER, port),
                (false, false) => pick(&OUT_REMOTE_TCP, port),
                (true, false) => pick(&OUT_REMOTE_UDP, port),
                (false, true) => pick(&OUT_LOCAL_TCP, port),
                (true, true) => pick(&OUT_LOCAL_UDP, port),
            };
            // A loopback source works for local destinations only (the kernel refuses the
            // route otherwise). TCP from ::1 to the pod's own global address is left out: see
            // the header.
            let v6_lo_to_global = v6 && !udp && matches!(dst, OutDst::PodEth0 | OutDst::PodEth1);
            let bind_src = match (bind, local_dst) {
                (Bind::Loopback, true) if v6_lo_to_global => None,
                (Bind::Loopback, true) => Some(ip(v6, Ipv4Addr::LOCALHOST, Ipv6Addr::LOCALHOST)),
                (Bind::Six, true) => Some(ip(v6, SIX4, SIX6)),
                _ => None,
            };
            let dst = SocketAddr::new(addr, port);
            let oif = if local_dst {
                "lo"
            } else if via1 {
                "eth1"
            } else {
                "eth0"
            };
            let src = kernel_source(topo, dst, bind_src);
            let from = From::Pod { uid, gid };
            let mut probe = if udp {
                Probe::udp(from, dst)
            } else {
                Probe::tcp(from, dst)
            };
            probe.bind_src = bind_src;
            let flow = Flow {
                direction: Direction::Out,
                proto: if udp { L4::Udp } else { L4::Tcp },
                dst,
                src: Some(src),
                sport: None,
                uid: Some(uid),
                gid: Some(gid),
                iif: None,
                oif: Some(oif.to_string()),
                mark: 0,
                ct: CtState::New,
            };
            Case { flow, probe }
        }
        FlowSpec::In {
            udp,
            v6,
            via_eth1,
            dst,
            port,
        } => {
            let iface = if via_eth1 { "eth1" } else { "eth0" };
            let addr = match dst {
                InDst::PodEth0 => iface_addr("eth0", v6),
                InDst::PodEth1 => iface_addr("eth1", v6),
                InDst::Foreign(i) => ip(v6, FOREIGN4[i % 2], FOREIGN6[i % 2]),
            };
            let port = if udp {
                pick(&IN_UDP, port)
            } else {
                pick(&IN_TCP, port)
            };
            let dst = SocketAddr::new(addr, port);
            let from = From::PeerVia(iface.to_string());
            let probe = if udp {
                Probe::udp(from, dst)
            } else {
                Probe::tcp(from, dst)
            };
            let flow = Flow {
                direction: Direction::In,
                proto: if udp { L4::Udp } else { L4::Tcp },
                dst,
                src: Some(peer_end(iface, v6)),
                sport: None,
                uid: None,
                gid: None,
                iif: Some(iface.to_string()),
                oif: None,
                mark: 0,
                ct: CtState::New,
            };
            Case { flow, probe }
        }
    }
}

// ---- One case -----------------------------------------------------------------------------

#[derive(Default)]
struct Stats {
    configs: usize,
    flows: usize,
    verdicts: BTreeMap<String, usize>,
    outcomes: BTreeMap<String, usize>,
}

fn verdict_kind(v: &Verdict) -> &'static str {
    match v {
        Verdict::Redirect { .. } => "redirect",
        Verdict::Tproxy { .. } => "tproxy",
        Verdict::Pass => "pass",
        Verdict::Drop => "drop",
    }
}

fn outcome_kind(o: &Outcome) -> String {
    match o {
        Outcome::Landed { side, .. } => format!("landed on {side}"),
        Outcome::Refused => "refused".into(),
        Outcome::Timeout => "timeout".into(),
        Outcome::Unreachable => "unreachable".into(),
        Outcome::Other(_) => "other".into(),
    }
}

fn explain(
    case: &Case,
    e: &Evaluation,
    want: &Outcome,
    got: &ProbeReport,
    problem: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "---- {problem}");
    let _ = writeln!(s, "flow:     {}", case.flow);
    let _ = writeln!(s, "probe:    {}", case.probe);
    let _ = writeln!(s, "verdict:  {} ({:?})", e.verdict, e.verdict);
    let _ = writeln!(s, "mark:     {:#x}, ct zone: {:?}", e.mark, e.ct_zone);
    let _ = writeln!(s, "path:");
    for step in e.path() {
        let _ = writeln!(s, "    {step}");
    }
    if e.path().next().is_none() {
        let _ = writeln!(s, "    (no rule matched)");
    }
    for n in &e.notes {
        let _ = writeln!(s, "note:     {n}");
    }
    let _ = writeln!(s, "expected: {want}");
    let _ = writeln!(s, "kernel:   {}", got.outcome);
    let _ = writeln!(
        s,
        "report:   local={:?} SO_ORIGINAL_DST={:?} line={:?}",
        got.local, got.raw_orig, got.line
    );
    s
}

/// One config's flows, evaluated and sent.
struct Run {
    rs: Ruleset,
    listeners: Listeners,
    cases: Vec<Case>,
    evals: Vec<Evaluation>,
    reports: Vec<ProbeReport>,
}

/// Builds a fresh topology for `cfg`, applies our rules in the pod, evaluates every flow on
/// the planned ruleset and sends it.
fn run_flows(cfg: &CaptureConfig, specs: &[FlowSpec]) -> Result<Run, String> {
    let rs = plan_with(cfg, &groups).map_err(|e| format!("plan: {e}\n{}", cfg.to_json()))?;
    let listeners = Listeners::for_config(cfg);
    let topo = Topology::new(&listeners.spec());
    // The peer has no route for foreign addresses: IPv4 then drops silently (no forwarding),
    // IPv6 answers "no route", which a connecting TCP socket takes as a soft error (RFC 5461)
    // and reports or not depending on timing. A blackhole drops them silently in both.
    topo.peer
        .ip_batch(true, &["route add blackhole default".to_string()]);
    redirect_core::Namespace::open(topo.pod.path())
        .and_then(|pod| {
            Ok(redirect_kernel::capture::apply_in(
                pod.backend(),
                redirect_core::view::TABLE,
                &redirect_core::sidecar_routes(cfg),
                &rs,
            )?)
        })
        .map_err(|e| format!("apply: {e}\n{}", cfg.to_json()))?;
    let cases: Vec<Case> = specs.iter().map(|s| resolve(s, &topo)).collect();
    let evals: Vec<Evaluation> = cases.iter().map(|c| evaluate(&rs, &c.flow)).collect();
    let probes: Vec<Probe> = cases.iter().map(|c| c.probe.clone()).collect();
    let reports = run_probes_report(&topo, &probes);
    Ok(Run {
        rs,
        listeners,
        cases,
        evals,
        reports,
    })
}

/// What is wrong with one flow's landing, if anything.
/// What is wrong with one flow's landing, if anything. Besides the outcome, the local address
/// of a diverted connection tells NAT from TPROXY and checks the redirect's address.
fn disagreement(
    e: &Evaluation,
    got: &ProbeReport,
    want: &Outcome,
    want_local: SocketAddr,
) -> Option<String> {
    if &got.outcome != want {
        return Some("the kernel disagrees with the evaluator".into());
    }
    if !matches!(e.verdict, Verdict::Redirect { .. } | Verdict::Tproxy { .. }) {
        return None;
    }
    match got.local {
        Some(local) if local != want_local => Some(format!(
            "landed where expected, but on local address {local}, not {want_local}"
        )),
        _ => None,
    }
}

/// Sends `specs` through a fresh pod programmed for `cfg` and compares every landing with the
/// verdict. Flows that disagree are sent once more, alone, in another fresh pod, to tell a
/// property of the flow from an interaction between flows.
fn check_case(
    cfg: &CaptureConfig,
    specs: &[FlowSpec],
    stats: &RefCell<Stats>,
) -> Result<(), String> {
    let run = run_flows(cfg, specs)?;
    let verbose = std::env::var("REDIRECT_EVAL_VERBOSE").is_ok_and(|v| v == "1");
    let mut failing = Vec::new();
    {
        let mut st = stats.borrow_mut();
        st.configs += 1;
        for (i, ((case, e), got)) in run
            .cases
            .iter()
            .zip(&run.evals)
            .zip(&run.reports)
            .enumerate()
        {
            st.flows += 1;
            *st.verdicts
                .entry(verdict_kind(&e.verdict).into())
                .or_default() += 1;
            *st.outcomes.entry(outcome_kind(&got.outcome)).or_default() += 1;
            let want_local = expected_local(e, &run.rs);
            let want = expected_outcome(&e.verdict, &case.flow, want_local, &run.listeners);
            if verbose {
                let last = e.path().last().map_or("-".to_string(), |s| s.to_string());
                eprintln!("  {} | {} | {} | {last}", case.flow, e.verdict, got.outcome);
            }
            if let Some(problem) = disagreement(e, got, &want, want_local) {
                failing.push((i, problem, want, want_local));
            }
        }
    }
    if failing.is_empty() {
        return Ok(());
    }
    let alone_specs: Vec<FlowSpec> = failing.iter().map(|f| specs[f.0].clone()).collect();
    let alone = run_flows(cfg, &alone_specs);
    let mut text = format!("{} of {} flows disagree:\n", failing.len(), specs.len());
    for (k, (i, problem, want, want_local)) in failing.iter().enumerate() {
        text += &explain(
            &run.cases[*i],
            &run.evals[*i],
            want,
            &run.reports[*i],
            problem,
        );
        match &alone {
            Ok(a) => {
                let again = &a.reports[k].outcome;
                let same = disagreement(&a.evals[k], &a.reports[k], want, *want_local).is_some();
                let _ = writeln!(
                    text,
                    "alone:    sent again alone in a fresh pod: {again} ({})",
                    if same {
                        "disagrees again"
                    } else {
                        "agrees: an interaction between flows?"
                    }
                );
            }
            Err(e) => {
                let _ = writeln!(text, "alone:    could not send it again: {e}");
            }
        }
    }
    let _ = write!(text, "config:\n{}", cfg.to_json());
    Err(text)
}

fn env_number<T: std::str::FromStr>(key: &str) -> Option<T> {
    let v = std::env::var(key).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={v:?}: expected a number")),
    )
}

/// 32 seed bytes for ChaCha from a u64 (splitmix64).
fn seed_bytes(seed: u64) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(32);
    for _ in 0..4 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out
}

#[kernel_test]
fn evaluator_agrees_with_the_kernel() {
    let cases: usize = env_number("REDIRECT_EVAL_CASES").unwrap_or(DEFAULT_CASES);
    let configs = cases.div_ceil(FLOWS_PER_CONFIG).max(1);
    let shrink: u32 = env_number("REDIRECT_EVAL_SHRINK").unwrap_or(DEFAULT_SHRINK);
    let seed: u64 = env_number("REDIRECT_EVAL_SEED").unwrap_or_else(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    });
    eprintln!(
        "eval_kernel: seed {seed}: {configs} configs x {FLOWS_PER_CONFIG} flows \
         (rerun with REDIRECT_EVAL_SEED={seed} REDIRECT_EVAL_CASES={cases})"
    );
    let run_config = Config {
        cases: configs as u32,
        failure_persistence: None,
        max_shrink_iters: shrink,
        max_shrink_time: 300_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        run_config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
    );
    let strategy = (
        config(),
        prop::collection::vec(flow_spec(), FLOWS_PER_CONFIG),
    );
    let stats = RefCell::new(Stats::default());
    let first_failure = RefCell::new(None::<String>);
    let started = Instant::now();
    let result = runner.run(&strategy, |(cfg, specs)| {
        check_case(&cfg, &specs, &stats).map_err(|msg| {
            first_failure
                .borrow_mut()
                .get_or_insert_with(|| msg.clone());
            TestCaseError::fail(msg)
        })
    });
    let st = stats.into_inner();
    eprintln!(
        "eval_kernel: {} configs, {} flows in {:.1}s; verdicts {:?}; outcomes {:?}",
        st.configs,
        st.flows,
        started.elapsed().as_secs_f64(),
        st.verdicts,
        st.outcomes
    );
    match result {
        Ok(()) => {}
        Err(TestError::Abort(why)) => panic!("eval_kernel aborted: {why} (seed {seed})"),
        Err(TestError::Fail(why, (_, specs))) => {
            let first = first_failure.into_inner().unwrap_or_default();
            panic!(
                "the evaluator and the kernel disagree (seed {seed}; rerun with \
                 REDIRECT_EVAL_SEED={seed} REDIRECT_EVAL_CASES={cases}).\n\n\
                 == first failing case, as drawn:\n{first}\n\n\
                 == the same after shrinking (a simpler config and flows that still fail; \
                 {} flows sent):\n{why}",
                specs.len(),
            );
        }
    }
}

/// The config generator alone, without the kernel: every config it draws is valid and plans.
#[test]
fn generated_configs_are_valid() {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 300,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    runner
        .run(&config(), |cfg| {
            cfg.validate()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            plan_with(&cfg, &groups).map_err(|e| TestCaseError::fail(e.to_string()))?;
            Ok(())
        })
        .unwrap();
}

/// `expected_outcome` on hand-picked flows of Istio's sidecar default (REDIRECT).
#[test]
fn expected_outcomes_by_hand() {
    let cfg = CaptureConfig::istio_sidecar_default();
    let listeners = Listeners::for_config(&cfg);
    let rs = plan_with(&cfg, &groups).unwrap();
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    let cases = [
        (
            "out tcp uid=1000 10.1.2.3:80 src=10.77.0.2 oif=eth0",
            Outcome::landed(Side::Pod, 15001, Some(sa("10.1.2.3:80"))),
        ),
        (
            "out tcp uid=1337 10.1.2.3:80 src=10.77.0.2 oif=eth0",
            Outcome::landed(Side::Peer, 80, None),
        ),
        (
            "out tcp uid=1337 10.1.2.3:9080 src=10.77.0.2 oif=eth0",
            Outcome::Refused,
        ),
        (
            "out tcp uid=1337 127.0.0.6:15002 src=127.0.0.1",
            Outcome::landed(Side::Pod, 15006, Some(sa("127.0.0.6:15002"))),
        ),
        (
            "out tcp uid=1000 127.0.0.6:15002 src=127.0.0.1",
            Outcome::Refused,
        ),
        (
            "in tcp 10.77.0.2:8080 src=10.77.1.1 iif=eth1",
            Outcome::landed(Side::Pod, 15006, Some(sa("10.77.0.2:8080"))),
        ),
        (
            "in tcp 10.77.0.2:15021 src=10.77.0.1",
            Outcome::landed(Side::Pod, 15021, None),
        ),
        (
            "in udp 10.77.0.2:53 src=10.77.0.1",
            Outcome::landed(Side::Pod, 53, None),
        ),
        ("in tcp 192.0.2.9:15021 src=10.77.0.1", Outcome::Timeout),
    ];
    for (text, want) in cases {
        let flow: Flow = text.parse().unwrap();
        let e = evaluate(&rs, &flow);
        assert_eq!(
            expected_outcome(&e.verdict, &e.flow, expected_local(&e, &rs), &listeners),
            want,
            "{text}: {}",
            e.verdict
        );
    }
    // A redirect to a port nobody listens on is refused; a drop times out.
    let flow: Flow = "in tcp 10.77.0.2:8080".parse().unwrap();
    let flow = flow.with_defaults();
    let to = sa("10.77.0.2:15999");
    let redirect = Verdict::Redirect { port: 15999, to };
    assert_eq!(
        expected_outcome(&redirect, &flow, to, &listeners),
        Outcome::Refused
    );
    assert_eq!(
        expected_outcome(&Verdict::Drop, &flow, flow.dst, &listeners),
        Outcome::Timeout
    );

    // TPROXY keeps the destination as the local address, unless nat also redirected it: with
    // a reroute interface in TPROXY mode, mangle tproxies to 15006 and nat then redirects to
    // 15001 at the interface's address; the connection lands on 15006 (the verdict) with the
    // NAT's local address.
    let cfg = CaptureConfig {
        mode: InterceptionMode::Tproxy,
        reroute_interfaces: vec!["eth1".into()],
        ..CaptureConfig::istio_sidecar_default()
    };
    let rs = plan_with(&cfg, &groups).unwrap();
    let tproxy = Verdict::Tproxy {
        port: 15006,
        mark: 1337,
    };
    let e = evaluate(&rs, &"in tcp 10.77.0.2:8080 iif=eth0".parse().unwrap());
    assert_eq!(e.verdict, tproxy);
    assert_eq!(expected_local(&e, &rs), sa("10.77.0.2:8080"));
    let e = evaluate(&rs, &"in tcp 10.77.0.2:8080 iif=eth1".parse().unwrap());
    assert_eq!(e.verdict, tproxy);
    assert_eq!(expected_local(&e, &rs), sa("10.77.1.2:15001"));
    assert_eq!(
        expected_outcome(&e.verdict, &e.flow, expected_local(&e, &rs), &listeners),
        Outcome::landed(Side::Pod, 15006, Some(sa("10.77.0.2:8080")))
    );
}
