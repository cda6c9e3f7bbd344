//! Istio's rules in a namespace, found and removed, and why an apply over what a namespace
//! holds refused: two capture rule sets would both act on every packet, and rules of ours for
//! another configuration would be silently kept, so both are refused unless the caller asked
//! to replace them (redirect-init's `--reconcile`). The policy itself is the facade's
//! `Namespace::apply_with`; the iptables backend's own run is [`reconcile_iptables`].

use std::fmt;

use crate::error::{Error, Result};
use crate::xtables::{self, Leftover, Tool, Variant};
use redirect_kernel::backend::Backend;
use redirect_kernel::capture;
use redirect_kernel::nft::{Difference, Nft};
use redirect_model::{sidecar_routes, CaptureConfig, Ruleset};

/// Istio's capture rules in a namespace (or our iptables backend's, which look the same).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IstioRules {
    /// Istio's nftables tables (`inet istio-*`).
    pub nft_tables: Vec<String>,
    /// Istio's iptables chains, and its rules in built-in chains.
    pub chains: Vec<Leftover>,
    /// iptables tables that are here but could not be read, one line each: iptables-legacy's
    /// on a node without `iptables-legacy-save` (they may hold Istio's rules; they cannot be
    /// removed either).
    pub unread: Vec<String>,
}

impl IstioRules {
    /// Whether there is neither an Istio table nor an Istio chain, nor a table that could not
    /// be read.
    pub fn is_empty(&self) -> bool {
        self.nft_tables.is_empty() && self.chains.is_empty() && self.unread.is_empty()
    }
}

impl fmt::Display for IstioRules {
    /// `nft tables [..]; iptables chains ..; unread: ..`, the parts that are there.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.nft_tables.is_empty() {
            parts.push(format!("nft tables {}", self.nft_tables.join(", ")));
        }
        if !self.chains.is_empty() {
            parts.push(format!("iptables chains {}", describe(&self.chains)));
        }
        if !self.unread.is_empty() {
            parts.push(self.unread.join("; "));
        }
        if parts.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&parts.join("; "))
    }
}

/// Where a run reads and removes Istio's rules: [`LiveIstioRules`] for the kernel and the
/// host's iptables; a test's store holds them in memory (`redirect_core::testing::FakeForeign`).
pub trait IstioRuleStore {
    /// Istio's tables and chains as they are now.
    fn read(&self) -> Result<IstioRules>;
    /// Remove them all; returns what was removed.
    fn remove(&self) -> Result<IstioRules>;
}

/// Istio's rules in the namespace of an nf_tables handle (the run's own: one socket for the
/// whole run): its nft tables over netlink, its iptables chains with the host's
/// `iptables-save` (run in the calling thread's namespace, which must be the handle's). One
/// table dump tells both where to look.
pub struct LiveIstioRules<'a>(
    /// The run's nf_tables handle, whose table dump lists Istio's tables and chains.
    pub &'a Nft,
);

impl IstioRuleStore for LiveIstioRules<'_> {
    fn read(&self) -> Result<IstioRules> {
        let list = self.0.tables()?;
        let (chains, unread) = xtables::find_istio_leftovers_in(&list.families())?;
        Ok(IstioRules {
            nft_tables: crate::tables::istio_tables_in(&list),
            chains,
            unread,
        })
    }

    fn remove(&self) -> Result<IstioRules> {
        Ok(IstioRules {
            nft_tables: crate::tables::remove_istio_tables(self.0)?,
            chains: xtables::remove_istio_leftovers()?,
            unread: Vec::new(),
        })
    }
}

