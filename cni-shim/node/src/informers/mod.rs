//! One informer per kind on this node, shared by every controller (issue 48): the node's pods
//! (one watch, `spec.nodeName=<node>`) and, in ambient mode, the namespaces as metadata only
//! (their labels are all the agent reads). A controller subscribes and gets what kube's watcher
//! would have given it (`Init`, each object, `InitDone`, then every change), from the one watch;
//! none opens its own (a test walks the sources for that).
//!
//! How the watch spares the API server:
//! - lists are served from the watch cache (`resourceVersion=0`), not read from etcd;
//! - bookmarks keep a watch's resource version fresh, so a reconnect resumes instead of
//!   listing again;
//! - a server that offers streaming lists (Kubernetes 1.32 and later) gets one watch with the
//!   initial objects in it; an older one (down to 1.20) a list and a watch;
//! - a failed list or watch is tried again after a jittered, doubling delay (`health`), so that
//!   N agents that lost the API server together do not come back together.

pub mod health;
pub mod started;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::Api;
use kube::runtime::watcher::{self, Event, InitialListStrategy};
use kube::{Client, Resource};
use tokio::sync::mpsc;
use tokio::sync::watch as signal;

use health::{Gauges, WatchHealth};

/// A kind's objects as the one watch last gave them, and its subscribers.
pub struct Informer<K> {
    shared: Arc<Mutex<Shared<K>>>,
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            shared: self.shared.clone(),
        }
    }
}

impl<K> Default for Informer<K> {
    fn default() -> Self {
        Informer {
            shared: Arc::new(Mutex::new(Shared {
                store: BTreeMap::new(),
                listing: None,
                listed: false,
                subscribers: Vec::new(),
            })),
        }
    }
}

struct Shared<K> {
    /// By `namespace/name`: the objects of the last complete listing, with the changes since.
    store: BTreeMap<String, K>,
    /// A listing under way: the objects it gave so far.
    listing: Option<BTreeMap<String, K>>,
    /// A listing completed once.
    listed: bool,
    subscribers: Vec<mpsc::UnboundedSender<Event<K>>>,
}

fn key<K: Resource>(o: &K) -> String {
    let meta = o.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

impl<K: Resource + Clone + Send + 'static> Informer<K> {
    /// A subscription: what the watch holds now, as a listing (`Init`, each object, and
    /// `InitDone` once a listing completed; a listing under way goes on live), then every event.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Event<K>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let replay: Vec<Event<K>> = match (&sh.listing, sh.listed) {
            (Some(partial), _) => std::iter::once(Event::Init)
                .chain(partial.values().cloned().map(Event::InitApply))
                .collect(),
            (None, true) => std::iter::once(Event::Init)
                .chain(sh.store.values().cloned().map(Event::InitApply))
                .chain(std::iter::once(Event::InitDone))
                .collect(),
            (None, false) => Vec::new(),
        };
        for e in replay {
            let _ = tx.send(e);
        }
        sh.subscribers.push(tx);
        rx
    }

    /// The objects as last listed, with the changes since.
    pub fn snapshot(&self) -> Vec<K> {
        let sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        sh.store.values().cloned().collect()
    }

    /// How many subscriptions are open.
    pub fn subscribers(&self) -> usize {
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        sh.subscribers.retain(|s| !s.is_closed());
        sh.subscribers.len()
    }

    /// One event of the watch: the store follows it, every subscriber gets it.
    pub fn publish(&self, e: Event<K>) {
        let mut sh = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        match &e {
            Event::Init => sh.listing = Some(BTreeMap::new()),
            Event::InitApply(o) => {
                let k = key(o);
                sh.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(k, o.clone());
            }
            Event::InitDone => {
                let listed = sh.listing.take().unwrap_or_default();
                sh.store = listed;
                sh.listed = true;
            }
            Event::Apply(o) => {
                sh.store.insert(key(o), o.clone());
            }
            Event::Delete(o) => {
                sh.store.remove(&key(o));
            }
        }
        sh.subscribers.retain(|s| s.send(e.clone()).is_ok());
    }
}

/// The pods of this node as the pod informer last listed them: what the hand-back at an
/// uninstall falls back on when the API server no longer answers it (its RBAC goes with the
/// same `helm uninstall`), and the pods whose counters are read.
pub type KnownPods = Informer<Pod>;

