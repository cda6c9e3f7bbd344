//! Our one nftables table as the model lays it out: its name, the names of its chains, and
//! the shape of long lists (port lists as merged ranges, CIDR lists as merged address
//! ranges). The kernel crate encodes this layout, the nft script renders it, and the evaluator
//! names its chains after it, so the three cannot drift apart.

use ipnet::IpNet;

use crate::ruleset::{Family, Hook, Stage};

/// The name of our table (family `inet`). One per network namespace; nothing else of ours exists
/// in a pod's namespace.
pub const TABLE: &str = "redirect_capture";

/// The name of our table in the host's namespace (family `inet`), for ambient's probe SNAT
/// (`HostProbeConfig`): Istio's `istio-ambient-nat`. A name of its own, so that the host's
/// table and a pod's capture never replace each other, even in one namespace.
pub const HOST_PROBE_TABLE: &str = "redirect_ambient_host";

/// Name of the base chain of a stage and hook.
pub fn base_chain_name(stage: Stage, hook: Hook) -> String {
    format!("{}_{}", stage.table_name(), hook.nf_name())
}

/// Name of a family's chain.
pub fn chain_name(stage: Stage, family: Family, name: &str) -> String {
    format!(
        "{}_{}_{}",
        stage.table_name(),
        family.nft_name(),
        name.to_ascii_lowercase()
    )
}

/// A port list at least this long is lowered to an interval set of merged ranges. A plain set
/// of 2-byte keys gets the kernel's bitmap backend, which checks each new element against every
/// element already inserted: 43,000 ports cost 8 s of kernel time, and any pod author can write
/// that many into one annotation. An interval set (an rbtree) inserts each range in
/// logarithmic time, and a contiguous run of ports is one range. Shorter lists keep the bitmap,
/// the fastest lookup (and cheap to fill at this size).
pub const PORT_RANGES_MIN: usize = 256;

/// A long port list as sorted, merged inclusive ranges; `None` for a short list (see
/// [`PORT_RANGES_MIN`]). The renderers use the same decision.
pub fn port_ranges(ports: &[u16]) -> Option<Vec<(u16, u16)>> {
    if ports.len() < PORT_RANGES_MIN {
        return None;
    }
    let mut sorted = ports.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for p in sorted {
        match out.last_mut() {
            Some((_, last)) if p <= last.saturating_add(1) => *last = (*last).max(p),
            _ => out.push((p, p)),
        }
    }
    Some(out)
}

/// How the kernel stores a port set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortForm {
    /// A short list as it is (the kernel's bitmap: the fastest lookup, cheap to fill at this
    /// size).
    Plain,
    /// Merged inclusive ranges in an interval set.
    Ranges(Vec<(u16, u16)>),
    /// The distinct ports, sorted, as 4-byte keys (the port, then two zero bytes) in a
    /// fixed-size hash set, looked up with a 4-byte load masked to the port.
    Hashed(Vec<u16>),
}

/// A long list whose runs average fewer ports than this is hashed: an interval set inserts a
/// start and an end key per run into a tree, and a list that merges little (every other port:
/// 32,767 runs) cost 40 to 190 ms of kernel time per ADD; a fixed-size hash of 4-byte keys
/// fills in a sixth of that per port (`nft -f` here: 6 ms against 38 ms for that list). From
/// runs of two ports on, the tree holds fewer keys than the hash and reads back faster
/// (43,000 random ports, runs of 2.9: ADD the same either way, CHECK 21 ms against 36).
pub const PORT_HASH_RUN: usize = 2;

/// The form of a port list (see [`PortForm`]); the renderers and the netlink backend use it.
pub fn port_form(ports: &[u16]) -> PortForm {
    let Some(ranges) = port_ranges(ports) else {
        return PortForm::Plain;
    };
    let distinct: usize = ranges.iter().map(|(a, b)| usize::from(b - a) + 1).sum();
    if ranges.len() * PORT_HASH_RUN > distinct {
        PortForm::Hashed(ranges.iter().flat_map(|&(a, b)| a..=b).collect())
    } else {
        PortForm::Ranges(ranges)
    }
}

/// The key of a port in a hashed port set: the port in network order, then two zero bytes,
/// as a 4-byte load at the port masked with `ff ff 00 00` leaves it.
pub fn hashed_port_key(port: u16) -> [u8; 4] {
    let [hi, lo] = port.to_be_bytes();
    [hi, lo, 0, 0]
}

/// CIDRs as sorted, merged half-open ranges [start, end); `None` end = to the top of the space.
/// Adjacent ranges are merged too, since the kernel refuses an end and a start on one key.
pub fn merged_ranges(cidrs: &[IpNet]) -> Vec<(u128, Option<u128>)> {
    let mut r: Vec<(u128, Option<u128>)> = cidrs
        .iter()
        .map(|c| {
            let (start, last) = match c {
                IpNet::V4(n) => (
                    u32::from(n.network()) as u128,
                    u32::from(n.broadcast()) as u128,
                ),
                IpNet::V6(n) => (u128::from(n.network()), u128::from(n.broadcast())),
            };
            let top = if matches!(c, IpNet::V4(_)) {
                u32::MAX as u128
            } else {
                u128::MAX
            };
            (start, if last == top { None } else { Some(last + 1) })
        })
        .collect();
    r.sort();
    let mut out: Vec<(u128, Option<u128>)> = Vec::new();
    for (s, e) in r {
        if let Some(last) = out.last_mut() {
            match last.1 {
                None => continue,
                Some(le) if s <= le => {
                    last.1 = e.map(|e| e.max(le));
                    continue;
                }
                _ => {}
            }
        }
        out.push((s, e));
    }
    out
}
