//! The agent's side of ZDS: it listens on a `SOCK_SEQPACKET` unix socket
//! (`/var/run/ztunnel/ztunnel.sock`, mode 0600 in a folder that must be the agent's alone),
//! ztunnel connects and says hello, and the agent sends every pod it holds (its network
//! namespace attached, or `keep` when the agent does not hold it) then `SnapshotSent`; after
//! that, requests go one at a time on each connection, each answered by an ack or a nack in
//! order. Every connection that got its snapshot stays open until ztunnel closes it (or a
//! request on it fails), as Istio's node agent keeps them: during ztunnel's rollout the old and
//! the new ztunnel are both connected. The newest serves adds (the connection requests go to);
//! a `del` goes to every connection open, so that the old ztunnel also stops serving a pod
//! that is gone. When the newest closes, the next newest serves adds again.
//!
//! What ztunnel holds is read from its answers, per connection: a pod counts as served only
//! when the connection serving adds acked its add (of the namespace held now). A nack, or a
//! connection that has not acked it (a new one, or an older one serving again), leaves it
//! unacked, and [`ZdsServer::unacked`] says what to send again; nothing is dropped because
//! ztunnel refused it once.
//!
//! Connections are let in by `gate` (silent peers cost no thread and delay no one); each
//! hello's handshake runs on a thread of its own with its own deadlines, the snapshot sent
//! without holding the server's lock, so a peer that stops answering delays no other. Each
//! idle connection is watched for ztunnel's hang-up (as Istio probes it), so that its death
//! shows at once.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cni_protocol::folder::NotOwn;
use cni_protocol::gate::Closed;
use cni_protocol::seqpacket;

use crate::proto::{WorkloadInfo, WorkloadRequest};
pub use crate::state::MAX_OPEN;
use crate::state::{exchange, Conn, Inner, State, Workload};

/// ztunnel's deadline for each step; the agent uses the same.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// What went wrong delivering a request to ztunnel.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// ztunnel answered with an error: it refused the request.
    #[error("ztunnel refused {request}: {error}")]
    Nack {
        /// The request refused, as [`WorkloadRequest::describe`] names it.
        request: String,
        /// ztunnel's error.
        error: String,
    },
    /// The connection failed or timed out; it was closed, and ztunnel gets the pod with the
    /// snapshot of its next connection.
    #[error("ztunnel's connection failed during {request}; the connection was closed (the pod goes with the next connection's snapshot)")]
    Connection {
        /// The request under way, as [`WorkloadRequest::describe`] names it.
        request: String,
        /// Why sending it or reading its answer failed.
        #[source]
        source: io::Error,
    },
}

/// Where a request ended up.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// ztunnel acknowledged it (now, or earlier on this connection).
    Acked,
    /// No ztunnel is connected (or the pod has no namespace to send): it goes with the next
    /// connection's snapshot.
    Queued,
}

/// What the connection serving adds (the newest) holds of one pod, as its answers said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The connection serving adds, if any is open.
    pub connection: Option<u64>,
    /// It acked the pod's add (or `keep`) of the namespace held now.
    pub acked: bool,
    /// Its last refusal of the pod, if it refused it.
    pub refused: Option<String>,
}

/// A connection, as seen from outside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Its number, from 1 in the order connections arrived; the logs name it.
    pub id: u64,
    /// When its handshake began.
    pub since: SystemTime,
}

impl Connection {
    fn of(c: &Conn) -> Connection {
        Connection {
            id: c.id,
            since: c.since,
        }
    }
}

/// The ZDS server; dropping it stops accepting and closes every connection.
pub struct ZdsServer {
    inner: Arc<Inner>,
    path: PathBuf,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl ZdsServer {
    /// Listens at `path`: a socket left there by an earlier run is replaced; anything else
    /// there is an error (not removed). `deadline` bounds each read and write.
    pub fn bind(path: &Path, deadline: Duration) -> io::Result<ZdsServer> {
        let server = ZdsServer::bind_paused(path, deadline)?;
        server.serve_connections();
        Ok(server)
    }

    /// [`ZdsServer::bind`], but ztunnel's hellos wait until
    /// [`ZdsServer::serve_connections`]: the agent first learns which pods are enrolled, so
    /// that the first snapshot holds them all. The socket's folder is made 0755 when missing
    /// and must be the agent's alone, its ancestors too (`run_dir::own_dir`): whoever can
    /// replace the socket can receive every pod's namespace. The socket is mode 0600.
    pub fn bind_paused(path: &Path, deadline: Duration) -> io::Result<ZdsServer> {
        check_folder(path)?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
                std::fs::remove_file(path)?
            }
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket: remove it, or point the ZDS socket \
                         elsewhere",
                        path.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = seqpacket::listen_private(path, 64)?;
        let inner = Arc::new(Inner::new(deadline));
        let for_thread = inner.clone();
        let accept = std::thread::Builder::new()
            .name("zds-accept".into())
            .spawn(move || crate::handshake::door(&for_thread, &listener))?;
        Ok(ZdsServer {
            inner,
            path: path.to_owned(),
            accept: Some(accept),
        })
    }

