//! redirect-core: a pod's traffic captured for its service-mesh sidecar, over netlink, in one
//! nftables table per network namespace, written in one atomic batch.
//!
//! ```no_run
//! use redirect_core::{Capture, CaptureConfig, Namespace, SystemGroups};
//!
//! fn main() -> Result<(), redirect_core::Error> {
//!     let mut config = CaptureConfig::istio_sidecar_default();
//!     config.inbound_exclude_ports.push(8080); // inbound 8080 reaches the app directly
//!     let capture = Capture::Sidecar(config.validated()?);
//!     println!("{}", redirect_core::render::nft_script_of(&capture, &capture.plan(&SystemGroups)?));
//!     let pod = Namespace::open("/run/netns/pod")?;
//!     pod.apply(&capture)?;
//!     assert!(pod.check(&capture)?.is_empty());
//!     Ok(())
//! }
//! ```
//!
//! A namespace's capture is one [`Capture`], of one of three kinds, each planned, applied,
//! checked, read and removed the same way through a [`Namespace`]:
//!
//! - [`Capture::Sidecar`]: Istio's sidecar capture. A [`CaptureConfig`] holds every parameter
//!   of Istio's `istio-iptables`, typed ([`CaptureConfig::istio_sidecar_default`] is what
//!   Istio's injector asks for); it is validated once into a [`ValidConfig`].
//! - [`Capture::Ambient`]: Istio's ambient in-pod rules, which send a pod's traffic to ztunnel
//!   ([`AmbientConfig`], Istio's defaults from `AmbientConfig::default()`).
//! - [`Capture::HostProbe`]: in the host's namespace, the SNAT of kubelet's probes to enrolled
//!   pods ([`HostProbeConfig`] and the pods' addresses), whose members
//!   [`Namespace::add_members`] and [`Namespace::remove_members`] change at run time.
//!
//! ```no_run
//! use redirect_core::{AmbientConfig, Capture, HostProbeConfig, Namespace};
//!
//! fn main() -> Result<(), redirect_core::Error> {
//!     // In the pod's namespace: its traffic to ztunnel.
//!     let pod = Namespace::open("/run/netns/pod")?;
//!     let ambient = Capture::Ambient(AmbientConfig::default());
//!     pod.apply(&ambient)?;
//!     assert!(pod.check(&ambient)?.is_empty());
//!     // In the host's: kubelet (UID 0 here) probes the pod from 169.254.7.127.
//!     let host = Namespace::current()?;
//!     let probe = HostProbeConfig::new(0);
//!     host.apply(&Capture::HostProbe { config: probe.clone(), members: vec![] })?;
//!     host.add_members(&probe, &["10.244.1.7".parse().unwrap()])?;
//!     Ok(())
//! }
//! ```
//!
//! [`Capture::plan`] turns any kind into a [`Ruleset`]: chains, rules and sets that send every
//! packet where Istio's rules send it. The ruleset is then
//!
//! - rendered: [`render::nft_script_of`] (an `nft -f` script, the kind's own table and
//!   header), [`render::iptables_restore_all`] (`iptables-restore` input, for kernels without
//!   nf_tables);
//! - evaluated: [`eval::evaluate`] says where one flow ends, and through which rules;
//! - programmed: a [`Namespace`] applies it with the routes the kind needs (TPROXY or reply
//!   policy routing, `::6` on `lo`), all or nothing, checks a namespace against it rule by rule
//!   ([`Mismatch`]), reads its table back ([`TableState`]) and removes it.
//!
//! Every failure is an [`Error`] whose message names the value and the fix, once.
//!
//! Capture rules the namespace holds that we did not write (Istio's chains and tables in
//! any of their forms) are a policy of the same apply: [`Namespace::apply_with`] refuses
//! them (the default), keeps them, or replaces them once ours are in ([`Foreign`]), and
//! [`Namespace::foreign`] reads them. The way back is [`Namespace::hand_back`]: our table
//! replaced, in one batch, by Istio's own rules for the same config, in the form chosen
//! ([`IstioForm`]: its iptables rules as iptables-nft keeps them, or its native nftables
//! tables; [`HandedBack`]).
//!
//! For the programs built on it (and a user who needs Istio's own decisions), the same door
//! holds, documented: `cli` (`istio-iptables`' flags and environment, with the `cli`
//! feature), [`mesh`] (the mesh's decision from a pod's annotations), [`pod_facts`] (what
//! Istio derives in the pod), [`foreign`] (the apply's policy, and Istio's rules as found),
//! [`probe`] (Istio's validation probe and its diagnosis), [`ambient`] (ambient enrollment),
//! [`view`] (a namespace's capture for a person: [`Namespace::inspect`]), [`trace`] (a
//! packet's real path, from the kernel's trace reports) and [`error`] (what
//! the one error's variants hold). The layers beneath (the model, the kernel, Istio's side)
//! are crates of their own that Cargo keeps apart; this crate names what it exposes of them,
//! item by item.
//!
//! Examples: `examples/plan.rs` (plan and print the rules for a config), `examples/capture.rs`
//! (apply, check and remove a sidecar's capture in a network namespace) and
//! `examples/ambient.rs` (ambient's in-pod rules and the host's probe SNAT, applied in fresh
//! namespaces and checked).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod ambient;
#[cfg(feature = "cli")]
pub mod cli;
pub mod error;
pub mod foreign;
mod hand_back;
pub mod mesh;
mod namespace;
pub mod pod_facts;
pub mod probe;
pub mod trace;
pub mod view;

pub use error::{Error, Result};
pub use foreign::{Applied, Apply, Foreign};
pub use hand_back::{HandedBack, IstioForm};
pub use namespace::{IstioHost, Namespace};

pub use redirect_kernel::backend::Backend;
pub use redirect_kernel::branch_eni;
pub use redirect_kernel::capture::{Cleaned, Mismatch};
pub use redirect_kernel::listeners;
pub use redirect_kernel::netns::{current_netns_id, netns_id_of, Netns, NetnsId};
pub use redirect_kernel::nft::{Difference, TableState};
pub use redirect_kernel::routes::TproxyRouting;
pub use redirect_kernel::sockopt::original_dst;
pub use redirect_kernel::synthetic;
pub use redirect_kernel::SystemGroups;
pub use redirect_model::{
    eval, render, sidecar_routes, AmbientConfig, Capture, CaptureConfig, Count, CountedPath,
    DnsCapture, Family, GroupRef, GroupResolver, HostProbeConfig, InterceptionMode,
    NoGroupDatabase, PathCounts, Routes, Ruleset, Selection, ValidConfig, DNS_AGENT_PORT,
};

/// The address types of the config's CIDR lists.
pub use ipnet;

/// Test doubles (the `testing` feature): a namespace that lives in memory ([`Fake`](testing::Fake)),
/// for a program's decisions tested without root.
#[cfg(feature = "testing")]
pub mod testing {
    pub use crate::foreign::FakeForeign;
    pub use redirect_kernel::fake::{Fake, FakeState};
}
