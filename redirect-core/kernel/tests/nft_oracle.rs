//! libnftnl is the oracle of our nf_tables encoder: for every message we send (batch begin and
//! end, table create/add/delete, set, elements, set flush and delete, chain, chain flush and
//! delete, rule with every expression kind), libnftnl, through the `nftnl` crate and
//! `nftnl-sys`, builds the message for the same object, and the bytes must be identical.
//!
//! Normalised before comparing, and nothing else: the netlink header's sequence number (bytes
//! 8..12) and port id (12..16). Both are per-socket bookkeeping: libnftnl's batches always
//! count from 1, ours continue a socket's count.
//!
//! Not covered by libnftnl: the begin message of `apply`'s batches carries `NFNL_BATCH_GENID`,
//! which `nftnl_batch_begin` cannot write (nft adds it by hand). Here every batch is encoded
//! without it, and `generation_bound_begin_carries_the_genid` checks that attribute's layout.
//!
//! Inputs: the benchmark configurations (`redirect-benches`), and random `CaptureConfig`s
//! (proptest), each encoded as a create batch and as in-place updates from another config.

use std::ffi::{c_void, CString};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ptr::NonNull;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use nftnl::expr::Expression;
use nftnl::{Chain, ChainType, Hook as NftHook, MsgType, NlMsg, Policy, ProtoFamily, Rule, Table};
use nftnl_sys::{self as sys, libc};
use proptest::prelude::*;

use redirect_kernel::nft::{
    self, Base, ChainKind, CtKey, Encoded, Expr, Features, Label, MetaKey, NftSet, NftTable,
    SetElem, Verdict, XtFound,
};
use redirect_model::Family;
use redirect_model::Hook;
use redirect_model::Ruleset;
use redirect_model::{CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection};
use redirect_testkit::plan_with;

// ---------------------------------------------------------------------------------------------
// libnftnl's side: each labelled message, built by libnftnl.

/// One libnftnl expression for one of ours: the nftnl crate's `Expression` trait over
/// `nftnl-sys`, as the libnftnl backend wrote them.
struct Oracle<'a> {
    expr: &'a Expr,
    set_id: u32,
}

