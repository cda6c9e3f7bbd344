//! The mesh's decision from a pod, as `istio-cni` makes it: the pod as the API gives it
//! ([`PodInfo`]), the annotations that change its capture, and [`decide`] (skip it, or
//! capture it with this config), with the plugin's defaults ([`MeshDefaults`]).

pub use redirect_istio::mesh::{
    decide, Decision, MeshDefaults, MeshError, ANNOTATIONS, BYPASS_GIDS, BYPASS_UIDS,
    EXCLUDE_INBOUND_PORTS, EXCLUDE_INTERFACES, EXCLUDE_OUTBOUND_IP_RANGES, EXCLUDE_OUTBOUND_PORTS,
    INCLUDE_INBOUND_PORTS, INCLUDE_OUTBOUND_IP_RANGES, INCLUDE_OUTBOUND_PORTS, INJECT,
    INTERCEPTION_MODE, KUBEVIRT_INTERFACES, LABELS, PROXY_ENV, REROUTE_INTERFACES, STATUS,
};
pub use redirect_istio::pod::{pod_from_text, ContainerInfo, PodInfo, PodSpecInfo};
