//! The named sets as the kernel stores them: port sets as they are, CIDR lists as interval sets
//! of merged ranges, and long CIDR lists as one fixed-size hash set per prefix length (why: see
//! `MASKED_MIN_CIDRS`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Subnets, Ipv6Subnets};

use super::{NftSet, SetElem};
use redirect_model::render::hashed_size;
use redirect_model::table::{hashed_port_key, merged_ranges, port_form, PortForm};
use redirect_model::{Family, NamedSet, SetElements};

/// CIDR sets lowered as one hash set per prefix length: the set's name → (prefix, set name).
pub(super) type Masked<'a> = BTreeMap<&'a str, Vec<(u8, String)>>;

/// What the rules need to know of how the sets were lowered.
#[derive(Default)]
pub(super) struct SetForms<'a> {
    pub masked: Masked<'a>,
    /// Port sets stored as hashed 4-byte keys ([`PortForm::Hashed`]): a rule looks them up
    /// with a 4-byte load masked to the port.
    pub hashed_ports: std::collections::BTreeSet<&'a str>,
}

/// A CIDR list at least this long is lowered to hash sets per prefix length, when it has at
/// most [`MASKED_MAX_PREFIXES`] of them: the kernel inserts an interval set's keys (a start and
/// an end per range) into a tree, which made 10,000 CIDRs cost 9 ms in the kernel; a fixed-size
/// hash takes half the keys and a third of the time. Shorter lists keep one interval set and
/// one lookup per packet.
pub const MASKED_MIN_CIDRS: usize = 256;
/// Each prefix length costs one more rule and one more lookup per packet.
pub const MASKED_MAX_PREFIXES: usize = 8;

/// Every set of the ruleset, appended to `out` with dense ids from 1; returns the CIDR sets
/// lowered as hash sets per prefix length, which the rules that look them up need.
pub(super) fn lower_sets<'a>(sets: &'a [NamedSet], out: &mut Vec<NftSet>) -> SetForms<'a> {
    let mut masked: Masked = BTreeMap::new();
    let mut hashed_ports = std::collections::BTreeSet::new();
    for set in sets {
        let id = out.len() as u32 + 1;
        match masked_groups(set) {
            Some(groups) => {
                let mut names = Vec::new();
                for (i, (prefix, keys)) in groups.into_iter().enumerate() {
                    let set = masked_set(set, prefix, keys, id + i as u32);
                    names.push((prefix, set.name.clone()));
                    out.push(set);
                }
                masked.insert(set.name.as_str(), names);
            }
            None => {
                let lowered = lower_set(set, id);
                if lowered.key_len == 4 && matches!(set.elements, SetElements::Ports(_)) {
                    hashed_ports.insert(set.name.as_str());
                }
                out.push(lowered);
            }
        }
    }
    SetForms {
        masked,
        hashed_ports,
    }
}

/// A long CIDR list as disjoint CIDRs grouped by prefix length (keys: the network addresses),
/// or `None` to keep it one interval set. The list is merged into ranges first and each range
/// cut into the fewest aligned blocks, so no address is in two groups.
fn masked_groups(set: &NamedSet) -> Option<Vec<(u8, Vec<u128>)>> {
    let SetElements::Cidrs(cidrs) = &set.elements else {
        return None;
    };
    if cidrs.len() < MASKED_MIN_CIDRS {
        return None;
    }
    let v6 = set.family == Some(Family::V6);
    let mut groups: BTreeMap<u8, Vec<u128>> = BTreeMap::new();
    for (start, end) in merged_ranges(cidrs) {
        for (net, prefix) in aligned_blocks(start, end, v6) {
            groups.entry(prefix).or_default().push(net);
            if groups.len() > MASKED_MAX_PREFIXES {
                return None;
            }
        }
    }
    // Longest prefixes first, as a reader expects the most specific first.
    Some(groups.into_iter().rev().collect())
}

