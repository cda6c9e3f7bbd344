//! The ambient controller: it watches this node's pods and every namespace's labels, enrolls
//! the pods Istio's selectors pick (a label change enrolls or releases a running pod), answers
//! the plugin's requests at ADD, and sets each pod's `ambient.istio.io/redirection`
//! annotation once the data plane holds it (`enabled`, or `pending` while ztunnel has not
//! acknowledged it).
//!
//! At start it learns every pod first and enrolls the ones already annotated (their rules
//! checked, and programmed again when they differ and `reconcile_on_startup` says so), and
//! only then lets ztunnel connect: ztunnel drops the pods a snapshot does not name.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::watch as signal;
use tokio::sync::{mpsc, oneshot};

use super::dataplane::{Dataplane, Rules, Stage};
use super::pods::{self, Want};
use super::AmbientSettings;
use crate::metrics::Metrics;
use crate::repair::actions::pod_label;
use crate::repair::controller::{not_listed, sleep_until};
use crate::repair::in_place::Places;
use crate::repair::queue::{Backoff, Queue};
use cni_plugin::ambient::{AddAnswer, AddRequest};
use redirect_core::istio::ambient::REDIRECTION;

/// The plugin's request at ADD, with the pod's namespace and where to answer.
pub struct PluginRequest {
    pub add: AddRequest,
    pub netns: std::os::fd::OwnedFd,
    pub answer: oneshot::Sender<AddAnswer>,
}

/// Everything the controller needs.
pub struct Controller {
    pub client: Client,
    pub settings: AmbientSettings,
    pub node: String,
    pub excluded: Vec<String>,
    pub places: Places,
    pub metrics: Metrics,
    pub dataplane: Arc<Mutex<Dataplane>>,
    pub requests: mpsc::Receiver<PluginRequest>,
}

/// The controller's memory of the cluster.
pub(super) struct State {
    pub(super) pods: HashMap<String, Pod>,
    pub(super) namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Whether each watch has listed once; enrollment starts when both have.
    listed: (bool, bool),
    started: bool,
    pub(super) queue: Queue,
    /// The pods of the listing under way (a relist after the watch failed).
    listing: Option<HashSet<String>>,
}

impl State {
    /// Nothing known yet; failed pods retried without end (backoff up to 30 s), as Istio.
    fn new() -> State {
        State {
            pods: HashMap::new(),
            namespaces: HashMap::new(),
            listed: (false, false),
            started: false,
            queue: Queue::new(u32::MAX, Backoff::default()),
            listing: None,
        }
    }

    pub(super) fn namespace_labels(&self, pod: &Pod) -> BTreeMap<String, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        self.namespaces.get(ns).cloned().unwrap_or_default()
    }

    /// A pod read from the API at ADD, before the watch brings it: kept (and not taken for
    /// deleted by a listing under way).
    pub(super) fn remember(&mut self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.clone() {
            if let Some(seen) = self.listing.as_mut() {
                seen.insert(uid.clone());
            }
            self.pods.entry(uid).or_insert_with(|| pod.clone());
        }
    }

    fn on_pod(&mut self, event: Event<Pod>) {
        match event {
            Event::Apply(p) | Event::InitApply(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    if let Some(seen) = self.listing.as_mut() {
                        seen.insert(uid.clone());
                    }
                    self.pods.insert(uid.clone(), p);
                    self.queue.add(&uid);
                }
            }
            Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.pods.remove(uid);
                    self.queue.add(uid);
                }
            }
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitDone => {
                // A pod deleted while the watch was down has no Delete event: the listing
                // is the truth.
                if let Some(seen) = self.listing.take() {
                    for uid in not_listed(self.pods.keys(), &seen) {
                        self.pods.remove(&uid);
                        self.queue.add(&uid);
                    }
                }
                self.listed.0 = true;
            }
        }
    }

    fn on_namespace(&mut self, event: Event<KubeNamespace>) {
        let changed = match event {
            Event::Apply(n) | Event::InitApply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                let labels = n.metadata.labels.clone().unwrap_or_default();
                (self.namespaces.insert(name.clone(), labels.clone()) != Some(labels))
                    .then_some(name)
            }
            Event::Delete(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                self.namespaces.remove(&name).map(|_| name)
            }
            Event::Init => None,
            Event::InitDone => {
                self.listed.1 = true;
                None
            }
        };
        if let Some(ns) = changed {
            let uids: Vec<String> = self
                .pods
                .iter()
                .filter(|(_, p)| p.metadata.namespace.as_deref() == Some(&ns))
                .map(|(u, _)| u.clone())
                .collect();
            for uid in uids {
                self.queue.add(&uid);
            }
        }
    }
}

