//! The controller's work queue: pod UIDs, each queued at most once, retried after a failure
//! with a doubling delay, and given up after a bounded number of attempts (client-go's
//! workqueue as Istio uses it, keyed by UID rather than by name so that a pod recreated under
//! the same name is a new item).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// The delays between attempts: `base`, doubling, at most `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay.
    pub base: Duration,
    /// The longest delay.
    pub cap: Duration,
}

impl Backoff {
    /// The delay before try `n + 1` after `n` failures in a row: `base` doubled `n` times, at
    /// most `cap`.
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

impl Default for Backoff {
    /// 250 ms doubling to 30 s: five attempts span about 4 s, a pod's crash loop then brings
    /// it back (kubelet restarts the validation container 10 s later, then less often).
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(250),
            cap: Duration::from_secs(30),
        }
    }
}

/// What became of a failed item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Queued again, due after this delay; `attempt` attempts failed so far.
    After {
        /// How long until it is due.
        delay: Duration,
        /// Failed attempts so far.
        attempt: u32,
    },
    /// `attempts` attempts failed: dropped until it is added again.
    GaveUp {
        /// Failed attempts in all.
        attempts: u32,
    },
}

/// Pod UIDs waiting for work: each queued once, retried after a failure with backoff, given up
/// after a number of attempts.
#[derive(Debug)]
pub struct Queue {
    ready: VecDeque<String>,
    /// Items waiting for their retry time, ordered by it.
    delayed: BTreeSet<(Instant, String)>,
    /// Every item in `ready` or `delayed`.
    queued: HashSet<String>,
    /// Failed attempts per item, until it succeeds, is forgotten or given up.
    failures: HashMap<String, u32>,
    max_attempts: u32,
    backoff: Backoff,
}

impl Queue {
    /// Empty; an item is given up after `max_attempts` failed attempts (at least 1), retried
    /// after `backoff`'s delays until then.
    pub fn new(max_attempts: u32, backoff: Backoff) -> Self {
        Queue {
            ready: VecDeque::new(),
            delayed: BTreeSet::new(),
            queued: HashSet::new(),
            failures: HashMap::new(),
            max_attempts: max_attempts.max(1),
            backoff,
        }
    }

    /// Queue `key` now, unless it is queued already (then it keeps its place and its time: a
    /// pod's status updates must not cut its backoff short).
    pub fn add(&mut self, key: &str) {
        if self.queued.insert(key.to_owned()) {
            self.ready.push_back(key.to_owned());
        }
    }

    /// The next item due at `now`, if any.
    pub fn pop(&mut self, now: Instant) -> Option<String> {
        while let Some(first) = self.delayed.first() {
            if first.0 > now {
                break;
            }
            let (_, key) = self.delayed.pop_first().expect("a first item");
            self.ready.push_back(key);
        }
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        Some(key)
    }

    /// When the earliest delayed item is due (`None`: nothing waits, or something is ready).
    pub fn next_due(&self) -> Option<Instant> {
        if !self.ready.is_empty() {
            return Some(Instant::now());
        }
        self.delayed.first().map(|(t, _)| *t)
    }

    /// `key`'s attempt failed at `now`: queue it again after its backoff, or give it up.
    pub fn retry(&mut self, key: &str, now: Instant) -> Retry {
        let failures = self.failures.entry(key.to_owned()).or_insert(0);
        *failures += 1;
        let attempt = *failures;
        if attempt >= self.max_attempts {
            self.failures.remove(key);
            return Retry::GaveUp { attempts: attempt };
        }
        let delay = self.backoff.delay(attempt - 1);
        if self.queued.insert(key.to_owned()) {
            self.delayed.insert((now + delay, key.to_owned()));
        }
        Retry::After { delay, attempt }
    }

    /// `key` succeeded or is gone: its failures are forgotten (and a queued copy dropped).
    pub fn forget(&mut self, key: &str) {
        self.failures.remove(key);
        if self.queued.remove(key) {
            self.ready.retain(|k| k != key);
            self.delayed.retain(|(_, k)| k != key);
        }
    }

    /// How many items are queued, ready or waiting for their retry.
    pub fn len(&self) -> usize {
        self.queued.len()
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(max: u32) -> Queue {
        Queue::new(
            max,
            Backoff {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(35),
            },
        )
    }

    #[test]
    fn an_item_is_queued_once() {
        let mut q = q(5);
        let now = Instant::now();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(now).as_deref(), Some("a"));
        assert_eq!(q.pop(now).as_deref(), Some("b"));
        assert_eq!(q.pop(now), None);
        q.add("a");
        assert_eq!(q.pop(now).as_deref(), Some("a"), "queued again once popped");
    }

    #[test]
    fn retries_double_up_to_the_cap_and_stop_at_the_bound() {
        let mut q = q(5);
        let t0 = Instant::now();
        let delays: Vec<Retry> = (0..5)
            .map(|_| {
                let r = q.retry("a", t0);
                q.forget_queued_copy("a");
                r
            })
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            delays,
            vec![
                Retry::After {
                    delay: ms(10),
                    attempt: 1
                },
                Retry::After {
                    delay: ms(20),
                    attempt: 2
                },
                Retry::After {
                    delay: ms(35),
                    attempt: 3
                },
                Retry::After {
                    delay: ms(35),
                    attempt: 4
                },
                Retry::GaveUp { attempts: 5 },
            ]
        );
        assert!(q.is_empty(), "a given-up item is not queued");
        assert!(
            matches!(q.retry("a", t0), Retry::After { attempt: 1, .. }),
            "counting starts over after giving up"
        );
    }

    #[test]
    fn a_retried_item_is_due_after_its_delay_and_an_add_does_not_cut_it_short() {
        let mut q = q(5);
        let t0 = Instant::now();
        q.add("a");
        assert_eq!(q.pop(t0).as_deref(), Some("a"));
        q.retry("a", t0);
        q.add("a");
        assert_eq!(q.pop(t0), None, "still waiting for its backoff");
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(10)));
        assert_eq!(q.pop(t0 + Duration::from_millis(10)).as_deref(), Some("a"));
    }

    #[test]
    fn forget_drops_the_failures_and_the_queued_copy() {
        let mut q = q(2);
        let t0 = Instant::now();
        q.retry("a", t0);
        q.forget("a");
        assert!(q.is_empty());
        assert_eq!(q.pop(t0 + Duration::from_secs(1)), None);
        assert!(
            matches!(q.retry("a", t0), Retry::After { attempt: 1, .. }),
            "failures forgotten: the bound of 2 is not reached by one more failure"
        );
    }

    impl Queue {
        /// Drops a queued copy but keeps the failure count (as a pop would).
        fn forget_queued_copy(&mut self, key: &str) {
            if self.queued.remove(key) {
                self.ready.retain(|k| k != key);
                self.delayed.retain(|(_, k)| k != key);
            }
        }
    }
}