/// [start, end) (end `None`: to the top of the space) as the fewest aligned CIDRs (ipnet's
/// subnet iterators), each `(network, prefix length)`.
fn aligned_blocks(start: u128, end: Option<u128>, v6: bool) -> Vec<(u128, u8)> {
    if v6 {
        let last = end.map_or(u128::MAX, |e| e - 1);
        Ipv6Subnets::new(Ipv6Addr::from(start), Ipv6Addr::from(last), 0)
            .map(|n| (u128::from(n.network()), n.prefix_len()))
            .collect()
    } else {
        let last = end.map_or(u32::MAX, |e| (e - 1) as u32);
        Ipv4Subnets::new(Ipv4Addr::from(start as u32), Ipv4Addr::from(last), 0)
            .map(|n| (u128::from(u32::from(n.network())), n.prefix_len()))
            .collect()
    }
}

/// The nft key type and length of an address set of `set`'s family.
fn addr_key(set: &NamedSet) -> (u32, u32) {
    if set.family == Some(Family::V6) {
        (TYPE_IPV6_ADDR, 16)
    } else {
        (TYPE_IPV4_ADDR, 4)
    }
}

fn masked_set(set: &NamedSet, prefix: u8, keys: Vec<u128>, id: u32) -> NftSet {
    let (key_type, key_len) = addr_key(set);
    NftSet {
        name: format!("{}_m{prefix}", set.name),
        id,
        key_type,
        key_len,
        interval: false,
        // A power of two at least the count, so a refill with a few more keys fits.
        size: Some((keys.len() as u32).next_power_of_two().max(64)),
        elements: keys
            .into_iter()
            .map(|k| SetElem {
                key: int_to_key(k, key_len),
                interval_end: false,
            })
            .collect(),
    }
}

/// nft key types (nftables' datatype ids) and lengths.
const TYPE_IPV4_ADDR: u32 = 7;
const TYPE_IPV6_ADDR: u32 = 8;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_INTEGER: u32 = 4;

fn lower_set(set: &NamedSet, id: u32) -> NftSet {
    match &set.elements {
        SetElements::Ports(ports) => match port_form(ports) {
            PortForm::Ranges(ranges) => {
                let ranges: Vec<(u128, Option<u128>)> = ranges
                    .into_iter()
                    .map(|(first, last)| {
                        (first as u128, (last < u16::MAX).then_some(last as u128 + 1))
                    })
                    .collect();
                NftSet {
                    name: set.name.clone(),
                    id,
                    key_type: TYPE_INET_SERVICE,
                    key_len: 2,
                    interval: true,
                    size: None,
                    elements: interval_elements(&ranges, 2),
                }
            }
            PortForm::Hashed(ports) => NftSet {
                name: set.name.clone(),
                id,
                // What nft writes for `typeof @th,16,32`: a raw 32-bit integer.
                key_type: TYPE_INTEGER,
                key_len: 4,
                interval: false,
                size: Some(hashed_size(ports.len())),
                elements: ports
                    .iter()
                    .map(|&p| SetElem {
                        key: hashed_port_key(p).to_vec(),
                        interval_end: false,
                    })
                    .collect(),
            },
            PortForm::Plain => plain_ports(set, id, ports),
        },
        // Addresses added and removed one by one at run time: a plain hash set, as Istio's
        // `type ipv4_addr` sets.
        SetElements::Addrs(addrs) => {
            let (key_type, key_len) = addr_key(set);
            NftSet {
                name: set.name.clone(),
                id,
                key_type,
                key_len,
                interval: false,
                size: None,
                elements: addrs.iter().map(|a| addr_elem(*a)).collect(),
            }
        }
        SetElements::Cidrs(cidrs) => {
            let (key_type, key_len) = addr_key(set);
            NftSet {
                name: set.name.clone(),
                id,
                key_type,
                key_len,
                interval: true,
                size: None,
                elements: interval_elements(&merged_ranges(cidrs), key_len),
            }
        }
    }
}

