//! What the ZDS server holds, shared by its calls (`server`) and the door's handshakes
//! (`handshake`): the pods held, the connections open with what each acked, the one request and
//! answer on a connection, and the watch for a hang-up. Below both, so that neither reaches
//! into the other.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use cni_protocol::gate::Closed;
use prost::Message;

use crate::proto::{ResponsePayload, WorkloadInfo, WorkloadRequest, WorkloadResponse};
use crate::wire;

/// Connections open at once; past that the oldest is closed. ztunnel is one process per node,
/// two during its rollout (Istio sets no bound; each open connection costs a descriptor).
pub const MAX_OPEN: usize = 8;

/// A pod to serve: who it is and, while the agent holds it, its network namespace; `gen`
/// changes with the namespace, so an ack of an older one does not count.
pub(crate) struct Workload {
    pub(crate) info: WorkloadInfo,
    pub(crate) netns: Option<OwnedFd>,
    pub(crate) gen: u64,
}

/// A connection that had its snapshot, and what it answered.
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) sock: OwnedFd,
    pub(crate) since: SystemTime,
    /// Pods this connection acked, with the generation acked.
    pub(crate) acked: HashMap<String, u64>,
    /// Pods this connection refused, with its error.
    pub(crate) refused: HashMap<String, String>,
}

/// The pods held and the connections open, under [`Inner`]'s lock.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) pods: BTreeMap<String, Workload>,
    /// Every connection open (each had its snapshot), oldest first: the last serves adds.
    pub(crate) conns: Vec<Conn>,
    pub(crate) gen: u64,
}

impl State {
    /// The connection serving adds: the newest.
    pub(crate) fn newest(&self) -> Option<&Conn> {
        self.conns.last()
    }

    pub(crate) fn conn_mut(&mut self, id: u64) -> Option<&mut Conn> {
        self.conns.iter_mut().find(|c| c.id == id)
    }

    /// Who serves adds now, for the log.
    pub(crate) fn serving(&self) -> String {
        match self.conns.as_slice() {
            [] => "no ztunnel is connected".into(),
            [only] => format!("connection {} serves", only.id),
            [.., last] => format!(
                "connection {} serves adds, {} connections open",
                last.id,
                self.conns.len()
            ),
        }
    }
}

type OnChange = Box<dyn Fn() + Send + Sync>;

/// What the server's calls and the door's threads share.
pub(crate) struct Inner {
    state: Mutex<State>,
    pub(crate) deadline: Duration,
    pub(crate) stop: AtomicBool,
    /// Hellos wait until the agent knows every enrolled pod: a snapshot that missed one would
    /// make ztunnel drop it.
    pub(crate) serving: AtomicBool,
    pub(crate) connections: AtomicU64,
    pub(crate) next_id: AtomicU64,
    pub(crate) handshakes: AtomicUsize,
    /// Called when a connection comes or goes.
    on_change: Mutex<Option<OnChange>>,
    pub(crate) closed: Mutex<Closed>,
}

impl Inner {
    /// Nothing held, no connection, hellos waiting (see `serving`).
    pub(crate) fn new(deadline: Duration) -> Inner {
        Inner {
            state: Mutex::new(State::default()),
            deadline,
            stop: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            handshakes: AtomicUsize::new(0),
            on_change: Mutex::new(None),
            closed: Mutex::new(Closed::default()),
        }
    }

    /// `f` runs each time a connection comes or goes.
    pub(crate) fn on_change(&self, f: OnChange) {
        *self.on_change.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it leaves the map as it was between two requests.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn changed(&self) {
        if let Some(f) = self
            .on_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            f();
        }
    }

    /// Closes each connection whose ztunnel hung up (or sent something unasked, which breaks
    /// the one-answer-per-request order).
    pub(crate) fn drop_if_hung_up(&self, state: &mut State) {
        let newest = state.newest().map(|c| c.id);
        let mut gone = Vec::new();
        state.conns.retain(|c| {
            let dead = hung_up(c.sock.as_fd());
            if dead {
                gone.push(c.id);
            }
            !dead
        });
        if gone.is_empty() {
            return;
        }
        for id in gone {
            // An older ztunnel leaving is the end of a rollout; the newest leaving is not.
            if Some(id) == newest {
                tracing::warn!(
                    "ZDS connection {id}: ztunnel closed it; {}",
                    state.serving()
                );
            } else {
                tracing::info!(
                    "ZDS connection {id}: ztunnel closed it; {}",
                    state.serving()
                );
            }
        }
        self.changed();
    }

    /// Run by the door's thread between connections: each idle connection looked at, unless
    /// a request holds the lock (that request sees a hang-up itself).
    pub(crate) fn liveness(&self) {
        let Ok(mut state) = self.state.try_lock() else {
            return;
        };
        self.drop_if_hung_up(&mut state);
    }
}

/// Whether ztunnel closed the connection (or sent something unasked) since the last answer.
fn hung_up(sock: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(sock, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => false,
        Ok(_) => true,
        Err(_) => true,
    }
}

/// One request and its answer: `None` for an ack, the error of a nack.
pub(crate) fn exchange(
    sock: BorrowedFd<'_>,
    request: &WorkloadRequest,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<Option<String>> {
    wire::send(sock, &request.encode_to_vec(), fd)?;
    let answer = wire::recv(sock)?;
    if !answer.fds.is_empty() {
        return Err(bad("an answer carrying descriptors"));
    }
    let response = WorkloadResponse::decode(answer.bytes.as_slice())
        .map_err(|e| bad(&format!("an answer that is not a WorkloadResponse ({e})")))?;
    match response.payload {
        Some(ResponsePayload::Ack(ack)) if ack.error.is_empty() => Ok(None),
        Some(ResponsePayload::Ack(ack)) => Ok(Some(ack.error)),
        None => Err(bad("an answer with no ack")),
    }
}

/// An answer or hello that breaks the protocol, as an error.
pub(crate) fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("ztunnel sent {what}"))
}
