//! The plugin's requests at ADD and CHECK (`cni_protocol::ambient`): a `SOCK_SEQPACKET` socket
//! in the run directory (mode 0600, root's: only root on the node may connect), one request
//! and one answer per connection. `gate` lets the requests in on one thread (a connection
//! that says nothing within [`FIRST_REQUEST`] is closed, and at most [`WAITING`] are held);
//! at most [`IN_FLIGHT`] requests wait for the controller at once, the rest answered "busy"
//! at once. The controller decides and answers in its own order with the watch's work
//! (`controller::plugin`).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::error::AmbientError;
use cni_protocol::ambient::{AddAnswer, AddRequest, MAX_MESSAGE, SOCKET_NAME};
use cni_protocol::gate::{self, Closed, Limits};
use cni_protocol::seqpacket::{self, Datagram};

/// How long a connection may take to send its request (the plugin sends it as it connects).
pub const FIRST_REQUEST: Duration = Duration::from_secs(1);
/// Connections held while they have said nothing.
pub const WAITING: usize = 32;
/// Requests waiting for the controller at once (a node's burst of pod starts, with room).
pub const IN_FLIGHT: usize = 256;

/// The plugin's request, with the pod's namespace and where to answer.
pub struct PluginRequest {
    pub add: AddRequest,
    pub netns: OwnedFd,
    pub reply: Reply,
}

/// The connection a request came on; answering (or dropping it) frees its place.
pub struct Reply {
    conn: OwnedFd,
    in_flight: Arc<AtomicUsize>,
}

impl Reply {
    /// Answers; the error when the plugin is gone (it gave up waiting: `Broken pipe`).
    pub fn send(self, answer: &AddAnswer) -> std::io::Result<()> {
        send_answer(&self.conn, answer)
    }

    /// Whether the plugin closed its end (it gave up waiting, and failed its ADD): then
    /// nothing may be done for the request.
    pub fn gone(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // The end of a closed connection reads as readable (its EOF) and hung up.
        let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            // The plugin sends nothing after its request: anything readable is its end.
            Ok(_) => fds[0].revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLIN)
            }),
            Err(_) => false,
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `answer` on the plugin's connection; the error when the plugin is gone.
fn send_answer(conn: &OwnedFd, answer: &AddAnswer) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    seqpacket::send(conn.as_fd(), &bytes, None, MAX_MESSAGE)
}

/// [`send_answer`], a failure logged.
fn answer_on(conn: &OwnedFd, answer: &AddAnswer) {
    if let Err(e) = send_answer(conn, answer) {
        tracing::warn!("ambient: could not answer the plugin: {e}");
    }
}

/// The listening socket's thread; dropping it stops the thread and removes the socket.
pub struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens in `run_dir` (which the agent has checked is its own) and forwards each request.
pub fn listen_in(run_dir: &Path, to: mpsc::Sender<PluginRequest>) -> std::io::Result<Listener> {
    let path = run_dir.join(SOCKET_NAME);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let sock = seqpacket::listen_private(&path, 128)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("ambient-plugin".into())
        .spawn(move || door(&sock, &flag, &to))?;
    Ok(Listener {
        path,
        stop,
        thread: Some(thread),
    })
}

fn door(sock: &OwnedFd, stop: &AtomicBool, to: &mpsc::Sender<PluginRequest>) {
    let limits = Limits {
        waiting: WAITING,
        first_datagram: FIRST_REQUEST,
        max: MAX_MESSAGE,
        tick: Duration::from_secs(1),
    };
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut seen = Closed::default();
    let first = |conn: OwnedFd, got: std::io::Result<Datagram>| {
        let _ = seqpacket::set_timeouts(&conn, Duration::from_secs(1));
        let read = got.map_err(|error| AmbientError::Unreadable { error });
        let (add, netns) = match read.and_then(read_request) {
            Ok(r) => r,
            Err(e) => {
                let error = e.to_string();
                return answer_on(&conn, &AddAnswer::Failed { error });
            }
        };
        if in_flight.fetch_add(1, Ordering::AcqRel) >= IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            let error = format!(
                "the agent is busy ({IN_FLIGHT} requests waiting); the runtime tries again"
            );
            tracing::warn!(
                "ambient: the plugin's request for {}/{} refused: {error}",
                add.namespace,
                add.name
            );
            return answer_on(&conn, &AddAnswer::Failed { error });
        }
        let reply = Reply {
            conn,
            in_flight: in_flight.clone(),
        };
        let request = PluginRequest { add, netns, reply };
        if let Err(e) = to.try_send(request) {
            let (error, r) = match e {
                mpsc::error::TrySendError::Full(r) => {
                    ("the agent is busy; the runtime tries again", r)
                }
                mpsc::error::TrySendError::Closed(r) => {
                    ("the ambient controller is not running", r)
                }
            };
            answer_on(
                &r.reply.conn,
                &AddAnswer::Failed {
                    error: error.into(),
                },
            );
        }
    };
    let tick = |closed: Closed| {
        if closed != seen {
            tracing::warn!(
                "ambient: {} connection(s) on {SOCKET_NAME} closed before their request ({} \
                 to make room, {} at the {FIRST_REQUEST:?} deadline); the plugin sends its \
                 request as soon as it connects",
                closed.evicted + closed.timed_out - seen.evicted - seen.timed_out,
                closed.evicted - seen.evicted,
                closed.timed_out - seen.timed_out,
            );
            seen = closed;
        }
    };
    gate::serve(sock, limits, stop, first, tick);
}

fn read_request(d: Datagram) -> Result<(AddRequest, OwnedFd), AmbientError> {
    let add: AddRequest =
        serde_json::from_slice(&d.bytes).map_err(|error| AmbientError::BadRequest { error })?;
    let mut fds = d.fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(fd), None) => Ok((add, fd)),
        _ => Err(AmbientError::Descriptors),
    }
}
