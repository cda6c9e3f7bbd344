//! The ambient controller, level-triggered: the desired state comes from the API (this node's
//! pods, every namespace's labels, Istio's selectors), the actual state is read back (each
//! enrolled pod's table, the host's probe table and its sets, what the current ztunnel
//! connection acked), and the difference is converged: on each change it sees, on each of the
//! plugin's requests, and in a pass every `AMBIENT_RECONCILE_INTERVAL` (and at once when
//! ztunnel comes or goes). A pod's `ambient.istio.io/redirection` annotation says what was
//! read back: `enabled` only when the current connection acked the pod, `pending` when a
//! connected ztunnel has not; with no ztunnel connected it is left as it is (nobody to ask),
//! so a restart of either side writes nothing to a pod that did not change.
//!
//! At start it learns every pod first and enrolls the ones already annotated (a pod without
//! an address yet is found by its cgroup, or kept in ztunnel when it cannot be found), and
//! only then lets ztunnel connect: ztunnel drops the pods a snapshot does not name.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use tokio::sync::watch as signal;
use tokio::sync::{mpsc, Notify};

mod plugin;
mod state;

use state::State;

use super::dataplane::{Dataplane, PassReport, Rules, Stage};
use super::dataplane_thread::DataplaneThread;
use super::error::AmbientError;
use super::identity::Binding;
use super::plugin_requests::PluginRequest;
use super::pods::{self, Want};
use super::AmbientSettings;
use crate::node_view::{AmbientPart, Kind, NodeView, PodEntry, ZtunnelState};
use crate::pods::{sleep_until, Places};
use crate::telemetry::Metrics;
use redirect_core::ambient::REDIRECTION;

/// Everything the controller needs.
pub struct Controller {
    pub client: Client,
    pub settings: AmbientSettings,
    /// The node's pods and the namespaces (metadata), shared with the other controllers.
    pub informers: crate::informers::Informers,
    pub node: String,
    pub excluded: Vec<String>,
    pub places: Places,
    pub metrics: Metrics,
    /// The data plane, on its own thread: every step that blocks goes there, in turn.
    pub dataplane: DataplaneThread,
    pub requests: mpsc::Receiver<PluginRequest>,
    pub view: NodeView,
}

/// The annotation a pod should carry at `stage`, given what it carries: with no ztunnel to
/// ask, what it carries stays.
fn annotation_for(stage: Stage, carried: Option<&str>) -> &'static str {
    match (stage, carried) {
        (Stage::Enabled, _) => "enabled",
        (Stage::Disconnected, Some("enabled")) => "enabled",
        (Stage::Pending | Stage::Disconnected, _) => "pending",
    }
}

