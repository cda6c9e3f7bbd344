//! Before a program run in a namespace that may hold rules already (ours from an earlier run,
//! or Istio's): program, skip, or replace, as the flags allow. Two capture rule sets would both
//! act on every packet, and rules of ours for another configuration would be silently kept, so
//! both are refused unless the operator asked to replace them (`--reconcile`).

use std::cell::RefCell;
use std::fmt;

use crate::error::{Error, Result};
use crate::xtables::{self, Leftover, Tool, Variant};
use redirect_kernel::backend::Backend;
use redirect_kernel::capture;
use redirect_kernel::nft::{self, Difference, Nft};
use redirect_model::table::TABLE;
use redirect_model::{sidecar_routes, CaptureConfig, Ruleset};

/// What the operator allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    /// Replace Istio's rules, or ours for another configuration (`--reconcile`).
    pub reconcile: bool,
    /// Program even when ours are already in place (`--force-apply`).
    pub force_apply: bool,
}

/// Istio's capture rules in a namespace (or our iptables backend's, which look the same).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IstioRules {
    /// Istio's nftables tables (`inet istio-*`).
    pub nft_tables: Vec<String>,
    /// Istio's iptables chains, and its rules in built-in chains.
    pub chains: Vec<Leftover>,
}

impl IstioRules {
    /// Whether there is neither an Istio table nor an Istio chain.
    pub fn is_empty(&self) -> bool {
        self.nft_tables.is_empty() && self.chains.is_empty()
    }
}

/// Where a run reads and removes Istio's rules: [`LiveIstioRules`] for the kernel and the
/// host's iptables; a `RefCell<IstioRules>` holds them in memory for a test (removing empties
/// it).
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
        Ok(IstioRules {
            nft_tables: crate::tables::istio_tables_in(&list),
            chains: xtables::find_istio_leftovers_in(&list.families())?,
        })
    }

    fn remove(&self) -> Result<IstioRules> {
        Ok(IstioRules {
            nft_tables: crate::tables::remove_istio_tables(self.0)?,
            chains: xtables::remove_istio_leftovers()?,
        })
    }
}

impl IstioRuleStore for RefCell<IstioRules> {
    fn read(&self) -> Result<IstioRules> {
        Ok(self.borrow().clone())
    }

    fn remove(&self) -> Result<IstioRules> {
        Ok(self.take())
    }
}

/// What the namespace holds before the run: ours, Istio's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    /// Our table against the plan: `None` when there is no table of ours, empty when equal.
    pub ours: Option<Vec<Difference>>,
    /// Istio's tables and chains.
    pub istio: IstioRules,
}

impl Existing {
    /// One read of our table (compared with `rs`), and Istio's tables and chains.
    pub fn read(k: &dyn Backend, istio: &dyn IstioRuleStore, rs: &Ruleset) -> Result<Existing> {
        // A pod's first run finds no table: skip building the expected state to compare with.
        let ours = k.read_table()?.map(|t| nft::compare(rs, Some(&t)));
        Ok(Existing {
            ours,
            istio: istio.read()?,
        })
    }
}

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Ours are in place and equal, and nothing else is: the routes beside them are ensured.
    Skip,
    /// Program the plan (creating our table, or replacing it atomically), then remove Istio's
    /// when there are any, so no packet goes uncaptured in between.
    Apply {
        /// A table of ours is there already, and is replaced.
        replaces_ours: bool,
        /// Istio's rules are there, and go once ours are in place.
        removes_istio: bool,
    },
}

/// Why a run would not program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Istio's rules are there and `--reconcile` was not given.
    IstioRules(IstioRules),
    /// Our rules for another configuration are there, and neither flag was given.
    OursDiffer {
        /// How our table differs from the plan.
        differences: Vec<Difference>,
    },
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
                "this namespace already holds Istio's capture rules (nft tables {:?}; iptables chains {}): both sets of rules would act on every packet. Replace them with ours (redirect-init --reconcile; the library's Foreign::Replace), or remove them (redirect-init --cleanup-only)",
                istio.nft_tables,
                describe(&istio.chains)
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
            Refusal::IstioRules(r) => Some(r),
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

/// What a run of the nftables backend does about what it found, as the flags allow.
pub fn resolve(found: &Existing, flags: Flags) -> Result<Resolution, Refusal> {
    let istio = !found.istio.is_empty();
    if istio && !flags.reconcile {
        return Err(Refusal::IstioRules(found.istio.clone()));
    }
    match &found.ours {
        Some(d) if d.is_empty() && !flags.force_apply && !istio => Ok(Resolution::Skip),
        Some(d) if !d.is_empty() && !flags.reconcile && !flags.force_apply => {
            Err(Refusal::OursDiffer {
                differences: d.clone(),
            })
        }
        ours => Ok(Resolution::Apply {
            replaces_ours: ours.is_some(),
            removes_istio: istio,
        }),
    }
}

/// What `reconcile` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconciled {
    /// What the run decided: skip (the routes only) or apply.
    pub resolution: Resolution,
    /// Istio's tables and chains removed after ours were in place.
    pub removed_istio: IstioRules,
}

