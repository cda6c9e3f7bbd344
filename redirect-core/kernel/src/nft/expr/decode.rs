//! Reading an expression back: a rule's `NFTA_LIST_ELEM`s, as a dump returns them, decode into
//! the same `Expr` we encode, when they are exactly a shape we write; anything else stays
//! visible as `Foreign`, with its raw attributes. Apart from the encoder because each kind of
//! expression needs its own strict check here.

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, Operator, Payload, Register, Verdict as NlVerdict, VerdictAttribute,
};

use super::{
    Base, CtKey, Expr, Foreign, MetaKey, Verdict, NFT_LOOKUP_F_INV, NFT_NAT_SNAT, NF_ACCEPT,
    NF_DROP, NF_NAT_RANGE_MAP_IPS, NF_NAT_RANGE_PROTO_SPECIFIED,
};
use crate::nft::extra::{self, CtAttr, NatAttr, RedirAttr, TproxyAttr};

/// Every expression we write uses register 1.
const R1: Register = Register::Reg1;

/// Decode one `NFTA_LIST_ELEM` of a rule. A shape we do not write becomes `Foreign`.
pub(in crate::nft) fn decode(elem: &ListAttribute<ExpressionAttribute>) -> Expr {
    let ListAttribute::Element(attrs) = elem else {
        return Expr::Foreign(Foreign {
            name: "(not an expression)".into(),
            attrs: raw(std::slice::from_ref(elem)),
        });
    };
    let mut name = String::new();
    let mut data = None;
    for a in attrs {
        match a {
            ExpressionAttribute::Name(n) => name = n.clone(),
            ExpressionAttribute::Data(d) => data = Some(d),
            _ => {}
        }
    }
    let Some(data) = data else {
        return Expr::Foreign(Foreign {
            name,
            attrs: Vec::new(),
        });
    };
    decode_data(data).unwrap_or_else(|| {
        Expr::Foreign(Foreign {
            name,
            attrs: raw_expressions(data),
        })
    })
}

/// Attributes as (type with its flags, value bytes).
fn raw<A: Nla>(attrs: &[A]) -> Vec<(u16, Vec<u8>)> {
    attrs
        .iter()
        .map(|a| {
            let d = extra::to_default(a);
            (d.kind(), extra::value(&d))
        })
        .collect()
}

fn raw_expressions(data: &Expressions) -> Vec<(u16, Vec<u8>)> {
    match data {
        Expressions::Bitwise(a) => raw(a),
        Expressions::Cmp(a) => raw(a),
        Expressions::Immediate(a) => raw(a),
        Expressions::Lookup(a) => raw(a),
        Expressions::Meta(a) => raw(a),
        Expressions::Payload(a) => raw(a),
        Expressions::Unknown(a) => raw(a),
        Expressions::Other { attributes, .. } => raw(attributes),
        _ => Vec::new(),
    }
}

fn value(d: &DataAttribute) -> Option<&Vec<u8>> {
    match d {
        DataAttribute::Value(v) => Some(v),
        _ => None,
    }
}

/// The typed form of an expression's data, when it is exactly a shape we write.
fn decode_data(data: &Expressions) -> Option<Expr> {
    match data {
        Expressions::Meta(attrs) => decode_meta(attrs),
        Expressions::Payload(attrs) => decode_payload(attrs),
        Expressions::Cmp(attrs) => decode_cmp(attrs),
        Expressions::Bitwise(attrs) => decode_mask(attrs),
        Expressions::Lookup(attrs) => decode_lookup(attrs),
        Expressions::Immediate(attrs) => decode_immediate(attrs),
        Expressions::Other {
            expression_type,
            attributes,
        } => decode_other(expression_type, attributes),
        _ => None,
    }
}

/// A meta load into, or set from, register 1.
fn decode_meta(attrs: &[Meta]) -> Option<Expr> {
    let (mut key, mut dreg, mut sreg) = (None, None, None);
    for a in attrs {
        match a {
            Meta::Key(k) => key = Some(MetaKey::from_netlink(*k)?),
            Meta::DestinationRegister(r) => dreg = Some(*r),
            Meta::SourceRegister(r) => sreg = Some(*r),
            _ => return None,
        }
    }
    match (key?, dreg, sreg) {
        (k, Some(r), None) if r == R1 => Some(Expr::Meta(k)),
        (k, None, Some(r)) if r == R1 => Some(Expr::MetaSet(k)),
        _ => None,
    }
}

