//! The node agent beside the installer (`redirect-cni-node`): the wiring of its parts, each a
//! module of its own with one entry, over what they share (the informers, the settings, the
//! metrics recorded, the node view): the metrics server (`crate::metrics`), the repair
//! controller (`crate::repair`), ambient mode (`crate::ambient`), the sidecar pods' counters
//! (`crate::counters`) and the untaint of its own node (`crate::untaint`). They run on one
//! thread with a current-thread tokio runtime; the installer's loop tells them when the plugin
//! is installed ([`Agent::set_ready`], also written to the run directory for the plugin's
//! STATUS) and stops them before it uninstalls.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::watch as signal;

use crate::atomic_file::{write_atomic, FileAttrs};
use crate::error::{Error, Result};
use crate::node_view::NodeView;
use crate::settings::Settings;
use crate::telemetry::Metrics;
use cni_protocol::cni::conf::NetConf;
use cni_protocol::events::{Readiness, READY_NAME};
use zds::server::ZdsServer;

/// The running agent; [`Agent::stop`] (or dropping it) stops it.
pub struct Agent {
    stop: signal::Sender<bool>,
    ready: signal::Sender<bool>,
    metrics: Metrics,
    /// Where the plugin's STATUS reads the agent's readiness.
    ready_file: PathBuf,
    thread: Option<JoinHandle<()>>,
    /// The node's pods as the pod watch last saw them (`HAND_BACK_ON_UNINSTALL` only).
    known: Option<crate::informers::KnownPods>,
}

impl Agent {
    /// Starts what `settings` ask for. Fails at once on what cannot work: no node name for the
    /// controller, an unusable monitoring port, a plugin entry the plugin itself would refuse.
    pub fn start(settings: &Settings) -> Result<Agent> {
        settings.check_agent()?;
        let listener = bind(settings.monitoring_port)?;
        let plugin = Arc::new(crate::plugin_entry::plugin_conf(settings)?);
        let mut metrics = Metrics::new(
            settings
                .repair
                .enabled
                .then_some(settings.repair.action)
                .flatten()
                .map(|a| a.metric_type()),
            settings.repair.enabled || settings.repair.adopting(),
        );
        if settings.ambient.enabled {
            metrics = metrics.with_ambient();
        }
        if settings.capture_counters.on() {
            let counts =
                crate::telemetry::capture_counts::CaptureCounts::new(settings.capture_counters);
            metrics = metrics.with_counters(counts);
        }
        // Before anything is installed: an unsafe socket folder stops the agent here.
        let zds = zds_server(settings)?;
        // The installer checks it too, later; the status file and the socket need it now.
        crate::run_dir::ensure(&settings.cni_agent_run_dir)?;
        let ready_file = settings.cni_agent_run_dir.join(READY_NAME);
        take_status_path(&ready_file)?;
        write_readiness(
            &ready_file,
            &Readiness::NotReady("the node agent is starting".into()),
        );
        let (stop, stop_rx) = signal::channel(false);
        let (ready, ready_rx) = signal::channel(false);
        // One informer per kind, shared by every controller; started once a client is made.
        let informers = crate::informers::Informers::default();
        let known = Some(informers.pods.clone());
        let parts = Parts {
            informers,
            settings: settings.clone(),
            plugin,
            metrics: metrics.clone(),
            listener,
            zds,
            view: NodeView::new(settings.node()),
            stop: stop_rx,
            ready: ready_rx,
        };
        let thread = std::thread::Builder::new()
            .name("redirect-agent".into())
            .spawn(move || parts.run())
            .map_err(|e| Error::Watch(format!("cannot start the agent's thread: {e}")))?;
        Ok(Agent {
            stop,
            ready,
            metrics,
            ready_file,
            thread: Some(thread),
            known,
        })
    }

    /// The node's pods as the agent's pod watch last listed them, kept when
    /// `HAND_BACK_ON_UNINSTALL` asks (the hand-back's fallback once the API is gone).
    pub fn known_pods(&self) -> Option<crate::informers::KnownPods> {
        self.known.clone()
    }

    /// The installer's verdict: the plugin is installed (or not any more, and why). Written to
    /// the run directory when it changes, for the plugin's STATUS.
    pub fn set_ready(&self, verdict: &Readiness) {
        let ready = *verdict == Readiness::Ready;
        self.metrics.set_ready(ready);
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
        // Read as the plugin reads it (never blocking, never following a link): a file
        // someone replaced is written again.
        let dir = self.ready_file.parent().unwrap_or(Path::new("/"));
        if Readiness::read(dir).as_ref() != Some(verdict) {
            write_readiness(&self.ready_file, verdict);
        }
    }

