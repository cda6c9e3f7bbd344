//! A flow to evaluate: the first packet of a connection (TCP) or a datagram (UDP), written the
//! way an operator says it: `out tcp uid=1000 10.1.2.3:80`, `in tcp 10.77.0.2:8080 src=10.0.0.9`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ruleset::{Family, L4};

/// Which way the packet travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Arrives on an interface of the pod (PREROUTING).
    In,
    /// Sent by a process in the pod (OUTPUT; then PREROUTING on `lo` when it stays local).
    Out,
}

/// The connection-tracking state of the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CtState {
    /// The first packet of a connection (the default): NAT rules run.
    New,
    /// A later packet: NAT rules do not run, `ct state established` matches.
    Established,
    /// A packet conntrack could not place.
    Invalid,
}

/// One packet. Fields left `None` are unknown: a rule that tests them does not match, except a
/// negated address or port test (an unknown source is none of the listed addresses).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flow {
    /// Whether the packet arrives (`in`) or is sent from the pod (`out`).
    pub direction: Direction,
    /// TCP or UDP.
    pub proto: L4,
    /// The destination address and port, which also give the flow's family.
    pub dst: SocketAddr,
    /// The source address; for `out`, unknown unless given or leaving through `lo`.
    pub src: Option<IpAddr>,
    /// The source port; unknown for an ephemeral port.
    pub sport: Option<u16>,
    /// The sending process (`out` only): owner UID of the socket.
    pub uid: Option<u32>,
    /// The sending process (`out` only): primary GID of the socket (the UID when not given).
    pub gid: Option<u32>,
    /// Input interface (`in` only).
    pub iif: Option<String>,
    /// Output interface (`out` only).
    pub oif: Option<String>,
    /// The packet mark it starts with (0 by default).
    pub mark: u32,
    /// Its conntrack state (new by default).
    pub ct: CtState,
}

impl Flow {
    /// The address family, the destination's.
    pub fn family(&self) -> Family {
        match self.dst {
            SocketAddr::V4(_) => Family::V4,
            SocketAddr::V6(_) => Family::V6,
        }
    }

    /// An outbound TCP connection from `uid` (primary GID the same) to `dst`, with the
    /// interface and source the kernel would pick for a pod (see [`Flow::with_defaults`]).
    pub fn out_tcp(uid: u32, dst: SocketAddr) -> Flow {
        Flow {
            direction: Direction::Out,
            proto: L4::Tcp,
            dst,
            src: None,
            sport: None,
            uid: Some(uid),
            gid: Some(uid),
            iif: None,
            oif: None,
            mark: 0,
            ct: CtState::New,
        }
        .with_defaults()
    }

    /// An inbound TCP connection arriving on `eth0` from `src` to `dst`.
    pub fn in_tcp(src: IpAddr, dst: SocketAddr) -> Flow {
        Flow {
            direction: Direction::In,
            proto: L4::Tcp,
            dst,
            src: Some(src),
            sport: None,
            uid: None,
            gid: None,
            iif: None,
            oif: None,
            mark: 0,
            ct: CtState::New,
        }
        .with_defaults()
    }

    /// Fill in what was not given, as the kernel would for a pod, and return the filled flow:
    /// `out` goes through `lo` to a loopback destination and through `eth0` otherwise, with
    /// the loopback source on `lo`, GID = UID; `in` arrives on `eth0`.
    pub fn with_defaults(mut self) -> Flow {
        match self.direction {
            Direction::Out => {
                if self.oif.is_none() {
                    let local = self.dst.ip().is_loopback();
                    self.oif = Some(if local { "lo" } else { "eth0" }.to_string());
                }
                if self.src.is_none() && self.oif.as_deref() == Some("lo") {
                    self.src = Some(match self.dst {
                        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
                    });
                }
                if self.gid.is_none() {
                    self.gid = self.uid;
                }
            }
            Direction::In => {
                if self.iif.is_none() {
                    self.iif = Some("eth0".to_string());
                }
            }
        }
        self
    }
}

/// A flow that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid flow {flow:?}: {problem}; expected e.g. 'out tcp uid=1000 10.1.2.3:80' or 'in tcp 10.77.0.2:8080 src=10.0.0.9' (keys: uid, gid, src, sport, iif, oif, mark, ct=new|established|invalid)")]
pub struct FlowError {
    /// The text as given.
    pub flow: String,
    /// What is wrong with it.
    pub problem: String,
}

impl FromStr for Flow {
    type Err = FlowError;

    /// Words in any order: `in`|`out`, `tcp`|`udp` (default tcp), the destination `ADDR:PORT`
    /// (`[v6]:PORT`), and `key=value` for the rest. Unknown fields get defaults (see
    /// [`Flow::with_defaults`]).
    fn from_str(s: &str) -> Result<Flow, FlowError> {
        let err = |problem: String| FlowError {
            flow: s.to_string(),
            problem,
        };
        let mut flow = Flow {
            direction: Direction::Out,
            proto: L4::Tcp,
            dst: SocketAddr::from(([0, 0, 0, 0], 0)),
            src: None,
            sport: None,
            uid: None,
            gid: None,
            iif: None,
            oif: None,
            mark: 0,
            ct: CtState::New,
        };
        let (direction, proto, dst) = read_words(s, &mut flow).map_err(err)?;
        flow.direction =
            direction.ok_or_else(|| err("the direction (in or out) is missing".into()))?;
        flow.proto = proto.unwrap_or(L4::Tcp);
        flow.dst = dst.ok_or_else(|| err("the destination ADDR:PORT is missing".into()))?;
        coherent(&flow).map_err(err)?;
        Ok(flow)
    }
}

