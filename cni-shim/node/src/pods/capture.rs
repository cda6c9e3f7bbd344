//! The capture our plugin's ADD would give a running pod, and the pod's namespace found on the
//! node: what repair (in place) and adoption (of pods Istio set up) both start from, and why
//! it could not be had.

use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::{self, Decision, MeshDefaults, MeshError};
use redirect_core::{Namespace, Netns};

use super::search::FindError;

/// Why a pod's capture could not be had or put in place; each names the pod (`namespace/name`).
#[derive(Debug, thiserror::Error)]
pub enum PodCaptureError {
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
    /// Istio's tables were written in place of ours, but the namespace reads back otherwise.
    #[error(
        "pod {pod}: handed back in {netns}, but it reads back otherwise ({}): run the hand-back \
         again, or roll the pod", differences.join("; ")
    )]
    NotHandedBack {
        /// The pod.
        pod: String,
        /// Where its namespace was found.
        netns: PathBuf,
        /// What is not as written, one line each.
        differences: Vec<String>,
    },
}

/// How a repair or an adoption reaches a pod's namespace: finds it from the pod's UID and IP,
/// and opens its kernel side: on the node, `search::find` over `/proc` and
/// `Namespace::open_in`; in a test, a fake.
pub struct Reach<'a> {
    /// Finds the namespace of the pod with this UID and IP.
    pub find: &'a dyn Fn(&str, IpAddr) -> Result<Netns, FindError>,
    /// Opens the namespace's kernel side, where the capture is applied and read back
    /// (`Namespace::open_in`).
    pub open: &'a dyn Fn(&Netns) -> redirect_core::Result<Namespace>,
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

/// The capture ADD would apply to `pod` and its namespace, found through `reach`.
pub fn locate(
    pod: &Pod,
    defaults: &MeshDefaults,
    reach: &Reach,
) -> Result<Located, PodCaptureError> {
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
        return Err(PodCaptureError::Incomplete(label));
    };
    let info = cni_protocol::pod::pod_info(pod.clone(), String::new(), String::new());
    let (cfg, dual_stack) = match mesh::decide(&info, defaults) {
        Ok(Decision::Capture {
            config, dual_stack, ..
        }) => (*config, dual_stack),
        Ok(Decision::Skip(why)) | Ok(Decision::NeedSpec(why)) => {
            return Ok(Located::NotCaptured(why));
        }
        Err(source) => return Err(PodCaptureError::Annotations { pod: label, source }),
    };
    let ns = (reach.find)(&uid, ip).map_err(|source| PodCaptureError::Netns {
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
