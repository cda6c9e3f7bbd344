//! The controller: this node's pods from the shared pod informer (`crate::informers`), the
//! latest object of each pod by UID, a queue of the broken ones, and one worker that acts on
//! them in turn.
//!
//! - Pods already broken when the agent starts come with the informer's listing.
//! - A pod is looked at again, with its latest state, whenever it changes; a failed action is
//!   retried with backoff up to `max_attempts` times, then waits for the pod's next change.
//! - A pod repaired in place is not repaired again while it lives (its validation container
//!   keeps its last 126 until kubelet restarts it); a pod recreated under the same name has a
//!   new UID, so it is a new pod.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use kube::Client;
use tokio::sync::watch as signal;

use super::actions;
use super::detect::{is_broken, Action};
use super::in_place::{self, Outcome};
use super::RepairSettings;
use crate::adopt::{self, AdoptIstio, Adopted};
use crate::adopted_forms;
use crate::node_view::{Kind, NodeView, PodEntry};
use crate::node_view::{ReadBack, Repair, RepairKind};
use crate::pods::queue::{Backoff, Queue, Retry};
use crate::pods::selectors::PodFilter;
use crate::pods::{label as pod_label, not_listed, sleep_until};
use crate::telemetry::{Metrics, Result as Counted};
use cni_protocol::cni::conf::NetConf;

/// Everything the controller needs.
pub struct Controller {
    /// The API client: the delete, label and Events of those modes.
    pub client: Client,
    /// The node's pods (the shared informer), which the controller subscribes to.
    pub pods: crate::informers::Informer<Pod>,
    /// What to watch, which pods are broken, and what to do with them.
    pub settings: RepairSettings,
    /// The plugin's own config entry, as the installer writes it: the capture of a repaired
    /// pod is the one the plugin's ADD would have applied.
    pub plugin: Arc<NetConf>,
    /// Where each action's result and the watch's health are counted.
    pub metrics: Metrics,
    /// The retries of a failed repair, delete or label.
    pub backoff: Backoff,
    /// Where the sidecar pods are shown (`/debug/node`).
    pub view: NodeView,
}

/// What one attempt at a pod came to.
enum Done {
    /// Finished (counted, or nothing to do).
    Finished,
    /// Failed: retry.
    Failed(String),
}

impl Controller {
    /// Acts on the pods the node's pod informer gives until `stop` turns true.
    pub async fn run(self, mut stop: signal::Receiver<bool>) {
        tracing::info!(
            "starting the repair controller: mode {}, this node's pods{}{}, broken = init \
             container {:?} last exited {} with annotation {:?}",
            self.settings.mode(),
            match self.settings.field_selectors.trim() {
                "" => String::new(),
                f => format!(" with fields {f:?}"),
            },
            match self.settings.label_selectors.trim() {
                "" => String::new(),
                l => format!(" and labels {l:?}"),
            },
            self.settings.filter.init_container_name,
            self.settings.filter.exit_code,
            self.settings.filter.sidecar_annotation,
        );
        // The settings were checked at start; a filter that cannot be read takes nothing.
        let filter = self.settings.pod_filter().unwrap_or_else(|e| {
            tracing::error!("the repair controller takes no pod: {e}");
            PodFilter::none()
        });
        let mut events = self.pods.subscribe();
        let mut state = State::new(&self.settings, self.backoff);
        loop {
            let due = state.queue.next_due();
            tokio::select! {
                _ = stop.changed() => break,
                event = events.recv() => match event {
                    None => break,
                    Some(event) => self.observe(&mut state, &filter, event),
                },
                _ = sleep_until(due), if due.is_some() => {}
            }
            if *stop.borrow() {
                break;
            }
            while let Some(uid) = state.queue.pop(Instant::now()) {
                self.work(&mut state, &uid).await;
                self.publish(&state, &uid);
                if *stop.borrow() {
                    break;
                }
            }
        }
        tracing::info!("the repair controller stopped");
    }