    /// The metrics, for what the installer counts (`istio_cni_installs_total`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Stops the agent's tasks, waits for its thread, and removes its status file (as dropping
    /// it does).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if self.thread.is_none() {
            return;
        }
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The node as it was: with no agent, STATUS asks nf_tables alone (the plugin works
        // without the agent; during an upgrade the next agent writes its own verdict).
        match std::fs::remove_file(&self.ready_file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => tracing::warn!(
                "{}: {e}; the plugin's STATUS keeps reading the last verdict",
                self.ready_file.display()
            ),
            _ => {}
        }
    }
}

/// At start, the status file's path must be free for the agent's regular file: a link, a
/// FIFO or a socket someone left there is removed (and said), a directory is refused (the
/// plugin's STATUS reads a directory there as "not ready", so nothing starts uncaptured).
fn take_status_path(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("inspect", path, e)),
    };
    let kind = meta.file_type();
    if kind.is_file() {
        return Ok(());
    }
    if kind.is_dir() {
        return Err(Error::StatusPathTaken {
            path: path.to_path_buf(),
        });
    }
    tracing::warn!(
        "{}: not the regular file the agent writes ({kind:?}); removed",
        path.display()
    );
    std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))
}

/// Writes the readiness file atomically; a failure is logged and changes nothing else (STATUS
/// then reads the last verdict, or none).
pub fn write_readiness(path: &Path, verdict: &Readiness) {
    let text = verdict.text();
    if let Err(e) = write_atomic(path, text.as_bytes(), FileAttrs::mode(0o644)) {
        tracing::warn!(
            "{}: {}; the plugin's STATUS cannot see the agent's readiness",
            path.display(),
            redirect_program::errors::chain(&e)
        );
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The endpoints' listener on all addresses (IPv6 and IPv4 where the node has IPv6).
fn bind(port: u16) -> Result<Option<TcpListener>> {
    if port == 0 {
        return Ok(None);
    }
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| Error::InvalidSetting {
            setting: "MONITORING_PORT",
            value: port.to_string(),
            reason: format!(
                "cannot listen on it ({e}); free the port, choose another, or 0 for no endpoints"
            ),
        })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Watch(format!("monitoring port {port}: {e}")))?;
    Ok(Some(listener))
}

/// What the agent's thread owns.
struct Parts {
    settings: Settings,
    plugin: Arc<NetConf>,
    metrics: Metrics,
    listener: Option<TcpListener>,
    zds: Option<ZdsServer>,
    view: NodeView,
    stop: signal::Receiver<bool>,
    ready: signal::Receiver<bool>,
    informers: crate::informers::Informers,
}

impl Parts {
    fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("the agent cannot start its runtime: {e}; no repair, no metrics");
                return;
            }
        };
        runtime.block_on(self.serve());
        runtime.shutdown_background();
    }

    async fn serve(self) {
        let s = &self.settings;
        let mut tasks = tokio::task::JoinSet::new();
        let endpoints = crate::metrics::Endpoints {
            listener: self.listener,
            port: s.monitoring_port,
            run_dir: s.cni_agent_run_dir.clone(),
            metrics: self.metrics.clone(),
            ready: self.ready.clone(),
            view: self.view.clone(),
        };
        tasks.spawn(crate::metrics::serve(endpoints, self.stop.clone()));
        let zds = self.zds;
        let shared = Shared {
            plugin: self.plugin.clone(),
            metrics: self.metrics.clone(),
            view: self.view.clone(),
            informers: self.informers.clone(),
        };
        with_client(
            s,
            zds,
            shared,
            self.ready.clone(),
            self.stop.clone(),
            &mut tasks,
        )
        .await;
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
        // Every task watches `stop`; give them a moment, then drop what is left.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    }
}

/// What the controllers share: the plugin's entry, the metrics, the node view, the informers.
struct Shared {
    plugin: Arc<NetConf>,
    metrics: Metrics,
    view: NodeView,
    informers: crate::informers::Informers,
}

/// The parts that talk to the API server: the repair controller, ambient mode, the untaint.
async fn with_client(
    s: &Settings,
    zds: Option<ZdsServer>,
    shared: Shared,
    ready: signal::Receiver<bool>,
    stop: signal::Receiver<bool>,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    let sidecar_pods = sidecar_pods(s);
    if !(sidecar_pods || s.untaint.is_some() || zds.is_some()) {
        return;
    }
    let client = match crate::kube_client::client(s, Some(&shared.informers.starts)).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}; no repair controller, no ambient mode and no untaint");
            return;
        }
    };
    let Shared {
        plugin,
        metrics,
        view,
        informers,
    } = shared;
    if sidecar_pods || zds.is_some() {
        start_informers(
            s,
            &client,
            (&informers, zds.is_some(), &metrics),
            tasks,
            &stop,
        )
        .await;
    }
    sidecar_counters(s, (&plugin, &metrics, &informers.pods), tasks, &stop);
    if sidecar_pods {
        let shared = (plugin, metrics.clone(), view.clone());
        tasks.spawn(crate::repair::run(
            client.clone(),
            informers.pods.clone(),
            &s.repair,
            shared,
            stop.clone(),
        ));
    }
    if let Some(zds) = zds {
        tasks.spawn(crate::ambient::run(
            client.clone(),
            informers,
            zds,
            (&s.ambient, &ambient_node(s)),
            (metrics, view),
            stop.clone(),
        ));
    }
    if let Some(key) = &s.untaint {
        tasks.spawn(crate::untaint::run(
            client,
            s.node().to_owned(),
            key.clone(),
            ready,
            stop,
        ));
    }
}

