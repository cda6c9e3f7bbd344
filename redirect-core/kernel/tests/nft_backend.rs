//! The nftables netlink backend against the kernel: apply, idempotence, atomic failure,
//! remove, read-back and drift detection. Each test has a fresh network namespace.

use redirect_kernel::nft::{self, text, Difference, TABLE};
use redirect_model::{Action, Chain, Family, Match, Rule, Stage, L4};
use redirect_model::{CaptureConfig, DnsCapture, InterceptionMode, Selection};
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, netns::TestNetns};

fn full_config() -> CaptureConfig {
    CaptureConfig {
        ipv6: true,
        mode: InterceptionMode::Tproxy,
        dns: DnsCapture::All,
        drop_invalid: true,
        outbound_include_cidrs: Selection::List(vec![
            "10.0.0.0/8".parse().unwrap(),
            "172.16.0.0/12".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ]),
        outbound_exclude_cidrs: vec![
            "10.96.0.0/12".parse().unwrap(),
            "1.2.3.4/32".parse().unwrap(),
        ],
        outbound_exclude_ports: vec![15020, 9000],
        outbound_include_ports: vec![3306, 5432],
        exclude_interfaces: vec!["eth9".into()],
        reroute_interfaces: vec!["tap0".into(), "tap1".into()],
        proxy_uids: vec![1337, 1000620000],
        ..CaptureConfig::istio_sidecar_default()
    }
}

/// Port lists long enough for the interval form (merged ranges): a contiguous run, the
/// worst case (every other port: nothing merges), and all ports but one.
fn long_port_lists() -> CaptureConfig {
    CaptureConfig {
        inbound_exclude_ports: (1..=20000).chain([15090, 15021, 15020]).collect(),
        outbound_exclude_ports: (2..=65534).step_by(2).collect(),
        outbound_include_ports: (1..=65535).filter(|p| *p != 8080).collect(),
        ..CaptureConfig::istio_sidecar_default()
    }
}

fn configs() -> Vec<(&'static str, CaptureConfig)> {
    vec![
        ("long port lists", long_port_lists()),
        ("istio default", CaptureConfig::istio_sidecar_default()),
        (
            "istio default ipv6",
            CaptureConfig {
                ipv6: true,
                ..CaptureConfig::istio_sidecar_default()
            },
        ),
        ("base", CaptureConfig::default()),
        ("everything", full_config()),
    ]
}

#[kernel_test]
fn apply_reads_back_equal_to_the_plan() {
    for (name, cfg) in configs() {
        let ns = TestNetns::new();
        let rs = plan(&cfg).unwrap();
        redirect_kernel::testing::nft_in(ns.path())
            .apply(&rs)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let diff = redirect_kernel::testing::nft_in(ns.path())
            .diff(&rs)
            .unwrap();
        assert!(diff.is_empty(), "{name}: {diff:#?}");
        let state = redirect_kernel::testing::nft_in(ns.path())
            .read()
            .unwrap()
            .unwrap();
        assert_eq!(state, nft::expected(&rs), "{name}");
        assert!(state.rule_count() >= rs.rule_count(), "{name}");
        // nft itself sees the table.
        let listing = ns.sh(&format!("nft list table inet {TABLE}"));
        assert!(listing.contains("chain nat_output"), "{name}: {listing}");
    }
}

#[kernel_test]
fn apply_twice_gives_the_same_state_and_replaces_a_different_one() {
    let ns = TestNetns::new();
    let full = plan(&full_config()).unwrap();
    let small = plan(&CaptureConfig::istio_sidecar_default()).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&full)
        .map(|_| ())
        .unwrap();
    let first = ns.sh(&format!("nft list table inet {TABLE}"));
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&full)
        .map(|_| ())
        .unwrap();
    let second = ns.sh(&format!("nft list table inet {TABLE}"));
    assert_eq!(first, second);
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&small)
        .map(|_| ())
        .unwrap();
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .diff(&small)
        .unwrap()
        .is_empty());
    // Nothing of the larger ruleset survives the replace.
    assert!(!redirect_kernel::testing::nft_in(ns.path())
        .diff(&full)
        .unwrap()
        .is_empty());
    assert_eq!(ns.sh("nft list tables").lines().count(), 1);
}

#[kernel_test]
fn a_ruleset_the_kernel_rejects_leaves_the_previous_one() {
    let ns = TestNetns::new();
    let good = plan(&CaptureConfig::istio_sidecar_default()).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&good)
        .map(|_| ())
        .unwrap();
    let before = ns.sh(&format!("nft list table inet {TABLE}"));
    // REDIRECT is only valid in nat chains: put one in the raw stage.
    let mut bad = good.clone();
    bad.chains.push(Chain {
        family: Family::V4,
        stage: Stage::Raw,
        name: "OUTPUT".into(),
        hook: Some(redirect_model::Hook::Output),
        rules: vec![Rule::new(
            vec![Match::Proto(L4::Tcp)],
            Action::Redirect(15001),
        )],
    });
    let err = redirect_kernel::testing::nft_in(ns.path())
        .apply(&bad)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("raw_ip_output"),
        "the error names the rule: {err}"
    );
    assert!(err.contains("errno"), "{err}");
    let after = ns.sh(&format!("nft list table inet {TABLE}"));
    assert_eq!(before, after);
    // Also on a namespace without our table: nothing is left behind.
    let empty = TestNetns::new();
    assert!(redirect_kernel::testing::nft_in(empty.path())
        .apply(&bad)
        .map(|_| ())
        .is_err());
    assert_eq!(empty.sh("nft list ruleset").trim(), "");
}

