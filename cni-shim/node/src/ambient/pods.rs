//! What the controller reads of a pod: whether it should be enrolled now (Istio's selectors,
//! its phase, its address), who it is, and its `ambient.istio.io/redirection` annotation.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use redirect_core::ambient::{enrollment, EnablementSelectors, Enrollment, PodView, REDIRECTION};

pub use crate::pods::{ips, label, live};

use super::dataplane::PodRef;

/// Whether a pod should be in the data plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    /// Enrolled, found by this address.
    In(IpAddr),
    /// Ambient, but it has no address yet: wait for it (the plugin's ADD enrolls it first).
    NoAddressYet,
    /// Out, and why; `deleting`: its namespace goes with it, its rules need not be removed.
    Out { why: String, deleting: bool },
}

/// The decision for `pod`, with its namespace's labels, the excluded namespaces and the
/// enablement selectors.
pub fn want(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    excluded: &[String],
    selectors: &EnablementSelectors,
) -> Want {
    let terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if pod.metadata.deletion_timestamp.is_some() || terminal {
        return Want::Out {
            why: "it is being deleted or has ended".into(),
            deleting: true,
        };
    }
    if let Enrollment::Not(why) = decide(pod, namespace_labels, excluded, selectors) {
        return Want::Out {
            why: why.into(),
            deleting: false,
        };
    }
    match ips(pod).first() {
        Some(ip) => Want::In(*ip),
        None => Want::NoAddressYet,
    }
}

/// The selectors' decision for `pod` (`redirect_core::ambient::enrollment`).
pub fn decide(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    excluded: &[String],
    selectors: &EnablementSelectors,
) -> Enrollment {
    let empty = BTreeMap::new();
    let view = PodView {
        namespace: pod.metadata.namespace.as_deref().unwrap_or(""),
        labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
        annotations: pod.metadata.annotations.as_ref().unwrap_or(&empty),
        host_network: pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false),
        namespace_labels,
    };
    enrollment(&view, excluded, selectors)
}

/// Who the pod is, for ztunnel, with the addresses its status lists (the caller replaces them
/// with those it checked).
pub fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        service_account: pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        ips: ips(pod),
    }
}

/// The pod's `ambient.istio.io/redirection` annotation.
pub fn redirection(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(REDIRECTION)
        .map(String::as_str)
}

/// The pod's annotations (empty when it has none).
pub fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_labelled_namespace_enrolls_a_running_pod_by_its_first_address() {
        let p = pod(json!({
            "metadata": {"name": "a", "namespace": "shop", "uid": "u1"},
            "spec": {"containers": [], "serviceAccountName": "web"},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "podIPs": [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}]}
        }));
        let ns = labels(&[("istio.io/dataplane-mode", "ambient")]);
        assert_eq!(
            want(&p, &ns, &[], &EnablementSelectors::default()),
            Want::In("10.0.0.9".parse().unwrap())
        );
        let r = pod_ref(&p);
        assert_eq!((r.service_account.as_str(), r.ips.len()), ("web", 2));
        assert!(matches!(
            want(&p, &labels(&[]), &[], &EnablementSelectors::default()),
            Want::Out {
                deleting: false,
                ..
            }
        ));
        assert!(matches!(
            want(&p, &ns, &["shop".into()], &EnablementSelectors::default()),
            Want::Out { .. }
        ));
    }

    #[test]
    fn no_address_waits_and_an_ended_pod_is_out_as_deleting() {
        let mut p = pod(json!({
            "metadata": {"name": "a", "namespace": "shop", "uid": "u1",
                         "labels": {"istio.io/dataplane-mode": "ambient"}},
            "spec": {"containers": []},
            "status": {"phase": "Pending"}
        }));
        assert_eq!(
            want(&p, &labels(&[]), &[], &EnablementSelectors::default()),
            Want::NoAddressYet
        );
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(matches!(
            want(&p, &labels(&[]), &[], &EnablementSelectors::default()),
            Want::Out { deleting: true, .. }
        ));
    }
}