impl Controller {
    /// Watches and acts until `stop` turns true.
    pub async fn run(mut self, mut stop: signal::Receiver<bool>) {
        tracing::info!(
            "starting the ambient controller: pods on node {} (istio.io/dataplane-mode=ambient \
             on the pod or its namespace), ztunnel's socket {}, a pass every {:?}",
            self.node,
            self.settings.ztunnel_socket.display(),
            self.settings.reconcile_interval
        );
        let mut pods = self.informers.pods.subscribe();
        let mut namespaces = self.informers.namespaces.subscribe();
        let mut state = State::new();
        state.passes.interval_s = self.settings.reconcile_interval.as_secs_f64();
        // ztunnel came or went: a pass at once (the gauge, the annotations, what to resend).
        let wake = Arc::new(Notify::new());
        let w = wake.clone();
        self.with_dataplane(move |dp| dp.zds().on_change(move || w.notify_one()))
            .await;
        let mut pass_timer = tokio::time::interval(self.settings.reconcile_interval);
        pass_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = state.queue.next_due();
            let mut pass_due = false;
            tokio::select! {
                _ = stop.changed() => break,
                Some(e) = pods.recv() => {
                    let uid = |p: &Pod| p.metadata.uid.as_ref().is_some_and(|u| state.pods.contains_key(u));
                    self.count_event(State::event_type(&e, uid));
                    state.on_pod(e)
                }
                Some(e) = namespaces.recv() => {
                    let name = |n: &KubeNamespace| n.metadata.name.as_ref().is_some_and(|n| state.namespaces.contains_key(n));
                    self.count_event(State::event_type(&e, name));
                    state.on_namespace(e)
                }
                Some(r) = self.requests.recv() => plugin::answer(&self, &mut state, r).await,
                _ = pass_timer.tick() => pass_due = true,
                _ = wake.notified() => pass_due = true,
                _ = sleep_until(due), if due.is_some() => {}
            }
            if *stop.borrow() {
                break;
            }
            if state.listed == (true, true) {
                self.work(&mut state).await;
                if pass_due && state.started {
                    self.pass(&mut state).await;
                    self.work(&mut state).await;
                }
            }
        }
        // The data plane dropped (its ZDS socket removed) before the controller is done.
        self.dataplane.close().await;
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
                    tracing::warn!(
                        "ambient: pod {uid}: {}; trying again",
                        redirect_program::errors::chain(&why)
                    );
                    state.queue.retry(&uid, Instant::now());
                }
            }
        }
        if first {
            state.started = true;
            let enrolled = self
                .with_dataplane(|dp| {
                    dp.zds().serve_connections();
                    dp.len()
                })
                .await;
            tracing::info!(
                "ambient: {enrolled} pod(s) enrolled at start; ztunnel may connect to {}",
                self.settings.ztunnel_socket.display()
            );
        }
        self.update_metrics().await;
    }

    /// One pass: the data plane read back and converged, the kept pods looked for, the
    /// annotations that differ from what was read queued, the view and metrics published.
    async fn pass(&self, state: &mut State) {
        let report = self.with_dataplane(|dp| dp.pass()).await;
        self.report(state, &report);
        self.find_kept(state).await;
        let stages: Vec<(String, Option<Stage>)> = self
            .with_dataplane(|dp| {
                dp.enrolled()
                    .into_iter()
                    .map(|u| {
                        let s = dp.stage(&u);
                        (u, s)
                    })
                    .collect()
            })
            .await;
        for (uid, stage) in stages {
            let Some(pod) = state.pods.get(&uid) else {
                continue;
            };
            let carried = pods::redirection(pod);
            if let Some(stage) = stage {
                if carried != Some(annotation_for(stage, carried)) {
                    state.queue.add(&uid);
                }
            }
        }
        state.passes.passes += 1;
        state.passes.last = Some(rfc3339(SystemTime::now()));
        state.passes.took_ms = report.took.as_secs_f64() * 1000.0;
        self.metrics.ambient_pass(report.took);
        // The stages and, with CAPTURE_COUNTERS, the counters this pass read.
        self.update_metrics().await;
        self.publish(state).await;
    }

    /// Logs and counts what a pass repaired and what it could not.
    fn report(&self, state: &mut State, report: &PassReport) {
        for (who, r) in &report.repairs {
            let what = if who == "host" {
                "the host's probe table".to_string()
            } else {
                format!("pod {who}")
            };
            tracing::warn!("ambient: {what} repaired ({}): {}", r.kind.label(), r.why);
            self.metrics.ambient_repair(r.kind.label());
            *state
                .passes
                .repairs
                .entry(r.kind.label().to_string())
                .or_default() += 1;
        }
        for p in &report.problems {
            tracing::warn!("ambient: {p}; trying again on the next pass");
        }
        if let Some((pod, before, outcome)) = &report.synthetic {
            self.metrics.synthetic_check(outcome.is_ok());
            if !outcome.is_ok() {
                tracing::warn!(
                    "ambient: pod {pod}: synthetic check failed ({}): {outcome} (observational: \
                     its state is unchanged)",
                    outcome.reason()
                );
            } else if *before == Some(false) {
                tracing::info!("ambient: pod {pod}: synthetic check recovered: {outcome}");
            }
        }
    }

    /// The pods ztunnel keeps whose namespace the agent did not find: looked for again.
    async fn find_kept(&self, state: &mut State) {
        let kept = self.with_dataplane(|dp| dp.kept()).await;
        for pod in kept {
            let ip = state
                .pods
                .get(&pod.uid)
                .and_then(|p| pods::ips(p).first().copied());
            let Ok(netns) = self.search(&pod.uid, ip).await else {
                continue;
            };
            let uid = pod.uid.clone();
            match self
                .with_dataplane(move |dp| dp.adopt(&uid, netns, Binding::Search))
                .await
            {
                Ok(r) => {
                    tracing::warn!(
                        "ambient: pod {} repaired ({}): {}",
                        pod.label(),
                        r.kind.label(),
                        r.why
                    );
                    self.metrics.ambient_repair(r.kind.label());
                    state.queue.add(&pod.uid);
                }
                Err(e) => tracing::warn!("ambient: pod {}: {e}", pod.label()),
            }
        }
    }

    /// Brings pod `uid` where it should be: enrolled, released, annotated.
    async fn reconcile(
        &self,
        state: &mut State,
        uid: &str,
        first: bool,
    ) -> Result<(), AmbientError> {
        let id = uid.to_owned();
        let enrolled = self.with_dataplane(move |dp| dp.stage(&id)).await;
        let Some(pod) = state.pods.get(uid).cloned() else {
            if enrolled.is_some() {
                self.release(uid, true).await;
            }
            return Ok(());
        };
        let annotated = pods::redirection(&pod).is_some();
        match (
            pods::want(
                &pod,
                &state.namespace_labels(&pod),
                &self.excluded,
                &self.settings.selectors,
            ),
            enrolled,
        ) {
            // Not enrolled, no address yet, never enrolled: the plugin's ADD enrolls it.
            (Want::NoAddressYet, None) if !annotated => Ok(()),
            (Want::In(_) | Want::NoAddressYet, None) => {
                let rules = match (first, annotated) {
                    (true, true) if !self.settings.reconcile_on_startup => Rules::Leave,
                    (_, true) => Rules::KeepIfSame,
                    (_, false) => Rules::Apply,
                };
                let stage = self.enroll_found(&pod, rules).await?;
                self.annotate(state, &pod, stage).await
            }
            (Want::In(_) | Want::NoAddressYet, Some(_)) => {
                self.confirm(state, &pod).await?;
                self.reconfigure(&pod).await?;
                let id = uid.to_owned();
                match self.with_dataplane(move |dp| dp.stage(&id)).await {
                    Some(stage) => self.annotate(state, &pod, stage).await,
                    None => Ok(()),
                }
            }
            (Want::Out { why, deleting }, Some(_)) => {
                tracing::info!("ambient: pod {} leaves the mesh: {why}", pods::label(&pod));
                self.release(uid, deleting).await;
                if deleting {
                    return Ok(());
                }
                self.unannotate(state, &pod).await
            }
            (Want::Out { why, deleting }, None) => {
                if deleting || !annotated {
                    return Ok(());
                }
                // Annotated by an earlier agent, out since: its rules go too.
                tracing::info!("ambient: pod {} leaves the mesh: {why}", pods::label(&pod));
                self.remove_left_rules(&pod).await;
                self.unannotate(state, &pod).await
            }
        }
    }

    /// An enrolled pod's in-pod settings converged on its annotations as they are now: a
    /// changed `ambient.istio.io/dns-capture` (or the like) is applied to the running pod, as
    /// the same pod enrolled now would get, and holds through the agent's restarts (which
    /// compute them from the annotations too). Istio reads them at enrollment only.
    async fn reconfigure(&self, pod: &Pod) -> Result<(), AmbientError> {
        let (uid, cfg) = (
            pod.metadata.uid.clone().unwrap_or_default(),
            self.pod_config(pod)?,
        );
        let to = cfg.clone();
        if let Some(was) = self
            .with_dataplane(move |dp| dp.reconfigure(&uid, &to))
            .await?
        {
            tracing::info!(
                "ambient: pod {}: its annotations changed its in-pod settings ({}): its rules \
                 programmed again with them",
                pods::label(pod),
                settings_change(&was, &cfg)
            );
        }
        Ok(())
    }

    /// The API's addresses of an enrolled pod checked against its namespace; a namespace that
    /// does not hold them is not the pod's: released, and the pod enrolled again in the one
    /// the agent's own search finds.
    async fn confirm(&self, state: &mut State, pod: &Pod) -> Result<(), AmbientError> {
        let (uid, api) = (pod.metadata.uid.clone().unwrap_or_default(), pods::ips(pod));
        let id = uid.clone();
        let why = match self.with_dataplane(move |dp| dp.confirm(&id, &api)).await {
            Ok(_) => return Ok(()),
            Err(why @ AmbientError::NotItsNamespace { .. }) => why,
            Err(other) => return Err(other),
        };
        tracing::warn!(
            "ambient: pod {}: {why}: released from it, its namespace searched for",
            pods::label(pod)
        );
        self.metrics.ambient_repair("namespace");
        *state.passes.repairs.entry("namespace".into()).or_default() += 1;
        self.release(&uid, false).await;
        self.enroll_found(pod, Rules::Apply).await.map(|_| ())
    }

    /// Finds the pod's namespace on the node (by its cgroup, and its address when it has one)
    /// and enrolls it there; a pod an earlier agent enrolled whose namespace cannot be found
    /// is kept in ztunnel as it is.
    async fn enroll_found(&self, pod: &Pod, rules: Rules) -> Result<Stage, AmbientError> {
        let who = pods::label(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ip = pods::ips(pod).first().copied();
        let netns = match self.search(&uid, ip).await {
            Ok(n) => n,
            Err(e) if rules == Rules::Leave || rules == Rules::KeepIfSame => {
                // Enrolled before: ztunnel keeps serving it as it is.
                tracing::warn!(
                    "ambient: pod {who}: {}; ztunnel is told to keep it",
                    redirect_program::errors::chain(&e)
                );
                let (r, cfg) = (pods::pod_ref(pod), self.pod_config(pod)?);
                return Ok(self
                    .with_dataplane(move |dp| dp.enroll(&r, None, &cfg, rules))
                    .await?
                    .0);
            }
            Err(e) => return Err(e),
        };
        let (r, cfg) = (pods::pod_ref(pod), self.pod_config(pod)?);
        let (stage, refused) = self
            .with_dataplane(move |dp| dp.enroll(&r, Some((netns, Binding::Search)), &cfg, rules))
            .await?;
        if let Some(e) = refused {
            tracing::warn!(
                "ambient: pod {who}: {}",
                redirect_program::errors::chain(&e)
            );
        }
        tracing::info!("ambient: pod {who} enrolled ({stage:?})");
        Ok(stage)
    }

    /// The agent's own search for pod `uid`'s namespace under the host's `/proc`.
    async fn search(
        &self,
        uid: &str,
        ip: Option<IpAddr>,
    ) -> Result<redirect_core::Netns, AmbientError> {
        let (places, uid) = (self.places.clone(), uid.to_owned());
        let found = tokio::task::spawn_blocking(move || match ip {
            Some(ip) => crate::pods::search::find(&places.proc, &places.pins, &uid, ip),
            None => crate::pods::search::find_by_uid(&places.proc, &uid),
        })
        .await?;
        Ok(found?)
    }

    pub(super) fn pod_config(
        &self,
        pod: &Pod,
    ) -> Result<redirect_core::AmbientConfig, AmbientError> {
        let (cfg, warnings) =
            redirect_core::ambient::pod_config(&pods::annotations(pod), &self.settings.base)
                .map_err(|e| AmbientError::Annotations { error: e.into() })?;
        for w in warnings {
            tracing::warn!("ambient: pod {}: {w}", pods::label(pod));
        }
        Ok(cfg)
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
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ip = pods::ips(pod).first().copied();
        let who = pods::label(pod);
        let netns = match self.search(&uid, ip).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(
                    "ambient: pod {who}: its in-pod rules could not be removed: {}",
                    redirect_program::errors::chain(&e)
                );
                return;
            }
        };
        let done = tokio::task::spawn_blocking(move || {
            // Whatever IPv6 setting put them there: both families' routing go.
            let capture = redirect_core::Capture::Ambient(redirect_core::AmbientConfig {
                ipv6: true,
                ..Default::default()
            });
            redirect_core::Namespace::from_netns(netns).and_then(|ns| ns.remove(&capture))
        })
        .await;
        if let Ok(Err(e)) = done {
            tracing::warn!("ambient: pod {who}: its in-pod rules could not be removed: {e}");
        }
    }

    /// Sets the pod's `ambient.istio.io/redirection` to what `stage` says (nothing is written
    /// when it says so already).
    async fn annotate(
        &self,
        state: &mut State,
        pod: &Pod,
        stage: Stage,
    ) -> Result<(), AmbientError> {
        let carried = pods::redirection(pod);
        let value = annotation_for(stage, carried);
        if carried == Some(value) {
            return Ok(());
        }
        self.patch_annotation(state, pod, Some(value)).await
    }

    /// Removes the pod's `ambient.istio.io/redirection`.
    async fn unannotate(&self, state: &mut State, pod: &Pod) -> Result<(), AmbientError> {
        if pods::redirection(pod).is_none() {
            return Ok(());
        }
        self.patch_annotation(state, pod, None).await
    }

    /// Writes the annotation; the pod the API server answers with (its state after the write)
    /// replaces the watch's copy, so that a pass before the watch's event does not write
    /// again.
    async fn patch_annotation(
        &self,
        state: &mut State,
        pod: &Pod,
        value: Option<&str>,
    ) -> Result<(), AmbientError> {
        let patch = serde_json::json!({"metadata": {"annotations": {REDIRECTION: value}}});
        let api: Api<Pod> = Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let written = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|error| AmbientError::Annotate {
                key: REDIRECTION,
                value: value.map(str::to_owned),
                error: Box::new(error),
            })?;
        if let (Some(uid), Some(rv)) = (
            written.metadata.uid.clone(),
            written.metadata.resource_version.clone(),
        ) {
            if state.pods.contains_key(&uid) {
                state.written.insert(uid.clone(), rv);
                state.pods.insert(uid, written);
            }
        }
        tracing::info!(
            "ambient: pod {} annotated {REDIRECTION}={}",
            pods::label(pod),
            value.unwrap_or("(removed)")
        );
        Ok(())
    }

    /// Runs `f` on the data plane, on its thread, after the calls before it.
    pub(super) async fn with_dataplane<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Dataplane) -> T + Send + 'static,
    ) -> T {
        self.dataplane.call(f).await
    }

    /// One watch event in Istio's `nodeagent_reconcile_events_total`.
    fn count_event(&self, r#type: Option<&'static str>) {
        if let Some(t) = r#type {
            self.metrics.reconcile_event(t);
        }
    }

    /// The ambient gauges and, with `CAPTURE_COUNTERS`, the enrolled pods' counters, as the
    /// data plane holds them now (read in one call).
    pub(super) async fn update_metrics(&self) {
        let counted = self.metrics.capture_counts();
        let with_counts = counted.is_some();
        let (enabled, pods, open, connections, counts) = self
            .with_dataplane(move |dp| {
                let uids = dp.enrolled();
                let enabled = uids
                    .iter()
                    .filter(|u| dp.stage(u) == Some(Stage::Enabled))
                    .count();
                let counts = with_counts.then(|| dp.counts());
                let zds = dp.zds();
                (
                    enabled,
                    uids.len(),
                    zds.open().len(),
                    zds.connections(),
                    counts,
                )
            })
            .await;
        self.metrics
            .set_ambient(enabled, pods - enabled, open, connections);
        if let (Some(store), Some(counts)) = (counted, counts) {
            store.set(crate::telemetry::capture_counts::Source::Ambient, counts);
        }
    }

    /// The node view's ambient part, from what the pass read.
    async fn publish(&self, state: &State) {
        let passes = state.passes.clone();
        let socket = self.settings.ztunnel_socket.display().to_string();
        let (mut part, kept) = self
            .with_dataplane(move |dp| {
                let conn = dp.zds().connection();
                let closed = dp.zds().closed_silent();
                let part = AmbientPart {
                    ztunnel: ZtunnelState {
                        socket,
                        connected: conn.is_some(),
                        connection: conn.as_ref().map(|c| c.id),
                        connected_since: conn.map(|c| rfc3339(c.since)),
                        connections: dp.zds().connections(),
                        connections_open: dp.zds().open().len(),
                        closed_silent: closed.evicted + closed.timed_out,
                    },
                    host_probe: dp.host(),
                    pass: passes,
                    pods: Vec::new(),
                };
                (part, dp.states())
            })
            .await;
        let connected = part.ztunnel.connected;
        part.pods = kept
            .into_iter()
            .map(|p| {
                let carried = state.pods.get(&p.uid).and_then(pods::redirection);
                let (word, attention) = pod_state(&p, connected, carried);
                PodEntry {
                    namespace: p.namespace,
                    name: p.name,
                    uid: p.uid,
                    kind: Kind::Ambient,
                    state: word.into(),
                    attention,
                    ips: p.ips,
                    netns: p.netns,
                    binding: p.binding,
                    rules: p.rules,
                    last_repair: p.repair,
                    ztunnel: Some(p.ztunnel),
                    synthetic_check: p.synthetic_check,
                }
            })
            .collect();
        self.view.set_ambient(part);
    }
}

