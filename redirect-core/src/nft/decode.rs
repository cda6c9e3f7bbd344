//! Reading the kernel's table in nft syntax: a rule as read back (libnftnl's expression text,
//! `[ meta load oifname => reg 1 ] [ cmp eq reg 1 0x00006f6c ... ]`) becomes
//! `oifname "lo" ...`, the way `render::nft_rule` writes a planned rule; set elements become
//! ports and CIDRs. Rules of shapes we never write keep their expression text, so nothing a
//! stranger put in our table is hidden.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use super::state::{Difference, SetState};

/// What register 1 holds, from the last load.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reg {
    None,
    Meta(&'static str),
    Addr {
        fam: &'static str,
        dir: &'static str,
    },
    Port(&'static str),
    CtState,
    CtMark,
    MetaMark,
    Imm(u32),
}

/// One rule, from its read-back expression text to nft syntax.
pub fn rule(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut reg = Reg::None;
    let mut mask: Option<Vec<u8>> = None;
    let mut imm: Vec<u8> = Vec::new();
    for expr in exprs(text) {
        let words: Vec<&str> = expr.split_whitespace().collect();
        let decoded = match words.as_slice() {
            ["meta", "load", key, "=>", "reg", _] => {
                reg = match *key {
                    "mark" => Reg::MetaMark,
                    "nfproto" => Reg::Meta("nfproto"),
                    "l4proto" => Reg::Meta("l4proto"),
                    "iifname" => Reg::Meta("iifname"),
                    "oifname" => Reg::Meta("oifname"),
                    "skuid" => Reg::Meta("skuid"),
                    "skgid" => Reg::Meta("skgid"),
                    _ => Reg::None,
                };
                mask = None;
                (reg != Reg::None).then(String::new)
            }
            ["payload", "load", len, "@", base, "header", "+", off, "=>", "reg", _] => {
                reg = match (*base, *len, *off) {
                    ("network", "4b", "12") => Reg::Addr {
                        fam: "ip",
                        dir: "saddr",
                    },
                    ("network", "4b", "16") => Reg::Addr {
                        fam: "ip",
                        dir: "daddr",
                    },
                    ("network", "16b", "8") => Reg::Addr {
                        fam: "ip6",
                        dir: "saddr",
                    },
                    ("network", "16b", "24") => Reg::Addr {
                        fam: "ip6",
                        dir: "daddr",
                    },
                    ("transport", "2b", "0") => Reg::Port("sport"),
                    ("transport", "2b", "2") => Reg::Port("dport"),
                    _ => Reg::None,
                };
                mask = None;
                (reg != Reg::None).then(String::new)
            }
            ["ct", "load", "state", "=>", "reg", _] => {
                reg = Reg::CtState;
                mask = None;
                Some(String::new())
            }
            ["ct", "load", "mark", "=>", "reg", _] => {
                reg = Reg::CtMark;
                Some(String::new())
            }
            ["bitwise", "reg", _, "=", "(", "reg", _, "&", rest @ ..] => {
                // `( reg 1 & MASK... ) ^ XOR...`: a mask test when XOR is all zero.
                let close = rest.iter().position(|w| *w == ")");
                let (m, x) = match close {
                    Some(i) if rest.get(i + 1) == Some(&"^") => (&rest[..i], &rest[i + 2..]),
                    _ => (&rest[..0], &rest[..0]),
                };
                let words = |ws: &[&str]| {
                    ws.iter()
                        .map(|w| hex_bytes(w))
                        .collect::<Option<Vec<_>>>()
                        .map(|v| v.concat())
                };
                match (words(m), words(x)) {
                    (Some(m), Some(x)) if !m.is_empty() && x.iter().all(|v| *v == 0) => {
                        mask = Some(m);
                        Some(String::new())
                    }
                    _ => None,
                }
            }
            ["cmp", op @ ("eq" | "neq"), "reg", _, data @ ..] => {
                let bytes: Option<Vec<u8>> = data
                    .iter()
                    .map(|w| hex_bytes(w))
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.concat());
                bytes.and_then(|b| condition(reg, mask.as_deref(), *op == "neq", &b))
            }
            ["lookup", "reg", _, "set", name, flags] => {
                let neg = u32::from_str_radix(flags.trim_start_matches("0x"), 16)
                    .is_ok_and(|f| f & 1 != 0);
                let what = match reg {
                    Reg::Addr { fam, dir } => Some(format!("{fam} {dir}")),
                    Reg::Port(dir) => Some(format!("th {dir}")),
                    _ => None,
                };
                what.map(|w| format!("{w} {}@{name}", if neg { "!= " } else { "" }))
            }
            ["immediate", "reg", "0", verdict @ ..] => match verdict {
                ["jump", "->", chain] => Some(format!("jump {chain}")),
                ["accept"] => Some("accept".into()),
                ["drop"] => Some("drop".into()),
                ["return"] => Some("return".into()),
                _ => None,
            },
            ["immediate", "reg", _, data @ ..] => {
                let bytes = data
                    .iter()
                    .map(|w| hex_bytes(w))
                    .collect::<Option<Vec<_>>>()
                    .map(|v| v.concat());
                bytes.map(|b| {
                    imm = b;
                    reg = Reg::Imm(u32_of(&imm));
                    String::new()
                })
            }
            ["redir", "proto_min", ..] => Some(format!("redirect to :{}", port_of(&imm))),
            ["tproxy", fam, "port", "reg", _] => {
                Some(format!("tproxy {fam} to :{}", port_of(&imm)))
            }
            ["meta", "set", "mark", "with", "reg", _] => match reg {
                Reg::Imm(v) => Some(format!("meta mark set {v}")),
                Reg::CtMark => Some("meta mark set ct mark".into()),
                _ => None,
            },
            ["ct", "set", "mark", "with", "reg", _] if reg == Reg::MetaMark => {
                Some("ct mark set meta mark".into())
            }
            ["ct", "set", "zone", "with", "reg", _] => match reg {
                Reg::Imm(_) => Some(format!("ct zone set {}", u16_of(&imm))),
                _ => None,
            },
            ["counter", ..] => Some("counter".into()),
            _ => None,
        };
        match decoded {
            Some(s) if s.is_empty() => {}
            Some(s) => out.push(s),
            // Not a shape we write: show the expression as the kernel holds it.
            None => out.push(format!("[ {expr} ]")),
        }
    }
    // A `meta mark` load that only fed `ct mark set` is not a condition.
    out.join(" ")
}

