//! Which pods the repair controller acts on: Istio's condition (`matchesFilter` in its
//! `cni/pkg/repair`), exactly, plus pods that never restart.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

/// The filter's settings, with Istio's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// The pod must carry this annotation key (any value); "" = any pod.
    pub sidecar_annotation: String,
    /// The init container to look at; "" = any.
    pub init_container_name: String,
    /// The exit code of its last termination; 0 = any.
    pub exit_code: i32,
    /// Its termination message, trimmed; "" = any.
    pub termination_message: String,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            sidecar_annotation: "sidecar.istio.io/status".into(),
            init_container_name: "istio-validation".into(),
            exit_code: 126,
            termination_message: String::new(),
        }
    }
}

/// What the controller does with a broken pod; the order is Istio's priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Program the capture into the pod's running namespace (`REPAIR_REPAIR_PODS`).
    Repair,
    /// Delete the pod, for its controller to recreate it (`REPAIR_DELETE_PODS`).
    Delete,
    /// Label the pod (`REPAIR_LABEL_PODS`).
    Label,
}

impl Action {
    /// The `type` label of `istio_cni_repair_pods_repaired_total`.
    pub fn metric_type(self) -> &'static str {
        match self {
            Action::Repair => "repair",
            Action::Delete => "delete",
            Action::Label => "label",
        }
    }
}

/// Whether `pod` is broken for `action`:
/// - it carries the sidecar annotation;
/// - an init container of that name is not terminated with success (reason `Completed` or
///   exit 0), and
/// - its last termination (`lastState.terminated`) has the exit code and message, or, for a pod
///   with `restartPolicy: Never` in delete and label mode, its current termination has them:
///   such a pod is never restarted, so it never has a last state (Istio never detects it,
///   istio#49210). Repairing one in place would not help: its validation never runs again.
pub fn is_broken(pod: &Pod, f: &Filter, action: Action) -> bool {
    if !f.sidecar_annotation.is_empty()
        && !pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(&f.sidecar_annotation))
    {
        return false;
    }
    let never_restarts = action != Action::Repair
        && pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    statuses.iter().any(|c| {
        if !f.init_container_name.is_empty() && c.name != f.init_container_name {
            return false;
        }
        let current = c.state.as_ref().and_then(|s| s.terminated.as_ref());
        if current.is_some_and(|t| t.reason.as_deref() == Some("Completed") || t.exit_code == 0) {
            return false;
        }
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        last.is_some_and(|t| matches(t, f))
            || (never_restarts && current.is_some_and(|t| matches(t, f)))
    })
}

fn matches(t: &ContainerStateTerminated, f: &Filter) -> bool {
    let message = f.termination_message.trim();
    (message.is_empty() || t.message.as_deref().unwrap_or("").trim() == message)
        && (f.exit_code == 0 || t.exit_code == f.exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn pod(annotated: bool, restart: &str, state: Value, last: Value) -> Pod {
        let annotations = if annotated {
            json!({"sidecar.istio.io/status": "{}"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1", "annotations": annotations},
            "spec": {"restartPolicy": restart, "containers": [{"name": "app"}]},
            "status": {"initContainerStatuses": [{
                "name": "istio-validation", "image": "i", "imageID": "", "ready": false,
                "restartCount": 1, "state": state, "lastState": last
            }]}
        }))
        .unwrap()
    }

    fn terminated(code: i32, reason: &str) -> Value {
        json!({"terminated": {"exitCode": code, "reason": reason}})
    }

    fn crashloop() -> Value {
        json!({"waiting": {"reason": "CrashLoopBackOff"}})
    }

    const ALL: [Action; 3] = [Action::Repair, Action::Delete, Action::Label];

    /// Istio's own unit cases (`repair_test.go`), in every mode.
    #[test]
    fn istios_cases() {
        let f = Filter::default();
        let broken = [
            pod(true, "Always", crashloop(), terminated(126, "Error")),
            pod(
                true,
                "Always",
                terminated(126, "Error"),
                terminated(126, "Error"),
            ),
        ];
        let working = [
            pod(true, "Always", json!({"running": {}}), json!({})),
            pod(
                true,
                "Always",
                terminated(0, "Completed"),
                terminated(126, "Error"),
            ),
            pod(true, "Always", crashloop(), terminated(55, "Error")),
            pod(false, "Always", crashloop(), terminated(126, "Error")),
        ];
        for a in ALL {
            for p in &broken {
                assert!(is_broken(p, &f, a), "{a:?}: {:?}", p.status);
            }
            for p in &working {
                assert!(!is_broken(p, &f, a), "{a:?}: {:?}", p.status);
            }
        }
        let no_status: Pod = serde_json::from_value(json!({
            "metadata": {"annotations": {"sidecar.istio.io/status": "{}"}}
        }))
        .unwrap();
        assert!(!is_broken(&no_status, &f, Action::Repair));
    }

    #[test]
    fn a_pod_that_never_restarts_is_broken_at_its_first_failure_outside_repair_mode() {
        let f = Filter::default();
        let job = pod(true, "Never", terminated(126, "Error"), json!({}));
        assert!(!is_broken(&job, &f, Action::Repair));
        assert!(is_broken(&job, &f, Action::Delete));
        assert!(is_broken(&job, &f, Action::Label));
        let other_code = pod(true, "Never", terminated(1, "Error"), json!({}));
        assert!(!is_broken(&other_code, &f, Action::Delete));
        // A pod that does restart is left to its next restart, as Istio does.
        let first = pod(true, "Always", terminated(126, "Error"), json!({}));
        assert!(!is_broken(&first, &f, Action::Delete));
    }

    #[test]
    fn filters_on_name_code_and_message() {
        let mut last = terminated(126, "Error");
        last["terminated"]["message"] = json!("  iptables validation failed  ");
        let p = pod(true, "Always", crashloop(), last);
        let with = |f: Filter| is_broken(&p, &f, Action::Repair);
        assert!(with(Filter {
            termination_message: "iptables validation failed".into(),
            ..Filter::default()
        }));
        assert!(!with(Filter {
            termination_message: "something else".into(),
            ..Filter::default()
        }));
        assert!(!with(Filter {
            init_container_name: "other".into(),
            ..Filter::default()
        }));
        assert!(with(Filter {
            init_container_name: String::new(),
            exit_code: 0,
            ..Filter::default()
        }));
        assert!(with(Filter {
            sidecar_annotation: String::new(),
            ..Filter::default()
        }));
    }
}