fn alloc(name: &std::ffi::CStr) -> NonNull<sys::nftnl_expr> {
    NonNull::new(unsafe { sys::nftnl_expr_alloc(name.as_ptr()) }).expect("nftnl_expr_alloc")
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

fn meta_key(k: MetaKey) -> u32 {
    (match k {
        MetaKey::NfProto => libc::NFT_META_NFPROTO,
        MetaKey::L4Proto => libc::NFT_META_L4PROTO,
        MetaKey::IifName => libc::NFT_META_IIFNAME,
        MetaKey::OifName => libc::NFT_META_OIFNAME,
        MetaKey::SkUid => libc::NFT_META_SKUID,
        MetaKey::SkGid => libc::NFT_META_SKGID,
        MetaKey::Mark => libc::NFT_META_MARK,
        MetaKey::NfTrace => libc::NFT_META_NFTRACE,
    }) as u32
}

fn ct_key(k: CtKey) -> u32 {
    (match k {
        CtKey::State => libc::NFT_CT_STATE,
        CtKey::Mark => libc::NFT_CT_MARK,
        CtKey::Zone => libc::NFT_CT_ZONE,
    }) as u32
}

const REG: u32 = libc::NFT_REG_1 as u32;

impl Expression for Oracle<'_> {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        unsafe {
            match self.expr {
                Expr::Meta(k) => {
                    let e = alloc(c"meta");
                    set_u32(e, sys::NFTNL_EXPR_META_KEY, meta_key(*k));
                    set_u32(e, sys::NFTNL_EXPR_META_DREG, REG);
                    e
                }
                Expr::MetaSet(k) => {
                    let e = alloc(c"meta");
                    set_u32(e, sys::NFTNL_EXPR_META_KEY, meta_key(*k));
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
                Expr::Bits { mask, xor } => {
                    let e = alloc(c"bitwise");
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_SREG, REG);
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_DREG, REG);
                    set_u32(e, sys::NFTNL_EXPR_BITWISE_LEN, mask.len() as u32);
                    set_data(e, sys::NFTNL_EXPR_BITWISE_MASK, mask);
                    set_data(e, sys::NFTNL_EXPR_BITWISE_XOR, xor);
                    e
                }
                Expr::Lookup { set, invert } => {
                    let e = alloc(c"lookup");
                    let name = CString::new(set.as_str()).unwrap();
                    set_u32(e, sys::NFTNL_EXPR_LOOKUP_SREG, REG);
                    sys::nftnl_expr_set_str(
                        e.as_ptr(),
                        sys::NFTNL_EXPR_LOOKUP_SET as u16,
                        name.as_ptr(),
                    );
                    set_u32(e, sys::NFTNL_EXPR_LOOKUP_SET_ID, self.set_id);
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
                    set_u32(e, sys::NFTNL_EXPR_CT_KEY, ct_key(*k));
                    set_u32(e, sys::NFTNL_EXPR_CT_DREG, REG);
                    e
                }
                Expr::CtSet(k) => {
                    let e = alloc(c"ct");
                    set_u32(e, sys::NFTNL_EXPR_CT_KEY, ct_key(*k));
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
                    set_u32(e, sys::NFTNL_EXPR_REDIR_REG_PROTO_MIN, REG);
                    set_u32(e, sys::NFTNL_EXPR_REDIR_REG_PROTO_MAX, REG);
                    // NF_NAT_RANGE_PROTO_SPECIFIED
                    set_u32(e, sys::NFTNL_EXPR_REDIR_FLAGS, 2);
                    e
                }
                Expr::Tproxy { nfproto } => {
                    let e = alloc(c"tproxy");
                    set_u32(e, sys::NFTNL_EXPR_TPROXY_FAMILY, *nfproto);
                    set_u32(e, sys::NFTNL_EXPR_TPROXY_REG_PORT, REG);
                    e
                }
                Expr::Snat { nfproto } => {
                    let e = alloc(c"nat");
                    set_u32(e, sys::NFTNL_EXPR_NAT_TYPE, libc::NFT_NAT_SNAT as u32);
                    set_u32(e, sys::NFTNL_EXPR_NAT_FAMILY, *nfproto);
                    set_u32(e, sys::NFTNL_EXPR_NAT_REG_ADDR_MIN, REG);
                    set_u32(e, sys::NFTNL_EXPR_NAT_REG_ADDR_MAX, REG);
                    // NF_NAT_RANGE_MAP_IPS, as the kernel dumps it back
                    set_u32(e, sys::NFTNL_EXPR_NAT_FLAGS, 1);
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
                        let chain = CString::new(chain.as_str()).unwrap();
                        sys::nftnl_expr_set_str(
                            e.as_ptr(),
                            sys::NFTNL_EXPR_IMM_CHAIN as u16,
                            chain.as_ptr(),
                        );
                    }
                    e
                }
                Expr::Foreign(f) => panic!("we never send a foreign expression: {f:?}"),
            }
        }
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// A message libnftnl builds into a buffer of `nft_nlmsg_maxsize`: its bytes.
fn built(write: impl FnOnce(*mut libc::c_char)) -> Vec<u8> {
    let mut buf = vec![0u8; nftnl::nft_nlmsg_maxsize() as usize];
    write(buf.as_mut_ptr() as *mut libc::c_char);
    let len = u32::from_ne_bytes(buf[..4].try_into().unwrap()) as usize;
    buf.truncate(len);
    buf
}

fn hdr(buf: *mut libc::c_char, ty: i32, flags: i32) -> *mut libc::nlmsghdr {
    unsafe {
        sys::nftnl_nlmsg_build_hdr(buf, ty as u16, libc::NFPROTO_INET as u16, flags as u16, 0)
    }
}

/// A libnftnl set object naming a table of ours and a set.
fn set_obj(table: &str, name: &str) -> NonNull<sys::nftnl_set> {
    let s = NonNull::new(unsafe { sys::nftnl_set_alloc() }).unwrap();
    let (table, name) = (cstr(table), cstr(name));
    unsafe {
        sys::nftnl_set_set_u32(
            s.as_ptr(),
            sys::NFTNL_SET_FAMILY as u16,
            libc::NFPROTO_INET as u32,
        );
        sys::nftnl_set_set_str(s.as_ptr(), sys::NFTNL_SET_TABLE as u16, table.as_ptr());
        sys::nftnl_set_set_str(s.as_ptr(), sys::NFTNL_SET_NAME as u16, name.as_ptr());
    }
    s
}