/// The direction, protocol and destination a flow's words name (each at most once).
type Named = (Option<Direction>, Option<L4>, Option<SocketAddr>);

/// The words of a flow: what they name, and their `key=value` fields set on `flow`. Each is
/// given once.
fn read_words(s: &str, flow: &mut Flow) -> Result<Named, String> {
    let (mut direction, mut proto, mut dst) = (None, None, None);
    let mut keys: Vec<&str> = Vec::new();
    for word in s.split_whitespace() {
        let once = |seen: bool, what: &str| {
            if seen {
                Err(format!("{what} is given twice ({word:?})"))
            } else {
                Ok(())
            }
        };
        match word {
            "in" | "out" => {
                once(direction.is_some(), "the direction")?;
                direction = Some(if word == "in" {
                    Direction::In
                } else {
                    Direction::Out
                });
            }
            "tcp" | "udp" => {
                once(proto.is_some(), "the protocol")?;
                proto = Some(if word == "tcp" { L4::Tcp } else { L4::Udp });
            }
            _ => match word.split_once('=') {
                Some((key, value)) => {
                    // `uid=1000 uid=1337` would be judged as the last one said.
                    once(keys.contains(&key), &format!("{key}="))?;
                    keys.push(key);
                    set_key(flow, key, value)?
                }
                None => {
                    once(dst.is_some(), "the destination")?;
                    dst = Some(word.parse::<SocketAddr>().map_err(|_| {
                        format!(
                            "{word:?} is not a destination ADDR:PORT ([ADDR]:PORT for IPv6), nor in/out, tcp/udp or key=value"
                        )
                    })?);
                }
            },
        }
    }
    Ok((direction, proto, dst))
}

/// The fields of a parsed flow agree with each other and with its direction.
fn coherent(flow: &Flow) -> Result<(), String> {
    if flow.dst.port() == 0 {
        return Err("the destination port is 0".into());
    }
    if let Some(src) = flow.src {
        if src.is_ipv4() != flow.dst.is_ipv4() {
            return Err(format!(
                "src={src} and destination {} are of different address families",
                flow.dst
            ));
        }
    }
    match flow.direction {
        Direction::In if flow.uid.is_some() || flow.gid.is_some() => Err(
            "uid= and gid= describe the sending process of an 'out' flow; an 'in' packet has none"
                .into(),
        ),
        Direction::In if flow.oif.is_some() => {
            Err("oif= is for 'out' flows; use iif= for 'in'".into())
        }
        Direction::Out if flow.iif.is_some() => {
            Err("iif= is for 'in' flows; use oif= for 'out'".into())
        }
        _ => Ok(()),
    }
}

fn set_key(flow: &mut Flow, key: &str, value: &str) -> Result<(), String> {
    let num = |what: &str| -> Result<u32, String> {
        let parsed = match value.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => value.parse::<u32>(),
        };
        parsed.map_err(|_| format!("{key}={value:?}: {what}"))
    };
    let port = || -> Result<u16, String> {
        value
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{key}={value:?}: expected a port from 1 to 65535"))
    };
    let iface = || -> Result<Option<String>, String> {
        if value.is_empty() || value.len() > 15 {
            return Err(format!(
                "{key}={value:?}: expected an interface name of 1 to 15 characters"
            ));
        }
        Ok(Some(value.to_string()))
    };
    match key {
        "uid" => flow.uid = Some(num("expected a numeric UID")?),
        "gid" => flow.gid = Some(num("expected a numeric GID")?),
        "mark" => flow.mark = num("expected a number (decimal or 0x hex)")?,
        "sport" => flow.sport = Some(port()?),
        "src" => match value.parse::<SocketAddr>() {
            Ok(a) => {
                flow.src = Some(a.ip());
                flow.sport = Some(a.port()).filter(|p| *p != 0);
            }
            Err(_) => {
                flow.src =
                    Some(value.parse::<IpAddr>().map_err(|_| {
                        format!("src={value:?}: expected an IP address, or ADDR:PORT")
                    })?)
            }
        },
        "iif" => flow.iif = iface()?,
        "oif" => flow.oif = iface()?,
        "ct" => {
            flow.ct = match value {
                "new" => CtState::New,
                "established" => CtState::Established,
                "invalid" => CtState::Invalid,
                _ => {
                    return Err(format!(
                        "ct={value:?}: expected new, established or invalid"
                    ))
                }
            }
        }
        _ => {
            return Err(format!(
                "unknown key {key:?} (keys: uid, gid, src, sport, iif, oif, mark, ct)"
            ))
        }
    }
    Ok(())
}

impl fmt::Display for Flow {
    /// The canonical form, which [`FromStr`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = match self.direction {
            Direction::In => "in",
            Direction::Out => "out",
        };
        write!(f, "{dir} {} {}", self.proto.name(), self.dst)?;
        match (self.src, self.sport) {
            (Some(ip), Some(p)) => write!(f, " src={}", SocketAddr::new(ip, p))?,
            (Some(ip), None) => write!(f, " src={ip}")?,
            (None, Some(p)) => write!(f, " sport={p}")?,
            (None, None) => {}
        }
        if let Some(u) = self.uid {
            write!(f, " uid={u}")?;
        }
        if let Some(g) = self.gid {
            write!(f, " gid={g}")?;
        }
        if let Some(i) = &self.iif {
            write!(f, " iif={i}")?;
        }
        if let Some(o) = &self.oif {
            write!(f, " oif={o}")?;
        }
        if self.mark != 0 {
            write!(f, " mark={:#x}", self.mark)?;
        }
        match self.ct {
            CtState::New => Ok(()),
            CtState::Established => write!(f, " ct=established"),
            CtState::Invalid => write!(f, " ct=invalid"),
        }
    }
}
