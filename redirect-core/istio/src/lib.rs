//! redirect-istio: Istio's side of a pod's capture, on top of the model and the kernel.
//!
//! - Istio's inputs: istio-iptables' command line and variables (`cli`, with the `cli`
//!   feature), the pod's annotations and spec mapped to a capture config ([`mesh`], [`pod`]),
//!   what Istio derives inside the pod ([`pod_facts`]: proxy UID, IPv6, DNS servers), the
//!   warnings about Istio's quirks ([`quirks`]), Go's forms ([`go`]).
//! - Istio's own rules: its iptables chains ([`xtables`]: found, loaded, the leftovers scan) and
//!   its nftables tables ([`tables`]), the tables its native nftables backend writes for a
//!   config ([`nft_form`], for a hand-back), the rules its iptables backend writes for a config
//!   ([`iptables_form`]), and its TPROXY routing values ([`TPROXY_ROUTING`]).
//! - Istio's rules as an apply meets them ([`capture`]): found and removed, described, why an
//!   apply refused, and the iptables backend's run over them.
//! - Istio's validation ([`validation`]): the probe and, when it fails, why.
//! - Ambient: which pods are enrolled and what their annotations change ([`ambient`]), and
//!   kubelet's UID for the host's probe SNAT ([`kubelet`], also `ambient::kubelet_uid`).
//! - [`Error`] and [`Result`]: the model's and the kernel's errors, and a failed tool.

#![deny(missing_docs)]

pub mod ambient;
pub mod capture;
#[cfg(feature = "cli")]
pub mod cli;
pub mod enablement;
mod error;
pub mod go;
pub mod iptables_form;
pub mod kubelet;
pub mod mesh;
pub mod nft_form;
pub mod pod;
pub mod pod_facts;
pub mod quirks;
pub mod tables;
pub mod validation;
pub mod xtables;

pub use error::{Error, Result};

use redirect_kernel::routes::TproxyRouting;

/// Istio's TPROXY routing (`--istio-inbound-tproxy-mark 1337`,
/// `--istio-inbound-tproxy-route-table 133`), which DEL removes whatever the pod's config was.
pub const TPROXY_ROUTING: TproxyRouting = TproxyRouting {
    mark: 1337,
    mask: u32::MAX,
    table: 133,
    priority: None,
};
