//! The nftables backend: our one `inet` table, programmed over netlink in Rust (no C library,
//! no `nft` binary).
//!
//! - `apply`: one batch. Into a namespace without our table it creates the table with every
//!   set, chain and rule; over an existing one it updates the table in place (`update`). The
//!   kernel commits a batch whole or not at all, so apply is atomic, idempotent, and on any
//!   error leaves the previous state.
//! - `remove`: deletes the table (absent is fine).
//! - `read_back` / `diff`: dump the table into the typed form the plan lowers to, and compare
//!   object by object.
//!
//! Layers: `lower` (Ruleset → typed table), `expr` and `extra` (expressions), `message` (each
//! netlink message), `batch`, `socket`, `dump`, `state` (read-back and comparison), `text` (nft
//! syntax), `update` (which batch), `foreign` (Istio's tables). Messages are byte-identical to
//! libnftnl's; `tests/nft_oracle.rs` checks that against libnftnl itself.
//!
//! Every function acts on the calling thread's network namespace; wrap it in
//! `crate::netns::run_in` for a pod. The `_in` variants do that.

mod batch;
mod dump;
mod elements;
mod expr;
mod extra;
mod foreign;
pub(crate) mod lower;
mod message;
mod socket;
mod state;
pub mod text;
mod update;

use std::path::Path;

pub use batch::{Encoded, Label};
pub use expr::{Base, CtKey, Expr, Foreign, MetaKey, Verdict};
pub use foreign::{families_with_tables, inet_tables, remove_inet_tables};
pub use lower::{lower, BaseSpec, ChainKind, NftChain, NftSet, NftTable, SetElem};
pub use redirect_model::table::TABLE;
pub use state::{table_flags, BaseState, ChainState, Difference, SetState, TableState};
pub use update::Changes;

use crate::error::Result;
use redirect_model::Ruleset;

/// How often apply reads the table again when a concurrent change moved the ruleset under it,
/// before it replaces the table whatever it holds (as it does when the read itself cannot
/// settle).
const APPLY_TRIES: usize = 3;

/// Program a ruleset: create our table, or update it in place to the ruleset, atomically.
pub fn apply(rs: &Ruleset) -> Result<()> {
    apply_table(&lower(rs)).map(|_| ())
}

/// What `apply_table` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// There was no table: it was created.
    Created,
    /// The table was updated in place (nothing sent when the changes are empty).
    Updated(Changes),
    /// Other writers kept changing the ruleset between read and write: the table was deleted
    /// and created again in one batch that depends on no read.
    Replaced,
}

/// `apply` of a lowered table, saying what it did.
pub fn apply_table(table: &NftTable) -> Result<Applied> {
    let sock = socket::Socket::open()?;
    for _ in 0..APPLY_TRIES {
        // The batch is bound to the generation the table was read at: if anything changed
        // since, the kernel refuses it whole.
        let (genid, current) = match dump::table_at(&sock) {
            Ok(read) => read,
            Err(crate::Error::ReadUnsettled { .. }) => break,
            Err(e) => return Err(e),
        };
        let (batch, applied) = match current {
            None => (
                update::create(table, sock.next_seq(), Some(genid)),
                Applied::Created,
            ),
            Some(cur) => match update::update(&cur, table, sock.next_seq(), Some(genid)) {
                None => return Ok(Applied::Updated(Changes::default())),
                Some((b, ch)) => (b, Applied::Updated(ch)),
            },
        };
        match send(&sock, &batch, table) {
            // The ruleset moved since it was read: read again.
            Err(crate::Error::NftRejected { errno, .. }) if errno == libc::ERESTART => continue,
            other => return other.map(|()| applied),
        }
    }
    let batch = update::replace(table, sock.next_seq());
    send(&sock, &batch, table).map(|()| Applied::Replaced)
}

fn send(sock: &socket::Socket, batch: &Encoded, table: &NftTable) -> Result<()> {
    let describe = |seq: u32| match batch.label_of(seq) {
        Some(l) => l.describe(table),
        None => format!("the batch (message {seq})"),
    };
    sock.send_batch(batch, &describe)
}

/// The batch `apply` sends into a namespace without our table, encoded but not sent: the
/// config → plan → netlink path without a kernel (benchmarks, size checks).
pub fn encode(rs: &Ruleset) -> Encoded {
    update::create(&lower(rs), 1, None)
}

/// The batch that creates a lowered table (for the oracle test and benchmarks).
pub fn encode_create(t: &NftTable, first_seq: u32) -> Encoded {
    update::create(t, first_seq, None)
}

/// The same, bound to a ruleset generation, as `apply` sends it.
pub fn encode_create_bound(t: &NftTable, first_seq: u32, genid: u32) -> Encoded {
    update::create(t, first_seq, Some(genid))
}

/// The state a lowered table has once applied (what a read back of it returns).
pub fn state_of(t: &NftTable) -> TableState {
    state::expected(t)
}

/// The batch that updates `current` into `t` in place, `None` when equal (for tests).
pub fn encode_update(current: &TableState, t: &NftTable) -> Option<(Encoded, Changes)> {
    update::update(current, t, 1, None)
}

/// The batch that replaces our table whatever it holds (for the oracle test).
pub fn encode_replace(t: &NftTable, first_seq: u32) -> Encoded {
    update::replace(t, first_seq)
}

/// The batch that deletes our table (for the oracle test).
pub fn encode_delete(first_seq: u32) -> Encoded {
    update::delete_tables(&[TABLE.to_string()], first_seq)
}

/// Delete our table. Returns whether there was one.
pub fn remove() -> Result<bool> {
    let sock = socket::Socket::open()?;
    let batch = update::delete_tables(&[TABLE.to_string()], sock.next_seq());
    match send(&sock, &batch, &NftTable::default()) {
        // No table (never made, or a concurrent DEL won): gone either way.
        Err(crate::Error::NftRejected { errno, .. }) if errno == libc::ENOENT => Ok(false),
        other => other.map(|()| true),
    }
}

/// Read our table back; `None` when it does not exist.
pub fn read_back() -> Result<Option<TableState>> {
    dump::table(&socket::Socket::open()?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use redirect_testkit::{kernel_tests_enabled, netns::TestNetns};

    /// A batch computed from a generation the ruleset has left is refused whole (ERESTART),
    /// so a stale difference is never applied; `apply` then reads again and succeeds.
    #[test]
    fn a_batch_bound_to_an_old_generation_is_refused() {
        if !kernel_tests_enabled() {
            return;
        }
        let ns = TestNetns::new();
        let rs =
            redirect_model::plan(&redirect_model::CaptureConfig::istio_sidecar_default()).unwrap();
        let t = lower(&rs);
        let err = ns.run(|| {
            let sock = socket::Socket::open().unwrap();
            let genid = dump::generation(&sock).unwrap();
            ns.sh("nft add table inet someone-else");
            let batch = update::create(&t, sock.next_seq(), Some(genid));
            send(&sock, &batch, &t).unwrap_err()
        });
        match err {
            crate::Error::NftRejected { errno, what, .. } => {
                assert_eq!(errno, libc::ERESTART, "{what}");
            }
            e => panic!("{e}"),
        }
        assert_eq!(
            read_back_in(ns.path()).unwrap(),
            None,
            "nothing was applied"
        );
        apply_in(ns.path(), &rs).unwrap();
        assert!(diff_in(ns.path(), &rs).unwrap().is_empty());
    }
}
