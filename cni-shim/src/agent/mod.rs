//! The node agent's long-running parts beside the installer (`redirect-cni install`): the repair
//! controller, the untaint of its own node, and the HTTP endpoints (metrics, probes). They run
//! on one thread with a current-thread tokio runtime; the installer's loop tells them when the
//! plugin is installed ([`Agent::set_ready`]) and stops them before it uninstalls.

pub mod http;
pub mod untaint;

use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::watch as signal;

use crate::cni::conf::NetConf;
use crate::node::error::{Error, Result};
use crate::node::metrics::Metrics;
use crate::node::plugin_entry::standalone_conf;
use crate::node::server_url;
use crate::node::settings::Settings;
use crate::repair::controller::Controller;
use crate::repair::queue::Backoff;

/// The running agent; [`Agent::stop`] (or dropping it) stops it.
pub struct Agent {
    stop: signal::Sender<bool>,
    ready: signal::Sender<bool>,
    metrics: Metrics,
    thread: Option<JoinHandle<()>>,
}

impl Agent {
    /// Starts what `settings` ask for. Fails at once on what cannot work: no node name for the
    /// controller, an unusable monitoring port, a plugin entry the plugin itself would refuse.
    pub fn start(settings: &Settings) -> Result<Agent> {
        settings.check_agent()?;
        let listener = bind(settings.monitoring_port)?;
        let plugin = Arc::new(plugin_conf(settings)?);
        let metrics = Metrics::new(
            settings
                .repair
                .enabled
                .then_some(settings.repair.action)
                .flatten(),
        );
        let (stop, stop_rx) = signal::channel(false);
        let (ready, ready_rx) = signal::channel(false);
        let parts = Parts {
            settings: settings.clone(),
            plugin,
            metrics: metrics.clone(),
            listener,
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
            thread: Some(thread),
        })
    }

    /// The installer's verdict: the plugin is installed (or not any more).
    pub fn set_ready(&self, ready: bool) {
        self.metrics.set_ready(ready);
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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

/// The plugin's own config entry, parsed as the plugin parses it.
fn plugin_conf(settings: &Settings) -> Result<NetConf> {
    let text = standalone_conf(settings).to_string();
    crate::cni::conf::parse(text.as_bytes()).map_err(|e| Error::InvalidSetting {
        setting: "PLUGIN_CONFIG_JSON",
        value: settings
            .plugin_config
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        reason: format!("the plugin would refuse its config entry: {}", e.msg),
    })
}

/// What the agent's thread owns.
struct Parts {
    settings: Settings,
    plugin: Arc<NetConf>,
    metrics: Metrics,
    listener: Option<TcpListener>,
    stop: signal::Receiver<bool>,
    ready: signal::Receiver<bool>,
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
        if let Some(l) = self.listener {
            match tokio::net::TcpListener::from_std(l) {
                Ok(l) => {
                    tracing::info!(
                        "serving /metrics, /readyz and /healthz on port {}",
                        s.monitoring_port
                    );
                    let status = http::Status {
                        metrics: self.metrics.clone(),
                        ready: self.ready.clone(),
                    };
                    tasks.spawn(http::serve(l, status, self.stop.clone()));
                }
                Err(e) => tracing::error!("monitoring port {}: {e}", s.monitoring_port),
            }
        }
        let wants_client = s.repair.enabled || s.untaint.is_some();
        if !s.repair.enabled {
            tracing::info!("the repair controller is disabled (REPAIR_ENABLED=false)");
        }
        if wants_client {
            match client(s).await {
                Ok(client) => {
                    if s.repair.enabled {
                        let controller = Controller {
                            client: client.clone(),
                            settings: s.repair.clone(),
                            plugin: self.plugin.clone(),
                            metrics: self.metrics.clone(),
                            backoff: Backoff::default(),
                        };
                        tasks.spawn(controller.run(self.stop.clone()));
                    }
                    if let Some(key) = &s.untaint {
                        tasks.spawn(untaint::run(
                            client,
                            s.node().to_owned(),
                            key.clone(),
                            self.ready.clone(),
                            self.stop.clone(),
                        ));
                    }
                }
                Err(e) => tracing::error!("{e}; no repair controller and no untaint"),
            }
        }
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
        // Every task watches `stop`; give them a moment, then drop what is left.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
    }
}

/// The agent's API client, from the same service account and server as the kubeconfig.
async fn client(s: &Settings) -> std::result::Result<kube::Client, String> {
    let host = s.kubernetes_service_host.as_deref().ok_or_else(|| {
        "KUBERNETES_SERVICE_HOST is not set: the agent cannot reach the API server".to_string()
    })?;
    let server = server_url(
        &s.kubernetes_service_protocol,
        host,
        &s.kubernetes_service_port,
    );
    crate::kube::agent_client(&server, s.ca_path().as_deref(), &s.token_path()).await
}
