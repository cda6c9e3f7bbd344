//! Taking over, in place, the sidecar pods Istio's CNI plugin set up (`ADOPT_ISTIO`): on a node
//! switched from Istio to us, each running pod still holds Istio's rules. With `replace` (the
//! default) the agent applies to it the capture our plugin's ADD would have applied (from its
//! annotations), ours first, then removes Istio's, so no packet goes uncaptured and no pod is
//! restarted; with `keep` it leaves them and shows the pod in the node view; `off` reads
//! nothing. A pod holding nothing of Istio's is left alone (our plugin or repair set it up).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use redirect_core::foreign::ForeignRules;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{Apply, Capture, Error, Foreign};

use crate::pods::capture::{locate, Located, PodCaptureError as RepairError, Reach};

/// `ADOPT_ISTIO`: what the agent does with pods that hold Istio's capture rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdoptIstio {
    /// Nothing is read.
    Off,
    /// They keep Istio's rules (which still capture); each is shown and counted.
    Keep,
    /// Ours replace them in place: ours applied first, theirs removed after.
    #[default]
    Replace,
}

impl AdoptIstio {
    /// `off`, `keep` or `replace`.
    pub fn parse(s: &str) -> Result<AdoptIstio, String> {
        match s.trim() {
            "off" => Ok(AdoptIstio::Off),
            "keep" => Ok(AdoptIstio::Keep),
            "replace" => Ok(AdoptIstio::Replace),
            _ => Err("expected off, keep or replace".into()),
        }
    }

    /// The setting's value.
    pub fn word(self) -> &'static str {
        match self {
            AdoptIstio::Off => "off",
            AdoptIstio::Keep => "keep",
            AdoptIstio::Replace => "replace",
        }
    }
}

/// What adopting one pod found and did.
#[derive(Debug)]
pub enum Adopted {
    /// Its namespace holds no rule of Istio's: nothing done.
    Nothing,
    /// Istio's rules were replaced by ours, read back equal.
    Replaced {
        /// What the namespace held of Istio's.
        held: ForeignRules,
        /// Where the namespace was found.
        netns: PathBuf,
        /// How long the switch took (ours applied, theirs removed, ours read back).
        took: Duration,
    },
    /// Istio's rules were left in place, and why.
    Kept {
        /// What the namespace holds of Istio's.
        held: ForeignRules,
        /// `ADOPT_ISTIO=keep`, or why they cannot be replaced here.
        why: String,
    },
    /// Our plugin would not capture this pod (e.g. it has Istio's init container): its rules,
    /// whoever wrote them, are left alone.
    NotCaptured(String),
}

/// Adopts `pod` (see the module's comment) with `mode` (not `Off`), through `reach`.
pub fn adopt_with(
    pod: &Pod,
    defaults: &MeshDefaults,
    reach: &Reach,
    mode: AdoptIstio,
) -> Result<Adopted, RepairError> {
    let target = match locate(pod, defaults, reach)? {
        Located::Capture(t) => t,
        Located::NotCaptured(why) => return Ok(Adopted::NotCaptured(why)),
    };
    let netns = target.ns.path().to_owned();
    let failed = |source: Error| RepairError::Apply {
        pod: target.label.clone(),
        netns: netns.clone(),
        source,
    };
    let started = Instant::now();
    let ns = (reach.open)(&target.ns).map_err(failed)?;
    let held = ns.foreign().map_err(failed)?;
    if held.is_empty() {
        return Ok(Adopted::Nothing);
    }
    if mode != AdoptIstio::Replace {
        return Ok(Adopted::Kept {
            held,
            why: "ADOPT_ISTIO=keep".into(),
        });
    }
    let capture = Capture::Sidecar(
        ns.for_pod(target.cfg, target.dual_stack, None)
            .map_err(failed)?,
    );
    match ns.apply_with(&capture, Apply::foreign(Foreign::Replace)) {
        Ok(_) => {}
        // What cannot be removed here is left as it was, still capturing.
        Err(Error::Refused(r)) if r.foreign().is_some() => {
            return Ok(Adopted::Kept {
                held,
                why: Error::Refused(r).to_string(),
            })
        }
        Err(e) => return Err(failed(e)),
    }
    let differences: Vec<String> = ns
        .check(&capture)
        .map_err(failed)?
        .iter()
        .map(|d| d.to_string())
        .collect();
    if !differences.is_empty() {
        return Err(RepairError::NotInKernel {
            pod: target.label,
            netns,
            differences,
        });
    }
    Ok(Adopted::Replaced {
        held,
        netns,
        took: started.elapsed(),
    })
}

/// Whether `pod` is a running sidecar pod (it carries `annotation`, Istio's
/// `sidecar.istio.io/status` by default) with an address, not on the host's network and not
/// being deleted: one that may hold Istio's rules.
pub fn running_sidecar(pod: &Pod, annotation: &str) -> bool {
    let key = match annotation {
        "" => "sidecar.istio.io/status",
        key => key,
    };
    let annotated = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key));
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ip = status.and_then(|s| s.pod_ip.as_deref()).is_some();
    annotated && !host_network && running && ip && pod.metadata.deletion_timestamp.is_none()
}
