//! nft syntax for the typed form: a rule's expressions (`meta l4proto tcp th dport 80
//! redirect to :15001`), the way `render::nft_rule` writes a planned rule, and set elements as
//! ports and CIDRs. What is not a shape we write is printed as the expression it is
//! (`[ meta load skuid => reg 2 ]`, or a stranger's expression by name with its raw
//! attributes), never dropped.

use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use super::expr::{Base, CtKey, Expr, MetaKey, Verdict};
use super::lower::SetElem;
use super::state::SetState;

/// What register 1 holds, from the last load.
#[derive(Clone, PartialEq, Eq)]
enum Reg {
    None,
    Meta(MetaKey),
    Addr {
        fam: &'static str,
        dir: &'static str,
    },
    Port(&'static str),
    /// Four bytes from a port on (`@th,<bit offset>,32`): a hashed port set's load.
    PortWord(u32),
    Ct(CtKey),
    Imm(Vec<u8>),
}

/// One rule in nft syntax.
pub fn exprs(rule: &[Expr]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut printer = Printer {
        reg: Reg::None,
        mask: None,
        bits: None,
    };
    let mut pending: Vec<&Expr> = Vec::new();
    for e in rule {
        match printer.text(e) {
            // A load (or mask, or value) that the next expression consumes.
            Some(s) if s.is_empty() => pending.push(e),
            Some(s) => {
                pending.clear();
                out.push(s);
            }
            // Not a shape we write: show it, and the loads that fed it, as the kernel holds
            // them.
            None => {
                out.extend(pending.drain(..).map(raw));
                out.push(raw(e));
            }
        }
    }
    out.extend(pending.into_iter().map(raw));
    out.join(" ")
}

/// What the expressions read so far left in register 1, and the mask over it.
struct Printer<'a> {
    reg: Reg,
    mask: Option<&'a [u8]>,
    /// A bitwise with a non-zero xor over register 1: (mask, xor).
    bits: Option<(&'a [u8], &'a [u8])>,
}

impl<'a> Printer<'a> {
    /// One expression's text: empty for a load that the next expression consumes, `None` for
    /// a shape we do not write.
    fn text(&mut self, e: &'a Expr) -> Option<String> {
        match e {
            Expr::Meta(_)
            | Expr::Payload { .. }
            | Expr::Ct(_)
            | Expr::Mask(_)
            | Expr::Bits { .. }
            | Expr::Imm(_) => self.load(e),
            Expr::Cmp { eq, data } => condition(&self.reg, self.mask, !eq, data),
            Expr::Lookup { set, invert } => self.lookup(set, *invert),
            Expr::Verdict(v) => Some(match v {
                Verdict::Jump(chain) => format!("jump {chain}"),
                Verdict::Accept => "accept".into(),
                Verdict::Drop => "drop".into(),
                Verdict::Return => "return".into(),
            }),
            _ => self.statement(e),
        }
    }

    /// A load into register 1, or a mask over it: remembered for what consumes it.
    fn load(&mut self, e: &'a Expr) -> Option<String> {
        match e {
            Expr::Meta(k) => {
                self.reg = Reg::Meta(*k);
                self.mask = None;
                self.bits = None;
                Some(String::new())
            }
            Expr::Payload { base, offset, len } => {
                self.reg = match (base, offset, len) {
                    (Base::Network, 12, 4) => addr("ip", "saddr"),
                    (Base::Network, 16, 4) => addr("ip", "daddr"),
                    (Base::Network, 8, 16) => addr("ip6", "saddr"),
                    (Base::Network, 24, 16) => addr("ip6", "daddr"),
                    (Base::Transport, 0, 2) => Reg::Port("sport"),
                    (Base::Transport, 2, 2) => Reg::Port("dport"),
                    (Base::Transport, 0 | 2, 4) => Reg::PortWord(offset * 8),
                    _ => Reg::None,
                };
                self.mask = None;
                (self.reg != Reg::None).then(String::new)
            }
            Expr::Ct(k) => {
                self.reg = Reg::Ct(*k);
                self.mask = None;
                self.bits = None;
                (*k != CtKey::Zone).then(String::new)
            }
            Expr::Mask(m) => {
                self.mask = Some(m);
                Some(String::new())
            }
            Expr::Bits { mask, xor } => {
                self.bits = Some((mask, xor));
                Some(String::new())
            }
            Expr::Imm(data) => {
                self.reg = Reg::Imm(data.clone());
                Some(String::new())
            }
            _ => None,
        }
    }