/// Whether the node's pods are watched: for repair, adoption, the hand-back's fallback and the
/// sidecar counters (ambient mode watches them too). Says why a part that needs the node's name
/// is not run.
fn sidecar_pods(s: &Settings) -> bool {
    if !s.repair.enabled {
        tracing::info!("the repair controller is disabled (REPAIR_ENABLED=false)");
    }
    let adopting = s.repair.adopting();
    if !adopting && s.repair.adopt_istio != crate::adopt::AdoptIstio::Off {
        // Only the repair controller (on by default) makes a node name required.
        tracing::warn!(
            "ADOPT_ISTIO={} needs this node's name (NODE_NAME or REPAIR_NODE_NAME): pods holding \
             Istio's rules are not looked for",
            s.repair.adopt_istio.word()
        );
    }
    // The node's pods are watched for repair, adoption, the hand-back's fallback, the sidecar
    // counters and ambient mode; all of them need the node's name.
    let named = !s.repair.node_name.is_empty();
    let keeping = named && (s.hand_back_on_uninstall.is_some() || s.capture_counters.on());
    s.repair.enabled || adopting || keeping
}

/// What ambient mode takes from the node's settings besides its own.
fn ambient_node(s: &Settings) -> crate::ambient::NodeSettings {
    crate::ambient::NodeSettings {
        name: s.node().to_owned(),
        excluded_namespaces: s.exclude_namespaces.clone(),
        places: s.repair.places.clone(),
        adopt_istio: s.repair.adopt_istio,
        adopted_forms: s.repair.adopted_forms.clone(),
        counters_every: s.capture_counters_interval,
        run_dir: s.cni_agent_run_dir.clone(),
    }
}

/// The node's informers, from the server's version (streaming lists from 1.32): pods, and
/// with `namespaces` (ambient mode) the namespaces.
async fn start_informers(
    s: &Settings,
    client: &kube::Client,
    (informers, namespaces, metrics): (&crate::informers::Informers, bool, &Metrics),
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &signal::Receiver<bool>,
) {
    let version = crate::informers::server_version(client).await;
    let cfg = crate::informers::config(version);
    tracing::info!(
        "watching this node's pods{} ({})",
        if namespaces {
            " and the namespaces (metadata)"
        } else {
            ""
        },
        match version {
            Some((1, m)) if m >= 32 => "streaming lists",
            _ => "lists from the watch cache, then watches",
        }
    );
    let backoff = crate::informers::health::WATCH_BACKOFF;
    let watching = (cfg, backoff, Some(metrics.watch_gauges()));
    crate::informers::start(
        client,
        s.node(),
        (informers, namespaces),
        watching,
        tasks,
        stop,
    );
}

/// `CAPTURE_COUNTERS`: the sidecar pods' counters read every `CAPTURE_COUNTERS_INTERVAL` from
/// the pods the pod informer lists (`known`).
fn sidecar_counters(
    s: &Settings,
    (plugin, metrics, known): (&NetConf, &Metrics, &crate::informers::KnownPods),
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &signal::Receiver<bool>,
) {
    let Some(counts) = metrics.capture_counts() else {
        return;
    };
    if s.repair.node_name.is_empty() {
        tracing::warn!(
            "CAPTURE_COUNTERS: the sidecar pods' counters need this node's name (NODE_NAME) to \
             list its pods: only ambient pods are counted"
        );
        return;
    }
    tasks.spawn(crate::counters::run(
        plugin.mesh.clone(),
        known.clone(),
        counts.clone(),
        s.repair.places.clone(),
        s.capture_counters_interval,
        stop.clone(),
    ));
}

/// The ZDS server, bound but not yet answering (`ambient::controller` lets ztunnel in once
/// it knows every enrolled pod); `None` without ambient mode.
fn zds_server(settings: &Settings) -> Result<Option<ZdsServer>> {
    if !settings.ambient.enabled {
        return Ok(None);
    }
    let path = &settings.ambient.ztunnel_socket;
    let invalid = |reason: String| Error::InvalidSetting {
        setting: "ZTUNNEL_UDS_ADDRESS",
        value: path.display().to_string(),
        reason,
    };
    ZdsServer::bind_paused(path, zds::server::DEADLINE)
        .map(Some)
        .map_err(|e| invalid(format!("cannot listen there: {e}")))
}
