//! The nf_tables expressions our rules use, built on `nftnl-sys` through nftnl's public
//! `Expression` trait. nftnl has no redir, tproxy or ct-zone expression and no inverted lookup,
//! so all of them are here in one small enum; every expression uses register 1.

use std::ffi::{c_void, CString};
use std::ptr::NonNull;

use nftnl::expr::Expression;
use nftnl::Rule;
use nftnl_sys::{self as sys, libc};

/// Where a payload load reads from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    Network,
    Transport,
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
    fn raw(self) -> u32 {
        (match self {
            MetaKey::NfProto => libc::NFT_META_NFPROTO,
            MetaKey::L4Proto => libc::NFT_META_L4PROTO,
            MetaKey::IifName => libc::NFT_META_IIFNAME,
            MetaKey::OifName => libc::NFT_META_OIFNAME,
            MetaKey::SkUid => libc::NFT_META_SKUID,
            MetaKey::SkGid => libc::NFT_META_SKGID,
            MetaKey::Mark => libc::NFT_META_MARK,
        }) as u32
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
    fn raw(self) -> u32 {
        (match self {
            CtKey::State => libc::NFT_CT_STATE,
            CtKey::Mark => libc::NFT_CT_MARK,
            CtKey::Zone => libc::NFT_CT_ZONE,
        }) as u32
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
    /// Look reg 1 up in a named set.
    Lookup {
        set: CString,
        set_id: u32,
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(CString),
}

const REG: u32 = libc::NFT_REG_1 as u32;
/// `NF_NAT_RANGE_PROTO_SPECIFIED` (linux/netfilter/nf_nat.h).
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

fn alloc(name: &std::ffi::CStr) -> NonNull<sys::nftnl_expr> {
    // Allocation of a few bytes failing means the process is out of memory; nftnl aborts too.
    NonNull::new(unsafe { sys::nftnl_expr_alloc(name.as_ptr()) })
        .unwrap_or_else(|| std::process::abort())
}

unsafe fn set_u32(e: NonNull<sys::nftnl_expr>, attr: u32, v: u32) {
    unsafe { sys::nftnl_expr_set_u32(e.as_ptr(), attr as u16, v) };
}

unsafe fn set_data(e: NonNull<sys::nftnl_expr>, attr: u32, data: &[u8]) {
    unsafe {
        sys::nftnl_expr_set(
            e.as_ptr(),
            attr as u16,
            data.as_ptr() as *const c_void,
            data.len() as u32,
        )
    };
}

impl Expression for Expr {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        unsafe {
            match self {
                Expr::Meta(k) => {
                    let e = alloc(c"meta");
                    set_u32(e, sys::NFTNL_EXPR_META_KEY, k.raw());
                    set_u32(e, sys::NFTNL_EXPR_META_DREG, REG);
                    e
                }
                Expr::MetaSet(k) => {
                    let e = alloc(c"meta");
                    set_u32(e, sys::NFTNL_EXPR_META_KEY, k.raw());
                    set_u32(e, sys::NFTNL_EXPR_META_SREG, REG);
                    e
                }
                Expr::Payload { base, offset, len } => {
                    let e = alloc(c"payload");
                    let b = match base {
                        Base::Network => libc::NFT_PAYLOAD_NETWORK_HEADER,
                        Base::Transport => libc::NFT_PAYLOAD_TRANSPORT_HEADER,
                    } as u32;
                    set_u32(e, sys::NFTNL_EXPR_PAYLOAD_BASE, b);
                    set_u32(e, sys::NFTNL_EXPR_PAYLOAD_OFFSET, *offset);
                    set_u32(e, sys::NFTNL_EXPR_PAYLOAD_LEN, *len);
                    set_u32(e, sys::NFTNL_EXPR_PAYLOAD_DREG, REG);
                    e
                }
                Expr::Cmp { eq, data } => {
                    let e = alloc(c"cmp");
                    set_u32(e, sys::NFTNL_EXPR_CMP_SREG, REG);
                    let op = if *eq {
                        libc::NFT_CMP_EQ
                    } else {
                        libc::NFT_CMP_NEQ
                    } as u32;
                    set_u32(e, sys::NFTNL_EXPR_CMP_OP, op);
                    set_data(e, sys::NFTNL_EXPR_CMP_DATA, data);
                    e
                }
                Expr::Mask(mask) => {
                    let e = alloc(c"bitwise");
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_SREG, REG);
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_DREG, REG);
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32);
                    set_data(e, sys::NFTNL_EXPR_BITWISE_MASK, mask);
                    set_data(e, sys::NFTNL_EXPR_BITWISE_XOR, &vec![0u8; mask.len()]);
                    e
                }
                Expr::Lookup {
                    set,
                    set_id,
                    invert,
                } => {
                    let e = alloc(c"lookup");
                    set_u32(e, sys::NFTNL_EXPR_LOOKUP_SREG, REG);
                    sys::nftnl_expr_set_str(
                        e.as_ptr(),
                        sys::NFTNL_EXPR_LOOKUP_SET as u16,
                        set.as_ptr(),
                    );
                    set_u32(e, sys::NFTNL_EXPR_LOOKUP_SET_ID, *set_id);
                    let flags = if *invert {
                        libc::NFT_LOOKUP_F_INV as u32
                    } else {
                        0
                    };
                    set_u32(e, sys::NFTNL_EXPR_LOOKUP_FLAGS, flags);
                    e
                }
                Expr::Ct(k) => {
                    let e = alloc(c"ct");
                    set_u32(e, sys::NFTNL_EXPR_CT_KEY, k.raw());
                    set_u32(e, sys::NFTNL_EXPR_CT_DREG, REG);
                    e
                }
                Expr::CtSet(k) => {
                    let e = alloc(c"ct");
                    set_u32(e, sys::NFTNL_EXPR_CT_KEY, k.raw());
                    set_u32(e, sys::NFTNL_EXPR_CT_SREG, REG);
                    e
                }
                Expr::Imm(data) => {
                    let e = alloc(c"immediate");
                    set_u32(e, sys::NFTNL_EXPR_IMM_DREG, REG);
                    set_data(e, sys::NFTNL_EXPR_IMM_DATA, data);
                    e
                }
                Expr::Redir => {
                    let e = alloc(c"redir");
                    // As the kernel dumps it back: min = max, and "port given" flag.
                    set_u32(e, sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN, REG);
                    set_u32(e, sys::NFTNL_EXPR_REDIR_REG_PROTO_MAX, REG);
                    set_u32(e, sys::NFTNL_EXPR_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
                    e
                }
                Expr::Tproxy { nfproto } => {
                    let e = alloc(c"tproxy");
                    set_u32(e, sys::NFTNL_EXPR_TPROXY_FAMILY, *nfproto);
                    set_u32(e, sys::NFTNL_EXPR_TPROXY_REG_PORT, REG);
                    e
                }
                Expr::Counter => alloc(c"counter"),
                Expr::Verdict(v) => {
                    let e = alloc(c"immediate");
                    set_u32(e, sys::NFTNL_EXPR_IMM_DREG, libc::NFT_REG_VERDICT as u32);
                    let code = match v {
                        Verdict::Accept => libc::NF_ACCEPT,
                        Verdict::Drop => libc::NF_DROP,
                        Verdict::Return => libc::NFT_RETURN,
                        Verdict::Jump(_) => libc::NFT_JUMP,
                    };
                    set_u32(e, sys::NFTNL_EXPR_IMM_VERDICT, code as u32);
                    if let Verdict::Jump(chain) = v {
                        sys::nftnl_expr_set_str(
                            e.as_ptr(),
                            sys::NFTNL_EXPR_IMM_CHAIN as u16,
                            chain.as_ptr(),
                        );
                    }
                    e
                }
            }
        }
    }
}
