//! redirect-cni: the CNI plugin (`plugin`, over the protocol in `cni`) and the node
//! DaemonSet's process (`daemon`: the installer `install` and the node agent `agent`, which
//! runs the repair controller `repair`). Siblings over shared modules: `cni` (the protocol and
//! the plugin's config), `node` (the DaemonSet's settings, errors, plugin entry and metrics),
//! `kube` (the API client). Thin: CNI stdin, CNI_ARGS and pod annotations become a
//! `redirect_model` config; the library crates do the rest.

pub mod agent;
pub mod cni;
pub mod daemon;
pub mod events;
pub mod install;
pub mod kube;
pub mod node;
pub mod plugin;
pub mod repair;

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
        kernel: &redirect_core::kernel::backend::open_live,
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
