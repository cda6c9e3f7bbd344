//! A ztunnel of our own for the agent's end-to-end tests: it connects to the agent's ZDS socket
//! (again and again, as ztunnel does), says hello, answers every request (an ack, or a nack for
//! the pods the test names), binds listeners on ztunnel's in-pod ports inside each pod added
//! (through the descriptor it received) and drops them at `del` and for the pods a snapshot
//! leaves out, as ztunnel does. A test can make it lose a pod's listeners while it goes on
//! acking (`close_listeners`), or ack some pods without ever making theirs (`hollow`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cni_protocol::seqpacket;
use nix::sys::socket::SockType;
use prost::Message;
use redirect_testkit::TestNetns;
use zds::proto::{Payload, WorkloadRequest, WorkloadResponse, ZdsHello};
use zds::wire;

/// ztunnel's in-pod ports.
pub const PORTS: [u16; 4] = [15001, 15006, 15008, 15053];
/// An address outside the pod, only for the outbound connection to be redirected.
pub const OUTSIDE: &str = "10.99.0.1:80";

/// A pod served: its namespace's identity (inode) and the listeners bound in it (TCP on
/// [`PORTS`], and the DNS proxy's UDP socket on 15053).
pub struct Served {
    pub netns: u64,
    pub listeners: Vec<TcpListener>,
    pub dns_udp: Option<UdpSocket>,
    /// The namespace, to bind the listeners again.
    fd: OwnedFd,
}

#[derive(Default)]
pub struct ZState {
    pub pods: BTreeMap<String, Served>,
    /// Pods named by the snapshot being received (ztunnel drops the others at its end).
    in_snapshot: BTreeSet<String>,
    pub snapshots: u32,
    /// Connections it made to the agent (a new one each time the agent closed the last).
    pub connections: u32,
    /// Each request, as `add <uid>`, `keep <uid>`, `del <uid>`, `snapshot-sent`.
    pub seen: Vec<String>,
    /// Adds of these pods are refused (a nack naming them).
    pub nack: BTreeSet<String>,
    /// Adds of these pods are acked, but no listener is bound for them.
    pub hollow: BTreeSet<String>,
}

/// The stand-in; dropping it closes its connection (as a killed ztunnel's is).
pub struct TestZtunnel {
    stop: Arc<AtomicBool>,
    reconnect: Arc<AtomicBool>,
    pub state: Arc<Mutex<ZState>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestZtunnel {
    pub fn start(path: &Path) -> TestZtunnel {
        TestZtunnel::nacking(path, &[])
    }

    /// A ztunnel that refuses the adds of `uids`.
    pub fn nacking(path: &Path, uids: &[&str]) -> TestZtunnel {
        let state = ZState {
            nack: uids.iter().map(|u| u.to_string()).collect(),
            ..ZState::default()
        };
        let (stop, state) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Mutex::new(state)),
        );
        let reconnect = Arc::new(AtomicBool::new(true));
        let (s, r, st, path) = (
            stop.clone(),
            reconnect.clone(),
            state.clone(),
            path.to_owned(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) && r.load(Ordering::Relaxed) {
                match connect_to(&path) {
                    Some(sock) => {
                        st.lock().unwrap().connections += 1;
                        serve(&sock, &s, &st)
                    }
                    None => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        });
        TestZtunnel {
            stop,
            reconnect,
            state,
            thread: Some(thread),
        }
    }

    /// Once its connection is closed (replaced by a newer one's), it does not connect again.
    pub fn stop_reconnecting(&self) {
        self.reconnect.store(false, Ordering::Relaxed);
    }

    /// Acks `uid`'s adds from now on without binding its listeners.
    pub fn hollow(&self, uid: &str) {
        self.state.lock().unwrap().hollow.insert(uid.to_owned());
    }

    /// Binds listeners for `uid` again at its adds.
    pub fn whole(&self, uid: &str) {
        self.state.lock().unwrap().hollow.remove(uid);
    }

    /// Closes `uid`'s listeners while it stays served (acked): a proxy that died.
    pub fn close_listeners(&self, uid: &str) {
        let mut z = self.state.lock().unwrap();
        let served = z.pods.get_mut(uid).expect("a pod served");
        served.listeners.clear();
        served.dns_udp = None;
    }

    /// Binds `uid`'s listeners again (its proxy back).
    pub fn open_listeners(&self, uid: &str) {
        let mut z = self.state.lock().unwrap();
        let served = z.pods.get_mut(uid).expect("a pod served");
        let (tcp, udp) = listeners_in(served.fd.try_clone().unwrap());
        served.listeners = tcp;
        served.dns_udp = Some(udp);
    }

    /// How many TCP listeners it holds for `uid`.
    pub fn listeners_of(&self, uid: &str) -> usize {
        let z = self.state.lock().unwrap();
        z.pods.get(uid).map_or(0, |s| s.listeners.len())
    }

    pub fn serves(&self, uid: &str) -> bool {
        self.state.lock().unwrap().pods.contains_key(uid)
    }

    /// The inode of the namespace it serves `uid` in.
    pub fn netns_of(&self, uid: &str) -> Option<u64> {
        self.state.lock().unwrap().pods.get(uid).map(|s| s.netns)
    }

    pub fn seen(&self) -> Vec<String> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn snapshots(&self) -> u32 {
        self.state.lock().unwrap().snapshots
    }

