//! The plugin's ADD and CHECK (`plugin_requests` brings them), answered in the controller's
//! loop with the watch's memory: the pod decided (from the API when the watch has not seen it
//! yet), its namespace checked to be the pod's, then enrolled (ADD) or its rules read back
//! (CHECK).

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::Path;

use cni_protocol::ambient::{AddAnswer, AddRequest, Command};
use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::api::Api;
use redirect_core::ambient::Enrollment;
use redirect_core::Netns;

use super::state::State;
use super::Controller;
use crate::ambient::dataplane::{Rules, Stage};
use crate::ambient::error::AmbientError;
use crate::ambient::identity::{self, Binding, Claim};
use crate::ambient::plugin_requests::PluginRequest;
use crate::ambient::{listeners, pods};

/// The plugin's ADD or CHECK, answered: the pod decided from the watch's memory (or the API when
/// the watch has not seen it yet).
pub(super) async fn answer(c: &Controller, state: &mut State, r: PluginRequest) {
    let who = format!("{}/{}", r.add.namespace, r.add.name);
    let command = r.add.command;
    if r.reply.gone() {
        // The plugin gave up waiting (the agent was stalled) and failed its ADD: the
        // runtime tears the sandbox down. Doing it now would enroll a dead sandbox.
        tracing::warn!(
            "ambient: pod {who}: the plugin gave up on its {} before the agent got to it \
             (its connection is closed): dropped, nothing done",
            verb(command)
        );
        return;
    }
    let mut uid = None;
    let answer = match decide_for_plugin(c, state, &r.add).await {
        Err(e) => AddAnswer::Failed {
            error: e.to_string(),
        },
        Ok(Err(reason)) => AddAnswer::NotAmbient { reason },
        Ok(Ok(pod)) => {
            uid.clone_from(&pod.metadata.uid);
            match command {
                Command::Add => enroll_for_plugin(c, state, &pod, r.add, r.netns).await,
                Command::Check => check_for_plugin(c, &pod, r.netns, &r.add.netns).await,
            }
        }
    };
    let verb = verb(command);
    match &answer {
        AddAnswer::Enrolled => tracing::info!("ambient: pod {who} enrolled at ADD"),
        AddAnswer::Matches => tracing::debug!("ambient: pod {who} at CHECK: its rules match"),
        AddAnswer::Differs { differences } => tracing::warn!(
            "ambient: pod {who} at CHECK: its rules differ: {}",
            differences.join("; ")
        ),
        AddAnswer::NotAmbient { reason } => {
            tracing::debug!("ambient: pod {who} at {verb}: not ambient ({reason})")
        }
        AddAnswer::Failed { error } => {
            c.metrics.ambient_failed();
            tracing::warn!("ambient: pod {who} at {verb}: {error}")
        }
    }
    // Istio's agent answers the ambient ADDs its plugin sends (ours asks about every pod
    // without a sidecar: a pod found not ambient is not one of those).
    match (command, &answer) {
        (Command::Add, AddAnswer::Enrolled) => c.metrics.ambient_plugin_request("200"),
        (Command::Add, AddAnswer::Failed { .. }) => c.metrics.ambient_plugin_request("500"),
        _ => {}
    }
    if let Err(e) = r.reply.send(&answer) {
        tracing::warn!("ambient: pod {who}: could not answer the plugin's {verb}: {e}");
        if let (AddAnswer::Enrolled, Some(uid)) = (&answer, &uid) {
            // The plugin failed the ADD (it gave up meanwhile): the runtime tears the
            // sandbox down, so what this ADD did is undone, as a failed ADD leaves
            // nothing.
            c.release(uid, false).await;
            tracing::warn!(
                "ambient: pod {who}: the ADD the plugin gave up on is undone (released, \
                 ztunnel told)"
            );
        }
    }
    c.update_metrics().await;
}

