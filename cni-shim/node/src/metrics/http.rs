//! The agent's HTTP endpoints, for Prometheus and the DaemonSet's probes, on the monitoring port
//! (all of the node's addresses: every pod of the node can reach it):
//! - `/metrics`: every metric (OpenMetrics text; no label names a pod);
//! - `/readyz`: 200 once the plugin is installed on this node (binary, kubeconfig, CNI
//!   config), 503 with the reason before, or while the config is being put back;
//! - `/healthz`: 200 while the agent's threads run.
//!
//! And `/debug/node`, the agent's view of every pod on the node as JSON (`node_view`: names,
//! namespaces, addresses, namespace paths), on the agent's own socket alone
//! (`<CNI_AGENT_RUN_DIR>/debug.sock`, mode 0600: the node's root only); the port answers 404
//! there, saying where it went.

use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch as signal;

use crate::node_view::NodeView;
use crate::telemetry::{self, Metrics};

/// The node view's socket in the run directory.
pub(super) const DEBUG_SOCKET: &str = "debug.sock";

/// What the endpoints report.
#[derive(Clone)]
pub(super) struct Status {
    pub metrics: Metrics,
    pub ready: signal::Receiver<bool>,
    pub view: NodeView,
    /// Where the node view is served (the monitoring port's 404 names it).
    pub view_socket: PathBuf,
}

/// Which door a request came in by.
#[derive(Clone, Copy, PartialEq)]
enum Door {
    /// The monitoring port: metrics and probes.
    Port,
    /// The agent's socket: the node view.
    Socket,
}

/// A listener whose connections hyper can serve.
trait Listener: Send + Sync + 'static {
    type Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl Future<Output = std::io::Result<Self::Conn>> + Send;
}

impl Listener for TcpListener {
    type Conn = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<Self::Conn> {
        self.accept().await.map(|(c, _)| c)
    }
}

impl Listener for UnixListener {
    type Conn = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Conn> {
        self.accept().await.map(|(c, _)| c)
    }
}

/// Serves the monitoring port until `stop` turns true.
pub(super) async fn serve(listener: TcpListener, status: Status, stop: signal::Receiver<bool>) {
    serve_on(&listener, Door::Port, status, stop).await
}

/// Serves the node view on `listener`, bound at `path` (by [`bind_view_socket`]), until `stop`
/// turns true; then removes the socket, if it is still this one.
pub(super) async fn serve_view(
    listener: UnixListener,
    path: PathBuf,
    status: Status,
    stop: signal::Receiver<bool>,
) {
    let bound = std::fs::symlink_metadata(&path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    serve_on(&listener, Door::Socket, status, stop).await;
    let now = std::fs::symlink_metadata(&path)
        .ok()
        .map(|m| (m.dev(), m.ino()));
    if bound.is_some() && now == bound {
        let _ = std::fs::remove_file(&path);
    }
}

/// Binds the node view's socket in `run_dir` (root's alone, mode 0600), in place of whatever a
/// previous agent left there (see `run_dir::bind_socket`).
pub(super) fn bind_view_socket(run_dir: &Path) -> std::io::Result<(UnixListener, PathBuf)> {
    let (l, path) = crate::run_dir::bind_socket(run_dir, DEBUG_SOCKET, |p| {
        std::os::unix::net::UnixListener::bind(p)
    })?;
    l.set_nonblocking(true)?;
    Ok((UnixListener::from_std(l)?, path))
}

async fn serve_on<L: Listener>(
    listener: &L,
    door: Door,
    status: Status,
    mut stop: signal::Receiver<bool>,
) {
    let status = Arc::new(status);
    loop {
        let conn = tokio::select! {
            _ = stop.changed() => return,
            conn = listener.next() => conn,
        };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                match door {
                    Door::Port => tracing::warn!("monitoring port: accept failed: {e}"),
                    Door::Socket => {
                        tracing::warn!("{}: accept failed: {e}", status.view_socket.display())
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let status = status.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let status = status.clone();
                async move { Ok::<_, Infallible>(answer(&req, &status, door)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(conn), service)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, status: &Status, door: Door) -> Response<Full<Bytes>> {
    let reply = |code: StatusCode, kind: &str, body: String| {
        Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, kind)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into());
    }
    if door == Door::Socket {
        return match req.uri().path() {
            "/debug/node" => reply(StatusCode::OK, "application/json", status.view.to_json()),
            _ => reply(
                StatusCode::NOT_FOUND,
                TEXT,
                "not found: /debug/node is served here; /metrics, /readyz and /healthz on the \
                 monitoring port\n"
                    .into(),
            ),
        };
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            telemetry::CONTENT_TYPE,
            status.metrics.encode(),
        ),
        "/readyz" if *status.ready.borrow() => reply(StatusCode::OK, TEXT, "ready\n".into()),
        "/readyz" => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            TEXT,
            "not ready: the plugin is not installed on this node yet (see the agent's log)\n"
                .into(),
        ),
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/debug/node" => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            format!(
                "not found: the node view names every pod of the node and is no longer served \
                 on this port, which every pod can reach; it is on the agent's socket {}, the \
                 node's root's alone: run `redirect-validate node` as root on the node, or \
                 `kubectl -n istio-system exec ds/istio-cni-node -- redirect-validate node`\n",
                status.view_socket.display()
            ),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /readyz and /healthz are served\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get<S: Read + Write>(mut s: S, path: &str) -> (u16, String) {
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let code = text[9..12].parse().unwrap();
        (code, text.split_once("\r\n\r\n").unwrap().1.to_owned())
    }

    /// The port answers the node view with a 404 naming the socket; the socket serves it, root's
    /// alone, and goes at stop.
    #[test]
    fn the_node_view_is_on_the_socket_alone() {
        let run = std::env::temp_dir().join(format!("rdc-http-{}", std::process::id()));
        std::fs::create_dir_all(&run).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (_ready_tx, ready) = signal::channel(true);
        let (stop_tx, stop) = signal::channel(false);
        let status = Status {
            metrics: Metrics::new(None, false),
            ready,
            view: NodeView::new("worker-3"),
            view_socket: run.join(DEBUG_SOCKET),
        };
        let (port, path) = rt.block_on(async {
            let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = tcp.local_addr().unwrap().port();
            let (unix, path) = bind_view_socket(&run).unwrap();
            tokio::spawn(serve(tcp, status.clone(), stop.clone()));
            tokio::spawn(serve_view(unix, path.clone(), status, stop));
            (port, path)
        });
        let (done, asked) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                let _ = asked.await;
                let _ = stop_tx.send(true);
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            })
        });
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);

        let tcp = || std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (code, body) = get(tcp(), "/debug/node");
        assert_eq!(code, 404, "{body}");
        assert!(
            body.contains(path.to_str().unwrap()) && body.contains("redirect-validate node"),
            "{body}"
        );
        assert_eq!(get(tcp(), "/healthz").0, 200);
        let unix = || std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (code, body) = get(unix(), "/debug/node");
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("\"worker-3\""), "{body}");
        assert_eq!(get(unix(), "/metrics").0, 404);
        done.send(()).unwrap();
        thread.join().unwrap();
        assert!(std::fs::symlink_metadata(&path).is_err(), "left at stop");
        let _ = std::fs::remove_dir_all(&run);
    }
}
