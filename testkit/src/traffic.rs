//! Probes: one connection (TCP) or one datagram (UDP) from the pod or the peer, and where it
//! landed.

use std::convert::From as _;
use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::flow::{Proto, Side, Timing};
use super::netns::{become_ids, in_netns};
use super::sock;
use super::topology::Topology;

/// Where a probe starts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum From {
    /// From inside the pod, by a process with this uid and (primary) gid and no supplementary
    /// groups (Istio's `--gid-owner` matches the primary gid only).
    Pod {
        /// The process's user ID.
        uid: u32,
        /// Its primary group ID.
        gid: u32,
    },
    /// From the peer, over the pod's `eth0` (the peer's normal routes).
    Peer,
    /// From the peer, arriving on the named pod-side interface (the socket is bound to the
    /// peer's end of that link, whose routes point at the pod).
    PeerVia(String),
}

impl fmt::Display for From {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            From::Pod { uid, gid } => write!(f, "pod({uid}/{gid})"),
            From::Peer => f.write_str("peer"),
            From::PeerVia(iface) => write!(f, "peer@{iface}"),
        }
    }
}

/// One connection attempt (TCP) or one datagram with a wait for the reply (UDP).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Probe {
    /// Where it starts.
    pub from: From,
    /// A TCP connection or a UDP datagram.
    pub proto: Proto,
    /// The destination it connects or sends to.
    pub dst: SocketAddr,
    /// Bind to this source address (port 0) before connecting, e.g. 127.0.0.1 or 127.0.0.6.
    pub bind_src: Option<IpAddr>,
}

impl Probe {
    /// A TCP connection from `from` to `dst`.
    pub fn tcp(from: From, dst: SocketAddr) -> Probe {
        Probe {
            from,
            proto: Proto::Tcp,
            dst,
            bind_src: None,
        }
    }

    /// A UDP datagram from `from` to `dst`.
    pub fn udp(from: From, dst: SocketAddr) -> Probe {
        Probe {
            from,
            proto: Proto::Udp,
            dst,
            bind_src: None,
        }
    }

    /// The same probe, bound to `src` first.
    pub fn bound(mut self, src: IpAddr) -> Probe {
        self.bind_src = Some(src);
        self
    }
}

impl fmt::Display for Probe {
    /// E.g. `pod(1337/1337) tcp 127.0.0.1->127.0.0.6:15002`, `peer@eth1 tcp ->10.0.0.9:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.from, self.proto)?;
        if let Some(src) = self.bind_src {
            write!(f, "{src}")?;
        }
        write!(f, "->{}", self.dst)
    }
}

/// Where a probe ended.
///
/// Equality keeps what matters for comparing two rulesets: the side and listener port it landed
/// on, and the original destination when the connection was diverted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A listener accepted it (TCP) or answered (UDP). `port` is the listener's own port.
    /// `orig` is the destination the client asked for when the connection was diverted: the
    /// `SO_ORIGINAL_DST` when it differs from the accepted socket's local address (NAT), else
    /// the local address itself when its port differs from the listener's (TPROXY keeps the
    /// original destination as the local address); `None` when not diverted.
    Landed {
        /// The namespace of the listener.
        side: Side,
        /// The listener's own port.
        port: u16,
        /// The destination asked for, when diverted.
        orig: Option<SocketAddr>,
    },
    /// Connection refused (TCP RST, or ICMP port unreachable for UDP).
    Refused,
    /// No answer within the probe timeout (dropped somewhere).
    Timeout,
    /// Host or network unreachable (ICMP, or no route).
    Unreachable,
    /// Anything else (a bind failure, a connection with no landing report, ...).
    Other(String),
}

impl Outcome {
    /// An [`Outcome::Landed`] from its three parts.
    pub fn landed(side: Side, port: u16, orig: Option<SocketAddr>) -> Outcome {
        Outcome::Landed { side, port, orig }
    }