/// Why a run would not program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Istio's rules are there and `--reconcile` was not given.
    IstioRules(Box<IstioRules>),
    /// Our rules for another configuration are there, and neither flag was given.
    OursDiffer {
        /// How our table differs from the plan.
        differences: Vec<Difference>,
    },
    /// Istio's rules were to be replaced, but some cannot be read or removed here (iptables-legacy
    /// tables with no binary): ours were not applied, theirs are as they were.
    CannotReplace(Box<IstioRules>),
    /// The iptables backend finds `ISTIO_*` chains, which iptables-restore cannot create again.
    IstioChains {
        /// The chains (and Istio's rules in built-in chains) found.
        chains: Vec<Leftover>,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::IstioRules(istio) => write!(
                f,
                "this namespace already holds Istio's capture rules (nft tables {:?}; iptables chains {}{}): both sets of rules would act on every packet. Replace them with ours (redirect-init --reconcile; the library's Foreign::Replace), or remove them (redirect-init --cleanup-only)",
                istio.nft_tables,
                describe(&istio.chains),
                istio.unread.iter().map(|u| format!("; {u}")).collect::<String>()
            ),
            Refusal::OursDiffer { differences } => {
                // One line: it is logged, and a log line is one event.
                let shown: Vec<String> =
                    differences.iter().take(10).map(|d| d.to_string()).collect();
                let more = match differences.len().saturating_sub(shown.len()) {
                    0 => String::new(),
                    n => format!("; and {n} more"),
                };
                write!(
                    f,
                    "this namespace already has our rules for another configuration ({} differences: {}{more}). Replace them atomically (redirect-init --reconcile or --force-apply; the library's Ours::Replace)",
                    differences.len(),
                    shown.join("; ")
                )
            }
            Refusal::CannotReplace(istio) => write!(
                f,
                "this namespace holds capture rules that cannot be replaced here ({istio}): nothing was changed, they still capture. Put iptables-legacy-save and iptables-legacy-restore on the node's PATH to replace them, or leave them (the library's Foreign::Keep; the agent's ADOPT_ISTIO=keep)"
            ),
            Refusal::IstioChains { chains } => write!(
                f,
                "ISTIO_* chains exist already ({}); iptables-restore cannot create them again. Rerun with --reconcile to replace them, or --cleanup-only to remove them",
                describe(chains)
            ),
        }
    }
}

/// Why a run changed nothing: what it found needs another policy (a flag it was not given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub Refusal);

impl Refused {
    /// The foreign rules that were found, when they are why.
    pub fn foreign(&self) -> Option<&IstioRules> {
        match &self.0 {
            Refusal::IstioRules(r) | Refusal::CannotReplace(r) => Some(r),
            _ => None,
        }
    }

    /// How our table differs from the capture asked for, when that is why.
    pub fn ours_differ(&self) -> Option<&[Difference]> {
        match &self.0 {
            Refusal::OursDiffer { differences } => Some(differences),
            _ => None,
        }
    }

    /// Istio's iptables chains that the iptables backend cannot create again, when that is
    /// why.
    pub fn chains(&self) -> Option<&[Leftover]> {
        match &self.0 {
            Refusal::IstioChains { chains } => Some(chains),
            _ => None,
        }
    }
}

/// Istio's chains as one line for a message: `IPv4/nft/nat/ISTIO_OUTPUT, ...`, or `none`.
pub fn describe(chains: &[Leftover]) -> String {
    if chains.is_empty() {
        return "none".into();
    }
    chains
        .iter()
        .map(|x| format!("{}/{}/{}/{}", x.variant, x.family, x.table, x.chain))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `reconcile_iptables` did.
#[derive(Clone, Debug)]
pub struct ReconciledIptables {
    /// The binaries that loaded each family's rules.
    pub tools: Vec<Tool>,
    /// Istio's chains removed (`replace`) before ours were loaded.
    pub removed_istio_chains: Vec<Leftover>,
    /// Our nftables table, removed (`replace`).
    pub removed_our_table: bool,
}

/// The iptables backend's run: Istio's chains are refused (iptables-restore cannot create them
/// again) unless `replace` (redirect-init's `--reconcile`) removes them first, with our
/// nftables table.
pub fn reconcile_iptables(
    k: &dyn Backend,
    cfg: &CaptureConfig,
    rs: &Ruleset,
    replace: bool,
    force_binary: Option<Variant>,
) -> Result<ReconciledIptables> {
    let chains = xtables::find_istio_leftovers()?;
    if !chains.is_empty() && !replace {
        return Err(Refused(Refusal::IstioChains { chains }).into());
    }
    let removed_istio_chains = if chains.is_empty() {
        Vec::new()
    } else {
        xtables::remove_istio_leftovers()?;
        chains
    };
    let removed_our_table = replace && k.remove_table().map_err(Error::from)?;
    let tools = capture::routes_then(k, &sidecar_routes(cfg), || xtables::apply(rs, force_binary))?;
    Ok(ReconciledIptables {
        tools,
        removed_istio_chains,
        removed_our_table,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redirect_model::Family;

    #[test]
    fn refusals_name_the_flag_and_the_chains() {
        let chain = Leftover {
            family: Family::V4,
            variant: Variant::Nft,
            table: "nat".into(),
            chain: "ISTIO_OUTPUT".into(),
            rules: 3,
            jumps: 1,
        };
        let r = Refusal::IstioChains {
            chains: vec![chain],
        }
        .to_string();
        assert!(r.contains("nft/IPv4/nat/ISTIO_OUTPUT"), "{r}");
        assert!(r.contains("--reconcile"), "{r}");
        assert_eq!(describe(&[]), "none");
    }
}
