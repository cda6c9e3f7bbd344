//! nf_tables' trace reports, read over netlink: a socket in a namespace joined to
//! `NFNLGRP_NFTRACE`, whose `NFT_MSG_TRACE` messages (`NFTA_TRACE_*`) become [`TraceEvent`]s,
//! one per rule a traced packet met (and per chain's end: a return or the policy). The
//! packets are marked by a trace table (`nft::trace_table`); `netlink-packet-netfilter` has no
//! trace message, so its attributes are our own type on `netlink-packet-core`'s traits.
//!
//! Also: [`send_probe`], the traced flow's first packet sent from inside a namespace (as a
//! given UID when asked).

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    emit_u32_be, parse_string, parse_u32_be, parse_u64_be, DecodeError, DefaultNla, Emitable, Nla,
    NlaBuffer, NlasIterator, Parseable,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket as NlSocket};
use serde::Serialize;

use crate::netns::Netns;

/// `NFNLGRP_NFTRACE`: the multicast group of trace reports.
pub const NFNLGRP_NFTRACE: u32 = 9;
/// `NFT_MSG_TRACE`, in subsystem `NFNL_SUBSYS_NFTABLES` (10).
const NFT_MSG_TRACE: u16 = (10 << 8) | 17;

// enum nft_trace_attributes (linux/netfilter/nf_tables.h).
const NFTA_TRACE_TABLE: u16 = 1;
const NFTA_TRACE_CHAIN: u16 = 2;
const NFTA_TRACE_RULE_HANDLE: u16 = 3;
const NFTA_TRACE_TYPE: u16 = 4;
const NFTA_TRACE_VERDICT: u16 = 5;
const NFTA_TRACE_ID: u16 = 6;
const NFTA_TRACE_NETWORK_HEADER: u16 = 8;
const NFTA_TRACE_TRANSPORT_HEADER: u16 = 9;
const NFTA_TRACE_IIF: u16 = 10;
const NFTA_TRACE_OIF: u16 = 12;
const NFTA_TRACE_MARK: u16 = 14;
const NFTA_TRACE_NFPROTO: u16 = 15;
const NFTA_TRACE_POLICY: u16 = 16;
// enum nft_verdict_attributes.
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// One `NFTA_TRACE_*` attribute: those a path needs typed, the rest kept raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceAttribute {
    /// The table's name.
    Table(String),
    /// The chain's name.
    Chain(String),
    /// The rule's handle.
    RuleHandle(u64),
    /// `NFT_TRACETYPE_*`.
    Type(u32),
    /// The verdict: its code (`NF_ACCEPT`, `NFT_JUMP`...) and, for a jump, the chain.
    Verdict(i32, Option<String>),
    /// The packet's trace id (the same for each report of one packet at one hook pass).
    Id(u32),
    /// The network header.
    NetworkHeader(Vec<u8>),
    /// The transport header.
    TransportHeader(Vec<u8>),
    /// The input interface's index.
    Iif(u32),
    /// The output interface's index.
    Oif(u32),
    /// The packet mark.
    Mark(u32),
    /// The protocol family (`NFPROTO_*`).
    NfProto(u32),
    /// The chain policy that decided the packet.
    Policy(u32),
    /// Any other attribute.
    Other(DefaultNla),
}

