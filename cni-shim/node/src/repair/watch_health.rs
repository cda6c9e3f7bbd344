//! The health of the controller's watch of this node's pods. An outage starts at the first
//! failed list or watch and ends at the first answer from the API server: a listed pod, the
//! end of a listing, a change. kube's watcher starts each new listing with `Event::Init`
//! before it sends the list request, so that event is no answer: counting it as one made an
//! unreachable server look back every 0.8 s (the backoff reset, "watching pods again" logged)
//! and flooded the log.
//!
//! One line when the outage starts (what failed, and that retries back off), one when it
//! ends (how long it lasted, how many retries); the retries back off exponentially to a cap.
//! The metrics say whether the watch works and when it last listed the pods.

use std::time::{Duration, Instant};

use kube::runtime::watcher;

use crate::metrics::Metrics;
use crate::pods::queue::Backoff;

/// The delays between two tries of a failed watch: 1 s doubling to 60 s.
pub const WATCH_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};

/// The watch's state, as the controller learns it.
pub struct WatchHealth {
    backoff: Backoff,
    outage: Option<Outage>,
    metrics: Metrics,
}

struct Outage {
    since: Instant,
    retries: u32,
}

impl WatchHealth {
    pub fn new(backoff: Backoff, metrics: Metrics) -> Self {
        metrics.set_watch_up(false);
        WatchHealth {
            backoff,
            outage: None,
            metrics,
        }
    }

    /// A list or watch failed: the first failure of an outage is logged; returns how long to
    /// wait before trying again.
    pub fn failed(&mut self, e: &watcher::Error) -> Duration {
        if matches!(e, watcher::Error::WatchError(r) if r.code == 410) {
            // The server's history moved past our resource version: the watcher lists again
            // at once. Routine, not an outage.
            tracing::debug!("the watch expired (410 Gone): listing the pods again");
            return Duration::ZERO;
        }
        self.metrics.set_watch_up(false);
        let outage = self.outage.get_or_insert_with(|| {
            tracing::error!(
                "watching this node's pods failed: {}; the repair controller acts on nothing until it works again; retrying with backoff ({} s doubling to {} s)",
                describe(e),
                self.backoff.base.as_secs_f64(),
                self.backoff.cap.as_secs_f64()
            );
            Outage {
                since: Instant::now(),
                retries: 0,
            }
        });
        let delay = self.backoff.delay(outage.retries);
        outage.retries += 1;
        tracing::debug!("watch retry {} in {delay:?}: {e}", outage.retries);
        delay
    }

    /// The API server answered: an outage, if one was on, is over.
    pub fn answered(&mut self) {
        self.metrics.set_watch_up(true);
        if let Some(o) = self.outage.take() {
            tracing::info!(
                "watching this node's pods again, after {:.1} s down and {} retries",
                o.since.elapsed().as_secs_f64(),
                o.retries
            );
        }
    }

    /// A listing of the pods completed.
    pub fn listed(&mut self) {
        self.answered();
        self.metrics.watch_listed();
    }
}

/// The watcher's error, with what to do when the API server refused the watch.
fn describe(e: &watcher::Error) -> String {
    let forbidden = matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 403 || s.code == 401
    );
    if forbidden {
        format!("{e}: the agent's ServiceAccount needs list and watch on pods (its ClusterRole in the manifests)")
    } else {
        e.to_string()
    }
}
