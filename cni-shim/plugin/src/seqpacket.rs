//! Datagrams on a `SOCK_SEQPACKET` unix socket, each with at most a few descriptors riding
//! along as `SCM_RIGHTS`: ZDS between the node agent and ztunnel, and the plugin's ambient
//! requests to the agent (a pod's network namespace travels by descriptor in both).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// One datagram as received: its bytes and the descriptors it carried.
pub struct Datagram {
    pub bytes: Vec<u8>,
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
    let mut buf = vec![0u8; max + 1];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let (len, flags, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
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
