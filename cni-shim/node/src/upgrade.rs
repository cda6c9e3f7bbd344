//! A clean stop: an upgrade (or a restart) of the DaemonSet, or its uninstall? On a real node a
//! rollout stops the old agent 3 to 12 s before the new one starts; had the old one removed the
//! plugin, every mesh pod created in that gap would start uncaptured and crash-loop until the
//! repair controller of the next agent acted. So the plugin stays in place when this pod's
//! DaemonSet still exists, is not being deleted and still selects this node (its node selector,
//! its required node affinity, its tolerations of the node's taints), as Istio's ambient agent
//! decides. Anything else (the DaemonSet gone or being deleted, our permission gone with the
//! uninstall, an API server that does not answer in time, no `POD_NAME`) removes it, as a stop
//! always did: a plugin left behind with no agent to come would keep capturing pods. With an
//! owned config file an API server that cannot be asked keeps it instead, Istio's default there.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec, Taint, Toleration,
};
use kube::api::Api;
use kube::Client;

use crate::settings::Settings;

/// What the agent does with the installation when it stops cleanly.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// Leave it for the next agent, for this reason.
    Keep(String),
    /// Remove it, for this reason.
    Remove(String),
}

/// How long the stop waits for the API server, well within the pod's grace period (10 s).
pub const DEADLINE: Duration = Duration::from_secs(4);

/// The decision, on a runtime of its own (the agent's has stopped by then). With an owned
/// config file (`ISTIO_OWNED_CNI_CONFIG`) a stop that cannot be told apart (the API server
/// unreachable or silent) keeps the plugin, as Istio's agent decides then; proof of an
/// uninstall (the DaemonSet gone or no longer for this node, our permission gone) removes it.
pub fn decide(settings: &Settings) -> Stop {
    let unsure = |why: String| match settings.owned_conf_name {
        Some(_) => Stop::Keep(format!(
            "{why}; with an owned config file a stop that cannot be told apart keeps the \
             plugin (Istio's default)"
        )),
        None => Stop::Remove(why),
    };
    if settings.pod_name.is_empty() || settings.pod_namespace.is_empty() {
        return Stop::Remove(
            "POD_NAME or POD_NAMESPACE is not set, so the DaemonSet cannot be told apart from \
             an uninstall (set both from the downward API)"
                .into(),
        );
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return unsure(format!("cannot ask the API server: {e}")),
    };
    runtime.block_on(async {
        let client = match crate::kube_client::client(settings, None).await {
            Ok(c) => c,
            Err(e) => return unsure(format!("cannot ask the API server: {e}")),
        };
        let asked = ask(
            &client,
            &settings.pod_namespace,
            &settings.pod_name,
            settings.node(),
        );
        match tokio::time::timeout(DEADLINE, asked).await {
            Ok(Ok(stop)) => stop,
            Ok(Err(why)) => unsure(why),
            Err(_) => unsure(format!("the API server did not answer within {DEADLINE:?}")),
        }
    })
}

/// Reads this pod, its DaemonSet and this node, and decides; `Err`: a read failed without
/// saying whether this is an uninstall (the caller decides).
pub async fn ask(client: &Client, namespace: &str, pod: &str, node: &str) -> Result<Stop, String> {
    let failed = |what: &str, e: kube::Error| match &e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Ok(Stop::Remove(format!(
            "cannot read {what}: our permission is gone (an uninstall removes it)"
        ))),
        _ => Err(format!("cannot read {what}: {e}")),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let me = match pods.get(pod).await {
        Ok(p) => p,
        Err(e) => return failed(&format!("this pod {namespace}/{pod}"), e),
    };
    let Some(ds_name) = owner_daemonset(&me) else {
        return Ok(Stop::Remove(format!(
            "this pod {namespace}/{pod} belongs to no DaemonSet"
        )));
    };
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let ds = match daemonsets.get_opt(&ds_name).await {
        Ok(Some(ds)) => ds,
        Ok(None) => {
            let why = format!("the DaemonSet {namespace}/{ds_name} is gone");
            return Ok(Stop::Remove(why));
        }
        Err(e) => return failed(&format!("the DaemonSet {namespace}/{ds_name}"), e),
    };
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(Stop::Remove(format!(
            "the DaemonSet {namespace}/{ds_name} is being deleted"
        )));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let this = match nodes.get(node).await {
        Ok(n) => n,
        Err(e) => return failed(&format!("this node {node}"), e),
    };
    let spec = ds.spec.and_then(|s| s.template.spec).unwrap_or_default();
    Ok(match selects(&spec, &this) {
        Ok(()) => Stop::Keep(format!(
            "the DaemonSet {namespace}/{ds_name} still runs a pod on node {node} (an upgrade or \
             a restart); the next agent takes over the plugin"
        )),
        Err(why) => Stop::Remove(format!(
            "the DaemonSet {namespace}/{ds_name} no longer runs a pod on node {node}: {why}"
        )),
    })
}

