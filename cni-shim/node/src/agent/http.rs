//! The agent's HTTP endpoints, for Prometheus and the DaemonSet's probes:
//! - `/metrics`: every metric (OpenMetrics text);
//! - `/readyz`: 200 once the plugin is installed on this node (binary, kubeconfig, CNI
//!   config), 503 with the reason before, or while the config is being put back;
//! - `/healthz`: 200 while the agent's threads run;
//! - `/debug/node`: the agent's view of every pod on the node, as JSON (`node_view`).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch as signal;

use crate::metrics::{self, Metrics};
use crate::node_view::NodeView;

/// What the endpoints report.
#[derive(Clone)]
pub struct Status {
    pub metrics: Metrics,
    pub ready: signal::Receiver<bool>,
    pub view: NodeView,
}

/// Serves `listener` until `stop` turns true.
pub async fn serve(listener: TcpListener, status: Status, mut stop: signal::Receiver<bool>) {
    let status = Arc::new(status);
    loop {
        let conn = tokio::select! {
            _ = stop.changed() => return,
            conn = listener.accept() => conn,
        };
        let (tcp, _) = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("monitoring port: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let status = status.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let status = status.clone();
                async move { Ok::<_, Infallible>(answer(&req, &status)) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

fn answer(req: &Request<Incoming>, status: &Status) -> Response<Full<Bytes>> {
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
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
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
        "/debug/node" => reply(StatusCode::OK, "application/json", status.view.to_json()),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: /metrics, /readyz, /healthz and /debug/node are served\n".into(),
        ),
    }
}
