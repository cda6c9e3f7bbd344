//! Istio's iptables rules as iptables-nft (iptables 1.8) keeps them: per family, the tables
//! mangle, nat and raw that have rules; in each, the user chains in the order Istio's restore
//! file names them, then the built-in chains in the order its rules first use them (as
//! `iptables-nft-restore` creates them); each rule's interface, protocol and address matches
//! first, then its other matches in order (ports, marks natively; `multiport`, `owner`,
//! `connmark`, `conntrack` as xtables matches), a counter, and its target (a verdict, or an
//! xtables target).

use ipnet::IpNet;
use redirect_kernel::nft::{
    Base, BaseSpec, ChainKind, Expr, Foreign, MetaKey, NftChain, Verdict, XtChainSpec, XtRuleSpec,
    XtTable,
};
use redirect_model::{Family, GroupResolver, Hook};

use super::xt_info as info;
use super::{chains, created_chains, IstioIptables, XtRule};
use crate::nft_form::Unsupported;

pub(super) const BUILT_IN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// [`IstioIptables::lower`]: both families' tables as iptables-nft keeps them.
pub(super) fn lower(
    form: &IstioIptables,
    groups: &dyn GroupResolver,
) -> Result<Vec<XtTable>, Unsupported> {
    let mut out = lower_family(&form.v4, Family::V4, groups)?;
    if let Some(v6) = &form.v6 {
        out.extend(lower_family(v6, Family::V6, groups)?);
    }
    Ok(out)
}

fn lower_family(
    rules: &[XtRule],
    family: Family,
    groups: &dyn GroupResolver,
) -> Result<Vec<XtTable>, Unsupported> {
    let state = chains(rules);
    let mut out = Vec::new();
    for table in ["mangle", "nat", "raw"] {
        // The user chains as Istio's restore file creates them, then the built-in chains in
        // the order its rules first use them.
        let user = created_chains(rules, table);
        let mut built_in: Vec<&str> = Vec::new();
        for r in rules.iter().filter(|r| r.table == table) {
            if BUILT_IN.contains(&r.chain) && !built_in.contains(&r.chain) {
                built_in.push(r.chain);
            }
        }
        if user.is_empty() && built_in.is_empty() {
            continue;
        }
        let mut specs = Vec::new();
        for name in user.into_iter().chain(built_in) {
            let mut lowered = Vec::new();
            for line in state.get(&(table, name)).into_iter().flatten() {
                lowered.push(lower_rule(line, family, groups)?);
            }
            specs.push(XtChainSpec {
                chain: NftChain {
                    name: name.to_string(),
                    base: base(table, name),
                    rules: Vec::new(),
                },
                rules: lowered,
            });
        }
        out.push(XtTable {
            family,
            name: table.to_string(),
            chains: specs,
        });
    }
    Ok(out)
}

/// iptables-nft's built-in chains: hook, type and priority.
fn base(table: &str, chain: &str) -> Option<BaseSpec> {
    let hook = match chain {
        "PREROUTING" => Hook::Prerouting,
        "OUTPUT" => Hook::Output,
        "POSTROUTING" => Hook::Postrouting,
        _ => return None,
    };
    let (kind, priority) = match (table, hook) {
        ("nat", Hook::Postrouting) => (ChainKind::Nat, 100),
        ("nat", _) => (ChainKind::Nat, -100),
        ("mangle", Hook::Output) => (ChainKind::Route, -150),
        ("mangle", _) => (ChainKind::Filter, -150),
        (_, _) => (ChainKind::Filter, -300),
    };
    Some(BaseSpec {
        hook,
        kind,
        priority,
    })
}

/// What a rule says, read from its words.
#[derive(Default)]
struct Parsed {
    iif: Option<(String, bool)>,
    oif: Option<(String, bool)>,
    proto: Option<u8>,
    src: Option<(IpNet, bool)>,
    dst: Option<(IpNet, bool)>,
    matches: Vec<Expr>,
    target: Vec<Expr>,
}

fn unsupported(word: &str, line: &str) -> Unsupported {
    Unsupported {
        what: format!("the iptables word {word:?} in `{line}`"),
        fix: "hand it back in Istio's nftables form".into(),
    }
}

fn xt(kind: &str, name: &str, rev: u32, data: Vec<u8>) -> Expr {
    let mut n = name.as_bytes().to_vec();
    n.push(0);
    Expr::Foreign(Foreign {
        name: kind.into(),
        attrs: vec![(1, n), (2, rev.to_be_bytes().to_vec()), (3, data)],
    })
}

fn cmp(eq: bool, data: Vec<u8>) -> Expr {
    Expr::Cmp { eq, data }
}