    /// One event of the pod informer: a pod the settings' selectors leave out is one the
    /// controller no longer holds (its adoption record stays: the pod lives).
    fn observe(&self, state: &mut State, filter: &PodFilter, event: Event<Pod>) {
        let event = match event {
            Event::InitApply(p) | Event::Apply(p) if !filter.matches(&p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    if state.pods.contains_key(uid) {
                        state.gone(uid);
                    }
                }
                return;
            }
            e => e,
        };
        let touched = touched(&event);
        let relisted = matches!(event, Event::InitDone);
        state.observe(event, &self.settings);
        if relisted {
            self.view.keep_sidecars(|u| state.pods.contains_key(u));
        }
        for uid in touched {
            self.publish(state, &uid);
        }
    }

    /// One attempt at the pod `uid`, with its latest state.
    async fn work(&self, state: &mut State, uid: &str) {
        let Some(pod) = state.pods.get(uid).cloned() else {
            state.queue.forget(uid);
            return;
        };
        if state.wants_adoption(&pod, uid, &self.settings) {
            match self.adopt(state, &pod, uid).await {
                Done::Finished => {
                    state.examined.insert(uid.to_owned());
                }
                Done::Failed(why) => {
                    self.metrics.adopted("failed", "unknown");
                    let next = state.queue.retry(uid, Instant::now());
                    tracing::error!(
                        "pod {}: adopting it failed: {why}; {}",
                        pod_label(&pod),
                        match next {
                            Retry::After { delay, attempt } => format!(
                                "retrying in {} ms (attempt {attempt} of {})",
                                delay.as_millis(),
                                self.settings.max_attempts
                            ),
                            Retry::GaveUp { attempts } => format!(
                                "given up after {attempts} attempts, until the pod changes again"
                            ),
                        }
                    );
                    return;
                }
            }
        }
        let Some(action) = self.settings.action else {
            state.queue.forget(uid);
            return;
        };
        if !is_broken(&pod, &self.settings.filter, action)
            || pod.metadata.deletion_timestamp.is_some()
        {
            state.queue.forget(uid);
            return;
        }
        let done = match action {
            Action::Repair => self.repair(state, &pod, uid).await,
            Action::Delete => self.delete(&pod).await,
            Action::Label => self.label(&pod).await,
        };
        match done {
            Done::Finished => state.queue.forget(uid),
            Done::Failed(why) => {
                self.metrics.count(action.metric_type(), Counted::Fail);
                match state.queue.retry(uid, Instant::now()) {
                    Retry::After { delay, attempt } => tracing::error!(
                        "pod {}: {} failed (attempt {attempt} of {}): {why}; retrying in {} ms",
                        pod_label(&pod),
                        action.metric_type(),
                        self.settings.max_attempts,
                        delay.as_millis()
                    ),
                    Retry::GaveUp { attempts } => tracing::error!(
                        "pod {}: {} failed {attempts} times, the last: {why}; giving up until \
                         the pod changes again",
                        pod_label(&pod),
                        action.metric_type()
                    ),
                }
            }
        }
    }

    async fn repair(&self, state: &mut State, pod: &Pod, uid: &str) -> Done {
        let who = pod_label(pod);
        if state.repaired.contains(uid) {
            return Done::Finished;
        }
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        if let Some(why) = self.plugin.excluded(&ns, &name) {
            tracing::info!(
                "pod {who} is broken, but the plugin leaves it alone: {why}; not repaired"
            );
            self.metrics
                .count(Action::Repair.metric_type(), Counted::Skip);
            return Done::Finished;
        }
        tracing::info!(
            "pod {who} is broken (its validation exited {}): repairing it in place",
            self.settings.filter.exit_code
        );
        let started = Instant::now();
        let (pod_copy, defaults, places) = (
            pod.clone(),
            self.plugin.mesh.clone(),
            self.settings.places.clone(),
        );
        let result =
            tokio::task::spawn_blocking(move || in_place::repair(&pod_copy, &defaults, &places))
                .await;
        match result {
            Ok(Ok(Outcome::Repaired { netns })) => {
                state.repaired.insert(uid.to_owned());
                state.last_repair.insert(
                    uid.to_owned(),
                    Repair {
                        at: std::time::SystemTime::now(),
                        kind: RepairKind::PodRules,
                        why: format!(
                            "its validation exited {}: capture programmed in {} and read back \
                             equal",
                            self.settings.filter.exit_code,
                            netns.display()
                        ),
                    },
                );
                self.metrics
                    .count(Action::Repair.metric_type(), Counted::Success);
                tracing::info!(
                    "pod {who} repaired: its capture is in {} and reads back as the plugin's \
                     ({} ms); its validation passes at its next restart",
                    netns.display(),
                    started.elapsed().as_millis()
                );
                Done::Finished
            }
            Ok(Ok(Outcome::NotCaptured(why))) => {
                state.repaired.insert(uid.to_owned());
                self.metrics
                    .count(Action::Repair.metric_type(), Counted::Skip);
                tracing::info!("pod {who} is broken, but the plugin would not capture it ({why}); not repaired");
                Done::Finished
            }
            // The error names the pod first; the log line does already.
            Ok(Err(e)) => {
                let text = redirect_program::errors::chain(&e);
                let prefix = format!("pod {who}: ");
                Done::Failed(text.strip_prefix(&prefix).unwrap_or(&text).to_owned())
            }
            Err(join) => Done::Failed(format!("the repair task failed: {join}")),
        }
    }

    /// Adopts a pod that may hold Istio's rules (`crate::adopt`).
    async fn adopt(&self, state: &mut State, pod: &Pod, uid: &str) -> Done {
        let who = pod_label(pod);
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        if self.plugin.excluded(&ns, &name).is_some() {
            return Done::Finished;
        }
        let (pod_copy, defaults, places, mode) = (
            pod.clone(),
            self.plugin.mesh.clone(),
            self.settings.places.clone(),
            self.settings.adopt_istio,
        );
        let result = tokio::task::spawn_blocking(move || {
            let find = |uid: &str, ip: std::net::IpAddr| {
                crate::pods::search::find(&places.proc, &places.pins, uid, ip)
            };
            let reach = in_place::Reach {
                find: &find,
                open: &redirect_core::Namespace::open_in,
            };
            adopt::adopt_with(&pod_copy, &defaults, &reach, mode)
        })
        .await;
        let adopted = match result {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => {
                let text = redirect_program::errors::chain(&e);
                let prefix = format!("pod {who}: ");
                return Done::Failed(text.strip_prefix(&prefix).unwrap_or(&text).to_owned());
            }
            Err(join) => return Done::Failed(format!("the adoption task failed: {join}")),
        };
        match adopted {
            Adopted::Nothing | Adopted::NotCaptured(_) => {}
            Adopted::Replaced { held, netns, took } => {
                self.metrics.adopted("replaced", adopted_forms::form(&held));
                if let Some(dir) = &self.settings.adopted_forms {
                    if let Err(e) = adopted_forms::record(dir, uid, adopted_forms::form(&held)) {
                        let e = redirect_program::errors::chain(&e);
                        tracing::warn!("pod {who}: its form is not recorded for a hand-back: {e}");
                    }
                }
                tracing::info!(
                    "pod {who} adopted: it held Istio's rules ({held}); ours are in {} and read \
                     back equal, Istio's removed ({} ms, no restart)",
                    netns.display(),
                    took.as_millis()
                );
                state.adoptions.insert(
                    uid.to_owned(),
                    Adoption::Replaced(Repair {
                        at: std::time::SystemTime::now(),
                        kind: RepairKind::Adopted,
                        why: format!(
                            "held Istio's rules ({held}): ours applied in {}, Istio's removed",
                            netns.display()
                        ),
                    }),
                );
            }
            Adopted::Kept { held, why } => {
                self.metrics.adopted("kept", adopted_forms::form(&held));
                tracing::warn!("pod {who} holds Istio's rules ({held}), kept as they are: {why}");
                state.adoptions.insert(
                    uid.to_owned(),
                    Adoption::Kept(format!(
                        "holds Istio's rules ({held}), still capturing, kept: {why}"
                    )),
                );
            }
        }
        Done::Finished
    }

    async fn delete(&self, pod: &Pod) -> Done {
        let who = pod_label(pod);
        tracing::info!(
            "pod {who} is broken: deleting it (its controller recreates it with the plugin)"
        );
        let result = actions::delete(&self.client, pod).await;
        let message = match &result {
            Ok(()) => "pod detected as broken, deleted".to_string(),
            Err(e) => format!("pod detected as broken, but failed to delete: {e}"),
        };
        self.event(pod, "DeleteBrokenPod", &message).await;
        match result {
            Ok(()) => {
                self.metrics
                    .count(Action::Delete.metric_type(), Counted::Success);
                tracing::info!("pod {who} deleted");
                Done::Finished
            }
            Err(e) => Done::Failed(format!("delete: {e}")),
        }
    }

    async fn label(&self, pod: &Pod) -> Done {
        let (who, key, value) = (
            pod_label(pod),
            &self.settings.label_key,
            &self.settings.label_value,
        );
        if actions::has_label(pod, key) {
            self.metrics
                .count(Action::Label.metric_type(), Counted::Skip);
            tracing::info!("pod {who} already has the label {key}: skipped");
            return Done::Finished;
        }
        tracing::info!("pod {who} is broken: labelling it {key}={value}");
        let result = actions::label(&self.client, pod, key, value).await;
        let message = match &result {
            Ok(()) => "pod detected as broken, labeled".to_string(),
            Err(e) => format!("pod detected as broken, but failed to label: {e}"),
        };
        self.event(pod, "LabelBrokenPod", &message).await;
        match result {
            Ok(()) => {
                self.metrics
                    .count(Action::Label.metric_type(), Counted::Success);
                tracing::info!("pod {who} labelled {key}={value}");
                Done::Finished
            }
            Err(e) => Done::Failed(format!("label: {e}")),
        }
    }

    async fn event(&self, pod: &Pod, reason: &str, message: &str) {
        if let Err(e) =
            actions::warn(&self.client, pod, &self.settings.node_name, reason, message).await
        {
            tracing::warn!(
                "pod {}: could not record the Event {reason}: {e}",
                pod_label(pod)
            );
        }
    }
}

