//! The agent's ZDS server against a ztunnel of our own that speaks the protocol
//! (`FakeZtunnel`): the hello and the snapshot, pods added and released, the namespace handed
//! over (the fake binds its listeners inside the pod through the descriptor it received, and a
//! connection from the pod lands on them), nacks, a ztunnel that hangs, reconnects, two
//! ztunnels connected at once (a rollout: adds to the newest, deletes to both), bad hellos, and
//! what the socket path may hold.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use redirect_testkit::{kernel_test, TestNetns};
use zds::proto::{Payload, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello};
use zds::server::{Delivery, ZdsError, ZdsServer};
use zds::wire;

const QUICK: Duration = Duration::from_millis(300);

/// A ztunnel of our own: connects, says hello, reads requests and answers them as told.
struct FakeZtunnel {
    sock: OwnedFd,
}

impl FakeZtunnel {
    fn connect(path: &Path) -> FakeZtunnel {
        let sock = cni_protocol::seqpacket::connect(path, Duration::from_secs(10)).unwrap();
        FakeZtunnel { sock }
    }

    fn hello(path: &Path) -> FakeZtunnel {
        let z = FakeZtunnel::connect(path);
        z.send(&ZdsHello { version: 1 }.encode_to_vec());
        z
    }

    fn send(&self, bytes: &[u8]) {
        wire::send(self.sock.as_fd(), bytes, None).unwrap();
    }

    fn next(&self) -> (WorkloadRequest, Vec<OwnedFd>) {
        let d = wire::recv(self.sock.as_fd()).expect("a request from the agent");
        (WorkloadRequest::decode(d.bytes.as_slice()).unwrap(), d.fds)
    }

    fn answer(&self, r: WorkloadResponse) {
        self.send(&r.encode_to_vec());
    }

    /// Reads and acks the snapshot; returns its requests up to (without) `SnapshotSent`.
    fn snapshot(&self) -> Vec<(WorkloadRequest, Vec<OwnedFd>)> {
        let mut out = Vec::new();
        loop {
            let (r, fds) = self.next();
            self.answer(WorkloadResponse::ack());
            if matches!(r.payload, Some(Payload::SnapshotSent(_))) {
                return out;
            }
            out.push((r, fds));
        }
    }

    /// Whether the agent closed this connection.
    fn closed(&self) -> bool {
        matches!(wire::recv(self.sock.as_fd()), Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof)
    }

    /// Whether the agent neither sent anything on this connection nor closed it (looked at
    /// for 100 ms).
    fn idle(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(100u8)).unwrap() == 0
    }

    /// Reads one request and acks it: the request.
    fn ack_next(&self) -> WorkloadRequest {
        let (r, _) = self.next();
        self.answer(WorkloadResponse::ack());
        r
    }
}

fn info(name: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: name.into(),
        namespace: "shop".into(),
        service_account: "web".into(),
    }
}

fn socket_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("ztunnel.sock")
}

fn netns_fd(ns: &TestNetns) -> OwnedFd {
    File::open(ns.path()).unwrap().into()
}

fn uid_of(r: &WorkloadRequest) -> String {
    match &r.payload {
        Some(Payload::Add(a)) => a.uid.clone(),
        Some(Payload::Keep(k)) => k.uid.clone(),
        Some(Payload::Del(d)) => d.uid.clone(),
        other => panic!("not a pod request: {other:?}"),
    }
}

fn wait_connected(server: &ZdsServer, n: u64) {
    cni_testkit::eventually(
        "the fake ztunnel connected",
        Duration::from_secs(10),
        || (server.connected() && server.connections() >= n).then_some(()),
    );
}

/// Listeners bound in the namespace of `fd` (entered by a thread of their own), as ztunnel
/// binds its in-pod listeners.
fn listeners_in(fd: OwnedFd, ports: &[u16]) -> Vec<TcpListener> {
    let ports = ports.to_vec();
    std::thread::spawn(move || {
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        ports
            .iter()
            .map(|p| TcpListener::bind(("127.0.0.1", *p)).unwrap())
            .collect()
    })
    .join()
    .unwrap()
}

