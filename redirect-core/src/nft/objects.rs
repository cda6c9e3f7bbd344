//! Building the apply and delete batches from a lowered table. Sets are our own `NlMsg`
//! types (nftnl's `Set` has no interval flag and no per-element flags).

use std::ffi::{c_void, CString};
use std::ptr::NonNull;

use nftnl::{
    Batch, Chain, ChainType, Hook as NftHook, MsgType, NlMsg, Policy, ProtoFamily, Rule, Table,
};
use nftnl_sys::{self as sys, libc};

use super::lower::{ChainKind, NftSet, NftTable};
use super::netlink::Socket;
use super::TABLE;
use crate::error::Result;
use crate::ruleset::Hook;

/// Elements per NEWSETELEM message: well under the kernel's message size for IPv6 ranges.
const ELEMS_PER_MSG: usize = 512;

fn table_obj() -> Table {
    Table::new(CString::new(TABLE).expect("no NUL"), ProtoFamily::Inet)
}

/// How the batch treats an existing table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Create the table; the whole batch fails with EEXIST if it exists. Nothing is deleted,
    /// so the commit needs no RCU grace period (a delete costs ~10 ms when the socket closes).
    Create,
    /// add table, delete table, add table with everything: an atomic, idempotent replace.
    Replace,
}

/// Program a lowered table in one batch.
pub fn apply_batch(sock: &Socket, t: &NftTable, mode: Mode) -> Result<()> {
    let table = table_obj();
    let mut batch = Batch::new();
    let mut labels: Vec<String> = Vec::new();
    let mut label = |s: String| labels.push(s);
    // Sequence numbers: begin message (if acked), then one per message.
    match mode {
        Mode::Create => {
            batch.add(&CreateTable, MsgType::Add);
            label(format!("create table inet {TABLE}"));
        }
        Mode::Replace => {
            batch.add(&table, MsgType::Add);
            label(format!("add table inet {TABLE}"));
            batch.add(&table, MsgType::Del);
            label(format!("delete table inet {TABLE}"));
            batch.add(&table, MsgType::Add);
            label(format!("add table inet {TABLE}"));
        }
    }

    for set in &t.sets {
        batch.add(&SetMsg { set, elems: None }, MsgType::Add);
        label(format!("add set {}", set.name));
        for (i, chunk) in set.elements.chunks(ELEMS_PER_MSG).enumerate() {
            batch.add(
                &SetMsg {
                    set,
                    elems: Some(chunk),
                },
                MsgType::Add,
            );
            label(format!(
                "add elements to set {} (chunk {})",
                set.name,
                i + 1
            ));
        }
    }
    let mut chains = Vec::new();
    for c in &t.chains {
        let mut chain = Chain::new(CString::new(c.name.as_str()).expect("no NUL"), &table);
        if let Some(base) = c.base {
            let hook = match base.hook {
                Hook::Prerouting => NftHook::PreRouting,
                Hook::Output => NftHook::Out,
            };
            chain.set_hook(hook, base.priority);
            chain.set_type(match base.kind {
                ChainKind::Filter => ChainType::Filter,
                ChainKind::Route => ChainType::Route,
                ChainKind::Nat => ChainType::Nat,
            });
            chain.set_policy(Policy::Accept);
        }
        chains.push(chain);
    }
    for (c, chain) in t.chains.iter().zip(&chains) {
        batch.add(chain, MsgType::Add);
        label(format!("add chain {}", c.name));
    }
    for (c, chain) in t.chains.iter().zip(&chains) {
        for (i, exprs) in c.rules.iter().enumerate() {
            let mut rule = Rule::new(chain);
            for e in exprs {
                rule.add_expr(e);
            }
            batch.add(&rule, MsgType::Add);
            label(format!("rule {} of chain {}: {:?}", i + 1, c.name, exprs));
        }
    }
    send(sock, batch, labels)
}

/// Delete our table in one batch.
pub fn delete_batch(sock: &Socket) -> Result<()> {
    let table = table_obj();
    let mut batch = Batch::new();
    batch.add(&table, MsgType::Del);
    send(sock, batch, vec![format!("delete table inet {TABLE}")])
}

fn send(sock: &Socket, batch: Batch, labels: Vec<String>) -> Result<()> {
    let batch = batch.finalize();
    let seqs = batch.sequence_numbers();
    // The begin and end messages take a sequence number each when the kernel acks them.
    let total = (seqs.end - seqs.start) as usize;
    let first = seqs.start + (total.saturating_sub(labels.len()) / 2) as u32;
    let describe = move |seq: u32| -> String {
        seq.checked_sub(first)
            .and_then(|i| labels.get(i as usize).cloned())
            .unwrap_or_else(|| format!("the batch (message {seq})"))
    };
    sock.send_batch(&batch, &describe)
}

