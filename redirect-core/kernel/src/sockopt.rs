//! Socket options `std` does not offer, shared by the validation probe and the test kit.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::sys::socket::{getsockopt, sockopt, SockaddrIn, SockaddrIn6};

/// `SO_ORIGINAL_DST` (v4: `SOL_IP`; v6: `SOL_IPV6` / `IP6T_SO_ORIGINAL_DST`, also 80): the
/// destination the client asked for before NAT. Fails (`ENOENT`) when the connection has no
/// conntrack entry. `v6` is the family of the accepted socket.
pub fn original_dst(fd: &impl AsFd, v6: bool) -> io::Result<SocketAddr> {
    Ok(if v6 {
        SockaddrIn6::from(getsockopt(fd, sockopt::Ip6tOriginalDst)?).into()
    } else {
        SockaddrIn::from(getsockopt(fd, sockopt::OriginalDst)?).into()
    })
}