    /// A set lookup of the address or port in register 1.
    fn lookup(&self, set: &str, invert: bool) -> Option<String> {
        let what = match &self.reg {
            Reg::Addr { fam, dir } => Some(format!("{fam} {dir}")),
            Reg::Port(dir) => Some(format!("th {dir}")),
            // As nft writes a raw load: the port masked out of the word.
            Reg::PortWord(bits) if self.mask == Some(&[0xff, 0xff, 0, 0][..]) => {
                Some(format!("@th,{bits},32 & 0xffff0000"))
            }
            _ => None,
        };
        what.map(|w| format!("{w} {}@{set}", if invert { "!= " } else { "" }))
    }

    /// A statement that takes register 1: redirect, tproxy, setting a mark or a zone; and the
    /// counter.
    fn statement(&self, e: &Expr) -> Option<String> {
        let reg = &self.reg;
        match e {
            Expr::Redir => match reg {
                Reg::Imm(d) => port_of(d).map(|p| format!("redirect to :{p}")),
                _ => None,
            },
            Expr::Tproxy { nfproto } => match (reg, family(*nfproto)) {
                (Reg::Imm(d), Some(fam)) => port_of(d).map(|p| format!("tproxy {fam} to :{p}")),
                _ => None,
            },
            Expr::MetaSet(MetaKey::Mark) => match reg {
                Reg::Imm(d) => u32_of(d).map(|v| format!("meta mark set {v}")),
                Reg::Ct(CtKey::Mark) => Some("meta mark set ct mark".into()),
                _ => None,
            },
            Expr::MetaSet(MetaKey::NfTrace) => match reg {
                Reg::Imm(d) => d.first().map(|v| format!("meta nftrace set {v}")),
                _ => None,
            },
            Expr::CtSet(CtKey::Mark) if *reg == Reg::Meta(MetaKey::Mark) => {
                Some("ct mark set meta mark".into())
            }
            Expr::CtSet(CtKey::Mark) if *reg == Reg::Ct(CtKey::Mark) => {
                let (mask, xor) = self.bits?;
                Some(format!(
                    "ct mark set ct mark & {:#x} | {:#x}",
                    u32_of(mask)?,
                    u32_of(xor)?
                ))
            }
            Expr::CtSet(CtKey::Zone) => match reg {
                Reg::Imm(d) if d.len() == 2 => {
                    Some(format!("ct zone set {}", u16::from_ne_bytes([d[0], d[1]])))
                }
                _ => None,
            },
            Expr::Snat { nfproto } => match (reg, family(*nfproto)) {
                (Reg::Imm(d), Some(fam)) => ip_of(d).map(|a| format!("snat {fam} to {a}")),
                _ => None,
            },
            Expr::Counter => Some("counter".into()),
            _ => None,
        }
    }
}

/// nft's name of an NFPROTO family in a statement (`tproxy ip`, `snat ip6`).
fn family(nfproto: u32) -> Option<&'static str> {
    match nfproto {
        2 => Some("ip"),
        10 => Some("ip6"),
        _ => None,
    }
}

fn addr(fam: &'static str, dir: &'static str) -> Reg {
    Reg::Addr { fam, dir }
}

/// An expression as it is, in the bracketed form of `nft --debug=netlink`.
pub fn raw(e: &Expr) -> String {
    let hex = |b: &[u8]| -> String { b.iter().map(|x| format!("{x:02x}")).collect() };
    match e {
        Expr::Meta(k) => format!("[ meta load {} => reg 1 ]", k.name()),
        Expr::MetaSet(k) => format!("[ meta set {} with reg 1 ]", k.name()),
        Expr::Payload { base, offset, len } => format!(
            "[ payload load {len}b @ {} header + {offset} => reg 1 ]",
            match base {
                Base::Network => "network",
                Base::Transport => "transport",
            }
        ),
        Expr::Cmp { eq, data } => format!(
            "[ cmp {} reg 1 0x{} ]",
            if *eq { "eq" } else { "neq" },
            hex(data)
        ),
        Expr::Mask(m) => format!("[ bitwise reg 1 = ( reg 1 & 0x{} ) ^ 0 ]", hex(m)),
        Expr::Bits { mask, xor } => format!(
            "[ bitwise reg 1 = ( reg 1 & 0x{} ) ^ 0x{} ]",
            hex(mask),
            hex(xor)
        ),
        Expr::Lookup { set, invert } => format!(
            "[ lookup reg 1 set {set}{} ]",
            if *invert { " inverted" } else { "" }
        ),
        Expr::Ct(k) => format!("[ ct load {k:?} => reg 1 ]").to_lowercase(),
        Expr::CtSet(k) => format!("[ ct set {k:?} with reg 1 ]").to_lowercase(),
        Expr::Imm(d) => format!("[ immediate reg 1 0x{} ]", hex(d)),
        Expr::Redir => "[ redir proto reg 1 ]".into(),
        Expr::Tproxy { nfproto } => format!("[ tproxy family {nfproto} port reg 1 ]"),
        Expr::Snat { nfproto } => format!("[ nat snat family {nfproto} addr_min reg 1 ]"),
        Expr::Counter => "[ counter ]".into(),
        Expr::Verdict(v) => format!("[ immediate reg 0 {v:?} ]").to_lowercase(),
        Expr::Foreign(f) => {
            let mut s = format!("[ {}", f.name);
            for (kind, value) in &f.attrs {
                let _ = write!(
                    s,
                    " {}=0x{}",
                    kind & netlink_packet_core::NLA_TYPE_MASK,
                    hex(value)
                );
            }
            s + " ]"
        }
    }
}

