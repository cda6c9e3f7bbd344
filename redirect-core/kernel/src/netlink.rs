//! One request and its replies on a netlink socket, whatever the family's messages (routing,
//! sock_diag): the request sent with its sequence number, the replies collected up to the end
//! of that request (NLMSG_DONE for a dump, the ACK or error otherwise), late answers to other
//! requests skipped.

use std::io;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
};
use netlink_sys::Socket;

/// Which step of an exchange failed, for the caller's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Send,
    Receive,
    Decode,
}

/// Sends `msg` with `flags` as request `seq` and returns its replies with the kernel's errno
/// (0 = success).
pub(crate) fn exchange<T>(
    socket: &Socket,
    seq: u32,
    msg: T,
    flags: u16,
) -> Result<(Vec<T>, i32), (Step, io::Error)>
where
    T: NetlinkSerializable + NetlinkDeserializable,
{
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut req = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    socket.send(&buf, 0).map_err(|e| (Step::Send, e))?;
    let mut replies = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full().map_err(|e| (Step::Receive, e))?;
        let mut rest = &datagram[..];
        while !rest.is_empty() {
            let reply = NetlinkMessage::<T>::deserialize(rest).map_err(|e| {
                let e = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
                (Step::Decode, e)
            })?;
            // Messages are 4-byte aligned (NLMSG_ALIGN); deserialize checked the length.
            let len = (reply.header.length as usize + 3) & !3;
            rest = rest.get(len..).unwrap_or_default();
            if reply.header.sequence_number != seq {
                continue; // a late answer to something else
            }
            match reply.payload {
                NetlinkPayload::InnerMessage(m) => replies.push(m),
                NetlinkPayload::Done(done) => return Ok((replies, done.code.saturating_abs())),
                NetlinkPayload::Error(e) => return Ok((replies, e.raw_code().saturating_abs())),
                _ => {}
            }
        }
    }
}
