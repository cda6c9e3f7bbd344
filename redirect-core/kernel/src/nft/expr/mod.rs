//! The nf_tables expressions of our rules, typed, in both directions: what we send and what a
//! dump reads back decode into the same `Expr`, so read-back compares structurally and nft
//! syntax is printed from this form (`text`). Every expression uses register 1.
//!
//! Encoding goes through `netlink-packet-netfilter` where it has the expression (meta, payload,
//! cmp, bitwise, immediate, lookup); ct, redir, tproxy and counter are our own attribute types
//! (`extra`). Attributes are written in libnftnl's order, so every rule is byte-identical to
//! the one libnftnl builds (the oracle test in `tests/nft_oracle.rs` holds us to it).
//!
//! Here: the types and the encoder; `decode` reads a dumped expression back.

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, MetaKey as NlMetaKey, Operator, Payload, Register, Verdict as NlVerdict,
    VerdictAttribute,
};

use super::extra::{self, CtAttr, RedirAttr, TproxyAttr};

mod decode;

/// Where a payload load reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    Network,
    Transport,
}

impl Base {
    fn raw(self) -> u32 {
        match self {
            Base::Network => 1,
            Base::Transport => 2,
        }
    }
}

/// Meta keys we load or set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaKey {
    NfProto,
    L4Proto,
    IifName,
    OifName,
    SkUid,
    SkGid,
    Mark,
}

impl MetaKey {
    fn netlink(self) -> NlMetaKey {
        match self {
            MetaKey::NfProto => NlMetaKey::Nfproto,
            MetaKey::L4Proto => NlMetaKey::L4Proto,
            MetaKey::IifName => NlMetaKey::Iifname,
            MetaKey::OifName => NlMetaKey::Oifname,
            MetaKey::SkUid => NlMetaKey::SocketUserId,
            MetaKey::SkGid => NlMetaKey::SocketGroupId,
            MetaKey::Mark => NlMetaKey::Mark,
        }
    }

    fn from_netlink(k: NlMetaKey) -> Option<Self> {
        Some(match k {
            NlMetaKey::Nfproto => MetaKey::NfProto,
            NlMetaKey::L4Proto => MetaKey::L4Proto,
            NlMetaKey::Iifname => MetaKey::IifName,
            NlMetaKey::Oifname => MetaKey::OifName,
            NlMetaKey::SocketUserId => MetaKey::SkUid,
            NlMetaKey::SocketGroupId => MetaKey::SkGid,
            NlMetaKey::Mark => MetaKey::Mark,
            _ => return None,
        })
    }

    /// The key as nft names it.
    pub fn name(self) -> &'static str {
        match self {
            MetaKey::NfProto => "nfproto",
            MetaKey::L4Proto => "l4proto",
            MetaKey::IifName => "iifname",
            MetaKey::OifName => "oifname",
            MetaKey::SkUid => "skuid",
            MetaKey::SkGid => "skgid",
            MetaKey::Mark => "mark",
        }
    }
}

/// Conntrack keys we load or set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKey {
    State,
    Mark,
    Zone,
}

impl CtKey {
    pub(super) fn raw(self) -> u32 {
        match self {
            CtKey::State => extra::NFT_CT_STATE,
            CtKey::Mark => extra::NFT_CT_MARK,
            CtKey::Zone => extra::NFT_CT_ZONE,
        }
    }

    pub(super) fn from_raw(k: u32) -> Option<Self> {
        Some(match k {
            extra::NFT_CT_STATE => CtKey::State,
            extra::NFT_CT_MARK => CtKey::Mark,
            extra::NFT_CT_ZONE => CtKey::Zone,
            _ => return None,
        })
    }
}

