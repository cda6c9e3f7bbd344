//! ZDS's door and handshakes: the listener's thread lets hellos in (`gate`: silent peers cost
//! no thread and delay no one), each hello's handshake runs on a thread of its own with its own
//! deadlines, the snapshot sent without holding the server's lock, so a peer that stops
//! answering delays no other; between connections, each idle one is watched for ztunnel's
//! hang-up.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cni_protocol::gate::{self, Closed, Limits};
use cni_protocol::seqpacket::{self, Datagram};
use prost::Message;

use crate::proto::{WorkloadInfo, WorkloadRequest, ZdsHello, VERSION_V1};
use crate::state::{bad, exchange, Conn, Inner, State, MAX_OPEN};
use crate::wire;

/// Connections that have not said hello, held at once (the oldest closed past that).
const WAITING_HELLOS: usize = 8;
/// Handshakes in flight at once: ztunnel is one process (two during its rollout).
const HANDSHAKES: usize = 4;
/// How often an idle connection is looked at for ztunnel's hang-up (and hellos that came while
/// the agent was starting are let in).
const LIVENESS: Duration = Duration::from_millis(100);

/// The listener's thread: hellos let in by the door, each handshake on a thread of its own;
/// the idle connections watched in between.
pub(super) fn door(inner: &Arc<Inner>, listener: &OwnedFd) {
    let limits = Limits {
        waiting: WAITING_HELLOS,
        first_datagram: inner.deadline,
        max: wire::MAX_DATAGRAM,
        tick: LIVENESS,
    };
    // Hellos that came while the agent was still learning its pods, oldest first.
    let parked = std::cell::RefCell::new(std::collections::VecDeque::new());
    let first = |sock: OwnedFd, hello: io::Result<Datagram>| {
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        match hello {
            Err(e) => tracing::warn!("ZDS connection {id} dropped before its hello: {e}"),
            Ok(hello) if inner.serving.load(Ordering::Relaxed) => {
                start_handshake(inner, id, sock, hello)
            }
            Ok(hello) => {
                let mut parked = parked.borrow_mut();
                parked.push_back((id, sock, hello));
                if parked.len() > HANDSHAKES {
                    parked.pop_front();
                }
            }
        }
    };
    let tick = |closed: Closed| {
        if inner.serving.load(Ordering::Relaxed) {
            for (id, sock, hello) in parked.borrow_mut().drain(..) {
                start_handshake(inner, id, sock, hello);
            }
        }
        inner.liveness();
        let mut seen = inner.closed.lock().unwrap_or_else(|p| p.into_inner());
        if closed != *seen {
            tracing::warn!(
                "ZDS: {} connection(s) closed before their hello ({} to make room, {} at the \
                 {:?} deadline); a ztunnel says hello as soon as it connects",
                closed.evicted + closed.timed_out - seen.evicted - seen.timed_out,
                closed.evicted - seen.evicted,
                closed.timed_out - seen.timed_out,
                inner.deadline
            );
            *seen = closed;
        }
    };
    gate::serve(listener, limits, &inner.stop, first, tick);
}

/// Runs the handshake of connection `id` on a thread of its own, unless too many are under
/// way.
fn start_handshake(inner: &Arc<Inner>, id: u64, sock: OwnedFd, hello: Datagram) {
    if inner.handshakes.fetch_add(1, Ordering::AcqRel) >= HANDSHAKES {
        inner.handshakes.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(
            "ZDS connection {id} dropped: {HANDSHAKES} handshakes are already under way"
        );
        return;
    }
    let for_thread = inner.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("zds-hello-{id}"))
        .spawn(move || {
            if let Err(e) = handshake(&for_thread, id, sock, &hello) {
                tracing::warn!("ZDS connection {id} dropped: {e}");
            }
            for_thread.handshakes.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        inner.handshakes.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!("ZDS connection {id} dropped: no thread for its handshake: {e}");
    }
}

