//! The nftables backend: our one `inet` table, programmed over netlink in Rust (no C library,
//! no `nft` binary), through a handle on one socket: [`Nft`].
//!
//! ```no_run
//! # fn demo(netns: &redirect_kernel::netns::Netns, rs: &redirect_model::Ruleset) -> redirect_kernel::Result<()> {
//! use redirect_kernel::nft::Nft;
//! let nft = Nft::open_in(netns)?; // one socket, created in the pod's namespace
//! nft.apply(rs)?;                 // create, or update in place, in one atomic batch
//! assert!(nft.diff(rs)?.is_empty());
//! # Ok(()) }
//! ```
//!
//! - [`Nft::apply`]: one batch. Into a namespace without our table it creates the table with
//!   every set, chain and rule; over an existing one it updates the table in place (`update`).
//!   The kernel commits a batch whole or not at all, so apply is atomic, idempotent, and on any
//!   error leaves the previous state.
//! - [`Nft::remove`]: deletes the table (absent is fine).
//! - [`Nft::read`] / [`Nft::diff`]: dump the table into the typed form the plan lowers to (one
//!   state of it, bound to the ruleset's generation), and compare object by object.
//! - [`Nft::inet_tables`], [`Nft::remove_inet_tables`], [`Nft::families_with_tables`]: other
//!   tables, by name.
//!
//! Pure, without a socket: [`lower`], [`expected`], [`compare`], [`text`]. With the `testing`
//! feature, the batches each operation sends, encoded but not sent (`testing`), for the libnftnl
//! oracle and the benchmarks.
//!
//! Layers: `lower` (Ruleset → typed table), `expr` and `extra` (expressions), `message` (each
//! netlink message), `batch`, `socket`, `dump`, `state` (read-back), `text` (nft syntax),
//! `compare` (read-back against the plan), `update` (which batch), `foreign` (other tables),
//! `handle` (the socket's jobs). Messages are byte-identical to libnftnl's;
//! `tests/nft_oracle.rs` checks that against libnftnl itself.

mod batch;
mod compare;
mod counters;
mod dump;
mod elements;
mod error;
mod expr;
mod extra;
pub mod feature;
mod foreign;
mod handle;
pub(crate) mod lower;
mod message;
mod nla_writer;
mod probe;
mod socket;
mod state;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
mod trace;
mod update;
mod xt_write;
mod xtables;

pub use batch::{Encoded, Label};
pub use compare::{table_flags, Difference};
pub use counters::{counters, path_counts, RuleCounter};
pub use error::{Error, MissingFeature, Result};
pub use expr::{Base, CtKey, Expr, Foreign, MetaKey, Verdict};
pub use feature::Feature;
pub use foreign::TableList;
pub use handle::{Applied, Nft};
pub use lower::{
    addr_elem, counted_rules, lower, lower_named, BaseSpec, ChainKind, CountedRule, NftChain,
    NftSet, NftTable, SetElem,
};
pub use probe::PROBE_TABLE;
pub use redirect_model::table::TABLE;
pub use state::{BaseState, ChainState, SetState, TableState};
pub use trace::{trace_batch, trace_table, RuleHandle, TraceMatch, TRACE_CHAIN, TRACE_PRIORITY};
#[cfg(feature = "testing")]
pub(crate) use update::changes;
pub use update::Changes;
pub use xt_write::{XtChainSpec, XtRuleSpec, XtTable};
pub use xtables::{XtChain, XtFound};

/// One nfnetlink message (header and `nfgenmsg` included) appended to `out`: for the other
/// netfilter subsystems we speak (`crate::ipset`).
pub(crate) fn write_message(
    out: &mut Vec<u8>,
    family: netlink_packet_netfilter::NetfilterProtoFamily,
    inner: netlink_packet_netfilter::NetfilterMessageInner,
    flags: u16,
    seq: u32,
) {
    message::write(out, family, 0, inner, flags, seq);
}

use redirect_model::Ruleset;

/// What the running kernel's nf_tables does that the encoder must match. Read once where a
/// socket is opened ([`Features::of_running_kernel`]) and passed to the encoder, which never
/// asks the system itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Kernels before 6.10 ignore NLM_F_ACK on a batch's begin and end; from 6.10 on they
    /// answer it, and the end's answer comes after the commit. The nftnl crate asks for it on
    /// those kernels too.
    pub acks_batch_ends: bool,
}

impl Features {
    /// The features of a kernel release (`uname -r`: "6.18.44-...").
    pub fn of_release(release: &str) -> Features {
        let mut parts = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|p| p.parse::<u32>().ok());
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Features {
            acks_batch_ends: (major, minor) >= (6, 10),
        }
    }

    /// The features of the kernel this process runs on (`uname`).
    pub fn of_running_kernel() -> Features {
        match nix::sys::utsname::uname() {
            Ok(u) => Features::of_release(&u.release().to_string_lossy()),
            Err(_) => Features::of_release(""),
        }
    }
}

/// The sets of our table `table`, lowered as a table whose sets name committed sets (id 0) and
/// hold the elements: what an element batch (`Nft::add_elements`, `remove_elements`) carries.
pub fn elements_table(table: &str, sets: &[redirect_model::NamedSet]) -> NftTable {
    let rs = Ruleset {
        chains: Vec::new(),
        sets: sets.to_vec(),
    };
    let mut t = lower_named(&rs, table);
    for s in &mut t.sets {
        s.id = 0;
    }
    t
}

/// What the kernel should hold for a ruleset, in the form a read returns.
pub fn expected(rs: &Ruleset) -> TableState {
    state::expected(&lower(rs))
}

/// The state a lowered table has once applied (what a read of it returns).
pub fn state_of(t: &NftTable) -> TableState {
    state::expected(t)
}

/// Compare a table already read (None = no table) with a ruleset; empty when they are equal.
pub fn compare(rs: &Ruleset, actual: Option<&TableState>) -> Vec<Difference> {
    compare::compare(&expected(rs), actual)
}
