//! The model's stages and hooks, and where they sit in netfilter: each hook's names and
//! `NF_INET_*` number, each stage's priority, and the type of base chain a (stage, hook) needs;
//! and the (stage, hook) pairs a ruleset uses (`HookedChains`, from `Ruleset::hooked_chains`).
//! One table, read by the nftables lowering, the nft script, the read-back's text and the plan,
//! so that they cannot disagree.

use serde::{Deserialize, Serialize};

use super::Chain;

/// The netfilter stage a chain runs at, named after the iptables table with the same priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Priority -300, before conntrack: conntrack zones.
    Raw,
    /// Priority -150: marks, TPROXY, invalid drop.
    Mangle,
    /// Priority -100, first packet of a connection only: REDIRECT.
    Nat,
}

impl Stage {
    /// Every stage, in the order netfilter runs them (raw, mangle, nat).
    pub const ALL: [Stage; 3] = [Stage::Raw, Stage::Mangle, Stage::Nat];

    /// The iptables table name.
    pub fn table_name(self) -> &'static str {
        match self {
            Stage::Raw => "raw",
            Stage::Mangle => "mangle",
            Stage::Nat => "nat",
        }
    }

    /// The netfilter hook priority of this stage.
    pub fn priority(self) -> i32 {
        match self {
            Stage::Raw => -300,
            Stage::Mangle => -150,
            Stage::Nat => -100,
        }
    }

    /// The netfilter priority of this stage's base chain on `hook`: the stage's, except
    /// nat at POSTROUTING, which is source NAT's place (`srcnat`, 100) as in iptables.
    pub fn priority_at(self, hook: Hook) -> i32 {
        match (self, hook) {
            (Stage::Nat, Hook::Postrouting) => 100,
            _ => self.priority(),
        }
    }

    /// The type of the base chain of this stage on `hook`. Mangle output is a route chain so
    /// a changed mark re-routes the packet, as iptables does.
    pub fn chain_kind(self, hook: Hook) -> ChainKind {
        match (self, hook) {
            (Stage::Nat, _) => ChainKind::Nat,
            (Stage::Mangle, Hook::Output) => ChainKind::Route,
            _ => ChainKind::Filter,
        }
    }
}

/// The netfilter hook of a built-in chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Hook {
    /// Before routing: packets arriving on an interface, `lo` included.
    Prerouting,
    /// Packets sent by a local process, which still carry their socket (owner UID/GID).
    Output,
    /// After routing, on the way out: where source NAT runs (the host's probe SNAT).
    Postrouting,
}

impl Hook {
    /// Every hook the model uses, in the order a backend declares their base chains.
    pub const ALL: [Hook; 3] = [Hook::Prerouting, Hook::Output, Hook::Postrouting];

    /// The iptables built-in chain name.
    pub fn chain_name(self) -> &'static str {
        match self {
            Hook::Prerouting => "PREROUTING",
            Hook::Output => "OUTPUT",
            Hook::Postrouting => "POSTROUTING",
        }
    }

    /// The hook of an iptables built-in chain name; `None` for any other chain.
    pub fn of_chain(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.chain_name() == name)
    }

    /// netfilter's name of the hook, as nft writes it (`hook prerouting`).
    pub fn nf_name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }

    /// The `inet` hook number (`NF_INET_*`), as netlink carries it.
    pub fn number(self) -> u32 {
        let n = match self {
            Hook::Prerouting => libc::NF_INET_PRE_ROUTING,
            Hook::Output => libc::NF_INET_LOCAL_OUT,
            Hook::Postrouting => libc::NF_INET_POST_ROUTING,
        };
        n as u32
    }

    /// The hook with an `inet` hook number; `None` for a hook we never use.
    pub fn from_number(n: u32) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.number() == n)
    }
}

/// The type of a base chain (`type` in nft).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainKind {
    /// A plain base chain (`type filter`): raw, and mangle except at OUTPUT.
    Filter,
    /// Like `Filter`, but a packet whose mark changed is routed again (`type route`): mangle at
    /// OUTPUT.
    Route,
    /// Sees only the first packet of a connection, whose NAT conntrack then applies to the
    /// rest (`type nat`).
    Nat,
}

impl ChainKind {
    /// The type's name as nft writes it (`filter`, `route`, `nat`).
    pub fn name(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Route => "route",
            ChainKind::Nat => "nat",
        }
    }
}

/// One (stage, hook) that chains of the ruleset are hooked at, with those chains (one per
/// family that has it), in the ruleset's order.
#[derive(Clone, Debug)]
pub struct HookedChains<'a> {
    /// The stage of the base chain.
    pub stage: Stage,
    /// The hook of the base chain.
    pub hook: Hook,
    /// The ruleset's built-in chains at this stage and hook, at most one per family.
    pub chains: Vec<&'a Chain>,
}