#[kernel_test]
fn the_snapshot_hands_each_pod_with_its_namespace_and_connections_land_on_ztunnels_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let pods: Vec<TestNetns> = (0..2).map(|_| TestNetns::with_prefix("rdzds")).collect();
    for (i, ns) in pods.iter().enumerate() {
        ns.sh("ip link set lo up");
        // No ztunnel yet: enrolled, queued for the snapshot.
        let sent = server.add(&format!("uid-{i}"), info(&format!("web-{i}")), netns_fd(ns));
        assert_eq!(sent.unwrap(), Delivery::Queued);
    }
    server.keep("uid-kept", info("old-0"));

    let z = FakeZtunnel::hello(&socket_path(&dir));
    let snapshot = z.snapshot();
    let uids: Vec<String> = snapshot.iter().map(|(r, _)| uid_of(r)).collect();
    assert_eq!(uids, ["uid-0", "uid-1", "uid-kept"]);
    let (add, fds) = &snapshot[0];
    match &add.payload {
        Some(Payload::Add(a)) => assert_eq!(a.workload_info, Some(info("web-0"))),
        other => panic!("{other:?}"),
    }
    assert_eq!(fds.len(), 1, "exactly one descriptor with an add");
    assert!(matches!(snapshot[2].0.payload, Some(Payload::Keep(_))));
    assert!(snapshot[2].1.is_empty(), "no descriptor with a keep");

    // The descriptor is pod 0's namespace: listeners bound through it take pod 0's connections.
    let mut snapshot = snapshot;
    let fd = snapshot[0].1.pop().unwrap();
    let listeners = listeners_in(fd, &[15001, 15006, 15008, 15053]);
    for (l, port) in listeners.iter().zip([15001u16, 15006, 15008, 15053]) {
        let mut c = pods[0].run(move || TcpStream::connect(("127.0.0.1", port)).unwrap());
        c.write_all(b"hi").unwrap();
        let (mut s, _) = l.accept().unwrap();
        let mut got = [0u8; 2];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
    }
    // Pod 1 is another namespace: nothing listens there.
    let refused = pods[1].run(|| TcpStream::connect(("127.0.0.1", 15001)).is_err());
    assert!(refused, "pod 1 reached a listener bound in pod 0");
}

#[kernel_test]
fn pods_added_and_released_after_the_snapshot_are_acked_nacked_and_a_hung_ztunnel_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let z = FakeZtunnel::hello(&socket_path(&dir));
    assert!(z.snapshot().is_empty());
    wait_connected(&server, 1);
    let ns = TestNetns::with_prefix("rdzds");

    // Acked.
    let answered = std::thread::scope(|s| {
        let t = s.spawn(|| {
            let (r, fds) = z.next();
            z.answer(WorkloadResponse::ack());
            (uid_of(&r), fds.len())
        });
        let sent = server.add("uid-a", info("web-a"), netns_fd(&ns));
        assert_eq!(sent.unwrap(), Delivery::Acked);
        t.join().unwrap()
    });
    assert_eq!(answered, ("uid-a".to_string(), 1));

    // Nacked: the error named; the pod stays held, unacked, to be sent again.
    std::thread::scope(|s| {
        s.spawn(|| {
            z.next();
            z.answer(WorkloadResponse::nack("no such pod in my cache"));
        });
        let err = server
            .add("uid-b", info("web-b"), netns_fd(&ns))
            .unwrap_err();
        assert!(matches!(err, ZdsError::Nack { .. }), "{err}");
        assert!(err.to_string().contains("no such pod in my cache"), "{err}");
        assert!(err.to_string().contains("uid-b"), "{err}");
    });
    assert_eq!(server.enrolled(), ["uid-a", "uid-b"]);
    let held = server.held("uid-b");
    assert!(!held.acked, "{held:?}");
    assert_eq!(held.refused.as_deref(), Some("no such pod in my cache"));
    assert_eq!(server.unacked(), ["uid-b"]);
    assert!(server.held("uid-a").acked);
    // Sent again: acked this time, nothing sent for the one acked already.
    std::thread::scope(|s| {
        s.spawn(|| {
            let (r, _) = z.next();
            assert_eq!(uid_of(&r), "uid-b");
            z.answer(WorkloadResponse::ack());
        });
        assert_eq!(server.sync("uid-b").unwrap(), Delivery::Acked);
    });
    assert_eq!(server.sync("uid-a").unwrap(), Delivery::Acked);
    assert!(server.unacked().is_empty());
    std::thread::scope(|s| {
        s.spawn(|| {
            z.next();
            z.answer(WorkloadResponse::ack());
        });
        assert_eq!(server.del("uid-b").unwrap(), Delivery::Acked);
    });
    // Released: del with the UID in field 2.
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let (r, _) = z.next();
            z.answer(WorkloadResponse::ack());
            r
        });
        assert_eq!(server.del("uid-a").unwrap(), Delivery::Acked);
        let r = t.join().unwrap();
        assert!(
            matches!(r.payload, Some(Payload::Del(ref d)) if d.uid == "uid-a"),
            "{r:?}"
        );
    });
    assert!(server.enrolled().is_empty());

    // Hung: reads the add, never answers. The add fails once the deadline passes, the
    // connection is closed, and the pod stays enrolled for the next connection's snapshot.
    let err = server
        .add("uid-c", info("web-c"), netns_fd(&ns))
        .unwrap_err();
    assert!(matches!(err, ZdsError::Connection { .. }), "{err}");
    assert!(err.to_string().contains("add uid-c"), "{err}");
    assert!(!server.connected());
    let (r, _) = z.next();
    assert_eq!(uid_of(&r), "uid-c", "the hung ztunnel had the request");
    assert!(z.closed(), "the hung connection was closed");
    let z2 = FakeZtunnel::hello(&socket_path(&dir));
    let again: Vec<String> = z2.snapshot().iter().map(|(r, _)| uid_of(r)).collect();
    assert_eq!(again, ["uid-c"]);
}