impl Nla for TraceAttribute {
    fn value_len(&self) -> usize {
        match self {
            TraceAttribute::Table(s) | TraceAttribute::Chain(s) => s.len() + 1,
            TraceAttribute::RuleHandle(_) => 8,
            TraceAttribute::Verdict(_, c) => {
                8 + c.as_ref().map_or(0, |c| (4 + c.len() + 1 + 3) & !3)
            }
            TraceAttribute::NetworkHeader(b) | TraceAttribute::TransportHeader(b) => b.len(),
            TraceAttribute::Other(n) => n.value_len(),
            _ => 4,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            TraceAttribute::Table(_) => NFTA_TRACE_TABLE,
            TraceAttribute::Chain(_) => NFTA_TRACE_CHAIN,
            TraceAttribute::RuleHandle(_) => NFTA_TRACE_RULE_HANDLE,
            TraceAttribute::Type(_) => NFTA_TRACE_TYPE,
            TraceAttribute::Verdict(..) => NFTA_TRACE_VERDICT | netlink_packet_core::NLA_F_NESTED,
            TraceAttribute::Id(_) => NFTA_TRACE_ID,
            TraceAttribute::NetworkHeader(_) => NFTA_TRACE_NETWORK_HEADER,
            TraceAttribute::TransportHeader(_) => NFTA_TRACE_TRANSPORT_HEADER,
            TraceAttribute::Iif(_) => NFTA_TRACE_IIF,
            TraceAttribute::Oif(_) => NFTA_TRACE_OIF,
            TraceAttribute::Mark(_) => NFTA_TRACE_MARK,
            TraceAttribute::NfProto(_) => NFTA_TRACE_NFPROTO,
            TraceAttribute::Policy(_) => NFTA_TRACE_POLICY,
            TraceAttribute::Other(n) => n.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            TraceAttribute::Table(s) | TraceAttribute::Chain(s) => {
                buf[..s.len()].copy_from_slice(s.as_bytes());
                buf[s.len()] = 0;
            }
            TraceAttribute::RuleHandle(h) => buf[..8].copy_from_slice(&h.to_be_bytes()),
            TraceAttribute::Verdict(code, chain) => {
                let mut nested: Vec<DefaultNla> = vec![DefaultNla::new(
                    NFTA_VERDICT_CODE,
                    code.to_be_bytes().to_vec(),
                )];
                if let Some(c) = chain {
                    let mut v = c.as_bytes().to_vec();
                    v.push(0);
                    nested.push(DefaultNla::new(NFTA_VERDICT_CHAIN, v));
                }
                nested.as_slice().emit(buf);
            }
            TraceAttribute::NetworkHeader(b) | TraceAttribute::TransportHeader(b) => {
                buf[..b.len()].copy_from_slice(b)
            }
            TraceAttribute::Type(v)
            | TraceAttribute::Id(v)
            | TraceAttribute::Iif(v)
            | TraceAttribute::Oif(v)
            | TraceAttribute::Mark(v)
            | TraceAttribute::NfProto(v)
            | TraceAttribute::Policy(v) => emit_u32_be(buf, *v).expect("4 bytes"),
            TraceAttribute::Other(n) => n.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for TraceAttribute {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        Ok(match buf.kind() {
            NFTA_TRACE_TABLE => TraceAttribute::Table(parse_string(v)?),
            NFTA_TRACE_CHAIN => TraceAttribute::Chain(parse_string(v)?),
            NFTA_TRACE_RULE_HANDLE => TraceAttribute::RuleHandle(parse_u64_be(v)?),
            NFTA_TRACE_TYPE => TraceAttribute::Type(parse_u32_be(v)?),
            NFTA_TRACE_VERDICT => {
                let (mut code, mut chain) = (0i32, None);
                for nla in NlasIterator::new(v) {
                    let nla = nla?;
                    match nla.kind() {
                        NFTA_VERDICT_CODE => code = parse_u32_be(nla.value())? as i32,
                        NFTA_VERDICT_CHAIN => chain = Some(parse_string(nla.value())?),
                        _ => {}
                    }
                }
                TraceAttribute::Verdict(code, chain)
            }
            NFTA_TRACE_ID => TraceAttribute::Id(parse_u32_be(v)?),
            NFTA_TRACE_NETWORK_HEADER => TraceAttribute::NetworkHeader(v.to_vec()),
            NFTA_TRACE_TRANSPORT_HEADER => TraceAttribute::TransportHeader(v.to_vec()),
            NFTA_TRACE_IIF => TraceAttribute::Iif(parse_u32_be(v)?),
            NFTA_TRACE_OIF => TraceAttribute::Oif(parse_u32_be(v)?),
            NFTA_TRACE_MARK => TraceAttribute::Mark(parse_u32_be(v)?),
            NFTA_TRACE_NFPROTO => TraceAttribute::NfProto(parse_u32_be(v)?),
            NFTA_TRACE_POLICY => TraceAttribute::Policy(parse_u32_be(v)?),
            _ => TraceAttribute::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// What a report is about (`NFT_TRACETYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// A rule matched (its verdict follows, `continue` when it has none).
    Rule,
    /// The packet came back from a chain it jumped to.
    Return,
    /// A base chain's policy decided.
    Policy,
    /// A type this reader does not know.
    Other,
}

/// One trace report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// The packet's trace id.
    pub id: u32,
    /// The table's family (`NFPROTO_*`: 1 inet).
    pub table_family: u8,
    /// The table.
    pub table: String,
    /// The chain.
    pub chain: String,
    /// The rule's handle (rule reports only).
    pub handle: Option<u64>,
    /// What the report is about.
    pub kind: TraceKind,
    /// The verdict, as nft names it (`continue`, `accept`, `drop`, `jump CHAIN`, `return`).
    pub verdict: Option<String>,
    /// The packet's family (`NFPROTO_*`: 2 IPv4, 10 IPv6).
    pub nfproto: Option<u32>,
    /// The input interface's index.
    pub iif: Option<u32>,
    /// The output interface's index.
    pub oif: Option<u32>,
    /// The packet mark.
    pub mark: Option<u32>,
    /// The packet's source and destination, from its headers, when they were reported.
    pub src: Option<SocketAddr>,
    /// See `src`.
    pub dst: Option<SocketAddr>,
}

/// A verdict code as nft prints it.
fn verdict_name(code: i32, chain: Option<String>) -> String {
    match (code, chain) {
        (0, _) => "drop".into(),
        (1, _) => "accept".into(),
        (-1, _) => "continue".into(),
        (-2, _) => "break".into(),
        (-3, Some(c)) => format!("jump {c}"),
        (-4, Some(c)) => format!("goto {c}"),
        (-5, _) => "return".into(),
        (n, _) => format!("verdict {n}"),
    }
}

/// The addresses and ports of a network and transport header.
fn endpoints(net: &[u8], th: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let (src, dst): (IpAddr, IpAddr) = match net.first()? >> 4 {
        4 if net.len() >= 20 => (
            <[u8; 4]>::try_from(&net[12..16]).ok()?.into(),
            <[u8; 4]>::try_from(&net[16..20]).ok()?.into(),
        ),
        6 if net.len() >= 40 => (
            <[u8; 16]>::try_from(&net[8..24]).ok()?.into(),
            <[u8; 16]>::try_from(&net[24..40]).ok()?.into(),
        ),
        _ => return None,
    };
    let port = |at: usize| th.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    Some((
        SocketAddr::new(src, port(0).unwrap_or(0)),
        SocketAddr::new(dst, port(2).unwrap_or(0)),
    ))
}

impl TraceEvent {
    /// A report from its attributes (`table_family` from its nfgenmsg).
    pub fn from_attributes(table_family: u8, attrs: Vec<TraceAttribute>) -> TraceEvent {
        let mut e = TraceEvent {
            id: 0,
            table_family,
            table: String::new(),
            chain: String::new(),
            handle: None,
            kind: TraceKind::Other,
            verdict: None,
            nfproto: None,
            iif: None,
            oif: None,
            mark: None,
            src: None,
            dst: None,
        };
        let (mut net, mut th) = (Vec::new(), Vec::new());
        let mut policy = None;
        for a in attrs {
            match a {
                TraceAttribute::Table(t) => e.table = t,
                TraceAttribute::Chain(c) => e.chain = c,
                TraceAttribute::RuleHandle(h) => e.handle = Some(h),
                TraceAttribute::Type(t) => {
                    e.kind = match t {
                        1 => TraceKind::Policy,
                        2 => TraceKind::Return,
                        3 => TraceKind::Rule,
                        _ => TraceKind::Other,
                    }
                }
                TraceAttribute::Verdict(code, chain) => e.verdict = Some(verdict_name(code, chain)),
                TraceAttribute::Id(i) => e.id = i,
                TraceAttribute::NetworkHeader(b) => net = b,
                TraceAttribute::TransportHeader(b) => th = b,
                TraceAttribute::Iif(i) => e.iif = Some(i),
                TraceAttribute::Oif(i) => e.oif = Some(i),
                TraceAttribute::Mark(m) => e.mark = Some(m),
                TraceAttribute::NfProto(p) => e.nfproto = Some(p),
                TraceAttribute::Policy(p) => policy = Some(p),
                TraceAttribute::Other(_) => {}
            }
        }
        if e.verdict.is_none() {
            e.verdict = policy.map(|p| verdict_name(p as i32, None));
        }
        if let Some((s, d)) = endpoints(&net, &th) {
            e.src = Some(s);
            e.dst = Some(d);
        }
        e
    }

    /// Decode one netlink message (header included); `None` when it is no trace report.
    pub fn decode(msg: &[u8]) -> Result<Option<TraceEvent>, DecodeError> {
        if msg.len() < 20 || u16::from_ne_bytes([msg[4], msg[5]]) != NFT_MSG_TRACE {
            return Ok(None);
        }
        let attrs = NlasIterator::new(&msg[20..])
            .map(|n| TraceAttribute::parse(&n?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(TraceEvent::from_attributes(msg[16], attrs)))
    }
}

/// A socket that receives the trace reports of one namespace.
pub struct TraceReader {
    sock: NlSocket,
    buf: Vec<u8>,
    pending: std::collections::VecDeque<TraceEvent>,
}

fn io_err(op: &'static str) -> impl Fn(io::Error) -> crate::nft::Error {
    move |e| crate::nft::Error::Netlink {
        op,
        hint: crate::errno_hint(e.raw_os_error().unwrap_or(0)),
        cause: e,
    }
}

impl TraceReader {
    /// Joined to `NFNLGRP_NFTRACE` in `netns` (the socket is made there; reports of that
    /// namespace only). Needs CAP_NET_ADMIN there.
    pub fn open_in(netns: &Netns) -> crate::Result<TraceReader> {
        Ok(netns.run(TraceReader::open)??)
    }

    /// [`TraceReader::open_in`] the calling thread's namespace.
    pub fn open() -> crate::nft::Result<TraceReader> {
        let mut sock = NlSocket::new(NETLINK_NETFILTER).map_err(io_err("open netfilter socket"))?;
        sock.bind_auto().map_err(io_err("bind netfilter socket"))?;
        sock.add_membership(NFNLGRP_NFTRACE)
            .map_err(io_err("join the nf_tables trace group"))?;
        // Many reports per packet: room for a burst.
        let _ = nix::sys::socket::setsockopt(
            &sock,
            nix::sys::socket::sockopt::RcvBufForce,
            &(4 * 1024 * 1024),
        );
        Ok(TraceReader {
            sock,
            buf: Vec::with_capacity(64 * 1024),
            pending: Default::default(),
        })
    }

    /// The next report, waiting until `deadline`; `None` when none came by then.
    pub fn next(&mut self, deadline: Instant) -> crate::nft::Result<Option<TraceEvent>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(Some(e));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if !self.wait(left)? {
                return Ok(None);
            }
            self.buf.clear();
            match self.sock.recv(&mut self.buf, libc::MSG_DONTWAIT) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    return Err(io_err("receive trace reports (some were lost)")(e))
                }
                Err(e) => return Err(io_err("receive trace reports")(e)),
            }
            let mut rest = &self.buf[..];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                if len < 16 || len > rest.len() {
                    break;
                }
                if let Ok(Some(e)) = TraceEvent::decode(&rest[..len]) {
                    self.pending.push_back(e);
                }
                rest = &rest[((len + 3) & !3).min(rest.len())..];
            }
        }
    }