fn owner_daemonset(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true))
        .map(|o| o.name.clone())
}

/// Whether a DaemonSet whose pods have `spec` places one on `node`, or why not: its node
/// selector, its required node affinity, and its tolerations of the node's NoSchedule and
/// NoExecute taints (what the DaemonSet controller checks).
pub fn selects(spec: &PodSpec, node: &Node) -> Result<(), String> {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.as_deref().unwrap_or("");
    for (k, v) in spec.node_selector.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Err(format!("its nodeSelector asks for {k}={v}"));
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(required) = required {
        // The terms are ORed; a term's requirements ANDed.
        if !required
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, name))
        {
            return Err("its required node affinity does not match the node".into());
        }
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    for taint in node.spec.iter().flat_map(|s| s.taints.iter().flatten()) {
        let repels = matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute");
        if repels && !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Err(format!(
                "it does not tolerate the node's taint {}:{}",
                taint.key, taint.effect
            ));
        }
    }
    Ok(())
}

fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term matches no node (Kubernetes' rule).
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let field = |r: &NodeSelectorRequirement| {
        let value = (r.key == "metadata.name").then_some(name);
        requirement(r, value)
    };
    exprs
        .iter()
        .all(|r| requirement(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(field)
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect = t.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        // An empty key with Exists tolerates every taint.
        "Exists" => key.is_empty() || key == taint.key,
        _ => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut v = v;
        v["containers"] = json!([]);
        serde_json::from_value(v).unwrap()
    }

    fn linux_node() -> Node {
        node(
            json!({"metadata": {"name": "node-1", "labels": {"kubernetes.io/os": "linux", "zone": "a", "cores": "8"}},
            "spec": {"taints": [{"key": "cni.istio.io/not-ready", "value": "true", "effect": "NoSchedule"}]}}),
        )
    }

    #[test]
    fn the_charts_spec_selects_a_linux_node_whatever_its_taints() {
        let chart = spec(json!({"nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"operator": "Exists"}]}));
        assert_eq!(selects(&chart, &linux_node()), Ok(()));
    }

    #[test]
    fn a_node_selector_or_an_untolerated_taint_excludes_the_node() {
        let windows = spec(json!({"nodeSelector": {"kubernetes.io/os": "windows"},
            "tolerations": [{"operator": "Exists"}]}));
        let err = selects(&windows, &linux_node()).unwrap_err();
        assert!(err.contains("kubernetes.io/os=windows"), "{err}");
        let intolerant = spec(json!({"tolerations": [{"key": "other", "operator": "Exists"}]}));
        let err = selects(&intolerant, &linux_node()).unwrap_err();
        assert!(err.contains("cni.istio.io/not-ready:NoSchedule"), "{err}");
        let exact =
            spec(json!({"tolerations": [{"key": "cni.istio.io/not-ready", "value": "true"}]}));
        assert_eq!(selects(&exact, &linux_node()), Ok(()));
        let wrong_value =
            spec(json!({"tolerations": [{"key": "cni.istio.io/not-ready", "value": "no"}]}));
        assert!(selects(&wrong_value, &linux_node()).is_err());
        let other_effect =
            spec(json!({"tolerations": [{"operator": "Exists", "effect": "NoExecute"}]}));
        assert!(selects(&other_effect, &linux_node()).is_err());
    }

    #[test]
    fn required_node_affinity_terms_are_ored_and_their_requirements_anded() {
        let affinity = |terms: serde_json::Value| {
            spec(
                json!({"tolerations": [{"operator": "Exists"}], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
            )
        };
        let n = linux_node();
        let ok = |t| selects(&affinity(t), &n).is_ok();
        assert!(ok(
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}])
        ));
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}])
        ));
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}])
        ));
        assert!(ok(
            json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])
        ));
        assert!(!ok(
            json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]}])
        ));
        assert!(ok(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}])
        ));
        assert!(!ok(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}])
        ));
        // OR of terms; AND within one.
        assert!(ok(json!([
            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}])));
        assert!(!ok(json!([{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "gpu", "operator": "Exists"}]}])));
        assert!(!ok(json!([{}])), "an empty term matches nothing");
    }

    #[test]
    fn without_its_pod_name_the_agent_removes_the_plugin() {
        let s = Settings {
            cleanup_on_exit: true,
            ..Settings::default()
        };
        assert!(matches!(decide(&s), Stop::Remove(why) if why.contains("POD_NAME")));
    }
}