    /// Whether this is one of the definite outcomes (not `Other`).
    pub fn is_definite(&self) -> bool {
        !matches!(self, Outcome::Other(_))
    }
}

impl fmt::Display for Outcome {
    /// `pod:15006 orig=10.77.0.2:8080`, `peer:80`, `refused`, `timeout`, `unreachable`,
    /// `other: <message>`; [`FromStr`] reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Landed { side, port, orig } => {
                write!(f, "{side}:{port}")?;
                if let Some(o) = orig {
                    write!(f, " orig={o}")?;
                }
                Ok(())
            }
            Outcome::Refused => f.write_str("refused"),
            Outcome::Timeout => f.write_str("timeout"),
            Outcome::Unreachable => f.write_str("unreachable"),
            Outcome::Other(m) => write!(f, "other: {m}"),
        }
    }
}

impl FromStr for Outcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "refused" => return Ok(Outcome::Refused),
            "timeout" => return Ok(Outcome::Timeout),
            "unreachable" => return Ok(Outcome::Unreachable),
            _ => {}
        }
        if let Some(m) = s.strip_prefix("other: ") {
            return Ok(Outcome::Other(m.to_string()));
        }
        let bad = || format!("not an outcome: {s:?}");
        let (landing, orig) = match s.split_once(" orig=") {
            Some((l, o)) => (l, Some(o.parse::<SocketAddr>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let (side, port) = landing.split_once(':').ok_or_else(bad)?;
        Ok(Outcome::Landed {
            side: side.parse()?,
            port: port.parse().map_err(|_| bad())?,
            orig,
        })
    }
}

/// An outcome with the details that equality leaves out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeReport {
    /// The outcome, as [`run_probe`] gives it.
    pub outcome: Outcome,
    /// The accepted socket's local address (TCP), or the datagram's destination with the
    /// listener's port (UDP).
    pub local: Option<SocketAddr>,
    /// `SO_ORIGINAL_DST` as read by the listener (`None` without a conntrack entry).
    pub raw_orig: Option<SocketAddr>,
    /// The listener's report line as received.
    pub line: Option<String>,
}

impl ProbeReport {
    fn of(outcome: Outcome) -> ProbeReport {
        ProbeReport {
            outcome,
            local: None,
            raw_orig: None,
            line: None,
        }
    }
}

/// Sends one probe through `topo`; see [`Outcome`].
pub fn run_probe(topo: &Topology, probe: &Probe) -> Outcome {
    match run_probe_report(topo, probe).outcome {
        // A second, patient look: on a slow machine (an emulated guest of the kernel matrix)
        // a link's first IPv6 neighbour discovery can outlast the default timeouts; a probe
        // the rules drop times out again.
        Outcome::Timeout => run_probe_with(topo, probe, Timing::patient()),
        outcome => outcome,
    }
}

/// [`run_probe`] with other timeouts than the topology's.
pub fn run_probe_with(topo: &Topology, probe: &Probe, timing: Timing) -> Outcome {
    run_probe_report_with(topo, probe, timing).outcome
}

/// Like [`run_probe`], with the local address and the raw report.
pub fn run_probe_report(topo: &Topology, probe: &Probe) -> ProbeReport {
    run_probe_report_with(topo, probe, topo.timing)
}