    /// Whether the socket became readable within `left`.
    fn wait(&self, left: Duration) -> crate::nft::Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let fd = fd_of(&self.sock);
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(n) => Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(io_err("wait for trace reports")(e.into())),
        }
    }
}

/// The socket's descriptor, borrowed for `poll`.
fn fd_of(sock: &NlSocket) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsFd;
    sock.as_fd()
}

/// Send the first packet of a flow to `dst` from the namespace `netns` (`None`: the calling
/// thread's): a TCP connection attempt (given up after `wait`) or one UDP datagram, from
/// `src` when given (it must be an address of that namespace), as `uid` when given (this
/// thread only switches, through raw syscalls). What the connection then does (refused,
/// unanswered) does not matter: its first packet has passed the rules.
pub fn send_probe(
    netns: Option<&Netns>,
    tcp: bool,
    dst: SocketAddr,
    src: Option<IpAddr>,
    uid: Option<u32>,
    wait: Duration,
) -> crate::Result<io::Result<()>> {
    let job = move || -> io::Result<()> {
        if let Some(uid) = uid {
            become_uid(uid)?;
        }
        send_once(tcp, dst, src, wait)
    };
    match netns {
        Some(ns) => Ok(ns.run(job)?),
        None => Ok(std::thread::scope(|s| {
            s.spawn(job)
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the sending thread panicked")))
        })),
    }
}

