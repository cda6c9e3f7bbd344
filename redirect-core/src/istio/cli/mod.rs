//! istio-iptables' command line, shared by the programs that take it: `redirect-init` (which
//! programs the rules) and `redirect-validate` (whose probe and tools read the same arguments,
//! as Istio runs its validation container with the init container's flags).
//!
//! `flags` resolves every flag and variable with Istio's precedence; `settings` types them into a
//! `CaptureConfig` plus how to run. Built with the `cli` feature (it needs clap).

pub mod flags;
pub mod settings;
