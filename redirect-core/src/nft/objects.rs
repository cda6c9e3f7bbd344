//! Building the apply and delete batches from a lowered table. Sets are our own `NlMsg`
//! types (nftnl's `Set` has no interval flag and no per-element flags).

use std::ffi::{c_void, CString};
use std::ptr::NonNull;

use nftnl::{
    Batch, Chain, ChainType, FinalizedBatch, Hook as NftHook, MsgType, NlMsg, Policy, ProtoFamily,
    Rule, Table,
};
use nftnl_sys::{self as sys, libc};

use netlink_packet_core::Emitable;

use super::elements::Elements;
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

/// What one message of a batch does, for the error that names it. Kept as indices and
/// built into text only when the kernel refuses a message (formatting every rule up front
/// cost more than encoding it).
#[derive(Clone, Copy, Debug)]
enum Label {
    CreateTable,
    AddTable,
    DeleteTable,
    AddSet(usize),
    AddElements { set: usize, chunk: usize },
    AddChain(usize),
    AddRule { chain: usize, rule: usize },
}

impl Label {
    fn describe(self, t: &NftTable) -> String {
        match self {
            Label::CreateTable => format!("create table inet {TABLE}"),
            Label::AddTable => format!("add table inet {TABLE}"),
            Label::DeleteTable => format!("delete table inet {TABLE}"),
            Label::AddSet(i) => format!("add set {}", t.sets[i].name),
            Label::AddElements { set, chunk } => {
                format!(
                    "add elements to set {} (chunk {})",
                    t.sets[set].name,
                    chunk + 1
                )
            }
            Label::AddChain(i) => format!("add chain {}", t.chains[i].name),
            Label::AddRule { chain, rule } => {
                let c = &t.chains[chain];
                format!("rule {} of chain {}: {:?}", rule + 1, c.name, c.rules[rule])
            }
        }
    }
}

/// A batch encoded for the kernel, with what each of its messages does.
pub struct Encoded {
    batch: FinalizedBatch,
    labels: Vec<Label>,
}

impl Encoded {
    /// The bytes one `sendmsg` carries.
    pub fn bytes(&self) -> Vec<u8> {
        self.batch.iter().flatten().copied().collect()
    }

    /// Number of messages between BEGIN and END.
    pub fn messages(&self) -> usize {
        self.labels.len()
    }
}

/// Encode the batch that programs a lowered table.
pub fn encode(t: &NftTable, mode: Mode) -> Encoded {
    let table = table_obj();
    let mut batch = Batch::new();
    let mut labels: Vec<Label> = Vec::new();
    match mode {
        Mode::Create => {
            batch.add(&CreateTable, MsgType::Add);
            labels.push(Label::CreateTable);
        }
        Mode::Replace => {
            batch.add(&table, MsgType::Add);
            batch.add(&table, MsgType::Del);
            batch.add(&table, MsgType::Add);
            labels.extend([Label::AddTable, Label::DeleteTable, Label::AddTable]);
        }
    }

    for (si, set) in t.sets.iter().enumerate() {
        batch.add(&SetMsg { set, elems: None }, MsgType::Add);
        labels.push(Label::AddSet(si));
        for (chunk, elems) in set.elements.chunks(ELEMS_PER_MSG).enumerate() {
            batch.add(
                &SetMsg {
                    set,
                    elems: Some(elems),
                },
                MsgType::Add,
            );
            labels.push(Label::AddElements { set: si, chunk });
        }
    }
    let mut chains = Vec::with_capacity(t.chains.len());
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
    for (ci, chain) in chains.iter().enumerate() {
        batch.add(chain, MsgType::Add);
        labels.push(Label::AddChain(ci));
    }
    for (ci, (c, chain)) in t.chains.iter().zip(&chains).enumerate() {
        for (ri, exprs) in c.rules.iter().enumerate() {
            let mut rule = Rule::new(chain);
            for e in exprs {
                rule.add_expr(e);
            }
            batch.add(&rule, MsgType::Add);
            labels.push(Label::AddRule {
                chain: ci,
                rule: ri,
            });
        }
    }
    Encoded {
        batch: batch.finalize(),
        labels,
    }
}

/// Program a lowered table in one batch.
pub fn apply_batch(sock: &Socket, t: &NftTable, mode: Mode) -> Result<()> {
    send(sock, &encode(t, mode), t)
}

/// Delete our table in one batch.
pub fn delete_batch(sock: &Socket) -> Result<()> {
    let mut batch = Batch::new();
    batch.add(&table_obj(), MsgType::Del);
    let encoded = Encoded {
        batch: batch.finalize(),
        labels: vec![Label::DeleteTable],
    };
    send(sock, &encoded, &NftTable::default())
}

fn send(sock: &Socket, encoded: &Encoded, t: &NftTable) -> Result<()> {
    let seqs = encoded.batch.sequence_numbers();
    // The begin and end messages take a sequence number each when the kernel acks them.
    let total = (seqs.end - seqs.start) as usize;
    let first = seqs.start + (total.saturating_sub(encoded.labels.len()) / 2) as u32;
    let describe = |seq: u32| -> String {
        seq.checked_sub(first)
            .and_then(|i| encoded.labels.get(i as usize))
            .map(|l| l.describe(t))
            .unwrap_or_else(|| format!("the batch (message {seq})"))
    };
    sock.send_batch(&encoded.batch, &describe)
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
            // A definition carries the set's type; a chunk of elements is appended after
            // the set's attributes (see `write`).
            if self.elems.is_none() {
                let flags = if self.set.interval {
                    libc::NFT_SET_INTERVAL as u32
                } else {
                    0
                };
                sys::nftnl_set_set_u32(p, sys::NFTNL_SET_FLAGS as u16, flags);
                sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_TYPE as u16, self.set.key_type);
                sys::nftnl_set_set_u32(p, sys::NFTNL_SET_KEY_LEN as u16, self.set.key_len);
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
                Some(elems) => {
                    // Table, set name and id from libnftnl (no elements: no list attribute),
                    // then the element list ourselves, within the message's maximum size
                    // (ELEMS_PER_MSG keeps a chunk far below it).
                    sys::nftnl_set_elems_nlmsg_build_payload(hdr, s.as_ptr());
                    let list = Elements(elems);
                    let n = list.buffer_len();
                    let len = (*hdr).nlmsg_len as usize;
                    assert!(len + n <= nftnl::nft_nlmsg_maxsize() as usize);
                    let tail = std::slice::from_raw_parts_mut((hdr as *mut u8).add(len), n);
                    list.emit(tail);
                    (*hdr).nlmsg_len += n as u32;
                }
            }
            sys::nftnl_set_free(s.as_ptr());
        }
    }
}
