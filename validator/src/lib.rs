//! redirect-validate: Istio's `istio-validation` probe (the default mode, same flags), and
//! tools for people debugging a pod: `inspect` (the rules a namespace holds, against what it
//! should hold), `explain` (where a flow goes, and why), `trace` (where the kernel really sent
//! one packet, beside explain's answer) and `node` (the node agent's view of
//! every pod on its node). Thin: the probe, the diagnosis, the
//! evaluator and the read-back live in the library crates (redirect-model, redirect-kernel, redirect-istio).

#![deny(missing_docs)]

mod args;
mod error;
mod explain;
mod inspect;
mod istio_validation;
mod node;
mod node_fetch;
mod pod_file;
mod trace;

use std::ffi::OsString;

use error::Error;

/// Exit code: success (the probe passed; `inspect` and `node` found nothing wrong).
pub const EXIT_OK: i32 = 0;
/// Exit code: no answer could be given: bad flags or environment, or an input that could not
/// be read or used (the message says which).
pub const EXIT_ERROR: i32 = 1;
/// `inspect`: the rules differ from the expected configuration; `node`: a pod needs attention.
pub const EXIT_DIFFERS: i32 = 2;
/// Exit code: the probe failed. 126 is Istio's "validation failed", which repair controllers
/// key on.
pub const EXIT_VALIDATION: i32 = 126;

/// The whole program, from arguments and an environment lookup to an exit code.
pub fn main_with(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> i32 {
    match args.get(1).and_then(|a| a.to_str()) {
        Some("inspect") => inspect::main(without_word(args), env),
        Some("explain") => explain::main(without_word(args), env),
        Some("node") => node::main(without_word(args)),
        Some("trace") => trace::main(without_word(args), env),
        _ => istio_validation::main(args, env),
    }
}

/// `redirect-validate inspect ...` parses as `redirect-validate-inspect ...`.
fn without_word(mut args: Vec<OsString>) -> Vec<OsString> {
    let word = args.remove(1);
    if let Some(first) = args.first_mut() {
        first.push(" ");
        first.push(word);
    }
    args
}