/// ztunnel's rollout: a second ztunnel connects while the first runs on. Both stay open (a
/// new connection used to close the old, and real ztunnel reconnects at once: the two evicted
/// each other); the second gets the whole snapshot with fresh descriptors and serves adds,
/// the first gets none; a `del` goes to both (as Istio's `PodDeleted`); `readd` to the newest
/// alone. When the newest goes, the first serves adds again: what it acked still counts, what
/// it never had is unacked and sent to it.
#[kernel_test]
fn a_second_connection_serves_adds_the_first_stays_open_for_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let ns = TestNetns::with_prefix("rdzds");
    for uid in ["uid-0", "uid-1"] {
        server.add(uid, info(uid), netns_fd(&ns)).unwrap();
    }
    let first = FakeZtunnel::hello(&socket_path(&dir));
    assert_eq!(first.snapshot().len(), 2);
    wait_connected(&server, 1);
    let second = FakeZtunnel::hello(&socket_path(&dir));
    let snap = second.snapshot();
    assert_eq!(snap.len(), 2);
    assert!(snap.iter().all(|(_, fds)| fds.len() == 1));
    wait_connected(&server, 2);
    let open: Vec<u64> = server.open().iter().map(|c| c.id).collect();
    assert_eq!(open.len(), 2, "both connections open: {open:?}");
    assert!(
        first.idle(),
        "the first connection was closed or sent something"
    );
    assert_eq!(server.connection().map(|c| c.id), Some(open[1]));
    assert_eq!(server.held("uid-0").connection, Some(open[1]));
    assert!(server.held("uid-0").acked);

    // A new pod goes to the newest alone.
    std::thread::scope(|s| {
        let t = s.spawn(|| uid_of(&second.ack_next()));
        let sent = server.add("uid-2", info("uid-2"), netns_fd(&ns)).unwrap();
        assert_eq!(sent, Delivery::Acked);
        assert_eq!(t.join().unwrap(), "uid-2");
    });
    assert!(first.idle(), "the older connection was sent an add");

    // A release goes to both.
    let (to_first, to_second) = std::thread::scope(|s| {
        let (a, b) = (s.spawn(|| first.ack_next()), s.spawn(|| second.ack_next()));
        assert_eq!(server.del("uid-1").unwrap(), Delivery::Acked);
        (a.join().unwrap(), b.join().unwrap())
    });
    for r in [&to_first, &to_second] {
        assert!(
            matches!(&r.payload, Some(Payload::Del(d)) if d.uid == "uid-1"),
            "{r:?}"
        );
    }

    // readd: del then add, to the newest alone.
    let again = std::thread::scope(|s| {
        let t = s.spawn(|| [second.ack_next(), second.ack_next()]);
        assert_eq!(server.readd("uid-0").unwrap(), Delivery::Acked);
        t.join().unwrap()
    });
    assert!(
        matches!(again[0].payload, Some(Payload::Del(_))),
        "{again:?}"
    );
    assert!(
        matches!(again[1].payload, Some(Payload::Add(_))),
        "{again:?}"
    );
    assert!(first.idle(), "the older connection was sent the readd");

    // The newest goes: the first serves adds again. uid-0 it acked in its snapshot; uid-2 it
    // never had.
    drop(second);
    cni_testkit::eventually(
        "the newest's hang-up noticed",
        Duration::from_secs(5),
        || (server.open().len() == 1).then_some(()),
    );
    assert_eq!(server.connection().map(|c| c.id), Some(open[0]));
    let held = server.held("uid-0");
    assert_eq!(
        (held.connection, held.acked),
        (Some(open[0]), true),
        "{held:?}"
    );
    assert!(!server.held("uid-2").acked);
    assert_eq!(server.unacked(), ["uid-2"]);
    std::thread::scope(|s| {
        let t = s.spawn(|| uid_of(&first.ack_next()));
        assert_eq!(server.sync("uid-2").unwrap(), Delivery::Acked);
        assert_eq!(t.join().unwrap(), "uid-2");
    });
    assert!(server.unacked().is_empty());
    // The last one goes: the next request is queued, not a failure.
    drop(first);
    assert!(!server.check_alive());
    assert_eq!(server.del("uid-0").unwrap(), Delivery::Queued);
    assert_eq!(server.enrolled(), ["uid-2"]);
}

