//! The door of the agent's two `SOCK_SEQPACKET` listeners (the plugin's `ambient.sock`,
//! ztunnel's ZDS socket): one thread per socket accepts every connection and holds it, with
//! no thread of its own, until its first datagram arrives (the plugin's request, ztunnel's
//! hello), then hands both over. A peer that says nothing costs one descriptor until its
//! deadline, and at most `waiting` of them are held: past that, the one that has waited
//! longest is closed (a real peer speaks as soon as it connects, so it is never the oldest for
//! long). So silent connections cost neither threads nor an unbounded number of descriptors,
//! and they hold up no other peer.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cni_plugin::seqpacket::{self, Datagram};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// How a socket's door treats the connections it holds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections held while they have said nothing; past this, the oldest is closed.
    pub waiting: usize,
    /// How long a connection may take to send its first datagram.
    pub first_datagram: Duration,
    /// The largest first datagram.
    pub max: usize,
    /// How often `tick` runs, whatever arrives.
    pub tick: Duration,
}

/// What the door did with connections that never spoke, for the logs and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Closed to make room for a newer connection.
    pub evicted: u64,
    /// Closed at their deadline.
    pub timed_out: u64,
}

/// Serves `listener` (non-blocking, `seqpacket::listen_private`) until `stop`: each
/// connection's first datagram goes to `first` with the connection (a datagram that cannot be
/// read, or a peer that hung up, closes it); `tick` runs every `limits.tick` with what was
/// closed since the start.
pub fn serve(
    listener: &OwnedFd,
    limits: Limits,
    stop: &AtomicBool,
    mut first: impl FnMut(OwnedFd, io::Result<Datagram>),
    mut tick: impl FnMut(Closed),
) {
    let mut waiting: VecDeque<(OwnedFd, Instant)> = VecDeque::new();
    let mut closed = Closed::default();
    let mut next_tick = Instant::now() + limits.tick;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let soonest = waiting
            .iter()
            .map(|(_, d)| *d)
            .chain([next_tick])
            .min()
            .unwrap_or(next_tick);
        let wait = soonest.saturating_duration_since(now).min(limits.tick);
        let ready = ready_now(listener, &waiting, wait);
        // Spoken (or hung up): handed over, oldest first.
        let mut kept = VecDeque::with_capacity(waiting.len());
        for ((conn, deadline), readable) in waiting.drain(..).zip(ready.waiting) {
            if readable {
                let got = seqpacket::try_recv(conn.as_fd(), limits.max);
                match got {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        kept.push_back((conn, deadline))
                    }
                    got => first(conn, got),
                }
            } else if Instant::now() >= deadline {
                closed.timed_out += 1;
            } else {
                kept.push_back((conn, deadline));
            }
        }
        waiting = kept;
        if ready.listener {
            // Everything waiting in the backlog, so that it drains however fast peers come.
            while let Ok(Some(conn)) = seqpacket::accept(listener) {
                waiting.push_back((conn, Instant::now() + limits.first_datagram));
                while waiting.len() > limits.waiting {
                    // The oldest makes room, unless it spoke meanwhile (a burst of real peers
                    // accepted at once): then it is served.
                    let Some((oldest, _)) = waiting.pop_front() else {
                        break;
                    };
                    match seqpacket::try_recv(oldest.as_fd(), limits.max) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => closed.evicted += 1,
                        got => first(oldest, got),
                    }
                }
            }
        }
        if Instant::now() >= next_tick {
            tick(closed);
            next_tick = Instant::now() + limits.tick;
        }
    }
}

/// Which of the listener and the waiting connections have something, waiting up to `wait`.
struct Ready {
    listener: bool,
    waiting: Vec<bool>,
}

