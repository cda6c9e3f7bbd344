//! The hand-back (`redirect-cni-node hand-back`, and `HAND_BACK_ON_UNINSTALL` at an
//! uninstall): every pod of the node our capture holds is given back to Istio in place, in the
//! form Istio itself writes for the pod's config (from its annotations, as our plugin's ADD
//! decided it): its iptables rules as iptables-nft keeps them, or its native nftables tables.
//! An ambient pod our agent enrolled gets the in-pod rules Istio's agent writes for its
//! annotations (in either form); ztunnel keeps its sockets in the pod and reconnects
//! to Istio's agent, which finds the pod enrolled (`ambient.istio.io/redirection`).
//! Our table is removed in the same batch, so no packet sees neither and no pod restarts.
//! Istio's agent, starting after, finds its rules in place. The CNI config entry is left to
//! Istio's installer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{AmbientConfig, Error as CoreError, HandedBack, IstioForm, Namespace, Netns};

use crate::pods::capture::{locate, Located, PodCaptureError, Reach, Target};

mod node;

pub use node::{main, run, Summary};

/// What handing one pod back did.
#[derive(Debug)]
pub enum HandedBackPod {
    /// Istio's tables are in its namespace and ours is gone, both read back.
    Done {
        /// The tables written.
        tables: Vec<String>,
        /// Where the namespace was found.
        netns: PathBuf,
        /// How long it took (found, written, read back).
        took: Duration,
    },
    /// Its namespace holds no table of ours: nothing done.
    NotOurs,
    /// Our plugin would not capture this pod: its rules, whoever wrote them, are left alone.
    NotCaptured(String),
}

/// What a pod is handed back with: the plugin's mesh defaults (a sidecar pod's capture, from
/// its annotations) and the agent's ambient settings (an enrolled pod's in-pod rules).
#[derive(Clone, Copy)]
pub struct Bases<'a> {
    /// The plugin's defaults.
    pub mesh: &'a MeshDefaults,
    /// The chart's ambient settings, under each pod's annotations.
    pub ambient: &'a AmbientConfig,
}

/// Hands `pod` back (see the module's comment), through `reach`. A pod our agent enrolled in
/// ambient (`ambient.istio.io/redirection` set) gets Istio's in-pod rules for its annotations;
/// any other, the sidecar capture our plugin's ADD would give it.
pub fn hand_back_with(
    pod: &Pod,
    bases: Bases,
    reach: &Reach,
    form: IstioForm,
) -> Result<HandedBackPod, PodCaptureError> {
    if is_ambient(pod) {
        return ambient_pod(pod, bases.ambient, reach, form);
    }
    let target = match locate(pod, bases.mesh, reach)? {
        Located::Capture(t) => t,
        Located::NotCaptured(why) => return Ok(HandedBackPod::NotCaptured(why)),
    };
    let started = Instant::now();
    let Target {
        label,
        cfg,
        dual_stack,
        ns: netns,
    } = *target;
    let handed = |ns: &Namespace| {
        let cfg = ns.for_pod(cfg, dual_stack, None)?;
        ns.hand_back(&cfg, form)
    };
    write_and_check(&label, &netns, reach, handed, started)
}

/// An ambient pod: Istio's in-pod rules for its annotations over the chart's settings.
fn ambient_pod(
    pod: &Pod,
    base: &AmbientConfig,
    reach: &Reach,
    form: IstioForm,
) -> Result<HandedBackPod, PodCaptureError> {
    let label = crate::pods::label(pod);
    let annotations = crate::ambient::pods::annotations(pod);
    let (cfg, _warnings) = redirect_core::ambient::pod_config(&annotations, base).map_err(|e| {
        PodCaptureError::Annotations {
            pod: label.clone(),
            source: e.into(),
        }
    })?;
    let (Some(uid), Some(ip)) = (
        pod.metadata.uid.as_deref(),
        crate::pods::ips(pod).first().copied(),
    ) else {
        return Err(PodCaptureError::Incomplete(label));
    };
    let started = Instant::now();
    let netns = (reach.find)(uid, ip).map_err(|source| PodCaptureError::Netns {
        pod: label.clone(),
        source: Box::new(source),
    })?;
    let handed = |ns: &Namespace| ns.hand_back_ambient(&cfg, form);
    write_and_check(&label, &netns, reach, handed, started)
}

/// Opens `netns`, hands it back with `handed` when it holds our table, and reads back that
/// Istio's rules are there and ours is gone.
fn write_and_check(
    label: &str,
    netns: &Netns,
    reach: &Reach,
    handed: impl FnOnce(&Namespace) -> redirect_core::Result<HandedBack>,
    started: Instant,
) -> Result<HandedBackPod, PodCaptureError> {
    let path = netns.path().to_owned();
    let failed = |source: CoreError| PodCaptureError::Apply {
        pod: label.to_string(),
        netns: path.clone(),
        source,
    };
    let ns = (reach.open)(netns).map_err(failed)?;
    let ours = |ns: &Namespace| -> Result<bool, PodCaptureError> {
        let table = ns.backend().read_table().map_err(|e| failed(e.into()))?;
        Ok(table.is_some())
    };
    if !ours(&ns)? {
        return Ok(HandedBackPod::NotOurs);
    }
    let done = handed(&ns).map_err(failed)?;
    let mut differences = Vec::new();
    if ns.foreign().map_err(failed)?.is_empty() {
        differences.push(format!(
            "Istio's rules ({}) are not there",
            done.tables.join(", ")
        ));
    }
    if ours(&ns)? {
        differences.push("our table is still there".into());
    }
    if !differences.is_empty() {
        return Err(PodCaptureError::NotHandedBack {
            pod: label.to_string(),
            netns: path,
            differences,
        });
    }
    Ok(HandedBackPod::Done {
        tables: done.tables,
        netns: path,
        took: started.elapsed(),
    })
}

/// Whether the pod carries `ambient.istio.io/redirection`, which our agent sets on the pods it
/// enrolled in ambient.
pub fn is_ambient(pod: &Pod) -> bool {
    crate::ambient::pods::redirection(pod).is_some()
}
