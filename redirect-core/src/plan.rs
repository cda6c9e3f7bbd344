//! `plan()`: a pure function from `CaptureConfig` to `Ruleset`.
//!
//! It follows Istio's iptables rule generation (`reference/istio-capture.md` §1.5–1.8) step by
//! step, one family at a time, so that every packet ends where Istio would send it. Where Istio
//! writes one rule per port or CIDR with the same action, we write one rule that looks the
//! value up in a named set; rules with one action and disjoint matches can be merged without
//! changing any decision. The per-UID and per-GID rules are kept one by one: their order
//! matters (with two proxy UIDs, the second UID's loopback traffic meets the first UID's
//! `! --uid-owner` RETURN first, as in Istio).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use crate::config::{
    CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection, DNS_AGENT_PORT, OUTBOUND_MARK,
};
use crate::error::{Error, Result};
use crate::ruleset::{
    Action, AddrMatch, Chain, CtStates, Family, Hook, Match, NamedSet, PortMatch, Rule, Ruleset,
    SetElements, Stage, L4,
};

pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
pub const ISTIO_DROP: &str = "ISTIO_DROP";
const PREROUTING: &str = "PREROUTING";
const OUTPUT: &str = "OUTPUT";

/// Resolves group names (owner groups) to GIDs.
pub trait GroupResolver {
    fn gid_of(&self, name: &str) -> Option<u32>;
}

/// Resolves names with the system's group database (`getgrnam`).
pub struct SystemGroups;

impl GroupResolver for SystemGroups {
    fn gid_of(&self, name: &str) -> Option<u32> {
        nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw())
    }
}

impl<F: Fn(&str) -> Option<u32>> GroupResolver for F {
    fn gid_of(&self, name: &str) -> Option<u32> {
        self(name)
    }
}

/// Plan the rules for a config, resolving group names with the system's group database.
pub fn plan(cfg: &CaptureConfig) -> Result<Ruleset> {
    plan_with(cfg, &SystemGroups)
}

/// Plan the rules for a config with a given group resolver.
pub fn plan_with(cfg: &CaptureConfig, groups: &dyn GroupResolver) -> Result<Ruleset> {
    cfg.validate()?;
    let owner_include = match &cfg.owner_groups_include {
        Selection::All => None,
        Selection::List(l) => Some(resolve_groups(l, groups)?),
    };
    let owner_exclude = resolve_groups(&cfg.owner_groups_exclude, groups)?;
    let mut families = vec![Family::V4];
    if cfg.ipv6 {
        families.push(Family::V6);
    }
    let mut sets = SetRegistry::default();
    let mut chains = Vec::new();
    for family in families {
        let p = FamilyPlanner {
            cfg,
            family,
            owner_include: owner_include.as_deref(),
            owner_exclude: &owner_exclude,
            b: Builder::new(family),
        };
        chains.extend(p.run(&mut sets));
    }
    Ok(Ruleset {
        chains,
        sets: sets.sets,
    })
}

fn resolve_groups(list: &[GroupRef], groups: &dyn GroupResolver) -> Result<Vec<u32>> {
    list.iter()
        .map(|g| match g {
            GroupRef::Id(id) => Ok(*id),
            GroupRef::Name(n) => groups.gid_of(n).ok_or_else(|| Error::Config {
                field: "owner_groups",
                value: n.clone(),
                expected: "a group that exists in the group database (/etc/group) or a numeric GID"
                    .into(),
            }),
        })
        .collect()
}

/// Named sets, deduplicated by name.
#[derive(Default)]
struct SetRegistry {
    sets: Vec<NamedSet>,
}

impl SetRegistry {
    fn ports(&mut self, name: &str, ports: &[u16]) -> String {
        let mut p = ports.to_vec();
        p.sort_unstable();
        p.dedup();
        self.add(NamedSet {
            name: name.to_string(),
            family: None,
            elements: SetElements::Ports(p),
        })
    }

    fn cidrs(&mut self, name: &str, family: Family, cidrs: &[IpNet]) -> String {
        self.add(NamedSet {
            name: format!("{}-{}", family.nft_name(), name),
            family: Some(family),
            elements: SetElements::Cidrs(IpNet::aggregate(&cidrs.to_vec())),
        })
    }

