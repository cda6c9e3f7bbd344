//! The tools the plan's steps write with: a family's chains built with iptables' append and
//! insert semantics (so each step reads like Istio's `-A`/`-I` lines), the registry that
//! deduplicates named sets, and shorthands for the matches every step uses.

use ipnet::IpNet;

use crate::ruleset::{
    Action, Chain, CountedPath, Family, Hook, Match, NamedSet, PortMatch, Rule, SetElements, Stage,
    L4,
};

/// Named sets, deduplicated by name.
#[derive(Default)]
pub(super) struct SetRegistry {
    pub(super) sets: Vec<NamedSet>,
}

impl SetRegistry {
    pub(super) fn ports(&mut self, name: &str, ports: &[u16]) -> String {
        let mut p = ports.to_vec();
        p.sort_unstable();
        p.dedup();
        self.add(NamedSet {
            name: name.to_string(),
            family: None,
            elements: SetElements::Ports(p),
        })
    }

    pub(super) fn cidrs(&mut self, name: &str, family: Family, cidrs: &[IpNet]) -> String {
        self.add(NamedSet {
            name: super::sets::cidr_set(family, name),
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
pub(super) struct Builder {
    family: Family,
    chains: Vec<Chain>,
    /// Counters on (opt-in): the rules appended with a path carry a counter.
    counting: bool,
}

impl Builder {
    pub(super) fn new(family: Family) -> Self {
        Builder::counting(family, false)
    }

    /// A builder whose counted rules carry a counter when `on`.
    pub(super) fn counting(family: Family, on: bool) -> Self {
        Builder {
            family,
            chains: Vec::new(),
            counting: on,
        }
    }

    /// Whether counted rules carry a counter.
    pub(super) fn counts(&self) -> bool {
        self.counting
    }

    fn chain(&mut self, stage: Stage, name: &str) -> &mut Chain {
        let pos = self
            .chains
            .iter()
            .position(|c| c.stage == stage && c.name == name);
        let i = match pos {
            Some(i) => i,
            None => {
                self.chains.push(Chain {
                    family: self.family,
                    stage,
                    name: name.to_string(),
                    hook: Hook::of_chain(name),
                    rules: Vec::new(),
                });
                self.chains.len() - 1
            }
        };
        &mut self.chains[i]
    }

    /// `-A chain`.
    pub(super) fn append(
        &mut self,
        stage: Stage,
        chain: &str,
        matches: Vec<Match>,
        action: Action,
    ) {
        self.ensure_target(stage, &action);
        self.chain(stage, chain)
            .rules
            .push(Rule::new(matches, action));
    }

    /// `-A chain`, a rule deciding `path`: with counters on, its counter adds to that path.
    pub(super) fn append_counted(
        &mut self,
        path: CountedPath,
        (stage, chain): (Stage, &str),
        matches: Vec<Match>,
        action: Action,
    ) {
        self.append(stage, chain, matches, action);
        if self.counting {
            let rule = self.chain(stage, chain).rules.last_mut();
            rule.expect("just appended").count = Some(path);
        }
    }

    /// `-I chain pos` (1-based, as iptables).
    pub(super) fn insert(
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
    pub(super) fn finish(mut self) -> Vec<Chain> {
        self.chains.sort_by_key(|c| c.stage);
        self.chains
    }
}

pub(super) fn tcp() -> Match {
    Match::Proto(L4::Tcp)
}
pub(super) fn udp() -> Match {
    Match::Proto(L4::Udp)
}
pub(super) fn dport(p: u16) -> Match {
    Match::DPort(PortMatch::Eq(p))
}
pub(super) fn iif(name: &str) -> Match {
    Match::Iif {
        name: name.to_string(),
        negate: false,
    }
}
pub(super) fn oif(name: &str) -> Match {
    Match::Oif {
        name: name.to_string(),
        negate: false,
    }
}
pub(super) fn lo() -> Match {
    oif("lo")
}
pub(super) fn uid(id: u32, negate: bool) -> Match {
    Match::Uid { id, negate }
}
pub(super) fn gid(id: u32, negate: bool) -> Match {
    Match::Gid { id, negate }
}
pub(super) fn jump(chain: &str) -> Action {
    Action::Jump(chain.to_string())
}
