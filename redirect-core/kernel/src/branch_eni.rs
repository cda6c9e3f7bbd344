//! kubelet's probes to pods behind an AWS branch ENI (EKS Security Groups for Pods), over
//! rtnetlink.
//!
//! With Security Groups for Pods, aws-vpc-cni gives a pod a VLAN of the node's trunk ENI: the
//! pod's veth and the VLAN interface share a routing table `T` (`iif <veth> lookup T`,
//! `iif vlan.eth.N lookup T`, and in `T` a host route to the pod through the veth and a default
//! route out of the VLAN). The main table has no route to the pod, so the node's own traffic to
//! it (kubelet's probes, SNATed to the link-local probe address) leaves through the VPC's
//! fabric, which drops it. Istio 1.31's node agent adds two rules per such pod
//! (`brancheni_linux.go`, `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`); these are the same rules:
//!
//! ```text
//! ip rule add to <pod> lookup T pref 512              # the probe goes through the veth
//! ip rule add iif <veth> lookup local pref <P - 1>    # its answer is delivered here, before
//!                                                     # aws-vpc-cni's `iif <veth>` rule (P)
//! ```
//!
//! Unlike Istio, which remembers in memory what it added, the rules we add carry a protocol of
//! their own ([`PROTOCOL`]), so that what is ours is read back from the kernel: a rule of ours
//! that no pod needs is removed, whoever's history it comes from (an agent restarted, a pod
//! deleted while the agent was down).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};
use netlink_packet_route::RouteNetlinkMessage;

use crate::routes::{address_family, check, header_table, route_error, Error, Rtnl};
use redirect_model::Family;

type Result<T, E = Error> = std::result::Result<T, E>;

/// The protocol (`ip rule ... protocol 157`) the rules we add carry: what tells them ours.
pub const PROTOCOL: u8 = 157;
/// The priority of the rule to the pod: aws-vpc-cni's own `to <pod> lookup main` for a pod on
/// a plain veth has it.
pub const TO_POD_PRIORITY: u32 = 512;
const MAIN_TABLE: u32 = 254;
const LOCAL_TABLE: u32 = 255;
/// Where the kernel says whether the node runs TCP's early demux: AWS asks for 0 on every node
/// with Security Groups for Pods, and the kernel's default is 1.
const EARLY_DEMUX: &str = "/proc/sys/net/ipv4/tcp_early_demux";

/// Whether `net.ipv4.tcp_early_demux` is 0 in the calling thread's network namespace: the sign,
/// as Istio takes it, that the node is set up for Security Groups for Pods. Unreadable is the
/// default (1).
pub fn early_demux_disabled() -> bool {
    std::fs::read(EARLY_DEMUX).is_ok_and(|v| v.first() == Some(&b'0'))
}

/// One of the two rules a branch-ENI pod needs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeRule {
    /// `to <pod> lookup <table> pref 512`: the node's traffic to the pod through its veth.
    ToPod {
        /// The pod's address.
        pod: IpAddr,
        /// aws-vpc-cni's table for the pod's VLAN.
        table: u32,
    },
    /// `iif <veth> lookup local pref <priority>`: the pod's answers delivered on the node.
    FromVeth {
        /// The family of the rule (the pod's address's).
        family: Family,
        /// The pod's veth on the node.
        veth: String,
        /// One below aws-vpc-cni's `iif <veth>` rule.
        priority: u32,
    },
}

impl fmt::Display for ProbeRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeRule::ToPod { pod, table } => {
                write!(f, "to {pod} lookup {table} pref {TO_POD_PRIORITY}")
            }
            ProbeRule::FromVeth {
                family,
                veth,
                priority,
            } => write!(f, "iif {veth} lookup local pref {priority} ({family})"),
        }
    }
}

impl ProbeRule {
    fn family(&self) -> Family {
        match self {
            ProbeRule::ToPod { pod, .. } => family_of(*pod),
            ProbeRule::FromVeth { family, .. } => *family,
        }
    }

    /// The rule as `ip rule add` would send it, with our protocol.
    fn message(&self) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header.family = address_family(self.family());
        m.header.action = RuleAction::ToTable;
        let proto = RuleAttribute::Protocol(RouteProtocol::from(PROTOCOL));
        m.attributes = match self {
            ProbeRule::ToPod { pod, table } => {
                m.header.dst_len = full_length(*pod);
                m.header.table = header_table(*table);
                vec![
                    RuleAttribute::Destination(*pod),
                    RuleAttribute::Table(*table),
                    RuleAttribute::Priority(TO_POD_PRIORITY),
                    proto,
                ]
            }
            ProbeRule::FromVeth { veth, priority, .. } => {
                m.header.table = header_table(LOCAL_TABLE);
                vec![
                    RuleAttribute::Iifname(veth.clone()),
                    RuleAttribute::Table(LOCAL_TABLE),
                    RuleAttribute::Priority(*priority),
                    proto,
                ]
            }
        };
        m
    }
}

