//! Lowering a `Ruleset` into the objects of our one `inet` table: chains, rules made of
//! expressions, and sets.
//!
//! Layout: one base chain per (stage, hook) that dispatches on `meta nfproto` to the chains of
//! each family (`<stage>_<family>_<name>`). So a family without rules never matches anything, and
//! a RETURN in a family's built-in chain ends the stage for that packet, as in iptables.

use std::net::IpAddr;

use ipnet::IpNet;

use super::expr::{Base, CtKey, Expr, MetaKey, Verdict};
use crate::ruleset::{
    Action, AddrMatch, Chain, CtStates, Family, Hook, Match, NamedSet, PortMatch, Ruleset,
    SetElements, Stage,
};

/// The kind of a base chain (`type` in nft).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainKind {
    Filter,
    Route,
    Nat,
}

impl ChainKind {
    pub fn name(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Route => "route",
            ChainKind::Nat => "nat",
        }
    }
}

/// A base chain's hook, kind and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseSpec {
    pub hook: Hook,
    pub kind: ChainKind,
    pub priority: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftChain {
    pub name: String,
    pub base: Option<BaseSpec>,
    pub rules: Vec<Vec<Expr>>,
}

/// A set as the kernel stores it: CIDR sets become interval sets of [start, end) ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftSet {
    pub name: String,
    pub id: u32,
    /// nft key type (`inet_service` 13, `ipv4_addr` 7, `ipv6_addr` 8) and its length.
    pub key_type: u32,
    pub key_len: u32,
    pub interval: bool,
    /// Element keys in order; for interval sets, each range is a start key followed, unless it
    /// runs to the end of the address space, by an end key (flagged interval-end).
    pub elements: Vec<SetElem>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetElem {
    pub key: Vec<u8>,
    pub interval_end: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NftTable {
    pub chains: Vec<NftChain>,
    pub sets: Vec<NftSet>,
}

/// Name of the base chain of a stage and hook.
pub fn base_chain_name(stage: Stage, hook: Hook) -> String {
    format!("{}_{}", stage.table_name(), hook_name(hook))
}

/// Name of a family's chain.
pub fn chain_name(stage: Stage, family: Family, name: &str) -> String {
    format!(
        "{}_{}_{}",
        stage.table_name(),
        family.nft_name(),
        name.to_ascii_lowercase()
    )
}

pub(crate) fn hook_name(hook: Hook) -> &'static str {
    match hook {
        Hook::Prerouting => "prerouting",
        Hook::Output => "output",
    }
}

pub(crate) fn base_spec(stage: Stage, hook: Hook) -> BaseSpec {
    // Mangle output is a route chain so a changed mark re-routes the packet, as iptables does.
    let kind = match (stage, hook) {
        (Stage::Nat, _) => ChainKind::Nat,
        (Stage::Mangle, Hook::Output) => ChainKind::Route,
        _ => ChainKind::Filter,
    };
    BaseSpec {
        hook,
        kind,
        priority: stage.priority(),
    }
}

pub fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

/// Lower a ruleset into table objects.
pub fn lower(rs: &Ruleset) -> NftTable {
    let mut table = NftTable::default();
    for (i, set) in rs.sets.iter().enumerate() {
        table.sets.push(lower_set(set, i as u32 + 1));
    }
    // Base dispatch chains, for every (stage, hook) some family uses.
    for stage in Stage::ALL {
        for hook in Hook::ALL {
            let users: Vec<&Chain> = rs
                .chains
                .iter()
                .filter(|c| c.stage == stage && c.hook == Some(hook))
                .collect();
            if users.is_empty() {
                continue;
            }
            let rules = users
                .iter()
                .map(|c| {
                    vec![
                        Expr::Meta(MetaKey::NfProto),
                        Expr::Cmp {
                            eq: true,
                            data: vec![nfproto(c.family)],
                        },
                        Expr::Verdict(Verdict::Jump(chain_name(stage, c.family, &c.name))),
                    ]
                })
                .collect();
            table.chains.push(NftChain {
                name: base_chain_name(stage, hook),
                base: Some(base_spec(stage, hook)),
                rules,
            });
        }
    }
    for c in &rs.chains {
        let mut rules = Vec::new();
        for r in &c.rules {
            let mut m = Vec::new();
            for cond in &r.matches {
                lower_match(&mut m, cond, c.family);
            }
            lower_action(&mut rules, m, &r.action, c.stage, c.family);
        }
        table.chains.push(NftChain {
            name: chain_name(c.stage, c.family, &c.name),
            base: None,
            rules,
        });
    }
    table
}

