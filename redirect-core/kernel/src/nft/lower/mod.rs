//! Lowering a `Ruleset` into the objects of our one `inet` table: chains, rules made of
//! expressions, and sets.
//!
//! Layout: one base chain per (stage, hook) that dispatches on `meta nfproto` to the chains of
//! each family (`<stage>_<family>_<name>`). So a family without rules never matches anything, and
//! a RETURN in a family's built-in chain ends the stage for that packet, as in iptables.
//!
//! Here: the table's typed objects, the names, and the base chains; `rules` lowers a planned
//! rule to expressions, `sets` lowers the named sets (long CIDR lists as hash sets per prefix).

use super::expr::{Expr, MetaKey, Verdict};
use redirect_model::{CountedPath, Family, Hook, HookedChains, Ruleset, Stage};

mod rules;
mod sets;

use redirect_model::table::{base_chain_name, chain_name, TABLE};
/// The type of a base chain; the model decides it (`Stage::chain_kind`).
pub use redirect_model::ChainKind;
pub use sets::addr_elem;

/// A base chain's hook, kind and priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseSpec {
    /// The netfilter hook it is attached to.
    pub hook: Hook,
    /// Its type (`nat`, `filter`, ...).
    pub kind: ChainKind,
    /// Its priority on the hook: lower runs first.
    pub priority: i32,
}

/// A chain of our table: a base chain on a hook, or a regular chain reached by a jump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftChain {
    /// Its name in the table.
    pub name: String,
    /// Its hook, type and priority for a base chain; `None` for a regular chain.
    pub base: Option<BaseSpec>,
    /// Its rules in order, each the list of its expressions.
    pub rules: Vec<Vec<Expr>>,
}

/// A set as the kernel stores it: CIDR sets become interval sets of [start, end) ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftSet {
    /// Its name in the table.
    pub name: String,
    /// Its id within a batch (`NFTA_SET_ID`), by which the batch's rules and elements find a
    /// set added in the same batch; 0 for a set already committed.
    pub id: u32,
    /// nft key type (`inet_service` 13, `ipv4_addr` 7, `ipv6_addr` 8) and its length.
    pub key_type: u32,
    /// The key's length in bytes.
    pub key_len: u32,
    /// Whether it is an interval set (`flags interval`), holding ranges.
    pub interval: bool,
    /// The size the set is declared with (`NFTA_SET_DESC_SIZE`), if any: given for the hash
    /// sets of a masked CIDR list, so the kernel picks its fixed-size hash.
    pub size: Option<u32>,
    /// Element keys in order; for interval sets, each range is a start key followed, unless it
    /// runs to the end of the address space, by an end key (flagged interval-end).
    pub elements: Vec<SetElem>,
}

/// One element of a set as the kernel stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetElem {
    /// The key's bytes, in network order.
    pub key: Vec<u8>,
    /// Whether it ends a range of an interval set (`NFT_SET_ELEM_INTERVAL_END`) rather than
    /// starting one.
    pub interval_end: bool,
}

/// A table of ours, lowered: its name (ours, [`redirect_model::table::TABLE`], unless a job
/// for another table of ours says otherwise), chains and sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftTable {
    /// The table's name (its family is always `inet`).
    pub name: String,
    /// Its chains: the base chains first, then the families' chains.
    pub chains: Vec<NftChain>,
    /// Its sets.
    pub sets: Vec<NftSet>,
}

impl Default for NftTable {
    /// Our table, empty.
    fn default() -> Self {
        NftTable::named(TABLE)
    }
}

impl NftTable {
    /// An empty table of ours named `name`.
    pub fn named(name: &str) -> Self {
        NftTable {
            name: name.into(),
            chains: Vec::new(),
            sets: Vec::new(),
        }
    }
}

impl BaseSpec {
    /// The base chain of a stage on a hook, as the model places it.
    pub(crate) fn at(stage: Stage, hook: Hook) -> BaseSpec {
        BaseSpec {
            hook,
            kind: stage.chain_kind(hook),
            priority: stage.priority_at(hook),
        }
    }
}

pub fn nfproto(family: Family) -> u8 {
    match family {
        Family::V4 => libc::NFPROTO_IPV4 as u8,
        Family::V6 => libc::NFPROTO_IPV6 as u8,
    }
}

/// Lower a ruleset into the objects of our table.
pub fn lower(rs: &Ruleset) -> NftTable {
    lower_named(rs, TABLE)
}

/// Lower a ruleset into the objects of our table named `name`.
pub fn lower_named(rs: &Ruleset, name: &str) -> NftTable {
    let mut table = NftTable::named(name);
    let forms = sets::lower_sets(&rs.sets, &mut table.sets);
    // Base dispatch chains, for every (stage, hook) some family uses.
    table
        .chains
        .extend(rs.hooked_chains().iter().map(dispatch_chain));
    table
        .chains
        .extend(rs.chains.iter().map(|c| rules::lower_chain(c, &forms)));
    table
}

/// A rule of our table that carries a counter (counters on): where it is, and its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountedRule {
    /// The chain's name in the table.
    pub chain: String,
    /// The rule's position in the chain, from 0.
    pub index: usize,
    /// The path its counter adds to.
    pub path: CountedPath,
}

/// The rules of `rs`, lowered, that carry a counter: where a read of the counters finds each
/// path's (see [`crate::nft::counters`]).
pub fn counted_rules(rs: &Ruleset) -> Vec<CountedRule> {
    let forms = sets::lower_sets(&rs.sets, &mut Vec::new());
    let mut out = Vec::new();
    for c in &rs.chains {
        let (chain, paths) = rules::lower_chain_counted(c, &forms);
        for (index, path) in paths.into_iter().enumerate() {
            if let Some(path) = path {
                let chain = chain.name.clone();
                out.push(CountedRule { chain, index, path });
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;
    use std::net::Ipv4Addr;

    #[test]
    fn a_rule_on_a_masked_set_becomes_one_rule_per_prefix() {
        let mut exclude: Vec<IpNet> = (0..300u32)
            .map(|i| IpNet::new(Ipv4Addr::from(0x0b00_0000 + (i << 8)).into(), 25).unwrap())
            .collect();
        exclude.push("10.0.0.0/8".parse().unwrap());
        let few = redirect_model::CaptureConfig {
            outbound_exclude_cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "11.0.0.0/25".parse().unwrap(),
            ],
            ..redirect_model::CaptureConfig::istio_sidecar_default()
        };
        let many = redirect_model::CaptureConfig {
            outbound_exclude_cidrs: exclude,
            ..redirect_model::CaptureConfig::istio_sidecar_default()
        };
        let (t_few, t_many) = (
            lower(&redirect_testkit::plan(&few).unwrap()),
            lower(&redirect_testkit::plan(&many).unwrap()),
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
        let cfg = redirect_model::CaptureConfig {
            ipv6: true,
            ..redirect_model::CaptureConfig::istio_sidecar_default()
        };
        let t = lower(&redirect_testkit::plan(&cfg).unwrap());
        let out = t.chains.iter().find(|c| c.name == "nat_output").unwrap();
        assert_eq!(out.rules.len(), 2);
        assert!(t.chains.iter().any(|c| c.name == "nat_ip6_istio_output"));
        let cfg4 = redirect_model::CaptureConfig::istio_sidecar_default();
        let t4 = lower(&redirect_testkit::plan(&cfg4).unwrap());
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