fn set_definition(table: &str, set: &NftSet) -> Vec<u8> {
    let s = set_obj(table, &set.name);
    unsafe {
        let p = s.as_ptr();
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_ID as u16, set.id);
        let flags = if set.interval {
            libc::NFT_SET_INTERVAL as u32
        } else {
            0
        };
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FLAGS as u16, flags);
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_TYPE as u16, set.key_type);
        sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_LEN as u16, set.key_len);
        if let Some(n) = set.size {
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_DESC_SIZE as u16, n);
        }
    }
    let out = built(|buf| unsafe {
        let h = hdr(
            buf,
            libc::NFT_MSG_NEWSET,
            libc::NLM_F_CREATE | libc::NLM_F_ACK,
        );
        sys::nftnl_set_nlmsg_build_payload(h, s.as_ptr());
    });
    unsafe { sys::nftnl_set_free(s.as_ptr()) };
    out
}

/// Elements as libnftnl itself writes them: one `nftnl_set_elem` per key; added, or
/// (`delete`) removed. A set id of 0 is a committed set, named only (as `nft add element`).
fn set_elements(table: &str, set: &NftSet, elems: &[SetElem], delete: bool) -> Vec<u8> {
    let s = set_obj(table, &set.name);
    unsafe {
        if set.id != 0 {
            sys::nftnl_set_set_u32(s.as_ptr(), sys::NFTNL_SET_ID as u16, set.id);
        }
        for e in elems {
            let el = sys::nftnl_set_elem_alloc();
            assert!(!el.is_null());
            sys::nftnl_set_elem_set(
                el,
                sys::NFTNL_SET_ELEM_KEY as u16,
                e.key.as_ptr() as *const c_void,
                e.key.len() as u32,
            );
            if e.interval_end {
                sys::nftnl_set_elem_set_u32(
                    el,
                    sys::NFTNL_SET_ELEM_FLAGS as u16,
                    libc::NFT_SET_ELEM_INTERVAL_END as u32,
                );
            }
            sys::nftnl_set_elem_add(s.as_ptr(), el);
        }
    }
    let (ty, flags) = match delete {
        false => (
            libc::NFT_MSG_NEWSETELEM,
            libc::NLM_F_CREATE | libc::NLM_F_ACK,
        ),
        true => (libc::NFT_MSG_DELSETELEM, libc::NLM_F_ACK),
    };
    let out = built(|buf| unsafe {
        let h = hdr(buf, ty, flags);
        sys::nftnl_set_elems_nlmsg_build_payload(h, s.as_ptr());
    });
    unsafe { sys::nftnl_set_free(s.as_ptr()) };
    out
}

fn set_flush_or_delete(table: &str, name: &str, delete: bool) -> Vec<u8> {
    let s = set_obj(table, name);
    let out = built(|buf| unsafe {
        if delete {
            let h = hdr(buf, libc::NFT_MSG_DELSET, libc::NLM_F_ACK);
            sys::nftnl_set_nlmsg_build_payload(h, s.as_ptr());
        } else {
            let h = hdr(buf, libc::NFT_MSG_DELSETELEM, libc::NLM_F_ACK);
            sys::nftnl_set_elems_nlmsg_build_payload(h, s.as_ptr());
        }
    });
    unsafe { sys::nftnl_set_free(s.as_ptr()) };
    out
}

fn table_msg(ty: i32, flags: i32, name: &str, with_flags: bool) -> Vec<u8> {
    table_msg_flags(ty, flags, name, with_flags.then_some(0))
}

/// A table message with `NFTNL_TABLE_FLAGS` set to `value` when given.
fn table_msg_flags(ty: i32, flags: i32, name: &str, value: Option<u32>) -> Vec<u8> {
    let name = cstr(name);
    built(|buf| unsafe {
        let t = sys::nftnl_table_alloc();
        assert!(!t.is_null());
        sys::nftnl_table_set_str(t, sys::NFTNL_TABLE_NAME as u16, name.as_ptr());
        if let Some(v) = value {
            sys::nftnl_table_set_u32(t, sys::NFTNL_TABLE_FLAGS as u16, v);
        }
        let h = hdr(buf, ty, flags);
        sys::nftnl_table_nlmsg_build_payload(h, t);
        sys::nftnl_table_free(t);
    })
}

