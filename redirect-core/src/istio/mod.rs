//! Istio compatibility, on top of the model: Istio's command line and settings (`cli`), its pod
//! annotations mapped to a capture config (`mesh`, from a `pod`), what Istio derives inside the
//! pod (`pod_facts`: proxy UID, IPv6, DNS servers), the warnings about Istio's quirks
//! (`quirks`), and Istio's own iptables rules: finding them, loading them, and the leftovers
//! scan (`xtables`).

#[cfg(feature = "cli")]
pub mod cli;
pub mod mesh;
pub mod pod;
pub mod pod_facts;
pub mod quirks;
pub mod xtables;