/// A short port list as it is: 2-byte keys, for which the kernel picks its bitmap.
fn plain_ports(set: &NamedSet, id: u32, ports: &[u16]) -> NftSet {
    NftSet::ports(set.name.clone(), id, ports)
}

impl NftSet {
    /// A set of ports as they are (`inet_service` keys, 2 bytes, big-endian), named `name`,
    /// with batch id `id`: our short port lists, and the inline `{ 53, 15008 }` of Istio's
    /// nftables form.
    pub fn ports(name: String, id: u32, ports: &[u16]) -> NftSet {
        NftSet {
            name,
            id,
            key_type: TYPE_INET_SERVICE,
            key_len: 2,
            interval: false,
            size: None,
            elements: ports
                .iter()
                .map(|p| SetElem {
                    key: p.to_be_bytes().to_vec(),
                    interval_end: false,
                })
                .collect(),
        }
    }
}

/// The keys of an interval set holding sorted, disjoint, non-adjacent [start, end) ranges
/// (`None` end: to the top of the key space).
fn interval_elements(ranges: &[(u128, Option<u128>)], key_len: u32) -> Vec<SetElem> {
    let mut elements = Vec::with_capacity(ranges.len() * 2 + 1);
    // Like nft, open with an interval end at 0 when the first range starts above it, so
    // every key below the first range finds an end and misses on every kernel.
    if ranges.first().is_some_and(|(start, _)| *start > 0) {
        elements.push(SetElem {
            key: int_to_key(0, key_len),
            interval_end: true,
        });
    }
    for &(start, end) in ranges {
        elements.push(SetElem {
            key: int_to_key(start, key_len),
            interval_end: false,
        });
        if let Some(end) = end {
            elements.push(SetElem {
                key: int_to_key(end, key_len),
                interval_end: true,
            });
        }
    }
    elements
}

/// One address as a plain set's element (its bytes in network order).
pub fn addr_elem(a: IpAddr) -> SetElem {
    let key = match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    SetElem {
        key,
        interval_end: false,
    }
}