fn condition(reg: &Reg, mask: Option<&[u8]>, neg: bool, b: &[u8]) -> Option<String> {
    let ne = if neg { "!= " } else { "" };
    Some(match reg {
        Reg::Meta(MetaKey::NfProto) => {
            let p = match b {
                [2] => "ipv4",
                [10] => "ipv6",
                _ => return None,
            };
            format!("meta nfproto {ne}{p}")
        }
        Reg::Meta(MetaKey::L4Proto) => {
            let p = match b {
                [6] => "tcp".to_string(),
                [17] => "udp".to_string(),
                [n] => n.to_string(),
                _ => return None,
            };
            format!("meta l4proto {ne}{p}")
        }
        Reg::Meta(key @ (MetaKey::IifName | MetaKey::OifName)) => {
            // Exact match: the name and its terminating NUL.
            let name = b.strip_suffix(&[0])?;
            if name.contains(&0) {
                return None;
            }
            format!("{} {ne}\"{}\"", key.name(), String::from_utf8_lossy(name))
        }
        Reg::Meta(key @ (MetaKey::SkUid | MetaKey::SkGid)) if mask.is_none() => {
            format!("meta {} {ne}{}", key.name(), u32_of(b)?)
        }
        Reg::Meta(MetaKey::Mark) if mask.is_none() => format!("meta mark {ne}{}", u32_of(b)?),
        Reg::Ct(CtKey::Mark) if mask.is_none() => format!("ct mark {ne}{}", u32_of(b)?),
        // A masked mark, as render::nft_rule writes it (nft needs the operator after `&`).
        Reg::Meta(MetaKey::Mark) | Reg::Ct(CtKey::Mark) => {
            let key = if *reg == Reg::Ct(CtKey::Mark) {
                "ct mark"
            } else {
                "meta mark"
            };
            let op = if neg { "!=" } else { "==" };
            format!("{key} & {:#x} {op} {:#x}", u32_of(mask?)?, u32_of(b)?)
        }
        Reg::Addr { fam, dir } => {
            let addr = ip_of(b)?;
            let prefix = match mask {
                Some(m) if m.len() == b.len() => prefix_of(m)?,
                Some(_) => return None,
                None => (b.len() * 8) as u8,
            };
            let net = IpNet::new(addr, prefix).ok()?;
            // A value with host bits under the mask is not a CIDR we write.
            if net.network() != addr {
                return None;
            }
            format!("{fam} {dir} {ne}{net}")
        }
        Reg::Port(dir) if mask.is_none() => format!("th {dir} {ne}{}", port_of(b)?),
        Reg::Ct(CtKey::State) => {
            // `ct state X` is a mask test: (state & X) != 0.
            let m = u32_of(mask?)?;
            if !neg || u32_of(b)? != 0 {
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

/// The prefix length of a contiguous netmask.
fn prefix_of(mask: &[u8]) -> Option<u8> {
    let ones: u32 = mask.iter().map(|x| x.count_ones()).sum();
    let contiguous = mask
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1))
        .skip(ones as usize)
        .all(|bit| bit == 0);
    contiguous.then_some(ones as u8)
}

fn u32_of(b: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(b.try_into().ok()?))
}

fn port_of(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.try_into().ok()?))
}

fn ip_of(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
        _ => None,
    }
}

/// An element's key in hex, `-` first for an interval end.
pub fn key(e: &SetElem) -> String {
    let hex: String = e.key.iter().map(|b| format!("{b:02x}")).collect();
    if e.interval_end {
        format!("-{hex}")
    } else {
        hex
    }
}

/// nft's `integer` key type: a hashed port set's (`typeof @th,16,32`).
const TYPE_INTEGER: u32 = 4;

