//! Istio's ambient in-pod rules in its native nftables form, built by us: for Istio's default
//! config and for an ingress pod with virtual interfaces and no DNS capture, each chain holds,
//! word for word, what Istio's agent writes in it (its nftables backend, as its own test data
//! shows; Istio ≥ 1.28).
//!
//! Then in the kernel, for each combination of DNS capture, IPv6, inbound bypass and virtual
//! interfaces: written over netlink in place of our in-pod table (`Nft::hand_over`), the
//! tables equal, expression for expression and line for line, what `nft -f` makes of the text
//! Istio's agent writes.

mod common;

use std::collections::BTreeMap;

use common::{ambient_combinations, handed_over_differs, none_wrong};
use redirect_istio::nft_form::IstioNft;
use redirect_model::AmbientConfig;
use redirect_testkit::{kernel_test, TestNetns};

/// `table chain` to its rules, each rule's words joined by one space (Istio's text has a
/// doubled space in two rules).
fn chains(nft: &IstioNft) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in nft.rule_lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..2], ["add", "rule"], "{line}");
        assert_eq!(words[2], "inet", "{line}");
        let key = format!("{} {}", words[3], words[4]);
        out.entry(key).or_default().push(words[5..].join(" "));
    }
    out
}

fn expect(rows: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    rows.iter()
        .map(|(k, v)| {
            let rules = v
                .iter()
                .map(|r| r.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            (k.to_string(), rules)
        })
        .collect()
}

const NAT: &str = "istio-ambient-nat";
const SNAT6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

#[test]
fn the_default_pods_tables_are_istios_chain_for_chain() {
    let built = IstioNft::ambient(&AmbientConfig::default());
    assert_eq!(
        built.table_names(),
        [NAT, "istio-ambient-mangle", "istio-ambient-raw"]
    );
    let not_ztunnel = "mark and 0xfff != 0x539";
    let want = expect(&[
        (&format!("{NAT} prerouting"), &["jump istio-prerouting"]),
        (&format!("{NAT} output"), &["jump istio-output"]),
        (
            &format!("{NAT} istio-prerouting"),
            &[
                "meta l4proto tcp ip saddr 169.254.7.127 counter accept",
                &format!("meta l4proto tcp ip6 saddr {SNAT6} counter accept"),
                &format!("ip daddr != 127.0.0.1/32 tcp dport != 15008 {not_ztunnel} counter redirect to :15006"),
                &format!("ip6 daddr != ::1/128 tcp dport != 15008 {not_ztunnel} counter redirect to :15006"),
            ],
        ),
        (
            &format!("{NAT} istio-output"),
            &[
                "meta l4proto tcp ip daddr 169.254.7.127 counter accept",
                &format!("meta l4proto tcp ip6 daddr {SNAT6} counter accept"),
                &format!("oifname != lo {not_ztunnel} udp dport 53 counter redirect to :15053"),
                &format!("ip daddr != 127.0.0.1/32 tcp dport 53 {not_ztunnel} counter redirect to :15053"),
                &format!("ip6 daddr != ::1/128 tcp dport 53 {not_ztunnel} counter redirect to :15053"),
                "meta l4proto tcp mark and 0xfff == 0x111 counter accept",
                "oifname lo ip daddr != 127.0.0.1/32 counter accept",
                "oifname lo ip6 daddr != ::1/128 counter accept",
                &format!("meta l4proto tcp ip daddr != 127.0.0.1/32 {not_ztunnel} counter redirect to :15001"),
                &format!("meta l4proto tcp ip6 daddr != ::1/128 {not_ztunnel} counter redirect to :15001"),
            ],
        ),
        ("istio-ambient-mangle prerouting", &["jump istio-prerouting"]),
        ("istio-ambient-mangle output", &["jump istio-output"]),
        (
            "istio-ambient-mangle istio-prerouting",
            &["meta mark & 0xfff == 0x539 counter ct mark set ct mark & 0xfffff000 | 0x111"],
        ),
        (
            "istio-ambient-mangle istio-output",
            &["ct mark and 0xfff == 0x111 counter meta mark set ct mark"],
        ),
        ("istio-ambient-raw prerouting", &["jump istio-prerouting"]),
        ("istio-ambient-raw output", &["jump istio-output"]),
        (
            "istio-ambient-raw istio-output",
            &["udp dport 53 meta mark and 0xfff == 0x539 counter ct zone set 1"],
        ),
        (
            "istio-ambient-raw istio-prerouting",
            &["udp sport 53 meta mark and 0xfff != 0x539 counter ct zone set 1"],
        ),
    ]);
    assert_eq!(chains(&built), want);
    let script = built.script();
    for decl in [
        "add chain inet istio-ambient-nat prerouting { type nat hook prerouting priority -100 ; }",
        "add chain inet istio-ambient-mangle output { type route hook output priority -150 ; }",
        "add chain inet istio-ambient-raw output { type filter hook output priority -300 ; }",
        "add chain inet istio-ambient-raw istio-prerouting",
    ] {
        assert!(script.lines().any(|l| l == decl), "no {decl:?}:\n{script}");
    }
}

#[test]
fn an_ingress_pod_with_virtual_interfaces_and_no_dns_is_istios_too() {
    let cfg = AmbientConfig {
        dns_capture: false,
        ipv6: false,
        bypass_inbound: true,
        virtual_interfaces: vec!["fake1s0f0".into(), "fake1s0f1".into()],
        ..AmbientConfig::default()
    };
    let built = IstioNft::ambient(&cfg);
    assert_eq!(built.table_names(), [NAT, "istio-ambient-mangle"]);
    let got = chains(&built);
    assert_eq!(
        got[&format!("{NAT} istio-prerouting")],
        [
            "iifname fake1s0f0 meta l4proto tcp counter redirect to :15001",
            "iifname fake1s0f0 meta l4proto tcp counter return",
            "iifname fake1s0f1 meta l4proto tcp counter redirect to :15001",
            "iifname fake1s0f1 meta l4proto tcp counter return",
        ]
    );
    assert_eq!(
        got[&format!("{NAT} istio-output")],
        [
            "meta l4proto tcp ip daddr 169.254.7.127 counter accept",
            "meta l4proto tcp mark and 0xfff == 0x111 counter accept",
            "oifname lo ip daddr != 127.0.0.1/32 counter accept",
            "meta l4proto tcp ip daddr != 127.0.0.1/32 mark and 0xfff != 0x539 counter redirect to :15001",
        ]
    );
    // An ingress pod with no virtual interface: Istio still declares the chain its base chain
    // jumps to, empty.
    let bare = IstioNft::ambient(&AmbientConfig {
        virtual_interfaces: Vec::new(),
        ..cfg
    });
    assert!(bare
        .script()
        .lines()
        .any(|l| l == format!("add chain inet {NAT} istio-prerouting")));
    assert!(!chains(&bare).contains_key(&format!("{NAT} istio-prerouting")));
}

#[kernel_test]
fn handed_back_ambient_tables_are_what_nft_makes_of_istios_text() {
    let mut wrong = Vec::new();
    let mut cases = 0;
    for (name, cfg) in ambient_combinations(&["kubevirt0", "eth1"]) {
        cases += 1;
        let istio_nft = IstioNft::ambient(&cfg);
        let istio = TestNetns::new();
        let path = std::env::temp_dir().join(format!(
            "rdt-ambient-nft-{}-{cases}.nft",
            std::process::id()
        ));
        std::fs::write(&path, istio_nft.script()).unwrap();
        istio.sh(&format!("nft -f {}", path.display()));
        let _ = std::fs::remove_file(&path);
        let tables = istio_nft.lower(&redirect_model::NoGroupDatabase).unwrap();
        wrong.extend(handed_over_differs(&name, &cfg, &istio, |nft| {
            nft.hand_over(&tables)
        }));
    }
    none_wrong(&wrong, cases);
}