/// An ambient pod's state in one word, and what needs attention.
fn pod_state(
    p: &super::dataplane::PodState,
    connected: bool,
    carried: Option<&str>,
) -> (&'static str, Option<String>) {
    let unequal = p.rules.as_ref().is_some_and(|r| !r.differences.is_empty());
    if p.netns.is_none() {
        return (
            "kept",
            Some("its namespace was not found: ztunnel keeps it as it had it".into()),
        );
    }
    if !connected {
        return ("disconnected", Some("no ztunnel is connected".into()));
    }
    if let Some(e) = &p.ztunnel.refused {
        return ("pending", Some(format!("ztunnel refused it: {e}")));
    }
    if !p.ztunnel.acked {
        return (
            "pending",
            Some("the ztunnel connection serving adds has not acked it".into()),
        );
    }
    if let Some(l) = p.ztunnel.listeners.as_ref().filter(|l| !l.seen) {
        let since = l.since.map(rfc3339).unwrap_or_default();
        return match &l.error {
            // A read that failed proves nothing either way: the ack stands.
            Some(e) => (
                "enabled",
                Some(format!("ztunnel's listeners could not be read: {e}")),
            ),
            None => (
                "pending",
                Some(format!(
                    "ztunnel acked it but its listeners {} are missing in its namespace \
                     (since {since}): sent again with backoff",
                    l.missing.join(", ")
                )),
            ),
        };
    }
    if unequal {
        return (
            "enabled",
            Some(
                "its rules differ from its plan and could not be programmed again (see the log)"
                    .into(),
            ),
        );
    }
    if carried != Some("enabled") {
        return ("enabled", Some("its annotation is not written yet".into()));
    }
    ("enabled", None)
}

