//! A sidecar's capture in a pod as Istio's programs run it: applied and checked with the
//! routes the pod's addresses call for ([`apply_to_pod`], [`check_pod`]), reconciled with
//! rules Istio's own `istio-iptables` left behind ([`reconcile`], [`reconcile_iptables`]),
//! those leftovers found ([`leftovers`]) and cleaned up with ours ([`cleanup_with_istio`]).

pub use redirect_istio::capture::{
    apply_to_pod, check_pod, cleanup_with_istio, describe, leftovers, reconcile,
    reconcile_iptables, resolve, Existing, Flags, IstioRuleStore, IstioRules, Leftovers,
    LiveIstioRules, ReconcileError, Reconciled, ReconciledIptables, Refusal, Resolution,
};
pub use redirect_istio::tables::{istio_tables, remove_istio_tables};
pub use redirect_istio::xtables::{Leftover, Variant};
pub use redirect_istio::TPROXY_ROUTING;
