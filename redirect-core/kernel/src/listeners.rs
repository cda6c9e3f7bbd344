//! The sockets listening in a network namespace, read over sock_diag (`NETLINK_SOCK_DIAG`,
//! inet_diag) as `ss -ltun` lists them, without its binary: whether a proxy's listeners are
//! there, the proof that traffic the rules redirect has somewhere to go.
//!
//! A [`SockDiag`] is a socket of the namespace it was opened in (a netlink socket answers for
//! the namespace it was created in), so one opened in a pod is kept and asked again each pass
//! without entering the pod.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::constants::{
    AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, TCP_CLOSE, TCP_ESTABLISHED, TCP_LISTEN,
};
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr as NlAddr};

use crate::netlink::Step;
use crate::netns::Netns;

/// Why the listening sockets could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespace could not be entered to open the socket there.
    #[error(transparent)]
    Netns(#[from] crate::netns::Error),
    /// The netlink socket failed (open, send, receive, decode).
    #[error("cannot {op} (sock_diag netlink): {cause}")]
    Netlink {
        /// What was being done.
        op: &'static str,
        /// The system's error.
        cause: io::Error,
    },
    /// The kernel refused the dump.
    #[error("the kernel refused to list the {transport} sockets: {}{}", io::Error::from_raw_os_error(*.errno), hint(*.errno))]
    Refused {
        /// The sockets asked for.
        transport: Transport,
        /// The kernel's errno.
        errno: i32,
    },
}

fn hint(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT | libc::EOPNOTSUPP => {
            "; hint: the kernel lacks inet_diag for this protocol (modprobe inet_diag tcp_diag udp_diag)"
        }
        _ => "",
    }
}

/// A transport protocol a proxy listens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// TCP: sockets in `LISTEN`.
    Tcp,
    /// UDP: bound, unconnected sockets.
    Udp,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
        })
    }
}

/// One listening socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Listener {
    /// Its protocol.
    pub transport: Transport,
    /// The address and port it is bound to (`0.0.0.0` or `::` for any).
    pub addr: SocketAddr,
    /// The UID that owns it.
    pub uid: u32,
}

/// A port and protocol, as a proxy's listener is named (`15001/tcp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Port {
    /// The port.
    pub port: u16,
    /// Its protocol.
    pub transport: Transport,
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.port, self.transport)
    }
}

/// The ports of `wanted` no socket of `listening` serves, on any address or family.
pub fn missing(wanted: &[Port], listening: &[Listener]) -> Vec<Port> {
    let held: BTreeSet<Port> = listening
        .iter()
        .map(|l| Port {
            port: l.addr.port(),
            transport: l.transport,
        })
        .collect();
    wanted
        .iter()
        .copied()
        .filter(|p| !held.contains(p))
        .collect()
}

/// A sock_diag socket in the namespace it was opened in.
pub struct SockDiag {
    socket: Socket,
    seq: u32,
}

impl SockDiag {
    /// One in the calling thread's namespace.
    pub fn open() -> Result<SockDiag, Error> {
        let net = |op| move |cause| Error::Netlink { op, cause };
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(net("open a socket"))?;
        socket.bind_auto().map_err(net("bind the socket"))?;
        socket
            .connect(&NlAddr::new(0, 0))
            .map_err(net("connect the socket"))?;
        Ok(SockDiag { socket, seq: 0 })
    }

    /// One in `netns` (created there, on a thread that entered it).
    pub fn open_in(netns: &Netns) -> Result<SockDiag, Error> {
        netns.run(SockDiag::open)?
    }