/// A pod behind a branch ENI, as aws-vpc-cni laid it out on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchEni {
    /// The pod's address.
    pub pod: IpAddr,
    /// The table of the pod's VLAN.
    pub table: u32,
    /// The pod's veth on the node.
    pub veth: String,
    /// The priority of aws-vpc-cni's `iif <veth> lookup <table>` rule.
    pub iif_priority: u32,
}

impl BranchEni {
    /// The two rules that let the node's probes reach the pod and its answers come back.
    pub fn rules(&self) -> [ProbeRule; 2] {
        [
            ProbeRule::ToPod {
                pod: self.pod,
                table: self.table,
            },
            ProbeRule::FromVeth {
                family: family_of(self.pod),
                veth: self.veth.clone(),
                priority: self.iif_priority.saturating_sub(1),
            },
        ]
    }
}

/// What a [`ProbeRoutes::converge`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Rules that were missing, added.
    pub added: Vec<ProbeRule>,
    /// Rules of ours that no pod needs, removed (in words: one of ours may have any shape).
    pub removed: Vec<String>,
}

/// The calling thread's namespace's rules and routes, for the probes to branch-ENI pods.
pub struct ProbeRoutes {
    nl: RefCell<Rtnl>,
}

impl ProbeRoutes {
    /// A handle on the calling thread's network namespace.
    pub fn open() -> Result<ProbeRoutes> {
        Ok(ProbeRoutes {
            nl: RefCell::new(Rtnl::open()?),
        })
    }

    /// The pods of `pods` that sit behind a branch ENI: an `iif <dev> lookup T` rule (T neither
    /// main nor local) whose table holds a host route to the pod through that same `<dev>`.
    /// Plain veth pods have no `iif` rule, and cost one rule dump per family.
    pub fn detect(&self, pods: &[IpAddr]) -> Result<Vec<BranchEni>> {
        let nl = &mut *self.nl.borrow_mut();
        let mut found = Vec::new();
        for family in [Family::V4, Family::V6] {
            let pods: Vec<IpAddr> = pods
                .iter()
                .copied()
                .filter(|ip| family_of(*ip) == family)
                .collect();
            if pods.is_empty() {
                continue;
            }
            // Table -> (interface, priority) of each `iif` rule into it.
            let mut iif: BTreeMap<u32, Vec<(String, u32)>> = BTreeMap::new();
            for rule in nl.rules(family)? {
                if let Some((table, dev, priority)) = iif_rule(&rule) {
                    iif.entry(table).or_default().push((dev, priority));
                }
            }
            if iif.is_empty() {
                continue;
            }
            let mut names: Option<HashMap<u32, String>> = None;
            for route in nl.routes(family)? {
                let Some((table, dst, oif)) = host_route(&route) else {
                    continue;
                };
                let (Some(rules), true) = (iif.get(&table), pods.contains(&dst)) else {
                    continue;
                };
                if found.iter().any(|b: &BranchEni| b.pod == dst) {
                    continue;
                }
                if names.is_none() {
                    names = Some(link_names(nl, family)?);
                }
                let Some(dev) = names.as_ref().and_then(|n| n.get(&oif)) else {
                    continue;
                };
                if let Some((_, priority)) = rules
                    .iter()
                    .filter(|(name, _)| name == dev)
                    .min_by_key(|(_, p)| *p)
                {
                    found.push(BranchEni {
                        pod: dst,
                        table,
                        veth: dev.clone(),
                        iif_priority: *priority,
                    });
                }
            }
        }
        found.sort_by_key(|b| b.pod);
        Ok(found)
    }

    /// The rules of ours the kernel holds (those carrying [`PROTOCOL`]), in words.
    pub fn held(&self) -> Result<Vec<String>> {
        let nl = &mut *self.nl.borrow_mut();
        let mut held = Vec::new();
        for family in [Family::V4, Family::V6] {
            held.extend(
                nl.rules(family)?
                    .iter()
                    .filter(|m| is_ours(m))
                    .map(|m| words(m, family)),
            );
        }
        Ok(held)
    }

