//! Ambient mode (Istio's ztunnel data plane): the agent enrolls this node's ambient pods
//! (`controller`: the pod and namespace watch, and the plugin's requests at ADD), puts the
//! in-pod rules in each and hands ztunnel its namespace (`dataplane`, over `zds`).

pub mod controller;
pub mod dataplane;
pub mod plugin_requests;
pub mod pods;
pub mod zds;

use std::path::PathBuf;

use redirect_core::AmbientConfig;

/// The agent's ambient settings (`AMBIENT_*`, `ZTUNNEL_UDS_ADDRESS`, `HOST_PROBE_SNAT_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct AmbientSettings {
    pub enabled: bool,
    /// The chart's in-pod settings; each pod's annotations apply over them.
    pub base: AmbientConfig,
    /// At start, program again the rules of enrolled pods that differ.
    pub reconcile_on_startup: bool,
    /// The ZDS socket ztunnel connects to.
    pub ztunnel_socket: PathBuf,
}
