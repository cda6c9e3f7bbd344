//! Which pods Istio's ambient mode enrolls, and what each pod's annotations change in its
//! in-pod rules (Istio's `enablement_selector.go` with the selectors of [`crate::enablement`],
//! and `getPodLevelTrafficOverrides`).

use std::collections::BTreeMap;

use redirect_model::{AmbientConfig, Error as ModelError};

pub use crate::enablement::{
    EnablementSelector, EnablementSelectors, LabelSelector, Operator, Requirement, SelectorError,
};
use crate::go::parse_bool;

/// kubelet's UID for the host's probe SNAT, from the host's `/proc` (see [`crate::kubelet`]).
pub use crate::kubelet::{kubelet_uid, KubeletUidError};

/// The label that enrolls a namespace or a pod (`ambient`), or keeps a pod out (`none`).
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";
/// Istio's system namespace (its agent's `SYSTEM_NAMESPACE` default), where a pod labelled
/// `app=ztunnel` is ztunnel and never enrolled.
pub const SYSTEM_NAMESPACE: &str = "istio-system";
/// The annotation of a sidecar pod: never ambient.
pub const SIDECAR_STATUS: &str = "sidecar.istio.io/status";
/// `true`: outbound captured, inbound not.
pub const BYPASS_INBOUND: &str = "ambient.istio.io/bypass-inbound-capture";
/// `true`/`false`: the pod's own DNS capture setting.
pub const DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
/// A comma-separated list of interfaces whose TCP goes to ztunnel's outbound port.
pub const REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
/// The annotation the agent sets on an enrolled pod (`enabled`, or `pending` while ztunnel has
/// not acknowledged it).
pub const REDIRECTION: &str = "ambient.istio.io/redirection";

/// The IP sets Istio's ambient agent keeps kubelet's probe addresses in, on the host (its
/// `cni/pkg/ipset`): matched by its probe SNAT chain, and ours to remove once that is gone.
pub const PROBE_SETS: [&str; 2] = ["istio-inpod-probes-v4", "istio-inpod-probes-v6"];

/// What the enrollment decision reads of a pod.
#[derive(Clone, Copy, Debug)]
pub struct PodView<'a> {
    /// The pod's namespace, checked against the excluded ones.
    pub namespace: &'a str,
    /// The pod's labels ([`DATAPLANE_MODE`]).
    pub labels: &'a BTreeMap<String, String>,
    /// The pod's annotations ([`SIDECAR_STATUS`]).
    pub annotations: &'a BTreeMap<String, String>,
    /// `spec.hostNetwork`: such a pod is never ambient.
    pub host_network: bool,
    /// The labels of the pod's namespace.
    pub namespace_labels: &'a BTreeMap<String, String>,
}

/// Whether a pod is ambient, and if not, why not (for the agent's log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enrollment {
    /// Enrolled: its traffic goes through ztunnel.
    Ambient,
    /// Not enrolled, with the reason.
    Not(&'static str),
}

/// Whether the pod is enrolled by `selectors` ([`EnablementSelectors`]); never a host-network
/// pod, a sidecar pod or a pod of an excluded namespace, whatever the selectors say.
pub fn enrollment(
    pod: &PodView,
    excluded_namespaces: &[String],
    selectors: &EnablementSelectors,
) -> Enrollment {
    if pod.host_network {
        return Enrollment::Not("on the host's network");
    }
    if pod.annotations.contains_key(SIDECAR_STATUS) {
        return Enrollment::Not("has a sidecar");
    }
    if excluded_namespaces.iter().any(|n| n == pod.namespace) {
        return Enrollment::Not("in an excluded namespace");
    }
    if pod.namespace == SYSTEM_NAMESPACE && pod.labels.get("app").is_some_and(|a| a == "ztunnel") {
        // Istio's IsZtunnelPod: a selector that takes every pod must not take ztunnel.
        return Enrollment::Not("ztunnel itself");
    }
    if selectors.matches(pod.labels, pod.namespace_labels) {
        return Enrollment::Ambient;
    }
    if !selectors.is_istio_default() {
        return Enrollment::Not("no enablement selector matches its labels and its namespace's");
    }
    match (mode(pod.labels), mode(pod.namespace_labels)) {
        (Some("none"), _) => Enrollment::Not("labelled istio.io/dataplane-mode=none"),
        _ => Enrollment::Not(
            "neither it nor its namespace is labelled istio.io/dataplane-mode=ambient",
        ),
    }
}

fn mode(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(DATAPLANE_MODE).map(String::as_str)
}

