//! The whole job for one namespace: plan, program the table, and the routes Istio adds beside
//! its rules (TPROXY policy routing when inbound is tproxied; `::6` on `lo` with IPv6); check
//! what is there against a config (`check`); decide what a run may do over rules already there
//! (`reconcile`); and clean up.

mod check;
mod reconcile;

pub use check::{check, check_in, compare, compare_uncaptured, Mismatch, RoutesSeen};
pub use reconcile::{
    decide, describe, reconcile, reconcile_iptables, Decision, Flags, Found, IstioRules,
    ReconcileError, Reconciled, ReconciledIptables, Refusal,
};

use std::path::Path;

use crate::error::Result;
use redirect_kernel::routes::{self, TproxyRouting};
use redirect_model::GroupResolver;
use redirect_model::{CaptureConfig, InterceptionMode};
use redirect_model::{Family, Ruleset};

/// The TPROXY mark and route table a config names, whether or not it uses them.
pub fn routing_of(cfg: &CaptureConfig) -> TproxyRouting {
    TproxyRouting {
        mark: cfg.tproxy_mark,
        table: cfg.tproxy_route_table,
    }
}

/// The TPROXY routing a config needs, if any (Istio adds it only with inbound capture).
pub fn tproxy_routing(cfg: &CaptureConfig) -> Option<TproxyRouting> {
    (cfg.mode == InterceptionMode::Tproxy && !cfg.inbound_ports.is_none()).then(|| routing_of(cfg))
}

fn families(cfg: &CaptureConfig) -> Vec<Family> {
    if cfg.ipv6 {
        vec![Family::V4, Family::V6]
    } else {
        vec![Family::V4]
    }
}

/// Plan and apply in the calling thread's namespace. The routes go first, then the rules
/// (atomically): the routes are harmless without the rules (nothing marks packets for them),
/// so a process killed at any point never leaves rules whose TPROXY routing is missing, and a
/// retry converges (both steps are idempotent).
pub fn apply(cfg: &CaptureConfig, groups: &dyn GroupResolver) -> Result<Ruleset> {
    let rs = redirect_model::plan_with(cfg, groups)?;
    routes_then(cfg, || Ok(redirect_kernel::nft::apply(&rs)?))?;
    Ok(rs)
}

/// Ensure the routes `cfg` needs, then run `rules`. When `rules` fails, the routes this call
/// added are removed again (best effort), so a failed apply leaves the namespace as it was.
pub(crate) fn routes_then<T>(cfg: &CaptureConfig, rules: impl FnOnce() -> Result<T>) -> Result<T> {
    let missing = MissingRoutes::read(cfg)?;
    apply_routes(cfg)?;
    rules().inspect_err(|_| missing.remove(cfg))
}

/// The routes a config needs that a namespace lacks entirely (partial ones are not ours to
/// take away).
struct MissingRoutes {
    tproxy: Vec<Family>,
    lo_v6: bool,
}

impl MissingRoutes {
    /// Read only what `cfg` needs: nothing at all for Istio's default REDIRECT over IPv4.
    fn read(cfg: &CaptureConfig) -> Result<MissingRoutes> {
        let mut tproxy = Vec::new();
        if let Some(r) = tproxy_routing(cfg) {
            for family in families(cfg) {
                if routes::read_tproxy(&r, family)?.is_absent() {
                    tproxy.push(family);
                }
            }
        }
        Ok(MissingRoutes {
            tproxy,
            lo_v6: cfg.ipv6 && !routes::has_lo_v6_inbound_addr()?,
        })
    }

    fn remove(&self, cfg: &CaptureConfig) {
        if let (Some(r), false) = (tproxy_routing(cfg), self.tproxy.is_empty()) {
            let _ = routes::remove_tproxy(&r, &self.tproxy);
        }
        if self.lo_v6 {
            let _ = routes::remove_lo_v6_inbound_addr();
        }
    }
}

/// The routes beside the rules, whatever backend programmed the rules: `::6` on `lo` with
/// IPv6, TPROXY policy routing with tproxied inbound capture.
pub fn apply_routes(cfg: &CaptureConfig) -> Result<()> {
    if cfg.ipv6 {
        routes::ensure_lo_v6_inbound_addr()?;
    }
    if let Some(r) = tproxy_routing(cfg) {
        routes::apply_tproxy(&r, &families(cfg))?;
    }
    Ok(())
}

/// What `cleanup` found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Our nftables table.
    pub table: bool,
    /// The TPROXY `ip rule` / local route, per family that had any.
    pub tproxy: Vec<Family>,
    /// `::6/128` on `lo`.
    pub lo_v6: bool,
}

/// Remove everything capture may have left, whatever config put it there: our table, TPROXY
/// routing with this mark and table in both families, and `::6` on `lo`. Istio adds the same
/// routes and address, so this also clears Istio's.
pub fn cleanup(routing: &TproxyRouting) -> Result<Cleaned> {
    let mut done = Cleaned {
        table: redirect_kernel::nft::remove()?,
        ..Cleaned::default()
    };
    for family in [Family::V4, Family::V6] {
        if !routes::read_tproxy(routing, family)?.is_absent() {
            routes::remove_tproxy(routing, &[family])?;
            done.tproxy.push(family);
        }
    }
    if routes::has_lo_v6_inbound_addr()? {
        routes::remove_lo_v6_inbound_addr()?;
        done.lo_v6 = true;
    }
    Ok(done)
}

/// What is left in a namespace, whoever put it there (`--cleanup-only --dry-run`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Our nftables table.
    pub table: bool,
    pub istio: IstioRules,
}

/// Read what `cleanup_with_istio` would remove (the routes aside).
pub fn leftovers() -> Result<Leftovers> {
    Ok(Leftovers {
        table: redirect_kernel::nft::read_back()?.is_some(),
        istio: IstioRules::read()?,
    })
}

/// `cleanup`, then Istio's nftables tables and iptables chains (`--cleanup-only`); returns
/// what each removed.
pub fn cleanup_with_istio(routing: &TproxyRouting) -> Result<(Cleaned, IstioRules)> {
    let ours = cleanup(routing)?;
    Ok((ours, IstioRules::remove()?))
}

/// Remove our table and the routes this config would have added.
pub fn remove(cfg: &CaptureConfig) -> Result<()> {
    redirect_kernel::nft::remove()?;
    if let Some(r) = tproxy_routing(cfg) {
        routes::remove_tproxy(&r, &families(cfg))?;
    }
    if cfg.ipv6 {
        routes::remove_lo_v6_inbound_addr()?;
    }
    Ok(())
}

/// `apply` inside the namespace at `netns`.
pub fn apply_in(
    netns: &Path,
    cfg: &CaptureConfig,
    groups: &(dyn GroupResolver + Sync),
) -> Result<Ruleset> {
    redirect_kernel::netns::run_in(netns, || apply(cfg, groups))?
}

/// `remove` inside the namespace at `netns`.
pub fn remove_in(netns: &Path, cfg: &CaptureConfig) -> Result<()> {
    redirect_kernel::netns::run_in(netns, || remove(cfg))?
}