/// The pod and whether it is ambient (`Ok(Err(reason))` when not).
async fn decide_for_plugin(
    c: &Controller,
    state: &mut State,
    add: &AddRequest,
) -> Result<Result<Pod, String>, AmbientError> {
    let cached = state.pods.values().find(|p| {
        p.metadata.namespace.as_deref() == Some(&add.namespace)
            && p.metadata.name.as_deref() == Some(&add.name)
            && add
                .uid
                .as_ref()
                .is_none_or(|u| p.metadata.uid.as_ref() == Some(u))
    });
    let pod = match cached {
        Some(p) => p.clone(),
        None => {
            let pod = Api::<Pod>::namespaced(c.client.clone(), &add.namespace)
                .get(&add.name)
                .await
                .map_err(|error| AmbientError::Read {
                    what: format!("pod {}/{}", add.namespace, add.name),
                    error: Box::new(error),
                })?;
            // Known before the watch brings it: the queue must not take it for deleted.
            state.remember(&pod);
            pod
        }
    };
    if !state.namespaces.contains_key(&add.namespace) {
        let ns = Api::<KubeNamespace>::all(c.client.clone())
            .get(&add.namespace)
            .await
            .map_err(|error| AmbientError::Read {
                what: format!("namespace {}", add.namespace),
                error: Box::new(error),
            })?;
        state.namespaces.insert(
            add.namespace.clone(),
            ns.metadata.labels.unwrap_or_default(),
        );
    }
    Ok(
        match pods::decide(
            &pod,
            &state.namespace_labels(&pod),
            &c.excluded,
            &c.settings.selectors,
        ) {
            Enrollment::Ambient => Ok(pod),
            Enrollment::Not(why) => Err(why.to_string()),
        },
    )
}

/// ADD: the namespace handed over is checked to be the pod's (`identity`), then the pod is
/// enrolled in it. A namespace that fails the check changes nothing, whatever was enrolled.
async fn enroll_for_plugin(
    c: &Controller,
    state: &mut State,
    pod: &Pod,
    add: AddRequest,
    fd: OwnedFd,
) -> AddAnswer {
    let (netns, cfg) = match handed_over(c, pod, fd, &add.netns) {
        Ok(got) => got,
        Err(answer) => return answer,
    };
    let (ips, binding) = match bind(c, state, pod, &netns, &add).await {
        Ok(checked) => checked,
        Err(answer) => return answer,
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut r = pods::pod_ref(pod);
    r.ips = ips;
    let was_enrolled = {
        let id = uid.clone();
        c.with_dataplane(move |dp| dp.pod(&id).is_some()).await
    };
    let added = c
        .with_dataplane(move |dp| dp.enroll(&r, Some((netns, binding)), &cfg, Rules::Apply))
        .await;
    match added {
        Ok((Stage::Enabled, _)) => {
            // The annotation right after the answer (the queue's next turn): the API's
            // round trip is not the pod's start's.
            state.queue.add(&uid);
            AddAnswer::Enrolled
        }
        Ok((_, refused)) => {
            let id = uid.clone();
            let lacking = c.with_dataplane(move |dp| dp.listeners_missing(&id)).await;
            // ADD fails: the namespace as it was (the runtime tears the sandbox down and
            // tries again).
            c.release(&uid, false).await;
            if was_enrolled {
                state.queue.add(&uid);
            }
            AddAnswer::Failed {
                error: match refused {
                    Some(e) => redirect_program::errors::chain(&e),
                    None if !lacking.is_empty() => format!(
                        "ztunnel acked the pod but its listeners {} are missing in the pod's \
                         namespace (ztunnel's proxy for it is not up: see ztunnel's log)",
                        listeners::words(&lacking)
                    ),
                    None => format!(
                        "ztunnel is not connected to {}: an ambient pod cannot start without it",
                        c.settings.ztunnel_socket.display()
                    ),
                },
            }
        }
        Err(e) => AddAnswer::Failed {
            error: e.to_string(),
        },
    }
}

/// The namespace a request handed over (judged: a network namespace) and the pod's
/// in-pod settings; the answer to give when either cannot be had.
fn handed_over(
    c: &Controller,
    pod: &Pod,
    fd: OwnedFd,
    path: &str,
) -> Result<(Netns, redirect_core::AmbientConfig), AddAnswer> {
    let failed = |error: String| AddAnswer::Failed { error };
    let netns =
        Netns::from_file(File::from(fd), Path::new(path)).map_err(|e| failed(e.to_string()))?;
    let cfg = c.pod_config(pod).map_err(|e| failed(e.to_string()))?;
    Ok((netns, cfg))
}

/// Whether `netns` may be the pod's (`identity::check`, with what the watch and the data
/// plane know): the addresses checked and how, or the refusal to answer with.
async fn bind(
    c: &Controller,
    state: &State,
    pod: &Pod,
    netns: &Netns,
    add: &AddRequest,
) -> Result<(Vec<IpAddr>, Binding), AddAnswer> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let owners = state.address_owners(&uid);
    let (id, except) = (netns.id(), uid);
    let bound = c.with_dataplane(move |dp| dp.bound_to(id, &except)).await;
    let claim = Claim {
        api: &pods::ips(pod),
        request: &add.ips,
        owner_of: &|ip| owners.get(&ip).cloned(),
        bound_to: &|_| bound.clone(),
    };
    identity::check(netns, &claim).map_err(|refused| {
        tracing::warn!(
            "ambient: pod {}: the namespace handed over at ADD ({}) is refused: {refused}",
            pods::label(pod),
            add.netns
        );
        AddAnswer::Failed {
            error: refused.to_string(),
        }
    })
}

