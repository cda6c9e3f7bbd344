//! Istio's policy over capture in one namespace, on the kernel layer's job
//! (`redirect_kernel::capture`: the routes, then the table; the check): IPv6 taken from the
//! pod's own addresses as Istio does ([`apply_to_pod`], [`check_pod`]: the plugin's ADD and
//! CHECK and the repair controller share them), what a run may do over rules already there,
//! ours or Istio's ([`reconcile`]), and a clean-up that also removes Istio's rules.

mod reconcile;

pub use reconcile::{
    describe, reconcile, reconcile_iptables, resolve, Existing, Flags, IstioRuleStore, IstioRules,
    LiveIstioRules, Reconciled, ReconciledIptables, Refusal, Refused, Resolution,
};

use std::net::IpAddr;

use redirect_kernel::backend::Backend;
use redirect_kernel::capture::{self, Cleaned, Mismatch};
use redirect_kernel::routes::TproxyRouting;
use redirect_model::table::TABLE;
use redirect_model::{sidecar_routes, GroupResolver, Ruleset, ValidConfig};

use crate::error::Result;
use crate::pod_facts;

/// `cfg` with IPv6 as the pod's addresses say (`dual_stack` and an IPv6 address: Istio's
/// rule), planned and applied with its routes: the config and the ruleset applied. The
/// addresses are `known` ones (a CNI result's, IPv4 first) or, with none, the namespace's.
pub fn apply_to_pod(
    k: &dyn Backend,
    cfg: ValidConfig,
    dual_stack: bool,
    groups: &dyn GroupResolver,
    known: Option<&[IpAddr]>,
) -> Result<(ValidConfig, Ruleset)> {
    let cfg = for_pod(k, cfg, dual_stack, known)?;
    let rs = cfg.plan(groups)?;
    capture::apply_in(k, TABLE, &sidecar_routes(&cfg), &rs)?;
    Ok((cfg, rs))
}

/// `cfg` with IPv6 as the pod's addresses say, planned, then checked: the config and how the
/// namespace differs from it (empty when it matches).
pub fn check_pod(
    k: &dyn Backend,
    cfg: ValidConfig,
    dual_stack: bool,
    groups: &dyn GroupResolver,
    known: Option<&[IpAddr]>,
) -> Result<(ValidConfig, Vec<Mismatch>)> {
    let cfg = for_pod(k, cfg, dual_stack, known)?;
    let rs = cfg.plan(groups)?;
    let differences = capture::check_in(k, TABLE, &sidecar_routes(&cfg), &rs)?;
    Ok((cfg, differences))
}

fn for_pod(
    k: &dyn Backend,
    cfg: ValidConfig,
    dual_stack: bool,
    known: Option<&[IpAddr]>,
) -> Result<ValidConfig> {
    let ipv6 = match known.filter(|a| !a.is_empty()) {
        Some(addrs) => pod_facts::detect_host_address(addrs, dual_stack)?.ipv6,
        None => pod_facts::detect_host_address(&k.addresses()?, dual_stack)?.ipv6,
    };
    Ok(cfg.with_ipv6(ipv6))
}

/// What is left in a namespace, whoever put it there (`--cleanup-only --dry-run`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Our nftables table.
    pub table: bool,
    /// Istio's nftables tables and iptables chains.
    pub istio: IstioRules,
}

/// Read what `cleanup_with_istio` would remove (the routes aside).
pub fn leftovers(k: &dyn Backend, istio: &dyn IstioRuleStore) -> Result<Leftovers> {
    Ok(Leftovers {
        table: k.read_table()?.is_some(),
        istio: istio.read()?,
    })
}

/// The kernel layer's `cleanup` (our table, TPROXY routing with this mark and table, `::6` on
/// `lo`: Istio adds the same routes and address, so this clears Istio's too), then Istio's
/// nftables tables and iptables chains (`--cleanup-only`); returns what each removed.
pub fn cleanup_with_istio(
    k: &dyn Backend,
    istio: &dyn IstioRuleStore,
    routing: &TproxyRouting,
) -> Result<(Cleaned, IstioRules)> {
    let ours = capture::cleanup(k, routing)?;
    Ok((ours, istio.remove()?))
}
