//! The agent's metrics, under Istio's names so that existing dashboards keep working:
//! `istio_cni_repair_pods_repaired_total{type,result}` and `istio_cni_install_ready`. The
//! exposition format is prometheus-client's.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::repair::detect::Action;

/// How one repair, delete or label ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Result {
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

/// The registry and its metrics; clones share them.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    repaired: Family<RepairLabels, Counter>,
    ready: Gauge,
}

impl Metrics {
    /// The metrics, with the counters of `mode` (if any) present at zero from the start.
    pub fn new(mode: Option<Action>) -> Self {
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
        if let Some(action) = mode {
            for result in [Result::Success, Result::Fail] {
                repaired
                    .get_or_create(&RepairLabels {
                        r#type: action.metric_type(),
                        result: result.label(),
                    })
                    .get();
            }
        }
        Metrics {
            registry: Arc::new(registry),
            repaired,
            ready,
        }
    }

    pub fn count(&self, action: Action, result: Result) {
        self.repaired
            .get_or_create(&RepairLabels {
                r#type: action.metric_type(),
                result: result.label(),
            })
            .inc();
    }

    pub fn set_ready(&self, ready: bool) {
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
        let m = Metrics::new(Some(Action::Repair));
        m.count(Action::Repair, Result::Success);
        m.count(Action::Repair, Result::Success);
        m.count(Action::Label, Result::Skip);
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
}