/// CHECK: the pod's in-pod rules in the namespace handed over, against its plan; the
/// namespace must be the one the pod is enrolled in.
async fn check_for_plugin(c: &Controller, pod: &Pod, fd: OwnedFd, path: &str) -> AddAnswer {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let (netns, cfg) = match handed_over(c, pod, fd, path) {
        Ok(got) => got,
        Err(answer) => return answer,
    };
    let id = uid.clone();
    let bound = c.with_dataplane(move |dp| dp.netns_id(&id)).await;
    if bound != Some(netns.id()) {
        return AddAnswer::Differs {
            differences: vec![match bound {
                None => "the pod is ambient but the agent holds no namespace for it (not \
                         enrolled yet, or its namespace was not found)"
                    .into(),
                Some(_) => "the namespace checked is not the one the pod is enrolled in".into(),
            }],
        };
    }
    // ztunnel's listeners too, as the pass reads them: the rules alone prove nothing.
    let wanted = c.settings.check_listeners.then(|| listeners::wanted(&cfg));
    let checked = tokio::task::spawn_blocking(move || {
        let lacking = wanted.map(|w| {
            redirect_core::listeners::SockDiag::open_in(&netns).and_then(|mut d| d.missing(&w))
        });
        let capture = redirect_core::Capture::Ambient(cfg);
        let rules = redirect_core::Namespace::from_netns(netns).and_then(|ns| ns.check(&capture));
        rules.map(|d| {
            let mut d: Vec<String> = d.iter().map(|m| m.to_string()).collect();
            match lacking {
                Some(Ok(m)) if !m.is_empty() => d.push(format!(
                    "ztunnel's listeners {} are missing in the pod's namespace",
                    listeners::words(&m)
                )),
                Some(Err(e)) => d.push(format!("ztunnel's listeners could not be read: {e}")),
                _ => {}
            }
            d
        })
    })
    .await;
    match checked {
        Ok(Ok(d)) if d.is_empty() => AddAnswer::Matches,
        Ok(Ok(differences)) => AddAnswer::Differs { differences },
        Ok(Err(e)) => AddAnswer::Failed {
            error: format!("reading the in-pod rules back: {e}"),
        },
        Err(e) => AddAnswer::Failed {
            error: e.to_string(),
        },
    }
}

/// The plugin's command, as the logs name it.
fn verb(command: Command) -> &'static str {
    match command {
        Command::Add => "ADD",
        Command::Check => "CHECK",
    }
}