    /// Brings the namespace's rules to `want`: each missing one added (one already there
    /// without our protocol, someone else's, is taken as there), each of ours not wanted
    /// removed.
    pub fn converge(&self, want: &[ProbeRule]) -> Result<Changed> {
        let nl = &mut *self.nl.borrow_mut();
        let mut changed = Changed::default();
        for family in [Family::V4, Family::V6] {
            let rules = nl.rules(family)?;
            let present: Vec<Option<ProbeRule>> =
                rules.iter().map(|m| probe_rule(m, family)).collect();
            for rule in want.iter().filter(|r| r.family() == family) {
                if present.contains(&Some(rule.clone())) || changed.added.contains(rule) {
                    continue;
                }
                let errno = nl.ack(
                    RouteNetlinkMessage::NewRule(rule.message()),
                    NLM_F_CREATE | NLM_F_EXCL,
                )?;
                check(errno, &[libc::EEXIST], || {
                    route_error(format!("add rule {rule}"), family, errno)
                })?;
                changed.added.push(rule.clone());
            }
            for (m, parsed) in rules.into_iter().zip(present) {
                if !is_ours(&m) || parsed.as_ref().is_some_and(|r| want.contains(r)) {
                    continue;
                }
                let what = words(&m, family);
                // Sent back as dumped: that rule alone goes.
                let errno = nl.ack(RouteNetlinkMessage::DelRule(m), 0)?;
                check(errno, &[libc::ENOENT], || {
                    route_error(format!("delete rule {what}"), family, errno)
                })?;
                changed.removed.push(what);
            }
        }
        Ok(changed)
    }
}

fn family_of(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

fn full_length(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn link_names(nl: &mut Rtnl, family: Family) -> Result<HashMap<u32, String>> {
    let replies = nl.dump(
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        "list interfaces",
        family,
    )?;
    Ok(replies
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => l.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some((l.header.index, n.clone())),
                _ => None,
            }),
            _ => None,
        })
        .collect())
}

fn table_of(m: &RuleMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(m.header.table))
}

fn priority_of(m: &RuleMessage) -> u32 {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RuleAttribute::Priority(p) => Some(*p),
            _ => None,
        })
        .unwrap_or(0)
}

fn is_ours(m: &RuleMessage) -> bool {
    m.attributes
        .iter()
        .any(|a| matches!(a, RuleAttribute::Protocol(p) if u8::from(*p) == PROTOCOL))
}

/// aws-vpc-cni's `iif <dev> lookup T` (T neither main nor local): T, dev and the priority.
fn iif_rule(m: &RuleMessage) -> Option<(u32, String, u32)> {
    let table = table_of(m);
    if m.header.action != RuleAction::ToTable
        || m.header.flags.contains(RuleFlags::Invert)
        || table == 0
        || table == MAIN_TABLE
        || table == LOCAL_TABLE
    {
        return None;
    }
    let dev = m.attributes.iter().find_map(|a| match a {
        RuleAttribute::Iifname(n) => Some(n.clone()),
        _ => None,
    })?;
    Some((table, dev, priority_of(m)))
}

/// A unicast host route (`/32`, `/128`) through an interface: its table, address and interface.
fn host_route(m: &RouteMessage) -> Option<(u32, IpAddr, u32)> {
    let h = &m.header;
    let mut table = u32::from(h.table);
    let (mut dst, mut oif) = (None, None);
    for a in &m.attributes {
        match a {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    let dst = dst?;
    (h.destination_prefix_length == full_length(dst)).then_some((table, dst, oif?))
}

/// The rule as one of the two shapes we add (whoever added it), or `None`.
fn probe_rule(m: &RuleMessage, family: Family) -> Option<ProbeRule> {
    let h = &m.header;
    if h.family != address_family(family)
        || h.action != RuleAction::ToTable
        || h.src_len != 0
        || h.tos != 0
        || h.flags.contains(RuleFlags::Invert)
    {
        return None;
    }
    let (mut dst, mut iif) = (None, None);
    for a in &m.attributes {
        match a {
            RuleAttribute::Destination(ip) => dst = Some(*ip),
            RuleAttribute::Iifname(n) => iif = Some(n.clone()),
            RuleAttribute::Table(_) | RuleAttribute::Priority(_) | RuleAttribute::Protocol(_) => {}
            // The kernel reports "no suppression" as -1, for every rule.
            RuleAttribute::SuppressPrefixLen(u32::MAX)
            | RuleAttribute::SuppressIfGroup(u32::MAX) => {}
            _ => return None,
        }
    }
    let (table, priority) = (table_of(m), priority_of(m));
    match (dst, iif) {
        (Some(pod), None)
            if h.dst_len == full_length(pod)
                && priority == TO_POD_PRIORITY
                && ![0, MAIN_TABLE, LOCAL_TABLE].contains(&table) =>
        {
            Some(ProbeRule::ToPod { pod, table })
        }
        (None, Some(veth)) if h.dst_len == 0 && table == LOCAL_TABLE => Some(ProbeRule::FromVeth {
            family,
            veth,
            priority,
        }),
        _ => None,
    }
}

/// A rule in words: as one of ours when it has that shape, else its table and priority.
fn words(m: &RuleMessage, family: Family) -> String {
    match probe_rule(m, family) {
        Some(r) => r.to_string(),
        None => format!(
            "a rule of protocol {PROTOCOL}: lookup {} pref {} ({family})",
            table_of(m),
            priority_of(m)
        ),
    }
}
