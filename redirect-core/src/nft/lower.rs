//! Lowering a `Ruleset` into the objects of our one `inet` table: chains, rules made of
//! expressions, and sets.
//!
//! Layout: one base chain per (stage, hook) that dispatches on `meta nfproto` to the chains of
//! each family (`<stage>_<family>_<name>`). So a family without rules never matches anything, and
//! a RETURN in a family's built-in chain ends the stage for that packet, as in iptables.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use super::expr::{Base, CtKey, Expr, MetaKey, Verdict};
/// The type of a base chain; the model decides it (`Stage::chain_kind`).
pub use crate::ruleset::ChainKind;
use crate::ruleset::{
    Action, AddrMatch, CtStates, Family, Hook, HookedChains, Match, NamedSet, PortMatch, Ruleset,
    SetElements, Stage,
};

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
    /// The size the set is declared with (`NFTA_SET_DESC_SIZE`), if any: given for the hash
    /// sets of a masked CIDR list, so the kernel picks its fixed-size hash.
    pub size: Option<u32>,
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
    format!("{}_{}", stage.table_name(), hook.nf_name())
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

impl BaseSpec {
    /// The base chain of a stage on a hook, as the model places it.
    pub(crate) fn at(stage: Stage, hook: Hook) -> BaseSpec {
        BaseSpec {
            hook,
            kind: stage.chain_kind(hook),
            priority: stage.priority(),
        }
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
    let mut masked: Masked = BTreeMap::new();
    for set in &rs.sets {
        let id = table.sets.len() as u32 + 1;
        match masked_groups(set) {
            Some(groups) => {
                let mut names = Vec::new();
                for (i, (prefix, keys)) in groups.into_iter().enumerate() {
                    let set = masked_set(set, prefix, keys, id + i as u32);
                    names.push((prefix, set.name.clone()));
                    table.sets.push(set);
                }
                masked.insert(set.name.as_str(), names);
            }
            None => table.sets.push(lower_set(set, id)),
        }
    }
    // Base dispatch chains, for every (stage, hook) some family uses.
    table
        .chains
        .extend(rs.hooked_chains().iter().map(dispatch_chain));
    for c in &rs.chains {
        let mut rules = Vec::new();
        for r in &c.rules {
            for m in lower_matches(&r.matches, c.family, &masked) {
                lower_action(&mut rules, m, &r.action, c.stage, c.family);
            }
        }
        table.chains.push(NftChain {
            name: chain_name(c.stage, c.family, &c.name),
            base: None,
            rules,
        });
    }
    table
}

/// The base chain of a (stage, hook): one jump per family to that family's chain.
fn dispatch_chain(h: &HookedChains) -> NftChain {
    let rules = h
        .chains
        .iter()
        .map(|c| {
            vec![
                Expr::Meta(MetaKey::NfProto),
                Expr::Cmp {
                    eq: true,
                    data: vec![nfproto(c.family)],
                },
                Expr::Verdict(Verdict::Jump(chain_name(h.stage, c.family, &c.name))),
            ]
        })
        .collect();
    NftChain {
        name: base_chain_name(h.stage, h.hook),
        base: Some(BaseSpec::at(h.stage, h.hook)),
        rules,
    }
}

/// CIDR sets lowered as one hash set per prefix length: the set's name → (prefix, set name).
type Masked<'a> = BTreeMap<&'a str, Vec<(u8, String)>>;

/// A CIDR list at least this long is lowered to hash sets per prefix length, when it has at
/// most [`MASKED_MAX_PREFIXES`] of them: the kernel inserts an interval set's keys (a start and
/// an end per range) into a tree, which made 10,000 CIDRs cost 9 ms in the kernel; a fixed-size
/// hash takes half the keys and a third of the time. Shorter lists keep one interval set and
/// one lookup per packet.
pub const MASKED_MIN_CIDRS: usize = 256;
/// Each prefix length costs one more rule and one more lookup per packet.
pub const MASKED_MAX_PREFIXES: usize = 8;

/// The rule's matches, lowered: one expression list, or one per prefix group when the rule
/// looks an address up in a masked CIDR set. The groups are disjoint (see [`masked_groups`]),
/// so at most one of the rules matches a packet and the action runs at most once.
fn lower_matches(matches: &[Match], family: Family, masked: &Masked) -> Vec<Vec<Expr>> {
    let mut variants = vec![Vec::new()];
    for cond in matches {
        let groups = match cond {
            Match::DAddr(AddrMatch::InSet(name)) | Match::SAddr(AddrMatch::InSet(name)) => {
                masked.get(name.as_str())
            }
            _ => None,
        };
        match groups {
            None => variants
                .iter_mut()
                .for_each(|m| lower_match(m, cond, family)),
            Some(groups) => {
                let (offset, len) = addr_offset(family, matches!(cond, Match::SAddr(_)));
                variants = variants
                    .into_iter()
                    .flat_map(|m| {
                        groups.iter().map(move |(prefix, set)| {
                            let mut m = m.clone();
                            m.push(Expr::Payload {
                                base: Base::Network,
                                offset,
                                len,
                            });
                            if u32::from(*prefix) < len * 8 {
                                m.push(Expr::Mask(prefix_mask(*prefix, len)));
                            }
                            m.push(set_ref(set));
                            m
                        })
                    })
                    .collect();
            }
        }
    }
    variants
}

/// A long CIDR list as disjoint CIDRs grouped by prefix length (keys: the network addresses),
/// or `None` to keep it one interval set. The list is merged into ranges first and each range
/// cut into the fewest aligned blocks, so no address is in two groups.
fn masked_groups(set: &NamedSet) -> Option<Vec<(u8, Vec<u128>)>> {
    let SetElements::Cidrs(cidrs) = &set.elements else {
        return None;
    };
    if cidrs.len() < MASKED_MIN_CIDRS {
        return None;
    }
    let v6 = set.family == Some(Family::V6);
    let mut groups: BTreeMap<u8, Vec<u128>> = BTreeMap::new();
    for (start, end) in merged_ranges(cidrs) {
        for (net, prefix) in aligned_blocks(start, end, v6) {
            groups.entry(prefix).or_default().push(net);
            if groups.len() > MASKED_MAX_PREFIXES {
                return None;
            }
        }
    }
    // Longest prefixes first, as a reader expects the most specific first.
    Some(groups.into_iter().rev().collect())
}

/// [start, end) (end `None`: to the top of the space) as the fewest aligned CIDRs (ipnet's
/// subnet iterators), each `(network, prefix length)`.
fn aligned_blocks(start: u128, end: Option<u128>, v6: bool) -> Vec<(u128, u8)> {
    if v6 {
        let last = end.map_or(u128::MAX, |e| e - 1);
        Ipv6Subnets::new(Ipv6Addr::from(start), Ipv6Addr::from(last), 0)
            .map(|n| (u128::from(n.network()), n.prefix_len()))
            .collect()
    } else {
        let last = end.map_or(u32::MAX, |e| (e - 1) as u32);
        Ipv4Subnets::new(Ipv4Addr::from(start as u32), Ipv4Addr::from(last), 0)
            .map(|n| (u128::from(u32::from(n.network())), n.prefix_len()))
            .collect()
    }
}

fn prefix_mask(prefix: u8, len: u32) -> Vec<u8> {
    let bits = len * 8;
    let mask: u128 = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    };
    let v = mask >> (128 - bits);
    int_to_key(v, len)
}

