//! The repair controller (Istio's `cni/pkg/repair`), run by the node agent: it watches this
//! node's pods, finds those that started without the plugin's rules (`detect`), and repairs them
//! in place (`in_place`, in the namespace `crate::pods::search` finds), deletes them or labels
//! them (`actions`), one pod at a time from a queue keyed by pod UID (`crate::pods::queue`),
//! driven by `controller` on the node's shared pod informer (`crate::informers`). The agent
//! starts it with [`run`], its one entry.

pub mod actions;
pub mod controller;
pub mod detect;
pub mod in_place;

use std::future::Future;
use std::sync::Arc;

use cni_protocol::cni::conf::NetConf;
use tokio::sync::watch as signal;

use crate::informers::KnownPods;
use crate::node_view::NodeView;
use crate::pods::queue::Backoff;
use crate::pods::Places;
use crate::telemetry::Metrics;
use detect::{Action, Filter};

/// The repair controller, the agent's part (or, with `REPAIR_ENABLED=false`, the adoption
/// alone), on the node's pod informer until `stop`: `plugin` is the plugin's own entry (a
/// repaired pod gets the capture its ADD would have), the actions are counted in `metrics`
/// and the sidecar pods shown in `view`.
pub fn run(
    client: kube::Client,
    pods: KnownPods,
    settings: &RepairSettings,
    (plugin, metrics, view): (Arc<NetConf>, Metrics, NodeView),
    stop: signal::Receiver<bool>,
) -> impl Future<Output = ()> {
    let mut settings = settings.clone();
    if !settings.enabled {
        // Watching for adoption only: no repair action.
        settings.action = None;
    }
    tracing::info!(
        "pods holding Istio's capture rules: ADOPT_ISTIO={}",
        settings.adopt_istio.word()
    );
    let controller = controller::Controller {
        client,
        settings,
        plugin,
        metrics,
        view,
        backoff: Backoff::default(),
        pods,
    };
    controller.run(stop)
}

/// The controller's settings (`REPAIR_*`, with the defaults of Istio's chart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairSettings {
    /// `REPAIR_ENABLED`: run the controller at all.
    pub enabled: bool,
    /// The first of repair, delete, label that is on (Istio's priority); `None`: watch only.
    pub action: Option<Action>,
    /// `REPAIR_NODE_NAME`: only this node's pods are watched.
    pub node_name: String,
    /// Which pods are broken (`REPAIR_SIDECAR_ANNOTATION`, `REPAIR_INIT_CONTAINER_*`).
    pub filter: Filter,
    /// `REPAIR_BROKEN_POD_LABEL_KEY`: the key label mode puts on a broken pod.
    pub label_key: String,
    /// `REPAIR_BROKEN_POD_LABEL_VALUE`: its value.
    pub label_value: String,
    /// `REPAIR_LABEL_SELECTORS`, as given to the API server.
    pub label_selectors: String,
    /// `REPAIR_FIELD_SELECTORS`, joined with `spec.nodeName=<node>`.
    pub field_selectors: String,
    /// Attempts per pod before giving up until the pod changes again.
    pub max_attempts: u32,
    /// `ADOPT_ISTIO`: what the controller does with pods holding Istio's rules
    /// (`crate::adopt`); it runs for that alone when `enabled` is false.
    pub adopt_istio: crate::adopt::AdoptIstio,
    /// Where repair mode looks for a pod's namespace.
    pub places: Places,
    /// Where the form each adopted pod held is recorded for a hand-back (the run directory,
    /// `crate::adopted_forms`); `None`: not recorded.
    pub adopted_forms: Option<std::path::PathBuf>,
}

impl RepairSettings {
    /// The field selector sent to the API server: ours, then `spec.nodeName=<node>`.
    pub fn field_selector(&self) -> String {
        let node = format!("spec.nodeName={}", self.node_name);
        match self.field_selectors.trim() {
            "" => node,
            extra => format!("{extra},{node}"),
        }
    }

    /// The pods the controller takes among the node's: `REPAIR_LABEL_SELECTORS` and
    /// `REPAIR_FIELD_SELECTORS`, matched on the node (the informer is shared); an error names
    /// the requirement that cannot be read.
    pub fn pod_filter(&self) -> Result<crate::pods::selectors::PodFilter, String> {
        crate::pods::selectors::PodFilter::parse(&self.label_selectors, &self.field_selectors)
    }

    /// Whether pods holding Istio's rules are looked for: `ADOPT_ISTIO` is not `off`, and the
    /// node's name is known (without it the watch cannot be narrowed to this node).
    pub fn adopting(&self) -> bool {
        self.adopt_istio != crate::adopt::AdoptIstio::Off && !self.node_name.is_empty()
    }

    /// The mode's name in logs and in the metric's `type` label.
    pub fn mode(&self) -> &'static str {
        match self.action {
            Some(a) => a.metric_type(),
            None => "none",
        }
    }
}