fn send_once(tcp: bool, dst: SocketAddr, src: Option<IpAddr>, wait: Duration) -> io::Result<()> {
    use nix::sys::socket::{self as s, AddressFamily, SockFlag, SockType, SockaddrStorage};
    let family = if dst.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    if tcp && src.is_none() {
        return match TcpStream::connect_timeout(&dst, wait) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EHOSTUNREACH) => Ok(()),
            Err(e) => Err(e),
        };
    }
    if !tcp {
        let bind: SocketAddr = match (src, dst.is_ipv6()) {
            (Some(a), _) => SocketAddr::new(a, 0),
            (None, false) => "0.0.0.0:0".parse().expect("address"),
            (None, true) => "[::]:0".parse().expect("address"),
        };
        let u = UdpSocket::bind(bind)?;
        u.send_to(b"redirect-validate trace", dst)?;
        return Ok(());
    }
    // TCP from a given source: bind, then connect without blocking and wait a little.
    let fd = s::socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK, None)?;
    let local = SockaddrStorage::from(SocketAddr::new(src.expect("given"), 0));
    s::bind(fd.as_raw_fd(), &local)?;
    match s::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    std::thread::sleep(wait.min(Duration::from_millis(200)));
    Ok(())
}

/// Switch the calling thread's credentials to `uid` (and its GID to the same number), with no
/// supplementary groups. Raw syscalls: libc's wrappers would switch every thread.
fn become_uid(uid: u32) -> io::Result<()> {
    // SAFETY: plain syscalls with integer arguments (and a null list for setgroups); they
    // change this thread's credentials only, which is the point.
    let r = unsafe {
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setresgid, uid, uid, uid) != 0
        {
            -1
        } else {
            libc::syscall(libc::SYS_setresuid, uid, uid, uid)
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A trace in progress in one namespace: the reports' socket (joined first, so the first
/// packet's reports are not missed) and the trace table, created over a socket of its own that
/// owns it where the kernel has owner tables. Dropping it removes the table (the kernel also
/// does when the process dies, for an owned table).
pub struct Tracer {
    reader: TraceReader,
    nft: crate::nft::Nft,
    table: String,
    owned: bool,
    removed: bool,
}

impl Tracer {
    /// Start tracing `m` in `netns` with a trace table named `table`.
    pub fn start(netns: &Netns, table: &str, m: &crate::nft::TraceMatch) -> crate::Result<Tracer> {
        let reader = TraceReader::open_in(netns)?;
        let nft = crate::nft::Nft::open_in(netns)?;
        let owned = nft.add_trace_table(&crate::nft::trace_table(table, m))?;
        Ok(Tracer {
            reader,
            nft,
            table: table.into(),
            owned,
            removed: false,
        })
    }

    /// Whether the kernel owns the table to this process's socket (removed when it dies).
    pub fn owned(&self) -> bool {
        self.owned
    }

    /// The trace table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The next report, waiting until `deadline`.
    pub fn next(&mut self, deadline: Instant) -> crate::nft::Result<Option<TraceEvent>> {
        self.reader.next(deadline)
    }

    /// The rules of the table `table` (ours), with their handles.
    pub fn rules_of(&self, table: &str) -> crate::nft::Result<Vec<crate::nft::RuleHandle>> {
        self.nft.rule_handles(table)
    }

    /// Remove the trace table now. Returns whether it was there.
    pub fn stop(mut self) -> crate::nft::Result<bool> {
        self.removed = true;
        self.nft.remove_named(&self.table)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.nft.remove_named(&self.table);
        }
    }
}
