//! The expressions `netlink-packet-netfilter` does not model (ct, redir, tproxy, nat), as our own
//! attribute types on `netlink-packet-core`'s `Nla` and `Parseable` traits. They travel in the
//! crate's `Expressions::Other` as `DefaultNla`s. Values are network byte order, as the kernel
//! reads them (`linux/netfilter/nf_tables.h`).

use netlink_packet_core::{
    emit_u32_be, parse_u32_be, DecodeError, DefaultNla, Emitable, Nla, NlaBuffer, Parseable,
};

// enum nft_ct_keys
pub(super) const NFT_CT_STATE: u32 = 0;
pub(super) const NFT_CT_MARK: u32 = 3;
pub(super) const NFT_CT_ZONE: u32 = 17;

// enum nft_ct_attributes
const NFTA_CT_DREG: u16 = 1;
const NFTA_CT_KEY: u16 = 2;
const NFTA_CT_SREG: u16 = 4;
// enum nft_redir_attributes
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;
const NFTA_REDIR_REG_PROTO_MAX: u16 = 2;
const NFTA_REDIR_FLAGS: u16 = 3;
// enum nft_nat_attributes
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
const NFTA_NAT_FLAGS: u16 = 7;
// enum nft_tproxy_attributes
const NFTA_TPROXY_FAMILY: u16 = 1;
const NFTA_TPROXY_REG_PORT: u16 = 3;

/// Declares a u32-valued attribute enum with its kinds, and its `Nla` and `Parseable` impls.
macro_rules! u32_attrs {
    ($name:ident { $($variant:ident = $kind:expr),+ $(,)? }) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) enum $name {
            $($variant(u32),)+
            /// An attribute of another kind: keeps the expression out of our shapes.
            Unknown(u16),
        }

        impl Nla for $name {
            fn value_len(&self) -> usize {
                4
            }
            fn kind(&self) -> u16 {
                match self {
                    $($name::$variant(_) => $kind,)+
                    $name::Unknown(k) => *k,
                }
            }
            fn emit_value(&self, buffer: &mut [u8]) {
                let v = match self {
                    $($name::$variant(v) => *v,)+
                    $name::Unknown(_) => 0,
                };
                // The buffer is value_len() long: emitting a u32 cannot fail.
                let _ = emit_u32_be(buffer, v);
            }
        }

        impl<T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&T>> for $name {
            fn parse(buf: &NlaBuffer<&T>) -> Result<Self, DecodeError> {
                let kind = buf.kind();
                $(if kind == $kind {
                    return Ok($name::$variant(parse_u32_be(buf.value())?));
                })+
                Ok($name::Unknown(kind))
            }
        }
    };
}

u32_attrs!(CtAttr {
    Key = NFTA_CT_KEY,
    Dreg = NFTA_CT_DREG,
    Sreg = NFTA_CT_SREG,
});

u32_attrs!(RedirAttr {
    RegProtoMin = NFTA_REDIR_REG_PROTO_MIN,
    RegProtoMax = NFTA_REDIR_REG_PROTO_MAX,
    Flags = NFTA_REDIR_FLAGS,
});

u32_attrs!(NatAttr {
    Type = NFTA_NAT_TYPE,
    Family = NFTA_NAT_FAMILY,
    RegAddrMin = NFTA_NAT_REG_ADDR_MIN,
    RegAddrMax = NFTA_NAT_REG_ADDR_MAX,
    Flags = NFTA_NAT_FLAGS,
});

u32_attrs!(TproxyAttr {
    Family = NFTA_TPROXY_FAMILY,
    RegPort = NFTA_TPROXY_REG_PORT,
});

/// Any attribute as the crate's `DefaultNla` (kind with its flags, and value bytes).
pub(super) fn to_default<A: Nla>(a: &A) -> DefaultNla {
    let mut v = vec![0u8; a.value_len()];
    a.emit_value(&mut v);
    let mut kind = a.kind();
    if a.is_nested() {
        kind |= netlink_packet_core::NLA_F_NESTED;
    }
    DefaultNla::new(kind, v)
}

/// The value bytes of a `DefaultNla` (the crate keeps them private; emitting gives them).
pub(super) fn value(d: &DefaultNla) -> Vec<u8> {
    let mut buf = vec![0u8; d.buffer_len()];
    d.emit(&mut buf);
    // NLA header: 2 bytes length, 2 bytes type.
    buf.truncate(4 + d.value_len());
    buf.split_off(4)
}

/// Parse every attribute of an `Other` expression as `A`, sorted by kind (the kernel dumps
/// them in its own order); `None` if one is malformed.
pub(super) fn parse_all<A>(attrs: &[DefaultNla]) -> Option<Vec<A>>
where
    A: Nla + for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    let mut out = attrs
        .iter()
        .map(|d| {
            let mut buf = vec![0u8; d.buffer_len()];
            d.emit(&mut buf);
            A::parse(&NlaBuffer::new_checked(&buf[..]).ok()?).ok()
        })
        .collect::<Option<Vec<A>>>()?;
    out.sort_by_key(|a| a.kind());
    Some(out)
}