impl Controller {
    /// Shows sidecar pod `uid` in the node view as the controller knows it (or drops it).
    fn publish(&self, state: &State, uid: &str) {
        let sidecar = |p: &Pod| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("sidecar.istio.io/status"))
        };
        let Some(pod) = state.pods.get(uid).filter(|p| sidecar(p)) else {
            self.view.forget_sidecar(uid);
            return;
        };
        let adoption = state.adoptions.get(uid);
        let repair = match adoption {
            Some(Adoption::Replaced(r)) => Some(r.clone()),
            _ => state.last_repair.get(uid).cloned(),
        };
        let action = self.settings.action.unwrap_or(Action::Repair);
        let (word, attention) = if state.repaired.contains(uid) {
            ("repaired", None)
        } else if let Some(Adoption::Kept(why)) = adoption {
            ("istio", Some(why.clone()))
        } else if let Some(Adoption::Replaced(_)) = adoption {
            ("adopted", None)
        } else if is_broken(pod, &self.settings.filter, action) {
            (
                "broken",
                Some(format!(
                    "its validation exited {}: started without capture (repair mode {})",
                    self.settings.filter.exit_code,
                    self.settings.mode()
                )),
            )
        } else {
            ("ok", None)
        };
        self.view.set_sidecar(PodEntry {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
            kind: Kind::Sidecar,
            state: word.into(),
            attention,
            ips: crate::pods::ips(pod),
            netns: None,
            binding: None,
            rules: repair.as_ref().map(|r| ReadBack {
                at: r.at,
                differences: Vec::new(),
            }),
            last_repair: repair,
            ztunnel: None,
            synthetic_check: None,
        });
    }
}

