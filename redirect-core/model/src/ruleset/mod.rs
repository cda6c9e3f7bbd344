//! The backend-neutral ruleset: what `plan()` produces and every backend consumes.
//!
//! It is shaped like Istio's iptables rules on purpose: one list of chains per address family,
//! each chain at a netfilter stage (raw, mangle, nat) and, for the built-in ones, on a hook. That
//! keeps the iptables-restore rendering direct and the parity with Istio easy to reason about;
//! the nftables backend folds it into one `inet` table (see `nft`).
//!
//! The stages and hooks, and where each sits in netfilter (names, numbers, priorities, base
//! chain types), are in `hooks`, the one table every backend reads it from.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

mod counted;
mod hooks;

pub use counted::{Count, CountedPath, PathCounts};
pub use hooks::{ChainKind, Hook, HookedChains, Stage};

/// Address family of a chain. Rules of a family never see the other family's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4 (nft `ip`, iptables).
    V4,
    /// IPv6 (nft `ip6`, ip6tables).
    V6,
}

impl Family {
    /// Both families, IPv4 first: the order chains are kept in.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The nftables name of the family (`ip`, `ip6`).
    pub fn nft_name(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

/// Transport protocol of a match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum L4 {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl L4 {
    /// The protocol's name as nft and iptables write it (`tcp`, `udp`).
    pub fn name(self) -> &'static str {
        match self {
            L4::Tcp => "tcp",
            L4::Udp => "udp",
        }
    }

    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4::Tcp => libc::IPPROTO_TCP as u8,
            L4::Udp => libc::IPPROTO_UDP as u8,
        }
    }
}

/// Conntrack states a rule can match (any of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CtStates {
    /// A packet conntrack could not place (`ct state invalid`).
    Invalid,
    /// A packet of a connection conntrack already knows, or related to one
    /// (`ct state related,established`).
    RelatedEstablished,
}

/// A port condition. Port lists of more than one port are named sets (`InSet`), except the
/// short negated list Istio writes as `-m multiport ! --dports 53,15008`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortMatch {
    /// The port is this one.
    Eq(u16),
    /// The port is not this one.
    Ne(u16),
    /// The port is none of these (a short list written inline).
    NotIn(Vec<u16>),
    /// The port is in the named port set.
    InSet(String),
}

/// An address condition on a CIDR, or membership of a named CIDR set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AddrMatch {
    /// The address is within this CIDR.
    Eq(IpNet),
    /// The address is outside this CIDR.
    Ne(IpNet),
    /// The address is in the named set (CIDRs or single addresses).
    InSet(String),
}

/// One condition of a rule. A port match requires an earlier `Proto` in the same rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Match {
    /// The transport protocol.
    Proto(L4),
    /// The destination port.
    DPort(PortMatch),
    /// The source port.
    SPort(PortMatch),
    /// The destination address.
    DAddr(AddrMatch),
    /// The source address.
    SAddr(AddrMatch),
    /// Input interface name; `negate` inverts.
    Iif {
        /// The interface name (`eth0`, `lo`).
        name: String,
        /// Match every other interface instead.
        negate: bool,
    },
    /// Output interface name.
    Oif {
        /// The interface name (`eth0`, `lo`).
        name: String,
        /// Match every other interface instead.
        negate: bool,
    },
    /// Owner UID of the local socket (output path only).
    Uid {
        /// The UID.
        id: u32,
        /// Match sockets of every other UID instead.
        negate: bool,
    },
    /// Owner GID of the local socket (output path only).
    Gid {
        /// The GID.
        id: u32,
        /// Match sockets of every other GID instead.
        negate: bool,
    },
    /// Packet mark.
    Mark {
        /// The whole mark to compare with.
        value: u32,
        /// Match every other mark instead.
        negate: bool,
    },
    /// Connection mark.
    CtMark {
        /// The whole connection mark to compare with.
        value: u32,
    },
    /// Packet mark bits: `mark & mask == value` (`negate`: `!=`), iptables' `--mark value/mask`.
    MarkBits {
        /// The bits wanted under `mask`.
        value: u32,
        /// The bits of the mark compared.
        mask: u32,
        /// Match when the bits differ instead.
        negate: bool,
    },
    /// Connection mark bits: `ct mark & mask == value`.
    CtMarkBits {
        /// The bits wanted under `mask`.
        value: u32,
        /// The bits of the connection mark compared.
        mask: u32,
    },
    /// The conntrack state is one of these.
    CtState(CtStates),
}

