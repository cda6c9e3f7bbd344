//! istio-iptables' command line, shared by the programs that take it: `redirect-init` (which
//! programs the rules) and `redirect-validate` (whose probe and tools read the same arguments,
//! as Istio runs its validation container with the init container's flags).
//!
//! `flag_table` is the engine for Go-style flags with variable fallbacks (also the installer's,
//! in cni-shim); `flags` is istio-iptables' table, resolved with Istio's precedence; `settings`
//! types them into a `CaptureConfig` plus how to run. Built with the `cli` feature (it needs
//! clap).

pub mod flag_table;
pub mod flags;
pub mod settings;