/// The node's informers.
#[derive(Clone, Default)]
pub struct Informers {
    /// The pods of this node (`spec.nodeName`).
    pub pods: Informer<Pod>,
    /// The namespaces, metadata only (spec and status empty); watched in ambient mode alone.
    pub namespaces: Informer<Namespace>,
    /// The watch requests the API server accepted, as the agent's client notes them
    /// (`kube_client::client`): a quiet watch's only sign that it is back.
    pub starts: started::WatchStarts,
}

/// What the watches ask of the server, from its version.
pub fn config(server: Option<(u32, u32)>) -> watcher::Config {
    let mut c = watcher::Config::default().any_semantic();
    // kube drops `resourceVersion=0` from a list that has a limit (a paged list cannot come
    // from the cache), so its default page of 500 made every list a quorum read from etcd,
    // which for the node's pods pages through every pod of the cluster. Unpaged, the watch
    // cache answers: this node's pods, and the namespaces' metadata.
    c.page_size = None;
    match server {
        Some((1, minor)) if minor >= 32 => c.streaming_lists(),
        _ => c,
    }
}

/// The server's version (`major`, `minor`), `None` when it cannot be read (the watches then
/// list and watch, which every version serves).
pub async fn server_version(client: &Client) -> Option<(u32, u32)> {
    let v = client.apiserver_version().await.ok()?;
    let digits = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
    Some((digits(&v.major)?, digits(&v.minor)?))
}

/// Starts the pods' watch of `node`, and with `namespaces` the namespaces' (metadata only),
/// feeding `informers` until `stop`; a failed watch is tried again after `backoff`'s delays
/// (`health::WATCH_BACKOFF` in the agent), jittered.
pub fn start(
    client: &Client,
    node: &str,
    (informers, namespaces): (&Informers, bool),
    (cfg, backoff, gauges): (watcher::Config, crate::pods::queue::Backoff, Option<Gauges>),
    tasks: &mut tokio::task::JoinSet<()>,
    stop: &signal::Receiver<bool>,
) {
    let fields = format!("spec.nodeName={node}");
    let api = Api::<Pod>::all(client.clone());
    let pods = move |c: watcher::Config| watcher::watcher(api.clone(), c.fields(&fields)).boxed();
    let health = WatchHealth::new("this node's pods", backoff, gauges);
    let watch = Watch {
        make: pods,
        cfg: cfg.clone(),
        accepted: informers.starts.subscribe("/api/v1/pods"),
    };
    tasks.spawn(feed(informers.pods.clone(), watch, health, stop.clone()));
    if namespaces {
        let api = Api::<Namespace>::all(client.clone());
        let meta = move |c: watcher::Config| {
            watcher::metadata_watcher(api.clone(), c)
                .map(|e| {
                    e.map(|e| match e {
                        Event::Apply(m) => Event::Apply(namespace(m)),
                        Event::Delete(m) => Event::Delete(namespace(m)),
                        Event::InitApply(m) => Event::InitApply(namespace(m)),
                        Event::Init => Event::Init,
                        Event::InitDone => Event::InitDone,
                    })
                })
                .boxed()
        };
        let health = WatchHealth::new("the namespaces", backoff, None);
        let watch = Watch {
            make: meta,
            cfg,
            accepted: informers.starts.subscribe("/api/v1/namespaces"),
        };
        tasks.spawn(feed(
            informers.namespaces.clone(),
            watch,
            health,
            stop.clone(),
        ));
    }
}

/// A kind's watch as it can be made again: with a list and a watch, when the server refuses
/// the streaming list it was asked for.
struct Watch<F> {
    make: F,
    cfg: watcher::Config,
    /// Changes when the server accepts a watch of this kind.
    accepted: signal::Receiver<u64>,
}

/// Whether `e` is the server refusing a streaming list: an old server (before 1.27) or one
/// with the WatchList feature off answers the watch's `sendInitialEvents` and
/// `resourceVersionMatch` with 400 or 422 (Invalid), at every try (1.20: 422 "resourceVersionMatch
/// is forbidden for watch", as the watch stream's first answer); a list and a watch work.
pub fn refuses_streaming(e: &watcher::Error) -> bool {
    let invalid = |code: u16| code == 400 || code == 422;
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(r))
        | watcher::Error::WatchFailed(kube::Error::Api(r)) => invalid(r.code),
        watcher::Error::WatchError(r) => invalid(r.code),
        _ => false,
    }
}

