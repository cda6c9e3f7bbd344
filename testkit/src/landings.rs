//! Where whole connections land, seen from outside: TCP listeners in one or more namespaces
//! that report, for each accepted connection, their label, their port and the original
//! destination; and a client that connects from a namespace as a given UID. The demo and the
//! CNI plugin's end-to-end tests use it; the kernel tests' [`crate::Topology`] is the richer
//! kit for probe matrices.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use crate::netns::{become_ids, TestNetns};

/// One accepted connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Landing {
    /// The label of the namespace whose listener accepted it.
    pub at: &'static str,
    /// The listener's port.
    pub port: u16,
    /// `SO_ORIGINAL_DST` when the connection was NATed, else the address it was sent to.
    pub orig: SocketAddr,
}

/// Listeners sharing one report channel.
pub struct Landings {
    tx: mpsc::Sender<Landing>,
    rx: mpsc::Receiver<Landing>,
}

impl Default for Landings {
    fn default() -> Self {
        Self::new()
    }
}

const WAIT: Duration = Duration::from_secs(2);

impl Landings {
    /// No listener yet: [`Landings::listen`] adds them.
    pub fn new() -> Landings {
        let (tx, rx) = mpsc::channel();
        Landings { tx, rx }
    }

    /// Listen in `ns` (reported as `at`) on each of `ports`, all IPv4 addresses; returns once
    /// every listener is bound. The listener threads live as long as the process.
    pub fn listen(&self, ns: &TestNetns, at: &'static str, ports: &[u16]) {
        for &port in ports {
            let path = ns.path().to_path_buf();
            let tx = self.tx.clone();
            let (ready_tx, ready_rx) = mpsc::channel();
            std::thread::spawn(move || serve(path, at, port, tx, ready_tx));
            ready_rx
                .recv_timeout(Duration::from_secs(5))
                .expect("listener ready");
        }
    }

    /// Connect from `from` (as `uid`, else root) to `dst`, and where it landed; the error says
    /// why it did not (refused, timed out, or accepted by nothing that reported).
    pub fn connect(
        &self,
        from: &TestNetns,
        uid: Option<u32>,
        dst: SocketAddr,
    ) -> Result<Landing, String> {
        while self.rx.try_recv().is_ok() {}
        from.run(move || -> Result<(), String> {
            if let Some(u) = uid {
                become_ids(u, u).map_err(|e| format!("become uid {u}: {e}"))?;
            }
            let mut s =
                TcpStream::connect_timeout(&dst, WAIT).map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(WAIT))
                .map_err(|e| format!("read timeout: {e}"))?;
            let mut b = [0u8; 2];
            s.read_exact(&mut b).map_err(|e| format!("read: {e}"))
        })?;
        self.rx
            .recv_timeout(WAIT)
            .map_err(|_| "no listener reported it".to_string())
    }
}

/// One listener's thread: enter the namespace, bind, report readiness, then every connection.
fn serve(
    path: PathBuf,
    at: &'static str,
    port: u16,
    tx: mpsc::Sender<Landing>,
    ready: mpsc::Sender<()>,
) {
    let f = std::fs::File::open(&path).expect("open the namespace file");
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    let l = TcpListener::bind(("0.0.0.0", port)).expect("bind a listener");
    ready.send(()).expect("report readiness");
    for mut s in l.incoming().flatten() {
        let orig = crate::sock::original_dst(&s.as_fd(), false)
            .or_else(|_| s.local_addr())
            .expect("a local address");
        let _ = tx.send(Landing { at, port, orig });
        let _ = s.write_all(b"ok");
    }
}