/// Read what is there, resolve what to do, and program `rs` (planned from `cfg`) with the nftables
/// backend; the routes beside the rules are ensured either way, and first (see
/// `redirect_kernel::capture::apply`), so a run that finds its rules in place completes the routes a killed run
/// left out.
pub fn reconcile(
    k: &dyn Backend,
    istio: &dyn IstioRuleStore,
    cfg: &CaptureConfig,
    rs: &Ruleset,
    flags: Flags,
) -> Result<Reconciled> {
    let found = Existing::read(k, istio, rs)?;
    let resolution = resolve(&found, flags).map_err(Refused)?;
    match resolution {
        Resolution::Apply { .. } => {
            capture::apply_in(k, TABLE, &sidecar_routes(cfg), rs).map_err(Error::from)?;
        }
        Resolution::Skip => capture::apply_routes(k, &sidecar_routes(cfg)).map_err(Error::from)?,
    }
    let removed_istio = match resolution {
        // Ours are in place first, so no packet goes uncaptured while Istio's go.
        Resolution::Apply {
            removes_istio: true,
            ..
        } => istio.remove()?,
        _ => IstioRules::default(),
    };
    Ok(Reconciled {
        resolution,
        removed_istio,
    })
}

/// What `reconcile_iptables` did.
#[derive(Clone, Debug)]
pub struct ReconciledIptables {
    /// The binaries that loaded each family's rules.
    pub tools: Vec<Tool>,
    /// Istio's chains removed (under `--reconcile`) before ours were loaded.
    pub removed_istio_chains: Vec<Leftover>,
    /// Our nftables table, removed under `--reconcile`.
    pub removed_our_table: bool,
}

/// The iptables backend's run: Istio's chains are refused (iptables-restore cannot create them
/// again) unless `--reconcile` removes them first, with our nftables table.
pub fn reconcile_iptables(
    k: &dyn Backend,
    cfg: &CaptureConfig,
    rs: &Ruleset,
    flags: Flags,
    force_binary: Option<Variant>,
) -> Result<ReconciledIptables> {
    let chains = xtables::find_istio_leftovers()?;
    if !chains.is_empty() && !flags.reconcile {
        return Err(Refused(Refusal::IstioChains { chains }).into());
    }
    let removed_istio_chains = if chains.is_empty() {
        Vec::new()
    } else {
        xtables::remove_istio_leftovers()?;
        chains
    };
    let removed_our_table = flags.reconcile && k.remove_table().map_err(Error::from)?;
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

    fn chain() -> Leftover {
        Leftover {
            family: Family::V4,
            variant: Variant::Nft,
            table: "nat".into(),
            chain: "ISTIO_OUTPUT".into(),
            rules: 3,
            jumps: 1,
        }
    }

    fn found(ours: Option<Vec<Difference>>, istio: bool) -> Existing {
        Existing {
            ours,
            istio: IstioRules {
                nft_tables: Vec::new(),
                chains: if istio { vec![chain()] } else { Vec::new() },
            },
        }
    }

    const NONE: Flags = Flags {
        reconcile: false,
        force_apply: false,
    };
    const RECONCILE: Flags = Flags {
        reconcile: true,
        force_apply: false,
    };
    const FORCE: Flags = Flags {
        reconcile: false,
        force_apply: true,
    };

    fn apply(replaces_ours: bool, removes_istio: bool) -> Result<Resolution, Refusal> {
        Ok(Resolution::Apply {
            replaces_ours,
            removes_istio,
        })
    }

    #[test]
    fn a_first_run_programs() {
        assert_eq!(resolve(&found(None, false), NONE), apply(false, false));
    }

    #[test]
    fn equal_rules_are_left_alone_unless_forced() {
        let equal = found(Some(Vec::new()), false);
        assert_eq!(resolve(&equal, NONE), Ok(Resolution::Skip));
        assert_eq!(resolve(&equal, RECONCILE), Ok(Resolution::Skip));
        assert_eq!(resolve(&equal, FORCE), apply(true, false));
    }

    #[test]
    fn our_rules_for_another_config_need_a_flag() {
        let differ = found(Some(vec![Difference::TableMissing]), false);
        assert!(matches!(
            resolve(&differ, NONE),
            Err(Refusal::OursDiffer { differences }) if differences.len() == 1
        ));
        assert_eq!(resolve(&differ, RECONCILE), apply(true, false));
        assert_eq!(resolve(&differ, FORCE), apply(true, false));
    }

    #[test]
    fn istio_rules_need_reconcile_even_when_forced() {
        for ours in [None, Some(Vec::new())] {
            let f = found(ours.clone(), true);
            assert!(matches!(resolve(&f, NONE), Err(Refusal::IstioRules(_))));
            assert!(matches!(resolve(&f, FORCE), Err(Refusal::IstioRules(_))));
            // Equal rules of ours are programmed again before Istio's go.
            assert_eq!(resolve(&f, RECONCILE), apply(ours.is_some(), true));
        }
    }

    #[test]
    fn refusals_name_the_flag_and_the_chains() {
        let r = Refusal::IstioChains {
            chains: vec![chain()],
        }
        .to_string();
        assert!(r.contains("nft/IPv4/nat/ISTIO_OUTPUT"), "{r}");
        assert!(r.contains("--reconcile"), "{r}");
        assert_eq!(describe(&[]), "none");
    }
}
