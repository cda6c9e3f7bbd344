//! Ambient mode (Istio's ztunnel data plane): the agent enrolls this node's ambient pods
//! (`controller`: the pod and namespace watch, the plugin's requests at ADD and CHECK, and a
//! pass every few seconds that reads everything back), binds each to the namespace that holds
//! its addresses (`identity`), puts the in-pod rules in it and hands ztunnel its namespace
//! (`dataplane`, over the `zds` crate). Both sockets are let in by `cni_protocol::gate`. The
//! agent starts it with [`run`], its one entry.

pub(crate) mod branch_eni;
pub(crate) mod controller;
pub(crate) mod dataplane;
pub(crate) mod dataplane_thread;
pub(crate) mod error;
pub(crate) mod identity;
pub(crate) mod listeners;
pub(crate) mod plugin_requests;
pub(crate) mod pods;
pub mod synthetic;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redirect_core::ambient::EnablementSelectors;
use redirect_core::AmbientConfig;
use tokio::sync::watch as signal;
use zds::server::ZdsServer;

use crate::adopt::AdoptIstio;
use crate::informers::Informers;
use crate::node_view::NodeView;
use crate::pods::Places;
use crate::telemetry::Metrics;
use dataplane::Dataplane;
use dataplane_thread::DataplaneThread;

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

/// What ambient mode takes from the node's settings besides its own ([`AmbientSettings`]).
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// This node's name: the pods enrolled are its own.
    pub name: String,
    /// `EXCLUDE_NAMESPACES`: pods there are never enrolled.
    pub excluded_namespaces: Vec<String>,
    /// Where a pod's namespace is looked for (the host's `/proc`, where kubelet's UID is read).
    pub places: Places,
    /// `ADOPT_ISTIO`: what is done with a pod that holds Istio's in-pod rules.
    pub adopt_istio: AdoptIstio,
    /// Where the form each adopted pod held is recorded for a hand-back; `None`: not recorded.
    pub adopted_forms: Option<PathBuf>,
    /// `CAPTURE_COUNTERS_INTERVAL`: how often the enrolled pods' counters are read.
    pub counters_every: Duration,
    /// The run directory: the plugin's requests come on a socket there.
    pub run_dir: PathBuf,
}

/// Ambient mode, the agent's part: the plugin's socket opened in the run directory, the data
/// plane over `zds` (with the host's probe SNAT), and the controller on the node's informers
/// until `stop`, counting into `metrics` and showing the pods in `view`. The socket and the
/// probe SNAT are set up now; the future returned runs the controller.
pub fn run(
    client: kube::Client,
    informers: Informers,
    zds: ZdsServer,
    (settings, node): (&AmbientSettings, &NodeSettings),
    (metrics, view): (Metrics, NodeView),
    stop: signal::Receiver<bool>,
) -> impl Future<Output = ()> {
    let (to, requests) = tokio::sync::mpsc::channel(plugin_requests::IN_FLIGHT);
    let listener = match plugin_requests::listen_in(&node.run_dir, to) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(
                "ambient: cannot listen for the plugin in {}: {e}; ambient pods are enrolled \
                 by the watch only, after they start",
                node.run_dir.display()
            );
            None
        }
    };
    let dataplane = Dataplane::new(zds)
        .with_adoption(node.adopt_istio, node.adopted_forms.clone())
        .with_branch_eni(settings.aws_branch_eni_probe)
        .with_listener_check(settings.check_listeners)
        .with_counters_every(node.counters_every)
        .with_synthetic_check(settings.synthetic_check.clone());
    let dataplane = host_probe(&settings.base, &node.places.proc, dataplane);
    // The data plane blocks (netlink, setns, ZDS's sockets): it is its own thread's.
    let dataplane = match DataplaneThread::start("ambient-dataplane", dataplane) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::error!("ambient: no thread for the data plane: {e}; no pod is enrolled");
            None
        }
    };
    let controller = dataplane.map(|dataplane| controller::Controller {
        client,
        settings: settings.clone(),
        informers,
        node: node.name.clone(),
        excluded: node.excluded_namespaces.clone(),
        places: node.places.clone(),
        metrics,
        dataplane,
        requests,
        view,
    });
    async move {
        if let Some(controller) = controller {
            controller.run(stop).await;
        }
        drop(listener);
    }
}

/// The host's probe SNAT for kubelet's UID, found in the host's `/proc`: without it kubelet's
/// probes to ambient pods are captured like any other connection, so its absence is an error
/// in the log, not a stop.
fn host_probe(base: &AmbientConfig, proc: &Path, mut dp: Dataplane) -> Dataplane {
    let uid = match redirect_core::ambient::kubelet_uid(proc) {
        Ok(uid) => uid,
        Err(e) => {
            tracing::error!(
                "ambient: no probe SNAT on this node: {}",
                redirect_program::errors::chain(&e)
            );
            return dp;
        }
    };
    let cfg = redirect_core::HostProbeConfig {
        kubelet_uid: uid,
        snat_v4: base.probe_snat_v4,
        snat_v6: base.ipv6.then_some(base.probe_snat_v6),
    };
    let (v4, v6) = (cfg.snat_v4, cfg.snat_v6);
    match dp.set_host_probe(cfg) {
        Ok(()) => tracing::info!(
            "ambient: kubelet (UID {uid})'s TCP to enrolled pods is SNATed to {v4}{}",
            v6.map(|a| format!(" and {a}")).unwrap_or_default()
        ),
        Err(e) => tracing::error!("ambient: no probe SNAT on this node: {e}"),
    }
    dp
}
