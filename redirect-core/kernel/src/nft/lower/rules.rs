//! A planned rule as nf_tables expressions: each match becomes a load and a comparison (or a
//! set lookup), each action its statements. A rule that looks an address up in a CIDR list
//! lowered as hash sets per prefix becomes one rule per prefix (see `sets`).

use std::net::IpAddr;

use super::sets::{int_to_key, SetForms};
use super::{nfproto, NftChain};
use crate::nft::expr::{Base, CtKey, Expr, MetaKey, Verdict};
use redirect_model::table::chain_name;
use redirect_model::{
    Action, AddrMatch, Chain, CountedPath, CtStates, Family, Match, PortMatch, Stage,
};

/// A family's chain: each rule's matches (one list, or one per prefix group) with its action.
pub(super) fn lower_chain(c: &Chain, forms: &SetForms) -> NftChain {
    lower_chain_counted(c, forms).0
}

/// [`lower_chain`], with the path each lowered rule's counter adds to (`None`: no counter).
/// A counted rule gets its `counter` after its matches, before its statements; every rule it
/// lowers to (one per prefix group, TPROXY's drop) carries one.
pub(super) fn lower_chain_counted(
    c: &Chain,
    forms: &SetForms,
) -> (NftChain, Vec<Option<CountedPath>>) {
    let (mut rules, mut paths) = (Vec::new(), Vec::new());
    for r in &c.rules {
        for mut m in lower_matches(&r.matches, c.family, forms) {
            if r.count.is_some() {
                m.push(Expr::Counter);
            }
            lower_action(&mut rules, m, &r.action, c.stage, c.family);
            paths.resize(rules.len(), r.count);
        }
    }
    let chain = NftChain {
        name: chain_name(c.stage, c.family, &c.name),
        base: None,
        rules,
    };
    (chain, paths)
}

/// The rule's matches, lowered: one expression list, or one per prefix group when the rule
/// looks an address up in a masked CIDR set. The groups are disjoint (see [`masked_groups`]),
/// so at most one of the rules matches a packet and the action runs at most once.
fn lower_matches(matches: &[Match], family: Family, forms: &SetForms) -> Vec<Vec<Expr>> {
    let mut variants = vec![Vec::new()];
    for cond in matches {
        let groups = match cond {
            Match::DAddr(AddrMatch::InSet(name)) | Match::SAddr(AddrMatch::InSet(name)) => {
                forms.masked.get(name.as_str())
            }
            _ => None,
        };
        let hashed_port = match cond {
            Match::DPort(PortMatch::InSet(name)) if forms.hashed_ports.contains(name.as_str()) => {
                Some((2, name))
            }
            Match::SPort(PortMatch::InSet(name)) if forms.hashed_ports.contains(name.as_str()) => {
                Some((0, name))
            }
            _ => None,
        };
        match (groups, hashed_port) {
            (None, Some((offset, name))) => variants
                .iter_mut()
                .for_each(|m| lower_hashed_port(m, offset, name)),
            (None, None) => variants
                .iter_mut()
                .for_each(|m| lower_match(m, cond, family)),
            (Some(groups), _) => {
                let (offset, len) = addr_offset(family, matches!(cond, Match::SAddr(_)));
                variants = variants
                    .into_iter()
                    .flat_map(|m| {
                        groups.iter().map(move |(prefix, set)| {
                            let mut m = m.clone();
                            m.push(Expr::Payload {
                                base: Base::Network,
                                offset,
                                len,
                            });
                            if u32::from(*prefix) < len * 8 {
                                m.push(Expr::Mask(prefix_mask(*prefix, len)));
                            }
                            m.push(set_ref(set));
                            m
                        })
                    })
                    .collect();
            }
        }
    }
    variants
}

fn prefix_mask(prefix: u8, len: u32) -> Vec<u8> {
    let bits = len * 8;
    let mask: u128 = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    };
    let v = mask >> (128 - bits);
    int_to_key(v, len)
}

fn set_ref(name: &str) -> Expr {
    Expr::Lookup {
        set: name.into(),
        invert: false,
    }
}