    /// Every listening socket of `transport`, IPv4 and IPv6.
    pub fn listening(&mut self, transport: Transport) -> Result<Vec<Listener>, Error> {
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            out.extend(self.dump(transport, family)?);
        }
        Ok(out)
    }

    /// The ports of `wanted` no socket listens on, dumping only what is needed: each
    /// protocol's IPv6 sockets first (a dual-stack `[::]` listener serves IPv4 too), its IPv4
    /// ones only while one of its ports is still missing.
    pub fn missing(&mut self, wanted: &[Port]) -> Result<Vec<Port>, Error> {
        let mut left: Vec<Port> = wanted.to_vec();
        for transport in [Transport::Tcp, Transport::Udp] {
            for family in [AF_INET6, AF_INET] {
                if !left.iter().any(|p| p.transport == transport) {
                    break;
                }
                let found = self.dump(transport, family)?;
                left = missing(&left, &found);
            }
        }
        Ok(left)
    }

    /// Every listening TCP and bound, unconnected UDP socket.
    pub fn all(&mut self) -> Result<Vec<Listener>, Error> {
        let mut out = self.listening(Transport::Tcp)?;
        out.extend(self.listening(Transport::Udp)?);
        Ok(out)
    }

    /// The TCP socket, in any state but `LISTEN`, whose local port is `port` and whose peer
    /// is `peer`: the server's end of a connection made from `peer` to a listener on `port`
    /// (in its queue, accepted, or accepted and closed already). IPv4 and IPv6 sockets are read, an IPv4
    /// address mapped into IPv6 (a dual-stack listener's) taken for the IPv4 one.
    pub fn accepted_from(
        &mut self,
        port: u16,
        peer: SocketAddr,
    ) -> Result<Option<Accepted>, Error> {
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        // Every state but LISTEN: the request socket of a handshake not yet done (SYN_RECV),
        // and one the server already accepted and closed (FIN_WAIT, TIME_WAIT...): a proxy
        // that accepts at once and cannot serve the connection closes it before we look.
        let states = StateFlags::from_bits_retain(0x1ffe & !(1 << TCP_LISTEN));
        for family in [AF_INET, AF_INET6] {
            let found = self
                .request(Transport::Tcp, family, IPPROTO_TCP, states.clone())?
                .into_iter()
                .map(|r| r.header)
                .find(|h| {
                    let id = &h.socket_id;
                    id.source_port == port
                        && id.destination_port == peer.port()
                        && id.destination_address.to_canonical() == peer.ip()
                });
            if let Some(h) = found {
                let id = &h.socket_id;
                return Ok(Some(Accepted {
                    local: SocketAddr::new(id.source_address.to_canonical(), id.source_port),
                    uid: h.uid,
                    established: h.state == TCP_ESTABLISHED,
                }));
            }
        }
        Ok(None)
    }

    fn dump(&mut self, transport: Transport, family: u8) -> Result<Vec<Listener>, Error> {
        let (protocol, states) = match transport {
            Transport::Tcp => (IPPROTO_TCP, StateFlags::from_bits_retain(1 << TCP_LISTEN)),
            // A UDP socket that is bound and not connected reads as TCP_CLOSE.
            Transport::Udp => (IPPROTO_UDP, StateFlags::from_bits_retain(1 << TCP_CLOSE)),
        };
        Ok(self
            .request(transport, family, protocol, states)?
            .into_iter()
            // An unconnected UDP socket has no peer; a connected one is no listener.
            .filter(|r| transport == Transport::Tcp || r.header.socket_id.destination_port == 0)
            .map(|r| Listener {
                transport,
                addr: SocketAddr::new(
                    r.header.socket_id.source_address,
                    r.header.socket_id.source_port,
                ),
                uid: r.header.uid,
            })
            .collect())
    }

    /// The sockets of `protocol` and `family` in `states`, dumped.
    fn request(
        &mut self,
        transport: Transport,
        family: u8,
        protocol: u8,
        states: StateFlags,
    ) -> Result<Vec<InetResponse>, Error> {
        let socket_id = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let request = SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol,
            extensions: ExtensionFlags::empty(),
            states,
            socket_id,
        });
        self.seq = self.seq.wrapping_add(1);
        let (replies, errno) =
            crate::netlink::exchange(&self.socket, self.seq, request, NLM_F_REQUEST | NLM_F_DUMP)
                .map_err(|(step, cause)| Error::Netlink {
                op: match step {
                    Step::Send => "send a dump",
                    Step::Receive => "receive the dump",
                    Step::Decode => "decode the dump",
                },
                cause,
            })?;
        match errno {
            0 => {}
            // No IPv6 in this kernel: no IPv6 sockets to list.
            libc::EAFNOSUPPORT if family == AF_INET6 => return Ok(Vec::new()),
            _ => return Err(Error::Refused { transport, errno }),
        }
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                SockDiagMessage::InetResponse(r) => Some(*r),
                _ => None,
            })
            .collect())
    }
}

/// The server's end of a connection, found by [`SockDiag::accepted_from`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Its local address: the listener's port, on the address the connection reached
    /// (`127.0.0.1:15001` for one redirected in the namespace's nat OUTPUT).
    pub local: SocketAddr,
    /// The UID that owns it (the listener's).
    pub uid: u32,
    /// It is `ESTABLISHED`; `false`: still a request (`SYN_RECV`), or closed by the server.
    pub established: bool,
}