/// A kind's events, as its watcher gives them.
type Events<K> = BoxStream<'static, Result<Event<K>, watcher::Error>>;

/// A namespace from its metadata alone.
fn namespace(m: kube::core::PartialObjectMeta<Namespace>) -> Namespace {
    Namespace {
        metadata: m.metadata,
        ..Namespace::default()
    }
}

/// What woke the watch's loop.
enum Woke<K> {
    Stop,
    /// The server accepted a watch of this kind.
    Accepted,
    /// The watch accepted last stayed up `health::STAYED_UP`.
    StayedUp,
    Event(Option<Result<Event<K>, watcher::Error>>),
}

/// Ready when `timer` is set and ends; never when it is not.
async fn stayed(timer: &mut Option<std::pin::Pin<Box<tokio::time::Sleep>>>) {
    match timer {
        Some(t) => t.await,
        None => std::future::pending().await,
    }
}

/// The watch's loop: each event published; a failure waits its jittered delay (the watcher
/// lists or watches again on the next poll). A watch the server accepted that stays up
/// `health::STAYED_UP` ends an outage, as an event would: a quiet kind sends none.
async fn feed<K, F>(
    informer: Informer<K>,
    mut watch: Watch<F>,
    mut health: WatchHealth,
    mut stop: signal::Receiver<bool>,
) where
    K: Resource + Clone + Send + 'static,
    F: Fn(watcher::Config) -> Events<K>,
{
    let mut events = (watch.make)(watch.cfg.clone());
    let mut up = None;
    loop {
        let woke = tokio::select! {
            _ = stop.changed() => Woke::Stop,
            Ok(()) = watch.accepted.changed() => Woke::Accepted,
            () = stayed(&mut up) => Woke::StayedUp,
            e = events.next() => Woke::Event(e),
        };
        let next = match woke {
            Woke::Stop => return,
            Woke::Accepted => {
                up = Some(Box::pin(tokio::time::sleep(health::STAYED_UP)));
                continue;
            }
            Woke::StayedUp => {
                up = None;
                health.answered();
                continue;
            }
            Woke::Event(next) => next,
        };
        match next {
            None => return,
            Some(Ok(e)) => {
                match &e {
                    Event::Init => {}
                    Event::InitDone => health.listed(),
                    _ => health.answered(),
                }
                informer.publish(e);
            }
            Some(Err(e))
                if watch.cfg.initial_list_strategy == InitialListStrategy::StreamingList
                    && refuses_streaming(&e) =>
            {
                tracing::warn!(
                    "the API server refused a streaming list ({e}): listing and watching instead"
                );
                watch.cfg.initial_list_strategy = InitialListStrategy::ListWatch;
                events = (watch.make)(watch.cfg.clone());
            }
            Some(Err(e)) => {
                up = None;
                let delay = health.failed(&e);
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                if unreadable(&e) {
                    events = (watch.make)(watch.cfg.clone());
                }
            }
        }
    }
}

