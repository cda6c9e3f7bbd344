//! Our table as the kernel holds it, in the typed form we encode from: what a dump (`dump`)
//! reads and what a plan should hold (`expected`), for `compare` to set side by side.

use std::fmt;

use super::expr::Expr;
use super::lower::{NftTable, SetElem};
use super::message::SET_INTERVAL;
use redirect_model::Hook;

/// A table as read back: its flags, chains (sorted by name) and sets (sorted by name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    /// `NFTA_TABLE_FLAGS`: 0 for ours. `dormant` unhooks every chain: nothing is captured,
    /// whatever the rules say.
    pub flags: u32,
    /// Its chains, sorted by name.
    pub chains: Vec<ChainState>,
    /// Its sets, sorted by name.
    pub sets: Vec<SetState>,
}

/// A chain as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainState {
    /// Its name in the table.
    pub name: String,
    /// What makes it a base chain; `None` for a regular chain.
    pub base: Option<BaseState>,
    /// Each rule's expressions, in order.
    pub rules: Vec<Vec<Expr>>,
}

/// What makes a chain a base chain: its type, hook, priority and policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseState {
    /// The chain's type as nft names it (`nat`, `filter`, `route`).
    pub kind: String,
    /// The `inet` hook number (`NF_INET_*`).
    pub hook: u32,
    /// Its priority on the hook: lower runs first.
    pub priority: i32,
    /// The verdict for a packet no rule decided: 1 accept (ours), 0 drop.
    pub policy: u32,
}

impl BaseState {
    pub(super) fn hook_name(&self) -> String {
        match Hook::from_number(self.hook) {
            Some(h) => h.nf_name().into(),
            None => format!("hook#{}", self.hook),
        }
    }
}

impl fmt::Display for BaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = match self.policy {
            1 => "accept".to_string(),
            0 => "drop".to_string(),
            p => p.to_string(),
        };
        write!(
            f,
            "type {} hook {} priority {} policy {policy}",
            self.kind,
            self.hook_name(),
            self.priority
        )
    }
}

/// A set as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetState {
    /// Its name in the table.
    pub name: String,
    /// nft key type (`inet_service` 13, `ipv4_addr` 7, `ipv6_addr` 8) and key length.
    pub key_type: u32,
    /// The key's length in bytes.
    pub key_len: u32,
    /// `NFTA_SET_FLAGS` (interval, constant, ...); ours carry at most interval.
    pub flags: u32,
    /// The declared size, if any (`NFTA_SET_DESC_SIZE`).
    pub size: Option<u32>,
    /// Element keys, sorted (interval sets hold start and end keys).
    pub elements: Vec<SetElem>,
}

impl SetState {
    /// Whether it is an interval set (holds ranges).
    pub fn interval(&self) -> bool {
        self.flags & SET_INTERVAL != 0
    }

    /// Key type, key length and flags, as one phrase.
    pub fn spec(&self) -> String {
        format!(
            "key type {} len {}{}",
            self.key_type,
            self.key_len,
            if self.interval() { " interval" } else { "" }
        )
    }

    pub(super) fn same_spec(&self, other: &SetState) -> bool {
        (self.key_type, self.key_len, self.flags) == (other.key_type, other.key_len, other.flags)
    }
}

impl TableState {
    /// The chain named `name`, if the table has it.
    pub fn chain(&self, name: &str) -> Option<&ChainState> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// The set named `name`, if the table has it.
    pub fn set(&self, name: &str) -> Option<&SetState> {
        self.sets.iter().find(|s| s.name == name)
    }

    /// The number of rules in all its chains.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }

    pub(super) fn sort(&mut self) {
        self.chains.sort_by(|a, b| a.name.cmp(&b.name));
        self.sets.sort_by(|a, b| a.name.cmp(&b.name));
        for s in &mut self.sets {
            s.elements
                .sort_by(|a, b| (&a.key, a.interval_end).cmp(&(&b.key, b.interval_end)));
        }
    }
}

/// What the kernel should hold for a lowered table.
pub fn expected(t: &NftTable) -> TableState {
    let mut state = TableState {
        flags: 0,
        chains: t
            .chains
            .iter()
            .map(|c| ChainState {
                name: c.name.clone(),
                base: c.base.map(|b| BaseState {
                    kind: b.kind.name().into(),
                    hook: b.hook.number(),
                    priority: b.priority,
                    policy: 1,
                }),
                rules: c.rules.clone(),
            })
            .collect(),
        sets: t
            .sets
            .iter()
            .map(|s| SetState {
                name: s.name.clone(),
                key_type: s.key_type,
                key_len: s.key_len,
                flags: if s.interval { SET_INTERVAL } else { 0 },
                size: s.size,
                elements: s.elements.clone(),
            })
            .collect(),
    };
    state.sort();
    state
}
