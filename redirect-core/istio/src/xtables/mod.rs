//! The iptables backend (kernels without nf_tables, or `--backend iptables`): renders the
//! ruleset as iptables-restore input and loads it with the host's binaries, choosing legacy or
//! nft as Istio does; also finds and removes Istio's own iptables leftovers (ISTIO_* chains).
//! The only place in the library crates that runs a binary.
//!
//! - [`detect`]: Istio's binary selection (reference §1.11), per family.
//! - [`apply`]: `<restore> --noflush` per family, checked first and rolled back on failure.
//! - [`find_istio_leftovers`] / [`remove_istio_leftovers`]: `ISTIO_*` chains, the jumps to
//!   them and Istio's rules in built-in chains, in every family × variant (see `leftovers`).
//!
//! Every function acts on the calling thread's network namespace: the binaries are started
//! from that thread and inherit it. The `_in` variants enter a namespace first.

mod apply;
mod detect;
mod exec;
mod leftovers;
mod save;

use std::fmt;

use crate::error::Result;
use redirect_model::{Family, Ruleset};

/// The two iptables implementations: `legacy` (x_tables) and `nft` (iptables over nf_tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `iptables-legacy`: the kernel's x_tables.
    Legacy,
    /// `iptables-nft`: iptables rules stored in nf_tables.
    Nft,
}

impl Variant {
    /// `FORCE_IPTABLES_BINARY`: `""` → `None` (detect), `"legacy"` / `"nft"` → `Some`.
    pub fn parse(field: &'static str, s: &str) -> redirect_model::Result<Option<Variant>> {
        match s {
            "" => Ok(None),
            "legacy" => Ok(Some(Variant::Legacy)),
            "nft" => Ok(Some(Variant::Nft)),
            _ => Err(redirect_model::Error::Config {
                field,
                value: s.to_string(),
                expected: "\"legacy\" or \"nft\" (iptables-legacy or iptables-nft), or empty to \
                           choose as Istio does"
                    .into(),
            }),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Variant::Legacy => "legacy",
            Variant::Nft => "nft",
        })
    }
}

/// The binaries chosen for one family.
#[derive(Clone, Debug)]
pub struct Tool {
    /// The family these binaries serve (`iptables` for IPv4, `ip6tables` for IPv6).
    pub family: Family,
    /// What `<save> --version` reports (`nf_tables` → nft), not what the name says.
    pub variant: Variant,
    /// e.g. `iptables-legacy-save`.
    pub save: String,
    /// e.g. `iptables-legacy-restore`.
    pub restore: String,
    /// e.g. `1.8.9`; `0.0.0` for a legacy binary too old to say.
    pub version: String,
    /// Writes pass `--wait=30` (legacy ≥ 1.6.2 takes the xtables lock).
    pub lock_wait: bool,
}

impl Tool {
    /// The rule binary itself (`iptables-nft`, `ip6tables`, ...).
    pub fn binary(&self) -> &str {
        self.save.strip_suffix("-save").unwrap_or(&self.save)
    }
}

/// One Istio (or our iptables-backend) leftover found in this netns.
///
/// For an `ISTIO_*` chain, `rules` counts the rules in it and `jumps` the rules outside
/// `ISTIO_*` chains that jump to it. An entry for a built-in chain (`PREROUTING`, `OUTPUT`)
/// stands for Istio's rules placed there directly (exclude interfaces, TPROXY marks): `rules`
/// counts them, `jumps` is 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leftover {
    /// The family whose `-save` listed it.
    pub family: Family,
    /// The iptables variant whose `-save` listed it.
    pub variant: Variant,
    /// The iptables table (`nat`, `mangle`, ...).
    pub table: String,
    /// The chain: `ISTIO_*`, or the built-in chain holding Istio's rules.
    pub chain: String,
    /// The rules in the chain (or Istio's rules in the built-in chain).
    pub rules: usize,
    /// The rules outside `ISTIO_*` chains that jump to it; 0 for a built-in chain.
    pub jumps: usize,
}

impl Leftover {
    /// Whether this is an `ISTIO_*` chain (else Istio's rules in a built-in chain).
    pub fn is_istio_chain(&self) -> bool {
        self.chain.starts_with("ISTIO_")
    }
}

impl fmt::Display for Leftover {
    /// `IPv4 nft nat ISTIO_OUTPUT: 9 rules, 1 jump to it`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {}: {} rule(s), {} jump(s) to it",
            self.family, self.variant, self.table, self.chain, self.rules, self.jumps
        )
    }
}

/// Istio's selection (reference §1.11) in the current netns; see `detect.rs` for the one
/// deliberate difference. The error names every binary tried, why each failed, and the fix.
pub fn detect(family: Family, force: Option<Variant>) -> Result<Tool> {
    detect::detect(family, force)
}

/// Load a ruleset: per family present, `render::iptables_restore` piped into
/// `<restore> --noflush` (`--wait=30` for legacy ≥ 1.6.2). Refuses, changing nothing, when
/// `ISTIO_*` chains (or chains it would create) exist already; rolls back on a failed restore.
/// Returns the tools used.
pub fn apply(rs: &Ruleset, force: Option<Variant>) -> Result<Vec<Tool>> {
    apply::apply(rs, force)
}

/// `-save` of each family × variant whose binaries exist (missing ones are skipped); the
/// `ISTIO_*` chains, the jumps to them, and Istio's rules in built-in chains.
pub fn find_istio_leftovers() -> Result<Vec<Leftover>> {
    let families = redirect_kernel::nft::Nft::open()?.families_with_tables()?;
    Ok(leftovers::find(&families)?.leftovers)
}

/// [`find_istio_leftovers`] where the families that hold nf_tables tables (iptables-nft's)
/// are known already (`TableList::families`).
///
/// Returns also, one line each, the iptables tables that could not be read: iptables-legacy's
/// where the node has no `iptables-legacy-save` (iptables-nft's are read over netlink then).
pub fn find_istio_leftovers_in(nft_families: &[Family]) -> Result<(Vec<Leftover>, Vec<String>)> {
    let found = leftovers::find(nft_families)?;
    Ok((found.leftovers, found.unread))
}

/// Remove what [`find_istio_leftovers`] finds, one `-restore --noflush` per table (each table
/// atomically). Returns what was removed; nothing found → `Ok(empty)`.
pub fn remove_istio_leftovers() -> Result<Vec<Leftover>> {
    leftovers::remove()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_force_iptables_binary() {
        let p = |s| Variant::parse("FORCE_IPTABLES_BINARY", s);
        assert_eq!(p("").unwrap(), None);
        assert_eq!(p("legacy").unwrap(), Some(Variant::Legacy));
        assert_eq!(p("nft").unwrap(), Some(Variant::Nft));
        for bad in ["iptables", "NFT", " nft"] {
            let msg = p(bad).unwrap_err().to_string();
            assert!(msg.contains("FORCE_IPTABLES_BINARY"), "{msg}");
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("\"legacy\" or \"nft\""), "{msg}");
        }
        assert_eq!(Variant::Legacy.to_string(), "legacy");
        assert_eq!(Variant::Nft.to_string(), "nft");
    }
}
