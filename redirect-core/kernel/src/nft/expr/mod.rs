//! The nf_tables expressions of our rules, typed, in both directions: what we send and what a
//! dump reads back decode into the same `Expr`, so read-back compares structurally and nft
//! syntax is printed from this form (`text`). Every expression uses register 1.
//!
//! Encoding goes through `netlink-packet-netfilter` where it has the expression (meta, payload,
//! cmp, bitwise, immediate, lookup); ct, redir, tproxy, nat and counter are our own attribute types
//! (`extra`). Attributes are written in libnftnl's order, so every rule is byte-identical to
//! the one libnftnl builds (the oracle test in `tests/nft_oracle.rs` holds us to it).
//!
//! Here: the types and the encoder; `decode` reads a dumped expression back (with `extra`'s
//! attribute types).

use netlink_packet_netfilter::nftables::MetaKey as NlMetaKey;

use super::extra;
use super::nla_writer::NlaWriter;

mod decode;
#[cfg(test)]
mod typed;

pub(in crate::nft) use decode::decode;

/// Where a payload load reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// The network header (IPv4 or IPv6): `ip daddr`, `ip6 saddr`.
    Network,
    /// The transport header (TCP, UDP): `th dport`.
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
    /// The packet's family in an `inet` table (IPv4 or IPv6).
    NfProto,
    /// The transport protocol (TCP, UDP).
    L4Proto,
    /// The name of the interface the packet came in on.
    IifName,
    /// The name of the interface the packet goes out on.
    OifName,
    /// The uid owning the local socket that sent the packet.
    SkUid,
    /// The gid owning the local socket that sent the packet.
    SkGid,
    /// The packet's mark (fwmark).
    Mark,
    /// The packet's trace bit (`meta nftrace`): set, the kernel reports every rule the packet
    /// meets to `NFNLGRP_NFTRACE` (only the trace table of `redirect-validate trace` sets it).
    NfTrace,
}

impl MetaKey {
    /// `enum nft_meta_keys`.
    fn raw(self) -> u32 {
        match self {
            MetaKey::Mark => 3,
            MetaKey::NfTrace => 12,
            MetaKey::IifName => 6,
            MetaKey::OifName => 7,
            MetaKey::SkUid => 10,
            MetaKey::SkGid => 11,
            MetaKey::NfProto => 15,
            MetaKey::L4Proto => 16,
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
            NlMetaKey::NftraceBit => MetaKey::NfTrace,
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
            MetaKey::NfTrace => "nftrace",
        }
    }
}

/// Conntrack keys we load or set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKey {
    /// The connection's state bits (new, established, related...).
    State,
    /// The connection's mark.
    Mark,
    /// The connection's conntrack zone.
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
        /// The header read.
        base: Base,
        /// Where the bytes start, from the header's start.
        offset: u32,
        /// How many bytes.
        len: u32,
    },
    /// Compare reg 1 with data.
    Cmp {
        /// Whether the rule goes on when they are equal (`==`); otherwise when not (`!=`).
        eq: bool,
        /// The bytes compared with, as the register holds them.
        data: Vec<u8>,
    },
    /// reg 1 = (reg 1 & mask) ^ 0.
    Mask(Vec<u8>),
    /// reg 1 = (reg 1 & mask) ^ xor, `xor` not all zero (a zero one is [`Expr::Mask`]): some
    /// bits of a mark set, the others kept.
    Bits {
        /// The bits kept.
        mask: Vec<u8>,
        /// The bits then set.
        xor: Vec<u8>,
    },
    /// Look reg 1 up in a named set of our table (the set id is added when encoding).
    Lookup {
        /// The set's name.
        set: String,
        /// Whether the rule goes on when reg 1 is *not* in the set.
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
        /// The family, as an `NFPROTO_*` number (2 IPv4, 10 IPv6).
        nfproto: u32,
    },
    /// Source NAT of one family to the address in reg 1 (`snat ip to A`).
    Snat {
        /// The family, as an `NFPROTO_*` number (2 IPv4, 10 IPv6).
        nfproto: u32,
    },
    /// Count the packets and bytes that reach it.
    Counter,
    /// End the rule with a verdict.
    Verdict(Verdict),
    /// An expression of a shape we never write (someone else's rule): kept with its raw
    /// attributes so that nothing in the table is hidden or dropped.
    Foreign(Foreign),
}

/// What a rule's verdict does with the packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through this hook.
    Accept,
    /// Drop it.
    Drop,
    /// Go back to the chain that jumped here.
    Return,
    /// Go on in the chain by that name, then come back.
    Jump(String),
}

/// An expression we do not model: its name and its attributes as (type, value bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    /// The expression's name (`NFTA_EXPR_NAME`: "fib", "limit").
    pub name: String,
    /// Its data's attributes, in the order the kernel dumped them.
    pub attrs: Vec<(u16, Vec<u8>)>,
}

