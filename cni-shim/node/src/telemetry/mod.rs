//! What the agent's parts record, for the metrics server (`crate::metrics`) to serve: one
//! registry ([`Metrics`]) that the installer, repair, ambient and the plugin's events count
//! into, and the capture counters' store ([`capture_counts`]). Below every part, so that none
//! reaches into another to count. The metrics, under Istio's names where Istio has them so
//! that existing dashboards keep working, and ours where it has none:
//!
//! - `istio_cni_repair_pods_repaired_total{type,result}`: the repair controller's actions;
//! - `istio_cni_install_ready`: whether the plugin is installed and the agent ready;
//! - `istio_cni_installs_total{result}`: install steps, with Istio's result values;
//! - `redirect_cni_plugin_calls_total{command,response_code}`: the plugin's calls, from its
//!   events (`cni_protocol::events`);
//! - in ambient mode, Istio's node agent's: `ztunnel_connected` (ztunnel's connections),
//!   `nodeagent_reconcile_events_total{type}` (the pod and namespace watch's events: add,
//!   update, delete) and `istio_cni_plugin_requests_total{response_code}` (the plugin's ambient
//!   ADDs the agent handled: 200 enrolled, 500 failed);
//! - `redirect_cni_add_duration_seconds` and `redirect_cni_add_phase_duration_seconds{phase}`:
//!   histograms of ADD's whole time and of each phase (istio#60472);
//! - `redirect_cni_adopted_pods_total{result,form}`: pods found holding Istio's rules
//!   (`ADOPT_ISTIO`), replaced, kept or failed, by Istio's form;
//! - `redirect_cni_synthetic_checks_total{result}`: the ambient synthetic checks
//!   (`AMBIENT_SYNTHETIC_CHECK`), `ok` or `failed`; absent while the check is off;
//! - `redirect_cni_repair_watch_up` and `redirect_cni_repair_watch_last_list_timestamp_seconds`:
//!   whether the repair controller's watch of this node's pods works, and when it last listed
//!   them (only while the controller runs), for an alert on an agent that cannot reach the API.
//!
//! The exposition format is prometheus-client's.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use cni_protocol::events::Event;

pub mod capture_counts;

/// The histograms' buckets, in seconds: 0.5 ms to 10 s (an ADD takes a few milliseconds; a
/// pod read from a slow API server, seconds).
pub const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// An install step's outcome, as Istio's `istio_cni_installs_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// The CNI config was written, or found in place at the first pass: `SUCCESS`.
    Success,
    /// The plugin binary could not be copied: `COPY_BINARIES_FAILURE`.
    CopyBinariesFailure,
    /// The service account's token or CA could not be read: `READ_SERVICE_ACCOUNT_FAILURE`.
    ReadServiceAccountFailure,
    /// The kubeconfig could not be made or written: `CREATE_KUBECONFIG_FAILURE`.
    CreateKubeconfigFailure,
    /// The CNI config could not be written: `CREATE_CNI_CONFIG_FAILURE`.
    CreateCniConfigFailure,
}

impl Install {
    fn label(self) -> &'static str {
        match self {
            Install::Success => "SUCCESS",
            Install::CopyBinariesFailure => "COPY_BINARIES_FAILURE",
            Install::ReadServiceAccountFailure => "READ_SERVICE_ACCOUNT_FAILURE",
            Install::CreateKubeconfigFailure => "CREATE_KUBECONFIG_FAILURE",
            Install::CreateCniConfigFailure => "CREATE_CNI_CONFIG_FAILURE",
        }
    }
}

/// How one repair, delete or label ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Result {
    Success,
    Fail,
    /// Nothing to do (label mode: the label is there already; repair mode: the plugin would
    /// not capture the pod).
    Skip,
}

