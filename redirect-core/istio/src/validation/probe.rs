//! Istio's validation probe (docs/redirect-validate.md, "The probe"), as a library call: listen on the
//! proxy's capture ports, connect from this process to 127.0.0.6:15002 (`[::6]`), and succeed
//! when a listener sees that original destination.
//!
//! Why it works (§5): a connection from the proxy's UID on `lo` to anything but 127.0.0.1 meets
//! `ISTIO_OUTPUT -o lo ! -d 127.0.0.1 ... --uid-owner 1337 -j ISTIO_IN_REDIRECT`, which every
//! config has, so it lands on the inbound capture port with original destination
//! 127.0.0.6:15002. So the probe tests "the rules are there", not what they capture.
//!
//! One thread does it all with nonblocking sockets and `poll`: nothing outlives [`run`], and the
//! probe runs in the calling thread's network namespace.

use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, connect, getsockopt, listen, setsockopt, socket, sockopt, AddressFamily, Backlog,
    SockFlag, SockType, SockaddrStorage,
};

/// What to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    /// `-p`: Envoy's outbound port; a listener opens here.
    pub envoy_port: u16,
    /// `-z`: the inbound capture port; a listener opens here.
    pub inbound_capture_port: u16,
    /// `--iptables-probe-port`: the client connects to 127.0.0.6 (`::6`) on this port.
    pub probe_port: u16,
    /// Listen on `[::1]`, bind the client to `[::1]:0` and connect to `[::6]`.
    pub ipv6: bool,
    /// `--probe-timeout`: the whole probe.
    pub timeout: Duration,
    /// A new connection attempt starts this often (Istio: 1 s).
    pub retry_interval: Duration,
}

impl ProbeSpec {
    /// Istio's ports (15001, 15006, 15002), IPv4, 5 s; a new attempt every 100 ms so that
    /// success is not held back by Istio's 1 s sleep.
    pub fn istio_default() -> Self {
        ProbeSpec {
            envoy_port: 15001,
            inbound_capture_port: 15006,
            probe_port: 15002,
            ipv6: false,
            timeout: Duration::from_secs(5),
            retry_interval: Duration::from_millis(100),
        }
    }

    /// Where the listeners open and the client binds: 127.0.0.1 or ::1.
    pub fn loopback(&self) -> IpAddr {
        if self.ipv6 {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        }
    }

    /// Where the client connects: 127.0.0.6 or ::6 (Envoy's inbound passthrough source), on
    /// `probe_port`.
    pub fn target(&self) -> SocketAddr {
        let ip = if self.ipv6 {
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6))
        } else {
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6))
        };
        SocketAddr::new(ip, self.probe_port)
    }
}

/// A listener accepted the probe's connection with the expected original destination.
#[derive(Debug)]
pub struct ProbeSuccess {
    /// The port of the listener that accepted it.
    pub listener_port: u16,
    /// Its `SO_ORIGINAL_DST`.
    pub original_dst: SocketAddr,
    /// From the start of the probe to this connection.
    pub elapsed: Duration,
    /// Connection attempts made, this one included.
    pub attempts: u32,
    /// Ports that could not be listened on (Istio logs these and carries on).
    pub listen_errors: Vec<(u16, io::Error)>,
}

