//! `iptables-restore` input, one text per family, in Istio's layout: tables in alphabetical
//! order, `-N` for every chain that is not built in, then the rules, then `COMMIT`; meant for
//! `iptables-restore --noflush` into a namespace without our chains. Sets become one rule per
//! element (iptables has no sets without ipset), in the set's order.

use std::fmt::Write;

use crate::ruleset::{
    Action, AddrMatch, CtStates, Family, Match, PortMatch, Rule, Ruleset, SetElements, Stage,
};

/// Both families' inputs: `(v4, Some(v6))` when the ruleset has IPv6 chains.
pub fn iptables_restore_all(rs: &Ruleset) -> (String, Option<String>) {
    let v6 = rs
        .families()
        .contains(&Family::V6)
        .then(|| iptables_restore(rs, Family::V6));
    (iptables_restore(rs, Family::V4), v6)
}

/// The input for one family (`iptables-restore` for V4, `ip6tables-restore` for V6).
pub fn iptables_restore(rs: &Ruleset, family: Family) -> String {
    let mut s = String::new();
    let mut stages: Vec<Stage> = Stage::ALL.to_vec();
    stages.sort_by_key(|st| st.table_name());
    for stage in stages {
        let chains: Vec<_> = rs.chains_of(family, stage).collect();
        if chains.is_empty() {
            continue;
        }
        let _ = writeln!(s, "*{}", stage.table_name());
        for c in chains.iter().filter(|c| c.hook.is_none()) {
            let _ = writeln!(s, "-N {}", c.name);
        }
        for c in &chains {
            for r in &c.rules {
                for line in expand(rs, r) {
                    let _ = writeln!(s, "-A {} {}", c.name, line);
                }
            }
        }
        let _ = writeln!(s, "COMMIT");
    }
    s
}

/// A rule as iptables arguments; a set match becomes one line per element.
fn expand(rs: &Ruleset, r: &Rule) -> Vec<String> {
    let mut lines = vec![String::new()];
    for m in &r.matches {
        let alts = match_args(rs, m);
        lines = lines
            .iter()
            .flat_map(|l| {
                alts.iter().map(move |a| {
                    if l.is_empty() {
                        a.clone()
                    } else {
                        format!("{l} {a}")
                    }
                })
            })
            .collect();
    }
    let target = action_args(&r.action);
    lines
        .into_iter()
        .map(|l| {
            if l.is_empty() {
                target.clone()
            } else {
                format!("{l} {target}")
            }
        })
        .collect()
}

fn set_ports(rs: &Ruleset, name: &str) -> Vec<u16> {
    match rs.set(name).map(|s| &s.elements) {
        Some(SetElements::Ports(p)) => p.clone(),
        _ => Vec::new(),
    }
}

fn set_cidrs(rs: &Ruleset, name: &str) -> Vec<String> {
    match rs.set(name).map(|s| &s.elements) {
        Some(SetElements::Cidrs(c)) => c.iter().map(|c| c.to_string()).collect(),
        Some(SetElements::Addrs(a)) => a.iter().map(|a| a.to_string()).collect(),
        _ => Vec::new(),
    }
}

/// The alternatives for one match (more than one only for a set).
fn match_args(rs: &Ruleset, m: &Match) -> Vec<String> {
    let one = |s: String| vec![s];
    let neg = |n: bool| if n { "! " } else { "" };
    match m {
        Match::Proto(p) => one(format!("-p {}", p.name())),
        Match::DPort(pm) | Match::SPort(pm) => {
            let dir = if matches!(m, Match::DPort(_)) {
                "dport"
            } else {
                "sport"
            };
            match pm {
                PortMatch::Eq(p) => one(format!("--{dir} {p}")),
                PortMatch::Ne(p) => one(format!("! --{dir} {p}")),
                PortMatch::NotIn(ps) => one(format!(
                    "-m multiport ! --{dir}s {}",
                    ps.iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )),
                PortMatch::InSet(set) => set_ports(rs, set)
                    .iter()
                    .map(|p| format!("--{dir} {p}"))
                    .collect(),
            }
        }
        Match::DAddr(am) | Match::SAddr(am) => {
            let flag = if matches!(m, Match::DAddr(_)) {
                "-d"
            } else {
                "-s"
            };
            match am {
                AddrMatch::Eq(n) => one(format!("{flag} {n}")),
                AddrMatch::Ne(n) => one(format!("! {flag} {n}")),
                AddrMatch::InSet(set) => set_cidrs(rs, set)
                    .iter()
                    .map(|c| format!("{flag} {c}"))
                    .collect(),
            }
        }
        Match::Iif { name, negate } => one(format!("{}-i {name}", neg(*negate))),
        Match::Oif { name, negate } => one(format!("{}-o {name}", neg(*negate))),
        Match::Uid { id, negate } => one(format!("-m owner {}--uid-owner {id}", neg(*negate))),
        Match::Gid { id, negate } => one(format!("-m owner {}--gid-owner {id}", neg(*negate))),
        Match::Mark { value, negate } => one(format!("-m mark {}--mark {value}", neg(*negate))),
        Match::CtMark { value } => one(format!("-m connmark --mark {value}")),
        Match::MarkBits {
            value,
            mask,
            negate,
        } => one(format!(
            "-m mark {}--mark {value:#x}/{mask:#x}",
            neg(*negate)
        )),
        Match::CtMarkBits { value, mask } => {
            one(format!("-m connmark --mark {value:#x}/{mask:#x}"))
        }
        Match::CtState(CtStates::Invalid) => one("-m conntrack --ctstate INVALID".into()),
        Match::CtState(CtStates::RelatedEstablished) => {
            one("-m conntrack --ctstate RELATED,ESTABLISHED".into())
        }
    }
}

fn action_args(a: &Action) -> String {
    match a {
        Action::Jump(c) => format!("-j {c}"),
        Action::Return => "-j RETURN".into(),
        Action::Accept => "-j ACCEPT".into(),
        Action::Drop => "-j DROP".into(),
        Action::Redirect(p) => format!("-j REDIRECT --to-ports {p}"),
        Action::Tproxy { port, mark } => {
            format!("-j TPROXY --tproxy-mark {mark}/0xffffffff --on-port {port}")
        }
        Action::SetMark(m) => format!("-j MARK --set-mark {m}"),
        Action::SaveMark => "-j CONNMARK --save-mark".into(),
        Action::RestoreMark => "-j CONNMARK --restore-mark".into(),
        Action::CtZone(z) => format!("-j CT --zone {z}"),
        Action::SetCtMarkBits { value, mask } => {
            format!("-j CONNMARK --set-xmark {value:#x}/{mask:#x}")
        }
        Action::Snat(a) => format!("-j SNAT --to-source {a}"),
    }
}