fn lower_rule(
    line: &str,
    family: Family,
    groups: &dyn GroupResolver,
) -> Result<XtRuleSpec, Unsupported> {
    let p = parse(line, family, groups)?;
    let mut e = Vec::new();
    for (key, name) in [(MetaKey::IifName, &p.iif), (MetaKey::OifName, &p.oif)] {
        if let Some((n, neg)) = name {
            let mut data = n.as_bytes().to_vec();
            data.push(0);
            e.extend([Expr::Meta(key), cmp(!neg, data)]);
        }
    }
    if let Some(proto) = p.proto {
        e.extend([Expr::Meta(MetaKey::L4Proto), cmp(true, vec![proto])]);
    }
    for (src, addr) in [(true, &p.src), (false, &p.dst)] {
        if let Some((net, neg)) = addr {
            addr_match(&mut e, src, *net, *neg);
        }
    }
    e.extend(p.matches);
    e.push(Expr::Counter);
    e.extend(p.target);
    Ok(XtRuleSpec {
        exprs: e,
        compat: p.proto.map(|n| (u32::from(n), 0)),
    })
}

fn addr_match(e: &mut Vec<Expr>, src: bool, net: IpNet, neg: bool) {
    let prefix = u32::from(net.prefix_len());
    if prefix == 0 {
        return;
    }
    let (offset, bytes) = match (net, src) {
        (IpNet::V4(n), true) => (12, n.network().octets().to_vec()),
        (IpNet::V4(n), false) => (16, n.network().octets().to_vec()),
        (IpNet::V6(n), true) => (8, n.network().octets().to_vec()),
        (IpNet::V6(n), false) => (24, n.network().octets().to_vec()),
    };
    let len = prefix.div_ceil(8) as usize;
    e.push(Expr::Payload {
        base: Base::Network,
        offset,
        len: len as u32,
    });
    if prefix % 8 != 0 {
        let mask = match net.netmask() {
            std::net::IpAddr::V4(m) => m.octets().to_vec(),
            std::net::IpAddr::V6(m) => m.octets().to_vec(),
        };
        e.push(Expr::Mask(mask[..len].to_vec()));
    }
    e.push(cmp(!neg, bytes[..len].to_vec()));
}

fn parse(line: &str, family: Family, groups: &dyn GroupResolver) -> Result<Parsed, Unsupported> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut p = Parsed::default();
    let (mut i, mut neg, mut module) = (0, false, "");
    let bad = |w: &str| unsupported(w, line);
    while i < words.len() {
        let (w, arg) = (words[i], words.get(i + 1).copied().unwrap_or(""));
        i += 2;
        match w {
            "!" => {
                neg = true;
                i -= 1;
                continue;
            }
            "-i" => p.iif = Some((arg.to_string(), neg)),
            "-o" => p.oif = Some((arg.to_string(), neg)),
            "-p" => p.proto = Some(proto_number(arg).ok_or_else(|| bad(arg))?),
            "-s" | "-d" => {
                // Istio writes a host without its length (`-s 169.254.7.127`).
                let net = match arg.parse::<std::net::IpAddr>() {
                    Ok(a) => IpNet::from(a),
                    Err(_) => arg.parse::<IpNet>().map_err(|_| bad(arg))?.trunc(),
                };
                let slot = if w == "-s" { &mut p.src } else { &mut p.dst };
                *slot = Some((net, neg));
            }
            "-m" => {
                module = arg;
                // `-m tcp` with no option of its own: iptables-nft keeps it as the xtables
                // match (every port), where its options become native expressions.
                let next = words.get(i).copied().unwrap_or("");
                if arg == "tcp" && !matches!(next, "--dport" | "--sport" | "!") {
                    p.matches.push(xt("match", "tcp", 0, info::tcp_any()));
                }
            }
            "-j" => {
                p.target = target(&words[i - 2..], family).ok_or_else(|| bad(arg))?;
                break;
            }
            _ => match_option(&mut p, (module, w, arg, neg), groups).ok_or_else(|| bad(w))?,
        }
        neg = false;
    }
    Ok(p)
}

fn proto_number(name: &str) -> Option<u8> {
    match name {
        "tcp" => Some(6),
        "udp" => Some(17),
        _ => None,
    }
}