/// A difference, with its rule in nft syntax instead of expression text.
pub fn difference(d: &Difference) -> String {
    match d {
        Difference::RuleMissing {
            chain,
            position,
            rule: r,
        } => format!("chain {chain}: rule {position} is missing: {}", rule(r)),
        Difference::RuleUnexpected {
            chain,
            position,
            rule: r,
        } => format!(
            "chain {chain}: rule {position} is not in the plan: {}",
            rule(r)
        ),
        other => other.to_string(),
    }
}

/// The expressions of a rule's text, without brackets.
fn exprs(text: &str) -> Vec<&str> {
    text.split("] [")
        .map(|e| {
            e.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
        })
        .filter(|e| !e.is_empty())
        .collect()
}

fn condition(reg: Reg, mask: Option<&[u8]>, neg: bool, b: &[u8]) -> Option<String> {
    let ne = if neg { "!= " } else { "" };
    Some(match reg {
        Reg::Meta("nfproto") => {
            let p = match b.first()? {
                2 => "ipv4",
                10 => "ipv6",
                _ => return None,
            };
            format!("meta nfproto {ne}{p}")
        }
        Reg::Meta("l4proto") => {
            let p = match b.first()? {
                6 => "tcp".to_string(),
                17 => "udp".to_string(),
                n => n.to_string(),
            };
            format!("meta l4proto {ne}{p}")
        }
        Reg::Meta(key @ ("iifname" | "oifname")) => {
            let name: Vec<u8> = b.iter().copied().take_while(|c| *c != 0).collect();
            format!("{key} {ne}\"{}\"", String::from_utf8_lossy(&name))
        }
        Reg::Meta(key @ ("skuid" | "skgid")) => format!("meta {key} {ne}{}", u32_of(b)),
        Reg::MetaMark => format!("meta mark {ne}{}", u32_of(b)),
        Reg::CtMark => format!("ct mark {ne}{}", u32_of(b)),
        Reg::Addr { fam, dir } => {
            let len = if fam == "ip" { 4 } else { 16 };
            let addr = ip_of(b.get(..len)?)?;
            let prefix = match mask {
                Some(m) => m.iter().map(|x| x.count_ones()).sum::<u32>() as u8,
                None => (len * 8) as u8,
            };
            format!("{fam} {dir} {ne}{}", IpNet::new(addr, prefix).ok()?)
        }
        Reg::Port(dir) => format!(
            "th {dir} {ne}{}",
            u16::from_be_bytes([*b.first()?, *b.get(1)?])
        ),
        Reg::CtState => {
            // `ct state X` is a mask test: (state & X) != 0.
            let m = u32_of(mask?);
            if !neg || u32_of(b) != 0 {
                return None;
            }
            match m {
                1 => "ct state invalid".into(),
                6 => "ct state established,related".into(),
                _ => format!("ct state & {m:#x} != 0"),
            }
        }
        _ => return None,
    })
}

