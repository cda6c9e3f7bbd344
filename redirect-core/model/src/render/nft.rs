//! `nft -f` script rendering. The script describes the same table layout as the netlink
//! backend (`redirect_kernel::nft`) and replaces the table atomically when loaded.

use std::fmt::Write;

use crate::config::join_with;
use crate::ruleset::{
    Action, AddrMatch, CtStates, Family, HookedChains, Match, NamedSet, PortMatch, Rule, Ruleset,
    SetElements, Stage,
};
use crate::table::{base_chain_name, chain_name, port_form, PortForm, TABLE};

/// The whole ruleset as an `nft -f` script: create-then-delete our table, then define it, so
/// loading it replaces any previous version in one transaction.
pub fn nft_script(rs: &Ruleset) -> String {
    nft_script_named(rs, TABLE, "sidecar capture rules")
}

/// The script of `capture` planned as `rs`: its own table, its own header.
pub fn nft_script_of(capture: &crate::Capture, rs: &Ruleset) -> String {
    nft_script_named(rs, capture.table(), capture.what())
}

/// [`nft_script`] for a table of ours with another name (the host's probe SNAT table,
/// `table::HOST_PROBE_TABLE`); `what` goes in the first line's comment.
pub fn nft_script_named(rs: &Ruleset, table: &str, what: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# redirect: {what}; load with `nft -f`");
    let _ = writeln!(s, "table inet {table} {{}}");
    let _ = writeln!(s, "delete table inet {table}");
    let _ = writeln!(s, "table inet {table} {{");
    for set in &rs.sets {
        write_set(&mut s, set);
    }
    for h in rs.hooked_chains() {
        write_base_chain(&mut s, &h);
    }
    for c in &rs.chains {
        let _ = writeln!(s, "\tchain {} {{", chain_name(c.stage, c.family, &c.name));
        for r in &c.rules {
            for line in nft_rule_in(r, c.family, c.stage, &rs.sets) {
                let _ = writeln!(s, "\t\t{line}");
            }
        }
        let _ = writeln!(s, "\t}}");
    }
    let _ = writeln!(s, "}}");
    s
}

