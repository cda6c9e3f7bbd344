//! redirect-core: a pod's traffic captured for its service-mesh sidecar, over netlink, in one
//! nftables table per network namespace, written in one atomic batch.
//!
//! ```no_run
//! use redirect_core::{CaptureConfig, Namespace, SystemGroups};
//!
//! fn main() -> Result<(), redirect_core::Error> {
//!     let mut config = CaptureConfig::istio_sidecar_default();
//!     config.inbound_exclude_ports.push(8080); // inbound 8080 reaches the app directly
//!     let config = config.validated()?;
//!     println!("{}", redirect_core::render::nft_script(&config.plan(&SystemGroups)?));
//!     let pod = Namespace::open("/run/netns/pod")?;
//!     pod.apply(&config)?;
//!     assert!(pod.check(&config)?.is_empty());
//!     Ok(())
//! }
//! ```
//!
//! The pipeline: a [`CaptureConfig`] (every parameter of Istio's `istio-iptables`, typed;
//! [`CaptureConfig::istio_sidecar_default`] is what Istio's injector asks for) is validated
//! once into a [`ValidConfig`], which [`ValidConfig::plan`] turns into a [`Ruleset`]: chains,
//! rules and sets that send every packet where Istio's rules send it. The ruleset is then
//!
//! - rendered: [`render::nft_script`] (an `nft -f` script), [`render::iptables_restore_all`]
//!   (`iptables-restore` input, for kernels without nf_tables);
//! - evaluated: [`eval::evaluate`] says where one flow ends, and through which rules;
//! - programmed: a [`Namespace`] applies it with the routes it needs (TPROXY policy routing,
//!   `::6` on `lo`), all or nothing, checks a namespace against a config rule by rule
//!   ([`Mismatch`]), reads our table back ([`TableState`]) and removes it.
//!
//! Istio's ambient mode: a [`Namespace`] applies a pod's in-pod rules for ztunnel
//! ([`AmbientConfig`]: `apply_ambient`, `check_ambient`, `remove_ambient`), and, in the host's
//! namespace, the SNAT of kubelet's probes ([`HostProbeConfig`]: `apply_host_probe`,
//! `host_probe_add`, `host_probe_remove`, `host_probe_members`, `remove_host_probe`; kubelet's
//! UID from `istio::ambient::kubelet_uid`).
//!
//! Every failure is an [`Error`] whose message names the value and the fix.
//!
//! Beneath this crate are its layers, which Cargo keeps apart and which are re-exported for
//! what the surface above does not name: [`model`] (the config, plan, renderings and
//! evaluator; no I/O), [`kernel`] (nftables over netlink, routes, namespaces; no Istio name),
//! and [`istio`] (Istio's flags, annotations, quirks, leftovers and validation probe, and its
//! policies over capture: reconcile, IPv6 from a pod's addresses).
//!
//! Examples: `examples/plan.rs` (plan and print the rules for a config) and
//! `examples/capture.rs` (apply, check and remove capture in a network namespace).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod host_probe;
mod namespace;

pub use error::{Error, Result};
pub use namespace::Namespace;

pub use redirect_kernel::backend::Backend;
pub use redirect_kernel::capture::{Cleaned, Mismatch};
pub use redirect_kernel::netns::Netns;
pub use redirect_kernel::nft::{Difference, TableState};
pub use redirect_kernel::routes::TproxyRouting;
pub use redirect_kernel::sockopt::original_dst;
pub use redirect_kernel::SystemGroups;
pub use redirect_model::{
    eval, render, AmbientConfig, CaptureConfig, DnsCapture, Family, GroupRef, GroupResolver,
    HostProbeConfig, InterceptionMode, NoGroupDatabase, Ruleset, Selection, ValidConfig,
};

/// The address types of the config's CIDR lists.
pub use ipnet;

/// The model: the config, its plan, the ruleset, the renderings, the evaluator. No I/O.
pub use redirect_model as model;

/// The kernel: our table over netlink, routes, namespaces, `SO_ORIGINAL_DST`. No Istio name.
pub use redirect_kernel as kernel;

/// Istio's inputs, rules, quirks and probe, and its policies over capture.
pub use redirect_istio as istio;
