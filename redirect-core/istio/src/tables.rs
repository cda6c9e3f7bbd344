//! Istio's own nftables tables, for a migration: its native backend (Istio ≥ 1.28) writes
//! `inet istio-proxy-{nat,mangle,raw}`, ambient writes `inet istio-ambient-{nat,mangle,raw}`.
//! Listed with a netlink table dump, deleted in one batch with every ACK checked. Tables of
//! other families and our own table are never touched.

use redirect_kernel::nft::{Nft, TableList};

use crate::error::Result;

const PREFIX: &str = "istio-";

/// Names of the `inet` tables starting with `istio-` in `nft`'s namespace, in kernel order.
pub fn istio_tables(nft: &Nft) -> Result<Vec<String>> {
    Ok(nft.inet_tables(PREFIX)?)
}

/// [`istio_tables`] of a listing already read.
pub fn istio_tables_in(list: &TableList) -> Vec<String> {
    list.inet_tables(PREFIX)
}

/// Delete every table [`istio_tables`] lists, in one batch (all or none). Returns the names.
pub fn remove_istio_tables(nft: &Nft) -> Result<Vec<String>> {
    Ok(nft.remove_inet_tables(PREFIX)?)
}