/// A set's elements as ports, CIDRs or (a hashed port set's) 32-bit words as the rendered
/// script writes them (interval sets hold start and end keys).
pub fn set_elements(set: &SetState) -> Vec<String> {
    if !set.interval() {
        return set
            .elements
            .iter()
            .map(|e| match e.key.as_slice() {
                [a, b] => u16::from_be_bytes([*a, *b]).to_string(),
                &[a, b, c, d] if set.key_type == TYPE_INTEGER => {
                    format!("0x{:08x}", u32::from_be_bytes([a, b, c, d]))
                }
                k => ip_of(k).map_or_else(|| key(e), |a| a.to_string()),
            })
            .collect();
    }
    // Sort by key; an interval is a start followed by the next end (exclusive).
    let mut sorted: Vec<(u128, bool, usize)> = set
        .elements
        .iter()
        .map(|e| {
            (
                e.key.iter().fold(0u128, |a, b| (a << 8) | *b as u128),
                e.interval_end,
                e.key.len(),
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
        // No end: the range runs to the top of the key space.
        let top = match len {
            2 => u16::MAX as u128,
            4 => u32::MAX as u128,
            _ => u128::MAX,
        };
        out.extend(cidrs(start, Some(top), len));
    }
    out
}

fn cidrs(start: u128, last: Option<u128>, len: usize) -> Vec<String> {
    let Some(last) = last else { return Vec::new() };
    if len == 2 {
        // Ports: one port, or a range as nft writes it.
        return vec![if start == last {
            start.to_string()
        } else {
            format!("{start}-{last}")
        }];
    }
    if len == 4 {
        let (a, b) = (Ipv4Addr::from(start as u32), Ipv4Addr::from(last as u32));
        Ipv4Subnets::new(a, b, 0).map(|n| n.to_string()).collect()
    } else {
        let (a, b) = (Ipv6Addr::from(start), Ipv6Addr::from(last));
        Ipv6Subnets::new(a, b, 0).map(|n| n.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::expected;
    use redirect_model::render::nft_rule;
    use redirect_model::table::chain_name;
    use redirect_model::{CaptureConfig, DnsCapture, InterceptionMode, Selection};

    /// Every planned rule, lowered to expressions, prints as the text `nft_rule` renders for
    /// it.
    #[test]
    fn lowered_rules_read_like_the_plan() {
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
            let rs = redirect_testkit::plan(&cfg).unwrap();
            let state = expected(&rs);
            for c in &rs.chains {
                let kernel = state
                    .chain(&chain_name(c.stage, c.family, &c.name))
                    .unwrap();
                let planned: Vec<String> = c
                    .rules
                    .iter()
                    .flat_map(|r| nft_rule(r, c.family, c.stage))
                    .collect();
                let printed: Vec<String> = kernel.rules.iter().map(|r| exprs(r)).collect();
                assert_eq!(printed, planned, "chain {}", c.name);
                checked += printed.len();
            }
        }
        assert!(checked > 60, "{checked}");
    }

    #[test]
    fn unknown_shapes_stay_visible() {
        let rule = [
            Expr::Meta(MetaKey::L4Proto),
            Expr::Cmp {
                eq: true,
                data: vec![6],
            },
            Expr::Foreign(super::super::expr::Foreign {
                name: "limit".into(),
                attrs: vec![(1, vec![0, 0, 0, 10])],
            }),
            Expr::Meta(MetaKey::SkUid),
            Expr::Mask(vec![0, 0, 0, 1]),
            Expr::Cmp {
                eq: true,
                data: vec![0, 0, 0, 1],
            },
            Expr::Verdict(Verdict::Drop),
        ];
        assert_eq!(
            exprs(&rule),
            "meta l4proto tcp [ limit 1=0x0000000a ] [ meta load skuid => reg 1 ] \
             [ bitwise reg 1 = ( reg 1 & 0x00000001 ) ^ 0 ] [ cmp eq reg 1 0x00000001 ] drop"
        );
    }

    #[test]
    fn set_elements_decode() {
        let ports = SetState {
            name: "p".into(),
            key_type: 13,
            key_len: 2,
            flags: 0,
            size: None,
            elements: vec![
                SetElem {
                    key: vec![0, 0x35],
                    interval_end: false,
                },
                SetElem {
                    key: vec![0x3a, 0x98],
                    interval_end: false,
                },
            ],
        };
        assert_eq!(set_elements(&ports), ["53", "15000"]);
        let rs = redirect_testkit::plan(&CaptureConfig {
            outbound_exclude_cidrs: vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.168.1.0/24".parse().unwrap(),
                "0.0.0.0/32".parse().unwrap(),
            ],
            ..CaptureConfig::istio_sidecar_default()
        })
        .unwrap();
        let state = expected(&rs);
        let set = state.set("ip-exclude-cidrs").unwrap();
        assert_eq!(
            set_elements(set),
            ["0.0.0.0/32", "10.0.0.0/8", "192.168.1.0/24"]
        );
    }
}
