//! A Kubernetes `Pod` (k8s-openapi) to the `PodInfo` capture reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use redirect_core::mesh::{ContainerInfo, PodInfo, PodSpecInfo};

/// A pod from its JSON (as `kubectl get pod -o json` or the API server prints it).
///
/// Errors name what is wrong: invalid JSON, not a `v1` `Pod`, or no `metadata.name` /
/// `metadata.namespace`.
pub fn pod_info_from_json(json: &str) -> Result<PodInfo, String> {
    let pod: Pod =
        serde_json::from_str(json).map_err(|e| format!("not a Kubernetes v1 Pod in JSON: {e}"))?;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .ok_or("the pod JSON has no metadata.namespace")?;
    let name = pod
        .metadata
        .name
        .clone()
        .ok_or("the pod JSON has no metadata.name")?;
    Ok(pod_info(pod, namespace, name))
}

/// The pod as capture sees it. `namespace` and `name` are used when the object lacks them.
pub fn pod_info(pod: Pod, namespace: String, name: String) -> PodInfo {
    let meta = pod.metadata;
    PodInfo {
        namespace: meta.namespace.unwrap_or(namespace),
        name: meta.name.unwrap_or(name),
        annotations: meta.annotations.unwrap_or_default(),
        labels: meta.labels.unwrap_or_default(),
        spec: pod.spec.map(|spec| PodSpecInfo {
            containers: spec.containers.into_iter().map(container_info).collect(),
            init_containers: spec
                .init_containers
                .unwrap_or_default()
                .into_iter()
                .map(container_info)
                .collect(),
        }),
    }
}

fn container_info(c: Container) -> ContainerInfo {
    let mut env = BTreeMap::new();
    for var in c.env.unwrap_or_default() {
        match (var.value_from, var.value) {
            // The value is resolved by the kubelet (fieldRef, secretKeyRef, ...): unknown here.
            // As the later definition wins in Kubernetes, it also hides an earlier literal.
            (Some(_), _) => {
                env.remove(&var.name);
            }
            // `value` absent means the empty string.
            (None, value) => {
                env.insert(var.name, value.unwrap_or_default());
            }
        }
    }
    let sc = c.security_context.unwrap_or_default();
    ContainerInfo {
        name: c.name,
        args: c.args.unwrap_or_default(),
        env,
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
    }
}