fn ifname(name: &str) -> Vec<u8> {
    // Exact match: the name and its terminating NUL, as nft writes `iifname "eth0"`.
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

fn addr_offset(family: Family, src: bool) -> (u32, u32) {
    match (family, src) {
        (Family::V4, true) => (12, 4),
        (Family::V4, false) => (16, 4),
        (Family::V6, true) => (8, 16),
        (Family::V6, false) => (24, 16),
    }
}

fn lower_match(out: &mut Vec<Expr>, m: &Match, family: Family) {
    match m {
        Match::Proto(p) => meta_cmp(out, MetaKey::L4Proto, true, vec![p.number()]),
        Match::DPort(pm) => lower_port(out, 2, pm),
        Match::SPort(pm) => lower_port(out, 0, pm),
        Match::DAddr(am) => lower_addr(out, addr_offset(family, false), am),
        Match::SAddr(am) => lower_addr(out, addr_offset(family, true), am),
        Match::Iif { name, negate } => meta_cmp(out, MetaKey::IifName, !negate, ifname(name)),
        Match::Oif { name, negate } => meta_cmp(out, MetaKey::OifName, !negate, ifname(name)),
        Match::Uid { id, negate } => meta_cmp(out, MetaKey::SkUid, !negate, ne_bytes(*id)),
        Match::Gid { id, negate } => meta_cmp(out, MetaKey::SkGid, !negate, ne_bytes(*id)),
        Match::Mark { value, negate } => meta_cmp(out, MetaKey::Mark, !negate, ne_bytes(*value)),
        Match::CtMark { value } => {
            out.push(Expr::Ct(CtKey::Mark));
            out.push(Expr::Cmp {
                eq: true,
                data: ne_bytes(*value),
            });
        }
        Match::MarkBits {
            value,
            mask,
            negate,
        } => {
            out.push(Expr::Meta(MetaKey::Mark));
            masked_cmp(out, *mask, !negate, *value);
        }
        Match::CtMarkBits { value, mask } => {
            out.push(Expr::Ct(CtKey::Mark));
            masked_cmp(out, *mask, true, *value);
        }
        Match::CtState(states) => lower_ct_state(out, *states),
    }
}

/// Register 1 (a mark) masked, then compared: `mark & mask == value`.
fn masked_cmp(out: &mut Vec<Expr>, mask: u32, eq: bool, value: u32) {
    out.push(Expr::Mask(ne_bytes(mask)));
    out.push(Expr::Cmp {
        eq,
        data: ne_bytes(value),
    });
}

/// Load a meta key and compare it.
fn meta_cmp(out: &mut Vec<Expr>, key: MetaKey, eq: bool, data: Vec<u8>) {
    out.push(Expr::Meta(key));
    out.push(Expr::Cmp { eq, data });
}

/// A 32-bit value as the kernel holds meta and ct keys: host byte order.
fn ne_bytes(v: u32) -> Vec<u8> {
    v.to_ne_bytes().to_vec()
}

/// A transport port at `offset` (0 source, 2 destination): equal, not equal, none of a list,
/// or in a set.
fn lower_port(out: &mut Vec<Expr>, offset: u32, pm: &PortMatch) {
    out.push(Expr::Payload {
        base: Base::Transport,
        offset,
        len: 2,
    });
    match pm {
        PortMatch::Eq(p) => out.push(Expr::Cmp {
            eq: true,
            data: p.to_be_bytes().to_vec(),
        }),
        PortMatch::Ne(p) => out.push(Expr::Cmp {
            eq: false,
            data: p.to_be_bytes().to_vec(),
        }),
        PortMatch::NotIn(ps) => {
            for p in ps {
                out.push(Expr::Cmp {
                    eq: false,
                    data: p.to_be_bytes().to_vec(),
                });
            }
        }
        PortMatch::InSet(name) => out.push(set_ref(name)),
    }
}

/// A port looked up in a hashed port set: 4 bytes from the port on, masked to the port (the
/// set's keys are the port and two zero bytes).
fn lower_hashed_port(out: &mut Vec<Expr>, offset: u32, set: &str) {
    out.push(Expr::Payload {
        base: Base::Transport,
        offset,
        len: 4,
    });
    out.push(Expr::Mask(vec![0xff, 0xff, 0, 0]));
    out.push(set_ref(set));
}

/// A network header address at `(offset, len)`: a CIDR (masked unless a host) or a set.
fn lower_addr(out: &mut Vec<Expr>, (offset, len): (u32, u32), am: &AddrMatch) {
    out.push(Expr::Payload {
        base: Base::Network,
        offset,
        len,
    });
    match am {
        AddrMatch::Eq(net) | AddrMatch::Ne(net) => {
            let eq = matches!(am, AddrMatch::Eq(_));
            if net.prefix_len() < net.max_prefix_len() {
                out.push(Expr::Mask(addr_bytes(net.netmask())));
            }
            out.push(Expr::Cmp {
                eq,
                data: addr_bytes(net.network()),
            });
        }
        AddrMatch::InSet(name) => out.push(set_ref(name)),
    }
}

/// Any of the conntrack states: the state bits masked, then not zero.
fn lower_ct_state(out: &mut Vec<Expr>, states: CtStates) {
    // ct state bits (nf_conntrack_common.h): INVALID 1, ESTABLISHED 2, RELATED 4.
    let mask: u32 = match states {
        CtStates::Invalid => 1,
        CtStates::RelatedEstablished => 2 | 4,
    };
    out.push(Expr::Ct(CtKey::State));
    out.push(Expr::Mask(mask.to_ne_bytes().to_vec()));
    out.push(Expr::Cmp {
        eq: false,
        data: 0u32.to_ne_bytes().to_vec(),
    });
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn lower_action(
    rules: &mut Vec<Vec<Expr>>,
    mut m: Vec<Expr>,
    action: &Action,
    stage: Stage,
    family: Family,
) {
    let v = |v: Verdict| Expr::Verdict(v);
    match action {
        Action::Jump(target) => m.push(v(Verdict::Jump(chain_name(stage, family, target)))),
        Action::Return => m.push(v(Verdict::Return)),
        Action::Accept => m.push(v(Verdict::Accept)),
        Action::Drop => m.push(v(Verdict::Drop)),
        Action::Redirect(port) => {
            m.push(Expr::Imm(port.to_be_bytes().to_vec()));
            m.push(Expr::Redir);
        }
        Action::Tproxy { port, mark } => {
            // xt_TPROXY accepts with the mark set, or drops when no socket takes the packet;
            // nft's tproxy just stops the rule then, so a second rule drops.
            let drop_rule = {
                let mut d = m.clone();
                d.push(v(Verdict::Drop));
                d
            };
            m.push(Expr::Imm(port.to_be_bytes().to_vec()));
            m.push(Expr::Tproxy {
                nfproto: nfproto(family) as u32,
            });
            m.push(Expr::Imm(mark.to_ne_bytes().to_vec()));
            m.push(Expr::MetaSet(MetaKey::Mark));
            m.push(v(Verdict::Accept));
            rules.push(m);
            rules.push(drop_rule);
            return;
        }
        Action::SetMark(mark) => {
            m.push(Expr::Imm(mark.to_ne_bytes().to_vec()));
            m.push(Expr::MetaSet(MetaKey::Mark));
        }
        Action::SaveMark => {
            m.push(Expr::Meta(MetaKey::Mark));
            m.push(Expr::CtSet(CtKey::Mark));
        }
        Action::RestoreMark => {
            m.push(Expr::Ct(CtKey::Mark));
            m.push(Expr::MetaSet(MetaKey::Mark));
        }
        Action::CtZone(zone) => {
            m.push(Expr::Imm(zone.to_ne_bytes().to_vec()));
            m.push(Expr::CtSet(CtKey::Zone));
        }
        // ct mark = (ct mark & !mask) ^ value, as nft writes `ct mark set ct mark & X | Y`.
        // The address into register 1, then source NAT of the chain's family to it.
        Action::Snat(a) => {
            m.push(Expr::Imm(addr_bytes(*a)));
            m.push(Expr::Snat {
                nfproto: nfproto(family) as u32,
            });
        }
        Action::SetCtMarkBits { value, mask } => {
            m.push(Expr::Ct(CtKey::Mark));
            m.push(Expr::Bits {
                mask: ne_bytes(!mask),
                xor: ne_bytes(*value),
            });
            m.push(Expr::CtSet(CtKey::Mark));
        }
    }
    rules.push(m);
}
