//! `plan()`: a pure function from `CaptureConfig` to `Ruleset`.
//!
//! It follows the rules Istio's `istio-iptables` generates, step by
//! step, one family at a time, so that every packet ends where Istio would send it. Where Istio
//! writes one rule per port or CIDR with the same action, we write one rule that looks the
//! value up in a named set; rules with one action and disjoint matches can be merged without
//! changing any decision. The per-UID and per-GID rules are kept one by one: their order
//! matters (with two proxy UIDs, the second UID's loopback traffic meets the first UID's
//! `! --uid-owner` RETURN first, as in Istio).
//!
//! `FamilyPlanner::run` lists Istio's steps in order; each step is a function on the planner
//! in the file of its part of the capture: `base` (interfaces, invalid drop, the fixed rules),
//! `inbound`, `outbound`, `dns`, `tproxy` (marks). `builder` holds the append/insert semantics
//! and the set registry they write with.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use crate::config::{CaptureConfig, GroupRef, InterceptionMode, Selection};
use crate::error::{Error, Result};
use crate::ruleset::{AddrMatch, Chain, Family, Match, PortMatch, Ruleset};

use builder::{gid, uid, Builder, SetRegistry};

mod base;
mod builder;
mod dns;
mod inbound;
mod outbound;
mod tproxy;

pub mod ambient;
pub mod host_probe;

pub mod chains;
pub mod sets;

use chains::*;

/// Resolves group names (owner groups) to GIDs.
pub trait GroupResolver {
    /// The GID of the group named `name`; `None` when there is no such group.
    fn gid_of(&self, name: &str) -> Option<u32>;
}

/// Resolves no name: only numeric GIDs plan. The host's group database is
/// `redirect_kernel::SystemGroups`.
pub struct NoGroupDatabase;

impl GroupResolver for NoGroupDatabase {
    fn gid_of(&self, _name: &str) -> Option<u32> {
        None
    }
}

impl<F: Fn(&str) -> Option<u32>> GroupResolver for F {
    fn gid_of(&self, name: &str) -> Option<u32> {
        self(name)
    }
}

/// Validate and plan with numeric groups only, for this crate's tests.
#[cfg(test)]
pub(crate) fn plan(cfg: &CaptureConfig) -> Result<Ruleset> {
    cfg.clone().validated()?.plan(&NoGroupDatabase)
}

/// `ValidConfig::plan`: the rules of a config validated once.
pub(crate) fn plan_checked(cfg: &CaptureConfig, groups: &dyn GroupResolver) -> Result<Ruleset> {
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
            b: Builder::counting(family, cfg.counters),
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

struct FamilyPlanner<'a> {
    cfg: &'a CaptureConfig,
    family: Family,
    owner_include: Option<&'a [u32]>,
    owner_exclude: &'a [u32],
    b: Builder,
}

impl FamilyPlanner<'_> {
    /// Istio's steps in Istio's order: the order of the appends and inserts is the order of
    /// the rules, so the steps must not be reordered.
    fn run(mut self, sets: &mut SetRegistry) -> Vec<Chain> {
        let p = &mut self;
        base::excluded_interfaces(p); // 1
        base::reroute_interfaces(p); // 2
        base::drop_invalid(p); // 3
        base::fixed_rules(p); // 4
        inbound::inbound_capture(p, sets); // 5
        outbound::outbound_entry(p); // 6, and our bypass IDs
        outbound::outbound_exclude_ports(p, sets); // 7
        outbound::inbound_passthrough(p); // 8
        outbound::proxy_traffic(p); // 9-10
        outbound::owner_groups(p); // 11
        if p.dns() {
            dns::dns_capture(p); // 12
        }
        outbound::loopback_destinations(p); // 13
        outbound::exclude_cidrs(p, sets); // 14
        outbound::include_ports(p, sets); // 15
        outbound::include_cidrs(p, sets); // 16
        if p.tproxy() {
            tproxy::tproxy_marks(p); // 17
        }
        self.b.finish()
    }

    fn tproxy(&self) -> bool {
        self.cfg.mode == InterceptionMode::Tproxy
    }

    /// Whether DNS capture is in effect (Istio's rule: see `DnsCapture::effective`).
    fn dns(&self) -> bool {
        self.cfg.dns.effective()
    }

    /// `LO`: the loopback destination that is never captured.
    fn lo_net(&self) -> IpNet {
        match self.family {
            Family::V4 => IpNet::V4(self.cfg.ipv4_loopback_cidr),
            Family::V6 => IpNet::V6(Ipv6Net::new(Ipv6Addr::LOCALHOST, 128).expect("/128")),
        }
    }

    /// `! -d LO`: any destination but the loopback one.
    fn not_lo(&self) -> Match {
        Match::DAddr(AddrMatch::Ne(self.lo_net()))
    }

    /// `SRC6`: Envoy's inbound passthrough source (127.0.0.6 / ::6).
    fn src6(&self) -> IpNet {
        match self.family {
            Family::V4 => IpNet::from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))),
            Family::V6 => IpNet::from(IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6))),
        }
    }

    /// The proxy's owner matches: each proxy UID, then each proxy GID.
    fn proxy_owners(&self) -> Vec<Match> {
        let cfg = self.cfg;
        cfg.proxy_uids
            .iter()
            .map(|&u| uid(u, false))
            .chain(cfg.proxy_gids.iter().map(|&g| gid(g, false)))
            .collect()
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
}

#[cfg(test)]
mod tests {
    use super::builder::jump;
    use super::*;
    use crate::config::DnsCapture;
    use crate::ruleset::{Action, SetElements, Stage};

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
        let v4 = rs
            .set(&sets::cidr_set(Family::V4, sets::EXCLUDE_CIDRS))
            .unwrap();
        // Overlaps are aggregated: 10.1/16 is inside 10/8.
        assert_eq!(
            v4.elements,
            SetElements::Cidrs(vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.168.0.0/16".parse().unwrap()
            ])
        );
        assert!(
            rs.set(&sets::cidr_set(Family::V6, sets::EXCLUDE_CIDRS))
                .is_none(),
            "one v6 CIDR stays inline"
        );
        let ports = rs.set(sets::INBOUND_EXCLUDE_PORTS).unwrap();
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
        let rs = cfg
            .validated()
            .unwrap()
            .plan(&|n: &str| (n == "no-such-group-xyz").then_some(4242))
            .unwrap();
        let out = rs.chain(Family::V4, Stage::Nat, ISTIO_OUTPUT).unwrap();
        assert!(out.rules.iter().any(|r| r.matches == vec![gid(4242, true)]));
    }
}
