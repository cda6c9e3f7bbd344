//! What every part of the kit speaks of: the side a listener is on, the protocol, and the
//! probes' timeouts. A module of its own so that listeners, topology and probes depend on it and
//! not on each other in a circle.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which namespace a listener (and so a landing) is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The pod's namespace.
    Pod,
    /// The peer's: the world outside the pod.
    Peer,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Pod => "pod",
            Side::Peer => "peer",
        })
    }
}

impl FromStr for Side {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pod" => Ok(Side::Pod),
            "peer" => Ok(Side::Peer),
            _ => Err(format!("unknown side {s:?} (pod, peer)")),
        }
    }
}

/// Transport protocol of a probe or listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// A TCP connection, answered with the landing report.
    Tcp,
    /// One UDP datagram, answered with the landing report as a datagram.
    Udp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        })
    }
}

/// Probe timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// TCP: how long a connect may take before the outcome is `Timeout`.
    pub connect: Duration,
    /// UDP: how long to wait for the reply before the outcome is `Timeout`.
    pub udp_reply: Duration,
    /// TCP: how long a connected probe waits for the listener's report line.
    pub report: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            connect: Duration::from_millis(300),
            udp_reply: Duration::from_millis(400),
            report: Duration::from_secs(2),
        }
    }
}

impl Timing {
    /// Ten times the default: for a second look at a probe that timed out, since on a loaded
    /// machine an answer can come later than the default allows, and slow is not dropped.
    pub fn patient() -> Timing {
        let d = Timing::default();
        Timing {
            connect: d.connect * 10,
            udp_reply: d.udp_reply * 10,
            report: d.report * 2,
        }
    }
}
