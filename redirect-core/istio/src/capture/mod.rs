//! The whole job for one namespace, through a [`Backend`] (the kernel, or a fake in tests):
//! plan, program the table, and the routes Istio adds beside its rules (TPROXY policy routing
//! when inbound is tproxied; `::6` on `lo` with IPv6); check what is there against a config
//! (`check`); decide what a run may do over rules already there (`reconcile`); and clean up.
//! [`apply_to_pod`] and [`check_pod`] first take IPv6 from the pod's own addresses, as Istio
//! does: the plugin's ADD and CHECK and the repair controller share them.

mod check;
mod reconcile;

pub use check::{check, compare, compare_uncaptured, Mismatch, RoutesSeen};
pub use reconcile::{
    decide, describe, reconcile, reconcile_iptables, Decision, Flags, Found, IstioRuleStore,
    IstioRules, LiveIstioRules, ReconcileError, Reconciled, ReconciledIptables, Refusal,
};

use redirect_kernel::backend::Backend;
use redirect_kernel::routes::TproxyRouting;
use redirect_model::GroupResolver;
use redirect_model::{CaptureConfig, InterceptionMode, ValidConfig};
use redirect_model::{Family, Ruleset};

use crate::error::Result;
use crate::pod_facts;

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

/// Plan and apply. The routes go first, then the rules (atomically): the routes are harmless
/// without the rules (nothing marks packets for them), so a process killed at any point never
/// leaves rules whose TPROXY routing is missing, and a retry converges (both steps are
/// idempotent).
pub fn apply(k: &dyn Backend, cfg: &CaptureConfig, groups: &dyn GroupResolver) -> Result<Ruleset> {
    let rs = redirect_model::plan_with(cfg, groups)?;
    routes_then(k, cfg, || Ok(k.apply(&rs)?))?;
    Ok(rs)
}

/// [`apply`] of a config validated already.
pub fn apply_valid(
    k: &dyn Backend,
    cfg: &ValidConfig,
    groups: &dyn GroupResolver,
) -> Result<Ruleset> {
    let rs = redirect_model::plan_valid(cfg, groups)?;
    routes_then(k, cfg, || Ok(k.apply(&rs)?))?;
    Ok(rs)
}

/// `cfg` with IPv6 as the pod's addresses say (`dual_stack` and an IPv6 address: Istio's
/// rule), then [`apply`]: the config and the ruleset applied.
pub fn apply_to_pod(
    k: &dyn Backend,
    cfg: ValidConfig,
    dual_stack: bool,
    groups: &dyn GroupResolver,
) -> Result<(ValidConfig, Ruleset)> {
    let cfg = for_pod(k, cfg, dual_stack)?;
    let rs = apply_valid(k, &cfg, groups)?;
    Ok((cfg, rs))
}

/// `cfg` with IPv6 as the pod's addresses say, planned, then [`check`]: the config and how the
/// namespace differs from it (empty when it matches).
pub fn check_pod(
    k: &dyn Backend,
    cfg: ValidConfig,
    dual_stack: bool,
    groups: &dyn GroupResolver,
) -> Result<(ValidConfig, Vec<Mismatch>)> {
    let cfg = for_pod(k, cfg, dual_stack)?;
    let rs = redirect_model::plan_valid(&cfg, groups)?;
    let differences = check(k, &cfg, &rs)?;
    Ok((cfg, differences))
}

fn for_pod(k: &dyn Backend, cfg: ValidConfig, dual_stack: bool) -> Result<ValidConfig> {
    let ipv6 = pod_facts::detect_host_address(&k.addresses()?, dual_stack)?.ipv6;
    Ok(cfg.with_ipv6(ipv6))
}

/// Ensure the routes `cfg` needs, then run `rules`. When `rules` fails, the routes this call
/// added are removed again (best effort), so a failed apply leaves the namespace as it was.
pub(crate) fn routes_then<T>(
    k: &dyn Backend,
    cfg: &CaptureConfig,
    rules: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let missing = MissingRoutes::read(k, cfg)?;
    apply_routes(k, cfg)?;
    rules().inspect_err(|_| missing.remove(k, cfg))
}

/// The routes a config needs that a namespace lacks entirely (partial ones are not ours to
/// take away).
struct MissingRoutes {
    tproxy: Vec<Family>,
    lo_v6: bool,
}

impl MissingRoutes {
    /// Read only what `cfg` needs: nothing at all for Istio's default REDIRECT over IPv4.
    fn read(k: &dyn Backend, cfg: &CaptureConfig) -> Result<MissingRoutes> {
        let mut tproxy = Vec::new();
        if let Some(r) = tproxy_routing(cfg) {
            for family in families(cfg) {
                if k.read_tproxy(&r, family)?.is_absent() {
                    tproxy.push(family);
                }
            }
        }
        Ok(MissingRoutes {
            tproxy,
            lo_v6: cfg.ipv6 && !k.has_lo_v6()?,
        })
    }

    fn remove(&self, k: &dyn Backend, cfg: &CaptureConfig) {
        if let (Some(r), false) = (tproxy_routing(cfg), self.tproxy.is_empty()) {
            let _ = k.remove_tproxy(&r, &self.tproxy);
        }
        if self.lo_v6 {
            let _ = k.remove_lo_v6();
        }
    }
}

/// The routes beside the rules, whatever backend programmed the rules: `::6` on `lo` with
/// IPv6, TPROXY policy routing with tproxied inbound capture.
pub fn apply_routes(k: &dyn Backend, cfg: &CaptureConfig) -> Result<()> {
    if cfg.ipv6 {
        k.ensure_lo_v6()?;
    }
    if let Some(r) = tproxy_routing(cfg) {
        k.apply_tproxy(&r, &families(cfg))?;
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
pub fn cleanup(k: &dyn Backend, routing: &TproxyRouting) -> Result<Cleaned> {
    let mut done = Cleaned {
        table: k.remove_table()?,
        ..Cleaned::default()
    };
    for family in [Family::V4, Family::V6] {
        if !k.read_tproxy(routing, family)?.is_absent() {
            k.remove_tproxy(routing, &[family])?;
            done.tproxy.push(family);
        }
    }
    if k.has_lo_v6()? {
        k.remove_lo_v6()?;
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
pub fn leftovers(k: &dyn Backend, istio: &dyn IstioRuleStore) -> Result<Leftovers> {
    Ok(Leftovers {
        table: k.read_table()?.is_some(),
        istio: istio.read()?,
    })
}

/// `cleanup`, then Istio's nftables tables and iptables chains (`--cleanup-only`); returns
/// what each removed.
pub fn cleanup_with_istio(
    k: &dyn Backend,
    istio: &dyn IstioRuleStore,
    routing: &TproxyRouting,
) -> Result<(Cleaned, IstioRules)> {
    let ours = cleanup(k, routing)?;
    Ok((ours, istio.remove()?))
}

/// Remove our table and the routes this config would have added.
pub fn remove(k: &dyn Backend, cfg: &CaptureConfig) -> Result<()> {
    k.remove_table()?;
    if let Some(r) = tproxy_routing(cfg) {
        k.remove_tproxy(&r, &families(cfg))?;
    }
    if cfg.ipv6 {
        k.remove_lo_v6()?;
    }
    Ok(())
}