/// One option of a match module (or of the protocol's implicit match); `None` for one Istio
/// never writes.
fn match_option(
    p: &mut Parsed,
    (module, w, arg, neg): (&str, &str, &str, bool),
    groups: &dyn GroupResolver,
) -> Option<()> {
    let e = &mut p.matches;
    match (module, w) {
        ("" | "tcp" | "udp", "--dport" | "--sport") => {
            let port: u16 = arg.parse().ok()?;
            let offset = if w == "--dport" { 2 } else { 0 };
            e.push(Expr::Payload {
                base: Base::Transport,
                offset,
                len: 2,
            });
            e.push(cmp(!neg, port.to_be_bytes().to_vec()));
        }
        ("multiport", "--dports") => {
            let ports: Vec<u16> = arg
                .split(',')
                .map(|s| s.parse().ok())
                .collect::<Option<_>>()?;
            e.push(xt(
                "match",
                "multiport",
                1,
                info::multiport_dports(&ports, neg),
            ));
        }
        ("owner", "--uid-owner" | "--gid-owner") => {
            let gid = w == "--gid-owner";
            let id = match arg.parse() {
                Ok(n) => n,
                Err(_) if gid => groups.gid_of(arg)?,
                Err(_) => return None,
            };
            e.push(xt("match", "owner", 1, info::owner(gid, id, neg)));
        }
        ("mark", "--mark") => {
            // iptables-nft's own: the mask only when it is not every bit.
            let (v, mask) = value_mask(arg)?;
            e.push(Expr::Meta(MetaKey::Mark));
            if mask != u32::MAX {
                e.push(Expr::Mask(mask.to_ne_bytes().to_vec()));
            }
            e.push(cmp(!neg, v.to_ne_bytes().to_vec()));
        }
        ("connmark", "--mark") => {
            let (v, mask) = value_mask(arg)?;
            e.push(xt("match", "connmark", 1, info::connmark(v, mask, neg)));
        }
        ("conntrack", "--ctstate") => {
            let bits = arg.split(',').try_fold(0u16, |acc, s| {
                Some(
                    acc | match s {
                        "INVALID" => 1,
                        "ESTABLISHED" => 2,
                        "RELATED" => 4,
                        _ => return None,
                    },
                )
            })?;
            e.push(xt("match", "conntrack", 3, info::conntrack_state(bits)));
        }
        _ => return None,
    }
    Some(())
}

/// A number as iptables reads it: decimal, or hexadecimal after `0x`.
fn number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `value[/mask]`; no mask is every bit.
fn value_mask(s: &str) -> Option<(u32, u32)> {
    match s.split_once('/') {
        Some((v, m)) => Some((number(v)?, number(m)?)),
        None => Some((number(s)?, u32::MAX)),
    }
}

/// `-j ...` (from `-j` on) as expressions.
fn target(words: &[&str], family: Family) -> Option<Vec<Expr>> {
    let v6 = family == Family::V6;
    let verdict = |v| Some(vec![Expr::Verdict(v)]);
    let opt = |i: usize| words.get(i).copied().unwrap_or("");
    match (opt(1), opt(2)) {
        ("RETURN", _) => verdict(Verdict::Return),
        ("ACCEPT", _) => verdict(Verdict::Accept),
        ("DROP", _) => verdict(Verdict::Drop),
        ("REDIRECT", "--to-ports" | "--to-port") => Some(vec![xt(
            "target",
            "REDIRECT",
            0,
            info::redirect(v6, opt(3).parse().ok()?),
        )]),
        ("MARK", "--set-mark") => Some(vec![xt(
            "target",
            "MARK",
            2,
            info::mark(opt(3).parse().ok()?),
        )]),
        ("CONNMARK", "--save-mark") => Some(vec![xt(
            "target",
            "CONNMARK",
            2,
            info::connmark_target(false),
        )]),
        ("CONNMARK", "--restore-mark") => {
            // `--nfmask`/`--ctmask`, when given, must be every bit: what the default is.
            let masks = &words[3.min(words.len())..];
            let all = masks.chunks(2).all(
                |kv| matches!(kv, ["--nfmask" | "--ctmask", v] if number(v) == Some(u32::MAX)),
            );
            all.then(|| vec![xt("target", "CONNMARK", 2, info::connmark_target(true))])
        }
        ("CONNMARK", "--set-xmark") => {
            let (v, mask) = value_mask(opt(3))?;
            Some(vec![xt(
                "target",
                "CONNMARK",
                2,
                info::connmark_set(v, mask),
            )])
        }
        ("TPROXY", "--tproxy-mark") => {
            let (mark, mask) = opt(3).split_once('/')?;
            let mask = u32::from_str_radix(mask.trim_start_matches("0x"), 16).ok()?;
            let port = (opt(4) == "--on-port").then(|| opt(5).parse().ok())??;
            Some(vec![xt(
                "target",
                "TPROXY",
                1,
                info::tproxy(mark.parse().ok()?, mask, port),
            )])
        }
        ("CT", "--zone") => Some(vec![xt(
            "target",
            "CT",
            2,
            info::ct_zone(opt(3).parse().ok()?),
        )]),
        (chain, "") if chain.starts_with("ISTIO_") => verdict(Verdict::Jump(chain.to_string())),
        _ => None,
    }
}
