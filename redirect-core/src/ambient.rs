//! Ambient enrollment as Istio decides it: which pods ambient captures ([`enrollment`] of a
//! [`PodView`] by [`EnablementSelectors`]), the annotations it reads and writes ([`REDIRECTION`]), a pod's in-pod config
//! from its annotations ([`pod_config`]), and kubelet's UID for the probe SNAT
//! ([`kubelet_uid`]). The rules themselves are [`Capture::Ambient`](crate::Capture::Ambient)
//! and [`Capture::HostProbe`](crate::Capture::HostProbe).

pub use redirect_istio::ambient::{
    enrollment, kubelet_uid, pod_config, EnablementSelector, EnablementSelectors, Enrollment,
    KubeletUidError, LabelSelector, Operator, PodView, Requirement, SelectorError, BYPASS_INBOUND,
    DATAPLANE_MODE, DNS_CAPTURE, REDIRECTION, REROUTE_VIRTUAL_INTERFACES, SIDECAR_STATUS,
};
/// ztunnel's in-pod ports, which the rules redirect to and its listeners bind.
pub use redirect_model::ambient::{DNS_PORT, HBONE_PORT, INBOUND_PORT, OUTBOUND_PORT};