    /// Connections it made so far.
    pub fn connections(&self) -> u32 {
        self.state.lock().unwrap().connections
    }

    /// Whether a connection from `pod` to the outside lands on this ztunnel's outbound
    /// listener of pod `uid`.
    pub fn lands(&self, pod: &TestNetns, uid: &str) -> bool {
        let to: SocketAddr = OUTSIDE.parse().unwrap();
        let c = pod.run(move || TcpStream::connect_timeout(&to, Duration::from_secs(2)));
        if c.is_err() {
            return false;
        }
        let state = self.state.lock().unwrap();
        let Some(served) = state.pods.get(uid) else {
            return false;
        };
        let Some(l) = served.listeners.first() else {
            return false;
        };
        l.set_nonblocking(true).unwrap();
        (0..50).any(|_| match l.accept() {
            Ok(_) => true,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        })
    }
}

impl Drop for TestZtunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect_to(path: &Path) -> Option<OwnedFd> {
    // Reads wait 200 ms at most, so that the thread sees `stop`.
    let sock = seqpacket::connect(path, Duration::from_millis(200)).ok()?;
    wire::send(sock.as_fd(), &ZdsHello { version: 1 }.encode_to_vec(), None).ok()?;
    Some(sock)
}

/// Answers the agent until it closes the connection or the test stops this ztunnel.
fn serve(sock: &OwnedFd, stop: &AtomicBool, state: &Mutex<ZState>) {
    // A new connection's snapshot names the pods to keep: none named yet.
    state.lock().unwrap().in_snapshot.clear();
    while !stop.load(Ordering::Relaxed) {
        let d = match wire::recv(sock.as_fd()) {
            Ok(d) => d,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => return,
        };
        let r = WorkloadRequest::decode(d.bytes.as_slice()).expect("a WorkloadRequest");
        let answer = handle(&mut state.lock().unwrap(), r, d.fds);
        if wire::send(sock.as_fd(), &answer.encode_to_vec(), None).is_err() {
            return;
        }
    }
}

fn handle(z: &mut ZState, r: WorkloadRequest, mut fds: Vec<OwnedFd>) -> WorkloadResponse {
    match r.payload {
        Some(Payload::Add(a)) => {
            z.seen.push(format!("add {}", a.uid));
            if z.nack.contains(&a.uid) {
                return WorkloadResponse::nack(&format!("pod {} refused by the test", a.uid));
            }
            let fd = fds.pop().expect("an add carries the pod's namespace");
            let ino = nix::sys::stat::fstat(&fd).unwrap().st_ino;
            // The same namespace again (a new agent's snapshot): the listeners stay.
            if z.pods.get(&a.uid).is_none_or(|s| s.netns != ino) {
                z.pods.remove(&a.uid);
                let (listeners, dns_udp) = if z.hollow.contains(&a.uid) {
                    (Vec::new(), None)
                } else {
                    let (tcp, udp) = listeners_in(fd.try_clone().unwrap());
                    (tcp, Some(udp))
                };
                z.pods.insert(
                    a.uid.clone(),
                    Served {
                        netns: ino,
                        listeners,
                        dns_udp,
                        fd,
                    },
                );
            }
            z.in_snapshot.insert(a.uid);
        }
        Some(Payload::Keep(k)) => {
            z.seen.push(format!("keep {}", k.uid));
            z.in_snapshot.insert(k.uid);
        }
        Some(Payload::Del(d)) => {
            z.seen.push(format!("del {}", d.uid));
            z.pods.remove(&d.uid);
        }
        Some(Payload::SnapshotSent(_)) => {
            z.seen.push("snapshot-sent".into());
            let named = std::mem::take(&mut z.in_snapshot);
            z.pods.retain(|uid, _| named.contains(uid));
            z.snapshots += 1;
        }
        None => panic!("an empty request"),
    }
    WorkloadResponse::ack()
}

/// ztunnel's listeners, bound inside the namespace of `fd` by a thread that enters it: TCP
/// on each of [`PORTS`], UDP on the DNS proxy's.
fn listeners_in(fd: OwnedFd) -> (Vec<TcpListener>, UdpSocket) {
    std::thread::spawn(move || {
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let tcp = PORTS.iter().map(|p| listen_reusing(*p)).collect();
        (tcp, UdpSocket::from(reusing(SockType::Datagram, 15053)))
    })
    .join()
    .unwrap()
}

/// A listener on `port` of the current namespace with `SO_REUSEPORT`, as ztunnel binds its
/// in-pod listeners (`INPOD_PORT_REUSE`, on by default): during a rollout the old and the new
/// ztunnel both listen in the same pod.
fn listen_reusing(port: u16) -> TcpListener {
    let sock = reusing(SockType::Stream, port);
    nix::sys::socket::listen(&sock, nix::sys::socket::Backlog::new(128).unwrap()).unwrap();
    TcpListener::from(sock)
}

/// A socket of `kind` bound to `port` (any address) with `SO_REUSEPORT`.
fn reusing(kind: SockType, port: u16) -> OwnedFd {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockaddrIn,
    };
    let sock = socket(AddressFamily::Inet, kind, SockFlag::SOCK_CLOEXEC, None).unwrap();
    setsockopt(&sock, sockopt::ReusePort, &true).unwrap();
    bind(sock.as_raw_fd(), &SockaddrIn::new(0, 0, 0, 0, port)).unwrap();
    sock
}
