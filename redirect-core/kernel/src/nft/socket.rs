//! The nf_tables netlink socket (`netlink-sys`): a batch sent in one `sendmsg` with an answer
//! checked for every message, requests and dumps parsed with `netlink-packet-netfilter`.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkBuffer, NetlinkMessage, NetlinkPayload, ParseableParametrized, NLMSG_DONE, NLMSG_ERROR,
    NLM_F_DUMP_INTR,
};
use netlink_packet_netfilter::nftables::NfTablesMessage;
use netlink_packet_netfilter::{NetfilterMessage, NetfilterProtoFamily};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket as NlSocket};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use super::batch::Encoded;
use super::error::{Error, Result};
use super::message;
use super::Features;
use crate::error::errno_hint;

const RECV_BUF: usize = 256 * 1024;
/// Room for the answers to a large batch, which the kernel sends all at once.
const RCVBUF: usize = 8 * 1024 * 1024;
/// Never wait forever for an answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What a refused message was, from its sequence number.
pub type Describe<'a> = &'a dyn Fn(u32) -> String;

pub struct Socket {
    sock: NlSocket,
    portid: u32,
    seq: Cell<u32>,
    features: Features,
}

fn netlink_err(op: &'static str) -> impl Fn(io::Error) -> Error {
    move |e| Error::Netlink {
        op,
        hint: errno_hint(e.raw_os_error().unwrap_or(0)),
        cause: e,
    }
}

pub(super) fn rejected(what: String, errno: i32) -> Error {
    Error::Rejected {
        what,
        errno,
        cause: io::Error::from_raw_os_error(errno),
        hint: errno_hint(errno),
    }
}

fn decode_err(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Netlink {
        op,
        cause: io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        hint: "",
    }
}

/// An nf_tables message as received: its type, its nfgenmsg family and the attributes after
/// the nfgenmsg. The caller parses it: with `netlink-packet-netfilter` (`parsed`), or with our
/// own parsers where the crate is slow (its list parsers format the whole list into each
/// element's error context, eagerly: quadratic in a dump message's size).
pub struct Raw {
    pub msg_type: u8,
    pub family: u8,
    pub payload: Vec<u8>,
}

impl Raw {
    pub fn parsed(&self) -> Result<NfTablesMessage> {
        NfTablesMessage::parse_with_param(&self.payload[..], self.msg_type)
            .map_err(|e| decode_err("parse an nf_tables message", e))
    }
}

/// One received message, as far as we need it.
enum Received {
    /// An answer: 0 for an ACK, else an errno.
    Answer {
        seq: u32,
        errno: i32,
    },
    Done {
        seq: u32,
    },
    Message {
        seq: u32,
        interrupted: bool,
        msg: Raw,
    },
    Other,
}

impl Socket {
    /// A socket in the calling thread's network namespace, for a kernel with `features`.
    pub fn open(features: Features) -> Result<Self> {
        let mut sock =
            NlSocket::new(NETLINK_NETFILTER).map_err(netlink_err("open netfilter socket"))?;
        let addr = sock
            .bind_auto()
            .map_err(netlink_err("bind netfilter socket"))?;
        if setsockopt(&sock, sockopt::RcvBufForce, &RCVBUF).is_err() {
            // Without CAP_NET_ADMIN the kernel caps this at rmem_max; still worth asking.
            let _ = setsockopt(&sock, sockopt::RcvBuf, &RCVBUF);
        }
        setsockopt(
            &sock,
            sockopt::ReceiveTimeout,
            &TimeVal::new(TIMEOUT.as_secs() as _, 0),
        )
        .map_err(|e| netlink_err("set netfilter socket timeout")(e.into()))?;
        Ok(Socket {
            sock,
            portid: addr.port_number(),
            seq: Cell::new(1),
            features,
        })
    }

    /// What the kernel at the other end does (the batches built for it must match).
    pub fn features(&self) -> Features {
        self.features
    }

    /// `n` fresh sequence numbers; returns the first.
    fn take_seqs(&self, n: u32) -> u32 {
        let first = self.seq.get();
        self.seq.set(first.wrapping_add(n));
        first
    }

    /// The first sequence number a batch built now should use (`send_batch` moves past it).
    pub fn next_seq(&self) -> u32 {
        self.seq.get()
    }

