//! Istio's own nftables tables, for a migration: its native backend (Istio ≥ 1.28) writes
//! `inet istio-proxy-{nat,mangle,raw}`, ambient writes `inet istio-ambient-{nat,mangle,raw}`.
//! Listed with a netlink table dump, deleted in one batch with every ACK checked. Tables of
//! other families and our own table are never touched.

use std::ffi::{c_char, CStr, CString};

use nftnl::{Batch, MsgType, ProtoFamily, Table};
use nftnl_sys::{self as sys, libc};

use super::netlink::Socket;
use crate::error::Result;

const PREFIX: &str = "istio-";

/// Names of the `inet` tables starting with `istio-` in the current netns, in kernel order.
pub fn istio_tables() -> Result<Vec<String>> {
    list(&Socket::open()?)
}

/// The families (`ip`, `ip6`) that have any nf_tables table in the current netns, from one
/// dump: iptables-nft keeps its rules in such tables, so in a family without one there is
/// nothing to look for and no `iptables-nft-save` to run.
pub fn families_with_tables() -> Result<Vec<crate::ruleset::Family>> {
    use crate::ruleset::Family;
    let all = tables(&Socket::open()?, libc::NFPROTO_UNSPEC as u16)?;
    let has = |p: i32| all.iter().any(|(f, _)| *f == p as u32);
    Ok([
        (Family::V4, libc::NFPROTO_IPV4),
        (Family::V6, libc::NFPROTO_IPV6),
    ]
    .into_iter()
    .filter(|(_, p)| has(*p))
    .map(|(f, _)| f)
    .collect())
}

/// Delete every table [`istio_tables`] lists, in one batch (all or none). Returns the names.
pub fn remove_istio_tables() -> Result<Vec<String>> {
    let sock = Socket::open()?;
    let names = list(&sock)?;
    if names.is_empty() {
        return Ok(names);
    }
    // Names come from the kernel as C strings: no interior NUL, nothing is dropped here.
    let tables: Vec<Table> = names
        .iter()
        .filter_map(|n| CString::new(n.as_str()).ok())
        .map(|n| Table::new(n, ProtoFamily::Inet))
        .collect();
    let mut batch = Batch::new();
    for t in &tables {
        batch.add(t, MsgType::Del);
    }
    let batch = batch.finalize();
    // As in objects.rs: begin and end take one sequence number each around the messages.
    let seqs = batch.sequence_numbers();
    let total = (seqs.end - seqs.start) as usize;
    let first = seqs.start + (total.saturating_sub(names.len()) / 2) as u32;
    let labels: Vec<String> = names
        .iter()
        .map(|n| format!("delete table inet {n}"))
        .collect();
    let describe = move |seq: u32| -> String {
        seq.checked_sub(first)
            .and_then(|i| labels.get(i as usize).cloned())
            .unwrap_or_else(|| format!("the batch deleting Istio's tables (message {seq})"))
    };
    sock.send_batch(&batch, &describe)?;
    Ok(names)
}

const SEQ: u32 = 1;

fn list(sock: &Socket) -> Result<Vec<String>> {
    Ok(tables(sock, libc::NFPROTO_INET as u16)?
        .into_iter()
        .filter(|(_, name)| name.starts_with(PREFIX))
        .map(|(_, name)| name)
        .collect())
}

/// Every table of `family` (`NFPROTO_UNSPEC`: all families) as (family, name).
fn tables(sock: &Socket, family: u16) -> Result<Vec<(u32, String)>> {
    let mut buf = vec![0u8; 256];
    // SAFETY: the buffer holds a header (and no payload); nftnl writes only the header.
    let req = unsafe {
        let hdr = sys::nftnl_nlmsg_build_hdr(
            buf.as_mut_ptr() as *mut c_char,
            libc::NFT_MSG_GETTABLE as u16,
            family,
            (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
            SEQ,
        );
        let len = (*hdr).nlmsg_len as usize;
        &buf[..len.min(256)]
    };
    let mut names = Vec::new();
    for msg in sock.dump(req, SEQ)?.unwrap_or_default() {
        // SAFETY: `msg` is one whole netlink message (header included) from the dump; the
        // table object is freed on every path.
        unsafe {
            let t = sys::nftnl_table_alloc();
            if t.is_null() {
                continue;
            }
            if sys::nftnl_table_nlmsg_parse(msg.as_ptr() as *const libc::nlmsghdr, t) >= 0 {
                let fam = sys::nftnl_table_get_u32(t, sys::NFTNL_TABLE_FAMILY as u16);
                let p = sys::nftnl_table_get_str(t, sys::NFTNL_TABLE_NAME as u16);
                if !p.is_null() {
                    names.push((fam, CStr::from_ptr(p).to_string_lossy().into_owned()));
                }
            }
            sys::nftnl_table_free(t);
        }
    }
    Ok(names)
}