impl Controller {
    /// Watches and acts until `stop` turns true.
    pub async fn run(mut self, mut stop: signal::Receiver<bool>) {
        tracing::info!(
            "starting the ambient controller: pods on node {} (istio.io/dataplane-mode=ambient \
             on the pod or its namespace), ztunnel's socket {}",
            self.node,
            self.settings.ztunnel_socket.display()
        );
        let fields = format!("spec.nodeName={}", self.node);
        let pods = watcher::watcher(
            Api::<Pod>::all(self.client.clone()),
            watcher::Config::default().fields(&fields),
        );
        let namespaces = watcher::watcher(
            Api::<KubeNamespace>::all(self.client.clone()),
            watcher::Config::default(),
        );
        let (mut pods, mut namespaces) = (std::pin::pin!(pods), std::pin::pin!(namespaces));
        let mut state = State::new();
        let mut retry = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            let due = state.queue.next_due();
            tokio::select! {
                _ = stop.changed() => break,
                Some(e) = pods.next() => match e {
                    Ok(e) => state.on_pod(e),
                    Err(e) => watch_failed("pods", &e).await,
                },
                Some(e) = namespaces.next() => match e {
                    Ok(e) => state.on_namespace(e),
                    Err(e) => watch_failed("namespaces", &e).await,
                },
                Some(r) = self.requests.recv() => self.plugin_request(&mut state, r).await,
                _ = retry.tick() => self.pending_again(&mut state),
                _ = sleep_until(due), if due.is_some() => {}
            }
            if *stop.borrow() {
                break;
            }
            if state.listed == (true, true) {
                self.work(&mut state).await;
            }
        }
        tracing::info!("the ambient controller stopped");
    }

    /// Works the queue; the first time, every pod, then ztunnel may connect.
    async fn work(&self, state: &mut State) {
        let first = !state.started;
        while let Some(uid) = state.queue.pop(Instant::now()) {
            match self.reconcile(state, &uid, first).await {
                Ok(()) => state.queue.forget(&uid),
                Err(why) => {
                    self.metrics.ambient_failed();
                    tracing::warn!("ambient: pod {uid}: {why}; trying again");
                    state.queue.retry(&uid, Instant::now());
                }
            }
        }
        if first {
            state.started = true;
            let dp = self.dataplane.lock().unwrap_or_else(|p| p.into_inner());
            dp.zds().serve_connections();
            tracing::info!(
                "ambient: {} pod(s) enrolled at start; ztunnel may connect to {}",
                dp.len(),
                self.settings.ztunnel_socket.display()
            );
        }
        self.update_metrics();
    }

    /// Pending pods are sent to ztunnel again (after a nack; a new connection's snapshot
    /// carries the others).
    fn pending_again(&self, state: &mut State) {
        let dp = self.dataplane.lock().unwrap_or_else(|p| p.into_inner());
        for uid in dp.enrolled() {
            let annotated = state
                .pods
                .get(&uid)
                .and_then(pods::redirection)
                .map(str::to_owned);
            if annotated.as_deref() != Some("enabled") {
                state.queue.add(&uid);
            }
        }
    }

    /// Brings pod `uid` where it should be: enrolled, released, annotated.
    async fn reconcile(&self, state: &mut State, uid: &str, first: bool) -> Result<(), String> {
        let id = uid.to_owned();
        let enrolled = self.with_dataplane(move |dp| dp.stage(&id)).await;
        let Some(pod) = state.pods.get(uid).cloned() else {
            if enrolled.is_some() {
                self.release(uid, true).await;
            }
            return Ok(());
        };
        match (
            pods::want(&pod, &state.namespace_labels(&pod), &self.excluded),
            enrolled,
        ) {
            (Want::In(ip), None) => {
                let rules = match (first, pods::redirection(&pod).is_some()) {
                    (true, true) if !self.settings.reconcile_on_startup => Rules::Leave,
                    (_, true) => Rules::KeepIfSame,
                    (_, false) => Rules::Apply,
                };
                let stage = self.enroll_found(&pod, ip, rules).await?;
                self.annotate(&pod, Some(stage)).await
            }
            (Want::In(_) | Want::NoAddressYet, Some(stage)) => {
                let (id, ips) = (uid.to_owned(), pods::ips(&pod));
                self.with_dataplane(move |dp| dp.refresh_ips(&id, &ips))
                    .await
                    .map_err(|e| e.to_string())?;
                let stage = match stage {
                    Stage::Pending => self.resend(uid).await.unwrap_or(stage),
                    Stage::Enabled => stage,
                };
                self.annotate(&pod, Some(stage)).await
            }
            (Want::NoAddressYet, None) => Ok(()),
            (Want::Out { why, deleting }, Some(_)) => {
                tracing::info!("ambient: pod {} leaves the mesh: {why}", pod_label(&pod));
                self.release(uid, deleting).await;
                if deleting {
                    return Ok(());
                }
                self.annotate(&pod, None).await
            }
            (Want::Out { why, deleting }, None) => {
                if deleting || pods::redirection(&pod).is_none() {
                    return Ok(());
                }
                // Annotated by an earlier agent, out since: its rules go too.
                tracing::info!("ambient: pod {} leaves the mesh: {why}", pod_label(&pod));
                self.remove_left_rules(&pod).await;
                self.annotate(&pod, None).await
            }
        }
    }

    /// Finds the pod's namespace on the node and enrolls it there.
    async fn enroll_found(
        &self,
        pod: &Pod,
        ip: std::net::IpAddr,
        rules: Rules,
    ) -> Result<Stage, String> {
        let (who, places) = (pod_label(pod), self.places.clone());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let netns = tokio::task::spawn_blocking(move || {
            crate::repair::pod_netns::find(&places.proc, &places.pins, &uid, ip)
        })
        .await
        .map_err(|e| e.to_string())?;
        let netns = match netns {
            Ok(n) => n,
            Err(e) if rules == Rules::Leave || rules == Rules::KeepIfSame => {
                // Enrolled before: ztunnel keeps serving it as it is.
                tracing::warn!("ambient: pod {who}: {e}; ztunnel is told to keep it");
                let r = pods::pod_ref(pod, &[]);
                self.with_dataplane(move |dp| dp.keep(&r)).await;
                return Ok(Stage::Pending);
            }
            Err(e) => return Err(e.to_string()),
        };
        let (r, cfg) = (pods::pod_ref(pod, &[]), self.pod_config(pod)?);
        let (stage, refused) = self
            .with_dataplane(move |dp| dp.add(&r, netns, &cfg, rules))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(e) = refused {
            tracing::warn!("ambient: pod {who}: {e}");
        }
        tracing::info!("ambient: pod {who} enrolled ({stage:?})");
        Ok(stage)
    }

    pub(super) fn pod_config(&self, pod: &Pod) -> Result<redirect_core::AmbientConfig, String> {
        let (cfg, warnings) =
            redirect_core::istio::ambient::pod_config(&pods::annotations(pod), &self.settings.base)
                .map_err(|e| e.to_string())?;
        for w in warnings {
            tracing::warn!("ambient: pod {}: {w}", pod_label(pod));
        }
        Ok(cfg)
    }

    async fn resend(&self, uid: &str) -> Option<Stage> {
        let uid = uid.to_owned();
        let sent = self.with_dataplane(move |dp| dp.resend(&uid)).await?;
        if let (_, Some(e)) = &sent {
            tracing::warn!("ambient: {e}");
        }
        Some(sent.0)
    }

    pub(super) async fn release(&self, uid: &str, deleting: bool) {
        let id = uid.to_owned();
        if let Some((pod, problems)) = self
            .with_dataplane(move |dp| dp.remove(&id, deleting))
            .await
        {
            for p in &problems {
                tracing::warn!("ambient: pod {}: {p}", pod.label());
            }
            tracing::info!(
                "ambient: pod {} released{}",
                pod.label(),
                if deleting {
                    " (being deleted: its rules go with its namespace)"
                } else {
                    ": its in-pod rules removed, ztunnel told"
                }
            );
        }
    }

    /// Rules an earlier agent left in a pod that is no longer ambient.
    async fn remove_left_rules(&self, pod: &Pod) {
        let Some(ip) = pods::ips(pod).first().copied() else {
            return;
        };
        let (places, uid, who) = (
            self.places.clone(),
            pod.metadata.uid.clone().unwrap_or_default(),
            pod_label(pod),
        );
        let done = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let netns = crate::repair::pod_netns::find(&places.proc, &places.pins, &uid, ip)
                .map_err(|e| e.to_string())?;
            let ns = redirect_core::Namespace::from_netns(netns).map_err(|e| e.to_string())?;
            ns.remove_ambient().map_err(|e| e.to_string())
        })
        .await;
        if let Ok(Err(e)) | Err(e) = done.map_err(|e| e.to_string()) {
            tracing::warn!("ambient: pod {who}: its in-pod rules could not be removed: {e}");
        }
    }

    /// Sets (or removes, with `None`) the pod's `ambient.istio.io/redirection`.
    pub(super) async fn annotate(&self, pod: &Pod, stage: Option<Stage>) -> Result<(), String> {
        let value = stage.map(|s| match s {
            Stage::Enabled => "enabled",
            Stage::Pending => "pending",
        });
        if pods::redirection(pod) == value {
            return Ok(());
        }
        let patch = serde_json::json!({"metadata": {"annotations": {REDIRECTION: value}}});
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("annotating {REDIRECTION}={value:?}: {e}"))?;
        tracing::info!(
            "ambient: pod {} annotated {REDIRECTION}={}",
            pod_label(pod),
            value.unwrap_or("(removed)")
        );
        Ok(())
    }

    /// Runs `f` on the data plane in a blocking task.
    pub(super) async fn with_dataplane<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Dataplane) -> T + Send + 'static,
    ) -> T {
        let dp = self.dataplane.clone();
        tokio::task::spawn_blocking(move || {
            let mut dp = dp.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut dp)
        })
        .await
        .expect("the data plane's task does not panic")
    }

    pub(super) fn update_metrics(&self) {
        let mut dp = self.dataplane.lock().unwrap_or_else(|p| p.into_inner());
        let uids = dp.enrolled();
        let enabled = uids
            .iter()
            .filter(|u| dp.stage(u) == Some(Stage::Enabled))
            .count();
        self.metrics.set_ambient(
            enabled,
            uids.len() - enabled,
            dp.zds().connected(),
            dp.zds().connections(),
        );
    }
}

