//! `redirect-cni-node hand-back [--hand-back-form as-adopted|iptables-nft|nftables]`, with the
//! agent's own flags and variables:
//! the node's pods listed from the API server (this node's only), each running pod our plugin
//! captures handed back (`super::hand_back_with`), one log line per pod, a summary, exit 0
//! when every pod was handed back, 1 when one failed (each named), 2 on bad input, with
//! nothing changed.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{hand_back_with, Bases, HandedBackPod};
use crate::adopted_forms::{self, HandBackForm};
use crate::error::{Error, Result};
use crate::informers::KnownPods;
use crate::pods::capture::Reach;
use crate::settings::Settings;
use redirect_core::IstioForm;

/// What a node's hand-back did, pod by pod.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pods now holding Istio's tables instead of ours.
    pub handed_back: usize,
    /// Pods holding no table of ours (nothing done).
    pub not_ours: usize,
    /// Pods our plugin does not capture, or not running (left alone).
    pub left_alone: usize,
    /// Pods that could not be handed back (each logged with why).
    pub failed: usize,
}

/// The command, with the settings `redirect-cni-node`'s own parse gave (see the module's
/// comment).
pub fn main(settings: &Settings) -> i32 {
    match run(settings, settings.hand_back_form, None) {
        Ok(s) if s.failed == 0 => 0,
        Ok(_) => 1,
        Err(e) => {
            tracing::error!("{}", redirect_program::errors::chain(&e));
            if matches!(e, Error::InvalidSetting { .. }) {
                2
            } else {
                1
            }
        }
    }
}

/// Hands back every pod of the node (see the module's comment) in `form` (per pod: the form it
/// held when adopted, recorded in the run directory, under `as-adopted`). The pods are listed
/// from the API server; when it does not answer and `known` holds the pods the agent's watch
/// last listed (at an uninstall, whose `helm uninstall` takes the RBAC away too), those.
pub fn run(settings: &Settings, form: HandBackForm, known: Option<&KnownPods>) -> Result<Summary> {
    let plugin = crate::plugin_entry::plugin_conf(settings)?;
    let node = settings.node().to_string();
    if node.is_empty() {
        return Err(Error::InvalidSetting {
            setting: "NODE_NAME",
            value: String::new(),
            reason: "the hand-back lists this node's pods by name: set NODE_NAME from the \
                     downward API (spec.nodeName)"
                .into(),
        });
    }
    let pods = match (list_pods(settings, &node), known.map(KnownPods::snapshot)) {
        (Ok(pods), _) => pods,
        (Err(e), Some(last)) if !last.is_empty() => {
            tracing::warn!(
                "{}: handing back the {} pods the agent's watch last listed",
                redirect_program::errors::chain(&e),
                last.len()
            );
            last
        }
        (Err(e), _) => return Err(e),
    };
    let run_dir = &settings.cni_agent_run_dir;
    let records = adopted_forms::all(run_dir);
    tracing::info!(
        "handing back the pods of node {node} to Istio ({} form{}): {} pods listed",
        form.word(),
        match form {
            HandBackForm::AsAdopted => format!(
                "; {} pods recorded as adopted, the others in {}",
                records.len(),
                adopted_forms::form_for(form, &records, "").word()
            ),
            HandBackForm::Fixed(_) => String::new(),
        },
        pods.len()
    );
    let places = settings.repair.places.clone();
    let find =
        |uid: &str, ip: IpAddr| crate::pods::search::find(&places.proc, &places.pins, uid, ip);
    let reach = Reach {
        find: &find,
        open: &redirect_core::Namespace::open_in,
    };
    let mut summary = Summary::default();
    for pod in &pods {
        let bases = Bases {
            mesh: &plugin.mesh,
            ambient: &settings.ambient.base,
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let pod_form = adopted_forms::form_for(form, &records, uid);
        if one_pod(pod, &plugin, (bases, &reach, pod_form), &mut summary) {
            adopted_forms::forget(run_dir, uid);
        }
    }
    tracing::info!(
        "hand-back of node {node}: {} handed back, {} held nothing of ours, {} left alone, {} failed",
        summary.handed_back,
        summary.not_ours,
        summary.left_alone,
        summary.failed
    );
    Ok(summary)
}

/// Hands one pod back and logs it; whether it was (its adoption record is then done with).
fn one_pod(
    pod: &Pod,
    plugin: &cni_protocol::cni::conf::NetConf,
    (bases, reach, form): (Bases, &Reach, IstioForm),
    summary: &mut Summary,
) -> bool {
    let (ns, name) = (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    );
    if !running_pod(pod) || plugin.excluded(&ns, &name).is_some() {
        summary.left_alone += 1;
        return false;
    }
    match hand_back_with(pod, bases, reach, form) {
        Ok(HandedBackPod::Done {
            tables,
            netns,
            took,
        }) => {
            summary.handed_back += 1;
            tracing::info!(
                "pod {ns}/{name} handed back: Istio's tables {} in {} in place of ours ({} form, \
                 {} ms, no restart)",
                tables.join(", "),
                netns.display(),
                form.word(),
                took.as_millis()
            );
            true
        }
        Ok(HandedBackPod::NotOurs) => {
            summary.not_ours += 1;
            false
        }
        Ok(HandedBackPod::NotCaptured(why)) => {
            summary.left_alone += 1;
            tracing::info!("pod {ns}/{name} left alone: our plugin does not capture it ({why})");
            false
        }
        Err(e) => {
            summary.failed += 1;
            tracing::error!("{}", redirect_program::errors::chain(&e));
            false
        }
    }
}

/// A running pod with an address, not on the host's network, not being deleted.
fn running_pod(pod: &Pod) -> bool {
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ip = status.and_then(|s| s.pod_ip.as_deref()).is_some();
    !host_network && running && ip && pod.metadata.deletion_timestamp.is_none()
}

fn list_pods(settings: &Settings, node: &str) -> Result<Vec<Pod>> {
    let failed = |what: String| Error::Api(format!("cannot list the pods of node {node}: {what}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(e.to_string()))?;
    runtime.block_on(async {
        let client = crate::kube_client::client(settings, None)
            .await
            .map_err(failed)?;
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = Api::<Pod>::all(client)
            .list(&params)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(list.items)
    })
}