impl Result {
    fn label(self) -> &'static str {
        match self {
            Result::Success => "success",
            Result::Fail => "fail",
            Result::Skip => "skip",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepairLabels {
    r#type: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    command: String,
    response_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The registry and its metrics; clones share them.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    repaired: Family<RepairLabels, Counter>,
    ready: Gauge,
    installs: Family<ResultLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    add: Histogram,
    add_phases: Histograms<PhaseLabels>,
    watch_up: Gauge,
    watch_listed: Gauge<f64, AtomicU64>,
    adopted: Family<AdoptLabels, Counter>,
    ambient: AmbientMetrics,
    /// `CAPTURE_COUNTERS`: the pods' counters, encoded at each scrape.
    counts: Option<crate::telemetry::capture_counts::CaptureCounts>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdoptLabels {
    result: &'static str,
    form: &'static str,
}

/// Ambient mode's metrics (registered with [`Metrics::with_ambient`]).
#[derive(Clone)]
struct AmbientMetrics {
    pods: Family<StageLabels, Gauge>,
    connected: Gauge,
    connections: Counter,
    failures: Counter,
    passes: Counter,
    pass_seconds: Histogram,
    repairs: Family<KindLabels, Counter>,
    /// Istio's `ztunnel_connected`.
    ztunnel_connected: Gauge,
    /// Istio's `nodeagent_reconcile_events_total{type}`.
    events: Family<TypeLabels, Counter>,
    /// Istio's `istio_cni_plugin_requests_total{response_code}`.
    istio_requests: Family<CodeLabels, Counter>,
    /// `redirect_cni_synthetic_checks_total{result}`.
    synthetic: Family<ResultLabels, Counter>,
    /// Connections counted so far (the server's count only grows).
    seen: Arc<AtomicU64>,
}

impl Default for AmbientMetrics {
    fn default() -> Self {
        AmbientMetrics {
            pods: Family::default(),
            connected: Gauge::default(),
            connections: Counter::default(),
            failures: Counter::default(),
            passes: Counter::default(),
            // 100 µs to 6.5 s: a pass over a full node's pods is tens of milliseconds.
            pass_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 4.0, 9),
            ),
            repairs: Family::default(),
            ztunnel_connected: Gauge::default(),
            events: Family::default(),
            istio_requests: Family::default(),
            synthetic: Family::default(),
            seen: Arc::default(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    response_code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

/// Istio's node agent's ambient metrics, under its names, labels and meanings (its
/// ztunnelserver.go, informers.go, cni-watcher.go), so that its dashboards and alerts work.
fn register_istios_ambient(registry: &mut Registry, a: &AmbientMetrics) {
    registry.register(
        "ztunnel_connected",
        "Number of ztunnel connections to the node agent (Istio's name)",
        a.ztunnel_connected.clone(),
    );
    registry.register(
        "nodeagent_reconcile_events",
        "The total number of node agent reconcile events: the ambient watch's pod and namespace events, by type (add, update, delete) (Istio's name)",
        a.events.clone(),
    );
    registry.register(
        "istio_cni_plugin_requests",
        "The total number of CNI plugin requests handled by the node agent: the plugin's ambient ADDs, by response code (200 enrolled, 500 failed) (Istio's name)",
        a.istio_requests.clone(),
    );
    for r#type in ["add", "update", "delete"] {
        let _ = a.events.get_or_create(&TypeLabels { r#type });
    }
}

/// `redirect_cni_adopted_pods_total`, registered.
fn register_adopted(registry: &mut Registry) -> Family<AdoptLabels, Counter> {
    let adopted = Family::<AdoptLabels, Counter>::default();
    registry.register(
        "redirect_cni_adopted_pods",
        "Pods found holding Istio's capture rules (ADOPT_ISTIO), by result (replaced: ours in place and Istio's removed; kept: left with Istio's rules; failed: retried) and Istio's form (nftables, iptables-nft, iptables-legacy)",
        adopted.clone(),
    );
    // Present at zero from the start, for alerts and dashboards (a failure's form is unknown).
    for form in ["nftables", "iptables-nft", "iptables-legacy"] {
        for result in ["replaced", "kept"] {
            let _ = adopted.get_or_create(&AdoptLabels { result, form });
        }
    }
    let _ = adopted.get_or_create(&AdoptLabels {
        result: "failed",
        form: "unknown",
    });
    adopted
}

impl Metrics {
    /// The metrics, with the counters of the repair controller's `mode` (its `type` label:
    /// `repair`, `delete`, `label`; if any) present at zero from the start; the watch's gauges
    /// only when the repair controller runs (`watch`).
    pub fn new(mode: Option<&'static str>, watch: bool) -> Self {
        let mut registry = Registry::default();
        let repaired = Family::<RepairLabels, Counter>::default();
        registry.register(
            "istio_cni_repair_pods_repaired",
            "Pods repaired, deleted or labelled by the repair controller, by action and result",
            repaired.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "istio_cni_install_ready",
            "Whether the plugin is installed on this node and the agent is ready (1) or not (0)",
            ready.clone(),
        );
        let installs = Family::<ResultLabels, Counter>::default();
        registry.register(
            "istio_cni_installs",
            "Install steps of the plugin by the installer, by result (Istio's values)",
            installs.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "redirect_cni_plugin_calls",
            "Calls of the CNI plugin on this node, by command and CNI result code (0: success)",
            requests.clone(),
        );
        let add = histogram();
        registry.register(
            "redirect_cni_add_duration_seconds",
            "The plugin's ADD, from its process's start to its answer",
            add.clone(),
        );
        let add_phases: Histograms<PhaseLabels> = Family::new_with_constructor(histogram);
        registry.register(
            "redirect_cni_add_phase_duration_seconds",
            "The phases of the plugin's ADD: config (parsing stdin), pod_read (reading the pod from the API), apply (programming the namespace)",
            add_phases.clone(),
        );
        let watch_up = Gauge::default();
        let watch_listed = Gauge::<f64, AtomicU64>::default();
        if watch {
            registry.register(
                "redirect_cni_repair_watch_up",
                "Whether the repair controller's watch of this node's pods works (1) or not (0: the API server unreachable, or the watch refused)",
                watch_up.clone(),
            );
            registry.register(
                "redirect_cni_repair_watch_last_list_timestamp_seconds",
                "When the repair controller last listed this node's pods (Unix time; 0: not yet)",
                watch_listed.clone(),
            );
        }
        let adopted = register_adopted(&mut registry);
        if let Some(r#type) = mode {
            for result in [Result::Success, Result::Fail] {
                repaired
                    .get_or_create(&RepairLabels {
                        r#type,
                        result: result.label(),
                    })
                    .get();
            }
        }
        Metrics {
            registry: Arc::new(registry),
            repaired,
            ready,
            installs,
            requests,
            add,
            add_phases,
            watch_up,
            watch_listed,
            adopted,
            ambient: AmbientMetrics::default(),
            counts: None,
        }
    }

    /// Adds ambient mode's metrics (right after [`Metrics::new`], before any clone).
    pub fn with_ambient(mut self) -> Self {
        let a = &self.ambient;
        let Some(registry) = Arc::get_mut(&mut self.registry) else {
            return self;
        };
        registry.register(
            "redirect_cni_ambient_pods",
            "Ambient pods in this node's data plane, by stage (enabled: ztunnel acknowledged them; pending: rules in place, ztunnel not yet)",
            a.pods.clone(),
        );
        registry.register(
            "redirect_cni_ambient_ztunnel_connected",
            "Whether ztunnel is connected to the agent's ZDS socket (1) or not (0)",
            a.connected.clone(),
        );
        registry.register(
            "redirect_cni_ambient_ztunnel_connections",
            "ZDS connections from ztunnel that got their snapshot",
            a.connections.clone(),
        );
        registry.register(
            "redirect_cni_ambient_failures",
            "Failed enrollments, releases or annotations of ambient pods (each retried)",
            a.failures.clone(),
        );
        registry.register(
            "redirect_cni_ambient_reconcile_passes",
            "Passes of the ambient controller (every AMBIENT_RECONCILE_INTERVAL, and when ztunnel comes or goes): each reads back every enrolled pod's rules, the host's probe table and what ztunnel acked",
            a.passes.clone(),
        );
        registry.register(
            "redirect_cni_ambient_reconcile_pass_seconds",
            "How long each pass took",
            a.pass_seconds.clone(),
        );
        registry.register(
            "redirect_cni_ambient_repairs",
            "What the passes found differing and put right, by kind (host_table: the host's probe table recreated; host_members: addresses missing from or left in its sets; pod_rules: a pod's in-pod rules programmed again; namespace: a pod's namespace found again or bound anew; resent: a pod the current ztunnel had not acked, sent again; probe_routes: an ip rule for a pod behind an AWS branch ENI added or removed)",
            a.repairs.clone(),
        );
        registry.register(
            "redirect_cni_synthetic_checks",
            "Synthetic checks of ambient pods (AMBIENT_SYNTHETIC_CHECK), one a pass at most: a connection to a documentation address in the pod's namespace, by result (ok: it landed on ztunnel's outbound listener 15001; failed: refused, timed out, no route, landed elsewhere or the namespace gone)",
            a.synthetic.clone(),
        );
        register_istios_ambient(registry, a);
        for stage in ["enabled", "pending"] {
            a.pods.get_or_create(&StageLabels { stage }).set(0);
        }
        for kind in [
            "host_table",
            "host_members",
            "pod_rules",
            "namespace",
            "resent",
            "listeners",
        ] {
            let _ = a.repairs.get_or_create(&KindLabels { kind });
        }
        self
    }

    /// Adds the capture counters (`CAPTURE_COUNTERS`, right after [`Metrics::new`], before
    /// any clone): `redirect_cni_capture_packets_total` and `redirect_cni_capture_bytes_total`,
    /// per path, and per pod when the mode says so.
    pub fn with_counters(
        mut self,
        counts: crate::telemetry::capture_counts::CaptureCounts,
    ) -> Self {
        let Some(registry) = Arc::get_mut(&mut self.registry) else {
            return self;
        };
        registry.register_collector(Box::new(counts.clone()));
        self.counts = Some(counts);
        self
    }

    /// The pod watch's health on `redirect_cni_repair_watch_up` and
    /// `redirect_cni_repair_watch_last_list_timestamp_seconds`, for its informer.
    pub fn watch_gauges(&self) -> crate::informers::health::Gauges {
        let (up, listed) = (self.clone(), self.clone());
        crate::informers::health::Gauges {
            up: Box::new(move |u| up.set_watch_up(u)),
            listed: Box::new(move || listed.watch_listed()),
        }
    }

    /// The pods' counters (`CAPTURE_COUNTERS`), for the readers to set; `None` when off.
    pub fn capture_counts(&self) -> Option<&crate::telemetry::capture_counts::CaptureCounts> {
        self.counts.as_ref()
    }

    /// One pod found holding Istio's rules: `result` replaced, kept or failed; `form` Istio's.
    pub fn adopted(&self, result: &'static str, form: &'static str) {
        self.adopted
            .get_or_create(&AdoptLabels { result, form })
            .inc();
    }

    /// One pass of the ambient controller, and how long it took.
    pub fn ambient_pass(&self, took: std::time::Duration) {
        self.ambient.passes.inc();
        self.ambient.pass_seconds.observe(took.as_secs_f64());
    }

    /// One repair of `kind` (`RepairKind::label`).
    pub fn ambient_repair(&self, kind: &'static str) {
        self.ambient
            .repairs
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// One synthetic check, `ok` or failed; both series present from the first.
    pub fn synthetic_check(&self, ok: bool) {
        let s = &self.ambient.synthetic;
        let _ = s.get_or_create(&ResultLabels { result: "ok" });
        let _ = s.get_or_create(&ResultLabels { result: "failed" });
        let result = if ok { "ok" } else { "failed" };
        s.get_or_create(&ResultLabels { result }).inc();
    }

    /// The data plane as it stands: pods by stage, ztunnel's connections open now (two during
    /// its rollout) and made so far.
    pub fn set_ambient(&self, enabled: usize, pending: usize, open: usize, connections: u64) {
        let a = &self.ambient;
        a.pods
            .get_or_create(&StageLabels { stage: "enabled" })
            .set(enabled as i64);
        a.pods
            .get_or_create(&StageLabels { stage: "pending" })
            .set(pending as i64);
        a.connected.set(i64::from(open > 0));
        // Istio's gauge counts the connections open, as its connMgr does.
        a.ztunnel_connected
            .set(i64::try_from(open).unwrap_or(i64::MAX));
        let before = a
            .seen
            .swap(connections, std::sync::atomic::Ordering::Relaxed);
        if connections > before {
            a.connections.inc_by(connections - before);
        }
    }

    /// One event of the ambient watch: `add`, `update` or `delete` (Istio's types).
    pub fn reconcile_event(&self, r#type: &'static str) {
        self.ambient
            .events
            .get_or_create(&TypeLabels { r#type })
            .inc();
    }

    /// One ambient ADD the plugin asked for, answered with Istio's code: `200` (enrolled) or
    /// `500` (not).
    pub fn ambient_plugin_request(&self, response_code: &'static str) {
        self.ambient
            .istio_requests
            .get_or_create(&CodeLabels { response_code })
            .inc();
    }

    /// One failed ambient step.
    pub fn ambient_failed(&self) {
        self.ambient.failures.inc();
    }

    /// The watch works (`true`) or not.
    pub fn set_watch_up(&self, up: bool) {
        self.watch_up.set(i64::from(up));
    }

    /// The watch listed this node's pods now.
    pub fn watch_listed(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.watch_listed.set(now);
    }

    /// One install step ended.
    pub fn installed(&self, result: Install) {
        self.installs
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
    }

    /// One call of the plugin, as its event tells it.
    pub fn plugin_event(&self, e: &Event) {
        self.requests
            .get_or_create(&RequestLabels {
                command: e.command.clone(),
                response_code: e.code_label(),
            })
            .inc();
        if e.command != "ADD" {
            return;
        }
        let seconds = |us: u64| us as f64 / 1e6;
        self.add.observe(seconds(e.total_us));
        for (phase, us) in [
            ("config", e.phases.config_us),
            ("pod_read", e.phases.pod_read_us),
            ("apply", e.phases.apply_us),
        ] {
            if let Some(us) = us {
                self.add_phases
                    .get_or_create(&PhaseLabels { phase })
                    .observe(seconds(us));
            }
        }
    }

    /// One pod the repair controller acted on: its action's `type` label and the result.
    pub(crate) fn count(&self, r#type: &'static str, result: Result) {
        self.repaired
            .get_or_create(&RepairLabels {
                r#type,
                result: result.label(),
            })
            .inc();
    }

    pub(crate) fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_under_istios_name_and_labels() {
        let m = Metrics::new(Some("repair"), true);
        m.count("repair", Result::Success);
        m.count("repair", Result::Success);
        m.count("label", Result::Skip);
        m.set_ready(true);
        let text = m.encode();
        for line in [
            "istio_cni_repair_pods_repaired_total{type=\"repair\",result=\"success\"} 2",
            "istio_cni_repair_pods_repaired_total{type=\"repair\",result=\"fail\"} 0",
            "istio_cni_repair_pods_repaired_total{type=\"label\",result=\"skip\"} 1",
            "istio_cni_install_ready 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn plugin_events_count_by_command_and_code_and_time_adds_by_phase() {
        let m = Metrics::new(None, false);
        let add = |code, total_us, apply_us| Event {
            command: "ADD".into(),
            code,
            pod: Some("shop/web-0".into()),
            total_us,
            phases: cni_protocol::events::Phases {
                config_us: Some(100),
                apply_us,
                ..Default::default()
            },
        };
        m.plugin_event(&add(0, 3_000, Some(2_000)));
        m.plugin_event(&add(0, 700, Some(400)));
        m.plugin_event(&add(101, 400, None));
        m.plugin_event(&Event {
            command: "DEL".into(),
            total_us: 9_000_000,
            ..Event::default()
        });
        m.installed(Install::Success);
        m.installed(Install::ReadServiceAccountFailure);
        let text = m.encode();
        for line in [
            "redirect_cni_plugin_calls_total{command=\"ADD\",response_code=\"0\"} 2",
            "redirect_cni_plugin_calls_total{command=\"ADD\",response_code=\"101\"} 1",
            "redirect_cni_plugin_calls_total{command=\"DEL\",response_code=\"0\"} 1",
            "istio_cni_installs_total{result=\"SUCCESS\"} 1",
            "istio_cni_installs_total{result=\"READ_SERVICE_ACCOUNT_FAILURE\"} 1",
            // DEL is not in the ADD histogram: 3 ADDs, one under 0.5 ms, two under 1 ms.
            "redirect_cni_add_duration_seconds_count 3",
            "redirect_cni_add_duration_seconds_bucket{le=\"0.0005\"} 1",
            "redirect_cni_add_duration_seconds_bucket{le=\"0.001\"} 2",
            "redirect_cni_add_duration_seconds_bucket{le=\"0.005\"} 3",
            "redirect_cni_add_phase_duration_seconds_count{phase=\"config\"} 3",
            "redirect_cni_add_phase_duration_seconds_count{phase=\"apply\"} 2",
            "redirect_cni_add_phase_duration_seconds_bucket{le=\"0.0005\",phase=\"apply\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("phase=\"pod_read\""), "{text}");
    }
}