/// A connection's hello, then the snapshot: every pod held, sent without the server's lock
/// (a ztunnel that stops answering holds up no one), then under the lock what changed
/// meanwhile and `SnapshotSent`; then it joins the connections open as the newest, the one
/// that serves adds (the older ones stay open: during ztunnel's rollout both are connected).
fn handshake(inner: &Inner, id: u64, sock: OwnedFd, hello: &Datagram) -> io::Result<()> {
    seqpacket::set_timeouts(&sock, inner.deadline)?;
    let version = hello_version(hello)?;
    let copy = copy_of(&inner.lock(), |_, _| true);
    let mut conn = Conn {
        id,
        sock,
        since: SystemTime::now(),
        acked: HashMap::new(),
        refused: HashMap::new(),
    };
    for (uid, info, fd, gen) in &copy {
        send_one(&mut conn, uid, info, fd.as_ref(), *gen)?;
    }
    let mut state = inner.lock();
    catch_up(&mut conn, &state, &copy)?;
    if let Some(error) = exchange(conn.sock.as_fd(), &WorkloadRequest::snapshot_sent(), None)? {
        return Err(bad(&format!("a nack of snapshot-sent: {error}")));
    }
    let (held, refused) = (state.pods.len(), conn.refused.len());
    state.conns.push(conn);
    let closed = match state.conns.len() > MAX_OPEN {
        true => Some(state.conns.remove(0).id),
        false => None,
    };
    let older: Vec<String> = state.conns[..state.conns.len() - 1]
        .iter()
        .map(|c| c.id.to_string())
        .collect();
    inner.connections.fetch_add(1, Ordering::Relaxed);
    drop(state);
    if let Some(old) = closed {
        tracing::warn!(
            "ZDS: more than {MAX_OPEN} connections open: the oldest, connection {old}, closed \
             (ztunnel is one process per node, two during its rollout)"
        );
    }
    tracing::info!(
        "ZDS connection {id}: ztunnel said hello (version {version}), got {held} pod(s) and \
         the end of the snapshot{}; it serves adds{}",
        match refused {
            0 => String::new(),
            n => format!("; it refused {n} (sent again on the next pass)"),
        },
        match older.len() {
            0 => String::new(),
            1 => format!(
                " (connection {} stays open for deletes, as in Istio: a ztunnel rollout)",
                older[0]
            ),
            _ => format!(
                " (connections {} stay open for deletes, as in Istio)",
                older.join(", ")
            ),
        }
    );
    inner.changed();
    Ok(())
}

/// The version of a hello this agent speaks, or why not.
fn hello_version(hello: &Datagram) -> io::Result<i32> {
    match ZdsHello::decode(hello.bytes.as_slice()) {
        Ok(h) if h.version == VERSION_V1 => Ok(h.version),
        Ok(h) => Err(bad(&format!(
            "hello with version {} (this agent speaks 1)",
            h.version
        ))),
        Err(e) => Err(bad(&format!(
            "a first datagram that is not a ZdsHello ({e})"
        ))),
    }
}

/// A pod as a snapshot sends it: its UID, who it is, a second descriptor of its namespace (or
/// none: `keep`), and the generation sent.
type Copied = (String, WorkloadInfo, Option<OwnedFd>, u64);

/// The pods held that `take` picks (by UID and generation), each with its own descriptor.
fn copy_of(state: &State, take: impl Fn(&String, u64) -> bool) -> Vec<Copied> {
    state
        .pods
        .iter()
        .filter(|(uid, w)| take(uid, w.gen))
        .map(|(uid, w)| {
            let fd = w.netns.as_ref().and_then(|f| f.try_clone().ok());
            (uid.clone(), w.info.clone(), fd, w.gen)
        })
        .collect()
}

/// Under the lock, before `SnapshotSent`: what changed while the snapshot `copy` was sent
/// (pods held since, or with a new namespace, sent; pods released since, `del`).
fn catch_up(conn: &mut Conn, state: &State, copy: &[Copied]) -> io::Result<()> {
    let sent: HashMap<&String, u64> = copy.iter().map(|(u, _, _, g)| (u, *g)).collect();
    for (uid, info, fd, gen) in &copy_of(state, |uid, gen| sent.get(uid) != Some(&gen)) {
        send_one(conn, uid, info, fd.as_ref(), *gen)?;
    }
    for (uid, ..) in copy.iter().filter(|(u, ..)| !state.pods.contains_key(u)) {
        exchange(conn.sock.as_fd(), &WorkloadRequest::del(uid), None)?;
        conn.acked.remove(uid);
    }
    Ok(())
}

/// One pod of a snapshot: `add` with its namespace, or `keep`; the answer recorded.
fn send_one(
    conn: &mut Conn,
    uid: &str,
    info: &WorkloadInfo,
    fd: Option<&OwnedFd>,
    gen: u64,
) -> io::Result<()> {
    let request = match fd {
        Some(_) => WorkloadRequest::add(uid, info.clone()),
        None => WorkloadRequest::keep(uid),
    };
    match exchange(conn.sock.as_fd(), &request, fd.map(|f| f.as_fd()))? {
        None => {
            conn.acked.insert(uid.to_owned(), gen);
        }
        Some(error) => {
            // ztunnel keeps serving the rest; the pod is sent again on the next pass.
            tracing::warn!(
                "ZDS connection {}: ztunnel refused {}: {error}",
                conn.id,
                request.describe()
            );
            conn.refused.insert(uid.to_owned(), error);
        }
    }
    Ok(())
}
