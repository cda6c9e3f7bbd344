//! The agent's side of ZDS: it listens on a `SOCK_SEQPACKET` unix socket
//! (`/var/run/ztunnel/ztunnel.sock`), ztunnel connects and says hello, and the agent sends
//! every enrolled pod (its network namespace attached) then `SnapshotSent`; after that, each
//! pod enrolled or released goes to that connection, one request in flight at a time, each
//! answered by an ack or a nack in order. A newer connection replaces an older one (ztunnel
//! restarted, or a second one during its rollout): new pods go to the newest.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::run_dir::NotOwn;
use cni_plugin::seqpacket;
use prost::Message;

use super::proto::{
    ResponsePayload, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello, VERSION_V1,
};
use super::wire;

/// ztunnel's deadline for each step; the agent uses the same.
pub const DEADLINE: Duration = Duration::from_secs(5);

/// What went wrong delivering a request to ztunnel.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    /// ztunnel answered with an error: it refused the request.
    #[error("ztunnel refused {request}: {error}")]
    Nack { request: String, error: String },
    /// The connection failed or timed out; it was closed, and ztunnel gets the pod with the
    /// snapshot of its next connection.
    #[error("ztunnel's connection failed during {request}: {source}; the connection was closed (the pod goes with the next connection's snapshot)")]
    Connection {
        request: String,
        #[source]
        source: io::Error,
    },
}

/// Where a request ended up.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    /// ztunnel acknowledged it.
    Acked,
    /// No ztunnel is connected: it goes with the next connection's snapshot.
    Queued,
}

/// An enrolled pod: who it is and, while the agent holds it, its network namespace.
struct Workload {
    info: WorkloadInfo,
    netns: Option<OwnedFd>,
}

struct Conn {
    id: u64,
    sock: OwnedFd,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<String, Workload>,
    conn: Option<Conn>,
}

struct Inner {
    state: Mutex<State>,
    deadline: Duration,
    stop: AtomicBool,
    /// Connections wait in the backlog until the agent knows every enrolled pod: a snapshot
    /// that missed one would make ztunnel drop it.
    serving: AtomicBool,
    connections: AtomicU64,
}

/// The ZDS server; dropping it stops accepting and closes the connection.
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

    /// [`ZdsServer::bind`], but ztunnel's connections wait (in the listen backlog) until
    /// [`ZdsServer::serve_connections`]: the agent first learns which pods are enrolled, so
    /// that the first snapshot holds them all. The socket's folder is made 0755 when missing
    /// and must be the agent's alone as the run directory is (`run_dir::own_dir`): whoever can
    /// replace the socket can receive every pod's namespace.
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
        // accept() waits at most this long, so that the thread sees `stop`.
        let listener = seqpacket::listen(path, 8, Duration::from_millis(200))?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            deadline,
            stop: AtomicBool::new(false),
            serving: AtomicBool::new(false),
            connections: AtomicU64::new(0),
        });
        let for_thread = inner.clone();
        let accept = std::thread::Builder::new()
            .name("zds-accept".into())
            .spawn(move || accept_loop(&for_thread, listener))?;
        Ok(ZdsServer {
            inner,
            path: path.to_owned(),
            accept: Some(accept),
        })
    }

    /// Starts answering ztunnel's connections (see [`ZdsServer::bind_paused`]).
    pub fn serve_connections(&self) {
        self.inner.serving.store(true, Ordering::Relaxed);
    }

    /// Enrolls a pod with its network namespace and sends it to ztunnel. A nack leaves it out
    /// (the caller may try again); a failed connection keeps it for the next snapshot.
    pub fn add(&self, uid: &str, info: WorkloadInfo, netns: OwnedFd) -> Result<Delivery, ZdsError> {
        let mut state = self.inner.lock();
        let request = WorkloadRequest::add(uid, info.clone());
        let result = self.inner.send(&mut state, &request, Some(netns.as_fd()));
        match &result {
            Err(ZdsError::Nack { .. }) => {
                state.pods.remove(uid);
            }
            _ => {
                state.pods.insert(
                    uid.to_owned(),
                    Workload {
                        info,
                        netns: Some(netns),
                    },
                );
            }
        }
        result
    }

    /// Enrolls a pod ztunnel already serves whose namespace the agent does not hold (after the
    /// agent's restart): snapshots carry it as `keep`.
    pub fn keep(&self, uid: &str, info: WorkloadInfo) {
        let mut state = self.inner.lock();
        state
            .pods
            .insert(uid.to_owned(), Workload { info, netns: None });
    }

    /// Releases a pod: forgotten here, `del` to ztunnel.
    pub fn del(&self, uid: &str) -> Result<Delivery, ZdsError> {
        let mut state = self.inner.lock();
        state.pods.remove(uid);
        self.inner
            .send(&mut state, &WorkloadRequest::del(uid), None)
    }

    /// The pods enrolled, by UID.
    pub fn enrolled(&self) -> Vec<String> {
        self.inner.lock().pods.keys().cloned().collect()
    }

    /// Whether a ztunnel is connected (and has had its snapshot).
    pub fn connected(&self) -> bool {
        self.inner.lock().conn.is_some()
    }

    /// Connections accepted so far (said hello and got their snapshot).
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

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

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding it leaves the map as it was between two requests.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `request` on the current connection and waits for its answer; on a failure the
    /// connection is closed.
    fn send(
        &self,
        state: &mut State,
        request: &WorkloadRequest,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Delivery, ZdsError> {
        if state.conn.as_ref().is_some_and(|c| hung_up(c.sock.as_fd())) {
            let old = state.conn.take().map_or(0, |c| c.id);
            tracing::info!("ZDS connection {old}: ztunnel closed it");
        }
        let Some(conn) = &state.conn else {
            return Ok(Delivery::Queued);
        };
        match exchange(conn.sock.as_fd(), request, fd) {
            Ok(None) => Ok(Delivery::Acked),
            Ok(Some(error)) => Err(ZdsError::Nack {
                request: request.describe(),
                error,
            }),
            Err(source) => {
                tracing::warn!(
                    "ZDS connection {}: {} failed: {source}; closing it",
                    conn.id,
                    request.describe()
                );
                state.conn = None;
                Err(ZdsError::Connection {
                    request: request.describe(),
                    source,
                })
            }
        }
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
fn exchange(
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

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("ztunnel sent {what}"))
}

/// Refuses a socket folder that is not the agent's alone (see [`ZdsServer::bind_paused`]).
fn check_folder(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    match crate::run_dir::own_dir(dir) {
        Ok(()) => Ok(()),
        Err(NotOwn::Io(_, e)) => Err(e),
        Err(NotOwn::Unsafe(what)) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: the ZDS socket's folder is {what}: whoever may write there can put their \
                 own socket in the agent's place and receive every pod's network namespace; \
                 make it the agent's alone (chmod 0755, owned by root)",
                dir.display()
            ),
        )),
    }
}