/// The older of two connections hangs up while both are idle: noticed (not only the
/// newest's hang-up), the newest serves on; whoever asked is told.
#[kernel_test]
fn an_older_connections_hang_up_is_noticed_too() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let changes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = changes.clone();
    server.on_change(move || {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let first = FakeZtunnel::hello(&socket_path(&dir));
    assert!(first.snapshot().is_empty());
    wait_connected(&server, 1);
    let second = FakeZtunnel::hello(&socket_path(&dir));
    assert!(second.snapshot().is_empty());
    wait_connected(&server, 2);
    let newest = server.connection().unwrap().id;
    let before = changes.load(std::sync::atomic::Ordering::Relaxed);
    drop(first);
    cni_testkit::eventually(
        "the older's hang-up noticed",
        Duration::from_secs(3),
        || (server.open().len() == 1).then_some(()),
    );
    assert_eq!(server.connection().map(|c| c.id), Some(newest));
    assert!(server.check_alive());
    assert!(changes.load(std::sync::atomic::Ordering::Relaxed) > before);
    assert!(second.idle());
}

/// A `del` while the older connection hangs: the newest still gets it, the hung one is closed
/// at the deadline, and the answer says so.
#[kernel_test]
fn a_del_reaches_the_newest_though_an_older_connection_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let ns = TestNetns::with_prefix("rdzds");
    server.add("uid-1", info("web-1"), netns_fd(&ns)).unwrap();
    let hung = FakeZtunnel::hello(&socket_path(&dir));
    assert_eq!(hung.snapshot().len(), 1);
    wait_connected(&server, 1);
    let newest = FakeZtunnel::hello(&socket_path(&dir));
    assert_eq!(newest.snapshot().len(), 1);
    wait_connected(&server, 2);
    let got = std::thread::scope(|s| {
        let t = s.spawn(|| newest.ack_next());
        let err = server.del("uid-1").unwrap_err();
        assert!(matches!(err, ZdsError::Connection { .. }), "{err}");
        t.join().unwrap()
    });
    assert!(matches!(got.payload, Some(Payload::Del(_))), "{got:?}");
    let (r, _) = hung.next();
    assert!(matches!(r.payload, Some(Payload::Del(_))), "{r:?}");
    assert!(hung.closed(), "the hung connection was closed");
    assert_eq!(server.open().len(), 1);
    assert!(server.connected());
}

/// More than `MAX_OPEN` connections at once: the oldest is closed, the rest stay.
#[kernel_test]
fn past_max_open_the_oldest_connection_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let mut all = Vec::new();
    for n in 1..=zds::server::MAX_OPEN + 1 {
        let z = FakeZtunnel::hello(&socket_path(&dir));
        assert!(z.snapshot().is_empty());
        wait_connected(&server, n as u64);
        all.push(z);
    }
    assert!(all[0].closed(), "the oldest stayed open");
    assert_eq!(server.open().len(), zds::server::MAX_OPEN);
    assert!(all[1..].iter().all(FakeZtunnel::idle));
}

