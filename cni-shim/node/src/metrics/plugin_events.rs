//! The plugin's events (`cni_protocol::events`): a datagram socket in the run directory, read until
//! the agent stops, each event counted in the metrics and each forwarded log line printed. The socket is the agent's alone (mode
//! 0600: the plugin runs as root, as the runtime does), and goes when the agent stops.

use std::path::{Path, PathBuf};

use tokio::net::UnixDatagram;
use tokio::sync::watch as signal;

use crate::telemetry::Metrics;
use cni_protocol::events::{Event, LogLine, MAX_EVENT, SOCKET_NAME};

/// Binds the socket in `run_dir` (a stale one from an agent killed before is replaced). A
/// datagram socket takes datagrams as soon as it is bound: `run_dir::bind_socket` makes it
/// 0600 before it is in place.
pub(super) fn bind(run_dir: &Path) -> std::io::Result<(UnixDatagram, PathBuf)> {
    crate::run_dir::bind_socket(run_dir, SOCKET_NAME, |p| UnixDatagram::bind(p))
}

/// Counts every event until `stop`; then removes the socket.
pub(super) async fn receive(
    sock: UnixDatagram,
    path: PathBuf,
    metrics: Metrics,
    mut stop: signal::Receiver<bool>,
) {
    let mut buf = vec![0u8; MAX_EVENT];
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            got = sock.recv(&mut buf) => match got {
                Ok(n) => match Event::decode(&buf[..n]) {
                    Some(e) => {
                        tracing::debug!(
                            "plugin {} {}: code {} in {} µs",
                            e.command,
                            e.pod.as_deref().unwrap_or("(no pod)"),
                            e.code,
                            e.total_us
                        );
                        metrics.plugin_event(&e);
                    }
                    None => match LogLine::decode(&buf[..n]) {
                        Some(l) => print_plugin_line(&l),
                        None => tracing::debug!("{}: a datagram that is no plugin event ({n} bytes)", path.display()),
                    },
                },
                Err(e) => {
                    tracing::warn!("{}: {e}; plugin events are no longer counted", path.display());
                    break;
                }
            },
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// A line the plugin logged, in the agent's log at its level, scope `cni-plugin`, with the
/// call's command and pod (the line is escaped again by the agent's logging: a forged line
/// stays one line).
fn print_plugin_line(l: &LogLine) {
    let pod = l.pod.as_deref().unwrap_or("-");
    let (command, line) = (&l.command, &l.line);
    match l.level.as_str() {
        "debug" => {
            tracing::debug!(target: "cni_plugin::forwarded", "plugin {command} {pod}: {line}")
        }
        "info" => tracing::info!(target: "cni_plugin::forwarded", "plugin {command} {pod}: {line}"),
        "warn" => tracing::warn!(target: "cni_plugin::forwarded", "plugin {command} {pod}: {line}"),
        _ => tracing::error!(target: "cni_plugin::forwarded", "plugin {command} {pod}: {line}"),
    }
}