const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED` (linux/netfilter/nf_nat.h).
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
/// `NF_NAT_RANGE_MAP_IPS`: the kernel sets it when an address register is given.
const NF_NAT_RANGE_MAP_IPS: u32 = 1;
/// `NFT_NAT_SNAT`.
const NFT_NAT_SNAT: u32 = 0;
const NFT_LOOKUP_F_INV: u32 = 1;

/// A verdict: an immediate (`NFTA_IMMEDIATE_DREG` 1, `_DATA` 2) into the verdict register.
fn emit_verdict(v: &Verdict, w: &mut NlaWriter) {
    w.u32(1, NFT_REG_VERDICT);
    w.nest(2, |w| {
        w.nest(NFTA_DATA_VERDICT, |w| {
            let (code, chain) = match v {
                Verdict::Accept => (NF_ACCEPT as i32, None),
                Verdict::Drop => (NF_DROP as i32, None),
                Verdict::Return => (NFT_RETURN, None),
                Verdict::Jump(c) => (NFT_JUMP, Some(c)),
            };
            w.u32(NFTA_VERDICT_CODE, code as u32);
            if let Some(c) = chain {
                w.str(NFTA_VERDICT_CHAIN, c);
            }
        })
    });
}

/// A data attribute `kind` holding `data` as a value (NFTA_DATA_VALUE).
fn value(w: &mut NlaWriter, kind: u16, data: &[u8]) {
    w.nest(kind, |w| w.bytes(NFTA_DATA_VALUE, data))
}

/// Register 1 = (register 1 & mask) ^ xor: NFTA_BITWISE_SREG 1, _DREG 2, _LEN 3, _MASK 4,
/// _XOR 5.
fn emit_bitwise(w: &mut NlaWriter, mask: &[u8], xor: &[u8]) {
    w.u32(1, NFT_REG_1);
    w.u32(2, NFT_REG_1);
    w.u32(3, mask.len() as u32);
    value(w, 4, mask);
    value(w, 5, xor);
}

// linux/netfilter/nf_tables.h: the attributes `emit` writes.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_RETURN: i32 = -5;
const NFT_JUMP: i32 = -3;

impl Expr {
    /// [`Expr::encode`]'s bytes, written straight into `w` (no attribute is allocated).
    pub(in crate::nft) fn emit(&self, set_id: &dyn Fn(&str) -> u32, w: &mut NlaWriter) {
        w.nest(NFTA_LIST_ELEM, |w| {
            w.str(NFTA_EXPR_NAME, self.name());
            w.nest(NFTA_EXPR_DATA, |w| self.emit_data(set_id, w));
        });
    }

    fn name(&self) -> &str {
        match self {
            Expr::Meta(_) | Expr::MetaSet(_) => "meta",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Mask(_) | Expr::Bits { .. } => "bitwise",
            Expr::Lookup { .. } => "lookup",
            Expr::Ct(_) | Expr::CtSet(_) => "ct",
            Expr::Imm(_) | Expr::Verdict(_) => "immediate",
            Expr::Redir => "redir",
            Expr::Tproxy { .. } => "tproxy",
            Expr::Snat { .. } => "nat",
            Expr::Counter => "counter",
            Expr::Foreign(f) => &f.name,
        }
    }

    /// The expression's attributes, in libnftnl's order (the numbers are each expression's
    /// `NFTA_*` of nf_tables.h).
    fn emit_data(&self, set_id: &dyn Fn(&str) -> u32, w: &mut NlaWriter) {
        match self {
            // NFTA_META_KEY 2, _DREG 1, _SREG 3.
            Expr::Meta(k) => {
                w.u32(2, k.raw());
                w.u32(1, NFT_REG_1);
            }
            Expr::MetaSet(k) => {
                w.u32(2, k.raw());
                w.u32(3, NFT_REG_1);
            }
            // NFTA_PAYLOAD_DREG 1, _BASE 2, _OFFSET 3, _LEN 4.
            Expr::Payload { base, offset, len } => {
                w.u32(1, NFT_REG_1);
                w.u32(2, base.raw());
                w.u32(3, *offset);
                w.u32(4, *len);
            }
            // NFTA_CMP_SREG 1, _OP 2 (NFT_CMP_EQ 0, _NEQ 1), _DATA 3.
            Expr::Cmp { eq, data } => {
                w.u32(1, NFT_REG_1);
                w.u32(2, if *eq { 0 } else { 1 });
                value(w, 3, data);
            }
            Expr::Mask(mask) => emit_bitwise(w, mask, &vec![0; mask.len()]),
            Expr::Bits { mask, xor } => emit_bitwise(w, mask, xor),
            // NFTA_LOOKUP_SREG 2, _SET 1, _SET_ID 4, _FLAGS 5.
            Expr::Lookup { set, invert } => {
                w.u32(2, NFT_REG_1);
                w.str(1, set);
                w.u32(4, set_id(set));
                w.u32(5, if *invert { NFT_LOOKUP_F_INV } else { 0 });
            }
            Expr::Ct(k) => {
                w.u32(2, k.raw());
                w.u32(1, NFT_REG_1);
            }
            Expr::CtSet(k) => {
                w.u32(2, k.raw());
                w.u32(4, NFT_REG_1);
            }
            // NFTA_IMMEDIATE_DREG 1, _DATA 2.
            Expr::Imm(data) => {
                w.u32(1, NFT_REG_1);
                value(w, 2, data);
            }
            Expr::Verdict(v) => emit_verdict(v, w),
            // NFTA_REDIR_REG_PROTO_MIN 1, _MAX 2, _FLAGS 3.
            Expr::Redir => {
                w.u32(1, NFT_REG_1);
                w.u32(2, NFT_REG_1);
                w.u32(3, NF_NAT_RANGE_PROTO_SPECIFIED);
            }
            // NFTA_TPROXY_FAMILY 1, _REG_PORT 3.
            Expr::Tproxy { nfproto } => {
                w.u32(1, *nfproto);
                w.u32(3, NFT_REG_1);
            }
            // NFTA_NAT_TYPE 1, _FAMILY 2, _REG_ADDR_MIN 3, _REG_ADDR_MAX 4, _FLAGS 7: as the
            // kernel dumps it back (nft sends the minimum only; the kernel fills in the rest).
            Expr::Snat { nfproto } => {
                w.u32(1, NFT_NAT_SNAT);
                w.u32(2, *nfproto);
                w.u32(3, NFT_REG_1);
                w.u32(4, NFT_REG_1);
                w.u32(7, NF_NAT_RANGE_MAP_IPS);
            }
            Expr::Counter => {}
            Expr::Foreign(f) => {
                for (kind, v) in &f.attrs {
                    w.bytes(*kind, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, NlaBuffer, Parseable};
    use netlink_packet_netfilter::nftables::{ExpressionAttribute, ListAttribute};

    fn round_trip(e: &Expr) -> Expr {
        let attr = e.encode(&|_| 7);
        let mut buf = vec![0u8; attr.buffer_len()];
        attr.emit(&mut buf);
        let parsed =
            ListAttribute::<ExpressionAttribute>::parse(&NlaBuffer::new(&buf[..])).unwrap();
        decode(&parsed)
    }

    /// Every shape of every expression we write, and a foreign one.
    fn every() -> Vec<Expr> {
        let mut all: Vec<Expr> = [
            MetaKey::NfProto,
            MetaKey::L4Proto,
            MetaKey::IifName,
            MetaKey::OifName,
            MetaKey::SkUid,
            MetaKey::SkGid,
            MetaKey::Mark,
            MetaKey::NfTrace,
        ]
        .into_iter()
        .flat_map(|k| [Expr::Meta(k), Expr::MetaSet(k)])
        .collect();
        all.extend([
            Expr::Payload {
                base: Base::Network,
                offset: 16,
                len: 4,
            },
            Expr::Payload {
                base: Base::Transport,
                offset: 2,
                len: 2,
            },
            Expr::Cmp {
                eq: true,
                data: vec![1, 2, 3, 4, 5],
            },
            Expr::Cmp {
                eq: false,
                data: vec![1, 2, 3],
            },
            Expr::Mask(vec![255; 16]),
            Expr::Mask(vec![255, 255, 0, 0]),
            Expr::Bits {
                mask: vec![0, 0xf0, 0xff, 0xff],
                xor: vec![0x11, 0x01, 0, 0],
            },
            Expr::Lookup {
                set: "ports".into(),
                invert: false,
            },
            Expr::Lookup {
                set: "ports".into(),
                invert: true,
            },
            Expr::Ct(CtKey::State),
            Expr::Ct(CtKey::Mark),
            Expr::CtSet(CtKey::Mark),
            Expr::CtSet(CtKey::Zone),
            Expr::Imm(vec![0x3a, 0x98]),
            Expr::Redir,
            Expr::Tproxy { nfproto: 2 },
            Expr::Tproxy { nfproto: 10 },
            Expr::Snat { nfproto: 2 },
            Expr::Snat { nfproto: 10 },
            Expr::Counter,
            Expr::Verdict(Verdict::Accept),
            Expr::Verdict(Verdict::Drop),
            Expr::Verdict(Verdict::Return),
            Expr::Verdict(Verdict::Jump("x".into())),
            Expr::Verdict(Verdict::Jump("nat_ip_istio_output".into())),
            Expr::Foreign(Foreign {
                name: "limit".into(),
                attrs: vec![(1, vec![0, 0, 0, 0, 0, 0, 0, 10]), (2, vec![1, 2, 3])],
            }),
        ]);
        all
    }

    /// The writer gives the typed path's bytes, attribute for attribute.
    #[test]
    fn the_writer_emits_the_typed_encoding() {
        for e in &every() {
            let typed = e.encode(&|_| 7);
            let mut want = vec![0u8; typed.buffer_len()];
            typed.emit(&mut want);
            let mut got = Vec::new();
            e.emit(&|_| 7, &mut NlaWriter::new(&mut got));
            assert_eq!(got, want, "{e:?}");
        }
    }

    #[test]
    fn every_expression_we_write_decodes_to_itself() {
        for e in &every() {
            assert_eq!(&round_trip(e), e);
        }
    }
}
