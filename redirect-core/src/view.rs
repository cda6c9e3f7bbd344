//! A namespace's capture for a person to read: what [`Namespace::inspect`](crate::Namespace::inspect)
//! returns ([`Inspection`]), our table's name and flags, its rules and sets printed as `nft`
//! prints them ([`text`]), and how many rules and chains a ruleset becomes in the kernel.

pub use redirect_kernel::capture::RoutesSeen;
pub use redirect_kernel::nft::{table_flags, text, TABLE};
/// The TPROXY mark and route table a sidecar's config names, whether or not it uses them.
pub use redirect_model::sidecar_routing as routing_of;

use redirect_kernel::capture::Mismatch;
use redirect_model::{Ruleset, ValidConfig};

use crate::probe::KernelView;

/// The rules and chains `rs` becomes in the kernel (with the per-family dispatch of the hooked
/// chains): the numbers `inspect` shows.
pub fn kernel_counts(rs: &Ruleset) -> (usize, usize) {
    let table = redirect_kernel::nft::lower(rs);
    let rules = table.chains.iter().map(|c| c.rules.len()).sum();
    (rules, table.chains.len())
}

/// What [`Namespace::inspect`](crate::Namespace::inspect) judges the namespace against.
#[derive(Clone, Copy, Debug)]
pub enum Expected<'a> {
    /// Nothing: the namespace is only shown.
    Unknown,
    /// The pod should have no capture: a table of ours is a difference.
    Uncaptured,
    /// A sidecar's capture, planned.
    Sidecar(&'a ValidConfig, &'a Ruleset),
}

/// A namespace's capture read once: our table and the foreign rules (`kernel`), the routes
/// beside them, and how they differ from what was expected.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// Our table, Istio's tables and chains, and what could not be read.
    pub kernel: KernelView,
    /// The TPROXY routing (both families) and `::6` on `lo`.
    pub routes: RoutesSeen,
    /// How it differs from what was expected (empty when equal, or nothing was).
    pub differences: Vec<Mismatch>,
}
