//! Repairing a running pod in place: the capture the plugin's ADD would have applied, into the
//! pod's namespace found from the node, then read back. "Repaired" means the rules are in the
//! kernel (Istio reported success with no rules written, istio#56587).

use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{Apply, Capture, Foreign, Namespace, Netns};

use crate::pods::capture::{locate, Located};
pub use crate::pods::capture::{PodCaptureError as RepairError, Reach};
use crate::pods::search as pod_netns;
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