/// The nft key type and length of an address set of `set`'s family.
fn addr_key(set: &NamedSet) -> (u32, u32) {
    if set.family == Some(Family::V6) {
        (TYPE_IPV6_ADDR, 16)
    } else {
        (TYPE_IPV4_ADDR, 4)
    }
}

fn masked_set(set: &NamedSet, prefix: u8, keys: Vec<u128>, id: u32) -> NftSet {
    let (key_type, key_len) = addr_key(set);
    NftSet {
        name: format!("{}_m{prefix}", set.name),
        id,
        key_type,
        key_len,
        interval: false,
        // A power of two at least the count, so a refill with a few more keys fits.
        size: Some((keys.len() as u32).next_power_of_two().max(64)),
        elements: keys
            .into_iter()
            .map(|k| SetElem {
                key: int_to_key(k, key_len),
                interval_end: false,
            })
            .collect(),
    }
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
            size: None,
            elements: ports
                .iter()
                .map(|p| SetElem {
                    key: p.to_be_bytes().to_vec(),
                    interval_end: false,
                })
                .collect(),
        },
        SetElements::Cidrs(cidrs) => {
            let (key_type, key_len) = addr_key(set);
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
                size: None,
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

    /// Every address of `groups` as ranges, merged: what the kernel's hash sets match.
    fn covered(groups: &[(u8, Vec<u128>)], v6: bool) -> Vec<(u128, Option<u128>)> {
        let nets: Vec<IpNet> = groups
            .iter()
            .flat_map(|(p, keys)| {
                keys.iter().map(move |k| {
                    if v6 {
                        IpNet::new(IpAddr::V6(Ipv6Addr::from(*k)), *p).unwrap()
                    } else {
                        IpNet::new(IpAddr::V4(Ipv4Addr::from(*k as u32)), *p).unwrap()
                    }
                })
            })
            .collect();
        merged_ranges(&nets)
    }

    fn cidr_set(family: Family, cidrs: Vec<IpNet>) -> NamedSet {
        NamedSet {
            name: "ip-exclude-cidrs".into(),
            family: Some(family),
            elements: SetElements::Cidrs(cidrs),
        }
    }

    #[test]
    fn long_cidr_lists_become_disjoint_hash_groups_covering_the_same_addresses() {
        // 300 /25s with gaps, a /24 over two of them, two adjacent /26s that merge with a /25,
        // a /32 inside a /25, and 10.0.0.0/8.
        let mut list: Vec<IpNet> = (0..300u32)
            .map(|i| IpNet::new(Ipv4Addr::from(0x0b00_0000 + (i << 8)).into(), 25).unwrap())
            .collect();
        list.extend(nets(&["11.0.5.0/24", "11.0.7.128/26", "11.0.7.192/26"]));
        list.extend(nets(&["11.0.9.7/32", "10.0.0.0/8"]));
        let set = cidr_set(Family::V4, list.clone());
        let groups = masked_groups(&set).expect("hash groups");
        assert_eq!(covered(&groups, false), merged_ranges(&list));
        let mut all: Vec<(u128, u8)> = groups
            .iter()
            .flat_map(|(p, keys)| keys.iter().map(move |k| (*k, *p)))
            .collect();
        all.sort();
        for w in all.windows(2) {
            let end = w[0].0 + (1u128 << (32 - w[0].1));
            assert!(end <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        }
        let prefixes: Vec<u8> = groups.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            prefixes,
            [25, 24, 8],
            "longest first; /26+/26 and /32 merged away"
        );

        let v6: Vec<IpNet> = (0..300u128)
            .map(|i| {
                IpNet::new(Ipv6Addr::from((0xfd00u128 << 112) + (i << 64)).into(), 64).unwrap()
            })
            .chain(nets(&["fe80::/10"]))
            .collect();
        let groups6 = masked_groups(&cidr_set(Family::V6, v6.clone())).expect("v6 groups");
        assert_eq!(covered(&groups6, true), merged_ranges(&v6));
    }

    #[test]
    fn short_or_ragged_cidr_lists_stay_one_interval_set() {
        let short = nets(&["10.0.0.0/8", "192.168.0.0/16"]);
        assert!(masked_groups(&cidr_set(Family::V4, short)).is_none());
        // 300 CIDRs of 15 prefix lengths (/18 to /32), none merging: more groups than the
        // bound.
        let ragged: Vec<IpNet> = (0..300u32)
            .map(|i| {
                let len = 18 + (i % 15) as u8;
                IpNet::new(Ipv4Addr::from(0x0c00_0000 + (i << 16)).into(), len).unwrap()
            })
            .collect();
        assert!(masked_groups(&cidr_set(Family::V4, ragged)).is_none());
    }

    #[test]
    fn a_rule_on_a_masked_set_becomes_one_rule_per_prefix() {
        let mut exclude: Vec<IpNet> = (0..300u32)
            .map(|i| IpNet::new(Ipv4Addr::from(0x0b00_0000 + (i << 8)).into(), 25).unwrap())
            .collect();
        exclude.push("10.0.0.0/8".parse().unwrap());
        let few = crate::CaptureConfig {
            outbound_exclude_cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "11.0.0.0/25".parse().unwrap(),
            ],
            ..crate::CaptureConfig::istio_sidecar_default()
        };
        let many = crate::CaptureConfig {
            outbound_exclude_cidrs: exclude,
            ..crate::CaptureConfig::istio_sidecar_default()
        };
        let (t_few, t_many) = (
            lower(&crate::plan(&few).unwrap()),
            lower(&crate::plan(&many).unwrap()),
        );
        let count = |t: &NftTable| t.chains.iter().map(|c| c.rules.len()).sum::<usize>();
        assert_eq!(
            count(&t_many),
            count(&t_few) + 1,
            "one lookup rule became two"
        );
        let names: Vec<&str> = t_many.sets.iter().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"ip-exclude-cidrs_m25") && names.contains(&"ip-exclude-cidrs_m8"),
            "{names:?}"
        );
        let m25 = t_many
            .sets
            .iter()
            .find(|s| s.name.ends_with("_m25"))
            .unwrap();
        assert_eq!(
            (m25.interval, m25.size, m25.elements.len()),
            (false, Some(512), 300)
        );
        let rule = t_many
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .find(|r| {
                r.iter()
                    .any(|e| matches!(e, Expr::Lookup { set, .. } if set.ends_with("_m8")))
            })
            .unwrap();
        assert!(rule.contains(&Expr::Mask(vec![255, 0, 0, 0])), "{rule:?}");
        // Set ids stay unique and dense.
        let ids: Vec<u32> = t_many.sets.iter().map(|s| s.id).collect();
        assert_eq!(ids, (1..=ids.len() as u32).collect::<Vec<_>>());
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
