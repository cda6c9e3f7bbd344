//! Istio's rules for the benchmark configurations, as Istio would load them.
//!
//! - iptables: Istio's own CNI golden for the sidecar default (`testdata/istio/cni/basic.restore`),
//!   with excluded CIDRs inserted where Istio puts them (one `-d CIDR -j RETURN` per CIDR after
//!   the `127.0.0.1/32` RETURN, as in the `ip-range` golden), and its IPv6 twin written the way
//!   Istio's IPv6 goldens differ from the IPv4 ones (`::6/128`, `::1/128`).
//! - nftables: the same rules in the form of Istio's native nftables backend (`nftables/*.golden`:
//!   one `inet istio-proxy-nat` table, a `counter` on every rule, one rule per excluded CIDR).
//!   No golden has exactly the sidecar default, so it is assembled from the lines the
//!   `inbound-ports-wildcard` and `ipnets` goldens use; `nft -f` loads it in the benchmarks.

use ipnet::IpNet;

/// The last rule of Istio's ISTIO_OUTPUT for `-i '*'`; excluded CIDRs go right before it.
const IPT_CATCH_ALL: &str = "-A ISTIO_OUTPUT -j ISTIO_REDIRECT";

/// Istio's IPv4 iptables-restore input for the sidecar default (`basic`) with `cidrs` excluded.
pub fn iptables_v4(basic: &str, cidrs: &[IpNet]) -> String {
    assert!(
        basic.contains(IPT_CATCH_ALL),
        "not Istio's sidecar default: no `{IPT_CATCH_ALL}` line"
    );
    let mut out = String::with_capacity(basic.len() + cidrs.len() * 40);
    for line in basic.lines() {
        if line == IPT_CATCH_ALL {
            for c in cidrs {
                out.push_str(&format!("-A ISTIO_OUTPUT -d {c} -j RETURN\n"));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The IPv6 twin of Istio's IPv4 sidecar rules (what `ip6tables-restore` gets for a dual-stack
/// pod): the loopback addresses are IPv6, nothing else changes.
pub fn iptables_v6(basic: &str) -> String {
    basic
        .replace("127.0.0.6/32", "::6/128")
        .replace("127.0.0.1/32", "::1/128")
}

/// Istio's native-nftables script for the sidecar default with `cidrs` excluded.
pub fn nft_sidecar_default(cidrs: &[IpNet]) -> String {
    let t = "inet istio-proxy-nat";
    let mut s = String::new();
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(format!("add table {t}"));
    line(format!("flush table {t}"));
    line(format!(
        "add chain {t} prerouting {{ type nat hook prerouting priority -100 ; }}"
    ));
    line(format!(
        "add chain {t} output {{ type nat hook output priority -100 ; }}"
    ));
    for c in [
        "istio-inbound",
        "istio-redirect",
        "istio-in-redirect",
        "istio-output",
    ] {
        line(format!("add chain {t} {c}"));
    }
    let rules = [
        "istio-inbound meta l4proto tcp tcp dport 15008 counter return",
        "istio-redirect meta l4proto tcp counter redirect to :15001",
        "istio-in-redirect meta l4proto tcp counter redirect to :15006",
        "prerouting meta l4proto tcp counter jump istio-inbound",
        "istio-inbound meta l4proto tcp tcp dport 15020 counter return",
        "istio-inbound meta l4proto tcp tcp dport 15021 counter return",
        "istio-inbound meta l4proto tcp tcp dport 15090 counter return",
        "istio-inbound meta l4proto tcp counter jump istio-in-redirect",
        "output counter jump istio-output",
        "istio-output meta l4proto tcp tcp dport 15020 counter return",
        "istio-output meta l4proto udp udp dport 15020 counter return",
        "istio-output oifname lo ip saddr 127.0.0.6/32 counter return",
        "istio-output oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skuid 1337 counter jump istio-in-redirect",
        "istio-output oifname lo skuid != 1337 counter return",
        "istio-output skuid 1337 counter return",
        "istio-output oifname lo meta l4proto tcp ip daddr != 127.0.0.1/32 tcp dport != 15008 skgid 1337 counter jump istio-in-redirect",
        "istio-output oifname lo skgid != 1337 counter return",
        "istio-output skgid 1337 counter return",
        "istio-output ip daddr 127.0.0.1/32 counter return",
    ];
    for r in rules {
        line(format!("add rule {t} {r}"));
    }
    for c in cidrs {
        line(format!(
            "add rule {t} istio-output ip daddr {c} counter return"
        ));
    }
    line(format!(
        "add rule {t} istio-output counter jump istio-redirect"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASIC: &str = "*nat\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n";

    #[test]
    fn cidrs_go_before_the_catch_all_redirect() {
        let cidrs = crate::excluded_cidrs(2);
        let v4 = iptables_v4(BASIC, &cidrs);
        assert_eq!(
            v4,
            "*nat\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -d 1.0.0.0/25 -j RETURN\n\
             -A ISTIO_OUTPUT -d 1.0.1.0/25 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\nCOMMIT\n"
        );
        assert!(iptables_v6(&v4).contains("-d ::1/128 -j RETURN"));
        let nft = nft_sidecar_default(&cidrs);
        let tail: Vec<&str> = nft.lines().rev().take(3).collect();
        assert_eq!(
            tail,
            [
                "add rule inet istio-proxy-nat istio-output counter jump istio-redirect",
                "add rule inet istio-proxy-nat istio-output ip daddr 1.0.1.0/25 counter return",
                "add rule inet istio-proxy-nat istio-output ip daddr 1.0.0.0/25 counter return",
            ]
        );
    }

    #[test]
    #[should_panic(expected = "not Istio's sidecar default")]
    fn refuses_other_rules() {
        iptables_v4("*nat\nCOMMIT\n", &[]);
    }
}
