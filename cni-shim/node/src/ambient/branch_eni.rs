//! kubelet's probes to ambient pods behind an AWS branch ENI (EKS Security Groups for Pods),
//! Istio 1.31's `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`: such a pod is routed out of the node's
//! trunk ENI, so the probe SNATed to the link-local address would leave through the VPC and be
//! lost. For each enrolled pod aws-vpc-cni laid out that way, two ip rules send the probe
//! through the pod's veth and take its answer in (`redirect_core::branch_eni`).
//!
//! As Istio, only on a node with `net.ipv4.tcp_early_demux=0`, which AWS asks for with
//! Security Groups for Pods (elsewhere nothing is looked for). Unlike Istio, which remembers
//! what it added, each call reads the node's rules back and converges them on the enrolled
//! pods: those of a released pod go, a deleted one comes back, one of ours that no pod needs
//! (an agent stopped while its pod went) goes, and with the setting off, all of ours go.

use std::net::IpAddr;

use redirect_core::branch_eni::{self, BranchEni, Changed, ProbeRoutes, ProbeRule};
use redirect_core::error::RoutesError;

/// The node's branch-ENI probe rules, for the enrolled pods.
pub(crate) struct BranchEniRules {
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`.
    enabled: bool,
    /// The node's routing socket, opened at the first call (in the agent's namespace).
    routes: Option<ProbeRoutes>,
    /// The pods found behind a branch ENI at the last call.
    pub found: Vec<BranchEni>,
}

impl BranchEniRules {
    pub fn new(enabled: bool) -> BranchEniRules {
        BranchEniRules {
            enabled,
            routes: None,
            found: Vec::new(),
        }
    }

    /// Reads the node's rules back and brings them to what `pods` (every enrolled pod's
    /// addresses) need; returns what changed.
    pub fn converge(&mut self, pods: &[IpAddr]) -> Result<Changed, RoutesError> {
        if self.routes.is_none() {
            self.routes = Some(ProbeRoutes::open()?);
        }
        let Some(routes) = &self.routes else {
            return Ok(Changed::default());
        };
        self.found = if self.enabled && branch_eni::early_demux_disabled() {
            routes.detect(pods)?
        } else {
            Vec::new()
        };
        let want: Vec<ProbeRule> = self.found.iter().flat_map(BranchEni::rules).collect();
        routes.converge(&want)
    }
}

/// What changed, in words for a log line or a repair ("" when nothing did).
pub(crate) fn words(changed: &Changed) -> String {
    let mut parts = Vec::new();
    if !changed.added.is_empty() {
        let added: Vec<String> = changed.added.iter().map(ToString::to_string).collect();
        parts.push(format!("added {}", added.join(", ")));
    }
    if !changed.removed.is_empty() {
        parts.push(format!(
            "removed {} (of no enrolled pod)",
            changed.removed.join(", ")
        ));
    }
    parts.join("; ")
}