/// The bytes of one printed 32-bit word (libnftnl prints register data as host-order words).
fn hex_bytes(word: &str) -> Option<Vec<u8>> {
    let w = u32::from_str_radix(word.strip_prefix("0x")?, 16).ok()?;
    Some(w.to_ne_bytes().to_vec())
}

fn u32_of(b: &[u8]) -> u32 {
    let mut w = [0u8; 4];
    for (i, v) in b.iter().take(4).enumerate() {
        w[i] = *v;
    }
    u32::from_ne_bytes(w)
}

fn u16_of(b: &[u8]) -> u16 {
    u16::from_ne_bytes([
        b.first().copied().unwrap_or(0),
        b.get(1).copied().unwrap_or(0),
    ])
}

fn port_of(b: &[u8]) -> u16 {
    u16::from_be_bytes([
        b.first().copied().unwrap_or(0),
        b.get(1).copied().unwrap_or(0),
    ])
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
        _ => None,
    }
}

/// A set's elements as ports or CIDRs (interval sets hold start and end keys).
pub fn set_elements(set: &SetState) -> Vec<String> {
    let keys: Vec<(bool, Vec<u8>)> = set
        .elements
        .iter()
        .filter_map(|e| {
            let (end, hex) = match e.strip_prefix('-') {
                Some(h) => (true, h),
                None => (false, e.as_str()),
            };
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?;
            Some((end, bytes))
        })
        .collect();
    if !set.spec.contains("interval") {
        return keys
            .iter()
            .map(|(_, k)| match k.len() {
                2 => u16::from_be_bytes([k[0], k[1]]).to_string(),
                _ => ip_of(k).map_or_else(|| hex(k), |a| a.to_string()),
            })
            .collect();
    }
    // Sort by key; an interval is a start followed by the next end (exclusive).
    let mut sorted: Vec<(u128, bool, usize)> = keys
        .iter()
        .map(|(end, k)| {
            (
                k.iter().fold(0u128, |a, b| (a << 8) | *b as u128),
                *end,
                k.len(),
            )
        })
        .collect();
    sorted.sort();
    let mut out = Vec::new();
    let mut open: Option<(u128, usize)> = None;
    for (value, end, len) in sorted {
        match (end, open) {
            (false, _) => open = Some((value, len)),
            (true, Some((start, len))) => {
                out.extend(cidrs(start, value.checked_sub(1), len));
                open = None;
            }
            (true, None) => {}
        }
    }
    if let Some((start, len)) = open {
        // No end: the range runs to the top of the address space.
        let top = if len == 4 {
            u32::MAX as u128
        } else {
            u128::MAX
        };
        out.extend(cidrs(start, Some(top), len));
    }
    out
}