/// The pod's in-pod config: `base` (the chart's settings) with the pod's annotations applied.
/// A boolean Go cannot parse counts as absent, as in Istio, and is returned as a warning; an
/// interface name Linux would refuse is an error naming the annotation and the value.
pub fn pod_config(
    annotations: &BTreeMap<String, String>,
    base: &AmbientConfig,
) -> Result<(AmbientConfig, Vec<String>), ModelError> {
    let mut cfg = base.clone();
    let mut warnings = Vec::new();
    let mut flag = |key: &str| -> Option<bool> {
        let value = annotations.get(key)?;
        let parsed = parse_bool(value);
        if parsed.is_none() {
            warnings.push(format!(
                "annotation {key}: {value:?} is not a boolean (true or false): ignored"
            ));
        }
        parsed
    };
    if let Some(bypass) = flag(BYPASS_INBOUND) {
        cfg.bypass_inbound = bypass;
    }
    if let Some(dns) = flag(DNS_CAPTURE) {
        cfg.dns_capture = dns;
    }
    if let Some(list) = annotations.get(REROUTE_VIRTUAL_INTERFACES) {
        cfg.virtual_interfaces = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        if let Err(ModelError::Config { expected, .. }) = cfg.plan() {
            return Err(ModelError::Config {
                field: REROUTE_VIRTUAL_INTERFACES,
                value: list.clone(),
                expected,
            });
        }
    }
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn decide(
        pod: &[(&str, &str)],
        ns: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Enrollment {
        let (labels, ns_labels, annotations) = (map(pod), map(ns), map(annotations));
        let view = PodView {
            namespace: "shop",
            labels: &labels,
            annotations: &annotations,
            host_network: false,
            namespace_labels: &ns_labels,
        };
        enrollment(&view, &[], &EnablementSelectors::istio_default())
    }

    #[test]
    fn enrollment_follows_istios_default_selectors() {
        let ambient = [(DATAPLANE_MODE, "ambient")];
        let none = [(DATAPLANE_MODE, "none")];
        assert_eq!(decide(&[], &ambient, &[]), Enrollment::Ambient);
        assert_eq!(decide(&ambient, &[], &[]), Enrollment::Ambient);
        assert!(matches!(decide(&none, &ambient, &[]), Enrollment::Not(_)));
        assert!(matches!(decide(&[], &[], &[]), Enrollment::Not(_)));
        assert!(matches!(
            decide(&[], &[(DATAPLANE_MODE, "sidecar")], &[]),
            Enrollment::Not(_)
        ));
        assert_eq!(
            decide(&[], &ambient, &[(SIDECAR_STATUS, "{}")]),
            Enrollment::Not("has a sidecar")
        );
        let (labels, annotations) = (map(&ambient), map(&[]));
        let default = EnablementSelectors::istio_default();
        let mut view = PodView {
            namespace: "kube-system",
            labels: &labels,
            annotations: &annotations,
            host_network: true,
            namespace_labels: &labels,
        };
        assert_eq!(
            enrollment(&view, &[], &default),
            Enrollment::Not("on the host's network")
        );
        view.host_network = false;
        assert_eq!(
            enrollment(&view, &["kube-system".into()], &default),
            Enrollment::Not("in an excluded namespace")
        );
        assert_eq!(enrollment(&view, &[], &default), Enrollment::Ambient);
    }

    #[test]
    fn annotations_change_what_they_name() {
        let base = AmbientConfig::default();
        let (cfg, warnings) = pod_config(
            &map(&[
                (BYPASS_INBOUND, "true"),
                (DNS_CAPTURE, "F"),
                (REROUTE_VIRTUAL_INTERFACES, " tap0, ,tap1 "),
            ]),
            &base,
        )
        .unwrap();
        assert!(cfg.bypass_inbound && !cfg.dns_capture, "{cfg:?}");
        assert_eq!(cfg.virtual_interfaces, ["tap0", "tap1"]);
        assert!(warnings.is_empty());
        // Go cannot parse it: absent, with a warning naming it.
        let (cfg, warnings) = pod_config(&map(&[(DNS_CAPTURE, "yes")]), &base).unwrap();
        assert!(cfg.dns_capture);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains(DNS_CAPTURE) && warnings[0].contains("yes"));
        // An interface Linux would refuse: an error naming the annotation and its value.
        let err = pod_config(&map(&[(REROUTE_VIRTUAL_INTERFACES, "tap0,a/b")]), &base)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(REROUTE_VIRTUAL_INTERFACES) && err.contains("a/b"),
            "{err}"
        );
    }
}