pub(super) fn int_to_key(v: u128, len: u32) -> Vec<u8> {
    match len {
        2 => (v as u16).to_be_bytes().to_vec(),
        4 => (v as u32).to_be_bytes().to_vec(),
        _ => v.to_be_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;
    use redirect_model::table::{merged_ranges, port_ranges};

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn long_port_lists_become_merged_ranges_short_ones_stay_plain() {
        assert_eq!(port_ranges(&[15090, 15021, 15020]), None);
        let mut long: Vec<u16> = (1000..1300).collect();
        long.extend([7, 5, 6, 65535, 65534, 1299, 40000]);
        assert_eq!(
            port_ranges(&long).unwrap(),
            [(5, 7), (1000, 1299), (40000, 40000), (65534, 65535)]
        );
        let set = NamedSet {
            name: "p".into(),
            family: None,
            elements: SetElements::Ports(long),
        };
        let lowered = lower_set(&set, 1);
        assert!(lowered.interval);
        let keys: Vec<(u16, bool)> = lowered
            .elements
            .iter()
            .map(|e| (u16::from_be_bytes([e.key[0], e.key[1]]), e.interval_end))
            .collect();
        // An end at 0 first; the last range runs to the top of the port space (no end key).
        assert_eq!(
            keys,
            [
                (0, true),
                (5, false),
                (8, true),
                (1000, false),
                (1300, true),
                (40000, false),
                (40001, true),
                (65534, false)
            ]
        );
    }

    #[test]
    fn ranges_merge_adjacent_and_overlapping() {
        let r = merged_ranges(&nets(&[
            "10.0.0.0/8",
            "11.0.0.0/16",
            "10.5.0.0/16",
            "192.168.0.0/16",
        ]));
        assert_eq!(
            r,
            vec![
                (0x0a00_0000, Some(0x0b01_0000)),
                (0xc0a8_0000, Some(0xc0a9_0000))
            ]
        );
        let r = merged_ranges(&nets(&["0.0.0.0/0", "10.0.0.0/8"]));
        assert_eq!(r, vec![(0, None)]);
        let r = merged_ranges(&nets(&["255.255.255.0/24"]));
        assert_eq!(r, vec![(0xffff_ff00, None)]);
    }

    /// Every address of `groups` as ranges, merged: what the kernel's hash sets match.
    fn covered(groups: &[(u8, Vec<u128>)], v6: bool) -> Vec<(u128, Option<u128>)> {
        let nets: Vec<IpNet> = groups
            .iter()
            .flat_map(|(p, keys)| {
                keys.iter().map(move |k| {
                    if v6 {
                        IpNet::new(IpAddr::V6(Ipv6Addr::from(*k)), *p).unwrap()
                    } else {
                        IpNet::new(IpAddr::V4(Ipv4Addr::from(*k as u32)), *p).unwrap()
                    }
                })
            })
            .collect();
        merged_ranges(&nets)
    }

    fn cidr_set(family: Family, cidrs: Vec<IpNet>) -> NamedSet {
        NamedSet {
            name: "ip-exclude-cidrs".into(),
            family: Some(family),
            elements: SetElements::Cidrs(cidrs),
        }
    }

    #[test]
    fn long_cidr_lists_become_disjoint_hash_groups_covering_the_same_addresses() {
        // 300 /25s with gaps, a /24 over two of them, two adjacent /26s that merge with a /25,
        // a /32 inside a /25, and 10.0.0.0/8.
        let mut list: Vec<IpNet> = (0..300u32)
            .map(|i| IpNet::new(Ipv4Addr::from(0x0b00_0000 + (i << 8)).into(), 25).unwrap())
            .collect();
        list.extend(nets(&["11.0.5.0/24", "11.0.7.128/26", "11.0.7.192/26"]));
        list.extend(nets(&["11.0.9.7/32", "10.0.0.0/8"]));
        let set = cidr_set(Family::V4, list.clone());
        let groups = masked_groups(&set).expect("hash groups");
        assert_eq!(covered(&groups, false), merged_ranges(&list));
        let mut all: Vec<(u128, u8)> = groups
            .iter()
            .flat_map(|(p, keys)| keys.iter().map(move |k| (*k, *p)))
            .collect();
        all.sort();
        for w in all.windows(2) {
            let end = w[0].0 + (1u128 << (32 - w[0].1));
            assert!(end <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        }
        let prefixes: Vec<u8> = groups.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            prefixes,
            [25, 24, 8],
            "longest first; /26+/26 and /32 merged away"
        );

        let v6: Vec<IpNet> = (0..300u128)
            .map(|i| {
                IpNet::new(Ipv6Addr::from((0xfd00u128 << 112) + (i << 64)).into(), 64).unwrap()
            })
            .chain(nets(&["fe80::/10"]))
            .collect();
        let groups6 = masked_groups(&cidr_set(Family::V6, v6.clone())).expect("v6 groups");
        assert_eq!(covered(&groups6, true), merged_ranges(&v6));
    }

    #[test]
    fn short_or_ragged_cidr_lists_stay_one_interval_set() {
        let short = nets(&["10.0.0.0/8", "192.168.0.0/16"]);
        assert!(masked_groups(&cidr_set(Family::V4, short)).is_none());
        // 300 CIDRs of 15 prefix lengths (/18 to /32), none merging: more groups than the
        // bound.
        let ragged: Vec<IpNet> = (0..300u32)
            .map(|i| {
                let len = 18 + (i % 15) as u8;
                IpNet::new(Ipv4Addr::from(0x0c00_0000 + (i << 16)).into(), len).unwrap()
            })
            .collect();
        assert!(masked_groups(&cidr_set(Family::V4, ragged)).is_none());
    }
}
