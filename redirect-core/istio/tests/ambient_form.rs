//! Istio's ambient in-pod rules in its iptables form, built by us: for Istio's default config
//! and for an ingress pod with virtual interfaces and no DNS capture, each chain holds, word for
//! word, what Istio's agent leaves in it (its `AppendInpodRules`, as its own test data shows).
//!
//! Then in the kernel, for each combination of DNS capture, IPv6, inbound bypass and virtual
//! interfaces: written over netlink in place of our in-pod table (`Nft::hand_over_xt`), the
//! tables equal, expression for expression and line for line, what `iptables-nft-restore`
//! makes of the same rules as Istio's restore file holds them.

mod common;

use std::collections::BTreeMap;

use common::{ambient_combinations, handed_over_differs, none_wrong};
use redirect_istio::iptables_form::{chains, restore_file, IstioIptables, XtRule};
use redirect_model::AmbientConfig;
use redirect_testkit::istio::iptables_restore_with;
use redirect_testkit::{kernel_test, TestNetns};

fn state(rules: &[XtRule]) -> BTreeMap<String, Vec<String>> {
    chains(rules)
        .into_iter()
        .map(|((t, c), r)| (format!("{t} {c}"), r))
        .collect()
}

fn expect(rows: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
        .collect()
}

const MARK: &str = "0x539/0xfff";

#[test]
fn the_default_pods_rules_are_istios_chain_for_chain() {
    let built = IstioIptables::ambient(&AmbientConfig::default());
    let not_mark = format!("-m mark ! --mark {MARK}");
    let want = expect(&[
        ("mangle PREROUTING", &["-j ISTIO_PRERT"]),
        ("mangle OUTPUT", &["-j ISTIO_OUTPUT"]),
        ("mangle ISTIO_PRERT", &["-m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff"]),
        (
            "mangle ISTIO_OUTPUT",
            &["-m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"],
        ),
        ("nat OUTPUT", &["-j ISTIO_OUTPUT"]),
        ("nat PREROUTING", &["-j ISTIO_PRERT"]),
        (
            "nat ISTIO_PRERT",
            &[
                "-s 169.254.7.127 -p tcp -m tcp -j ACCEPT",
                &format!("! -d 127.0.0.1/32 -p tcp ! --dport 15008 {not_mark} -j REDIRECT --to-ports 15006"),
            ],
        ),
        (
            "nat ISTIO_OUTPUT",
            &[
                "-d 169.254.7.127 -p tcp -m tcp -j ACCEPT",
                &format!("! -o lo -p udp {not_mark} -m udp --dport 53 -j REDIRECT --to-port 15053"),
                &format!("! -d 127.0.0.1/32 -p tcp --dport 53 {not_mark} -j REDIRECT --to-ports 15053"),
                "-p tcp -m mark --mark 0x111/0xfff -j ACCEPT",
                "! -d 127.0.0.1/32 -o lo -j ACCEPT",
                &format!("! -d 127.0.0.1/32 -p tcp {not_mark} -j REDIRECT --to-ports 15001"),
            ],
        ),
        ("raw PREROUTING", &["-j ISTIO_PRERT"]),
        ("raw OUTPUT", &["-j ISTIO_OUTPUT"]),
        ("raw ISTIO_OUTPUT", &[&format!("-p udp -m mark --mark {MARK} -m udp --dport 53 -j CT --zone 1")]),
        ("raw ISTIO_PRERT", &[&format!("-p udp {not_mark} -m udp --sport 53 -j CT --zone 1")]),
    ]);
    assert_eq!(state(&built.v4), want);
    let v6 = built.v6.expect("IPv6 is on by default");
    let v6_state = state(&v6);
    assert_eq!(
        v6_state["nat ISTIO_PRERT"][0],
        "-s fd16:9254:7127:1337:ffff:ffff:ffff:ffff -p tcp -m tcp -j ACCEPT"
    );
    assert_eq!(
        v6_state["nat ISTIO_OUTPUT"][5],
        format!("! -d ::1/128 -p tcp {not_mark} -j REDIRECT --to-ports 15001")
    );
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
    let built = IstioIptables::ambient(&cfg);
    assert_eq!(built.v6, None);
    let got = state(&built.v4);
    assert_eq!(
        got["nat ISTIO_PRERT"],
        [
            "-i fake1s0f0 -p tcp -j REDIRECT --to-ports 15001",
            "-i fake1s0f0 -p tcp -j RETURN",
            "-i fake1s0f1 -p tcp -j REDIRECT --to-ports 15001",
            "-i fake1s0f1 -p tcp -j RETURN",
        ]
    );
    assert_eq!(
        got["nat ISTIO_OUTPUT"],
        [
            "-d 169.254.7.127 -p tcp -m tcp -j ACCEPT".to_string(),
            "-p tcp -m mark --mark 0x111/0xfff -j ACCEPT".to_string(),
            "! -d 127.0.0.1/32 -o lo -j ACCEPT".to_string(),
            format!(
                "! -d 127.0.0.1/32 -p tcp -m mark ! --mark {MARK} -j REDIRECT --to-ports 15001"
            ),
        ]
    );
    assert!(!got.keys().any(|k| k.starts_with("raw")), "{got:?}");
}

#[kernel_test]
fn handed_back_ambient_tables_are_what_iptables_nft_restore_makes_of_istios_rules() {
    let mut wrong = Vec::new();
    let mut cases = 0;
    for (name, cfg) in ambient_combinations(&["kubevirt0"]) {
        cases += 1;
        let istio_rules = IstioIptables::ambient(&cfg);
        let istio = TestNetns::new();
        let dir = tempfile_dir();
        for (v6, rules) in [
            (false, Some(&istio_rules.v4)),
            (true, istio_rules.v6.as_ref()),
        ] {
            if let Some(rules) = rules {
                let path = dir.join(format!("{cases}-{v6}.restore"));
                std::fs::write(&path, restore_file(rules)).unwrap();
                iptables_restore_with(&istio, v6, &path, Some("nft"));
            }
        }
        let tables = istio_rules.lower(&redirect_model::NoGroupDatabase).unwrap();
        wrong.extend(handed_over_differs(&name, &cfg, &istio, |nft| {
            nft.hand_over_xt(&tables)
        }));
    }
    none_wrong(&wrong, cases);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rdt-ambient-form-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