/// One nf_tables expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// Load a meta key into reg 1.
    Meta(MetaKey),
    /// Set a meta key from reg 1.
    MetaSet(MetaKey),
    /// Load `len` bytes at `offset` of a header into reg 1.
    Payload {
        base: Base,
        offset: u32,
        len: u32,
    },
    /// Compare reg 1 with data.
    Cmp {
        eq: bool,
        data: Vec<u8>,
    },
    /// reg 1 = (reg 1 & mask) ^ 0.
    Mask(Vec<u8>),
    /// Look reg 1 up in a named set of our table (the set id is added when encoding).
    Lookup {
        set: String,
        invert: bool,
    },
    /// Load a conntrack key into reg 1.
    Ct(CtKey),
    /// Set a conntrack key from reg 1.
    CtSet(CtKey),
    /// reg 1 = data.
    Imm(Vec<u8>),
    /// Redirect to the port in reg 1 (big-endian).
    Redir,
    /// Transparent proxy to the port in reg 1 (big-endian), for one family.
    Tproxy {
        nfproto: u32,
    },
    Counter,
    Verdict(Verdict),
    /// An expression of a shape we never write (someone else's rule): kept with its raw
    /// attributes so that nothing in the table is hidden or dropped.
    Foreign(Foreign),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
}

/// An expression we do not model: its name and its attributes as (type, value bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    pub name: String,
    pub attrs: Vec<(u16, Vec<u8>)>,
}

const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED` (linux/netfilter/nf_nat.h).
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
const NFT_LOOKUP_F_INV: u32 = 1;

impl Expr {
    /// The expression as a rule's `NFTA_LIST_ELEM`. `set_id` gives the transaction id of a
    /// set of ours by name (0 when unknown, as libnftnl writes it).
    pub(super) fn encode(
        &self,
        set_id: &dyn Fn(&str) -> u32,
    ) -> ListAttribute<ExpressionAttribute> {
        let r1 = Register::Reg1;
        let ex = match self {
            Expr::Meta(k) => {
                Expressions::Meta(vec![Meta::Key(k.netlink()), Meta::DestinationRegister(r1)])
            }
            Expr::MetaSet(k) => {
                Expressions::Meta(vec![Meta::Key(k.netlink()), Meta::SourceRegister(r1)])
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
            Expr::Lookup { set, invert } => Expressions::Lookup(vec![
                Lookup::SourceRegister(r1),
                Lookup::Set(set.clone()),
                Lookup::SetId(set_id(set)),
                Lookup::Flags(if *invert { NFT_LOOKUP_F_INV } else { 0 }),
            ]),
            Expr::Ct(k) => other("ct", &[CtAttr::Key(k.raw()), CtAttr::Dreg(1)]),
            Expr::CtSet(k) => other("ct", &[CtAttr::Key(k.raw()), CtAttr::Sreg(1)]),
            Expr::Imm(data) => Expressions::Immediate(vec![
                Immediate::DestinationRegister(r1),
                Immediate::Data(DataAttribute::Value(data.clone())),
            ]),
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
            Expr::Counter => other::<CtAttr>("counter", &[]),
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

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, NlaBuffer, Parseable};

    fn round_trip(e: &Expr) -> Expr {
        let attr = e.encode(&|_| 7);
        let mut buf = vec![0u8; attr.buffer_len()];
        attr.emit(&mut buf);
        let parsed =
            ListAttribute::<ExpressionAttribute>::parse(&NlaBuffer::new(&buf[..])).unwrap();
        Expr::decode(&parsed)
    }

    #[test]
    fn every_expression_we_write_decodes_to_itself() {
        let all = [
            Expr::Meta(MetaKey::NfProto),
            Expr::MetaSet(MetaKey::Mark),
            Expr::Payload {
                base: Base::Transport,
                offset: 2,
                len: 2,
            },
            Expr::Cmp {
                eq: false,
                data: vec![1, 2, 3],
            },
            Expr::Mask(vec![255, 255, 0, 0]),
            Expr::Lookup {
                set: "ports".into(),
                invert: true,
            },
            Expr::Ct(CtKey::State),
            Expr::CtSet(CtKey::Zone),
            Expr::Imm(vec![0x3a, 0x98]),
            Expr::Redir,
            Expr::Tproxy { nfproto: 10 },
            Expr::Counter,
            Expr::Verdict(Verdict::Accept),
            Expr::Verdict(Verdict::Drop),
            Expr::Verdict(Verdict::Return),
            Expr::Verdict(Verdict::Jump("nat_ip_istio_output".into())),
            Expr::Foreign(Foreign {
                name: "limit".into(),
                attrs: vec![(1, vec![0, 0, 0, 0, 0, 0, 0, 10])],
            }),
        ];
        for e in &all {
            assert_eq!(&round_trip(e), e);
        }
    }
}