/// A payload load of the network or transport header into register 1.
fn decode_payload(attrs: &[Payload]) -> Option<Expr> {
    let (mut dreg, mut base, mut offset, mut len) = (None, None, None, None);
    for a in attrs {
        match a {
            Payload::DestinationRegister(r) => dreg = Some(*r),
            Payload::Base(b) => base = Some(*b),
            Payload::Offset(o) => offset = Some(*o),
            Payload::Len(l) => len = Some(*l),
            _ => return None,
        }
    }
    let base = match base? {
        1 => Base::Network,
        2 => Base::Transport,
        _ => return None,
    };
    (dreg? == R1).then_some(Expr::Payload {
        base,
        offset: offset?,
        len: len?,
    })
}

/// An equal or not-equal comparison of register 1.
fn decode_cmp(attrs: &[Cmp]) -> Option<Expr> {
    let (mut sreg, mut op, mut data) = (None, None, None);
    for a in attrs {
        match a {
            Cmp::SourceRegister(r) => sreg = Some(*r),
            Cmp::Op(o) => op = Some(*o),
            Cmp::Data(d) => data = Some(value(d)?.clone()),
            _ => return None,
        }
    }
    let eq = match op? {
        Operator::Equal => true,
        Operator::NotEqual => false,
        _ => return None,
    };
    (sreg? == R1).then_some(Expr::Cmp { eq, data: data? })
}

/// A bitwise AND of register 1 with a mask, then an XOR, in place: the only bitwise we write
/// (a zero XOR is a [`Expr::Mask`], another one [`Expr::Bits`]).
fn decode_mask(attrs: &[Bitwise]) -> Option<Expr> {
    let (mut sreg, mut dreg, mut len, mut mask, mut xor) = (None, None, None, None, None);
    for a in attrs {
        match a {
            Bitwise::SourceRegister(r) => sreg = Some(*r),
            Bitwise::DestinationRegister(r) => dreg = Some(*r),
            Bitwise::Length(l) => len = Some(*l as usize),
            Bitwise::Mask(d) => mask = Some(value(d)?.clone()),
            Bitwise::Xor(d) => xor = Some(value(d)?.clone()),
            // NFT_BITWISE_BOOL (mask and xor), which newer kernels dump explicitly.
            Bitwise::Op(0) => {}
            _ => return None,
        }
    }
    let (mask, xor) = (mask?, xor?);
    let fits = sreg? == R1 && dreg? == R1 && len? == mask.len() && xor.len() == mask.len();
    if !fits {
        return None;
    }
    Some(match xor.iter().all(|b| *b == 0) {
        true => Expr::Mask(mask),
        false => Expr::Bits { mask, xor },
    })
}

/// A lookup of register 1 in a named set, maybe inverted.
fn decode_lookup(attrs: &[Lookup]) -> Option<Expr> {
    let (mut set, mut sreg, mut flags) = (None, None, 0);
    for a in attrs {
        match a {
            Lookup::Set(s) => set = Some(s.clone()),
            Lookup::SourceRegister(r) => sreg = Some(*r),
            Lookup::Flags(f) => flags = *f,
            // A transaction id: meaningless once committed.
            Lookup::SetId(_) => {}
            _ => return None,
        }
    }
    (sreg? == R1 && flags & !NFT_LOOKUP_F_INV == 0).then_some(Expr::Lookup {
        set: set?,
        invert: flags & NFT_LOOKUP_F_INV != 0,
    })
}

/// An immediate: a value into register 1, or a verdict.
fn decode_immediate(attrs: &[Immediate]) -> Option<Expr> {
    let (mut dreg, mut data) = (None, None);
    for a in attrs {
        match a {
            Immediate::DestinationRegister(r) => dreg = Some(*r),
            Immediate::Data(d) => data = Some(d),
            _ => return None,
        }
    }
    match (dreg?, data?) {
        (r, DataAttribute::Value(v)) if r == R1 => Some(Expr::Imm(v.clone())),
        (Register::Verdict, DataAttribute::Verdict(va)) => decode_verdict(va),
        _ => None,
    }
}

