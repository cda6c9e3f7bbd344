//! redirect-program: what redirect-init, redirect-cni (plugin and installer) and
//! redirect-validate share about running as a process.
//!
//! - [`logging`]: the one `tracing` subscriber per process and our line format (escaped, one
//!   event one line, a log file that never blocks), Istio's JSON lines and `scope:level` lists.
//! - [`env`](mod@env): the variables a program reads must be UTF-8 ([`env::check_utf8`]).
//! - [`errors`]: an error with its causes, each once, for whatever shows it to an operator
//!   ([`errors::chain`]).
//!
//! No unsafe code.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod env;
pub mod errors;
mod log_json;
mod log_scopes;
pub mod logging;
