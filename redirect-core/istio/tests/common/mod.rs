//! What the tests of Istio's data share: a case's configuration as a `CaptureConfig`, and
//! what a namespace's xtables tables hold, for comparing ours with iptables-nft-restore's.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::net::IpAddr;

use redirect_model::{
    parse::parse_cidr_selection, parse::parse_cidrs, parse::parse_groups,
    parse::parse_port_selection, CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection,
};
use redirect_testkit::istio::IstioCase;
use redirect_testkit::TestNetns;

/// The case's configuration as a `CaptureConfig`, through our own parsers of Istio's syntax.
pub fn config_of(case: &IstioCase) -> CaptureConfig {
    let s = |k: &str| {
        case.raw
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let b = |k: &str| case.raw.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    let ids = |k: &'static str| redirect_model::parse::parse_ids(k, &s(k)).unwrap();
    let mut servers: Vec<IpAddr> = case.dns_servers_v4.iter().map(|a| IpAddr::V4(*a)).collect();
    servers.extend(case.dns_servers_v6.iter().map(|a| IpAddr::V6(*a)));
    let groups_exclude = match parse_groups("x", &s("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")) {
        Ok(Selection::List(l)) => l,
        _ => Vec::<GroupRef>::new(),
    };
    let cfg = CaptureConfig {
        envoy_port: s("envoy-port").parse().unwrap(),
        inbound_capture_port: s("inbound-capture-port").parse().unwrap(),
        inbound_tunnel_port: s("inbound-tunnel-port").parse().unwrap(),
        proxy_uids: ids("proxy-uid"),
        proxy_gids: ids("proxy-gid"),
        mode: InterceptionMode::parse("m", &s("istio-inbound-interception-mode")).unwrap(),
        inbound_ports: parse_port_selection("b", &s("istio-inbound-ports")).unwrap(),
        inbound_exclude_ports: redirect_model::parse::parse_ports(
            "d",
            &s("istio-local-exclude-ports"),
        )
        .unwrap(),
        outbound_include_cidrs: parse_cidr_selection("i", &s("istio-service-cidr")).unwrap(),
        outbound_exclude_cidrs: parse_cidrs("x", &s("istio-service-exclude-cidr")).unwrap(),
        outbound_include_ports: redirect_model::parse::parse_ports("q", &s("istio-outbound-ports"))
            .unwrap(),
        outbound_exclude_ports: redirect_model::parse::parse_ports(
            "o",
            &s("istio-local-outbound-ports-exclude"),
        )
        .unwrap(),
        exclude_interfaces: redirect_model::parse::parse_interfaces(
            "c",
            &s("istio-exclude-interfaces"),
        )
        .unwrap(),
        reroute_interfaces: redirect_model::parse::parse_interfaces(
            "k",
            &s("kube-virt-interfaces"),
        )
        .unwrap(),
        tproxy_mark: s("istio-inbound-tproxy-mark").parse().unwrap(),
        tproxy_route_table: s("istio-inbound-tproxy-route-table").parse().unwrap(),
        dns: DnsCapture::from_istio(b("redirect-dns"), b("capture-all-dns"), &servers),
        drop_invalid: b("drop-invalid"),
        owner_groups_include: parse_groups("g", &s("ISTIO_OUTBOUND_OWNER_GROUPS")).unwrap(),
        owner_groups_exclude: groups_exclude,
        ipv4_loopback_cidr: redirect_model::parse::parse_loopback_cidr(
            "l",
            &s("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"),
        )
        .unwrap(),
        ipv6: b("enable-ipv6"),
        bypass_uids: Vec::new(),
        bypass_gids: Vec::new(),
        counters: false,
    };
    cfg.validate()
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    cfg
}

/// What a namespace holds, handles left out: every expression of every rule, then each
/// family's iptables-nft-save without its comments and counters.
pub fn listing(ns: &TestNetns) -> String {
    let nft = ns
        .sh("nft --debug=netlink list ruleset")
        .lines()
        .map(|l| {
            // `ip[6]|inet <table> <chain> <handle> [<position>]`: the handles are the kernel's.
            let family = l.starts_with("ip") || l.starts_with("inet ");
            let rule_head = family && l.split(' ').count() > 3 && !l.contains('@');
            match rule_head {
                true => l.split(' ').take(3).collect::<Vec<_>>().join(" "),
                false => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let save = |bin: &str| redirect_testkit::istio::saved(ns, bin);
    format!(
        "{nft}\n{}\n{}",
        save("iptables-nft-save"),
        save("ip6tables-nft-save")
    )
}

/// The lines where Istio's listing and ours differ (the first six), `None` when they are equal.
pub fn differing(istio: &str, ours: &str) -> Option<String> {
    (istio != ours).then(|| {
        istio
            .lines()
            .zip(ours.lines())
            .filter(|(a, b)| a != b)
            .take(6)
            .map(|(a, b)| format!("  istio: {a}\n  ours:  {b}"))
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Every combination of DNS capture, IPv6, inbound bypass and virtual interfaces (`virtual`
/// when on), each with its name: the 16 ambient configs the form tests write.
pub fn ambient_combinations(
    virtual_interfaces: &[&str],
) -> Vec<(String, redirect_model::AmbientConfig)> {
    (0..16u8)
        .map(|n| {
            let (dns, ipv6, bypass, virt) = (n & 1 != 0, n & 2 != 0, n & 4 != 0, n & 8 != 0);
            let cfg = redirect_model::AmbientConfig {
                dns_capture: dns,
                ipv6,
                bypass_inbound: bypass,
                virtual_interfaces: match virt {
                    true => virtual_interfaces.iter().map(|i| i.to_string()).collect(),
                    false => Vec::new(),
                },
                ..Default::default()
            };
            let name = format!("dns {dns}, ipv6 {ipv6}, bypass {bypass}, virtual {virt}");
            (name, cfg)
        })
        .collect()
}

/// Fails naming every case in `wrong` (of `cases`, which must be 16).
pub fn none_wrong(wrong: &[String], cases: usize) {
    assert_eq!(cases, 16);
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Our in-pod rules for `cfg` in a fresh namespace, then `hand` (one of the hand-overs) in
/// their place: what differs from `istio`'s listing, or how the hand-over went wrong, named
/// `name`; `None` when the two are the same.
pub fn handed_over_differs<E: std::fmt::Debug + Send>(
    name: &str,
    cfg: &redirect_model::AmbientConfig,
    istio: &TestNetns,
    hand: impl FnOnce(&redirect_kernel::nft::Nft) -> Result<bool, E> + Send,
) -> Option<String> {
    let handed = TestNetns::new();
    let ours = cfg.plan().unwrap();
    let had_ours = handed.run(|| {
        let nft = redirect_kernel::nft::Nft::open().unwrap();
        nft.apply(&ours).unwrap();
        hand(&nft)
    });
    if !matches!(had_ours, Ok(true)) {
        return Some(format!("{name}: {had_ours:?}"));
    }
    differing(&listing(istio), &listing(&handed)).map(|diff| format!("{name}:\n{diff}"))
}