/// A chain through the nftnl crate, as the libnftnl backend built it.
fn chain_msg(t: &NftTable, ci: usize, msg: MsgType) -> Vec<u8> {
    let table = Table::new(cstr(&t.name), ProtoFamily::Inet);
    let c = &t.chains[ci];
    let mut chain = Chain::new(cstr(&c.name), &table);
    if let Some(base) = c.base {
        let hook = match base.hook {
            Hook::Prerouting => NftHook::PreRouting,
            Hook::Output => NftHook::Out,
            Hook::Postrouting => NftHook::PostRouting,
        };
        chain.set_hook(hook, base.priority);
        chain.set_type(match base.kind {
            ChainKind::Filter => ChainType::Filter,
            ChainKind::Route => ChainType::Route,
            ChainKind::Nat => ChainType::Nat,
        });
        chain.set_policy(Policy::Accept);
    }
    built(|buf| unsafe { chain.write(buf as *mut c_void, 0, msg) })
}

fn chain_delete(table: &str, name: &str) -> Vec<u8> {
    let table = Table::new(cstr(table), ProtoFamily::Inet);
    let chain = Chain::new(cstr(name), &table);
    built(|buf| unsafe { chain.write(buf as *mut c_void, 0, MsgType::Del) })
}

/// `flush chain`: a rule delete with only the table and chain.
fn chain_flush(table: &str, name: &str) -> Vec<u8> {
    let table = Table::new(cstr(table), ProtoFamily::Inet);
    let chain = Chain::new(cstr(name), &table);
    let rule = Rule::new(&chain);
    built(|buf| unsafe { rule.write(buf as *mut c_void, 0, MsgType::Del) })
}

fn rule_msg(t: &NftTable, ci: usize, ri: usize) -> Vec<u8> {
    let table = Table::new(cstr(&t.name), ProtoFamily::Inet);
    let c = &t.chains[ci];
    let chain = Chain::new(cstr(&c.name), &table);
    let mut rule = Rule::new(&chain);
    for e in &c.rules[ri] {
        let set_id = match e {
            Expr::Lookup { set, .. } => t.sets.iter().find(|s| &s.name == set).map_or(0, |s| s.id),
            _ => 0,
        };
        rule.add_expr(&Oracle { expr: e, set_id });
    }
    built(|buf| unsafe { rule.write(buf as *mut c_void, 0, MsgType::Add) })
}

const ELEMS_PER_MSG: usize = 512;

/// libnftnl's bytes for the message a label names, in table `t`; `acked` tells whether begin
/// and end ask for an answer (kernels from 6.10, as the nftnl crate decides).
fn oracle(label: &Label, t: &NftTable, acked: bool) -> Vec<u8> {
    match label {
        Label::Begin | Label::End => built(|buf| unsafe {
            let h = if *label == Label::Begin {
                sys::nftnl_batch_begin(buf, 0)
            } else {
                sys::nftnl_batch_end(buf, 0)
            };
            if acked {
                (*h).nlmsg_flags |= libc::NLM_F_ACK as u16;
            }
        }),
        Label::CreateTable => table_msg(
            libc::NFT_MSG_NEWTABLE,
            libc::NLM_F_CREATE | libc::NLM_F_EXCL | libc::NLM_F_ACK,
            &t.name,
            true,
        ),
        Label::AddTable => table_msg(libc::NFT_MSG_NEWTABLE, libc::NLM_F_ACK, &t.name, false),
        Label::ActivateTable => table_msg(libc::NFT_MSG_NEWTABLE, libc::NLM_F_ACK, &t.name, true),
        Label::DeleteTable(name) => table_msg(libc::NFT_MSG_DELTABLE, libc::NLM_F_ACK, name, false),
        Label::AddSet(i) => set_definition(&t.name, &t.sets[*i]),
        Label::AddElements { set, chunk } | Label::DeleteElements { set, chunk } => {
            let s = &t.sets[*set];
            let elems = s.elements.chunks(ELEMS_PER_MSG).nth(*chunk).unwrap();
            let delete = matches!(label, Label::DeleteElements { .. });
            set_elements(&t.name, s, elems, delete)
        }
        Label::FlushSet(name) => set_flush_or_delete(&t.name, name, false),
        Label::DeleteSet(name) => set_flush_or_delete(&t.name, name, true),
        Label::AddChain(i) => chain_msg(t, *i, MsgType::Add),
        Label::FlushChain(name) => chain_flush(&t.name, name),
        Label::DeleteChain(name) => chain_delete(&t.name, name),
        Label::AddRule { chain, rule } => rule_msg(t, *chain, *rule),
        Label::XtDeleteRule {
            nfproto,
            table,
            chain,
            handle,
        } => in_xt_chain(*nfproto, table, chain, |chain| {
            let mut rule = Rule::new(chain);
            rule.set_handle(*handle);
            built(|buf| unsafe { rule.write(buf as *mut c_void, 0, MsgType::Del) })
        }),
        Label::XtFlushChain {
            nfproto,
            table,
            chain,
        } => in_xt_chain(*nfproto, table, chain, |chain| {
            let rule = Rule::new(chain);
            built(|buf| unsafe { rule.write(buf as *mut c_void, 0, MsgType::Del) })
        }),
        Label::XtDeleteChain {
            nfproto,
            table,
            chain,
        } => in_xt_chain(*nfproto, table, chain, |chain| {
            built(|buf| unsafe { chain.write(buf as *mut c_void, 0, MsgType::Del) })
        }),
    }
}

