//! Istio's own nftables tables, for a migration: its native backend (Istio ≥ 1.28) writes
//! `inet istio-proxy-{nat,mangle,raw}`, ambient writes `inet istio-ambient-{nat,mangle,raw}`.
//! Listed with a netlink table dump, deleted in one batch with every ACK checked. Tables of
//! other families and our own table are never touched.

use super::socket::Socket;
use super::{dump, update};
use crate::error::Result;
use crate::ruleset::Family;

const PREFIX: &str = "istio-";
const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// Names of the `inet` tables starting with `istio-` in the current netns, in kernel order.
pub fn istio_tables() -> Result<Vec<String>> {
    list(&Socket::open()?)
}

/// The families (`ip`, `ip6`) that have any nf_tables table in the current netns, from one
/// dump: iptables-nft keeps its rules in such tables, so in a family without one there is
/// nothing to look for and no `iptables-nft-save` to run.
pub fn families_with_tables() -> Result<Vec<Family>> {
    let all = dump::tables(&Socket::open()?)?;
    let has = |p: u8| all.iter().any(|(f, _)| *f == p);
    Ok([(Family::V4, NFPROTO_IPV4), (Family::V6, NFPROTO_IPV6)]
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
    let batch = update::delete_tables(&names, sock.next_seq());
    let describe = |seq: u32| match batch.label_of(seq) {
        Some(l) => l.describe(&Default::default()),
        None => format!("the batch deleting Istio's tables (message {seq})"),
    };
    sock.send_batch(&batch, &describe)?;
    Ok(names)
}

fn list(sock: &Socket) -> Result<Vec<String>> {
    Ok(dump::tables(sock)?
        .into_iter()
        .filter(|(family, name)| *family == NFPROTO_INET && name.starts_with(PREFIX))
        .map(|(_, name)| name)
        .collect())
}
