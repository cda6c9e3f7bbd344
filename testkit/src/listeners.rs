//! Listeners that answer every connection (TCP) or datagram (UDP) with one landing report line:
//! `side=<pod|peer> port=<listener port> orig=<SO_ORIGINAL_DST or -> local=<local address>`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Duration;

use super::flow::{Proto, Side};
use super::netns::{become_ids, TestNetns};
use super::sock;

/// Envoy's outbound (15001), inbound (15006), tunnel (15008) and the agent's DNS (15053) ports.
pub const CAPTURE_PORTS: [u16; 4] = [15001, 15006, 15008, 15053];
/// The agent's DNS proxy port.
pub const DNS_PROXY_PORT: u16 = 15053;

/// Which listeners to open in one namespace; every port gets a v4 socket on `0.0.0.0` and a v6
/// socket on `[::]` (`IPV6_V6ONLY`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerSpec {
    /// TCP ports.
    pub tcp: Vec<u16>,
    /// UDP ports.
    pub udp: Vec<u16>,
    /// `IP_TRANSPARENT` / `IPV6_TRANSPARENT` on the TCP listeners, so TPROXY can hand them
    /// connections for any destination.
    pub transparent: bool,
    /// The uid/gid that owns the UDP sockets on [`DNS_PROXY_PORT`], as the agent's DNS proxy
    /// (the proxy uid) would: Istio's raw-table rules put the proxy's DNS replies into conntrack
    /// zone 2 by owner, and only then are they un-NATed back to the resolver address.
    pub dns_proxy_owner: Option<(u32, u32)>,
}

impl ListenerSpec {
    /// The pod side: TCP on the capture ports, 53 and `app_ports`; UDP on 15053 and 53;
    /// transparent; the DNS proxy owned by 1337/1337.
    pub fn pod(app_ports: &[u16]) -> ListenerSpec {
        let mut tcp = CAPTURE_PORTS.to_vec();
        tcp.push(53);
        tcp.extend_from_slice(app_ports);
        ListenerSpec {
            tcp: dedup(tcp),
            udp: vec![DNS_PROXY_PORT, 53],
            transparent: true,
            dns_proxy_owner: Some((1337, 1337)),
        }
    }

    /// The peer side: TCP on `ports` and 53, UDP on 53.
    pub fn peer(ports: &[u16]) -> ListenerSpec {
        let mut tcp = ports.to_vec();
        tcp.push(53);
        ListenerSpec {
            tcp: dedup(tcp),
            udp: vec![53],
            transparent: false,
            dns_proxy_owner: None,
        }
    }
}

pub(crate) fn dedup<T: PartialEq + Copy>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

struct Sock {
    fd: OwnedFd,
    proto: Proto,
    port: u16,
    v6: bool,
}

