//! Other tables than ours: which families hold any (iptables-nft keeps its rules in such
//! tables), the `inet` tables whose name starts with a prefix, and deleting them in one batch.
//! What the names mean (Istio's `istio-*` tables) is for the caller to say.

use super::error::Result;
use super::socket::Socket;
use super::{dump, update};
use redirect_model::Family;

const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

/// Every nf_tables table of a namespace, from one dump: what the questions below ask of it, so
/// that one dump answers them all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableList {
    /// (nfproto family, name), in kernel order.
    tables: Vec<(u8, String)>,
}

impl TableList {
    pub(super) fn read(sock: &Socket) -> Result<TableList> {
        Ok(TableList {
            tables: dump::tables(sock)?,
        })
    }

    /// The families (`ip`, `ip6`) that have any table: iptables-nft keeps its rules in such
    /// tables, so in a family without one there is nothing to look for.
    pub fn families(&self) -> Vec<Family> {
        let has = |p: u8| self.tables.iter().any(|(f, _)| *f == p);
        [(Family::V4, NFPROTO_IPV4), (Family::V6, NFPROTO_IPV6)]
            .into_iter()
            .filter(|(_, p)| has(*p))
            .map(|(f, _)| f)
            .collect()
    }

    /// Names of the `inet` tables whose name starts with `prefix`, in kernel order.
    pub fn inet_tables(&self, prefix: &str) -> Vec<String> {
        self.tables
            .iter()
            .filter(|(family, name)| *family == NFPROTO_INET && name.starts_with(prefix))
            .map(|(_, name)| name.clone())
            .collect()
    }
}

/// The families (`ip`, `ip6`) that have any nf_tables table, from one dump.
pub(super) fn families_with_tables(sock: &Socket) -> Result<Vec<Family>> {
    Ok(TableList::read(sock)?.families())
}

/// Names of the `inet` tables whose name starts with `prefix`, in kernel order.
pub(super) fn inet_tables(sock: &Socket, prefix: &str) -> Result<Vec<String>> {
    Ok(TableList::read(sock)?.inet_tables(prefix))
}

/// Deletes every table [`inet_tables`] lists for `prefix`, in one batch (all or none);
/// returns the names.
pub(super) fn remove_inet_tables(sock: &Socket, prefix: &str) -> Result<Vec<String>> {
    let names = inet_tables(sock, prefix)?;
    if names.is_empty() {
        return Ok(names);
    }
    let batch = update::delete_tables(&names, sock.next_seq(), sock.features());
    let describe = |seq: u32| match batch.label_of(seq) {
        Some(l) => l.describe(&Default::default()),
        None => format!("the batch deleting tables {prefix}* (message {seq})"),
    };
    sock.send_batch(&batch, &describe)?;
    Ok(names)
}