fn run_probe_report_with(topo: &Topology, probe: &Probe, timing: Timing) -> ProbeReport {
    match &probe.from {
        From::Pod { uid, gid } => {
            let (uid, gid) = (*uid, *gid);
            in_netns(topo.pod.path(), move || {
                // This thread only: the credentials of every other thread stay as they are.
                if let Err(e) = become_ids(uid, gid) {
                    return ProbeReport::of(Outcome::Other(format!(
                        "cannot switch to uid {uid} gid {gid}: {e}"
                    )));
                }
                client(probe, None, &timing)
            })
        }
        From::Peer => in_netns(topo.peer.path(), || client(probe, None, &timing)),
        From::PeerVia(iface) => {
            let link = topo.link(iface).unwrap_or_else(|| {
                panic!(
                    "probe {probe}: the topology has no pod interface {iface:?} (has: {})",
                    topo.links()
                        .iter()
                        .map(|l| l.pod_if.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            });
            let dev = link.peer_if.clone();
            in_netns(topo.peer.path(), move || client(probe, Some(&dev), &timing))
        }
    }
}

/// Runs all probes (a few at a time) and returns their outcomes in order.
pub fn run_probes(topo: &Topology, probes: &[Probe]) -> Vec<Outcome> {
    run_probes_report(topo, probes)
        .into_iter()
        .map(|r| r.outcome)
        .collect()
}

/// Like [`run_probes`], with reports.
pub fn run_probes_report(topo: &Topology, probes: &[Probe]) -> Vec<ProbeReport> {
    const POOL: usize = 16;
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<ProbeReport>>> =
        probes.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..POOL.min(probes.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(probe) = probes.get(i) else { break };
                let report = run_probe_report(topo, probe);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every probe ran")
        })
        .collect()
}

fn classify(e: &io::Error) -> Outcome {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => Outcome::Refused,
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => Outcome::Unreachable,
        Some(libc::ETIMEDOUT) | Some(libc::EAGAIN) => Outcome::Timeout,
        _ => Outcome::Other(e.to_string()),
    }
}

fn client(probe: &Probe, device: Option<&str>, timing: &Timing) -> ProbeReport {
    match client_inner(probe, device, timing) {
        Ok(r) => r,
        Err(outcome) => ProbeReport::of(outcome),
    }
}

fn client_inner(
    probe: &Probe,
    device: Option<&str>,
    timing: &Timing,
) -> Result<ProbeReport, Outcome> {
    let v6 = probe.dst.is_ipv6();
    let ty = match probe.proto {
        Proto::Tcp => libc::SOCK_STREAM,
        Proto::Udp => libc::SOCK_DGRAM,
    };
    let fd = sock::socket(v6, ty, probe.proto == Proto::Tcp)
        .map_err(|e| Outcome::Other(format!("socket: {e}")))?;
    let raw = fd.as_raw_fd();
    if let Some(dev) = device {
        sock::bind_to_device(raw, dev)
            .map_err(|e| Outcome::Other(format!("SO_BINDTODEVICE {dev}: {e}")))?;
    }
    if let Some(src) = probe.bind_src {
        if src.is_ipv6() != v6 {
            return Err(Outcome::Other(format!(
                "bind {src}: family differs from {}",
                probe.dst
            )));
        }
        sock::bind(raw, &SocketAddr::new(src, 0))
            .map_err(|e| Outcome::Other(format!("bind {src}: {e}")))?;
    }
    let text = match probe.proto {
        Proto::Tcp => {
            let connected = sock::connect_start(raw, &probe.dst).map_err(|e| classify(&e))?;
            if !connected {
                let ready = sock::wait_for(raw, libc::POLLOUT, timing.connect)
                    .map_err(|e| Outcome::Other(format!("poll: {e}")))?;
                if !ready {
                    return Err(Outcome::Timeout);
                }
                if let Some(e) = sock::take_error(raw).map_err(|e| Outcome::Other(e.to_string()))? {
                    return Err(classify(&e));
                }
            }
            sock::set_nonblocking(raw, false).map_err(|e| Outcome::Other(e.to_string()))?;
            let mut stream = TcpStream::from(fd);
            let _ = stream.set_read_timeout(Some(timing.report));
            let mut buf = Vec::new();
            let read = stream.read_to_end(&mut buf);
            if buf.is_empty() {
                return Err(Outcome::Other(match read {
                    Ok(_) => "connected, but closed without a landing report".to_string(),
                    Err(e) => format!("connected, but no landing report: {e}"),
                }));
            }
            String::from_utf8_lossy(&buf).into_owned()
        }
        Proto::Udp => {
            let socket = UdpSocket::from(fd);
            socket.connect(probe.dst).map_err(|e| classify(&e))?;
            let _ = socket.set_read_timeout(Some(timing.udp_reply));
            socket.send(b"probe\n").map_err(|e| classify(&e))?;
            let mut buf = [0u8; 512];
            match socket.recv(&mut buf) {
                Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Outcome::Timeout)
                }
                Err(e) => return Err(classify(&e)),
            }
        }
    };
    parse_report(&text).ok_or_else(|| Outcome::Other(format!("unparsable landing report {text:?}")))
}

