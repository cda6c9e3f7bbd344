//! The hand-back (`redirect-cni-node hand-back`, and `HAND_BACK_ON_UNINSTALL` at an
//! uninstall): every pod of the node our capture holds is given back to Istio in place, in the
//! form Istio itself writes for the pod's config (from its annotations, as our plugin's ADD
//! decided it): its iptables rules as iptables-nft keeps them, or its native nftables tables.
//! Our table is removed in the same batch, so no packet sees neither and no pod restarts.
//! Istio's agent, starting after, finds its rules in place. The CNI config entry is left to
//! Istio's installer.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{Error as CoreError, IstioForm};

use crate::pods::capture::{locate, Located, PodCaptureError, Reach};

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

/// Hands `pod` back (see the module's comment), through `reach`.
pub fn hand_back_with(
    pod: &Pod,
    defaults: &MeshDefaults,
    reach: &Reach,
    form: IstioForm,
) -> Result<HandedBackPod, PodCaptureError> {
    let target = match locate(pod, defaults, reach)? {
        Located::Capture(t) => t,
        Located::NotCaptured(why) => return Ok(HandedBackPod::NotCaptured(why)),
    };
    let netns = target.ns.path().to_owned();
    let failed = |source: CoreError| PodCaptureError::Apply {
        pod: target.label.clone(),
        netns: netns.clone(),
        source,
    };
    let started = Instant::now();
    let ns = (reach.open)(&target.ns).map_err(failed)?;
    if ns
        .backend()
        .read_table()
        .map_err(|e| failed(e.into()))?
        .is_none()
    {
        return Ok(HandedBackPod::NotOurs);
    }
    let cfg = ns
        .for_pod(target.cfg, target.dual_stack, None)
        .map_err(failed)?;
    let done = ns.hand_back(&cfg, form).map_err(failed)?;
    let mut differences = Vec::new();
    if ns.foreign().map_err(failed)?.is_empty() {
        differences.push(format!(
            "Istio's rules ({}) are not there",
            done.tables.join(", ")
        ));
    }
    let ours_left = ns
        .backend()
        .read_table()
        .map_err(|e| failed(e.into()))?
        .is_some();
    if ours_left {
        differences.push("our table is still there".into());
    }
    if !differences.is_empty() {
        return Err(PodCaptureError::NotHandedBack {
            pod: target.label,
            netns,
            differences,
        });
    }
    Ok(HandedBackPod::Done {
        tables: done.tables,
        netns,
        took: started.elapsed(),
    })
}