/// The expressions the netlink crate does not type (ct, redir, tproxy, nat, counter), from our own
/// attribute types.
fn decode_other(expression_type: &str, attributes: &[DefaultNla]) -> Option<Expr> {
    match expression_type {
        "ct" => decode_ct(attributes),
        "redir" => {
            let want = [
                RedirAttr::RegProtoMin(1),
                RedirAttr::RegProtoMax(1),
                RedirAttr::Flags(NF_NAT_RANGE_PROTO_SPECIFIED),
            ];
            (extra::parse_all::<RedirAttr>(attributes)?.as_slice() == want).then_some(Expr::Redir)
        }
        "tproxy" => match extra::parse_all::<TproxyAttr>(attributes)?.as_slice() {
            [TproxyAttr::Family(f), TproxyAttr::RegPort(1)] => Some(Expr::Tproxy { nfproto: *f }),
            _ => None,
        },
        "nat" => decode_snat(attributes),
        // Packet and byte counts are the kernel's; any counter is our counter.
        "counter" => Some(Expr::Counter),
        _ => None,
    }
}

/// `ct` loads or sets with register 1; anything else (a direction, another key) is not ours.
fn decode_ct(attrs: &[DefaultNla]) -> Option<Expr> {
    match extra::parse_all::<CtAttr>(attrs)?.as_slice() {
        [CtAttr::Dreg(1), CtAttr::Key(k)] => Some(Expr::Ct(CtKey::from_raw(*k)?)),
        [CtAttr::Key(k), CtAttr::Sreg(1)] => Some(Expr::CtSet(CtKey::from_raw(*k)?)),
        _ => None,
    }
}

/// Source NAT to the address in register 1: as we send it (and the kernel dumps it), or as nft
/// sends it (the address register alone).
fn decode_snat(attributes: &[DefaultNla]) -> Option<Expr> {
    use NatAttr::*;
    let nfproto = match extra::parse_all::<NatAttr>(attributes)?.as_slice() {
        [Type(NFT_NAT_SNAT), Family(f), RegAddrMin(1)] => *f,
        [Type(NFT_NAT_SNAT), Family(f), RegAddrMin(1), RegAddrMax(1), Flags(NF_NAT_RANGE_MAP_IPS)] => {
            *f
        }
        _ => return None,
    };
    Some(Expr::Snat { nfproto })
}

fn decode_verdict(va: &[VerdictAttribute]) -> Option<Expr> {
    let (mut code, mut chain) = (None, None);
    for a in va {
        match a {
            VerdictAttribute::Code(c) => code = Some(*c),
            VerdictAttribute::Chain(c) => chain = Some(c.clone()),
            _ => return None,
        }
    }
    let v = match (code?, chain) {
        (NlVerdict::Jump, Some(c)) => Verdict::Jump(c),
        (NlVerdict::Return, None) => Verdict::Return,
        (NlVerdict::Other(NF_ACCEPT), None) => Verdict::Accept,
        (NlVerdict::Other(NF_DROP), None) => Verdict::Drop,
        _ => return None,
    };
    Some(Expr::Verdict(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_netfilter::nftables::MetaKey as NlMetaKey;

    #[test]
    fn a_shape_we_do_not_write_stays_visible_as_foreign() {
        // A meta load into register 2 is not ours: it keeps its name and attributes.
        let e = Expressions::Meta(vec![
            Meta::Key(NlMetaKey::L4Proto),
            Meta::DestinationRegister(Register::Reg2),
        ]);
        let decoded = decode(&e.into());
        let Expr::Foreign(f) = decoded else {
            panic!("{decoded:?}")
        };
        assert_eq!(f.name, "meta");
        assert_eq!(
            f.attrs,
            vec![
                (2, 16u32.to_be_bytes().to_vec()),
                (1, 2u32.to_be_bytes().to_vec())
            ]
        );
    }
}
