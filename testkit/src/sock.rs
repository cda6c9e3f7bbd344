//! Thin, checked wrappers over the socket calls the kit needs that `std` does not offer
//! (socket options before bind, `IP_PKTINFO`, interface flags, `SO_ORIGINAL_DST`).

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A new socket of the address family of `addr` (close-on-exec; nonblocking if asked).
pub(crate) fn socket(v6: bool, ty: libc::c_int, nonblocking: bool) -> io::Result<OwnedFd> {
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    let mut flags = ty | libc::SOCK_CLOEXEC;
    if nonblocking {
        flags |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: socket() has no memory arguments; a non-negative result is a new descriptor we own.
    let fd = cvt(unsafe { libc::socket(domain, flags, 0) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn set_int_opt(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a live c_int of the given length.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub(crate) fn bind_to_device(fd: RawFd, ifname: &str) -> io::Result<()> {
    // SAFETY: the option value is the interface name's bytes with their exact length.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            ifname.as_ptr().cast(),
            ifname.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub(crate) fn to_raw(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

pub(crate) fn bind(fd: RawFd, addr: &SocketAddr) -> io::Result<()> {
    let (storage, len) = to_raw(addr);
    // SAFETY: storage holds a valid sockaddr of length len.
    cvt(unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) })
        .map(drop)
}

pub(crate) fn listen(fd: RawFd) -> io::Result<()> {
    // SAFETY: no memory arguments.
    cvt(unsafe { libc::listen(fd, 128) }).map(drop)
}

/// Starts a connect; returns Ok(true) when already connected, Ok(false) when in progress.
pub(crate) fn connect_start(fd: RawFd, addr: &SocketAddr) -> io::Result<bool> {
    let (storage, len) = to_raw(addr);
    // SAFETY: storage holds a valid sockaddr of length len.
    let ret = unsafe { libc::connect(fd, (&storage as *const libc::sockaddr_storage).cast(), len) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Waits until `fd` has one of `events`; Ok(false) on timeout.
pub(crate) fn wait_for(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one live pollfd.
        let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        return Ok(ret > 0);
    }
}

pub(crate) fn take_error(fd: RawFd) -> io::Result<Option<io::Error>> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are live and sized for SO_ERROR.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok((value != 0).then(|| io::Error::from_raw_os_error(value)))
}

pub(crate) fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, integer flags only.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(drop)
}

/// Sets `IFF_UP` on the interface `name` of the calling thread's network namespace.
pub(crate) fn set_link_up(name: &str) -> io::Result<()> {
    let fd = socket(false, libc::SOCK_DGRAM, false)?;
    // SAFETY: ifreq is plain old data; zeroed is valid.
    let mut ifr: libc::ifreq = unsafe { mem::zeroed() };
    if name.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: ioctl with a live ifreq, as SIOCGIFFLAGS/SIOCSIFFLAGS expect.
    unsafe {
        cvt(libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr))?;
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        cvt(libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr))?;
    }
    Ok(())
}

/// The unspecified address of a family.
pub(crate) fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

/// Receives one datagram with its destination address (IP_PKTINFO / IPV6_PKTINFO).
pub(crate) fn recv_with_dst(
    fd: RawFd,
    v6: bool,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
    let mut iov = [io::IoSliceMut::new(buf)];
    let mut cmsg = if v6 {
        nix::cmsg_space!(libc::in6_pktinfo)
    } else {
        nix::cmsg_space!(libc::in_pktinfo)
    };
    let msg = recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())
        .map_err(io::Error::from)?;
    let mut dst = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(info) => {
                dst = Some(IpAddr::V4(Ipv4Addr::from(
                    info.ipi_addr.s_addr.to_ne_bytes(),
                )));
            }
            ControlMessageOwned::Ipv6PacketInfo(info) => {
                dst = Some(IpAddr::V6(Ipv6Addr::from(info.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    let from = msg
        .address
        .and_then(|a| {
            if let Some(a4) = a.as_sockaddr_in() {
                Some(SocketAddr::V4(SocketAddrV4::new(a4.ip(), a4.port())))
            } else {
                a.as_sockaddr_in6()
                    .map(|a6| SocketAddr::V6(SocketAddrV6::new(a6.ip(), a6.port(), 0, 0)))
            }
        })
        .ok_or_else(|| io::Error::other("datagram without a source address"))?;
    Ok((msg.bytes, from, dst))
}

/// Sends one datagram to `to`, from the local address `src` (IP_PKTINFO / IPV6_PKTINFO), so the
/// reply leaves from the address the request was sent to.
pub(crate) fn send_from(
    fd: RawFd,
    data: &[u8],
    to: &SocketAddr,
    src: Option<IpAddr>,
) -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
    let iov = [io::IoSlice::new(data)];
    let dest = SockaddrStorage::from(*to);
    let sent = match src {
        Some(IpAddr::V4(a)) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.octets()),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv4PacketInfo(&info)],
                MsgFlags::empty(),
                Some(&dest),
            )
        }
        Some(IpAddr::V6(a)) => {
            let info = libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                ipi6_ifindex: 0,
            };
            sendmsg(
                fd,
                &iov,
                &[ControlMessage::Ipv6PacketInfo(&info)],
                MsgFlags::empty(),
                Some(&dest),
            )
        }
        None => sendmsg(fd, &iov, &[], MsgFlags::empty(), Some(&dest)),
    };
    sent.map(drop).map_err(io::Error::from)
}

/// Where a redirected connection was headed (`SO_ORIGINAL_DST`, or `IP6T_SO_ORIGINAL_DST` for
/// IPv6), as a proxy reads it; an error when the connection was not redirected.
pub(crate) fn original_dst(fd: &impl std::os::fd::AsFd, v6: bool) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt, SockaddrIn, SockaddrIn6};
    Ok(if v6 {
        SockaddrIn6::from(getsockopt(fd, sockopt::Ip6tOriginalDst)?).into()
    } else {
        SockaddrIn::from(getsockopt(fd, sockopt::OriginalDst)?).into()
    })
}