fn cidrs(start: u128, last: Option<u128>, len: usize) -> Vec<String> {
    let Some(last) = last else { return Vec::new() };
    if len == 4 {
        let (a, b) = (Ipv4Addr::from(start as u32), Ipv4Addr::from(last as u32));
        Ipv4Subnets::new(a, b, 0).map(|n| n.to_string()).collect()
    } else {
        let (a, b) = (Ipv6Addr::from(start), Ipv6Addr::from(last));
        Ipv6Subnets::new(a, b, 0).map(|n| n.to_string()).collect()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CaptureConfig, DnsCapture, InterceptionMode, Selection};
    use crate::nft::{chain_name, expected, lower};
    use crate::render::nft_rule;

    /// Every planned rule, lowered and read back as the kernel would hold it, decodes to the
    /// text `nft_rule` renders for it.
    #[test]
    fn decoded_rules_read_like_the_plan() {
        let configs = [
            CaptureConfig::istio_sidecar_default(),
            CaptureConfig {
                mode: InterceptionMode::Tproxy,
                dns: DnsCapture::All,
                ipv6: true,
                drop_invalid: true,
                outbound_include_cidrs: Selection::List(vec![
                    "10.0.0.0/8".parse().unwrap(),
                    "10.96.0.1/32".parse().unwrap(),
                    "fd00::/8".parse().unwrap(),
                ]),
                outbound_exclude_cidrs: vec!["192.168.0.0/16".parse().unwrap()],
                outbound_include_ports: vec![5432, 6379],
                outbound_exclude_ports: vec![3306],
                exclude_interfaces: vec!["eth9".into()],
                reroute_interfaces: vec!["net1".into()],
                proxy_gids: vec![1337, 1338],
                bypass_uids: vec![4000],
                ..CaptureConfig::istio_sidecar_default()
            },
            CaptureConfig {
                dns: DnsCapture::Servers {
                    v4: vec!["10.96.0.10".parse().unwrap()],
                    v6: vec![],
                },
                ..CaptureConfig::default()
            },
        ];
        let mut checked = 0;
        for cfg in configs {
            let rs = crate::plan(&cfg).unwrap();
            let state = expected(&rs);
            let _ = lower(&rs);
            for c in &rs.chains {
                let kernel = state
                    .chain(&chain_name(c.stage, c.family, &c.name))
                    .unwrap();
                let planned: Vec<String> = c
                    .rules
                    .iter()
                    .flat_map(|r| nft_rule(r, c.family, c.stage))
                    .collect();
                let decoded: Vec<String> = kernel.rules.iter().map(|t| rule(t)).collect();
                assert_eq!(decoded, planned, "chain {}", c.name);
                checked += decoded.len();
            }
        }
        assert!(checked > 60, "{checked}");
    }

    #[test]
    fn unknown_shapes_stay_visible() {
        let t = "[ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ] [ limit rate 10/second ] [ immediate reg 0 drop ]";
        assert_eq!(rule(t), "meta l4proto tcp [ limit rate 10/second ] drop");
    }

    #[test]
    fn set_elements_decode() {
        let ports = SetState {
            name: "p".into(),
            spec: "key type 13 len 2".into(),
            elements: vec!["0035".into(), "3a98".into()],
        };
        assert_eq!(set_elements(&ports), ["53", "15000"]);
        let rs = crate::plan(&CaptureConfig {
            outbound_exclude_cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.168.1.0/24".parse().unwrap(),
                "0.0.0.0/32".parse().unwrap(),
            ],
            ..CaptureConfig::istio_sidecar_default()
        })
        .unwrap();
        let state = expected(&rs);
        let set = state
            .sets
            .iter()
            .find(|s| s.name == "ip-exclude-cidrs")
            .unwrap();
        assert_eq!(
            set_elements(set),
            ["0.0.0.0/32", "10.0.0.0/8", "192.168.1.0/24"]
        );
    }
}
