//! The opt-in counters of a capture: which of four paths a counted rule adds to, and what a
//! namespace's counters read back as, summed per path. Only the rules that decide a path carry
//! a counter (a redirect to the proxy, the RETURN of a bypass or of an exclusion), so in the
//! nat stage each counts the first packet of a connection: a connection is one packet there.

use serde::{Deserialize, Serialize};

/// A path a connection takes through the capture rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountedPath {
    /// Inbound, handed to the proxy's inbound port (REDIRECT or TPROXY).
    InboundCaptured,
    /// Outbound, redirected to the proxy's outbound port (or its DNS port).
    OutboundCaptured,
    /// The proxy's own traffic, left alone by its owner (UID, GID) or its mark (ztunnel's).
    Bypassed,
    /// Left alone by an exclusion of the config: a port, a CIDR, an interface, an owner group.
    Excluded,
}

impl CountedPath {
    /// Every path, in the order metrics list them.
    pub const ALL: [CountedPath; 4] = [
        CountedPath::InboundCaptured,
        CountedPath::OutboundCaptured,
        CountedPath::Bypassed,
        CountedPath::Excluded,
    ];

    /// The path's name in metrics and JSON (`inbound_captured`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CountedPath::InboundCaptured => "inbound_captured",
            CountedPath::OutboundCaptured => "outbound_captured",
            CountedPath::Bypassed => "bypassed",
            CountedPath::Excluded => "excluded",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Packets and bytes a counter saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// Packets (in the nat stage: connections).
    pub packets: u64,
    /// Their bytes, IP header included.
    pub bytes: u64,
}

/// A namespace's counters summed per path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathCounts([Count; 4]);

impl PathCounts {
    /// The count of one path.
    pub fn get(&self, path: CountedPath) -> Count {
        self.0[path.index()]
    }

    /// Adds one counter's reading to its path.
    pub fn add(&mut self, path: CountedPath, c: Count) {
        let sum = &mut self.0[path.index()];
        sum.packets = sum.packets.saturating_add(c.packets);
        sum.bytes = sum.bytes.saturating_add(c.bytes);
    }

    /// Each path with its count, in [`CountedPath::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (CountedPath, Count)> + '_ {
        CountedPath::ALL.into_iter().map(|p| (p, self.get(p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_per_path_and_saturate() {
        let mut c = PathCounts::default();
        c.add(
            CountedPath::Bypassed,
            Count {
                packets: 2,
                bytes: 120,
            },
        );
        c.add(
            CountedPath::Bypassed,
            Count {
                packets: 3,
                bytes: 180,
            },
        );
        c.add(
            CountedPath::Excluded,
            Count {
                packets: u64::MAX,
                bytes: 1,
            },
        );
        c.add(
            CountedPath::Excluded,
            Count {
                packets: 1,
                bytes: 1,
            },
        );
        assert_eq!(
            c.get(CountedPath::Bypassed),
            Count {
                packets: 5,
                bytes: 300
            }
        );
        assert_eq!(c.get(CountedPath::Excluded).packets, u64::MAX);
        assert_eq!(c.get(CountedPath::InboundCaptured), Count::default());
        let names: Vec<&str> = c.iter().map(|(p, _)| p.name()).collect();
        assert_eq!(
            names,
            [
                "inbound_captured",
                "outbound_captured",
                "bypassed",
                "excluded"
            ]
        );
    }
}