    fn add(&mut self, set: NamedSet) -> String {
        let name = set.name.clone();
        if !self.sets.iter().any(|s| s.name == name) {
            self.sets.push(set);
        }
        name
    }
}

/// Builds one family's chains with iptables' append and insert semantics.
struct Builder {
    family: Family,
    chains: Vec<Chain>,
}

impl Builder {
    fn new(family: Family) -> Self {
        Builder {
            family,
            chains: Vec::new(),
        }
    }

    fn chain(&mut self, stage: Stage, name: &str) -> &mut Chain {
        let pos = self
            .chains
            .iter()
            .position(|c| c.stage == stage && c.name == name);
        let i = match pos {
            Some(i) => i,
            None => {
                let hook = match name {
                    PREROUTING => Some(Hook::Prerouting),
                    OUTPUT => Some(Hook::Output),
                    _ => None,
                };
                self.chains.push(Chain {
                    family: self.family,
                    stage,
                    name: name.to_string(),
                    hook,
                    rules: Vec::new(),
                });
                self.chains.len() - 1
            }
        };
        &mut self.chains[i]
    }

    /// `-A chain`.
    fn append(&mut self, stage: Stage, chain: &str, matches: Vec<Match>, action: Action) {
        self.ensure_target(stage, &action);
        self.chain(stage, chain)
            .rules
            .push(Rule::new(matches, action));
    }

    /// `-I chain pos` (1-based, as iptables).
    fn insert(
        &mut self,
        stage: Stage,
        chain: &str,
        pos: usize,
        matches: Vec<Match>,
        action: Action,
    ) {
        self.ensure_target(stage, &action);
        let rules = &mut self.chain(stage, chain).rules;
        let at = pos.saturating_sub(1).min(rules.len());
        rules.insert(at, Rule::new(matches, action));
    }

    /// A jump target exists even when it has no rules (iptables `-N`).
    fn ensure_target(&mut self, stage: Stage, action: &Action) {
        if let Action::Jump(target) = action {
            self.chain(stage, target);
        }
    }

    /// Chains ordered by stage (raw, mangle, nat), then by creation.
    fn finish(mut self) -> Vec<Chain> {
        self.chains.sort_by_key(|c| c.stage);
        self.chains
    }
}

fn tcp() -> Match {
    Match::Proto(L4::Tcp)
}
fn udp() -> Match {
    Match::Proto(L4::Udp)
}
fn dport(p: u16) -> Match {
    Match::DPort(PortMatch::Eq(p))
}
fn iif(name: &str) -> Match {
    Match::Iif {
        name: name.to_string(),
        negate: false,
    }
}
fn oif(name: &str) -> Match {
    Match::Oif {
        name: name.to_string(),
        negate: false,
    }
}
fn lo() -> Match {
    oif("lo")
}
fn uid(id: u32, negate: bool) -> Match {
    Match::Uid { id, negate }
}
fn gid(id: u32, negate: bool) -> Match {
    Match::Gid { id, negate }
}
fn jump(chain: &str) -> Action {
    Action::Jump(chain.to_string())
}

struct FamilyPlanner<'a> {
    cfg: &'a CaptureConfig,
    family: Family,
    owner_include: Option<&'a [u32]>,
    owner_exclude: &'a [u32],
    b: Builder,
}

