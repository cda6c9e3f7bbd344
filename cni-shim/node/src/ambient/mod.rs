//! Ambient mode (Istio's ztunnel data plane): the agent enrolls this node's ambient pods
//! (`controller`: the pod and namespace watch, the plugin's requests at ADD and CHECK, and a
//! pass every few seconds that reads everything back), binds each to the namespace that holds
//! its addresses (`identity`), puts the in-pod rules in it and hands ztunnel its namespace
//! (`dataplane`, over the `zds` crate). Both sockets are let in by `cni_protocol::gate`.

pub(crate) mod branch_eni;
pub(crate) mod controller;
pub(crate) mod dataplane;
pub(crate) mod error;
pub(crate) mod identity;
pub(crate) mod listeners;
pub(crate) mod plugin_requests;
pub(crate) mod pods;
pub mod synthetic;

use std::path::PathBuf;
use std::time::Duration;

use redirect_core::ambient::EnablementSelectors;
use redirect_core::AmbientConfig;

/// The agent's ambient settings (`AMBIENT_*`, `ZTUNNEL_UDS_ADDRESS`, `HOST_PROBE_SNAT_*`).
#[derive(Clone, Debug, PartialEq)]
pub struct AmbientSettings {
    /// `AMBIENT_ENABLED`: enroll this node's ambient pods and serve ztunnel.
    pub enabled: bool,
    /// `AMBIENT_ENABLEMENT_SELECTOR`: which pods are enrolled (Istio's default when unset).
    pub selectors: EnablementSelectors,
    /// The chart's in-pod settings; each pod's annotations apply over them.
    pub base: AmbientConfig,
    /// At start, program again the rules of enrolled pods that differ.
    pub reconcile_on_startup: bool,
    /// How often the pass reads everything back (`AMBIENT_RECONCILE_INTERVAL`).
    pub reconcile_interval: Duration,
    /// The ZDS socket ztunnel connects to.
    pub ztunnel_socket: PathBuf,
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`: ip rules for kubelet's probes to pods behind an
    /// AWS branch ENI (on nodes with `net.ipv4.tcp_early_demux=0`).
    pub aws_branch_eni_probe: bool,
    /// `AMBIENT_CHECK_LISTENERS`: a pod is `enabled` only while ztunnel's listeners are seen
    /// in its namespace.
    pub check_listeners: bool,
    /// `AMBIENT_SYNTHETIC_CHECK`: which pod a pass sends a synthetic connection through, to
    /// prove it lands on ztunnel's 15001 (observational).
    pub synthetic_check: synthetic::SyntheticCheck,
}
