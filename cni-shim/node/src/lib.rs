//! redirect-cni-node: the node DaemonSet's process (`daemon`). It installs the plugin
//! (`install`: the binary, the CNI config, the kubeconfig; `upgrade`, whether a stop leaves it
//! for the next agent) and runs the node agent beside it (`agent`, which only wires the parts).
//! The parts, each a module with one entry and none using another (`redirect-core`'s
//! `tests/layers.rs` checks): the installer `install`, the repair controller `repair`,
//! ambient mode `ambient`, the metrics server `metrics`, the sidecar pods' counters
//! `counters`, and `untaint`. What they share is below them: the informers (one watch per
//! kind), the pods on this node (`pods`), the settings (flags and Istio-named variables),
//! errors, what they record for the metrics (`telemetry`), the node view, the plugin entry
//! installed, atomic file writes, and the agent's API client (`kube_client`). The plugin's own
//! crate (`cni_plugin`) gives its config, its events and the pod conversion; it links nothing
//! of this one.

#![deny(missing_docs)]

pub mod adopt;
pub mod adopted_forms;
pub mod agent;
pub mod ambient;
pub mod atomic_file;
pub mod counters;
pub mod daemon;
pub mod error;
pub mod hand_back;
pub mod informers;
pub mod install;
pub mod kube_client;
pub mod metrics;
pub mod node_view;
pub mod plugin_entry;
pub mod pods;
pub mod repair;
pub mod run_dir;
pub mod settings;
pub mod telemetry;
pub mod untaint;
pub mod upgrade;

pub use error::{Error, Result};
pub use settings::{Parsed, Settings};

/// The `type` (and binary name) of our plugin; an entry with this type is ours. Here, below
/// both, because the settings refuse another in `PLUGIN_CONFIG_JSON` and `plugin_entry` writes it.
pub const PLUGIN_TYPE: &str = "redirect-cni";

/// `https://host:port`, with brackets around an IPv6 address.
pub fn server_url(protocol: &str, host: &str, port: &str) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    format!("{protocol}://{host}:{port}")
}
