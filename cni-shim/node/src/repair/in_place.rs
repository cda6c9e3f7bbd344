//! Repairing a running pod in place: the capture the plugin's ADD would have applied, into the
//! pod's namespace found from the node, then read back. "Repaired" means the rules are in the
//! kernel (Istio reported success with no rules written, istio#56587).

use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::{self, Decision, MeshDefaults, MeshError};
use redirect_core::{Apply, Capture, Foreign, Namespace, Netns};

use crate::pods::search::{self as pod_netns, FindError};
pub use crate::pods::Places;

/// What a repair did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The capture is in the pod's namespace now (found at `netns`), read back equal.
    Repaired {
        /// Where the namespace was found (`<proc>/<pid>/ns/net` or a pin).
        netns: PathBuf,
    },
    /// The plugin would not capture this pod (e.g. `sidecar.istio.io/inject: "false"`):
    /// nothing done.
    NotCaptured(String),
}

/// Why a pod could not be repaired; each names the pod (`namespace/name`).
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The pod has no UID or no IP in its status yet.
    #[error("pod {0} has no UID or no pod IP yet")]
    Incomplete(String),
    /// The pod's annotations do not give a capture the plugin would apply.
    #[error("pod {pod}")]
    Annotations {
        /// The pod.
        pod: String,
        /// What is wrong with them.
        source: MeshError,
    },
    /// The pod's network namespace was not found.
    #[error("pod {pod}")]
    Netns {
        /// The pod.
        pod: String,
        /// What the search looked at.
        source: Box<FindError>,
    },
    /// Programming the capture in the namespace failed.
    #[error("pod {pod}: programming its capture in {netns}", netns = netns.display())]
    Apply {
        /// The pod.
        pod: String,
        /// Where its namespace was found.
        netns: PathBuf,
        /// The failure.
        source: redirect_core::Error,
    },
    /// The capture was applied, but the rules read back differ from it.
    #[error(
        "pod {pod}: the capture was applied in {netns} but reads back different ({}): not \
         repaired", differences.join("; ")
    )]
    NotInKernel {
        /// The pod.
        pod: String,
        /// Where its namespace was found.
        netns: PathBuf,
        /// How they differ, one line each.
        differences: Vec<String>,
    },
}

/// How a repair reaches a pod's namespace: finds it from the pod's UID and IP, and opens its
/// kernel side: the node's in [`repair`] (`pod_netns::find` over `/proc`, `open_live`), or a
/// fake in a test.
pub struct Reach<'a> {
    /// Finds the namespace of the pod with this UID and IP.
    pub find: &'a dyn Fn(&str, IpAddr) -> Result<Netns, FindError>,
    /// Opens the namespace's kernel side, where the capture is applied and read back
    /// (`Namespace::open_in`).
    pub open: &'a dyn Fn(&Netns) -> redirect_core::Result<Namespace>,
}

/// Repairs `pod` in place on the node: see the module's comment. `defaults` are the plugin's
/// settings (its config entry), so the capture is the one ADD would have applied.
pub fn repair(pod: &Pod, defaults: &MeshDefaults, places: &Places) -> Result<Outcome, RepairError> {
    let find = |uid: &str, ip: IpAddr| pod_netns::find(&places.proc, &places.pins, uid, ip);
    let reach = Reach {
        find: &find,
        open: &Namespace::open_in,
    };
    repair_with(pod, defaults, &reach)
}

/// [`repair`] through `reach`.
pub fn repair_with(
    pod: &Pod,
    defaults: &MeshDefaults,
    reach: &Reach,
) -> Result<Outcome, RepairError> {
    let target = match locate(pod, defaults, reach)? {
        Located::Capture(t) => t,
        Located::NotCaptured(why) => return Ok(Outcome::NotCaptured(why)),
    };
    let netns = target.ns.path().to_owned();
    match apply_and_read_back(&target.ns, reach.open, target.cfg, target.dual_stack) {
        Ok(differences) if differences.is_empty() => Ok(Outcome::Repaired { netns }),
        Ok(differences) => Err(RepairError::NotInKernel {
            pod: target.label,
            netns,
            differences,
        }),
        Err(source) => Err(RepairError::Apply {
            pod: target.label,
            netns,
            source,
        }),
    }
}

/// A pod the plugin would capture, with its capture and its namespace found on the node.
pub struct Target {
    /// `namespace/name`.
    pub label: String,
    /// The capture ADD would apply (before the pod's addresses decide IPv6).
    pub cfg: redirect_core::ValidConfig,
    /// Whether the plugin's settings ask for dual stack.
    pub dual_stack: bool,
    /// The pod's namespace.
    pub ns: Netns,
}

/// What [`locate`] found.
pub enum Located {
    /// The plugin would capture it: here is how and where.
    Capture(Box<Target>),
    /// The plugin would not capture it, and why.
    NotCaptured(String),
}

/// The capture ADD would apply to `pod` and its namespace, found through `reach`: what repair
/// and adoption (`crate::adopt`) both start from.
pub fn locate(pod: &Pod, defaults: &MeshDefaults, reach: &Reach) -> Result<Located, RepairError> {
    let label = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    );
    let uid = pod.metadata.uid.clone();
    let ip: Option<IpAddr> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|s| s.parse().ok());
    let (Some(uid), Some(ip)) = (uid, ip) else {
        return Err(RepairError::Incomplete(label));
    };
    let info = cni_protocol::pod::pod_info(pod.clone(), String::new(), String::new());
    let (cfg, dual_stack) = match mesh::decide(&info, defaults) {
        Ok(Decision::Capture {
            config, dual_stack, ..
        }) => (*config, dual_stack),
        Ok(Decision::Skip(why)) | Ok(Decision::NeedSpec(why)) => {
            return Ok(Located::NotCaptured(why));
        }
        Err(source) => return Err(RepairError::Annotations { pod: label, source }),
    };
    let ns = (reach.find)(&uid, ip).map_err(|source| RepairError::Netns {
        pod: label.clone(),
        source: Box::new(source),
    })?;
    Ok(Located::Capture(Box::new(Target {
        label,
        cfg,
        dual_stack,
        ns,
    })))
}

/// Repair's policy over what the pod's namespace holds: the pod started before our plugin was
/// there, so rules another layer wrote are kept as they are (today's behaviour; the switch from
/// Istio replaces them); ours for another config are updated in place, as ADD would.
const REPAIR_POLICY: Apply = Apply::foreign(Foreign::Keep);

/// The capture ADD would apply, then how the namespace differs from it, one line each.
fn apply_and_read_back(
    ns: &Netns,
    open: &dyn Fn(&Netns) -> redirect_core::Result<Namespace>,
    cfg: redirect_core::ValidConfig,
    dual_stack: bool,
) -> redirect_core::Result<Vec<String>> {
    let pod = open(ns)?;
    let capture = Capture::Sidecar(pod.for_pod(cfg, dual_stack, None)?);
    pod.apply_with(&capture, REPAIR_POLICY)?;
    Ok(pod.check(&capture)?.iter().map(|d| d.to_string()).collect())
}