/// What a rule does when all its matches hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Continue in the named chain (same family and stage), then come back.
    Jump(String),
    /// Leave this chain; in a built-in chain, the packet goes on unchanged.
    Return,
    /// Stop this stage's processing; the packet goes on.
    Accept,
    /// Discard the packet.
    Drop,
    /// NAT the destination to this port on the local host (first packet of a connection).
    Redirect(u16),
    /// Assign to the local transparent socket on this port and set the packet mark; drop when
    /// no such socket exists (as xt_TPROXY does).
    Tproxy {
        /// The port of the transparent socket (the proxy's inbound port).
        port: u16,
        /// The packet mark set, which policy routing delivers locally.
        mark: u32,
    },
    /// Set the packet mark and go on.
    SetMark(u32),
    /// Copy the packet mark into the connection mark and go on.
    SaveMark,
    /// Copy the connection mark into the packet mark and go on.
    RestoreMark,
    /// Put the connection in this conntrack zone and go on (raw stage only).
    CtZone(u16),
    /// Set the connection mark's bits under `mask` to `value` (the others kept) and go on:
    /// iptables' `CONNMARK --set-xmark value/mask` for a `value` within `mask`.
    SetCtMarkBits {
        /// The bits written under `mask`.
        value: u32,
        /// The bits of the connection mark that change.
        mask: u32,
    },
    /// Rewrite the connection's source address to this one (nat stage, POSTROUTING only; first
    /// packet of a connection), iptables' `SNAT --to-source`. The address's family is the
    /// chain's.
    Snat(IpAddr),
}

/// One rule of a chain: when every match holds, the action runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    /// The conditions, all of which must hold; an empty list matches every packet.
    pub matches: Vec<Match>,
    /// What the rule does to a matching packet.
    pub action: Action,
    /// With counters on (opt-in), the path whose counter this rule adds to; `None` for a rule
    /// without a counter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<CountedPath>,
}

impl Rule {
    /// A rule from its conditions and action, without a counter.
    pub fn new(matches: Vec<Match>, action: Action) -> Self {
        Rule {
            matches,
            action,
            count: None,
        }
    }
}

/// A chain of one family at one stage. Built-in chains (`hook` set) are named after the hook
/// (`PREROUTING`, `OUTPUT`), the others carry Istio's names (`ISTIO_OUTPUT`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    /// The family whose packets it sees.
    pub family: Family,
    /// The stage it runs at; jumps stay within it.
    pub stage: Stage,
    /// The built-in name (`OUTPUT`) or Istio's (`ISTIO_OUTPUT`), which jumps name.
    pub name: String,
    /// The hook of a built-in chain; `None` for a chain reached only by jumps.
    pub hook: Option<Hook>,
    /// The rules, in the order they are tried.
    pub rules: Vec<Rule>,
}

/// The elements of a named set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SetElements {
    /// Ports (nft `inet_service`), sorted and without duplicates.
    Ports(Vec<u16>),
    /// CIDRs of one family, aggregated (no overlaps), sorted.
    Cidrs(Vec<IpNet>),
    /// Single addresses of one family, in a plain (hashed) set whose elements change at run
    /// time (added and removed one by one, not planned): the host's probe sets. Usually
    /// empty in a plan.
    Addrs(Vec<IpAddr>),
}

/// A named set. CIDR sets belong to one family; port sets serve both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedSet {
    /// The name rules look it up by (`PortMatch::InSet`, `AddrMatch::InSet`).
    pub name: String,
    /// The family of a CIDR or address set; `None` for a port set.
    pub family: Option<Family>,
    /// What the set holds.
    pub elements: SetElements,
}

/// The whole plan for one network namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruleset {
    /// Chains in a stable order: by family, stage, then the order they were first used.
    pub chains: Vec<Chain>,
    /// The named sets the rules look values up in.
    pub sets: Vec<NamedSet>,
}

impl Ruleset {
    /// Every (stage, hook) some chain is hooked at, in stage then hook order: the base chains
    /// a backend declares.
    pub fn hooked_chains(&self) -> Vec<HookedChains<'_>> {
        let mut out = Vec::new();
        for stage in Stage::ALL {
            for hook in Hook::ALL {
                let chains: Vec<&Chain> = self
                    .chains
                    .iter()
                    .filter(|c| c.stage == stage && c.hook == Some(hook))
                    .collect();
                if !chains.is_empty() {
                    out.push(HookedChains {
                        stage,
                        hook,
                        chains,
                    });
                }
            }
        }
        out
    }

    /// The chain named `name` of one family and stage, if the plan has it.
    pub fn chain(&self, family: Family, stage: Stage, name: &str) -> Option<&Chain> {
        self.chains
            .iter()
            .find(|c| c.family == family && c.stage == stage && c.name == name)
    }

    /// The named set `name`, if the plan has it.
    pub fn set(&self, name: &str) -> Option<&NamedSet> {
        self.sets.iter().find(|s| s.name == name)
    }

    /// The families that have at least one chain.
    pub fn families(&self) -> Vec<Family> {
        let mut f: Vec<Family> = self.chains.iter().map(|c| c.family).collect();
        f.sort();
        f.dedup();
        f
    }

    /// The chains of one family and stage, in order.
    pub fn chains_of(&self, family: Family, stage: Stage) -> impl Iterator<Item = &Chain> {
        self.chains
            .iter()
            .filter(move |c| c.family == family && c.stage == stage)
    }

    /// Number of rules in all chains.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}
