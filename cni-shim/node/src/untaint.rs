//! Prevention (`--untaint-node`): once the plugin is installed and the agent is ready, remove
//! our taint (`cni.istio.io/not-ready` by default) from this node, so that nodes registered
//! with it never run mesh pods before the plugin. Istio does this from istiod; the agent knows
//! first when its own node is ready. Only taints with exactly our key are removed, with the
//! node's resourceVersion as a precondition so that a concurrent change to the taints is not
//! overwritten (a conflict is read again and retried).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use tokio::sync::watch as signal;

/// What an untaint pass found.
#[derive(Debug, PartialEq, Eq)]
enum Untainted {
    /// Our taint was there and is gone now.
    Removed,
    /// The node does not carry it.
    Absent,
}

/// Removes every taint with key `key` from node `node`.
async fn untaint(client: &Client, node: &str, key: &str) -> Result<Untainted, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await?;
    let taints = current
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if !taints.iter().any(|t| t.key == key) {
        return Ok(Untainted::Absent);
    }
    let kept: Vec<_> = taints.into_iter().filter(|t| t.key != key).collect();
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.metadata.resource_version},
        "spec": {"taints": kept},
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Untainted::Removed)
}

/// Waits until `ready`, then untaints, retrying failures (1 s doubling to 30 s) until it
/// succeeds or `stop`.
pub async fn run(
    client: Client,
    node: String,
    key: String,
    mut ready: signal::Receiver<bool>,
    mut stop: signal::Receiver<bool>,
) {
    tokio::select! {
        _ = stop.changed() => return,
        r = ready.wait_for(|r| *r) => if r.is_err() { return },
    }
    let mut delay = Duration::from_secs(1);
    loop {
        match untaint(&client, &node, &key).await {
            Ok(Untainted::Removed) => {
                tracing::info!("removed the taint {key} from node {node}: the plugin is installed");
                return;
            }
            Ok(Untainted::Absent) => {
                tracing::info!("node {node} does not carry the taint {key}: nothing to remove");
                return;
            }
            Err(e) => tracing::error!(
                "could not remove the taint {key} from node {node}: {e}; the service account \
                 needs `get` and `patch` on nodes; retrying in {} s",
                delay.as_secs()
            ),
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}