/// libnftnl's message `f` builds for the chain `chain` of iptables-nft's table `table`.
fn in_xt_chain(
    nfproto: u8,
    table: &str,
    chain: &str,
    f: impl FnOnce(&Chain) -> Vec<u8>,
) -> Vec<u8> {
    let table = Table::new(cstr(table), family(nfproto));
    let chain = Chain::new(cstr(chain), &table);
    f(&chain)
}

/// iptables-nft's families.
fn family(nfproto: u8) -> ProtoFamily {
    match nfproto {
        2 => ProtoFamily::Ipv4,
        10 => ProtoFamily::Ipv6,
        other => panic!("not an iptables family: {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Our side, and the comparison.

/// The messages of an encoded batch, in order.
fn split(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push(bytes[at..at + len].to_vec());
        at += (len + 3) & !3;
    }
    out
}

/// Sequence number and port id zeroed: the only fields allowed to differ.
fn normalised(mut m: Vec<u8>) -> Vec<u8> {
    m[8..16].fill(0);
    m
}

/// Compare every message of a batch with libnftnl's; returns how many were compared.
fn check(batch: &Encoded, t: &NftTable, what: &str) -> usize {
    let ours = split(batch.bytes());
    // Begin and end carry a label only where they are answered.
    let acked = batch
        .labels()
        .first()
        .is_some_and(|(_, l)| *l == Label::Begin);
    let mut labels: Vec<Label> = batch.labels().iter().map(|(_, l)| l.clone()).collect();
    if !acked {
        labels.insert(0, Label::Begin);
        labels.push(Label::End);
    }
    assert_eq!(ours.len(), labels.len(), "{what}: messages and labels");
    for (i, (mine, label)) in ours.into_iter().zip(&labels).enumerate() {
        let theirs = normalised(oracle(label, t, acked));
        let mine = normalised(mine);
        if mine != theirs {
            let at = (0..mine.len().max(theirs.len()))
                .find(|&k| mine.get(k) != theirs.get(k))
                .unwrap_or(0);
            let window =
                |m: &[u8]| m[at.saturating_sub(16).min(m.len())..(at + 16).min(m.len())].to_vec();
            panic!(
                "{what}: message {i} ({label:?}) differs from libnftnl's at byte {at} of {}/{}\n ours:     {:02x?}\n libnftnl: {:02x?}",
                mine.len(),
                theirs.len(),
                window(&mine),
                window(&theirs)
            );
        }
    }
    labels.len()
}

/// Numeric groups only: the oracle needs no group database.
struct NoGroups;
impl redirect_model::GroupResolver for NoGroups {
    fn gid_of(&self, _name: &str) -> Option<u32> {
        None
    }
}

fn lowered(cfg: &CaptureConfig) -> Option<(Ruleset, NftTable)> {
    let rs = plan_with(cfg, &NoGroups).ok()?;
    let t = nft::lower(&rs);
    Some((rs, t))
}

/// The create batch, and the in-place update from `from`'s table to `to`'s (and back).
fn check_pair(from: &CaptureConfig, to: &CaptureConfig, what: &str) -> usize {
    let (Some((_, a)), Some((_, b))) = (lowered(from), lowered(to)) else {
        return 0;
    };
    let mut n = check(
        &nft::testing::encode_create(&b, 1, Features::of_running_kernel()),
        &b,
        &format!("{what}: create"),
    );
    // The same table found dormant: the update that makes it active again.
    let mut dormant = nft::state_of(&b);
    dormant.flags = 1;
    let (batch, changes) = nft::testing::encode_update(&dormant, &b, Features::of_running_kernel())
        .expect("a dormant table changes");
    assert!(changes.table_flags, "{what}: {changes:?}");
    n += check(&batch, &b, &format!("{what}: activate"));
    for (x, y, dir) in [(&a, &b, "forward"), (&b, &a, "back")] {
        let current = nft::state_of(x);
        if let Some((batch, _)) =
            nft::testing::encode_update(&current, y, Features::of_running_kernel())
        {
            n += check(&batch, y, &format!("{what}: update {dir}"));
        }
    }
    n += check(
        &nft::testing::encode_replace(&b, 1, Features::of_running_kernel()),
        &b,
        &format!("{what}: replace"),
    );
    n += check(
        &nft::testing::encode_delete(1, Features::of_running_kernel()),
        &NftTable::default(),
        "delete",
    );
    n
}

#[test]
fn benchmark_configs_encode_exactly_as_libnftnl() {
    let configs = redirect_testkit::configs::configs();
    let mut compared = 0;
    for (name, cfg) in &configs {
        for (other, to) in &configs {
            compared += check_pair(to, cfg, &format!("{other} -> {name}"));
        }
    }
    eprintln!("{compared} messages compared with libnftnl");
    assert!(compared > 1000, "{compared}");
}

#[test]
fn counted_rules_encode_exactly_as_libnftnl() {
    // Counters on: each counted rule gets a `counter` before its statement, in a new table
    // and in an update from the same config without counters.
    use redirect_testkit::configs;
    let mut compared = 0;
    for (name, cfg) in [
        ("tproxy dns ipv6", configs::tproxy_dns_ipv6()),
        ("300 excluded CIDRs", configs::with_excluded(300)),
        ("sidecar", configs::sidecar_default()),
    ] {
        let counted = CaptureConfig {
            counters: true,
            ..cfg.clone()
        };
        let (rs, t) = lowered(&counted).expect("plans");
        assert!(!nft::counted_rules(&rs).is_empty(), "{name}");
        compared += check(
            &nft::testing::encode_create(&t, 1, Features::of_running_kernel()),
            &t,
            &format!("{name} with counters"),
        );
        compared += check_pair(&cfg, &counted, &format!("{name} -> with counters"));
    }
    assert!(compared > 100, "{compared}");
}

#[test]
fn ambient_rules_encode_exactly_as_libnftnl() {
    // Istio's in-pod rules for ambient: masked marks, a connection mark set bit by bit.
    use redirect_model::AmbientConfig;
    let d = AmbientConfig::default;
    let variants = [
        d(),
        AmbientConfig {
            dns_capture: false,
            ipv6: false,
            ..d()
        },
        AmbientConfig {
            bypass_inbound: true,
            virtual_interfaces: vec!["tap0".into()],
            ..d()
        },
        AmbientConfig {
            counters: true,
            virtual_interfaces: vec!["tap0".into()],
            ..d()
        },
    ];
    let mut compared = 0;
    for cfg in &variants {
        let t = nft::lower(&cfg.plan().unwrap());
        compared += check(
            &nft::testing::encode_create(&t, 1, Features::of_running_kernel()),
            &t,
            &format!("ambient {cfg:?}"),
        );
    }
    assert!(compared > 60, "{compared}");
}

#[test]
fn host_probe_table_and_its_members_encode_exactly_as_libnftnl() {
    // Ambient's probe SNAT on the host: nat POSTROUTING at 100, meta skuid, a lookup in a
    // plain address set, snat to an address per family; the sets' members added and removed.
    use redirect_model::table::HOST_PROBE_TABLE;
    use redirect_model::HostProbeConfig;
    let pods: Vec<std::net::IpAddr> = ["10.77.0.2", "10.77.0.3", "fd00::2"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let features = Features::of_running_kernel();
    let mut compared = 0;
    for cfg in [
        HostProbeConfig::new(0),
        HostProbeConfig {
            snat_v6: None,
            ..HostProbeConfig::new(4242)
        },
    ] {
        let pods: Vec<_> = pods
            .iter()
            .copied()
            .filter(|p| cfg.family_of(*p).is_ok())
            .collect();
        let t = nft::lower_named(&cfg.plan_with(&pods).unwrap(), HOST_PROBE_TABLE);
        assert!(t
            .chains
            .iter()
            .flat_map(|c| &c.rules)
            .flatten()
            .any(|e| matches!(e, Expr::Snat { .. })));
        compared += check(
            &nft::testing::encode_create(&t, 1, features),
            &t,
            "host create",
        );
        // The members alone, into sets committed before (named only, id 0).
        let mut members = NftTable::named(HOST_PROBE_TABLE);
        members.sets = t.sets.clone();
        members.sets.iter_mut().for_each(|s| s.id = 0);
        for delete in [false, true] {
            let batch = nft::testing::encode_elements(&members, delete, features);
            compared += check(&batch, &members, &format!("host members, delete {delete}"));
        }
        let empty = nft::state_of(&nft::lower_named(&cfg.plan().unwrap(), HOST_PROBE_TABLE));
        let (batch, _) =
            nft::testing::encode_update(&empty, &t, features).expect("elements differ");
        compared += check(&batch, &t, "host update");
    }
    assert!(compared > 20, "{compared}");
}

#[test]
fn trace_table_encodes_exactly_as_libnftnl() {
    // `redirect-validate trace`'s table: one filter chain at -350, one rule per flow shape
    // (TCP's SYN test, a source, a UID, IPv6) ending in `meta nftrace set 1`; created with and
    // without NFT_TABLE_F_OWNER.
    use redirect_model::L4;
    let features = Features::of_running_kernel();
    let flows = [
        nft::TraceMatch {
            outbound: true,
            proto: L4::Tcp,
            dst: "10.1.2.3:80".parse().unwrap(),
            src: None,
            uid: Some(1000),
        },
        nft::TraceMatch {
            outbound: false,
            proto: L4::Udp,
            dst: "[fd00::7]:53".parse().unwrap(),
            src: Some("fd00::9".parse().unwrap()),
            uid: None,
        },
        nft::TraceMatch {
            outbound: false,
            proto: L4::Tcp,
            dst: "10.77.0.2:8080".parse().unwrap(),
            src: Some("10.77.0.1".parse().unwrap()),
            uid: None,
        },
    ];
    let mut compared = 0;
    for m in &flows {
        let t = nft::trace_table("redirect_trace_42", m);
        assert!(t.chains[0].rules[0].contains(&Expr::MetaSet(nft::MetaKey::NfTrace)));
        compared += check(&nft::trace_batch(&t, false, 1, features), &t, "trace table");
        // Owned: the table message carries NFT_TABLE_F_OWNER (2); the rest is the same.
        let owned = split(nft::trace_batch(&t, true, 1, features).bytes());
        let plain = split(nft::trace_batch(&t, false, 1, features).bytes());
        let theirs = table_msg_flags(
            libc::NFT_MSG_NEWTABLE,
            libc::NLM_F_CREATE | libc::NLM_F_EXCL | libc::NLM_F_ACK,
            &t.name,
            Some(2),
        );
        assert_eq!(
            normalised(owned[1].clone()),
            normalised(theirs),
            "owned table"
        );
        assert_eq!(owned[2..], plain[2..], "the rest of the owned batch");
        compared += 1;
    }
    assert_eq!(
        compared,
        3 * 6,
        "begin, table, chain, rule, end, and the owned table"
    );
}

#[test]
fn removing_iptables_nft_chains_encodes_exactly_as_libnftnl() {
    // Istio's chains in iptables-nft's tables of both families: jumps by handle, the chains
    // flushed, then deleted.
    let s = |x: &str| x.to_string();
    let found = XtFound::of(
        vec![
            (Family::V4, s("nat"), s("PREROUTING"), 3),
            (Family::V4, s("nat"), s("OUTPUT"), 0x1_0000_0002),
            (Family::V6, s("mangle"), s("OUTPUT"), 7),
        ],
        vec![
            (Family::V4, s("nat"), s("ISTIO_INBOUND")),
            (Family::V4, s("nat"), s("ISTIO_OUTPUT")),
            (Family::V6, s("mangle"), s("ISTIO_DIVERT")),
        ],
    );
    for features in [
        Features::of_release("5.10.0"),
        Features::of_release("6.12.0"),
    ] {
        let batch = nft::testing::encode_xtables_removal(&found, features);
        let compared = check(&batch, &NftTable::default(), "iptables-nft removal");
        assert_eq!(
            compared,
            2 + 3 + 3 + 3,
            "begin, 3 rules, 3 flushes, 3 deletes, end"
        );
    }
}

#[test]
fn generation_bound_begin_carries_the_genid() {
    // Our apply binds its batch to the generation it read: begin carries NFNL_BATCH_GENID.
    let plain = split(
        nft::testing::encode_create(&NftTable::default(), 1, Features::of_running_kernel()).bytes(),
    )[0]
    .clone();
    let bound = split(
        nft::testing::encode_create_bound(
            &NftTable::default(),
            1,
            0x0102_0304,
            Features::of_running_kernel(),
        )
        .bytes(),
    )[0]
    .clone();
    // Same header fields but the length, then the attribute: len 8, type 1, value big-endian.
    assert_eq!(bound.len(), plain.len() + 8);
    assert_eq!(&bound[4..16], &plain[4..16]);
    assert_eq!(&bound[16..20], &plain[16..20]);
    assert_eq!(&bound[20..], &[8, 0, 1, 0, 1, 2, 3, 4]);
}

// ---------------------------------------------------------------------------------------------
// Random configurations.

fn v4_cidr() -> impl Strategy<Value = IpNet> {
    (any::<u32>(), 0u8..=32)
        .prop_map(|(a, p)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), p).unwrap().trunc()))
}