impl FamilyPlanner<'_> {
    /// `LO`: the loopback destination that is never captured.
    fn lo_net(&self) -> IpNet {
        match self.family {
            Family::V4 => IpNet::V4(self.cfg.ipv4_loopback_cidr),
            Family::V6 => IpNet::V6(Ipv6Net::new(Ipv6Addr::LOCALHOST, 128).expect("/128")),
        }
    }

    /// `SRC6`: Envoy's inbound passthrough source (127.0.0.6 / ::6).
    fn src6(&self) -> IpNet {
        match self.family {
            Family::V4 => IpNet::from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))),
            Family::V6 => IpNet::from(IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6))),
        }
    }

    /// CIDRs of a list that belong to this family.
    fn of_family(&self, cidrs: &[IpNet]) -> Vec<IpNet> {
        cidrs
            .iter()
            .filter(|c| {
                matches!(
                    (c, self.family),
                    (IpNet::V4(_), Family::V4) | (IpNet::V6(_), Family::V6)
                )
            })
            .copied()
            .collect()
    }

    fn dns_servers(&self) -> Vec<IpNet> {
        match (&self.cfg.dns, self.family) {
            (DnsCapture::Servers { v4, .. }, Family::V4) => {
                v4.iter().map(|a| IpNet::from(IpAddr::V4(*a))).collect()
            }
            (DnsCapture::Servers { v6, .. }, Family::V6) => {
                v6.iter().map(|a| IpNet::from(IpAddr::V6(*a))).collect()
            }
            _ => Vec::new(),
        }
    }

    /// A port-list match: one port inline, more as a named set.
    fn port_match(&self, sets: &mut SetRegistry, set_name: &str, ports: &[u16]) -> PortMatch {
        match ports {
            [p] => PortMatch::Eq(*p),
            _ => PortMatch::InSet(sets.ports(set_name, ports)),
        }
    }

    /// A CIDR-list match: one CIDR inline, more as a named set of this family.
    fn cidr_match(&self, sets: &mut SetRegistry, set_name: &str, cidrs: &[IpNet]) -> AddrMatch {
        match cidrs {
            [c] => AddrMatch::Eq(*c),
            _ => AddrMatch::InSet(sets.cidrs(set_name, self.family, cidrs)),
        }
    }

    fn run(mut self, sets: &mut SetRegistry) -> Vec<Chain> {
        let cfg = self.cfg;
        let tproxy = cfg.mode == InterceptionMode::Tproxy;
        let dns = cfg.dns.effective();
        let lo_net = self.lo_net();
        let src6 = self.src6();
        let b = &mut self.b;
        use Stage::{Mangle, Nat, Raw};

        // 1. Excluded interfaces: nothing is captured on them.
        for i in &cfg.exclude_interfaces {
            b.append(Nat, PREROUTING, vec![iif(i)], Action::Return);
            b.append(Nat, OUTPUT, vec![oif(i)], Action::Return);
            if tproxy {
                b.append(Mangle, PREROUTING, vec![iif(i)], Action::Return);
                b.append(Mangle, OUTPUT, vec![oif(i)], Action::Return);
            }
        }
        // 2. Reroute (KubeVirt) interfaces: other traffic from them is not inbound capture.
        for i in &cfg.reroute_interfaces {
            b.insert(Nat, PREROUTING, 1, vec![iif(i)], Action::Return);
        }
        // 3. Drop conntrack-invalid packets.
        if cfg.drop_invalid {
            b.append(
                Mangle,
                PREROUTING,
                vec![Match::CtState(CtStates::Invalid)],
                jump(ISTIO_DROP),
            );
            b.append(Mangle, ISTIO_DROP, vec![], Action::Drop);
        }
        // 4. Always present: tunnel port RETURN and the two redirect chains.
        b.append(
            Nat,
            ISTIO_INBOUND,
            vec![tcp(), dport(cfg.inbound_tunnel_port)],
            Action::Return,
        );
        b.append(
            Nat,
            ISTIO_REDIRECT,
            vec![tcp()],
            Action::Redirect(cfg.envoy_port),
        );
        b.append(
            Nat,
            ISTIO_IN_REDIRECT,
            vec![tcp()],
            Action::Redirect(cfg.inbound_capture_port),
        );

        // 5. Inbound capture.
        if !cfg.inbound_ports.is_none() {
            let table = if tproxy { Mangle } else { Nat };
            if tproxy {
                b.append(
                    Mangle,
                    ISTIO_DIVERT,
                    vec![],
                    Action::SetMark(cfg.tproxy_mark),
                );
                b.append(Mangle, ISTIO_DIVERT, vec![], Action::Accept);
                b.append(
                    Mangle,
                    ISTIO_TPROXY,
                    vec![Match::DAddr(AddrMatch::Ne(lo_net)), tcp()],
                    Action::Tproxy {
                        port: cfg.inbound_capture_port,
                        mark: cfg.tproxy_mark,
                    },
                );
            }
            b.append(table, PREROUTING, vec![tcp()], jump(ISTIO_INBOUND));
            let established = Match::CtState(CtStates::RelatedEstablished);
            match &cfg.inbound_ports {
                Selection::All => {
                    if !cfg.inbound_exclude_ports.is_empty() {
                        let m = self.port_match(
                            sets,
                            "inbound-exclude-ports",
                            &cfg.inbound_exclude_ports,
                        );
                        self.b.append(
                            table,
                            ISTIO_INBOUND,
                            vec![tcp(), Match::DPort(m)],
                            Action::Return,
                        );
                    }
                    let b = &mut self.b;
                    if tproxy {
                        b.append(
                            table,
                            ISTIO_INBOUND,
                            vec![tcp(), established],
                            jump(ISTIO_DIVERT),
                        );
                        b.append(table, ISTIO_INBOUND, vec![tcp()], jump(ISTIO_TPROXY));
                    } else {
                        b.append(table, ISTIO_INBOUND, vec![tcp()], jump(ISTIO_IN_REDIRECT));
                    }
                }
                Selection::List(ports) => {
                    let m = Match::DPort(self.port_match(sets, "inbound-ports", ports));
                    let b = &mut self.b;
                    if tproxy {
                        b.append(
                            table,
                            ISTIO_INBOUND,
                            vec![tcp(), m.clone(), established],
                            jump(ISTIO_DIVERT),
                        );
                        b.append(table, ISTIO_INBOUND, vec![tcp(), m], jump(ISTIO_TPROXY));
                    } else {
                        b.append(
                            table,
                            ISTIO_INBOUND,
                            vec![tcp(), m],
                            jump(ISTIO_IN_REDIRECT),
                        );
                    }
                }
            }
        }

        // 6. Outbound entry.
        self.b.append(Nat, OUTPUT, vec![], jump(ISTIO_OUTPUT));
        // Ours: bypass UIDs/GIDs (init containers) leave before any capture, DNS included.
        for u in &cfg.bypass_uids {
            self.b
                .append(Nat, ISTIO_OUTPUT, vec![uid(*u, false)], Action::Return);
        }
        for g in &cfg.bypass_gids {
            self.b
                .append(Nat, ISTIO_OUTPUT, vec![gid(*g, false)], Action::Return);
        }
        // 7. Outbound port excludes, TCP and UDP.
        if !cfg.outbound_exclude_ports.is_empty() {
            let m = self.port_match(sets, "outbound-exclude-ports", &cfg.outbound_exclude_ports);
            self.b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![tcp(), Match::DPort(m.clone())],
                Action::Return,
            );
            self.b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![udp(), Match::DPort(m)],
                Action::Return,
            );
        }
        let b = &mut self.b;
        // 8. Envoy's inbound passthrough (source 127.0.0.6 / ::6) is never captured again.
        b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![lo(), Match::SAddr(AddrMatch::Eq(src6))],
            Action::Return,
        );

        // 9-10. The proxy's own traffic. Istio drops the "app on loopback" RETURN when an
        // include CIDR (of either family) is a loopback address.
        let include_has_loopback = cfg.include_cidrs().iter().any(|c| c.addr().is_loopback());
        let not_lo = Match::DAddr(AddrMatch::Ne(lo_net));
        let tunnel = cfg.inbound_tunnel_port;
        for &u in &cfg.proxy_uids {
            let dport_guard = if dns {
                Match::DPort(PortMatch::NotIn(vec![53, tunnel]))
            } else {
                Match::DPort(PortMatch::Ne(tunnel))
            };
            b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![lo(), not_lo.clone(), tcp(), dport_guard, uid(u, false)],
                jump(ISTIO_IN_REDIRECT),
            );
            if !include_has_loopback {
                let m = if dns {
                    vec![lo(), tcp(), Match::DPort(PortMatch::Ne(53)), uid(u, true)]
                } else {
                    vec![lo(), uid(u, true)]
                };
                b.append(Nat, ISTIO_OUTPUT, m, Action::Return);
            }
            b.append(Nat, ISTIO_OUTPUT, vec![uid(u, false)], Action::Return);
        }
        for &g in &cfg.proxy_gids {
            // Istio's GID redirect rule never carries the DNS port exception.
            b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![
                    lo(),
                    not_lo.clone(),
                    tcp(),
                    Match::DPort(PortMatch::Ne(tunnel)),
                    gid(g, false),
                ],
                jump(ISTIO_IN_REDIRECT),
            );
            if !include_has_loopback {
                let m = if dns {
                    vec![lo(), tcp(), Match::DPort(PortMatch::Ne(53)), gid(g, true)]
                } else {
                    vec![lo(), gid(g, true)]
                };
                b.append(Nat, ISTIO_OUTPUT, m, Action::Return);
            }
            b.append(Nat, ISTIO_OUTPUT, vec![gid(g, false)], Action::Return);
        }
        // 11. Owner groups.
        match self.owner_include {
            Some(include) => {
                let m = include.iter().map(|&g| gid(g, true)).collect();
                b.append(Nat, ISTIO_OUTPUT, m, Action::Return);
            }
            None => {
                for &g in self.owner_exclude {
                    b.append(Nat, ISTIO_OUTPUT, vec![gid(g, false)], Action::Return);
                }
            }
        }
        // 12. DNS capture.
        if dns {
            let all = cfg.dns == DnsCapture::All;
            let servers = self.dns_servers();
            let b = &mut self.b;
            if all || !servers.is_empty() {
                b.append(Nat, ISTIO_OUTPUT, vec![], jump(ISTIO_OUTPUT_DNS));
            }
            if all {
                b.append(
                    Nat,
                    ISTIO_OUTPUT_DNS,
                    vec![tcp(), dport(53)],
                    Action::Redirect(DNS_AGENT_PORT),
                );
                b.append(
                    Nat,
                    ISTIO_OUTPUT_DNS,
                    vec![udp(), dport(53)],
                    Action::Redirect(DNS_AGENT_PORT),
                );
            } else {
                for proto in [tcp(), udp()] {
                    for s in &servers {
                        b.append(
                            Nat,
                            ISTIO_OUTPUT_DNS,
                            vec![proto.clone(), dport(53), Match::DAddr(AddrMatch::Eq(*s))],
                            Action::Redirect(DNS_AGENT_PORT),
                        );
                    }
                }
            }
            // Conntrack zones keep proxy↔resolver (1) and app↔agent (2) UDP flows apart.
            b.append(Raw, OUTPUT, vec![], jump(ISTIO_OUTPUT_DNS));
            let owners = cfg
                .proxy_uids
                .iter()
                .map(|&u| uid(u, false))
                .chain(cfg.proxy_gids.iter().map(|&g| gid(g, false)));
            for owner in owners {
                b.append(
                    Raw,
                    ISTIO_OUTPUT_DNS,
                    vec![udp(), dport(53), owner.clone()],
                    Action::CtZone(1),
                );
                b.append(
                    Raw,
                    ISTIO_OUTPUT_DNS,
                    vec![udp(), Match::SPort(PortMatch::Eq(DNS_AGENT_PORT)), owner],
                    Action::CtZone(2),
                );
            }
            if all {
                b.append(Raw, PREROUTING, vec![], jump(ISTIO_INBOUND));
                b.append(
                    Raw,
                    ISTIO_OUTPUT_DNS,
                    vec![udp(), dport(53)],
                    Action::CtZone(2),
                );
                b.append(
                    Raw,
                    ISTIO_INBOUND,
                    vec![udp(), Match::SPort(PortMatch::Eq(53))],
                    Action::CtZone(1),
                );
            } else if !servers.is_empty() {
                b.append(Raw, PREROUTING, vec![], jump(ISTIO_INBOUND));
                for s in &servers {
                    b.append(
                        Raw,
                        ISTIO_OUTPUT_DNS,
                        vec![udp(), dport(53), Match::DAddr(AddrMatch::Eq(*s))],
                        Action::CtZone(2),
                    );
                    b.append(
                        Raw,
                        ISTIO_INBOUND,
                        vec![
                            udp(),
                            Match::SPort(PortMatch::Eq(53)),
                            Match::SAddr(AddrMatch::Eq(*s)),
                        ],
                        Action::CtZone(1),
                    );
                }
            }
        }
        // 13. Loopback destinations are never captured.
        self.b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![Match::DAddr(AddrMatch::Eq(lo_net))],
            Action::Return,
        );
        // 14. Excluded CIDRs.
        let exclude = self.of_family(&cfg.outbound_exclude_cidrs);
        if !exclude.is_empty() {
            let m = self.cidr_match(sets, "exclude-cidrs", &exclude);
            self.b
                .append(Nat, ISTIO_OUTPUT, vec![Match::DAddr(m)], Action::Return);
        }
        // 15. Included outbound ports, whatever the destination.
        if !cfg.outbound_include_ports.is_empty() {
            let m = self.port_match(sets, "outbound-include-ports", &cfg.outbound_include_ports);
            self.b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![tcp(), Match::DPort(m)],
                jump(ISTIO_REDIRECT),
            );
        }
        // 16. Included CIDRs, and the same destinations from reroute interfaces.
        match &cfg.outbound_include_cidrs {
            Selection::All => {
                self.b
                    .append(Nat, ISTIO_OUTPUT, vec![], jump(ISTIO_REDIRECT));
                for i in &cfg.reroute_interfaces {
                    self.b
                        .insert(Nat, PREROUTING, 1, vec![iif(i)], jump(ISTIO_REDIRECT));
                }
            }
            Selection::List(list) => {
                let include = self.of_family(list);
                if !include.is_empty() {
                    let m = Match::DAddr(self.cidr_match(sets, "include-cidrs", &include));
                    for i in &cfg.reroute_interfaces {
                        self.b.insert(
                            Nat,
                            PREROUTING,
                            1,
                            vec![iif(i), m.clone()],
                            jump(ISTIO_REDIRECT),
                        );
                    }
                    self.b
                        .append(Nat, ISTIO_OUTPUT, vec![m], jump(ISTIO_REDIRECT));
                }
            }
        }
        // 17. TPROXY: keep marks across the connection and let Envoy reach the app via the pod IP.
        if tproxy {
            let mark = cfg.tproxy_mark;
            let b = &mut self.b;
            let marked = || Match::Mark {
                value: mark,
                negate: false,
            };
            b.append(Mangle, PREROUTING, vec![tcp(), marked()], Action::SaveMark);
            b.append(Mangle, OUTPUT, vec![tcp(), lo(), marked()], Action::Return);
            let owners = cfg
                .proxy_uids
                .iter()
                .map(|&u| uid(u, false))
                .chain(cfg.proxy_gids.iter().map(|&g| gid(g, false)));
            for owner in owners {
                b.append(
                    Mangle,
                    OUTPUT,
                    vec![not_lo.clone(), tcp(), lo(), owner],
                    Action::SetMark(OUTBOUND_MARK),
                );
            }
            b.append(
                Mangle,
                OUTPUT,
                vec![tcp(), Match::CtMark { value: mark }],
                Action::RestoreMark,
            );
            b.insert(
                Mangle,
                ISTIO_INBOUND,
                1,
                vec![tcp(), marked()],
                Action::Return,
            );
            b.insert(
                Mangle,
                ISTIO_INBOUND,
                2,
                vec![
                    tcp(),
                    Match::SAddr(AddrMatch::Eq(src6)),
                    Match::Iif {
                        name: "lo".into(),
                        negate: false,
                    },
                ],
                Action::Return,
            );
            b.insert(
                Mangle,
                ISTIO_INBOUND,
                3,
                vec![
                    tcp(),
                    Match::Iif {
                        name: "lo".into(),
                        negate: false,
                    },
                    Match::Mark {
                        value: OUTBOUND_MARK,
                        negate: true,
                    },
                ],
                Action::Return,
            );
        }
        self.b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DnsCapture;

    fn count(rs: &Ruleset, f: Family, s: Stage, c: &str) -> usize {
        rs.chain(f, s, c).map_or(0, |c| c.rules.len())
    }

    #[test]
    fn base_config_matches_istio_empty_case() {
        // Istio's `empty` golden: nat has 4 chains; ISTIO_OUTPUT has 8 rules.
        let rs = plan(&CaptureConfig::default()).unwrap();
        assert_eq!(rs.families(), vec![Family::V4]);
        assert_eq!(count(&rs, Family::V4, Stage::Nat, ISTIO_OUTPUT), 8);
        assert_eq!(count(&rs, Family::V4, Stage::Nat, ISTIO_INBOUND), 1);
        assert_eq!(count(&rs, Family::V4, Stage::Nat, OUTPUT), 1);
        assert!(rs.chain(Family::V4, Stage::Nat, PREROUTING).is_none());
        assert!(rs.sets.is_empty());
    }

    #[test]
    fn ipv6_off_plans_no_ipv6_chain() {
        let cfg = CaptureConfig {
            outbound_include_cidrs: Selection::List(vec!["fd00::/8".parse().unwrap()]),
            ..CaptureConfig::istio_sidecar_default()
        };
        let rs = plan(&cfg).unwrap();
        assert!(rs.chains.iter().all(|c| c.family == Family::V4));
        assert!(rs.sets.iter().all(|s| s.family != Some(Family::V6)));
    }

    #[test]
    fn lists_become_sets() {
        let cfg = CaptureConfig {
            ipv6: true,
            outbound_exclude_cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
                "192.168.0.0/16".parse().unwrap(),
                "fd00::/8".parse().unwrap(),
            ],
            ..CaptureConfig::istio_sidecar_default()
        };
        let rs = plan(&cfg).unwrap();
        let v4 = rs.set("ip-exclude-cidrs").unwrap();
        // Overlaps are aggregated: 10.1/16 is inside 10/8.
        assert_eq!(
            v4.elements,
            SetElements::Cidrs(vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.168.0.0/16".parse().unwrap()
            ])
        );
        assert!(
            rs.set("ip6-exclude-cidrs").is_none(),
            "one v6 CIDR stays inline"
        );
        let ports = rs.set("inbound-exclude-ports").unwrap();
        assert_eq!(
            ports.elements,
            SetElements::Ports(vec![15020, 15021, 15090])
        );
    }

    #[test]
    fn tproxy_inserts_land_first() {
        let cfg = CaptureConfig {
            mode: InterceptionMode::Tproxy,
            inbound_ports: Selection::All,
            ..CaptureConfig::default()
        };
        let rs = plan(&cfg).unwrap();
        let c = rs.chain(Family::V4, Stage::Mangle, ISTIO_INBOUND).unwrap();
        assert_eq!(c.rules.len(), 5);
        assert_eq!(c.rules[0].action, Action::Return);
        assert_eq!(c.rules[3].action, jump(ISTIO_DIVERT));
        assert_eq!(c.rules[4].action, jump(ISTIO_TPROXY));
    }

    #[test]
    fn dns_disabled_without_servers() {
        let cfg = CaptureConfig {
            dns: DnsCapture::Servers {
                v4: vec![],
                v6: vec![],
            },
            ..CaptureConfig::default()
        };
        let rs = plan(&cfg).unwrap();
        assert!(rs.chains.iter().all(|c| c.stage != Stage::Raw));
        assert!(rs.chain(Family::V4, Stage::Nat, ISTIO_OUTPUT_DNS).is_none());
    }

    #[test]
    fn unknown_group_name_is_an_error() {
        let cfg = CaptureConfig {
            owner_groups_include: Selection::List(vec![GroupRef::Name("no-such-group-xyz".into())]),
            ..CaptureConfig::default()
        };
        let e = plan(&cfg).unwrap_err().to_string();
        assert!(e.contains("no-such-group-xyz"), "{e}");
        let rs = plan_with(&cfg, &|n: &str| (n == "no-such-group-xyz").then_some(4242)).unwrap();
        let out = rs.chain(Family::V4, Stage::Nat, ISTIO_OUTPUT).unwrap();
        assert!(out.rules.iter().any(|r| r.matches == vec![gid(4242, true)]));
    }
}
