//! A synthetic connection through a namespace's capture: the proof that its rules, its routes
//! and a proxy's listener agree. Inside the namespace, a TCP connection is opened with a
//! deadline to an address the rules capture (a documentation address, RFC 5737 or RFC 3849,
//! that nothing serves); redirected to the proxy's listener, its handshake completes in the
//! namespace, and nothing leaves it. Then sock_diag, in the same namespace, finds the socket
//! on the listener's port whose peer is our connection's local address: the connection
//! landed there, and nowhere else. The connection is reset at once (`SO_LINGER` 0: no
//! `TIME_WAIT` left in the namespace); the proxy sees one connection it cannot serve.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::listeners::{Accepted, SockDiag};
use crate::netns::Netns;

/// The IPv4 target: TEST-NET-1's `192.0.2.1`, port 9 (discard).
pub const TARGET_V4: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 9);
/// The IPv6 target: `[2001:db8::1]:9` (the documentation prefix).
pub const TARGET_V6: SocketAddr = SocketAddr::new(
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
    9,
);
/// How long the handshake may take: over loopback it takes microseconds.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// The target for a namespace with an IPv4 address ([`TARGET_V4`]), or IPv6 only.
pub fn target(ipv4: bool) -> SocketAddr {
    if ipv4 {
        TARGET_V4
    } else {
        TARGET_V6
    }
}

/// How one synthetic connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It landed on the listener's port: the server's end found, the target its original
    /// destination.
    Ok {
        /// The address connected to (the original destination).
        target: SocketAddr,
        /// Our end's local address.
        from: SocketAddr,
        /// The server's end, on the listener's port.
        landed: Accepted,
    },
    /// Refused (a reset): the rules sent it to a port nothing listens on.
    Refused {
        /// The address connected to.
        target: SocketAddr,
        /// The port it was meant to land on.
        port: u16,
    },
    /// No answer within the deadline: the rules or routes sent it elsewhere (out of the
    /// namespace, or to nothing).
    TimedOut {
        /// The address connected to.
        target: SocketAddr,
        /// The deadline.
        after: Duration,
    },
    /// The namespace has no route to the target (the capture never ran: the kernel routes
    /// before the nat OUTPUT hook).
    NoRoute {
        /// The address connected to.
        target: SocketAddr,
        /// The system's error.
        error: String,
    },
    /// Connected, but no socket on the listener's port has it for peer: something else
    /// answered.
    LandedElsewhere {
        /// The address connected to.
        target: SocketAddr,
        /// Our end's local address.
        from: SocketAddr,
        /// The port it was meant to land on.
        port: u16,
    },
    /// The namespace could not be entered (it is gone).
    NamespaceGone(String),
    /// The check itself could not run (a socket, sock_diag).
    Failed(String),
}

impl Outcome {
    /// Whether it landed on the listener.
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok { .. })
    }

    /// The outcome in one word: `ok`, `refused`, `timed_out`, `no_route`, `landed_elsewhere`,
    /// `namespace_gone`, `failed`.
    pub fn reason(&self) -> &'static str {
        match self {
            Outcome::Ok { .. } => "ok",
            Outcome::Refused { .. } => "refused",
            Outcome::TimedOut { .. } => "timed_out",
            Outcome::NoRoute { .. } => "no_route",
            Outcome::LandedElsewhere { .. } => "landed_elsewhere",
            Outcome::NamespaceGone(_) => "namespace_gone",
            Outcome::Failed(_) => "failed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok {
                target,
                from,
                landed,
            } => write!(
                f,
                "ok: a connection to {target} from {from} landed on {} (uid {}), its original \
                 destination {target}",
                landed.local, landed.uid
            ),
            Outcome::Refused { target, port } => write!(
                f,
                "refused: a connection to {target} was reset: no listener on {port} where the \
                 rules sent it"
            ),
            Outcome::TimedOut { target, after } => write!(
                f,
                "timed out: a connection to {target} got no answer in {after:?}: the rules or \
                 routes send it elsewhere than the listener"
            ),
            Outcome::NoRoute { target, error } => {
                write!(f, "no route: a connection to {target} failed: {error}")
            }
            Outcome::LandedElsewhere { target, from, port } => write!(
                f,
                "landed elsewhere: a connection to {target} from {from} was answered, but no \
                 socket on {port} has it for peer"
            ),
            Outcome::NamespaceGone(e) => write!(f, "namespace gone: {e}"),
            Outcome::Failed(e) => write!(f, "the check could not run: {e}"),
        }
    }
}

/// Connects to `target` inside `netns` within `deadline` and proves the connection landed on
/// a socket of `port` there.
pub fn check(netns: &Netns, target: SocketAddr, port: u16, deadline: Duration) -> Outcome {
    netns
        .run(|| check_here(target, port, deadline))
        .unwrap_or_else(|e| Outcome::NamespaceGone(e.to_string()))
}

/// [`check`] in the calling thread's namespace.
pub fn check_here(target: SocketAddr, port: u16, deadline: Duration) -> Outcome {
    let stream = match TcpStream::connect_timeout(&target, deadline) {
        Ok(s) => s,
        Err(e) => return refused(target, port, deadline, &e),
    };
    // Reset at close: no TIME_WAIT left in the namespace for each check.
    let _ = nix::sys::socket::setsockopt(
        &stream,
        nix::sys::socket::sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
    let from = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => return Outcome::Failed(format!("getsockname: {e}")),
    };
    let found = SockDiag::open().and_then(|mut d| d.accepted_from(port, from));
    drop(stream);
    match found {
        Ok(Some(landed)) => Outcome::Ok {
            target,
            from,
            landed,
        },
        Ok(None) => Outcome::LandedElsewhere { target, from, port },
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The outcome of a connection that failed with `e`.
fn refused(target: SocketAddr, port: u16, after: Duration, e: &io::Error) -> Outcome {
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::ConnectionRefused, _) => Outcome::Refused { target, port },
        (io::ErrorKind::TimedOut, _) | (_, Some(libc::ETIMEDOUT)) => {
            Outcome::TimedOut { target, after }
        }
        (_, Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EADDRNOTAVAIL)) => {
            Outcome::NoRoute {
                target,
                error: e.to_string(),
            }
        }
        _ => Outcome::Failed(format!("connect to {target}: {e}")),
    }
}