#[kernel_test]
fn bad_hellos_are_dropped_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    // Version 2, garbage, an oversized datagram, nothing at all (the deadline).
    let v2 = FakeZtunnel::connect(&socket_path(&dir));
    v2.send(&ZdsHello { version: 2 }.encode_to_vec());
    assert!(v2.closed());
    let garbage = FakeZtunnel::connect(&socket_path(&dir));
    garbage.send(&[0xff, 0xff, 0xff]);
    assert!(garbage.closed());
    let big = FakeZtunnel::connect(&socket_path(&dir));
    nix::sys::socket::send(
        big.sock.as_raw_fd(),
        &[0u8; 2000],
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    assert!(big.closed());
    let silent = FakeZtunnel::connect(&socket_path(&dir));
    assert!(silent.closed(), "a silent peer is dropped at the deadline");
    assert_eq!(server.connections(), 0);
    let good = FakeZtunnel::hello(&socket_path(&dir));
    assert!(good.snapshot().is_empty());
    wait_connected(&server, 1);
}

#[test]
fn the_socket_path_a_stale_socket_is_replaced_anything_else_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_path(&dir);
    drop(std::os::unix::net::UnixDatagram::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket from an earlier run");
    let server = ZdsServer::bind(&path, QUICK).unwrap();
    drop(server);
    assert!(!path.exists(), "removed when the server stops");
    std::fs::write(&path, "not a socket").unwrap();
    let err = ZdsServer::bind(&path, QUICK).err().unwrap();
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

/// A ztunnel refuses a pod in its snapshot: the pod stays held and unacked; a new connection's
/// snapshot carries it and its ack counts; an ack on an older connection does not.
#[kernel_test]
fn a_refused_pod_is_unacked_until_a_connection_acks_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let ns = TestNetns::with_prefix("rdzds");
    server.set("uid-1", info("web-1"), Some(netns_fd(&ns)));
    let first = FakeZtunnel::hello(&socket_path(&dir));
    let (r, _) = first.next();
    assert_eq!(uid_of(&r), "uid-1");
    first.answer(WorkloadResponse::nack("not now"));
    let (r, _) = first.next();
    assert!(matches!(r.payload, Some(Payload::SnapshotSent(_))));
    first.answer(WorkloadResponse::ack());
    wait_connected(&server, 1);
    let held = server.held("uid-1");
    assert_eq!((held.connection, held.acked), (Some(1), false), "{held:?}");
    assert_eq!(server.unacked(), ["uid-1"]);

    let second = FakeZtunnel::hello(&socket_path(&dir));
    let snap = second.snapshot();
    assert_eq!(snap.len(), 1, "the refused pod is in the next snapshot");
    wait_connected(&server, 2);
    let held = server.held("uid-1");
    assert!(held.acked && held.refused.is_none(), "{held:?}");
    assert_ne!(held.connection, Some(1));
    assert!(server.unacked().is_empty());
    // A new namespace for the pod (a new sandbox) must be acked again.
    server.set("uid-1", info("web-1"), Some(netns_fd(&ns)));
    assert!(!server.held("uid-1").acked);
    assert_eq!(server.unacked(), ["uid-1"]);
}

/// A peer that says hello and then stops answering in the middle of its snapshot holds up no
/// other: a real ztunnel connecting meanwhile gets its whole snapshot at once.
#[kernel_test]
fn a_peer_that_stops_answering_holds_up_no_other_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), Duration::from_secs(5)).unwrap();
    let ns = TestNetns::with_prefix("rdzds");
    server.set("uid-1", info("web-1"), Some(netns_fd(&ns)));
    let stuck = FakeZtunnel::hello(&socket_path(&dir));
    let (r, _) = stuck.next();
    assert_eq!(uid_of(&r), "uid-1", "the stuck peer got its first request");
    let started = std::time::Instant::now();
    let real = FakeZtunnel::hello(&socket_path(&dir));
    assert_eq!(real.snapshot().len(), 1);
    wait_connected(&server, 1);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the real ztunnel waited {took:?} behind the stuck one"
    );
    drop(stuck);
}

/// ztunnel dies while the connection is idle: noticed without any request, within the
/// liveness check's period, and whoever asked is told.
#[kernel_test]
fn a_dead_ztunnel_is_noticed_while_the_connection_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let server = ZdsServer::bind(&socket_path(&dir), QUICK).unwrap();
    let changes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = changes.clone();
    server.on_change(move || {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let z = FakeZtunnel::hello(&socket_path(&dir));
    assert!(z.snapshot().is_empty());
    wait_connected(&server, 1);
    drop(z);
    cni_testkit::eventually(
        "the dead connection noticed",
        Duration::from_secs(3),
        || (!server.connected()).then_some(()),
    );
    assert!(
        changes.load(std::sync::atomic::Ordering::Relaxed) >= 2,
        "came and went"
    );
}