    /// Starts answering ztunnel's hellos (see [`ZdsServer::bind_paused`]).
    pub fn serve_connections(&self) {
        self.inner.serving.store(true, Ordering::Relaxed);
    }

    /// `f` runs (on the server's threads) each time a connection comes or goes.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        self.inner.on_change(Box::new(f));
    }

    /// Holds `uid` with its namespace (`None`: ztunnel is told to keep what it has, in each
    /// snapshot), without sending anything: [`ZdsServer::sync`] does. A new namespace must be
    /// acked again.
    pub fn set(&self, uid: &str, info: WorkloadInfo, netns: Option<OwnedFd>) {
        let mut state = self.inner.lock();
        let same = state
            .pods
            .get(uid)
            .is_some_and(|w| w.info == info && w.netns.is_none() && netns.is_none());
        if same {
            return;
        }
        state.gen += 1;
        let gen = state.gen;
        state
            .pods
            .insert(uid.to_owned(), Workload { info, netns, gen });
    }

    /// Sends `uid`'s add to the connection serving adds (the newest) unless it acked it
    /// already; older connections get no adds (as Istio's `PodAdded`). A nack is remembered
    /// (and the pod stays held, to be sent again); a failed connection is closed.
    pub fn sync(&self, uid: &str) -> Result<Delivery, ZdsError> {
        let mut state = self.inner.lock();
        self.inner.drop_if_hung_up(&mut state);
        let Some(w) = state.pods.get(uid) else {
            return Ok(Delivery::Queued);
        };
        let gen = w.gen;
        let Some(newest) = state.newest() else {
            return Ok(Delivery::Queued);
        };
        if newest.acked.get(uid) == Some(&gen) {
            return Ok(Delivery::Acked);
        }
        let id = newest.id;
        let Some(fd) = w.netns.as_ref().and_then(|f| f.try_clone().ok()) else {
            return Ok(Delivery::Queued);
        };
        let request = WorkloadRequest::add(uid, w.info.clone());
        let result = send_to(&self.inner, &mut state, id, &request, Some(fd.as_fd()));
        if let Some(c) = state.conn_mut(id) {
            match &result {
                Ok(Delivery::Acked) => {
                    c.acked.insert(uid.to_owned(), gen);
                    c.refused.remove(uid);
                }
                Err(ZdsError::Nack { error, .. }) => {
                    c.acked.remove(uid);
                    c.refused.insert(uid.to_owned(), error.clone());
                }
                _ => {}
            }
        }
        result
    }

    /// [`ZdsServer::set`] then [`ZdsServer::sync`].
    pub fn add(&self, uid: &str, info: WorkloadInfo, netns: OwnedFd) -> Result<Delivery, ZdsError> {
        self.set(uid, info, Some(netns));
        self.sync(uid)
    }

    /// Holds a pod ztunnel already serves whose namespace the agent does not hold (after the
    /// agent's restart): snapshots carry it as `keep`.
    pub fn keep(&self, uid: &str, info: WorkloadInfo) {
        self.set(uid, info, None);
    }

    /// Sends `uid` to the connection serving adds (the newest) again though it acked it: a
    /// `del`, then its add. ztunnel takes a second add of the same namespace for done (it
    /// keeps its proxy record even when the proxy's listeners are gone); a `del` first makes
    /// it start the pod's proxy anew. Older connections are not told (their ztunnel is on its
    /// way out and gets no adds). The pod stays held whatever the answers.
    pub fn readd(&self, uid: &str) -> Result<Delivery, ZdsError> {
        {
            let mut state = self.inner.lock();
            self.inner.drop_if_hung_up(&mut state);
            if !state.pods.contains_key(uid) {
                return Ok(Delivery::Queued);
            }
            let Some(id) = state.newest().map(|c| c.id) else {
                return Ok(Delivery::Queued);
            };
            let sent = send_to(
                &self.inner,
                &mut state,
                id,
                &WorkloadRequest::del(uid),
                None,
            );
            if let Some(c) = state.conn_mut(id) {
                c.acked.remove(uid);
            }
            sent?;
        }
        self.sync(uid)
    }

    /// Releases a pod: forgotten here, `del` to every connection open (as Istio's
    /// `PodDeleted`: an older ztunnel still serving it during a rollout stops too), the newest
    /// first. `Acked` when each acked it; otherwise the first failure (every connection is
    /// still told).
    pub fn del(&self, uid: &str) -> Result<Delivery, ZdsError> {
        let mut state = self.inner.lock();
        state.pods.remove(uid);
        self.inner.drop_if_hung_up(&mut state);
        let ids: Vec<u64> = state.conns.iter().rev().map(|c| c.id).collect();
        let mut answer = match ids.is_empty() {
            true => Ok(Delivery::Queued),
            false => Ok(Delivery::Acked),
        };
        for id in ids {
            let sent = send_to(
                &self.inner,
                &mut state,
                id,
                &WorkloadRequest::del(uid),
                None,
            );
            if let Some(c) = state.conn_mut(id) {
                c.acked.remove(uid);
                c.refused.remove(uid);
            }
            if let (Err(e), Ok(_)) = (sent, &answer) {
                answer = Err(e);
            }
        }
        answer
    }

    /// What the connection serving adds holds of `uid`.
    pub fn held(&self, uid: &str) -> Held {
        let state = self.inner.lock();
        let gen = state.pods.get(uid).map(|w| w.gen);
        match state.newest() {
            None => Held {
                connection: None,
                acked: false,
                refused: None,
            },
            Some(c) => Held {
                connection: Some(c.id),
                acked: gen.is_some() && c.acked.get(uid).copied() == gen,
                refused: c.refused.get(uid).cloned(),
            },
        }
    }

    /// The pods held that the connection serving adds has not acked (none without a
    /// connection), and could be sent (their namespace is held).
    pub fn unacked(&self) -> Vec<String> {
        let state = self.inner.lock();
        let Some(c) = state.newest() else {
            return Vec::new();
        };
        state
            .pods
            .iter()
            .filter(|(uid, w)| w.netns.is_some() && c.acked.get(*uid) != Some(&w.gen))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Pods a connection open acked that are no longer held (released during its
    /// handshake): each gets a `del` (on every connection).
    pub fn release_leftovers(&self) -> Vec<(String, Result<Delivery, ZdsError>)> {
        let left: std::collections::BTreeSet<String> = {
            let state = self.inner.lock();
            state
                .conns
                .iter()
                .flat_map(|c| c.acked.keys())
                .filter(|u| !state.pods.contains_key(*u))
                .cloned()
                .collect()
        };
        left.into_iter()
            .map(|uid| {
                let sent = self.del(&uid);
                (uid, sent)
            })
            .collect()
    }

    /// Looks at each idle connection now: closed when its ztunnel hung up. Whether one is
    /// connected.
    pub fn check_alive(&self) -> bool {
        let mut state = self.inner.lock();
        self.inner.drop_if_hung_up(&mut state);
        !state.conns.is_empty()
    }

    /// The pods held, by UID.
    pub fn enrolled(&self) -> Vec<String> {
        self.inner.lock().pods.keys().cloned().collect()
    }

    /// Whether a ztunnel is connected (and has had its snapshot).
    pub fn connected(&self) -> bool {
        !self.inner.lock().conns.is_empty()
    }

    /// The connection serving adds: the newest open.
    pub fn connection(&self) -> Option<Connection> {
        self.inner.lock().newest().map(Connection::of)
    }

    /// Every connection open, oldest first (the last serves adds): two during ztunnel's
    /// rollout.
    pub fn open(&self) -> Vec<Connection> {
        self.inner.lock().conns.iter().map(Connection::of).collect()
    }

    /// Connections that got their snapshot so far.
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// Connections closed before they said hello (silent, or too many at once).
    pub fn closed_silent(&self) -> Closed {
        *self.inner.closed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The socket's path, removed when the server is dropped.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ZdsServer {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Sends `request` on connection `id` and waits for its answer; on a failure the
/// connection is closed (the next newest then serves adds, if it was the newest).
fn send_to(
    inner: &Inner,
    state: &mut State,
    id: u64,
    request: &WorkloadRequest,
    fd: Option<BorrowedFd<'_>>,
) -> Result<Delivery, ZdsError> {
    let Some(conn) = state.conns.iter().find(|c| c.id == id) else {
        return Ok(Delivery::Queued);
    };
    match exchange(conn.sock.as_fd(), request, fd) {
        Ok(None) => Ok(Delivery::Acked),
        Ok(Some(error)) => Err(ZdsError::Nack {
            request: request.describe(),
            error,
        }),
        Err(source) => {
            state.conns.retain(|c| c.id != id);
            tracing::warn!(
                "ZDS connection {id}: {} failed: {source}; closed it ({})",
                request.describe(),
                state.serving()
            );
            inner.changed();
            Err(ZdsError::Connection {
                request: request.describe(),
                source,
            })
        }
    }
}

/// Refuses a socket folder that is not the agent's alone (see [`ZdsServer::bind_paused`]).
fn check_folder(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    match cni_protocol::folder::own_dir(dir) {
        Ok(()) => Ok(()),
        Err(NotOwn::Io(_, e)) => Err(e),
        Err(NotOwn::Unsafe(what)) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: the ZDS socket's folder is not the agent's alone ({what}): whoever may \
                 write there can put their own socket in the agent's place and receive every \
                 pod's network namespace; make it and its parents writable by root alone \
                 (chmod 0755, owned by root; a shared parent such as /tmp must be sticky)",
                dir.display()
            ),
        )),
    }
}
