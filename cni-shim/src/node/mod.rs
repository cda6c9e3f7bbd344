//! What the node DaemonSet's parts share: its settings (flags and Istio-named variables), its
//! errors, the plugin entry it installs, its metrics, and atomic file writes. The installer (`install`), the node
//! agent (`agent`) and the repair controller (`repair`) are siblings over this module; the
//! DaemonSet's process (`daemon`) runs them together.

pub mod atomic_file;
pub mod error;
pub mod metrics;
pub mod plugin_entry;
pub mod settings;

pub use error::{Error, Result};
pub use settings::{Parsed, Settings};

/// `https://host:port`, with brackets around an IPv6 address.
pub fn server_url(protocol: &str, host: &str, port: &str) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    format!("{protocol}://{host}:{port}")
}
