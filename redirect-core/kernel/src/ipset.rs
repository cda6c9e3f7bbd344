//! The kernel's IP sets (`ip_set`, netfilter subsystem 6) by name, over netlink, with no `ipset`
//! binary: whether one exists, and destroying it. Istio's ambient agent keeps the addresses
//! kubelet probes in such sets on the host (`istio-inpod-probes-v4`, `-v6`), matched by its
//! probe SNAT chain; once that chain is gone, nothing uses them.
//!
//! Each request is one nfnetlink message: `nfgenmsg` and the attributes `IPSET_ATTR_PROTOCOL`
//! (u8, the protocol version, 6 as every kernel since 3.0 accepts) and `IPSET_ATTR_SETNAME`
//! (NUL-terminated). The answer is an ack or an error; `ENOENT` means no such set.

use std::io;
use std::time::Duration;

use netlink_packet_core::{DefaultNla, NetlinkBuffer, NLMSG_ERROR};
use netlink_packet_netfilter::{NetfilterMessageInner, NetfilterProtoFamily, NetfilterSubsystem};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

/// `NFNL_SUBSYS_IPSET`.
const NFNL_SUBSYS_IPSET: u8 = 6;
/// `IPSET_CMD_DESTROY`, `IPSET_CMD_HEADER` (enum ipset_cmd).
const IPSET_CMD_DESTROY: u8 = 3;
const IPSET_CMD_HEADER: u8 = 12;
/// `IPSET_ATTR_PROTOCOL`, `IPSET_ATTR_SETNAME`.
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
/// The protocol version we speak (`IPSET_PROTOCOL_MIN`).
const IPSET_PROTOCOL: u8 = 6;
/// `IPSET_MAXNAMELEN`, the NUL included.
const IPSET_MAXNAMELEN: usize = 32;
/// `IPSET_ERR_REFERENCED`: the set is in use.
const IPSET_ERR_REFERENCED: i32 = 4100;
/// How long to wait for the kernel's answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the set `name` exists in the calling thread's network namespace.
pub fn exists(name: &str) -> io::Result<bool> {
    match request(IPSET_CMD_HEADER, name) {
        Ok(()) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Destroys the set `name`; `false` when there was none. Fails with `EBUSY` while a rule still
/// matches it.
pub fn destroy(name: &str) -> io::Result<bool> {
    match request(IPSET_CMD_DESTROY, name) {
        Ok(()) => Ok(true),
        Err(e) if absent(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// No such set, or no `ip_set` in this kernel (then there is no set either).
fn absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::EPROTONOSUPPORT) | Some(libc::EOPNOTSUPP)
    )
}

/// The request's bytes: one message of `cmd` for the set `name`, asking for an ack.
pub fn message(cmd: u8, name: &str, seq: u32) -> Vec<u8> {
    let mut set_name = name.as_bytes().to_vec();
    set_name.push(0);
    let inner: NetfilterMessageInner = NetfilterMessageInner::Other {
        subsys: NetfilterSubsystem::Other(NFNL_SUBSYS_IPSET),
        message_type: cmd,
        attributes: vec![
            DefaultNla::new(IPSET_ATTR_PROTOCOL, vec![IPSET_PROTOCOL]),
            DefaultNla::new(IPSET_ATTR_SETNAME, set_name),
        ],
    };
    let mut out = Vec::new();
    crate::nft::write_message(
        &mut out,
        NetfilterProtoFamily::IPv4,
        inner,
        // NLM_F_EXCL: without it the kernel answers "done" for a set that is not there.
        netlink_packet_core::NLM_F_ACK | netlink_packet_core::NLM_F_EXCL,
        seq,
    );
    out
}

fn request(cmd: u8, name: &str) -> io::Result<()> {
    // A destroy without a name destroys every set: never send one.
    if name.is_empty() || name.len() >= IPSET_MAXNAMELEN || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not an IP set name (1 to 31 bytes, no NUL)"),
        ));
    }
    let mut sock = Socket::new(NETLINK_NETFILTER)?;
    sock.bind_auto()?;
    nix::sys::socket::setsockopt(
        &sock,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(TIMEOUT.as_secs() as _, 0),
    )?;
    sock.send(&message(cmd, name, 1), 0)?;
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        sock.recv(&mut buf, 0)?;
        let mut at = 0;
        while at < buf.len() {
            let msg = NetlinkBuffer::new_checked(&buf[at..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = msg.length() as usize;
            if msg.message_type() == NLMSG_ERROR {
                let payload = msg.payload();
                let code = i32::from_ne_bytes(payload[..4].try_into().unwrap_or_default());
                return match -code {
                    0 => Ok(()),
                    // ip_set's own code for a set a rule still references.
                    IPSET_ERR_REFERENCED => Err(io::Error::from_raw_os_error(libc::EBUSY)),
                    c => Err(io::Error::from_raw_os_error(c)),
                };
            }
            // Another answer (a header's description) comes before the ack.
            at += (len + 3) & !3;
            if len == 0 {
                break;
            }
        }
    }
}
