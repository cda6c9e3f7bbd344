//! redirect-cni: the CNI plugin a runtime runs once per pod (`plugin`, over the protocol in
//! `cni`). Thin: CNI stdin, CNI_ARGS and the pod's annotations (from the runtime, or read from
//! the API server by `kube`) become a `redirect_core` config; the library does the rest.
//! What it shares with the node agent (the CNI protocol and its config, the events it tells the
//! agent, the ambient request, the sockets) is the crate `cni-protocol`, re-exported here; the
//! node agent (`cni-node`, `redirect-cni-node`) uses that crate, not this one, and this crate
//! links none of the agent.

#![deny(missing_docs)]

pub mod kube;
pub mod plugin;

pub use cni_protocol::{ambient, cni, events, seqpacket};

/// The node agent's binary, which `redirect-cni install` runs from beside the plugin.
pub const NODE_AGENT_BINARY: &str = "redirect-cni-node";

/// The plugin's process: stdout gets the result or the CNI error object; returns the exit code.
/// `env_error`: a CNI variable that is not UTF-8 (`redirect_program::env::check_utf8`).
/// `started`: when the process started, for the call's whole time.
pub fn plugin_main(
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &[u8],
    env_error: Option<String>,
    started: std::time::Instant,
) -> i32 {
    use std::io::Write;
    let inv = plugin::Invocation {
        env,
        stdin,
        env_error,
        kernel: &redirect_core::Namespace::open_in,
        started,
    };
    let (out, code) = match plugin::run(&inv) {
        Ok(out) => (out, 0),
        // plugin::run has logged it (stderr, and the log file when the config names one).
        Err((e, version)) => (e.to_json(&version), 1),
    };
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.as_bytes());
    let _ = stdout.flush();
    code
}