fn write_set(s: &mut String, set: &NamedSet) {
    let (ty, flags, elems) = match &set.elements {
        // A long list as the netlink backend lowers it (`PortForm`).
        SetElements::Ports(p) => match port_form(p) {
            PortForm::Ranges(ranges) => (
                "type inet_service",
                " flags interval;".to_string(),
                ranges
                    .iter()
                    .map(|(a, b)| {
                        if a == b {
                            a.to_string()
                        } else {
                            format!("{a}-{b}")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            PortForm::Hashed(ports) => (
                "typeof @th,16,32",
                format!(" size {};", hashed_size(ports.len())),
                ports
                    .iter()
                    .map(|p| format!("0x{p:04x}0000"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            PortForm::Plain => ("type inet_service", String::new(), join_with(p, ", ")),
        },
        SetElements::Cidrs(c) => (
            addr_type(set),
            " flags interval;".to_string(),
            join_with(c, ", "),
        ),
        SetElements::Addrs(a) => (addr_type(set), String::new(), join_with(a, ", ")),
    };
    let _ = write!(s, "\tset {} {{ {ty};{flags}", set.name);
    if !elems.is_empty() {
        let _ = write!(s, " elements = {{ {elems} }}");
    }
    let _ = writeln!(s, " }}");
}

fn addr_type(set: &NamedSet) -> &'static str {
    if set.family == Some(Family::V6) {
        "type ipv6_addr"
    } else {
        "type ipv4_addr"
    }
}

/// The size a hashed set is declared with: a power of two at least its count (at least 64), so
/// a refill with a few more keys fits, as for the hashed CIDR sets.
pub fn hashed_size(count: usize) -> u32 {
    (count as u32).next_power_of_two().max(64)
}

/// The base chain of a (stage, hook), dispatching to each family's chain as the netlink
/// backend's does.
fn write_base_chain(s: &mut String, h: &HookedChains) {
    let (stage, hook) = (h.stage, h.hook);
    let _ = writeln!(s, "\tchain {} {{", base_chain_name(stage, hook));
    let _ = writeln!(
        s,
        "\t\ttype {} hook {} priority {}; policy accept;",
        stage.chain_kind(hook).name(),
        hook.nf_name(),
        stage.priority_at(hook)
    );
    for c in &h.chains {
        let proto = match c.family {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        };
        let _ = writeln!(
            s,
            "\t\tmeta nfproto {proto} jump {}",
            chain_name(stage, c.family, &c.name)
        );
    }
    let _ = writeln!(s, "\t}}");
}

/// One rule in nft syntax (TPROXY takes two: the tproxy and the drop when no socket is found).
/// A port set is named as in a short list's rule; [`nft_rule_in`] writes the masked load the
/// kernel's rule has for a hashed one.
pub fn nft_rule(r: &Rule, family: Family, stage: Stage) -> Vec<String> {
    nft_rule_in(r, family, stage, &[])
}

/// [`nft_rule`], with the ruleset's sets: a port match on a hashed port set is written as the
/// kernel holds it, `@th,16,32 & 0xffff0000 @set` (`@th,0,32` for the source port).
pub fn nft_rule_in(r: &Rule, family: Family, stage: Stage, sets: &[NamedSet]) -> Vec<String> {
    let fam = family.nft_name();
    let hashed = |name: &str| {
        sets.iter().any(|s| {
            s.name == name
                && matches!(&s.elements, SetElements::Ports(p) if matches!(port_form(p), PortForm::Hashed(_)))
        })
    };
    let mut m: Vec<String> = Vec::new();
    for cond in &r.matches {
        m.push(match_text(cond, fam, &hashed));
    }
    // A counted rule counts what matched, before its statement (`... counter redirect ...`).
    if r.count.is_some() {
        m.push("counter".into());
    }
    let prefix = if m.is_empty() {
        String::new()
    } else {
        format!("{} ", m.join(" "))
    };
    let action = match &r.action {
        Action::Jump(t) => format!("jump {}", chain_name(stage, family, t)),
        Action::Return => "return".into(),
        Action::Accept => "accept".into(),
        Action::Drop => "drop".into(),
        Action::Redirect(p) => format!("redirect to :{p}"),
        Action::Tproxy { port, mark } => {
            return vec![
                format!("{prefix}tproxy {fam} to :{port} meta mark set {mark} accept"),
                format!("{prefix}drop"),
            ]
        }
        Action::SetMark(v) => format!("meta mark set {v}"),
        Action::SaveMark => "ct mark set meta mark".into(),
        Action::RestoreMark => "meta mark set ct mark".into(),
        Action::CtZone(z) => format!("ct zone set {z}"),
        Action::SetCtMarkBits { value, mask } => {
            format!("ct mark set ct mark & {:#x} | {value:#x}", !mask)
        }
        // An inet table needs the family named: `snat ip to ...`.
        Action::Snat(a) => format!("snat {fam} to {a}"),
    };
    vec![format!("{prefix}{action}")]
}

/// One match in nft syntax; `hashed` tells a hashed port set by its name.
fn match_text(cond: &Match, fam: &str, hashed: &dyn Fn(&str) -> bool) -> String {
    match cond {
        Match::Proto(p) => format!("meta l4proto {}", p.name()),
        Match::DPort(PortMatch::InSet(s)) if hashed(s) => {
            format!("@th,16,32 & 0xffff0000 @{s}")
        }
        Match::SPort(PortMatch::InSet(s)) if hashed(s) => format!("@th,0,32 & 0xffff0000 @{s}"),
        Match::DPort(pm) => port("dport", pm),
        Match::SPort(pm) => port("sport", pm),
        Match::DAddr(am) => addr(fam, "daddr", am),
        Match::SAddr(am) => addr(fam, "saddr", am),
        Match::Iif { name, negate } => format!("iifname {}\"{name}\"", neg(*negate)),
        Match::Oif { name, negate } => format!("oifname {}\"{name}\"", neg(*negate)),
        Match::Uid { id, negate } => format!("meta skuid {}{id}", neg(*negate)),
        Match::Gid { id, negate } => format!("meta skgid {}{id}", neg(*negate)),
        Match::Mark { value, negate } => format!("meta mark {}{value}", neg(*negate)),
        Match::CtMark { value } => format!("ct mark {value}"),
        Match::MarkBits {
            value,
            mask,
            negate,
        } => {
            format!("meta mark & {mask:#x} {}{value:#x}", eq_or_ne(*negate))
        }
        Match::CtMarkBits { value, mask } => format!("ct mark & {mask:#x} == {value:#x}"),
        Match::CtState(CtStates::Invalid) => "ct state invalid".into(),
        Match::CtState(CtStates::RelatedEstablished) => "ct state established,related".into(),
    }
}

/// A masked comparison's operator: nft needs it spelled out after `&`.
fn eq_or_ne(negate: bool) -> &'static str {
    if negate {
        "!= "
    } else {
        "== "
    }
}

fn neg(n: bool) -> &'static str {
    if n {
        "!= "
    } else {
        ""
    }
}

fn port(dir: &str, pm: &PortMatch) -> String {
    match pm {
        PortMatch::Eq(p) => format!("th {dir} {p}"),
        PortMatch::Ne(p) => format!("th {dir} != {p}"),
        PortMatch::NotIn(ps) => ps
            .iter()
            .map(|p| format!("th {dir} != {p}"))
            .collect::<Vec<_>>()
            .join(" "),
        PortMatch::InSet(s) => format!("th {dir} @{s}"),
    }
}

fn addr(fam: &str, dir: &str, am: &AddrMatch) -> String {
    match am {
        AddrMatch::Eq(n) => format!("{fam} {dir} {n}"),
        AddrMatch::Ne(n) => format!("{fam} {dir} != {n}"),
        AddrMatch::InSet(s) => format!("{fam} {dir} @{s}"),
    }
}
