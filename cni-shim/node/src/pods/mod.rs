//! The pods on this node, as both controllers (repair, ambient) see them: a pod's name and
//! addresses as its status lists them (`label`, `ips`, `live`), where the agent looks for a pod's
//! network namespace (`Places`, and `search`: by the pod's cgroup and address under the host's
//! `/proc`), the watch's relist (`not_listed`: the pods a new listing no longer names, deleted
//! while the watch was down) and the per-pod work queue with its backoff (`queue`). Neither
//! controller reaches into the other: what they share is here.

pub mod capture;
pub mod queue;
pub mod search;
pub mod selectors;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

/// Where the agent looks for a pod's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Places {
    /// The host's `/proc` as mounted in the agent (`/host/proc`).
    pub proc: PathBuf,
    /// The runtime's pinned namespaces (`/var/run/netns`).
    pub pins: PathBuf,
}

impl Default for Places {
    fn default() -> Self {
        Places {
            proc: PathBuf::from("/host/proc"),
            pins: PathBuf::from("/var/run/netns"),
        }
    }
}

/// `namespace/name`, for logs.
pub fn label(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The pod's addresses: `status.podIPs`, else `status.podIP`.
pub fn ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    status
        .pod_ip
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// Whether the pod's sandbox may still hold its addresses (not ended).
pub fn live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The UIDs known that a listing did not name: pods deleted while the watch was down (no
/// Delete event comes for them).
pub fn not_listed<'a>(
    known: impl Iterator<Item = &'a String>,
    listed: &HashSet<String>,
) -> Vec<String> {
    known.filter(|u| !listed.contains(*u)).cloned().collect()
}

/// Waits until `due`, or for ever when there is nothing due (a `select!` branch).
pub async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