/// The pods an event names.
fn touched(event: &Event<Pod>) -> Vec<String> {
    match event {
        Event::Apply(p) | Event::InitApply(p) | Event::Delete(p) => {
            p.metadata.uid.iter().cloned().collect()
        }
        Event::Init | Event::InitDone => Vec::new(),
    }
}

/// The controller's memory: the latest pods, the queue, the pods repaired.
struct State {
    pods: HashMap<String, Pod>,
    queue: Queue,
    repaired: HashSet<String>,
    /// When and how each repaired pod was repaired (the node view's).
    last_repair: HashMap<String, Repair>,
    /// UIDs seen in the current initial listing (to drop pods gone while the watch was down).
    listing: Option<HashSet<String>>,
    /// Pods looked at for Istio's rules (`ADOPT_ISTIO`): once per pod while it lives.
    examined: HashSet<String>,
    /// What adoption did to each pod that held Istio's rules.
    adoptions: HashMap<String, Adoption>,
}

/// What adoption did to a pod (the node view's).
enum Adoption {
    /// Istio's rules replaced by ours.
    Replaced(Repair),
    /// Istio's rules kept, and why.
    Kept(String),
}

impl State {
    fn new(s: &RepairSettings, backoff: Backoff) -> Self {
        State {
            pods: HashMap::new(),
            queue: Queue::new(s.max_attempts, backoff),
            repaired: HashSet::new(),
            last_repair: HashMap::new(),
            listing: None,
            examined: HashSet::new(),
            adoptions: HashMap::new(),
        }
    }