fn accept_loop(inner: &Inner, listener: OwnedFd) {
    let mut next_id = 1u64;
    while !inner.stop.load(Ordering::Relaxed) {
        if !inner.serving.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let sock = match seqpacket::accept(&listener) {
            Ok(Some(sock)) => sock,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("ZDS: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        if let Err(e) = serve(inner, id, sock) {
            tracing::warn!("ZDS connection {id} dropped: {e}");
        }
    }
}

/// A new connection: its hello, then the snapshot under the state's lock, then it becomes the
/// connection requests go to.
fn serve(inner: &Inner, id: u64, sock: OwnedFd) -> io::Result<()> {
    seqpacket::set_timeouts(&sock, inner.deadline)?;
    let hello = wire::recv(sock.as_fd())?;
    let hello = match ZdsHello::decode(hello.bytes.as_slice()) {
        Ok(h) if h.version == VERSION_V1 => h,
        Ok(h) => {
            return Err(bad(&format!(
                "hello with version {} (this agent speaks 1)",
                h.version
            )))
        }
        Err(e) => {
            return Err(bad(&format!(
                "a first datagram that is not a ZdsHello ({e})"
            )))
        }
    };
    let mut state = inner.lock();
    let mut adds = 0;
    for (uid, w) in &state.pods {
        let (request, fd) = match &w.netns {
            Some(ns) => (WorkloadRequest::add(uid, w.info.clone()), Some(ns.as_fd())),
            None => (WorkloadRequest::keep(uid), None),
        };
        if let Some(error) = exchange(sock.as_fd(), &request, fd)? {
            // ztunnel keeps serving the rest; the pod stays enrolled for its next snapshot.
            tracing::warn!(
                "ZDS connection {id}: ztunnel refused {}: {error}",
                request.describe()
            );
        }
        adds += 1;
    }
    if let Some(error) = exchange(sock.as_fd(), &WorkloadRequest::snapshot_sent(), None)? {
        return Err(bad(&format!("a nack of snapshot-sent: {error}")));
    }
    if let Some(old) = state.conn.replace(Conn { id, sock }) {
        tracing::info!("ZDS connection {id} replaces connection {}", old.id);
    }
    inner.connections.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        "ZDS connection {id}: ztunnel said hello (version {}), sent {adds} pods and the end of the snapshot",
        hello.version
    );
    Ok(())
}
