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

use crate::seqpacket::{self, Datagram};
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
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A door on a socket of its own, on a thread, recording what it hands over and closes.
    struct Door {
        _dir: tempfile::TempDir,
        path: PathBuf,
        listener: Option<OwnedFd>,
        stop: Arc<AtomicBool>,
        got: Arc<Mutex<Vec<Vec<u8>>>>,
        closed: Arc<Mutex<Closed>>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Door {
        /// The socket, listening; [`Door::open`] starts serving it.
        fn new() -> Door {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gate.sock");
            let listener = seqpacket::listen_private(&path, 128).unwrap();
            Door {
                _dir: dir,
                path,
                listener: Some(listener),
                stop: Arc::default(),
                got: Arc::default(),
                closed: Arc::default(),
                thread: None,
            }
        }

        fn open(mut self, waiting: usize, first_datagram: Duration) -> Door {
            let listener = self.listener.take().unwrap();
            let (s, g, c) = (self.stop.clone(), self.got.clone(), self.closed.clone());
            self.thread = Some(std::thread::spawn(move || {
                let limits = Limits {
                    waiting,
                    first_datagram,
                    max: 64,
                    tick: Duration::from_millis(20),
                };
                let first = |_, d: io::Result<Datagram>| {
                    g.lock()
                        .unwrap()
                        .push(d.map(|d| d.bytes).unwrap_or_default())
                };
                serve(&listener, limits, &s, first, |n| *c.lock().unwrap() = n)
            }));
            self
        }

        fn peer(&self, says: Option<&[u8]>) -> OwnedFd {
            let p = seqpacket::connect(&self.path, Duration::from_secs(2)).unwrap();
            if let Some(bytes) = says {
                seqpacket::send(p.as_fd(), bytes, None, 64).unwrap();
            }
            p
        }

        fn wait_for(&self, n: usize) {
            let start = Instant::now();
            while self.got.lock().unwrap().len() < n {
                let got = self.got.lock().unwrap().len();
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "{got} of {n} served"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            // A tick, for `closed`.
            std::thread::sleep(Duration::from_millis(50));
        }

        fn closed(&self) -> Closed {
            *self.closed.lock().unwrap()
        }
    }

    impl Drop for Door {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                t.join().unwrap();
            }
        }
    }

    #[test]
    fn silent_peers_are_evicted_oldest_first_and_a_speaking_peer_is_served() {
        let door = Door::new().open(4, Duration::from_secs(30));
        let silent: Vec<OwnedFd> = (0..50).map(|_| door.peer(None)).collect();
        let _real = door.peer(Some(b"hello"));
        door.wait_for(1);
        assert_eq!(door.got.lock().unwrap()[0], b"hello");
        // 51 accepted, 4 held at most: the 47 oldest silent ones closed, the real one never.
        assert_eq!(door.closed().evicted, 47);
        drop(silent);
    }

    #[test]
    fn a_burst_of_real_peers_is_served_whole_however_few_may_wait() {
        // The peers connect and speak before the door looks: all 100 wait in the backlog.
        let door = Door::new();
        let peers: Vec<OwnedFd> = (0..100).map(|_| door.peer(Some(b"req"))).collect();
        let door = door.open(4, Duration::from_secs(30));
        door.wait_for(100);
        assert!(door.got.lock().unwrap().iter().all(|b| b == b"req"));
        assert_eq!(door.closed().evicted, 0);
        drop(peers);
    }

    #[test]
    fn a_silent_peer_is_closed_at_its_deadline() {
        let door = Door::new().open(4, Duration::from_millis(100));
        let peer = door.peer(None);
        let got = seqpacket::recv(peer.as_fd(), 64);
        assert!(
            matches!(&got, Err(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "the silent peer was not closed"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(door.closed().timed_out, 1);
    }
}