fn v6_cidr() -> impl Strategy<Value = IpNet> {
    (any::<u128>(), 0u8..=128)
        .prop_map(|(a, p)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), p).unwrap().trunc()))
}

fn cidrs(max: usize) -> impl Strategy<Value = Vec<IpNet>> {
    prop::collection::vec(prop_oneof![3 => v4_cidr(), 1 => v6_cidr()], 0..max)
}

fn ports(max: usize) -> impl Strategy<Value = Vec<u16>> {
    prop::collection::vec(1u16..=65535, 0..max)
}

fn port_selection() -> impl Strategy<Value = Selection<u16>> {
    prop_oneof![Just(Selection::All), ports(12).prop_map(Selection::List)]
}

fn ids() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(any::<u32>(), 0..4)
}

fn ifname() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9.-]{0,14}"
}

fn config() -> impl Strategy<Value = CaptureConfig> {
    let capture = (
        1u16..=65535,
        1u16..=65535,
        1u16..=65535,
        prop::collection::vec(any::<u32>(), 1..3),
        ids(),
        prop_oneof![
            Just(InterceptionMode::Redirect),
            Just(InterceptionMode::Tproxy)
        ],
        any::<u32>(),
        1u32..=250,
    );
    let traffic = (
        port_selection(),
        ports(8),
        prop_oneof![Just(Selection::All), cidrs(20).prop_map(Selection::List)],
        cidrs(40),
        ports(6),
        ports(6),
        prop::collection::vec(ifname(), 0..3),
        prop::collection::vec(ifname(), 0..3),
    );
    let dns = prop_oneof![
        Just(DnsCapture::Off),
        Just(DnsCapture::All),
        (
            prop::collection::vec(any::<u32>().prop_map(Ipv4Addr::from), 0..3),
            prop::collection::vec(any::<u128>().prop_map(Ipv6Addr::from), 0..3)
        )
            .prop_map(|(v4, v6)| DnsCapture::Servers { v4, v6 }),
    ];
    let rest = (
        dns,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just(Selection::All),
            prop::collection::vec(any::<u32>().prop_map(GroupRef::Id), 1..3)
                .prop_map(Selection::List)
        ],
        prop::collection::vec(any::<u32>().prop_map(GroupRef::Id), 0..3),
        ids(),
        ids(),
    );
    (capture, traffic, rest).prop_map(
        |(
            (envoy, inbound, tunnel, uids, gids, mode, mark, table),
            (in_ports, in_excl, include, exclude, out_incl, out_excl, excl_if, reroute_if),
            (dns, drop_invalid, ipv6, groups_in, groups_ex, bypass_uids, bypass_gids),
        )| CaptureConfig {
            envoy_port: envoy,
            inbound_capture_port: inbound,
            inbound_tunnel_port: tunnel,
            proxy_uids: uids,
            proxy_gids: gids,
            mode,
            inbound_ports: in_ports,
            inbound_exclude_ports: in_excl,
            outbound_include_cidrs: include,
            outbound_exclude_cidrs: exclude,
            outbound_include_ports: out_incl,
            outbound_exclude_ports: out_excl,
            exclude_interfaces: excl_if,
            reroute_interfaces: reroute_if,
            tproxy_mark: mark,
            tproxy_route_table: table,
            dns,
            drop_invalid,
            owner_groups_include: groups_in,
            owner_groups_exclude: groups_ex,
            ipv6,
            bypass_uids,
            bypass_gids,
            ..CaptureConfig::istio_sidecar_default()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any valid configuration, created and updated from another, encodes exactly as libnftnl.
    #[test]
    fn random_configs_encode_exactly_as_libnftnl(a in config(), b in config()) {
        // Configs the model refuses (a proxy UID also bypassed, ...) are not encoded at all.
        prop_assume!(lowered(&a).is_some() && lowered(&b).is_some());
        check_pair(&a, &b, "random");
    }
}