async fn watch_failed(what: &str, e: &watcher::Error) {
    tracing::warn!("ambient: the watch of {what} failed: {e}; trying again in 1 s");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, ns: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": ns, "uid": uid}
        }))
        .unwrap()
    }

    fn state() -> State {
        State::new()
    }

    fn drain(s: &mut State) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(u) = s.queue.pop(Instant::now()) {
            s.queue.forget(&u);
            out.push(u);
        }
        out.sort();
        out
    }

    #[test]
    fn a_relist_drops_the_pods_it_no_longer_names_but_those_read_at_add() {
        let mut s = state();
        s.on_pod(Event::Init);
        s.on_pod(Event::InitApply(pod("a", "shop")));
        s.on_pod(Event::InitApply(pod("b", "shop")));
        s.on_pod(Event::InitDone);
        assert_eq!(drain(&mut s), ["a", "b"]);
        // The watch failed; b was deleted meanwhile, c read from the API at ADD during the
        // new listing.
        s.on_pod(Event::Init);
        s.remember(&pod("c", "shop"));
        s.on_pod(Event::InitApply(pod("a", "shop")));
        s.on_pod(Event::InitDone);
        assert_eq!(drain(&mut s), ["a", "b"], "b queued to be released");
        let mut kept: Vec<&String> = s.pods.keys().collect();
        kept.sort();
        assert_eq!(kept, ["a", "c"]);
    }

    #[test]
    fn a_namespace_label_change_queues_its_pods_only() {
        let mut s = state();
        s.on_pod(Event::Apply(pod("a", "shop")));
        s.on_pod(Event::Apply(pod("b", "other")));
        drain(&mut s);
        let ns: KubeNamespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}
        }))
        .unwrap();
        s.on_namespace(Event::Apply(ns.clone()));
        assert_eq!(drain(&mut s), ["a"]);
        s.on_namespace(Event::Apply(ns));
        assert!(
            drain(&mut s).is_empty(),
            "the same labels again queue nothing"
        );
    }
}