/// What differs between two in-pod settings, in words.
fn settings_change(
    was: &redirect_core::AmbientConfig,
    now: &redirect_core::AmbientConfig,
) -> String {
    let mut out = Vec::new();
    if was.dns_capture != now.dns_capture {
        out.push(format!(
            "dns capture {} -> {}",
            was.dns_capture, now.dns_capture
        ));
    }
    if was.bypass_inbound != now.bypass_inbound {
        out.push(format!(
            "inbound bypass {} -> {}",
            was.bypass_inbound, now.bypass_inbound
        ));
    }
    if was.virtual_interfaces != now.virtual_interfaces {
        out.push(format!(
            "virtual interfaces {:?} -> {:?}",
            was.virtual_interfaces, now.virtual_interfaces
        ));
    }
    if out.is_empty() {
        out.push("node-wide settings".into());
    }
    out.join(", ")
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_annotation_says_what_the_current_connection_acked_and_stays_without_one() {
        assert_eq!(annotation_for(Stage::Enabled, None), "enabled");
        assert_eq!(annotation_for(Stage::Pending, Some("enabled")), "pending");
        assert_eq!(
            annotation_for(Stage::Disconnected, Some("enabled")),
            "enabled"
        );
        assert_eq!(
            annotation_for(Stage::Disconnected, Some("pending")),
            "pending"
        );
        assert_eq!(annotation_for(Stage::Disconnected, None), "pending");
    }
}
