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

/// How a namespace was tied to its pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Binding {
    /// It holds the addresses the API lists for the pod.
    ApiAddresses,
    /// It holds the addresses the plugin's request listed, which no other pod of the node has;
    /// the API listed none yet: checked again as soon as it does.
    RequestAddresses,
    /// Neither the API nor the request listed an address (a plugin run without a previous
    /// result, as under Multus): the namespace's own addresses, which no other pod of the
    /// node has; checked again as soon as the API lists the pod's.
    NamespaceAddresses,
    /// The agent's own search found it (the pod's cgroup, and its address when known).
    Search,
}

/// What a repair put right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RepairKind {
    /// The host's probe table was gone: recreated with every enrolled pod's addresses.
    HostTable,
    /// Addresses missing from (or left in) the host's probe sets.
    HostMembers,
    /// A pod's in-pod rules differed from its plan (or were gone): programmed again.
    PodRules,
    /// A pod's namespace found again (after a `keep`), or bound anew.
    Namespace,
    /// A pod the current ztunnel had not acked, sent again.
    Resent,
    /// A sidecar pod held Istio's capture rules: ours applied, Istio's removed (`ADOPT_ISTIO`).
    Adopted,
    /// The ip rules for kubelet's probes to pods behind an AWS branch ENI: one missing,
    /// added, or one of ours that no enrolled pod needs, removed.
    ProbeRoutes,
    /// ztunnel acked a pod whose listeners are missing in its namespace: sent again.
    Listeners,
}

impl RepairKind {
    /// The `kind` label of `redirect_cni_ambient_repairs_total`.
    pub fn label(self) -> &'static str {
        match self {
            RepairKind::HostTable => "host_table",
            RepairKind::HostMembers => "host_members",
            RepairKind::PodRules => "pod_rules",
            RepairKind::Namespace => "namespace",
            RepairKind::Resent => "resent",
            RepairKind::Adopted => "adopted",
            RepairKind::ProbeRoutes => "probe_routes",
            RepairKind::Listeners => "listeners",
        }
    }
}

/// One repair: when, what, and why (what was read back).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Repair {
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
    pub kind: RepairKind,
    pub why: String,
}

/// A pod's rules as they stand after the last read (and the repair it led to).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ReadBack {
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
    /// What differed from the plan (empty: equal), or why it could not be read.
    pub differences: Vec<String>,
}

/// The host table as last read back.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct HostView {
    /// Whether the probe SNAT is configured (kubelet was found).
    pub configured: bool,
    /// The addresses in its sets at the last read; `None`: the table was not there.
    pub members: Option<Vec<IpAddr>>,
    #[serde(with = "rfc3339_opt")]
    pub checked_at: Option<SystemTime>,
    pub repair: Option<Repair>,
    /// The ip rules held for pods behind an AWS branch ENI, at the last read.
    pub branch_eni_rules: Vec<String>,
}

/// What the ZDS connection serving adds (the newest open) holds of a pod.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ZtunnelView {
    pub connection: Option<u64>,
    pub acked: bool,
    pub refused: Option<String>,
    /// ztunnel's listeners in the pod's namespace as last read (`None`: not read: not acked,
    /// or `AMBIENT_CHECK_LISTENERS=false`).
    pub listeners: Option<ListenersView>,
}

/// ztunnel's listeners in a pod's namespace, as the last read found them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ListenersView {
    #[serde(with = "rfc3339")]
    pub checked_at: SystemTime,
    /// Every listener wanted was there.
    pub seen: bool,
    /// The ports missing (`15001/tcp`).
    pub missing: Vec<String>,
    /// Since when the last finding (seen, or these missing) holds.
    #[serde(with = "rfc3339_opt")]
    pub since: Option<SystemTime>,
    /// Why the read failed, if it did.
    pub error: Option<String>,
}

/// The last synthetic check of a pod (`AMBIENT_SYNTHETIC_CHECK`): a connection to a
/// documentation address in its namespace, proved to land on ztunnel's 15001.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct SyntheticView {
    #[serde(with = "rfc3339")]
    pub at: SystemTime,
    pub ok: bool,
    /// In one word: `ok`, `refused`, `timed_out`, `no_route`, `landed_elsewhere`,
    /// `namespace_gone`, `failed`.
    pub result: &'static str,
    /// In words.
    pub detail: String,
    /// How long the check took, in ms.
    pub took_ms: f64,
}

/// The kind of capture a pod has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    Ambient,
    Sidecar,
}

/// One pod in the view.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PodEntry {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub kind: Kind,
    /// One word: ambient `enabled`, `pending`, `disconnected` (no ztunnel to ask), `kept`
    /// (ztunnel keeps it, its namespace not found); sidecar `ok`, `broken`, `repaired`,
    /// `adopted` (Istio's rules replaced by ours), `istio` (Istio's rules kept).
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
    /// The last synthetic check (`None`: none ran for it; observational, its state unchanged).
    pub synthetic_check: Option<SyntheticView>,
}

/// ztunnel's connection as the agent holds it.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ZtunnelState {
    pub socket: String,
    pub connected: bool,
    /// The connection serving adds (the newest open), and since when.
    pub connection: Option<u64>,
    pub connected_since: Option<String>,
    /// Connections that got their snapshot since the agent started.
    pub connections: u64,
    /// Connections open now: 1, or 2 while ztunnel rolls out (the older gets deletes only).
    pub connections_open: usize,
    /// Connections closed before their hello.
    pub closed_silent: u64,
}

/// The ambient controller's passes.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct PassState {
    pub passes: u64,
    pub last: Option<String>,
    pub took_ms: f64,
    pub interval_s: f64,
    /// Repairs since the agent started, by kind.
    pub repairs: BTreeMap<String, u64>,
}

/// What the ambient controller publishes after each pass.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct AmbientPart {
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
    pub(crate) fn new(node: &str) -> NodeView {
        let view = NodeView::default();
        view.lock().node = node.to_owned();
        view
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ambient part, replaced whole after each pass.
    pub(crate) fn set_ambient(&self, part: AmbientPart) {
        self.lock().ambient = Some(part);
    }

    /// A sidecar pod as the repair controller sees it now.
    pub(crate) fn set_sidecar(&self, entry: PodEntry) {
        self.lock().sidecar.insert(entry.uid.clone(), entry);
    }

    /// Keeps the sidecar pods `known` says are still there (after a relist).
    pub(crate) fn keep_sidecars(&self, known: impl Fn(&str) -> bool) {
        self.lock().sidecar.retain(|uid, _| known(uid));
    }

    /// A sidecar pod gone.
    pub(crate) fn forget_sidecar(&self, uid: &str) {
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

/// Times in the node view: RFC 3339, as the API's.
mod rfc3339 {
    pub fn serialize<S: serde::Serializer>(
        t: &std::time::SystemTime,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_rfc3339_seconds(*t).to_string())
    }
}

mod rfc3339_opt {
    pub fn serialize<S: serde::Serializer>(
        t: &Option<std::time::SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&humantime::format_rfc3339_seconds(*t).to_string()),
            None => s.serialize_none(),
        }
    }
}