/// Listening sockets of one namespace, served by one thread until dropped.
pub(crate) struct ListenerSet {
    stop: Option<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ListenerSet {
    fn drop(&mut self) {
        // Closing our end wakes the poll loop (EOF on its end).
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn open_one(proto: Proto, port: u16, v6: bool, transparent: bool) -> Result<OwnedFd, String> {
    let what = format!(
        "{proto} {} port {port}",
        if v6 { "[::]" } else { "0.0.0.0" }
    );
    let ty = match proto {
        Proto::Tcp => libc::SOCK_STREAM,
        Proto::Udp => libc::SOCK_DGRAM,
    };
    let fd = sock::socket(v6, ty, true).map_err(|e| format!("socket for {what}: {e}"))?;
    let raw = fd.as_raw_fd();
    let opt = |level, name, what_opt: &str| {
        sock::set_int_opt(raw, level, name, 1).map_err(|e| format!("{what_opt} on {what}: {e}"))
    };
    opt(libc::SOL_SOCKET, libc::SO_REUSEADDR, "SO_REUSEADDR")?;
    if v6 {
        opt(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, "IPV6_V6ONLY")?;
    }
    match proto {
        Proto::Tcp if transparent => {
            if v6 {
                opt(libc::SOL_IPV6, libc::IPV6_TRANSPARENT, "IPV6_TRANSPARENT")?;
            } else {
                opt(libc::SOL_IP, libc::IP_TRANSPARENT, "IP_TRANSPARENT")?;
            }
        }
        Proto::Tcp => {}
        Proto::Udp => {
            if v6 {
                opt(
                    libc::IPPROTO_IPV6,
                    libc::IPV6_RECVPKTINFO,
                    "IPV6_RECVPKTINFO",
                )?;
            } else {
                opt(libc::IPPROTO_IP, libc::IP_PKTINFO, "IP_PKTINFO")?;
            }
        }
    }
    let addr = SocketAddr::new(sock::unspecified(v6), port);
    sock::bind(raw, &addr).map_err(|e| format!("bind {what}: {e}"))?;
    if proto == Proto::Tcp {
        sock::listen(raw).map_err(|e| format!("listen {what}: {e}"))?;
    }
    Ok(fd)
}

/// Opens the listeners of `spec` inside `ns` and serves them on a thread.
pub(crate) fn start(ns: &TestNetns, side: Side, spec: &ListenerSpec) -> ListenerSet {
    let socks: Vec<Sock> = ns.run(|| {
        let mut socks = Vec::new();
        let mut open = |proto, port, v6, owner: Option<(u32, u32)>| -> Result<(), String> {
            let fd = match owner {
                // A socket's owner is its creator's: create it on a thread with those ids.
                Some((uid, gid)) => std::thread::scope(|s| {
                    s.spawn(|| {
                        become_ids(uid, gid)
                            .map_err(|e| format!("switch to uid {uid} gid {gid}: {e}"))?;
                        open_one(proto, port, v6, false)
                    })
                    .join()
                    .unwrap_or_else(|_| Err("socket thread panicked".into()))
                })?,
                None => open_one(proto, port, v6, spec.transparent)?,
            };
            socks.push(Sock {
                fd,
                proto,
                port,
                v6,
            });
            Ok(())
        };
        let result = (|| {
            for &port in &dedup(spec.tcp.iter().copied()) {
                for v6 in [false, true] {
                    open(Proto::Tcp, port, v6, None)?;
                }
            }
            for &port in &dedup(spec.udp.iter().copied()) {
                let owner = spec.dns_proxy_owner.filter(|_| port == DNS_PROXY_PORT);
                for v6 in [false, true] {
                    open(Proto::Udp, port, v6, owner)?;
                }
            }
            Ok::<(), String>(())
        })();
        if let Err(e) = result {
            panic!("cannot open {side} listeners in netns {}: {e}", ns.name());
        }
        socks
    });
    let (stop, stop_rx) = UnixStream::pair().expect("socketpair for the listener stop signal");
    let thread = std::thread::Builder::new()
        .name(format!("rdt-listen-{side}"))
        .spawn(move || serve(side, socks, stop_rx))
        .expect("spawn the listener thread");
    ListenerSet {
        stop: Some(stop),
        thread: Some(thread),
    }
}

fn serve(side: Side, socks: Vec<Sock>, stop: UnixStream) {
    let mut tcp: Vec<Option<TcpListener>> = Vec::new();
    let mut udp: Vec<Option<UdpSocket>> = Vec::new();
    let mut pollfds: Vec<libc::pollfd> = vec![libc::pollfd {
        fd: stop.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let mut meta = Vec::new();
    for s in socks {
        pollfds.push(libc::pollfd {
            fd: s.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        meta.push((s.proto, s.port, s.v6));
        match s.proto {
            Proto::Tcp => {
                tcp.push(Some(TcpListener::from(s.fd)));
                udp.push(None);
            }
            Proto::Udp => {
                tcp.push(None);
                udp.push(Some(UdpSocket::from(s.fd)));
            }
        }
    }
    let mut buf = [0u8; 2048];
    loop {
        for p in pollfds.iter_mut() {
            p.revents = 0;
        }
        // SAFETY: pollfds is a live array of pollfd of the given length.
        let ret = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, -1) };
        if ret < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!(
                "testkit {side} listeners: poll: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        if pollfds[0].revents != 0 {
            return;
        }
        for i in 1..pollfds.len() {
            if pollfds[i].revents == 0 {
                continue;
            }
            let (_, port, v6) = meta[i - 1];
            if let Some(l) = &tcp[i - 1] {
                serve_tcp(side, port, v6, l);
            }
            if let Some(u) = &udp[i - 1] {
                serve_udp(side, port, v6, u, &mut buf);
            }
        }
    }
}

fn report(side: Side, port: u16, orig: Option<SocketAddr>, local: Option<SocketAddr>) -> String {
    let show = |a: Option<SocketAddr>| a.map_or_else(|| "-".to_string(), |a| a.to_string());
    format!(
        "side={side} port={port} orig={} local={}\n",
        show(orig),
        show(local)
    )
}

fn serve_tcp(side: Side, port: u16, v6: bool, listener: &TcpListener) {
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let orig = crate::sock::original_dst(&stream, v6).ok();
                let local = stream.local_addr().ok();
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = stream.write_all(report(side, port, orig, local).as_bytes());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // ECONNABORTED and friends: the client is gone; nothing to report to.
                eprintln!("testkit {side} listener tcp/{port}: accept: {e}");
                return;
            }
        }
    }
}

fn serve_udp(side: Side, port: u16, v6: bool, socket: &UdpSocket, buf: &mut [u8]) {
    loop {
        match sock::recv_with_dst(socket.as_raw_fd(), v6, buf) {
            Ok((_, from, dst)) => {
                let local = SocketAddr::new(dst.unwrap_or_else(|| sock::unspecified(v6)), port);
                let line = report(side, port, None, Some(local));
                let src: Option<IpAddr> = dst;
                if let Err(e) = sock::send_from(socket.as_raw_fd(), line.as_bytes(), &from, src) {
                    eprintln!("testkit {side} listener udp/{port}: reply to {from}: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // ECONNREFUSED is an earlier reply's ICMP error, reported once: keep serving.
                if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                    continue;
                }
                eprintln!("testkit {side} listener udp/{port}: recv: {e}");
                return;
            }
        }
    }
}
