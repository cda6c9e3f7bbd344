//! ZDS datagrams on a `SOCK_SEQPACKET` unix socket: one protobuf message each, at most
//! [`MAX_DATAGRAM`] bytes, a pod's network namespace riding along as one `SCM_RIGHTS`
//! descriptor (`cni_protocol::seqpacket` does the sending and receiving).

use std::io;
use std::os::fd::BorrowedFd;

pub use cni_protocol::seqpacket::Datagram;

/// The largest datagram either side sends (ztunnel's limit).
pub const MAX_DATAGRAM: usize = 1024;

/// Sends `bytes` (one message) with `fd` attached when given.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    cni_protocol::seqpacket::send(sock, bytes, fd, MAX_DATAGRAM)
}

/// Receives one datagram of at most [`MAX_DATAGRAM`] bytes (see `cni_protocol::seqpacket::recv`).
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Datagram> {
    cni_protocol::seqpacket::recv(sock, MAX_DATAGRAM)
}
