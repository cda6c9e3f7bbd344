//! The watches the API server accepted. kube's watcher says nothing when a watch request is
//! answered, only when an object comes, so a watch of a quiet kind (the namespaces, the pods of
//! an idle node) that came back after an outage looked down until something changed: no
//! "watching again" line, `redirect_cni_repair_watch_up` 0, and the next failure's backoff
//! went on doubling from the last outage. A layer on the agent's API client notes each 2xx
//! answer to a watch request by the path it watched (`/api/v1/pods`), and the informer of that
//! path learns of it (`WatchStarts::subscribe`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::sync::watch;
use tower::{Layer, Service};

/// The accepted watch requests, counted by path.
#[derive(Clone, Default)]
pub struct WatchStarts {
    paths: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
}

impl WatchStarts {
    /// A receiver that changes at each watch of `path` the server accepts.
    pub fn subscribe(&self, path: &str) -> watch::Receiver<u64> {
        let mut paths = self.paths.lock().unwrap_or_else(|p| p.into_inner());
        paths
            .entry(path.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn accepted(&self, path: &str) {
        let paths = self.paths.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = paths.get(path) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// The layer that notes them, for kube's `ClientBuilder::with_layer`.
    pub fn layer(&self) -> NoteWatchStarts {
        NoteWatchStarts(self.clone())
    }
}

/// The tower layer of [`WatchStarts`].
pub struct NoteWatchStarts(WatchStarts);

impl<S> Layer<S> for NoteWatchStarts {
    type Service = Noting<S>;

    fn layer(&self, inner: S) -> Noting<S> {
        Noting {
            inner,
            starts: self.0.clone(),
        }
    }
}

/// The client's service, noting the accepted watches.
#[derive(Clone)]
pub struct Noting<S> {
    inner: S,
    starts: WatchStarts,
}

/// Whether `query` asks for a watch (`watch=true`, or `1` as some clients write it).
fn is_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Noting<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let watched = is_watch(req.uri().query()).then(|| req.uri().path().to_owned());
        let answer = self.inner.call(req);
        let starts = self.starts.clone();
        Box::pin(async move {
            let res = answer.await?;
            if let Some(path) = watched {
                if res.status().is_success() {
                    starts.accepted(&path);
                }
            }
            Ok(res)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    /// A server that answers `status` to everything.
    fn server(
        status: u16,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send> + Clone
    {
        tower::service_fn(move |_req: Request<()>| async move {
            Ok::<_, Infallible>(Response::builder().status(status).body(()).unwrap())
        })
    }

    async fn ask(starts: &WatchStarts, status: u16, uri: &str) {
        let svc = starts.layer().layer(server(status));
        let req = Request::builder().uri(uri).body(()).unwrap();
        svc.oneshot(req).await.unwrap();
    }

    #[tokio::test]
    async fn an_accepted_watch_is_noted_by_its_path_and_nothing_else_is() {
        let starts = WatchStarts::default();
        let mut pods = starts.subscribe("/api/v1/pods");
        let mut namespaces = starts.subscribe("/api/v1/namespaces");
        // A list, a refused watch, a watch of another path: none is a pod watch accepted.
        ask(
            &starts,
            200,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&resourceVersion=0",
        )
        .await;
        ask(&starts, 403, "/api/v1/pods?watch=true&resourceVersion=7").await;
        ask(
            &starts,
            200,
            "/api/v1/namespaces?watch=true&resourceVersion=7",
        )
        .await;
        assert!(!pods.has_changed().unwrap());
        assert!(namespaces.has_changed().unwrap());
        namespaces.mark_unchanged();
        ask(
            &starts,
            200,
            "/api/v1/pods?&watch=true&timeoutSeconds=290&resourceVersion=7",
        )
        .await;
        assert!(pods.has_changed().unwrap());
        assert_eq!(*pods.borrow_and_update(), 1);
        assert!(!namespaces.has_changed().unwrap());
        // `watch=1`, as other clients write it; `watchful=true` is no watch.
        ask(&starts, 200, "/api/v1/pods?watch=1").await;
        ask(&starts, 200, "/api/v1/pods?watchful=true").await;
        assert_eq!(*pods.borrow_and_update(), 2);
    }
}
