//! redirect-model: what a pod's traffic capture is, without touching anything.
//!
//! `CaptureConfig` (what the mesh wants) → [`ValidConfig`] (validated once) →
//! [`ValidConfig::plan`] → [`Ruleset`] (backend-neutral
//! chains, rules and sets, following Istio's rule generation step by step) → the renderings
//! ([`render`]: an `nft -f` script, `iptables-restore` input) and the evaluator ([`eval`]:
//! where one flow ends, and through which rules). [`table`] is the layout of our one nftables
//! table (its name, chain names, the shape of long lists) that the kernel crate encodes.
//!
//! No I/O: group names are resolved by a [`GroupResolver`] the caller passes (the host's group
//! database lives in `redirect-kernel`). No unsafe code.
//!
//! The public surface:
//! - the config: [`CaptureConfig`], [`ValidConfig`] (validated once, planned without a second
//!   check), [`DnsCapture`], [`GroupRef`], [`InterceptionMode`], [`Selection`],
//!   [`DNS_AGENT_PORT`], [`OUTBOUND_MARK`], [`MAX_OWNER_GROUPS`], and Istio's string forms of
//!   its lists ([`parse`], [`join`](mod@join));
//! - the plan: [`ValidConfig::plan`] (the one way to plan), [`GroupResolver`],
//!   [`NoGroupDatabase`], and the names the plan gives chains ([`chains`]) and sets ([`sets`]);
//! - ambient: [`AmbientConfig`] (a pod's in-pod rules, [`ambient`]) and [`HostProbeConfig`]
//!   (the host's probe SNAT, [`host_probe`]);
//! - [`Capture`]: any of the three kinds as one value, with its plan, table and routes
//!   ([`Routes`], [`PolicyRouting`]);
//! - the ruleset types ([`Ruleset`] and its parts);
//! - [`render`], [`eval`], [`table`];
//! - [`Error`] and [`Result`].

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod capture;
mod config;
mod error;
mod plan;
mod ruleset;

pub mod eval;
pub mod render;
pub mod table;

pub use capture::{
    sidecar_routes, sidecar_routing, Capture, PolicyRouting, Routes, AMBIENT_ROUTING,
};
pub use config::{
    join, parse, CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection, ValidConfig,
    DNS_AGENT_PORT, MAX_OWNER_GROUPS, OUTBOUND_MARK,
};
pub use error::{Error, IdKind, Result};
pub use plan::ambient::{self, AmbientConfig};
pub use plan::host_probe::{self, HostProbeConfig};
pub use plan::{chains, sets, GroupResolver, NoGroupDatabase};
pub use ruleset::{
    Action, AddrMatch, Chain, ChainKind, Count, CountedPath, CtStates, Family, Hook, HookedChains,
    Match, NamedSet, PathCounts, PortMatch, Rule, Ruleset, SetElements, Stage, L4,
};