/// Parses `side=<s> port=<p> orig=<a|-> local=<a|->` into a report with a normalised outcome.
fn parse_report(text: &str) -> Option<ProbeReport> {
    let line = text.lines().next()?.trim();
    let mut side = None;
    let mut port = None;
    let mut raw_orig = None;
    let mut local = None;
    for field in line.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        let addr = |v: &str| -> Option<Option<SocketAddr>> {
            if v == "-" {
                Some(None)
            } else {
                v.parse().ok().map(Some)
            }
        };
        match k {
            "side" => side = Some(v.parse::<Side>().ok()?),
            "port" => port = Some(v.parse::<u16>().ok()?),
            "orig" => raw_orig = addr(v)?,
            "local" => local = addr(v)?,
            _ => {}
        }
    }
    let (side, port) = (side?, port?);
    let orig = match (raw_orig, local) {
        (Some(o), l) if Some(o) != l => Some(o),
        (_, Some(l)) if l.port() != port => Some(l),
        _ => None,
    };
    Some(ProbeReport {
        outcome: Outcome::Landed { side, port, orig },
        local,
        raw_orig,
        line: Some(line.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_display_round_trips() {
        for o in [
            Outcome::landed(Side::Pod, 15006, Some("10.77.0.2:8080".parse().unwrap())),
            Outcome::landed(Side::Peer, 80, None),
            Outcome::landed(Side::Pod, 15001, Some("[2001:db8::1]:80".parse().unwrap())),
            Outcome::Refused,
            Outcome::Timeout,
            Outcome::Unreachable,
            Outcome::Other("bind ::6: Cannot assign requested address".into()),
        ] {
            assert_eq!(o.to_string().parse::<Outcome>().unwrap(), o, "{o}");
        }
    }

    #[test]
    fn reports_are_normalised() {
        // REDIRECT: the original destination differs from the local address.
        let r = parse_report("side=pod port=15006 orig=10.77.0.2:8080 local=10.77.0.2:15006\n")
            .unwrap();
        assert_eq!(
            r.outcome,
            Outcome::landed(Side::Pod, 15006, Some("10.77.0.2:8080".parse().unwrap()))
        );
        // Conntrack without NAT: SO_ORIGINAL_DST is the local address: not diverted.
        let r = parse_report("side=peer port=80 orig=10.77.0.1:80 local=10.77.0.1:80").unwrap();
        assert_eq!(r.outcome, Outcome::landed(Side::Peer, 80, None));
        // No conntrack at all.
        let r = parse_report("side=peer port=80 orig=- local=10.77.0.1:80").unwrap();
        assert_eq!(r.outcome, Outcome::landed(Side::Peer, 80, None));
        // TPROXY: the local address is the original destination.
        let r =
            parse_report("side=pod port=15006 orig=10.77.0.2:8080 local=10.77.0.2:8080").unwrap();
        assert_eq!(
            r.outcome,
            Outcome::landed(Side::Pod, 15006, Some("10.77.0.2:8080".parse().unwrap()))
        );
        assert_eq!(r.local, Some("10.77.0.2:8080".parse().unwrap()));
        assert!(parse_report("garbage").is_none());
    }
}