/// Why the probe did not succeed.
#[derive(Debug)]
pub enum ProbeFailure {
    /// No listener could be opened (both ports taken, or no permission). Carries each port and
    /// its error.
    NoListener {
        /// Each capture port and why it could not be listened on.
        errors: Vec<(u16, io::Error)>,
    },
    /// Nothing arrived with the expected original destination before the timeout.
    Timeout {
        /// How long the probe ran.
        after: Duration,
        /// The spec's family and probe port: the client connected to 127.0.0.6 or ::6 on it.
        ipv6: bool,
        /// The spec's probe port (`--iptables-probe-port`).
        probe_port: u16,
        /// Connection attempts made.
        attempts: u32,
        /// Attempts whose connect succeeded (so something answered, but not with the expected
        /// original destination on our listeners).
        connected: u32,
        /// The ports a listener was open on.
        listening: Vec<u16>,
        /// The ports that could not be listened on, each with its error.
        listen_errors: Vec<(u16, io::Error)>,
        /// The last attempt's connect error; `None` if it connected.
        last_connect_error: Option<io::Error>,
        /// Connections that did reach a listener but with another original destination.
        wrong_destinations: Vec<SocketAddr>,
    },
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn ports(errors: &[(u16, io::Error)]) -> String {
            let each: Vec<String> = errors.iter().map(|(p, e)| format!("{p} ({e})")).collect();
            each.join(", ")
        }
        match self {
            ProbeFailure::NoListener { errors } => {
                write!(
                    f,
                    "no listener available: cannot listen on port {}",
                    ports(errors)
                )
            }
            ProbeFailure::Timeout {
                after,
                ipv6,
                probe_port,
                attempts,
                connected,
                listening,
                listen_errors,
                last_connect_error,
                wrong_destinations,
            } => {
                let probed = ProbeSpec {
                    ipv6: *ipv6,
                    probe_port: *probe_port,
                    ..ProbeSpec::istio_default()
                };
                let (target, loopback) = (probed.target(), probed.loopback());
                let listening: Vec<String> = listening.iter().map(u16::to_string).collect();
                write!(
                    f,
                    "validation timeout after {} ms: {attempts} connection attempts to {target} \
                     ({connected} connected); none reached the listeners on {loopback} port {} \
                     with that original destination",
                    after.as_millis(),
                    listening.join(", ")
                )?;
                match last_connect_error {
                    Some(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => write!(
                        f,
                        "; last attempt: connection refused by {target}: nothing redirected it \
                         to a listener"
                    )?,
                    Some(e) => write!(f, "; last attempt: connect to {target}: {e}")?,
                    None => write!(f, "; last attempt connected")?,
                }
                if !wrong_destinations.is_empty() {
                    let seen: Vec<String> =
                        wrong_destinations.iter().map(|a| a.to_string()).collect();
                    write!(
                        f,
                        "; connections arrived with other original destinations: {}",
                        seen.join(", ")
                    )?;
                }
                if !listen_errors.is_empty() {
                    write!(f, "; could not listen on port {}", ports(listen_errors))?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ProbeFailure {}

/// Runs the probe in the calling thread's network namespace and with the process's
/// credentials (the caller runs it as the proxy UID). Returns once a listener sees the
/// expected original destination, or after `spec.timeout`; no socket outlives the call.
pub fn run(spec: &ProbeSpec) -> Result<ProbeSuccess, ProbeFailure> {
    let start = Instant::now();
    let deadline = start + spec.timeout;
    let (listeners, listen_errors) = open_listeners(spec);
    if listeners.is_empty() {
        return Err(ProbeFailure::NoListener {
            errors: listen_errors,
        });
    }
    let mut tally = Tally::default();
    let success = |(listener_port, original_dst), attempts, listen_errors| ProbeSuccess {
        listener_port,
        original_dst,
        elapsed: start.elapsed(),
        attempts,
        listen_errors,
    };
    while Instant::now() < deadline {
        if let Some(found) = attempt(spec, &listeners, &mut tally, deadline) {
            return Ok(success(found, tally.attempts, listen_errors));
        }
    }
    // A connection may have been queued in the last instant.
    if let Some(found) = accept_all(&listeners, spec, &mut tally.wrong_destinations) {
        return Ok(success(found, tally.attempts, listen_errors));
    }
    Err(ProbeFailure::Timeout {
        after: start.elapsed(),
        ipv6: spec.ipv6,
        probe_port: spec.probe_port,
        attempts: tally.attempts,
        connected: tally.connected,
        listening: listeners.iter().map(|(p, _)| *p).collect(),
        listen_errors,
        last_connect_error: tally.last_connect_error,
        wrong_destinations: tally.wrong_destinations,
    })
}

/// The listeners on the proxy's capture ports, each with its port.
type Listeners = Vec<(u16, TcpListener)>;

/// The listeners on the proxy's two capture ports, and the ports that could not be opened.
fn open_listeners(spec: &ProbeSpec) -> (Listeners, Vec<(u16, io::Error)>) {
    let mut listeners = Vec::new();
    let mut listen_errors = Vec::new();
    for port in [spec.envoy_port, spec.inbound_capture_port] {
        match open_listener(SocketAddr::new(spec.loopback(), port)) {
            Ok(l) => listeners.push((port, l)),
            Err(e) => listen_errors.push((port, e)),
        }
    }
    (listeners, listen_errors)
}

/// What the attempts saw, for the failure's diagnosis.
#[derive(Default)]
struct Tally {
    attempts: u32,
    connected: u32,
    last_connect_error: Option<io::Error>,
    wrong_destinations: Vec<SocketAddr>,
}

/// One attempt, Istio's client: connect, close, sleep. Here the connect runs while the
/// listeners keep accepting, and the next attempt starts when this one's interval is over.
/// Returns the listener port and original destination when the expected one arrived.
fn attempt(
    spec: &ProbeSpec,
    listeners: &[(u16, TcpListener)],
    tally: &mut Tally,
    deadline: Instant,
) -> Option<(u16, SocketAddr)> {
    tally.attempts += 1;
    // At least 1 ms, so a zero interval cannot spin through sockets.
    let interval = spec.retry_interval.max(Duration::from_millis(1));
    let attempt_end = (Instant::now() + interval).min(deadline);
    tally.last_connect_error = None;
    let mut pending = None;
    match start_connect(spec) {
        Ok(Some(client)) => pending = Some(client),
        Ok(None) => tally.connected += 1,
        Err(e) => tally.last_connect_error = Some(e),
    }
    loop {
        if let Some(found) = accept_all(listeners, spec, &mut tally.wrong_destinations) {
            return Some(found);
        }
        let now = Instant::now();
        if now >= attempt_end {
            break;
        }
        let client_ready = wait(listeners, pending.as_ref(), attempt_end - now);
        // Once the client is ready it closes, as Istio's does.
        if let Some(client) = pending.take_if(|_| client_ready) {
            match connect_result(&client) {
                Ok(()) => tally.connected += 1,
                Err(e) => tally.last_connect_error = Some(e),
            }
        }
    }
    if pending.is_some() {
        tally.last_connect_error = Some(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {interval:?}"),
        ));
    }
    None
}

/// Waits up to `timeout` for a connection on a listener or for the pending client's connect
/// to finish; returns whether the client is ready.
fn wait(listeners: &[(u16, TcpListener)], pending: Option<&OwnedFd>, timeout: Duration) -> bool {
    let mut fds: Vec<libc::pollfd> = listeners
        .iter()
        .map(|(_, l)| pollfd(l.as_raw_fd(), libc::POLLIN))
        .chain(pending.map(|c| pollfd(c.as_raw_fd(), libc::POLLOUT)))
        .collect();
    if let Err(e) = poll(&mut fds, timeout) {
        if e.kind() != io::ErrorKind::Interrupted {
            // Only ENOMEM is possible with these descriptors: wait instead of spinning.
            std::thread::sleep(timeout);
        }
    }
    // The client's entry is the last one.
    pending.is_some() && fds.last().is_some_and(|p| p.revents != 0)
}

/// Accepts every queued connection and answers each as Istio's server does: the original port
/// as ASCII digits, then close. Returns the listener port and original destination of the first
/// connection whose original port is the probe port; the others go to `wrong`.
fn accept_all(
    listeners: &[(u16, TcpListener)],
    spec: &ProbeSpec,
    wrong: &mut Vec<SocketAddr>,
) -> Option<(u16, SocketAddr)> {
    for (port, listener) in listeners {
        loop {
            let mut stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: queue empty. Anything else (ECONNABORTED): client gone.
                Err(_) => break,
            };
            let Some(orig) = original_dst(&stream, spec.ipv6) else {
                continue;
            };
            // A few bytes into a fresh socket's buffer: never blocks. std sends with
            // MSG_NOSIGNAL, so a client that already closed cannot raise SIGPIPE.
            let _ = stream.write_all(orig.port().to_string().as_bytes());
            if orig.port() == spec.probe_port {
                return Some((*port, orig));
            }
            wrong.push(orig);
        }
    }
    None
}

/// The connection's original destination; without a conntrack entry (nothing NATed it) that
/// is simply the address it was accepted on.
fn original_dst(stream: &TcpStream, v6: bool) -> Option<SocketAddr> {
    redirect_kernel::sockopt::original_dst(stream, v6)
        .ok()
        .or_else(|| stream.local_addr().ok())
}

/// A nonblocking listener with SO_REUSEADDR and SO_REUSEPORT, as Istio opens it.
fn open_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let fd = new_socket(&addr)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    listen(&fd, Backlog::new(128)?)?;
    Ok(TcpListener::from(fd))
}

fn new_socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    Ok(socket(family, SockType::Stream, flags, None)?)
}

/// Starts one client connection: `Ok(Some(socket))` while in progress, `Ok(None)` when it
/// connected at once (and is already closed).
fn start_connect(spec: &ProbeSpec) -> io::Result<Option<OwnedFd>> {
    let target = spec.target();
    let fd = new_socket(&target)?;
    // Bound to 127.0.0.1 / ::1: left to itself, a connection to ::6 would take ::6 (on lo) as
    // its source and meet the `-s ::6 -j RETURN` passthrough rule instead of the redirect.
    bind(
        fd.as_raw_fd(),
        &SockaddrStorage::from(SocketAddr::new(spec.loopback(), 0)),
    )?;
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(target)) {
        Ok(()) => Ok(None),
        Err(Errno::EINPROGRESS) => Ok(Some(fd)),
        Err(e) => Err(e.into()),
    }
}

/// The outcome of a nonblocking connect that poll reported ready.
fn connect_result(fd: &OwnedFd) -> io::Result<()> {
    match getsockopt(fd, sockopt::SocketError)? {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// `poll(2)` for up to `timeout`, rounded up to whole milliseconds so a sub-millisecond rest
/// does not spin.
fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<()> {
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed slice of pollfd of the length passed.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
