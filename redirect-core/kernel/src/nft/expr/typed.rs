//! The typed encoding of an expression through `netlink-packet-netfilter` (and our `extra`
//! attributes): what was sent before `Expr::emit`, kept as the reference the writer's bytes
//! are tested against, and to parse back in the round-trip test.

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, MetaKey as NlMetaKey, Operator, Payload, Register, Verdict as NlVerdict,
    VerdictAttribute,
};

use super::super::extra::{self, CtAttr, NatAttr, RedirAttr, TproxyAttr};
use super::*;

fn netlink(k: MetaKey) -> NlMetaKey {
    match k {
        MetaKey::NfProto => NlMetaKey::Nfproto,
        MetaKey::L4Proto => NlMetaKey::L4Proto,
        MetaKey::IifName => NlMetaKey::Iifname,
        MetaKey::OifName => NlMetaKey::Oifname,
        MetaKey::SkUid => NlMetaKey::SocketUserId,
        MetaKey::SkGid => NlMetaKey::SocketGroupId,
        MetaKey::Mark => NlMetaKey::Mark,
        MetaKey::NfTrace => NlMetaKey::NftraceBit,
    }
}

impl Expr {
    /// The expression as a rule's `NFTA_LIST_ELEM`, in the crate's typed form. `set_id` gives
    /// the transaction id of a set of ours by name (0 when unknown, as libnftnl writes it).
    /// What is sent is [`Expr::emit`]'s, the same bytes without the allocations.
    pub(in crate::nft) fn encode(
        &self,
        set_id: &dyn Fn(&str) -> u32,
    ) -> ListAttribute<ExpressionAttribute> {
        let r1 = Register::Reg1;
        let ex = match self {
            Expr::Meta(k) => {
                Expressions::Meta(vec![Meta::Key(netlink(*k)), Meta::DestinationRegister(r1)])
            }
            Expr::MetaSet(k) => {
                Expressions::Meta(vec![Meta::Key(netlink(*k)), Meta::SourceRegister(r1)])
            }
            Expr::Payload { base, offset, len } => Expressions::Payload(vec![
                Payload::DestinationRegister(r1),
                Payload::Base(base.raw()),
                Payload::Offset(*offset),
                Payload::Len(*len),
            ]),
            Expr::Cmp { eq, data } => Expressions::Cmp(vec![
                Cmp::SourceRegister(r1),
                Cmp::Op(if *eq {
                    Operator::Equal
                } else {
                    Operator::NotEqual
                }),
                Cmp::Data(DataAttribute::Value(data.clone())),
            ]),
            Expr::Mask(mask) => Expressions::Bitwise(vec![
                Bitwise::SourceRegister(r1),
                Bitwise::DestinationRegister(r1),
                Bitwise::Length(mask.len() as u32),
                Bitwise::Mask(DataAttribute::Value(mask.clone())),
                Bitwise::Xor(DataAttribute::Value(vec![0; mask.len()])),
            ]),
            Expr::Bits { mask, xor } => Expressions::Bitwise(vec![
                Bitwise::SourceRegister(r1),
                Bitwise::DestinationRegister(r1),
                Bitwise::Length(mask.len() as u32),
                Bitwise::Mask(DataAttribute::Value(mask.clone())),
                Bitwise::Xor(DataAttribute::Value(xor.clone())),
            ]),
            Expr::Lookup { set, invert } => Expressions::Lookup(vec![
                Lookup::SourceRegister(r1),
                Lookup::Set(set.clone()),
                Lookup::SetId(set_id(set)),
                Lookup::Flags(if *invert { NFT_LOOKUP_F_INV } else { 0 }),
            ]),
            Expr::Imm(data) => Expressions::Immediate(vec![
                Immediate::DestinationRegister(r1),
                Immediate::Data(DataAttribute::Value(data.clone())),
            ]),
            Expr::Ct(_)
            | Expr::CtSet(_)
            | Expr::Redir
            | Expr::Tproxy { .. }
            | Expr::Snat { .. }
            | Expr::Counter => self.ours(),
            Expr::Verdict(v) => verdict(v),
            Expr::Foreign(f) => Expressions::Other {
                expression_type: f.name.clone(),
                attributes: f
                    .attrs
                    .iter()
                    .map(|(k, v)| DefaultNla::new(*k, v.clone()))
                    .collect(),
            },
        };
        ex.into()
    }

    /// The expressions the crate does not type, from our own attribute types (`extra`).
    fn ours(&self) -> Expressions {
        match self {
            Expr::Ct(k) => other("ct", &[CtAttr::Key(k.raw()), CtAttr::Dreg(1)]),
            Expr::CtSet(k) => other("ct", &[CtAttr::Key(k.raw()), CtAttr::Sreg(1)]),
            // As the kernel dumps it back: min = max, and "port given".
            Expr::Redir => other(
                "redir",
                &[
                    RedirAttr::RegProtoMin(1),
                    RedirAttr::RegProtoMax(1),
                    RedirAttr::Flags(NF_NAT_RANGE_PROTO_SPECIFIED),
                ],
            ),
            Expr::Tproxy { nfproto } => other(
                "tproxy",
                &[TproxyAttr::Family(*nfproto), TproxyAttr::RegPort(1)],
            ),
            Expr::Snat { nfproto } => other(
                "nat",
                &[
                    NatAttr::Type(NFT_NAT_SNAT),
                    NatAttr::Family(*nfproto),
                    NatAttr::RegAddrMin(1),
                    NatAttr::RegAddrMax(1),
                    NatAttr::Flags(NF_NAT_RANGE_MAP_IPS),
                ],
            ),
            Expr::Counter => other::<CtAttr>("counter", &[]),
            _ => unreachable!("typed by the crate: {self:?}"),
        }
    }
}

/// A verdict: an immediate into the verdict register.
fn verdict(v: &Verdict) -> Expressions {
    let (code, chain) = match v {
        Verdict::Accept => (NlVerdict::Other(NF_ACCEPT), None),
        Verdict::Drop => (NlVerdict::Other(NF_DROP), None),
        Verdict::Return => (NlVerdict::Return, None),
        Verdict::Jump(c) => (NlVerdict::Jump, Some(c)),
    };
    let mut va = vec![VerdictAttribute::Code(code)];
    va.extend(chain.map(|c| VerdictAttribute::Chain(c.clone())));
    Expressions::Immediate(vec![
        Immediate::DestinationRegister(Register::Verdict),
        Immediate::Data(DataAttribute::Verdict(va)),
    ])
}

/// An expression the crate does not model, from our own attribute types.
fn other<A: Nla>(name: &str, attrs: &[A]) -> Expressions {
    Expressions::Other {
        expression_type: name.into(),
        attributes: attrs.iter().map(extra::to_default).collect(),
    }
}
