//! redirect-core: a pod's traffic capture for a service-mesh sidecar, compatible with Istio.
//!
//! `CaptureConfig` (what the mesh wants) → `plan()` → `Ruleset` (backend-neutral) → the nftables
//! netlink backend (`nft`), the renderers (`render`) and the evaluator (`eval`). `capture` is the
//! job on one namespace (apply, check, reconcile, clean up), `routes` the routing beside the
//! rules, `netns` the way into a pod's namespace, `validation` Istio's probe and its diagnosis,
//! and `istio` everything that is Istio's rather than the model's (its command line, annotations,
//! quirks and iptables rules).
//!
//! The modules of the model are private: what the programs use of them is re-exported here.
//! docs/architecture.md has the map and which layer may import which.

// The model: what the mesh wants, planned into a backend-neutral ruleset.
mod config;
mod plan;
mod ruleset;

// Program support.
mod alloc;
mod env_vars;
mod error;
mod sockopt;

// Policy: the job on one namespace.
pub mod capture;
// Istio compatibility, on top of the model.
pub mod istio;
// Backends, renderers and the evaluator of the model.
pub mod eval;
pub mod nft;
pub mod render;
// The kernel beside the rules.
pub mod netns;
pub mod routes;
// Istio's validation probe and its diagnosis.
pub mod validation;
// The programs' one log subscriber and line format.
pub mod logging;

pub use config::{
    join, parse, CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection, DNS_AGENT_PORT,
    MAX_OWNER_GROUPS, OUTBOUND_MARK,
};
pub use env_vars::check_utf8 as check_env_utf8;
pub use error::{Error, Result};
pub use plan::{plan, plan_with, GroupResolver, SystemGroups};
pub use ruleset::{
    Action, AddrMatch, Chain, ChainKind, CtStates, Family, Hook, HookedChains, Match, NamedSet,
    PortMatch, Rule, Ruleset, SetElements, Stage, L4,
};
pub use sockopt::original_dst;
