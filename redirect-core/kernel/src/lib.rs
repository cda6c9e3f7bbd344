//! redirect-kernel: a pod's capture in the kernel, over netlink, in Rust (no C library, no
//! `nft`, `ip` or `iptables` binary).
//!
//! - [`nft`]: a handle (`Nft`) on our one `inet` table (`redirect_model::table`): a lowered ruleset encoded
//!   into one atomic batch (byte-identical to libnftnl's), applied, updated in place, read
//!   back bound to the ruleset's generation, compared, printed as nft syntax; other tables
//!   listed and deleted by name.
//! - [`routes`]: a handle (`Routes`) on TPROXY policy routing and `::6` on `lo` (rtnetlink),
//!   and the addresses of the namespace's interfaces.
//! - [`netns`]: a network namespace opened once and judged by its descriptor, and work run
//!   inside it.
//! - [`listeners`]: the sockets listening in a namespace (sock_diag), as `ss -ltun` lists
//!   them.
//! - [`synthetic`]: a synthetic connection through a namespace's capture, proved to land on a
//!   listener (sock_diag).
//! - [`sockopt`]: the original destination of a redirected connection (`SO_ORIGINAL_DST`).
//! - [`backend`]: what capture needs of one namespace (our table, the routes beside it, the
//!   addresses), behind the `Backend` trait: `Live` over the kernel, and with the `testing`
//!   feature `fake::Fake` in memory.
//! - [`capture`]: capture in one namespace through a `Backend`: the routes, then the table
//!   (undone on failure); checked against a config; removed; cleaned up.
//! - [`trace`]: nf_tables' trace reports of one namespace (`NFNLGRP_NFTRACE`), and a flow's
//!   first packet sent from inside it.
//! - [`SystemGroups`]: the host's group database for the plan's owner groups.
//! - [`Error`], [`Result`], [`errno_hint`].
//!
//! Nothing here knows Istio: names and policies are the caller's.

#![deny(missing_docs)]

mod error;
mod groups;
mod netlink;

pub mod backend;
pub mod branch_eni;
pub mod capture;
#[cfg(feature = "testing")]
pub mod fake;
pub mod ipset;
pub mod listeners;
pub mod netns;
pub mod nft;
pub mod routes;
pub mod sockopt;
pub mod synthetic;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;

pub use error::{errno_hint, Error, Result};
pub use groups::SystemGroups;
