//! The agent's view of every pod on its node, as the controllers last read it back: served as
//! JSON on the monitoring port (`GET /debug/node`) and printed by `redirect-validate node`.
//! Ambient pods come from the ambient controller's pass (state, rules read back and when,
//! the last repair and why, what the current ztunnel connection acked); sidecar pods from the
//! repair controller (broken or not, repaired when and how). Pods that need attention come
//! first.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use crate::ambient::dataplane::{HostView, ReadBack, Repair, ZtunnelView};
use crate::ambient::identity::Binding;

/// The kind of capture a pod has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Ambient,
    Sidecar,
}

/// One pod in the view.
#[derive(Clone, Debug, Serialize)]
pub struct PodEntry {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub kind: Kind,
    /// One word: ambient `enabled`, `pending`, `disconnected` (no ztunnel to ask), `kept`
    /// (ztunnel keeps it, its namespace not found); sidecar `ok`, `broken`, `repaired`.
    pub state: String,
    /// Why it needs an operator's attention; `None` when all is well.
    pub attention: Option<String>,
    pub ips: Vec<IpAddr>,
    pub netns: Option<String>,
    pub binding: Option<Binding>,
    /// The rules as last read back (`None`: not read by the agent).
    pub rules: Option<ReadBack>,
    pub last_repair: Option<Repair>,
    pub ztunnel: Option<ZtunnelView>,
}

/// ztunnel's connection as the agent holds it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ZtunnelState {
    pub socket: String,
    pub connected: bool,
    pub connection: Option<u64>,
    pub connected_since: Option<String>,
    /// Connections that got their snapshot since the agent started.
    pub connections: u64,
    /// Connections closed before their hello.
    pub closed_silent: u64,
}

/// The ambient controller's passes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PassState {
    pub passes: u64,
    pub last: Option<String>,
    pub took_ms: f64,
    pub interval_s: f64,
    /// Repairs since the agent started, by kind.
    pub repairs: BTreeMap<String, u64>,
}

/// What the ambient controller publishes after each pass.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AmbientPart {
    pub ztunnel: ZtunnelState,
    pub host_probe: HostView,
    pub pass: PassState,
    #[serde(skip)]
    pub pods: Vec<PodEntry>,
}

#[derive(Default)]
struct Parts {
    node: String,
    ambient: Option<AmbientPart>,
    sidecar: BTreeMap<String, PodEntry>,
}

/// The view, shared by the controllers (writers) and the HTTP endpoint (reader).
#[derive(Clone, Default)]
pub struct NodeView {
    inner: Arc<Mutex<Parts>>,
}

/// The document `GET /debug/node` serves.
#[derive(Serialize)]
struct Document<'a> {
    node: &'a str,
    at: String,
    ambient: Option<&'a AmbientPart>,
    pods: Vec<&'a PodEntry>,
}

impl NodeView {
    pub fn new(node: &str) -> NodeView {
        let view = NodeView::default();
        view.lock().node = node.to_owned();
        view
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ambient part, replaced whole after each pass.
    pub fn set_ambient(&self, part: AmbientPart) {
        self.lock().ambient = Some(part);
    }

    /// A sidecar pod as the repair controller sees it now.
    pub fn set_sidecar(&self, entry: PodEntry) {
        self.lock().sidecar.insert(entry.uid.clone(), entry);
    }

    /// Keeps the sidecar pods `known` says are still there (after a relist).
    pub fn keep_sidecars(&self, known: impl Fn(&str) -> bool) {
        self.lock().sidecar.retain(|uid, _| known(uid));
    }

    /// A sidecar pod gone.
    pub fn forget_sidecar(&self, uid: &str) {
        self.lock().sidecar.remove(uid);
    }

    /// The view as JSON: the pods that need attention first, then by namespace and name.
    pub fn to_json(&self) -> String {
        let parts = self.lock();
        let mut pods: Vec<&PodEntry> = parts
            .ambient
            .iter()
            .flat_map(|a| a.pods.iter())
            .chain(parts.sidecar.values())
            .collect();
        pods.sort_by(|a, b| {
            (a.attention.is_none(), &a.namespace, &a.name).cmp(&(
                b.attention.is_none(),
                &b.namespace,
                &b.name,
            ))
        });
        let doc = Document {
            node: &parts.node,
            at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            ambient: parts.ambient.as_ref(),
            pods,
        };
        serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
