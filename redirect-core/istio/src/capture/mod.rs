//! Istio's rules as the one apply (`redirect_core::Namespace::apply_with`) meets them: found
//! and removed ([`IstioRuleStore`], [`LiveIstioRules`]), described ([`describe`]), and why an
//! apply refused ([`Refused`]); and the iptables backend's run over them
//! ([`reconcile_iptables`]).

mod reconcile;

pub use reconcile::{
    describe, reconcile_iptables, IstioRuleStore, IstioRules, LiveIstioRules, ReconciledIptables,
    Refusal, Refused,
};
