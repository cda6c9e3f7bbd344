//! The fixed configurations the benchmarks measure (and the kernel's oracle test encodes), with
//! their excluded-CIDR lists: here, so that the kernel's tests need not link the benchmarks.

use ipnet::{IpNet, Ipv4Net};
use redirect_model::CaptureConfig;
use redirect_model::{DnsCapture, InterceptionMode, Selection};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Istio's sidecar default (`-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*'
/// -d 15090,15021,15020`), IPv4, with the CNI plugin's `-o 15020`.
pub fn sidecar_default() -> CaptureConfig {
    CaptureConfig {
        outbound_exclude_ports: vec![15020],
        ..CaptureConfig::istio_sidecar_default()
    }
}

/// The richest common shape: TPROXY inbound, DNS capture to two servers per family, IPv6.
pub fn tproxy_dns_ipv6() -> CaptureConfig {
    CaptureConfig {
        mode: InterceptionMode::Tproxy,
        dns: DnsCapture::Servers {
            v4: vec![Ipv4Addr::new(10, 96, 0, 10), Ipv4Addr::new(10, 96, 0, 11)],
            v6: vec![
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10),
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x11),
            ],
        },
        ipv6: true,
        ..sidecar_default()
    }
}

/// The sidecar default with `n` excluded outbound CIDRs (`-x`).
pub fn with_excluded(n: usize) -> CaptureConfig {
    CaptureConfig {
        outbound_exclude_cidrs: excluded_cidrs(n),
        ..sidecar_default()
    }
}

/// `n` distinct IPv4 CIDRs `A.B.C.0/25` with A in 1..=9, B in 0..=9, C in 0..=255 (23,040 at
/// most). No two are adjacent (each /25 leaves the upper half of its /24 free), so a set holds
/// exactly `n` intervals and iptables exactly `n` rules: neither side merges. The text form is
/// short enough that 10,000 of them fit in one argument (`MAX_ARG_STRLEN`, 128 KiB), which is
/// what Istio's `-x` flag would receive. None covers 10.0.0.0/8, where benchmark traffic goes.
pub fn excluded_cidrs(n: usize) -> Vec<IpNet> {
    assert!(n <= 9 * 10 * 256, "at most 23040 CIDRs of this shape");
    (0..n)
        .map(|i| {
            let (a, rest) = (1 + i / 2560, i % 2560);
            let (b, c) = (rest / 256, rest % 256);
            let addr = Ipv4Addr::new(a as u8, b as u8, c as u8, 0);
            IpNet::V4(Ipv4Net::new(addr, 25).expect("valid prefix"))
        })
        .collect()
}

/// The CIDRs as Istio's flags and annotations write them: `a,b,c`.
pub fn cidr_list(cidrs: &[IpNet]) -> String {
    Selection::List(cidrs.to_vec()).to_string()
}

/// The sidecar default with every port excluded from inbound capture but one (65,535 ports, as
/// an `excludeInboundPorts` annotation can list them): one range in the interval set.
pub fn ports_all() -> CaptureConfig {
    CaptureConfig {
        inbound_exclude_ports: (1..=65535).collect(),
        ..sidecar_default()
    }
}

/// The sidecar default with every other port excluded (2, 4, ..., 65534: 32,767 ports, none
/// adjacent): the worst case of the interval form, where nothing merges.
pub fn ports_alternate() -> CaptureConfig {
    CaptureConfig {
        inbound_exclude_ports: (2..=65534).step_by(2).collect(),
        ..sidecar_default()
    }
}

/// The configurations every benchmark runs, by name.
pub fn configs() -> Vec<(&'static str, CaptureConfig)> {
    vec![
        ("sidecar-default", sidecar_default()),
        ("tproxy-dns-ipv6", tproxy_dns_ipv6()),
        ("exclude-10", with_excluded(10)),
        ("exclude-1000", with_excluded(1000)),
        ("exclude-10000", with_excluded(10_000)),
        ("ports-65535", ports_all()),
        ("ports-alternate", ports_alternate()),
    ]
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excluded_cidrs_are_distinct_non_adjacent_and_fit_one_argument() {
        let cidrs = excluded_cidrs(10_000);
        let set: std::collections::BTreeSet<_> = cidrs.iter().collect();
        assert_eq!(set.len(), 10_000);
        // Non-adjacent: merging them gives as many ranges as CIDRs.
        assert_eq!(redirect_model::table::merged_ranges(&cidrs).len(), 10_000);
        let text = cidr_list(&cidrs);
        assert!(text.len() < 128 * 1024, "{} bytes", text.len());
        let ten: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(cidrs.iter().all(|c| !c.contains(&ten) && !ten.contains(c)));
    }
}
