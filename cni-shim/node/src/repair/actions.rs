//! Delete and label modes, and their Warning Events (Istio's `DeleteBrokenPod` and
//! `LabelBrokenPod`, core/v1, source component `cni-repair`).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::chrono::Utc;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;

/// The Events' source component, as Istio's.
pub const COMPONENT: &str = "cni-repair";

pub use crate::pods::label as pod_label;

fn pods(client: &Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

/// Deletes `pod` if it is still this very object: its UID and resourceVersion are
/// preconditions, so a pod recreated under the same name, or changed since, is left alone.
pub async fn delete(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    pods(client, pod).delete(name, &params).await.map(|_| ())
}

/// Whether `pod` carries the label `key` (any value).
pub fn has_label(pod: &Pod, key: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(key))
}

/// Adds the label `key=value` to `pod` with a JSON merge patch on its `status` subresource,
/// which needs less privilege than patching the pod.
pub async fn label(client: &Client, pod: &Pod, key: &str, value: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    pods(client, pod)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Records a Warning Event on `pod`. Failing to record it is logged by the caller, never fatal.
pub async fn warn(
    client: &Client,
    pod: &Pod,
    node: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = Time(Utc::now());
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}.")),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.clone()),
            name: Some(name),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    };
    Api::<Event>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}