/// Whether `e` is a line of the watch's answer that holds no watch event. kube reads a watch's
/// answer line by line whatever its HTTP status, and stays on it after an error: the 403 that
/// a restarted API server (1.20) answers to a metadata watch before its RBAC cache is filled is
/// a pretty-printed Status of about 10 lines, each one another error and another backoff
/// delay (the namespaces' watch came back only minutes later). A proxy's error page reads the
/// same; and an event that could not be read is one the store missed. So the rest of that
/// answer is dropped, and a new watcher lists again, from the watch cache.
pub fn unreadable(e: &watcher::Error) -> bool {
    matches!(
        e,
        watcher::Error::WatchFailed(
            kube::Error::SerdeError(_) | kube::Error::LinesCodecMaxLineLengthExceeded
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "uid": name}
        }))
        .unwrap()
    }

    fn names(rx: &mut mpsc::UnboundedReceiver<Event<Pod>>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = rx.try_recv() {
            out.push(match e {
                Event::Init => "init".into(),
                Event::InitApply(p) => format!("+{}", p.metadata.name.unwrap()),
                Event::InitDone => "done".into(),
                Event::Apply(p) => format!("~{}", p.metadata.name.unwrap()),
                Event::Delete(p) => format!("-{}", p.metadata.name.unwrap()),
            });
        }
        out
    }

    /// A late subscriber gets what the watch holds as a listing, then the changes: the same
    /// as its own watch would have given it, from the one watch.
    #[test]
    fn a_subscriber_gets_the_listing_then_every_change_whenever_it_comes() {
        let i: Informer<Pod> = Informer::default();
        let mut early = i.subscribe();
        i.publish(Event::Init);
        i.publish(Event::InitApply(pod("a")));
        let mut during = i.subscribe();
        i.publish(Event::InitApply(pod("b")));
        i.publish(Event::InitDone);
        i.publish(Event::Apply(pod("c")));
        i.publish(Event::Delete(pod("a")));
        let mut late = i.subscribe();
        i.publish(Event::Apply(pod("d")));
        assert_eq!(
            names(&mut early),
            ["init", "+a", "+b", "done", "~c", "-a", "~d"]
        );
        assert_eq!(
            names(&mut during),
            ["init", "+a", "+b", "done", "~c", "-a", "~d"]
        );
        assert_eq!(names(&mut late), ["init", "+b", "+c", "done", "~d"]);
        let snapshot: Vec<String> = i
            .snapshot()
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        assert_eq!(snapshot, ["b", "c", "d"]);
        // A relist replaces the store at its end; a subscriber that went is dropped.
        drop(late);
        i.publish(Event::Init);
        i.publish(Event::InitApply(pod("e")));
        assert_eq!(
            i.snapshot().len(),
            3,
            "the old listing holds until the new one ends"
        );
        i.publish(Event::InitDone);
        assert_eq!(i.snapshot().len(), 1);
        assert_eq!(i.subscribers(), 2);
    }

    /// One unreadable line of a watch's answer (the first of a pretty-printed 403) makes a new
    /// watcher after one backoff delay: kube's own would have read the next line, and the next,
    /// each after a doubled delay (1 + 2 + 4 + ... seconds for the 10 lines).
    #[tokio::test(start_paused = true)]
    async fn an_unreadable_answer_is_dropped_and_the_kind_listed_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let make = move |_: watcher::Config| -> Events<Pod> {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            let items: Vec<Result<Event<Pod>, watcher::Error>> = if first {
                (0..10)
                    .map(|_| {
                        let e = serde_json::from_str::<u8>("\"kind\": \"Status\",").unwrap_err();
                        Err(watcher::Error::WatchFailed(kube::Error::SerdeError(e)))
                    })
                    .collect()
            } else {
                vec![
                    Ok(Event::Init),
                    Ok(Event::InitApply(pod("a"))),
                    Ok(Event::InitDone),
                ]
            };
            futures_util::stream::iter(items)
                .chain(futures_util::stream::pending())
                .boxed()
        };
        let informer: Informer<Pod> = Informer::default();
        let watch = Watch {
            make,
            cfg: watcher::Config::default(),
            accepted: started::WatchStarts::default().subscribe("/api/v1/pods"),
        };
        let health = WatchHealth::new("this node's pods", health::WATCH_BACKOFF, None);
        let (_stop_tx, stop) = signal::channel(false);
        let task = tokio::spawn(feed(informer.clone(), watch, health, stop));
        // One delay: at most the backoff's base.
        tokio::time::sleep(health::WATCH_BACKOFF.base + Duration::from_millis(10)).await;
        assert_eq!(
            made.load(Ordering::SeqCst),
            2,
            "a new watcher after one delay"
        );
        assert_eq!(informer.snapshot().len(), 1, "the kind listed again");
        task.abort();
    }

    #[test]
    fn streaming_lists_only_where_the_server_offers_them() {
        use kube::runtime::watcher::{InitialListStrategy, ListSemantic};
        for (v, streaming) in [
            (Some((1, 20)), false),
            (Some((1, 31)), false),
            (Some((1, 32)), true),
            (Some((1, 36)), true),
            (None, false),
        ] {
            let c = config(v);
            assert_eq!(
                c.initial_list_strategy == InitialListStrategy::StreamingList,
                streaming,
                "{v:?}"
            );
            assert_eq!(
                c.list_semantic,
                ListSemantic::Any,
                "lists from the watch cache"
            );
            assert!(c.bookmarks);
            assert_eq!(
                c.page_size, None,
                "a limit would make kube drop resourceVersion=0"
            );
        }
    }
}