fn ready_now(listener: &OwnedFd, waiting: &VecDeque<(OwnedFd, Instant)>, wait: Duration) -> Ready {
    let mut fds = Vec::with_capacity(waiting.len() + 1);
    fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
    for (conn, _) in waiting {
        fds.push(PollFd::new(conn.as_fd(), PollFlags::POLLIN));
    }
    let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::ZERO);
    if poll(&mut fds, timeout).is_err() {
        // EINTR: look again.
        return Ready {
            listener: false,
            waiting: vec![false; waiting.len()],
        };
    }
    let any = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    Ready {
        listener: any(&fds[0]),
        waiting: fds[1..].iter().map(any).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn silent_peers_are_evicted_oldest_first_and_a_speaking_peer_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.sock");
        let listener = seqpacket::listen_private(&path, 128).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let closed = Arc::new(Mutex::new(Closed::default()));
        let (s, g, c) = (stop.clone(), got.clone(), closed.clone());
        let t = std::thread::spawn(move || {
            let limits = Limits {
                waiting: 4,
                first_datagram: Duration::from_secs(30),
                max: 64,
                tick: Duration::from_millis(20),
            };
            serve(
                &listener,
                limits,
                &s,
                |_, d| {
                    g.lock()
                        .unwrap()
                        .push(d.map(|d| d.bytes).unwrap_or_default())
                },
                |n| *c.lock().unwrap() = n,
            )
        });
        let silent: Vec<OwnedFd> = (0..50)
            .map(|_| seqpacket::connect(&path, Duration::from_secs(2)).unwrap())
            .collect();
        let real = seqpacket::connect(&path, Duration::from_secs(2)).unwrap();
        seqpacket::send(real.as_fd(), b"hello", None, 64).unwrap();
        let start = Instant::now();
        while got.lock().unwrap().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(5), "never served");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(got.lock().unwrap()[0], b"hello");
        std::thread::sleep(Duration::from_millis(50));
        // 51 accepted, 4 held at most: the 47 oldest silent ones closed, the real one never.
        assert_eq!(closed.lock().unwrap().evicted, 47);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        drop(silent);
    }

    #[test]
    fn a_burst_of_real_peers_is_served_whole_however_few_may_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.sock");
        let listener = seqpacket::listen_private(&path, 128).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let got = Arc::new(Mutex::new(0usize));
        let closed = Arc::new(Mutex::new(Closed::default()));
        // The peers connect and speak before the door looks: all 100 wait in the backlog.
        let peers: Vec<OwnedFd> = (0..100)
            .map(|_| {
                let p = seqpacket::connect(&path, Duration::from_secs(2)).unwrap();
                seqpacket::send(p.as_fd(), b"req", None, 64).unwrap();
                p
            })
            .collect();
        let (s, g, c) = (stop.clone(), got.clone(), closed.clone());
        let t = std::thread::spawn(move || {
            let limits = Limits {
                waiting: 4,
                first_datagram: Duration::from_secs(30),
                max: 64,
                tick: Duration::from_millis(20),
            };
            serve(
                &listener,
                limits,
                &s,
                |_, d| {
                    assert_eq!(d.unwrap().bytes, b"req");
                    *g.lock().unwrap() += 1
                },
                |n| *c.lock().unwrap() = n,
            )
        });
        let start = Instant::now();
        while *got.lock().unwrap() < 100 {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{} served",
                got.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(closed.lock().unwrap().evicted, 0);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        drop(peers);
    }

    #[test]
    fn a_silent_peer_is_closed_at_its_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.sock");
        let listener = seqpacket::listen_private(&path, 8).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let closed = Arc::new(Mutex::new(Closed::default()));
        let (s, c) = (stop.clone(), closed.clone());
        let t = std::thread::spawn(move || {
            let limits = Limits {
                waiting: 4,
                first_datagram: Duration::from_millis(100),
                max: 64,
                tick: Duration::from_millis(20),
            };
            serve(&listener, limits, &s, |_, _| {}, |n| *c.lock().unwrap() = n)
        });
        let peer = seqpacket::connect(&path, Duration::from_secs(2)).unwrap();
        let got = seqpacket::recv(peer.as_fd(), 64);
        assert!(
            matches!(&got, Err(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "the silent peer was not closed"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(closed.lock().unwrap().timed_out, 1);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }
}