fn set_ref(name: &str) -> Expr {
    Expr::Lookup {
        set: name.into(),
        invert: false,
    }
}

fn ifname(name: &str) -> Vec<u8> {
    // Exact match: the name and its terminating NUL, as nft writes `iifname "eth0"`.
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

fn addr_offset(family: Family, src: bool) -> (u32, u32) {
    match (family, src) {
        (Family::V4, true) => (12, 4),
        (Family::V4, false) => (16, 4),
        (Family::V6, true) => (8, 16),
        (Family::V6, false) => (24, 16),
    }
}

fn lower_match(out: &mut Vec<Expr>, m: &Match, family: Family) {
    match m {
        Match::Proto(p) => {
            out.push(Expr::Meta(MetaKey::L4Proto));
            out.push(Expr::Cmp {
                eq: true,
                data: vec![p.number()],
            });
        }
        Match::DPort(pm) | Match::SPort(pm) => {
            let offset = if matches!(m, Match::SPort(_)) { 0 } else { 2 };
            out.push(Expr::Payload {
                base: Base::Transport,
                offset,
                len: 2,
            });
            match pm {
                PortMatch::Eq(p) => out.push(Expr::Cmp {
                    eq: true,
                    data: p.to_be_bytes().to_vec(),
                }),
                PortMatch::Ne(p) => out.push(Expr::Cmp {
                    eq: false,
                    data: p.to_be_bytes().to_vec(),
                }),
                PortMatch::NotIn(ps) => {
                    for p in ps {
                        out.push(Expr::Cmp {
                            eq: false,
                            data: p.to_be_bytes().to_vec(),
                        });
                    }
                }
                PortMatch::InSet(name) => out.push(set_ref(name)),
            }
        }
        Match::DAddr(am) | Match::SAddr(am) => {
            let (offset, len) = addr_offset(family, matches!(m, Match::SAddr(_)));
            out.push(Expr::Payload {
                base: Base::Network,
                offset,
                len,
            });
            match am {
                AddrMatch::Eq(net) | AddrMatch::Ne(net) => {
                    let eq = matches!(am, AddrMatch::Eq(_));
                    if net.prefix_len() < net.max_prefix_len() {
                        out.push(Expr::Mask(addr_bytes(net.netmask())));
                    }
                    out.push(Expr::Cmp {
                        eq,
                        data: addr_bytes(net.network()),
                    });
                }
                AddrMatch::InSet(name) => out.push(set_ref(name)),
            }
        }
        Match::Iif { name, negate } | Match::Oif { name, negate } => {
            let key = if matches!(m, Match::Iif { .. }) {
                MetaKey::IifName
            } else {
                MetaKey::OifName
            };
            out.push(Expr::Meta(key));
            out.push(Expr::Cmp {
                eq: !negate,
                data: ifname(name),
            });
        }
        Match::Uid { id, negate } | Match::Gid { id, negate } => {
            let key = if matches!(m, Match::Uid { .. }) {
                MetaKey::SkUid
            } else {
                MetaKey::SkGid
            };
            out.push(Expr::Meta(key));
            out.push(Expr::Cmp {
                eq: !negate,
                data: id.to_ne_bytes().to_vec(),
            });
        }
        Match::Mark { value, negate } => {
            out.push(Expr::Meta(MetaKey::Mark));
            out.push(Expr::Cmp {
                eq: !negate,
                data: value.to_ne_bytes().to_vec(),
            });
        }
        Match::CtMark { value } => {
            out.push(Expr::Ct(CtKey::Mark));
            out.push(Expr::Cmp {
                eq: true,
                data: value.to_ne_bytes().to_vec(),
            });
        }
        Match::CtState(states) => {
            // ct state bits (nf_conntrack_common.h): INVALID 1, ESTABLISHED 2, RELATED 4.
            let mask: u32 = match states {
                CtStates::Invalid => 1,
                CtStates::RelatedEstablished => 2 | 4,
            };
            out.push(Expr::Ct(CtKey::State));
            out.push(Expr::Mask(mask.to_ne_bytes().to_vec()));
            out.push(Expr::Cmp {
                eq: false,
                data: 0u32.to_ne_bytes().to_vec(),
            });
        }
    }
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn lower_action(
    rules: &mut Vec<Vec<Expr>>,
    mut m: Vec<Expr>,
    action: &Action,
    stage: Stage,
    family: Family,
) {
    let v = |v: Verdict| Expr::Verdict(v);
    match action {
        Action::Jump(target) => m.push(v(Verdict::Jump(chain_name(stage, family, target)))),
        Action::Return => m.push(v(Verdict::Return)),
        Action::Accept => m.push(v(Verdict::Accept)),
        Action::Drop => m.push(v(Verdict::Drop)),
        Action::Redirect(port) => {
            m.push(Expr::Imm(port.to_be_bytes().to_vec()));
            m.push(Expr::Redir);
        }
        Action::Tproxy { port, mark } => {
            // xt_TPROXY accepts with the mark set, or drops when no socket takes the packet;
            // nft's tproxy just stops the rule then, so a second rule drops.
            let drop_rule = {
                let mut d = m.clone();
                d.push(v(Verdict::Drop));
                d
            };
            m.push(Expr::Imm(port.to_be_bytes().to_vec()));
            m.push(Expr::Tproxy {
                nfproto: nfproto(family) as u32,
            });
            m.push(Expr::Imm(mark.to_ne_bytes().to_vec()));
            m.push(Expr::MetaSet(MetaKey::Mark));
            m.push(v(Verdict::Accept));
            rules.push(m);
            rules.push(drop_rule);
            return;
        }
        Action::SetMark(mark) => {
            m.push(Expr::Imm(mark.to_ne_bytes().to_vec()));
            m.push(Expr::MetaSet(MetaKey::Mark));
        }
        Action::SaveMark => {
            m.push(Expr::Meta(MetaKey::Mark));
            m.push(Expr::CtSet(CtKey::Mark));
        }
        Action::RestoreMark => {
            m.push(Expr::Ct(CtKey::Mark));
            m.push(Expr::MetaSet(MetaKey::Mark));
        }
        Action::CtZone(zone) => {
            m.push(Expr::Imm(zone.to_ne_bytes().to_vec()));
            m.push(Expr::CtSet(CtKey::Zone));
        }
    }
    rules.push(m);
}

/// nft key types (nftables' datatype ids) and lengths.
const TYPE_IPV4_ADDR: u32 = 7;
const TYPE_IPV6_ADDR: u32 = 8;
const TYPE_INET_SERVICE: u32 = 13;

fn lower_set(set: &NamedSet, id: u32) -> NftSet {
    match &set.elements {
        SetElements::Ports(ports) => NftSet {
            name: set.name.clone(),
            id,
            key_type: TYPE_INET_SERVICE,
            key_len: 2,
            interval: false,
            elements: ports
                .iter()
                .map(|p| SetElem {
                    key: p.to_be_bytes().to_vec(),
                    interval_end: false,
                })
                .collect(),
        },
        SetElements::Cidrs(cidrs) => {
            let v6 = set.family == Some(Family::V6);
            let (key_type, key_len) = if v6 {
                (TYPE_IPV6_ADDR, 16)
            } else {
                (TYPE_IPV4_ADDR, 4)
            };
            let mut elements = Vec::new();
            let ranges = merged_ranges(cidrs);
            // Like nft, open with an interval end at 0 when the first range starts above it, so
            // every key below the first range finds an end and misses on every kernel.
            if ranges.first().is_some_and(|(start, _)| *start > 0) {
                elements.push(SetElem {
                    key: int_to_key(0, key_len),
                    interval_end: true,
                });
            }
            for (start, end) in ranges {
                elements.push(SetElem {
                    key: int_to_key(start, key_len),
                    interval_end: false,
                });
                if let Some(end) = end {
                    elements.push(SetElem {
                        key: int_to_key(end, key_len),
                        interval_end: true,
                    });
                }
            }
            NftSet {
                name: set.name.clone(),
                id,
                key_type,
                key_len,
                interval: true,
                elements,
            }
        }
    }
}

/// CIDRs as sorted, merged half-open ranges [start, end); `None` end = to the top of the space.
/// Adjacent ranges are merged too, since the kernel refuses an end and a start on one key.
pub fn merged_ranges(cidrs: &[IpNet]) -> Vec<(u128, Option<u128>)> {
    let mut r: Vec<(u128, Option<u128>)> = cidrs
        .iter()
        .map(|c| {
            let (start, last) = match c {
                IpNet::V4(n) => (
                    u32::from(n.network()) as u128,
                    u32::from(n.broadcast()) as u128,
                ),
                IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
            };
            let top = if matches!(c, IpNet::V4(_)) {
                u32::MAX as u128
            } else {
                u128::MAX
            };
            (start, if last == top { None } else { Some(last + 1) })
        })
        .collect();
    r.sort();
    let mut out: Vec<(u128, Option<u128>)> = Vec::new();
    for (s, e) in r {
        if let Some(last) = out.last_mut() {
            match last.1 {
                None => continue,
                Some(le) if s <= le => {
                    last.1 = e.map(|e| e.max(le));
                    continue;
                }
                _ => {}
            }
        }
        out.push((s, e));
    }
    out
}

fn int_to_key(v: u128, len: u32) -> Vec<u8> {
    if len == 4 {
        (v as u32).to_be_bytes().to_vec()
    } else {
        v.to_be_bytes().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn ranges_merge_adjacent_and_overlapping() {
        let r = merged_ranges(&nets(&[
            "10.0.0.0/8",
            "11.0.0.0/16",
            "10.5.0.0/16",
            "192.168.0.0/16",
        ]));
        assert_eq!(
            r,
            vec![
                (0x0a00_0000, Some(0x0b01_0000)),
                (0xc0a8_0000, Some(0xc0a9_0000))
            ]
        );
        let r = merged_ranges(&nets(&["0.0.0.0/0", "10.0.0.0/8"]));
        assert_eq!(r, vec![(0, None)]);
        let r = merged_ranges(&nets(&["255.255.255.0/24"]));
        assert_eq!(r, vec![(0xffff_ff00, None)]);
    }

    #[test]
    fn dispatch_chains_per_family() {
        let cfg = crate::CaptureConfig {
            ipv6: true,
            ..crate::CaptureConfig::istio_sidecar_default()
        };
        let t = lower(&crate::plan(&cfg).unwrap());
        let out = t.chains.iter().find(|c| c.name == "nat_output").unwrap();
        assert_eq!(out.rules.len(), 2);
        assert!(t.chains.iter().any(|c| c.name == "nat_ip6_istio_output"));
        let cfg4 = crate::CaptureConfig::istio_sidecar_default();
        let t4 = lower(&crate::plan(&cfg4).unwrap());
        assert_eq!(
            t4.chains
                .iter()
                .find(|c| c.name == "nat_output")
                .unwrap()
                .rules
                .len(),
            1
        );
        assert!(!t4.chains.iter().any(|c| c.name.contains("ip6")));
    }
}
