//! The nf_tables expressions of our rules, typed, in both directions: what we send and what a
//! dump reads back decode into the same `Expr`, so read-back compares structurally and nft
//! syntax is printed from this form (`text`). Every expression uses register 1.
//!
//! Encoding goes through `netlink-packet-netfilter` where it has the expression (meta, payload,
//! cmp, bitwise, immediate, lookup); ct, redir, tproxy and counter are our own attribute types
//! (`extra`). Attributes are written in libnftnl's order, so every rule is byte-identical to
//! the one libnftnl builds (the oracle test in `tests/nft_oracle.rs` holds us to it).

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::nftables::{
    Bitwise, Cmp, DataAttribute, ExpressionAttribute, Expressions, Immediate, ListAttribute,
    Lookup, Meta, MetaKey as NlMetaKey, Operator, Payload, Register, Verdict as NlVerdict,
    VerdictAttribute,
};

use super::extra::{self, CtAttr, RedirAttr, TproxyAttr};

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
            Expr::Verdict(v) => {
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

    /// Decode one `NFTA_LIST_ELEM` of a rule. A shape we do not write becomes `Foreign`.
    pub(super) fn decode(elem: &ListAttribute<ExpressionAttribute>) -> Expr {
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
}

/// An expression the crate does not model, from our own attribute types.
fn other<A: Nla>(name: &str, attrs: &[A]) -> Expressions {
    Expressions::Other {
        expression_type: name.into(),
        attributes: attrs.iter().map(extra::to_default).collect(),
    }
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
    let r1 = Register::Reg1;
    match data {
        Expressions::Meta(attrs) => {
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
                (k, Some(r), None) if r == r1 => Some(Expr::Meta(k)),
                (k, None, Some(r)) if r == r1 => Some(Expr::MetaSet(k)),
                _ => None,
            }
        }
        Expressions::Payload(attrs) => {
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
            (dreg? == r1).then_some(Expr::Payload {
                base,
                offset: offset?,
                len: len?,
            })
        }
        Expressions::Cmp(attrs) => {
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
            (sreg? == r1).then_some(Expr::Cmp { eq, data: data? })
        }
        Expressions::Bitwise(attrs) => {
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
            let fits = sreg? == r1
                && dreg? == r1
                && len? == mask.len()
                && xor.len() == mask.len()
                && xor.iter().all(|b| *b == 0);
            fits.then_some(Expr::Mask(mask))
        }
        Expressions::Lookup(attrs) => {
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
            (sreg? == r1 && flags & !NFT_LOOKUP_F_INV == 0).then_some(Expr::Lookup {
                set: set?,
                invert: flags & NFT_LOOKUP_F_INV != 0,
            })
        }
        Expressions::Immediate(attrs) => {
            let (mut dreg, mut data) = (None, None);
            for a in attrs {
                match a {
                    Immediate::DestinationRegister(r) => dreg = Some(*r),
                    Immediate::Data(d) => data = Some(d),
                    _ => return None,
                }
            }
            match (dreg?, data?) {
                (r, DataAttribute::Value(v)) if r == r1 => Some(Expr::Imm(v.clone())),
                (Register::Verdict, DataAttribute::Verdict(va)) => decode_verdict(va),
                _ => None,
            }
        }
        Expressions::Other {
            expression_type,
            attributes,
        } => match expression_type.as_str() {
            "ct" => extra::decode_ct(attributes),
            "redir" => {
                let want = [
                    RedirAttr::RegProtoMin(1),
                    RedirAttr::RegProtoMax(1),
                    RedirAttr::Flags(NF_NAT_RANGE_PROTO_SPECIFIED),
                ];
                (extra::parse_all::<RedirAttr>(attributes)?.as_slice() == want)
                    .then_some(Expr::Redir)
            }
            "tproxy" => match extra::parse_all::<TproxyAttr>(attributes)?.as_slice() {
                [TproxyAttr::Family(f), TproxyAttr::RegPort(1)] => {
                    Some(Expr::Tproxy { nfproto: *f })
                }
                _ => None,
            },
            // Packet and byte counts are the kernel's; any counter is our counter.
            "counter" => Some(Expr::Counter),
            _ => None,
        },
        _ => None,
    }
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

    #[test]
    fn a_shape_we_do_not_write_stays_visible_as_foreign() {
        // A meta load into register 2 is not ours: it keeps its name and attributes.
        let e = Expressions::Meta(vec![
            Meta::Key(NlMetaKey::L4Proto),
            Meta::DestinationRegister(Register::Reg2),
        ]);
        let decoded = Expr::decode(&e.into());
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