#[kernel_test]
fn remove_leaves_nothing_and_is_idempotent() {
    let ns = TestNetns::new();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&plan(&full_config()).unwrap())
        .map(|_| ())
        .unwrap();
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .remove()
        .unwrap());
    assert_eq!(ns.sh("nft list ruleset").trim(), "");
    assert!(!redirect_kernel::testing::nft_in(ns.path())
        .remove()
        .unwrap());
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .is_none());
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path())
            .diff(&plan(&CaptureConfig::default()).unwrap())
            .unwrap(),
        vec![Difference::TableMissing]
    );
}

#[kernel_test]
fn a_rule_deleted_by_hand_is_reported() {
    let ns = TestNetns::new();
    let rs = plan(&CaptureConfig::istio_sidecar_default()).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .unwrap();
    // Delete the last rule of the v4 ISTIO_OUTPUT chain (the catch-all redirect).
    let listing = ns.sh(&format!(
        "nft -a list chain inet {TABLE} nat_ip_istio_output"
    ));
    let handle = listing
        .lines()
        .filter_map(|l| {
            l.rsplit_once("# handle ")
                .map(|(_, h)| h.trim().to_string())
        })
        .next_back()
        .expect("rules have handles");
    ns.sh(&format!(
        "nft delete rule inet {TABLE} nat_ip_istio_output handle {handle}"
    ));
    let diff = redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap();
    assert_eq!(diff.len(), 1, "{diff:#?}");
    match &diff[0] {
        Difference::RuleMissing { chain, rule, .. } => {
            assert_eq!(chain, "nat_ip_istio_output");
            // In nft syntax, as `nft_script` writes it.
            assert_eq!(rule, "jump nat_ip_istio_redirect");
        }
        d => panic!("unexpected {d:?}"),
    }
    // A set element removed by hand is reported too.
    let rs6 = plan(&full_config()).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs6)
        .map(|_| ())
        .unwrap();
    ns.sh(&format!(
        "nft delete element inet {TABLE} ip-exclude-cidrs {{ 1.2.3.4 }}"
    ));
    let diff = redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs6)
        .unwrap();
    assert!(
        matches!(&diff[..], [Difference::SetElements { set, .. }] if set == "ip-exclude-cidrs"),
        "{diff:#?}"
    );
}

#[kernel_test]
fn large_cidr_lists_load_as_one_set() {
    let ns = TestNetns::new();
    let exclude: Vec<ipnet::IpNet> = (0..10_000u32)
        .map(|i| {
            ipnet::IpNet::new(std::net::Ipv4Addr::from(0x0b00_0000 + i * 512).into(), 24).unwrap()
        })
        .collect();
    let cfg = CaptureConfig {
        outbound_exclude_cidrs: exclude,
        ..CaptureConfig::istio_sidecar_default()
    };
    let rs = plan(&cfg).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .unwrap();
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap()
        .is_empty());
}

/// A long port list is one interval set of merged ranges, read back as ranges; one that
/// merges little (every other port) a fixed-size hash of 4-byte keys, looked up with a masked
/// 4-byte load; a second apply sends nothing.
#[kernel_test]
fn long_port_lists_are_ranges_in_an_interval_set() {
    let ns = TestNetns::new();
    let rs = plan(&long_port_lists()).unwrap();
    let t = nft::lower(&rs);
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .unwrap();
    let back = redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .expect("a table");
    let set = |name: &str| back.set(name).unwrap_or_else(|| panic!("no set {name}"));
    let inbound = set("inbound-exclude-ports");
    assert!(inbound.interval(), "{inbound:?}");
    assert_eq!(text::set_elements(inbound), ["1-20000"]);
    let every_other = set("outbound-exclude-ports");
    assert!(!every_other.interval(), "{:?}", every_other.size);
    assert_eq!((every_other.key_len, every_other.size), (4, Some(32768)));
    assert_eq!(text::set_elements(every_other).len(), 32767);
    assert_eq!(
        text::set_elements(every_other)[..2],
        ["0x00020000", "0x00040000"]
    );
    let rule = back
        .chains
        .iter()
        .flat_map(|c| &c.rules)
        .map(|r| text::exprs(r))
        .find(|r| r.contains("@outbound-exclude-ports"))
        .expect("a rule looking the hashed set up");
    assert!(
        rule.contains("@th,16,32 & 0xffff0000 @outbound-exclude-ports"),
        "{rule}"
    );
    let listed = ns.sh("nft list set inet redirect_capture outbound-exclude-ports");
    assert!(listed.contains("size 32768"), "{listed}");
    assert_eq!(
        text::set_elements(set("outbound-include-ports")),
        ["1-8079", "8081-65535"]
    );
    let listed = ns.sh("nft list set inet redirect_capture outbound-include-ports");
    assert!(
        listed.contains("flags interval") && listed.contains("1-8079, 8081-65535"),
        "{listed}"
    );
    // Applied again: nothing differs, nothing is sent.
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap()
        .is_empty());
    match redirect_kernel::testing::nft_in(ns.path())
        .apply_table(&t)
        .unwrap()
    {
        nft::Applied::Updated(ch) => assert!(ch.is_empty(), "{ch:?}"),
        other => panic!("{other:?}"),
    }
}
