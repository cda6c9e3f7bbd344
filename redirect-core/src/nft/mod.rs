//! The nftables backend: our one `inet` table, programmed over netlink (no `nft` binary).
//!
//! - `apply`: one batch that adds the table, deletes it, and adds it again with every set,
//!   chain and rule. The kernel commits the batch whole or not at all, so apply replaces the
//!   previous ruleset atomically, is idempotent, and on any error leaves the previous state.
//! - `remove`: deletes the table (absent is fine).
//! - `read_back` / `diff`: dump the table and compare it with a plan, rule by rule.
//!
//! Every function acts on the calling thread's network namespace; wrap it in
//! `netns::run_in` for a pod. The `_in` variants do that.

pub mod decode;
mod elements;
mod expr;
mod foreign;
pub(crate) mod lower;
mod netlink;
mod objects;
mod state;

use std::path::Path;

pub use foreign::{families_with_tables, istio_tables, remove_istio_tables};
pub use lower::{base_chain_name, chain_name, lower, merged_ranges, NftTable};
pub use objects::Encoded;
pub use state::{Difference, TableState};

use crate::error::Result;
use crate::ruleset::Ruleset;

/// The name of our table (family `inet`). One per network namespace; nothing else of ours exists.
pub const TABLE: &str = "redirect_capture";

/// Program a ruleset, atomically replacing whatever our table held.
pub fn apply(rs: &Ruleset) -> Result<()> {
    let table = lower(rs);
    let sock = netlink::Socket::open()?;
    // A pod's first apply finds no table: create it without a delete in the batch (fast
    // commit). If it exists, that batch fails whole and the atomic replace follows.
    match objects::apply_batch(&sock, &table, objects::Mode::Create) {
        Err(crate::Error::NftRejected { errno, .. }) if errno == libc::EEXIST => {
            objects::apply_batch(&sock, &table, objects::Mode::Replace)
        }
        other => other,
    }
}

/// The batch `apply` sends into a namespace without our table, encoded but not sent: the
/// config → plan → netlink path without a kernel (benchmarks, size checks).
pub fn encode(rs: &Ruleset) -> Encoded {
    objects::encode(&lower(rs), objects::Mode::Create)
}

/// Delete our table. Returns whether there was one.
pub fn remove() -> Result<bool> {
    let sock = netlink::Socket::open()?;
    if state::dump(&sock)?.is_none() {
        return Ok(false);
    }
    match objects::delete_batch(&sock) {
        // Another remover (a concurrent DEL) won the race since the dump: it is gone either way.
        Err(crate::Error::NftRejected { errno, .. }) if errno == libc::ENOENT => Ok(false),
        other => other.map(|()| true),
    }
}

/// Read our table back; `None` when it does not exist.
pub fn read_back() -> Result<Option<TableState>> {
    let sock = netlink::Socket::open()?;
    state::dump(&sock)
}

/// What the kernel should hold for a ruleset, in the form `read_back` returns.
pub fn expected(rs: &Ruleset) -> TableState {
    state::expected(&lower(rs))
}

/// Compare the kernel's table with a ruleset; empty when they are equal.
pub fn diff(rs: &Ruleset) -> Result<Vec<Difference>> {
    Ok(compare(rs, read_back()?.as_ref()))
}

/// Compare a table already read back (None = no table) with a ruleset.
pub fn compare(rs: &Ruleset, actual: Option<&TableState>) -> Vec<Difference> {
    state::compare(&expected(rs), actual)
}

/// `apply` inside the namespace at `netns`.
pub fn apply_in(netns: &Path, rs: &Ruleset) -> Result<()> {
    crate::netns::run_in(netns, || apply(rs))?
}

/// `remove` inside the namespace at `netns`.
pub fn remove_in(netns: &Path) -> Result<bool> {
    crate::netns::run_in(netns, remove)?
}

/// `read_back` inside the namespace at `netns`.
pub fn read_back_in(netns: &Path) -> Result<Option<TableState>> {
    crate::netns::run_in(netns, read_back)?
}

/// `diff` inside the namespace at `netns`.
pub fn diff_in(netns: &Path, rs: &Ruleset) -> Result<Vec<Difference>> {
    crate::netns::run_in(netns, || diff(rs))?
}
