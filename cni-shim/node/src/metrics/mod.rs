//! The metrics server: the agent's endpoints (`http`: `/metrics`, `/readyz` and `/healthz` on
//! the monitoring port, the node view on the agent's own socket) and the plugin's events
//! counted (`plugin_events`). What it serves is what the other parts recorded in
//! `crate::telemetry` and `crate::node_view`; it reaches into none of them. One entry,
//! [`serve`].

mod http;
mod plugin_events;

use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;

use tokio::sync::watch as signal;

use crate::node_view::NodeView;
use crate::telemetry::Metrics;

/// What the metrics server serves, and where.
pub struct Endpoints {
    /// The monitoring port's listener; `None` when `MONITORING_PORT` is 0.
    pub listener: Option<TcpListener>,
    /// `MONITORING_PORT`, for the log.
    pub port: u16,
    /// The run directory: the node view's socket and the plugin's events socket are there.
    pub run_dir: PathBuf,
    /// What the parts recorded (`/metrics`; the plugin's events are counted in it).
    pub metrics: Metrics,
    /// Whether the plugin is installed (`/readyz`).
    pub ready: signal::Receiver<bool>,
    /// The agent's view of every pod (`/debug/node`).
    pub view: NodeView,
}

/// Binds the endpoints' sockets and starts serving them (in the runtime this is called in);
/// the future returned ends once each has stopped at `stop`. A socket that cannot be had is
/// logged, and the rest served.
pub fn serve(e: Endpoints, stop: signal::Receiver<bool>) -> impl Future<Output = ()> {
    let mut tasks = tokio::task::JoinSet::new();
    let status = http::Status {
        metrics: e.metrics.clone(),
        ready: e.ready,
        view: e.view,
        view_socket: e.run_dir.join(http::DEBUG_SOCKET),
    };
    if let Some(l) = e.listener {
        match tokio::net::TcpListener::from_std(l) {
            Ok(l) => {
                tracing::info!("serving /metrics, /readyz and /healthz on port {}", e.port);
                tasks.spawn(http::serve(l, status.clone(), stop.clone()));
            }
            Err(err) => tracing::error!("monitoring port {}: {err}", e.port),
        }
    }
    // The node view names every pod: on a socket only the node's root may open, whatever
    // MONITORING_PORT says.
    match http::bind_view_socket(&e.run_dir) {
        Ok((l, path)) => {
            tracing::info!(
                "serving the node view (/debug/node) on {}, root's alone",
                path.display()
            );
            tasks.spawn(http::serve_view(l, path, status, stop.clone()));
        }
        Err(err) => tracing::error!(
            "{}: {err}; the node view (redirect-validate node) is not served",
            status.view_socket.display()
        ),
    }
    match plugin_events::bind(&e.run_dir) {
        Ok((sock, path)) => {
            tasks.spawn(plugin_events::receive(sock, path, e.metrics, stop));
        }
        Err(err) => tracing::warn!(
            "{}: {err}; the plugin's calls are not counted",
            e.run_dir.join(cni_protocol::events::SOCKET_NAME).display()
        ),
    }
    async move { while tasks.join_next().await.is_some() {} }
}
