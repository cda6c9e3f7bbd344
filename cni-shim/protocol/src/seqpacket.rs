//! Datagrams on a `SOCK_SEQPACKET` unix socket, each with at most a few descriptors riding
//! along as `SCM_RIGHTS`: ZDS between the node agent and ztunnel, and the plugin's ambient
//! requests to the agent (a pod's network namespace travels by descriptor in both).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use std::path::Path;
use std::time::Duration;

use nix::sys::socket::{
    accept4, bind, connect as connect_to, listen as listen_on, recvmsg, sendmsg, setsockopt,
    socket, sockopt, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// A socket connected to the listener at `path`, each send and receive (and the connect, when
/// the listener's backlog is full) bounded by `timeout`.
pub fn connect(path: &Path, timeout: Duration) -> io::Result<OwnedFd> {
    let sock = seqpacket()?;
    set_timeouts(&sock, timeout)?;
    connect_to(sock.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(sock)
}

/// A socket listening at `path` (which must be free), whose `accept` waits at most `poll`: the
/// accepting thread sees its stop flag that often.
pub fn listen(path: &Path, backlog: i32, poll: Duration) -> io::Result<OwnedFd> {
    let sock = seqpacket()?;
    bind(sock.as_raw_fd(), &UnixAddr::new(path)?)?;
    listen_on(&sock, Backlog::new(backlog)?)?;
    setsockopt(&sock, sockopt::ReceiveTimeout, &timeval(poll))?;
    Ok(sock)
}

/// A socket listening at `path` (which must be free), its file made mode 0600 before it
/// listens, whatever the process's umask (no one else may connect, even for an instant), and
/// non-blocking: [`accept`] returns `None` at once when no connection waits (a poll loop
/// serves it).
pub fn listen_private(path: &Path, backlog: i32) -> io::Result<OwnedFd> {
    use std::os::unix::fs::PermissionsExt;
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    bind(sock.as_raw_fd(), &UnixAddr::new(path)?)?;
    // Connecting needs write permission on the file; before listen() nobody can connect.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listen_on(&sock, Backlog::new(backlog)?)?;
    Ok(sock)
}

/// The next connection; `None` when none came within the listener's wait.
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        Ok(raw) => Ok(Some(unsafe { OwnedFd::from_raw_fd(raw) })),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Bounds each send and receive on `sock` by `t`.
pub fn set_timeouts(sock: &OwnedFd, t: Duration) -> io::Result<()> {
    setsockopt(sock, sockopt::ReceiveTimeout, &timeval(t))?;
    setsockopt(sock, sockopt::SendTimeout, &timeval(t))?;
    Ok(())
}

fn timeval(t: Duration) -> nix::sys::time::TimeVal {
    nix::sys::time::TimeVal::new(t.as_secs() as i64, t.subsec_micros() as i64)
}

/// One datagram as received: its bytes and the descriptors it carried.
pub struct Datagram {
    /// The message.
    pub bytes: Vec<u8>,
    /// The descriptors that rode along (`SCM_RIGHTS`), now owned by the receiver.
    pub fds: Vec<OwnedFd>,
}

/// Sends `bytes` (one message, at most `max` bytes) with `fd` attached when given.
pub fn send(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
    max: usize,
) -> io::Result<()> {
    if bytes.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a {}-byte message, over the {max} bytes allowed",
                bytes.len()
            ),
        ));
    }
    let iov = [IoSlice::new(bytes)];
    let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage> = match raw.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&raw)],
    };
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(io::Error::other(format!(
            "sent {sent} of {} bytes",
            bytes.len()
        )));
    }
    Ok(())
}

/// Receives one datagram (waiting as the socket's receive timeout says). The peer closing the
/// connection is `UnexpectedEof`; a datagram over `max` bytes or with more than two
/// descriptors is `InvalidData` (its descriptors are closed).
pub fn recv(sock: BorrowedFd<'_>, max: usize) -> io::Result<Datagram> {
    recv_with(sock, max, MsgFlags::empty())
}

/// [`recv`] that does not wait: `WouldBlock` when no datagram is there.
pub fn try_recv(sock: BorrowedFd<'_>, max: usize) -> io::Result<Datagram> {
    recv_with(sock, max, MsgFlags::MSG_DONTWAIT)
}

fn recv_with(sock: BorrowedFd<'_>, max: usize, flags: MsgFlags) -> io::Result<Datagram> {
    let mut buf = vec![0u8; max + 1];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let (len, flags, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | flags,
        )?;
        let mut fds = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: the kernel just installed these descriptors in this process for this
                // message; nothing else owns them.
                fds.extend(
                    received
                        .into_iter()
                        .map(|f| unsafe { OwnedFd::from_raw_fd(f) }),
                );
            }
        }
        (msg.bytes, msg.flags, fds)
    };
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a datagram over {max} bytes or with too many descriptors"),
        ));
    }
    if len == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the connection",
        ));
    }
    buf.truncate(len);
    Ok(Datagram { bytes: buf, fds })
}