    fn observe(&mut self, event: Event<Pod>, s: &RepairSettings) {
        match event {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(pod) => {
                if let (Some(seen), Some(uid)) = (self.listing.as_mut(), pod.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                self.apply(pod, s);
            }
            Event::InitDone => {
                if let Some(seen) = self.listing.take() {
                    for uid in not_listed(self.pods.keys(), &seen) {
                        self.gone(&uid);
                    }
                    // The adoption records of pods the listing no longer has (gone while
                    // the agent was away too).
                    if let Some(dir) = &s.adopted_forms {
                        adopted_forms::retain(dir, |uid| seen.contains(uid));
                    }
                }
            }
            Event::Apply(pod) => self.apply(pod, s),
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    self.gone(uid);
                    if let Some(dir) = &s.adopted_forms {
                        adopted_forms::forget(dir, uid);
                    }
                }
            }
        }
    }

    fn apply(&mut self, pod: Pod, s: &RepairSettings) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        // The field selector names this node; a pod elsewhere is never ours to touch.
        let here = pod.spec.as_ref().and_then(|p| p.node_name.as_deref()) == Some(&s.node_name);
        let broken = here && s.action.is_some_and(|a| is_broken(&pod, &s.filter, a));
        let adopt = here && self.wants_adoption(&pod, &uid, s);
        self.pods.insert(uid.clone(), pod);
        if broken || adopt {
            self.queue.add(&uid);
        }
    }

    /// Whether `pod` is to be looked at for Istio's rules: adoption is on, the pod is a
    /// running sidecar pod with an address, not being deleted, and was not looked at yet.
    fn wants_adoption(&self, pod: &Pod, uid: &str, s: &RepairSettings) -> bool {
        s.adopt_istio != AdoptIstio::Off
            && !self.examined.contains(uid)
            && adopt::running_sidecar(pod, &s.filter.sidecar_annotation)
    }

    fn gone(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.repaired.remove(uid);
        self.last_repair.remove(uid);
        self.examined.remove(uid);
        self.adoptions.remove(uid);
        self.queue.forget(uid);
    }
}
