//! The health of an informer's watch (this node's pods, the namespaces). An outage starts at the first
//! failed list or watch and ends at the first answer from the API server: a listed pod, the
//! end of a listing, a change. kube's watcher starts each new listing with `Event::Init`
//! before it sends the list request, so that event is no answer: counting it as one made an
//! unreachable server look back every 0.8 s (the backoff reset, "watching pods again" logged)
//! and flooded the log.
//!
//! One line when the outage starts (what failed, and that retries back off), one when it
//! ends (how long it lasted, how many retries); the retries back off exponentially to a cap,
//! each delay drawn between half and all of it, so that the agents of a cluster that lost the
//! API server together come back spread out. The pods' watch's metrics say whether it works
//! and when it last listed the pods.

use std::time::{Duration, Instant};

use kube::runtime::watcher;

use crate::pods::queue::Backoff;

/// The delays between two tries of a failed watch: 1 s doubling to 60 s.
pub const WATCH_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};

/// How far apart the agents list again after a 410 Gone: each waits a uniform random part
/// of it. An API server that restarts answers 410 to every agent's watch within a second; at
/// 5,000 nodes, 10 s makes that 500 lists a second instead of 5,000 at once (each from the
/// watch cache), while an agent's controllers act on what they last saw for at most 10 s.
pub const RELIST_SPREAD: Duration = Duration::from_secs(10);

/// How long a watch the API server accepted must stay up to end an outage (and start the
/// next one's backoff from its base again): kube's watcher gives no event for a quiet kind, so
/// an accepted watch is the sign it works; a server that accepts each watch and fails it at
/// once keeps the outage, and its backoff.
pub const STAYED_UP: Duration = Duration::from_secs(5);

/// Where a watch's health is shown: whether it works, and that it listed (the pods' watch's
/// `redirect_cni_repair_watch_*` metrics, made by the metrics' `watch_gauges`).
pub struct Gauges {
    /// Whether the watch works.
    pub up: Box<dyn Fn(bool) + Send + Sync>,
    /// A listing completed.
    pub listed: Box<dyn Fn() + Send + Sync>,
}

/// The watch's state, as its informer learns it.
pub struct WatchHealth {
    /// What is watched, for the log (`this node's pods`).
    what: &'static str,
    backoff: Backoff,
    outage: Option<Outage>,
    /// The pods' watch's metrics (`redirect_cni_repair_watch_*`); `None` for another kind.
    metrics: Option<Gauges>,
}

struct Outage {
    since: Instant,
    retries: u32,
}

impl WatchHealth {
    /// The health of the watch of `what` (for the log), retried after `backoff`'s delays; the
    /// pods' watch sets its `metrics`.
    pub fn new(what: &'static str, backoff: Backoff, metrics: Option<Gauges>) -> Self {
        if let Some(m) = &metrics {
            (m.up)(false);
        }
        WatchHealth {
            what,
            backoff,
            outage: None,
            metrics,
        }
    }

    /// A list or watch failed: the first failure of an outage is logged; returns how long to
    /// wait before trying again.
    pub fn failed(&mut self, e: &watcher::Error) -> Duration {
        if matches!(e, watcher::Error::WatchError(r) if r.code == 410) {
            // The server's history moved past our resource version: the watcher lists again.
            // Routine, not an outage; but a restarted API server answers it to every agent of
            // the cluster at once, so each lists after its own random part of RELIST_SPREAD.
            let delay = RELIST_SPREAD.mul_f64(fastrand::f64());
            tracing::debug!(
                "the watch expired (410 Gone): listing {} again in {delay:?}",
                self.what
            );
            return delay;
        }
        if let Some(m) = &self.metrics {
            (m.up)(false);
        }
        let (what, backoff) = (self.what, self.backoff);
        let outage = self.outage.get_or_insert_with(|| {
            tracing::error!(
                "watching {what} failed: {}; the controllers act on what they last saw until it \
                 works again; retrying with backoff ({} s doubling to {} s, jittered)",
                describe(e, what),
                backoff.base.as_secs_f64(),
                backoff.cap.as_secs_f64()
            );
            Outage {
                since: Instant::now(),
                retries: 0,
            }
        });
        // Between half and all of the delay: agents that failed together retry apart.
        let delay = self
            .backoff
            .delay(outage.retries)
            .mul_f64(0.5 + fastrand::f64() / 2.0);
        outage.retries += 1;
        tracing::debug!("watch retry {} in {delay:?}: {e}", outage.retries);
        delay
    }

    /// The API server answered: an outage, if one was on, is over.
    pub fn answered(&mut self) {
        if let Some(m) = &self.metrics {
            (m.up)(true);
        }
        if let Some(o) = self.outage.take() {
            tracing::info!(
                "watching {} again, after {:.1} s down and {} retries",
                self.what,
                o.since.elapsed().as_secs_f64(),
                o.retries
            );
        }
    }

    /// A listing of the pods completed.
    pub fn listed(&mut self) {
        self.answered();
        if let Some(m) = &self.metrics {
            (m.listed)();
        }
    }
}

/// The watcher's error, with what to do when the API server refused the watch.
fn describe(e: &watcher::Error, what: &str) -> String {
    let forbidden = matches!(
        e,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
            | watcher::Error::WatchStartFailed(kube::Error::Api(s))
            if s.code == 403 || s.code == 401
    );
    if forbidden {
        let resource = if what.ends_with("pods") {
            "pods"
        } else {
            "namespaces"
        };
        format!("{e}: the agent's ServiceAccount needs list and watch on {resource} (its ClusterRole in the manifests)")
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone() -> watcher::Error {
        watcher::Error::WatchError(kube::core::ErrorResponse {
            status: "Failure".into(),
            message: "too old resource version".into(),
            reason: "Expired".into(),
            code: 410,
        })
    }

    /// A 410 is no outage, and the agents that get it together list apart: each delay within
    /// RELIST_SPREAD, and not all the same.
    #[test]
    fn a_410_relists_within_the_spread_and_apart() {
        let mut h = WatchHealth::new("this node's pods", WATCH_BACKOFF, None);
        let delays: Vec<Duration> = (0..100).map(|_| h.failed(&gone())).collect();
        assert!(delays.iter().all(|d| *d < RELIST_SPREAD), "{delays:?}");
        let (min, max) = (delays.iter().min().unwrap(), delays.iter().max().unwrap());
        assert!(
            *max - *min > RELIST_SPREAD / 2,
            "100 draws spread over less than half: {min:?} to {max:?}"
        );
        assert!(h.outage.is_none(), "a 410 is no outage");
    }
}
