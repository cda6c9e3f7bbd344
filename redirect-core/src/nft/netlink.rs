//! Talking nf_tables over netlink: one batch with an ACK checked for every message, and dumps.

use std::collections::BTreeMap;
use std::io;

use nftnl::FinalizedBatch;

use crate::error::{errno_hint, Error, Result};

const NLMSG_HDRLEN: usize = std::mem::size_of::<libc::nlmsghdr>();
const RECV_BUF: usize = 256 * 1024;

pub struct Socket {
    sock: mnl::Socket,
}

impl Socket {
    pub fn open() -> Result<Self> {
        let sock = mnl::Socket::new(mnl::Bus::Netfilter).map_err(|e| Error::Netlink {
            op: "open netfilter socket",
            hint: errno_hint(e.raw_os_error().unwrap_or(0)),
            source: e,
        })?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        // Many ACKs come back at once for a large batch: give them room, and never wait forever.
        let size: libc::c_int = 8 * 1024 * 1024;
        let tv = libc::timeval {
            tv_sec: 10,
            tv_usec: 0,
        };
        unsafe {
            let p = &size as *const _ as *const libc::c_void;
            let n = std::mem::size_of_val(&size) as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, p, n) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, p, n);
            }
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of_val(&tv) as libc::socklen_t,
            );
        }
        Ok(Socket { sock })
    }

    /// Send a batch and check one answer for every sequence number in `expect`. `describe`
    /// names the message of a sequence number for the error.
    pub fn send_batch(
        &self,
        batch: &FinalizedBatch,
        describe: &dyn Fn(u32) -> String,
    ) -> Result<()> {
        self.send_whole(batch).map_err(|e| Error::Netlink {
            op: "send nf_tables batch",
            hint: errno_hint(e.raw_os_error().unwrap_or(0)),
            source: e,
        })?;
        let seqs = batch.sequence_numbers();
        let mut pending: BTreeMap<u32, ()> = seqs.clone().map(|s| (s, ())).collect();
        let mut first_error: Option<(u32, i32)> = None;
        let mut buf = vec![0u8; RECV_BUF];
        let portid = self.sock.portid();
        while !pending.is_empty() {
            let n = match self.sock.recv_raw(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && first_error.is_some() => break,
                Err(e) => {
                    return Err(Error::Netlink {
                        op: "receive nf_tables acknowledgements",
                        hint: errno_hint(e.raw_os_error().unwrap_or(0)),
                        source: e,
                    })
                }
            };
            for (hdr, payload) in messages(&buf[..n]) {
                if hdr.nlmsg_pid != portid && hdr.nlmsg_pid != 0 {
                    continue;
                }
                if hdr.nlmsg_type as i32 == libc::NLMSG_ERROR {
                    let errno = error_of(payload);
                    pending.remove(&hdr.nlmsg_seq);
                    if errno != 0 && first_error.is_none() {
                        first_error = Some((hdr.nlmsg_seq, errno));
                    }
                }
            }
            // After an error the kernel aborts the batch; answers for the rest may not come.
            if first_error.is_some() && pending.iter().all(|(s, _)| *s > first_error.unwrap().0) {
                break;
            }
        }
        if let Some((seq, errno)) = first_error {
            return Err(Error::NftRejected {
                what: describe(seq),
                errno,
                source: io::Error::from_raw_os_error(errno),
                hint: errno_hint(errno),
            });
        }
        Ok(())
    }

    /// Send every page of a batch in ONE sendmsg: the kernel commits what one message buffer
    /// holds between BEGIN and END, so a batch split over several sends would not be atomic
    /// (and its later parts would be refused). The send buffer is grown to fit, as nft does.
    fn send_whole(&self, batch: &FinalizedBatch) -> io::Result<()> {
        let pages: Vec<&[u8]> = batch.iter().collect();
        let total: usize = pages.iter().map(|p| p.len()).sum();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.sock);
        let want = (total + 64 * 1024) as libc::c_int;
        unsafe {
            let p = &want as *const _ as *const libc::c_void;
            let n = std::mem::size_of_val(&want) as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, p, n) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, p, n);
            }
        }
        let mut iov: Vec<libc::iovec> = pages
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = &mut addr as *mut _ as *mut libc::c_void;
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        let sent = unsafe { libc::sendmsg(fd, &msg, 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if sent as usize != total {
            return Err(io::Error::other(format!(
                "sent {sent} of {total} bytes of the batch"
            )));
        }
        Ok(())
    }

    /// Send one dump request and collect the payloads of every answer until NLMSG_DONE.
    /// ENOENT (no such table or set) is `Ok(None)`.
    pub fn dump(&self, request: &[u8], seq: u32) -> Result<Option<Vec<Vec<u8>>>> {
        self.sock.send(request).map_err(|e| Error::Netlink {
            op: "send nf_tables dump request",
            hint: errno_hint(e.raw_os_error().unwrap_or(0)),
            source: e,
        })?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let n = self.sock.recv_raw(&mut buf).map_err(|e| Error::Netlink {
                op: "receive nf_tables dump",
                hint: errno_hint(e.raw_os_error().unwrap_or(0)),
                source: e,
            })?;
            for (hdr, payload) in messages(&buf[..n]) {
                if hdr.nlmsg_seq != seq {
                    continue;
                }
                match hdr.nlmsg_type as i32 {
                    libc::NLMSG_DONE => return Ok(Some(out)),
                    libc::NLMSG_ERROR => {
                        let errno = error_of(payload);
                        if errno == 0 {
                            continue;
                        }
                        if errno == libc::ENOENT {
                            return Ok(None);
                        }
                        return Err(Error::NftRejected {
                            what: "a dump request".into(),
                            errno,
                            source: io::Error::from_raw_os_error(errno),
                            hint: errno_hint(errno),
                        });
                    }
                    _ => {
                        let mut whole = Vec::with_capacity(NLMSG_HDRLEN + payload.len());
                        whole.extend_from_slice(header_bytes(&hdr));
                        whole.extend_from_slice(payload);
                        out.push(whole);
                    }
                }
            }
        }
    }
    /// Send one non-dump request with an ACK; `Ok(None)` when the kernel answers ENOENT.
    pub fn dump_single(&self, request: &[u8], seq: u32) -> Result<Option<()>> {
        self.sock.send(request).map_err(|e| Error::Netlink {
            op: "send nf_tables request",
            hint: errno_hint(e.raw_os_error().unwrap_or(0)),
            source: e,
        })?;
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let n = self.sock.recv_raw(&mut buf).map_err(|e| Error::Netlink {
                op: "receive nf_tables answer",
                hint: errno_hint(e.raw_os_error().unwrap_or(0)),
                source: e,
            })?;
            for (hdr, payload) in messages(&buf[..n]) {
                if hdr.nlmsg_seq != seq || hdr.nlmsg_type as i32 != libc::NLMSG_ERROR {
                    continue;
                }
                let errno = error_of(payload);
                return match errno {
                    0 => Ok(Some(())),
                    libc::ENOENT => Ok(None),
                    _ => Err(Error::NftRejected {
                        what: "a get request".into(),
                        errno,
                        source: io::Error::from_raw_os_error(errno),
                        hint: errno_hint(errno),
                    }),
                };
            }
        }
    }
}

/// The errno of an NLMSG_ERROR payload (0 for an ACK).
fn error_of(payload: &[u8]) -> i32 {
    payload
        .get(..4)
        .map(|b| -i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(libc::EPROTO)
}

fn header_bytes(h: &libc::nlmsghdr) -> &[u8] {
    unsafe { std::slice::from_raw_parts(h as *const _ as *const u8, NLMSG_HDRLEN) }
}

/// Split a receive buffer into (header, payload) pairs.
fn messages(mut buf: &[u8]) -> Vec<(libc::nlmsghdr, &[u8])> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let hdr: libc::nlmsghdr = unsafe { std::ptr::read_unaligned(buf.as_ptr() as *const _) };
        let len = hdr.nlmsg_len as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            break;
        }
        out.push((hdr, &buf[NLMSG_HDRLEN..len]));
        let aligned = (len + 3) & !3;
        buf = &buf[aligned.min(buf.len())..];
    }
    out
}