/// A set definition (`elems: None`) or a chunk of its elements.
struct SetMsg<'a> {
    set: &'a NftSet,
    elems: Option<&'a [super::lower::SetElem]>,
}

impl SetMsg<'_> {
    fn build(&self) -> NonNull<sys::nftnl_set> {
        let s = NonNull::new(unsafe { sys::nftnl_set_alloc() })
            .unwrap_or_else(|| std::process::abort());
        let table = CString::new(TABLE).expect("no NUL");
        let name = CString::new(self.set.name.as_str()).expect("no NUL");
        unsafe {
            let p = s.as_ptr();
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FAMILY as u16, libc::NFPROTO_INET as u32);
            sys::nftnl_set_set_str(p, sys::NFTNL_SET_TABLE as u16, table.as_ptr());
            sys::nftnl_set_set_str(p, sys::NFTNL_SET_NAME as u16, name.as_ptr());
            sys::nftnl_set_set_u32(p, sys::NFTNL_SET_ID as u16, self.set.id);
            match self.elems {
                None => {
                    let flags = if self.set.interval {
                        libc::NFT_SET_INTERVAL as u32
                    } else {
                        0
                    };
                    sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FLAGS as u16, flags);
                    sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_TYPE as u16, self.set.key_type);
                    sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_LEN as u16, self.set.key_len);
                }
                Some(elems) => {
                    for el in elems {
                        let e = NonNull::new(sys::nftnl_set_elem_alloc())
                            .unwrap_or_else(|| std::process::abort());
                        sys::nftnl_set_elem_set(
                            e.as_ptr(),
                            sys::NFTNL_SET_ELEM_KEY as u16,
                            el.key.as_ptr() as *const c_void,
                            el.key.len() as u32,
                        );
                        if el.interval_end {
                            sys::nftnl_set_elem_set_u32(
                                e.as_ptr(),
                                sys::NFTNL_SET_ELEM_FLAGS as u16,
                                libc::NFT_SET_ELEM_INTERVAL_END as u32,
                            );
                        }
                        sys::nftnl_set_elem_add(p, e.as_ptr());
                    }
                }
            }
        }
        s
    }
}

/// `add table` with NLM_F_EXCL: fails with EEXIST when our table exists.
struct CreateTable;

unsafe impl NlMsg for CreateTable {
    unsafe fn write(&self, buf: *mut c_void, seq: u32, _msg_type: MsgType) {
        let name = CString::new(TABLE).expect("no NUL");
        unsafe {
            let t = sys::nftnl_table_alloc();
            // As nftnl's own constructors: allocation failure is fatal.
            assert!(!t.is_null(), "nftnl_table_alloc: out of memory");
            sys::nftnl_table_set_str(t, sys::NFTNL_TABLE_NAME as u16, name.as_ptr());
            sys::nftnl_table_set_u32(t, sys::NFTNL_TABLE_FLAGS as u16, 0);
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf as *mut libc::c_char,
                libc::NFT_MSG_NEWTABLE as u16,
                libc::NFPROTO_INET as u16,
                (libc::NLM_F_CREATE | libc::NLM_F_EXCL | libc::NLM_F_ACK) as u16,
                seq,
            );
            sys::nftnl_table_nlmsg_build_payload(hdr, t);
            sys::nftnl_table_free(t);
        }
    }
}

unsafe impl NlMsg for SetMsg<'_> {
    unsafe fn write(&self, buf: *mut c_void, seq: u32, _msg_type: MsgType) {
        let s = self.build();
        unsafe {
            let (ty, flags) = match self.elems {
                None => (libc::NFT_MSG_NEWSET, libc::NLM_F_CREATE | libc::NLM_F_ACK),
                Some(_) => (
                    libc::NFT_MSG_NEWSETELEM,
                    libc::NLM_F_CREATE | libc::NLM_F_ACK,
                ),
            };
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf as *mut libc::c_char,
                ty as u16,
                libc::NFPROTO_INET as u16,
                flags as u16,
                seq,
            );
            match self.elems {
                None => sys::nftnl_set_nlmsg_build_payload(hdr, s.as_ptr()),
                Some(_) => sys::nftnl_set_elems_nlmsg_build_payload(hdr, s.as_ptr()),
            }
            sys::nftnl_set_free(s.as_ptr());
        }
    }
}
