//! `testpod ztunnel SOCKET`: a stand-in for ztunnel on the real node. It connects to the node
//! agent's ZDS socket (again and again, as ztunnel does), says hello, acknowledges every
//! request, and for each pod added binds listeners inside the pod's network namespace through
//! the descriptor it received, as ztunnel's proxy does before it acks: 15001 (outbound),
//! 15006 (inbound plaintext), 15008 (HBONE) and 15053 (DNS, TCP and UDP), which the agent
//! reads back. 15006 drops every SYN (a socket filter), so that an inbound connection the
//! rules capture never connects (kubelet's probes then pass only through the host's probe
//! SNAT). Each connection is answered and printed as `landed <port> <original
//! destination>`; `del`, and a snapshot that leaves a pod out, close its listeners.
//!
//! The messages and the datagrams are the agent's own: the `zds` crate and
//! `cni_protocol::seqpacket`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;

use cni_protocol::seqpacket;
use zds::proto::{Payload, WorkloadRequest, WorkloadResponse, ZdsHello};

/// ztunnel's limit on a datagram.
const MAX: usize = 1024;
/// The ports bound in each pod.
const PORTS: [u16; 4] = [15001, 15006, 15008, 15053];

/// A pod served: its namespace's inode and the flag that stops its listeners.
struct Served {
    netns: u64,
    stop: Arc<AtomicBool>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

pub fn run(socket_path: &str) -> i32 {
    // The pods outlive a connection (the agent restarting): the next snapshot says which stay.
    let mut pods: BTreeMap<String, Served> = BTreeMap::new();
    loop {
        if let Some(sock) = dial(socket_path) {
            println!("ztunnel: connected to {socket_path}");
            serve(&sock, &mut pods);
            println!("ztunnel: the agent closed the connection");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn dial(path: &str) -> Option<OwnedFd> {
    // No deadline: ztunnel waits for the agent's requests for as long as it is connected.
    let sock = seqpacket::connect(std::path::Path::new(path), Duration::ZERO).ok()?;
    seqpacket::send(
        sock.as_fd(),
        &ZdsHello { version: 1 }.encode_to_vec(),
        None,
        MAX,
    )
    .ok()?;
    Some(sock)
}

/// Answers the agent until it closes the connection.
fn serve(sock: &OwnedFd, pods: &mut BTreeMap<String, Served>) {
    let mut snapshot: Option<BTreeSet<String>> = Some(BTreeSet::new());
    while let Ok(d) = seqpacket::recv(sock.as_fd(), MAX) {
        let Ok(r) = WorkloadRequest::decode(d.bytes.as_slice()) else {
            println!("ztunnel: a datagram that is not a WorkloadRequest");
            return;
        };
        handle(r, d.fds, pods, &mut snapshot);
        let ack = WorkloadResponse::ack().encode_to_vec();
        if seqpacket::send(sock.as_fd(), &ack, None, MAX).is_err() {
            return;
        }
    }
}

fn handle(
    r: WorkloadRequest,
    mut fds: Vec<OwnedFd>,
    pods: &mut BTreeMap<String, Served>,
    snapshot: &mut Option<BTreeSet<String>>,
) {
    let named = |uid: &str, snapshot: &mut Option<BTreeSet<String>>| {
        if let Some(s) = snapshot.as_mut() {
            s.insert(uid.to_owned());
        }
    };
    match r.payload {
        Some(Payload::Add(a)) => {
            let info = a.workload_info.unwrap_or_default();
            let who = format!("{}/{}", info.namespace, info.name);
            println!("ztunnel: add {} {who}", a.uid);
            named(&a.uid, snapshot);
            let Some(fd) = fds.pop() else { return };
            let ino = nix::sys::stat::fstat(&fd).map(|s| s.st_ino).unwrap_or(0);
            if pods.get(&a.uid).is_some_and(|s| s.netns == ino) {
                return;
            }
            let stop = Arc::new(AtomicBool::new(false));
            bind_in(fd, who, stop.clone());
            pods.insert(a.uid, Served { netns: ino, stop });
        }
        Some(Payload::Keep(k)) => {
            println!("ztunnel: keep {}", k.uid);
            named(&k.uid, snapshot);
        }
        Some(Payload::Del(d)) => {
            println!("ztunnel: del {}", d.uid);
            pods.remove(&d.uid);
        }
        Some(Payload::SnapshotSent(_)) => {
            let named = snapshot.take().unwrap_or_default();
            pods.retain(|uid, _| named.contains(uid));
            println!("ztunnel: snapshot received, serving {} pod(s)", pods.len());
        }
        None => println!("ztunnel: an empty request"),
    }
}

/// Listeners on [`PORTS`] (and the DNS proxy's UDP socket) in the namespace of `fd`, on a
/// thread that enters it, until `stop`. Returns once they are bound: ztunnel acks a pod
/// after its proxy's listeners are up, and the agent reads them after the ack.
fn bind_in(fd: OwnedFd, who: String, stop: Arc<AtomicBool>) {
    let (bound, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Err(e) = nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET) {
            println!("ztunnel: {who}: cannot enter its namespace: {e}");
            let _ = bound.send(());
            return;
        }
        let listeners: Vec<(u16, TcpListener)> = PORTS
            .iter()
            .filter_map(|p| {
                let l =
                    TcpListener::bind(("::", *p)).or_else(|_| TcpListener::bind(("0.0.0.0", *p)));
                l.ok().map(|l| (*p, l))
            })
            .collect();
        for (port, l) in &listeners {
            if *port == 15006 {
                drop_every_packet(l);
            }
        }
        let _dns = UdpSocket::bind(("::", 15053)).or_else(|_| UdpSocket::bind(("0.0.0.0", 15053)));
        let _ = bound.send(());
        for (_, l) in &listeners {
            let _ = l.set_nonblocking(true);
        }
        while !stop.load(Ordering::Relaxed) {
            for (port, l) in &listeners {
                if let Ok((mut conn, _)) = l.accept() {
                    let line = format!("landed {port} {}", crate::original(&conn));
                    println!("ztunnel: {who} {line}");
                    let _ = writeln!(conn, "{line}");
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("ztunnel: {who}: listeners closed");
    });
    let _ = wait.recv();
}

/// A socket filter that drops every packet: a listener that is there (the agent reads it)
/// but that no connection reaches, its SYNs dropped before the handshake.
fn drop_every_packet(l: &TcpListener) {
    use std::os::fd::AsRawFd;
    // One classic BPF instruction: BPF_RET | BPF_K with 0 bytes kept.
    let mut drop = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: drop.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `drop`, both alive for the call; the kernel copies them.
    let r = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r != 0 {
        println!(
            "ztunnel: cannot attach the filter to 15006: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    #[redirect_testkit::kernel_test]
    fn the_filtered_listener_is_listed_but_never_connected_to() {
        let ns = redirect_testkit::TestNetns::with_prefix("zf");
        ns.sh("ip link set lo up");
        let (filtered, plain, _held) = ns.run(|| {
            let filtered = TcpListener::bind("127.0.0.1:15006").unwrap();
            drop_every_packet(&filtered);
            let plain = TcpListener::bind("127.0.0.1:15001").unwrap();
            let to = |p: u16| {
                let a = std::net::SocketAddr::from(([127, 0, 0, 1], p));
                TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
            };
            (to(15006), to(15001), (filtered, plain))
        });
        assert!(!filtered, "a connection reached the filtered listener");
        assert!(plain, "the plain listener refused a connection");
        assert!(
            ns.sh("ss -ltnH").contains(":15006"),
            "15006 is not listening"
        );
    }
}
