//! Rewrites of the CNI config counted over a sliding window: past the limit, the watcher holds
//! off and warns, since it is then fighting another installer that keeps rewriting the file.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Counts rewrites over a sliding window, and says how long to hold off past the limit.
#[derive(Debug, Clone)]
pub struct RewriteLimiter {
    window: Duration,
    max: usize,
    times: VecDeque<Instant>,
}

impl RewriteLimiter {
    /// At most `max` rewrites per `window`.
    pub fn new(max: usize, window: Duration) -> Self {
        RewriteLimiter {
            window,
            max,
            times: VecDeque::new(),
        }
    }

    /// Count a rewrite made at `now`.
    pub fn record(&mut self, now: Instant) {
        self.expire(now);
        self.times.push_back(now);
    }

    /// `None` if another rewrite may be made at `now`, else how long to wait.
    pub fn wait_needed(&mut self, now: Instant) -> Option<Duration> {
        self.expire(now);
        if self.times.len() < self.max {
            return None;
        }
        let oldest = *self.times.front()?;
        Some((oldest + self.window).saturating_duration_since(now))
    }

    /// Rewrites counted in the current window.
    pub fn count(&self) -> usize {
        self.times.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(t) = self.times.front() {
            if now.saturating_duration_since(*t) >= self.window {
                self.times.pop_front();
            } else {
                break;
            }
        }
    }
}