    fn recv_into(&self, buf: &mut Vec<u8>, op: &'static str) -> Result<()> {
        buf.clear();
        self.sock.recv(buf, 0).map_err(netlink_err(op))?;
        Ok(())
    }

    /// Split a datagram into the messages we care about; messages for other ports are skipped.
    fn parse(&self, mut buf: &[u8], op: &'static str) -> Result<Vec<Received>> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let nl = NetlinkBuffer::new_checked(buf).map_err(|e| decode_err(op, e))?;
            let len = nl.length() as usize;
            let (seq, pid, ty, flags) = (
                nl.sequence_number(),
                nl.port_number(),
                nl.message_type(),
                nl.flags(),
            );
            let whole = &buf[..len];
            buf = &buf[((len + 3) & !3).min(buf.len())..];
            if pid != self.portid && pid != 0 {
                continue;
            }
            out.push(match ty {
                NLMSG_ERROR => {
                    let m = NetlinkMessage::<NetfilterMessage>::deserialize(whole)
                        .map_err(|e| decode_err(op, e))?;
                    let errno = match m.payload {
                        NetlinkPayload::Error(e) => e.code.map_or(0, |c| -c.get()),
                        _ => libc::EPROTO,
                    };
                    Received::Answer { seq, errno }
                }
                NLMSG_DONE => Received::Done { seq },
                // nf_tables messages: subsystem 10 in the type's high byte.
                _ if ty >> 8 == 10 && whole.len() >= 20 => Received::Message {
                    seq,
                    interrupted: flags & NLM_F_DUMP_INTR != 0,
                    msg: Raw {
                        msg_type: ty as u8,
                        family: whole[16],
                        payload: whole[20..].to_vec(),
                    },
                },
                _ => Received::Other,
            });
        }
        Ok(out)
    }

    /// Send a batch and check the answer to every message that asked for one. `describe`
    /// names the message of a sequence number for the error. The first refusal is returned.
    pub fn send_batch(&self, batch: &Encoded, describe: Describe) -> Result<()> {
        match self.send_batch_answer(batch)? {
            Some((seq, errno)) => Err(rejected(describe(seq), errno)),
            None => Ok(()),
        }
    }

    /// One `sendmsg` of the whole batch (the send buffer must hold it, as nft ensures).
    fn send_whole(&self, batch: &Encoded) -> Result<()> {
        let bytes = batch.bytes();
        let want = bytes.len() + 64 * 1024;
        if setsockopt(&self.sock, sockopt::SndBufForce, &want).is_err() {
            let _ = setsockopt(&self.sock, sockopt::SndBuf, &want);
        }
        let sent = self
            .sock
            .send(bytes, 0)
            .map_err(netlink_err("send nf_tables batch"))?;
        if sent != bytes.len() {
            return Err(netlink_err("send nf_tables batch")(io::Error::other(
                format!("sent {sent} of {} bytes of the batch", bytes.len()),
            )));
        }
        if let Some((last, _)) = batch.labels().last() {
            self.seq.set(self.seq.get().max(last.wrapping_add(1)));
        }
        Ok(())
    }

    /// Send a batch; the first refusal, as (sequence number, errno), or `None` when the kernel
    /// took it whole.
    pub fn send_batch_answer(&self, batch: &Encoded) -> Result<Option<(u32, i32)>> {
        self.send_whole(batch)?;
        let mut pending: BTreeSet<u32> = batch.labels().iter().map(|(s, _)| *s).collect();
        let mut first_error: Option<(u32, i32)> = None;
        let mut buf = Vec::with_capacity(RECV_BUF);
        while !pending.is_empty() {
            if let Err(e) = self.recv_into(&mut buf, "receive nf_tables answers") {
                // After a refusal the kernel aborts the batch; answers for the rest may not
                // come, and the timeout ends the wait.
                if first_error.is_some() {
                    break;
                }
                return Err(e);
            }
            for r in self.parse(&buf, "receive nf_tables answers")? {
                if let Received::Answer { seq, errno } = r {
                    let ours = pending.remove(&seq) || seq == batch.begin_seq();
                    if ours && errno != 0 && first_error.is_none() {
                        first_error = Some((seq, errno));
                    }
                    // Refused as a whole, before any message was looked at: nothing follows.
                    if errno != 0 && seq == batch.begin_seq() {
                        pending.clear();
                    }
                }
            }
            if let Some((seq, _)) = first_error {
                if pending.iter().all(|s| *s > seq) {
                    break;
                }
            }
        }
        Ok(first_error)
    }

    /// Send a check-only batch (no end: `Batch::check_only`) and return every refusal, as
    /// (sequence number, errno). The kernel handles the batch within `sendmsg`, so every
    /// answer is queued when it returns: they are read without waiting.
    pub fn check_batch(&self, batch: &Encoded) -> Result<Vec<(u32, i32)>> {
        self.send_whole(batch)?;
        let mut pending: BTreeSet<u32> = batch.labels().iter().map(|(s, _)| *s).collect();
        let mut refused = Vec::new();
        let mut buf = Vec::with_capacity(RECV_BUF);
        while !pending.is_empty() {
            buf.clear();
            match self.sock.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(netlink_err("receive nf_tables answers")(e)),
            }
            for r in self.parse(&buf, "receive nf_tables answers")? {
                if let Received::Answer { seq, errno } = r {
                    if (pending.remove(&seq) || seq == batch.begin_seq()) && errno != 0 {
                        refused.push((seq, errno));
                    }
                }
            }
        }
        Ok(refused)
    }

    /// A request answered by one message (and an ACK); `Ok(None)` when the kernel answers
    /// ENOENT.
    pub fn request(&self, msg: NfTablesMessage, what: &str) -> Result<Option<NfTablesMessage>> {
        let seq = self.take_seqs(1);
        let mut req = Vec::new();
        message::write_nft(&mut req, msg, message::flags::GET, seq);
        self.sock
            .send(&req, 0)
            .map_err(netlink_err("send nf_tables request"))?;
        let mut answer = None;
        let mut buf = Vec::with_capacity(RECV_BUF);
        loop {
            self.recv_into(&mut buf, "receive nf_tables answer")?;
            for r in self.parse(&buf, "receive nf_tables answer")? {
                match r {
                    Received::Message { seq: s, msg, .. } if s == seq => {
                        answer = Some(msg.parsed()?)
                    }
                    Received::Answer { seq: s, errno } if s == seq => {
                        return match errno {
                            0 => Ok(answer),
                            libc::ENOENT => Ok(None),
                            _ => Err(rejected(format!("a request for {what}"), errno)),
                        };
                    }
                    _ => {}
                }
            }
        }
    }

    /// A dump of our `inet` table's objects.
    pub fn dump_ours(&self, msg: NfTablesMessage, what: &str) -> Result<Option<Vec<Raw>>> {
        self.dump(NetfilterProtoFamily::Inet, msg, what)
    }

    /// A dump: every message until NLMSG_DONE, unparsed. `Ok(None)`
    /// when the kernel answers ENOENT (no such table or set); an EINTR refusal when the
    /// ruleset changed during the dump, which the caller may try again.
    pub fn dump(
        &self,
        family: NetfilterProtoFamily,
        msg: NfTablesMessage,
        what: &str,
    ) -> Result<Option<Vec<Raw>>> {
        let seq = self.take_seqs(1);
        let mut req = Vec::new();
        message::write(&mut req, family, 0, msg, message::flags::DUMP, seq);
        self.sock
            .send(&req, 0)
            .map_err(netlink_err("send nf_tables dump request"))?;
        let mut out = Vec::new();
        let mut interrupted = false;
        let mut buf = Vec::with_capacity(RECV_BUF);
        loop {
            self.recv_into(&mut buf, "receive nf_tables dump")?;
            for r in self.parse(&buf, "receive nf_tables dump")? {
                match r {
                    Received::Message {
                        seq: s,
                        interrupted: i,
                        msg,
                    } if s == seq => {
                        interrupted |= i;
                        out.push(msg);
                    }
                    Received::Done { seq: s } if s == seq => {
                        if interrupted {
                            return Err(rejected(
                                format!("a dump of {what} (interrupted by a concurrent change)"),
                                libc::EINTR,
                            ));
                        }
                        return Ok(Some(out));
                    }
                    Received::Answer { seq: s, errno } if s == seq && errno != 0 => {
                        return match errno {
                            libc::ENOENT => Ok(None),
                            _ => Err(rejected(format!("a dump of {what}"), errno)),
                        };
                    }
                    _ => {}
                }
            }
        }
    }
}
