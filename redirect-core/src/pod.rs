//! What capture needs to know about a Kubernetes pod, whether it came from the runtime's
//! `io.kubernetes.cri.pod-annotations` capability (annotations only) or from the API server
//! (the whole spec). `mesh` turns it into a decision and a `CaptureConfig`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A pod as capture sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The containers, when the spec is known (from the API); `None` with annotations only.
    #[serde(default)]
    pub spec: Option<PodSpecInfo>,
}

/// The parts of a pod spec that decide capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSpecInfo {
    #[serde(default)]
    pub containers: Vec<ContainerInfo>,
    #[serde(default)]
    pub init_containers: Vec<ContainerInfo>,
}

/// One container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    pub name: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// `env[].value` literals only (Istio ignores `valueFrom`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `securityContext.runAsUser`.
    #[serde(default)]
    pub run_as_user: Option<i64>,
    /// `securityContext.runAsGroup`.
    #[serde(default)]
    pub run_as_group: Option<i64>,
}

impl PodSpecInfo {
    /// A container by name, among containers then init containers (native sidecars are init
    /// containers).
    pub fn container(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .chain(&self.init_containers)
            .find(|c| c.name == name)
    }
}
