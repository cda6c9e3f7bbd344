//! Istio's iptables form, built by us, against Istio's own goldens: for every case of
//! `testdata/istio/iptables/` (its `.restore`, and its `.restore6` when the case has IPv6) and
//! of `testdata/istio/cni/`, each chain holds, rule for rule and word for word, what Istio's
//! restore file leaves in it once its inserts are placed. Addresses are compared as addresses
//! (Istio writes a resolver as `/etc/resolv.conf` spells it).
//!
//! Then in the kernel: written over netlink in place of our table (`Nft::hand_over_xt`), the
//! tables equal, expression for expression (`nft --debug=netlink list ruleset`) and line for
//! line (`iptables-nft-save`, `ip6tables-nft-save`), what `iptables-nft-restore` makes of
//! Istio's restore files in a fresh namespace, and our table is gone.

mod common;

use std::collections::BTreeMap;

use common::{config_of, differing, listing};
use redirect_istio::iptables_form::{chains, IstioIptables};
use redirect_kernel::nft::Nft;
use redirect_testkit::istio::{
    group_gid, list_cases, list_cni_cases, load_istio_case_with, IstioCase,
};
use redirect_testkit::{kernel_test, plan_with, TestNetns};

fn word(w: &str) -> String {
    match w.parse::<ipnet::IpNet>() {
        Ok(n) => n.to_string(),
        Err(_) => w.to_string(),
    }
}

/// Each chain's rules once the restore file is applied, by "table chain".
fn restored(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut table = String::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
            continue;
        }
        let w: Vec<String> = line.split_whitespace().map(word).collect();
        let w: Vec<&str> = w.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["-A", c, rest @ ..] => out
                .entry(format!("{table} {c}"))
                .or_default()
                .push(rest.join(" ")),
            ["-I", c, n, rest @ ..] => {
                let list = out.entry(format!("{table} {c}")).or_default();
                let at = n
                    .parse::<usize>()
                    .unwrap()
                    .saturating_sub(1)
                    .min(list.len());
                list.insert(at, rest.join(" "));
            }
            ["-N", _] | ["COMMIT"] | [] => {}
            _ => panic!("a restore line this test does not know: {line}"),
        }
    }
    out
}

fn ours(rules: &[redirect_istio::iptables_form::XtRule]) -> BTreeMap<String, Vec<String>> {
    chains(rules)
        .into_iter()
        .map(|((t, c), rules)| {
            let rules = rules
                .iter()
                .map(|r| r.split(' ').map(word).collect::<Vec<_>>().join(" "))
                .collect();
            (format!("{t} {c}"), rules)
        })
        .collect()
}

fn compare(case: &IstioCase, wrong: &mut Vec<String>) {
    let built = IstioIptables::build(&config_of(case)).unwrap();
    let v4 = std::fs::read_to_string(case.restore_path()).unwrap();
    if restored(&v4) != ours(&built.v4) {
        wrong.push(format!(
            "{} (IPv4):\n  Istio: {:#?}\n  ours:  {:#?}",
            case.name,
            restored(&v4),
            ours(&built.v4)
        ));
    }
    match (&built.v6, case.enable_ipv6) {
        (Some(v6rules), true) => {
            let v6 = std::fs::read_to_string(case.restore6_path()).unwrap();
            if restored(&v6) != ours(v6rules) {
                wrong.push(format!(
                    "{} (IPv6):\n  Istio: {:#?}\n  ours:  {:#?}",
                    case.name,
                    restored(&v6),
                    ours(v6rules)
                ));
            }
        }
        (None, false) => {}
        (v6, ipv6) => wrong.push(format!("{}: IPv6 {ipv6}, ours {v6:?}", case.name)),
    }
}

#[test]
fn istios_iptables_rules_equal_what_each_golden_leaves_in_each_chain() {
    let mut wrong = Vec::new();
    let (cases, cni) = (list_cases(), list_cni_cases());
    assert_eq!(
        (cases.len(), cni.len()),
        (27, 9),
        "Istio's iptables and CNI cases"
    );
    for name in &cases {
        compare(&IstioCase::load(name), &mut wrong);
    }
    for name in &cni {
        compare(&IstioCase::load_cni(name), &mut wrong);
    }
    assert!(
        wrong.is_empty(),
        "{} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[kernel_test]
fn handed_back_iptables_tables_are_what_iptables_nft_restore_makes_of_each_golden() {
    let groups = |n: &str| group_gid(n);
    let mut wrong = Vec::new();
    let all = list_cases().into_iter().map(|n| IstioCase::load(&n));
    for case in all.chain(
        list_cni_cases()
            .into_iter()
            .map(|n| IstioCase::load_cni(&n)),
    ) {
        let cfg = config_of(&case);
        let tables = IstioIptables::build(&cfg).unwrap().lower(&groups).unwrap();
        let istio = TestNetns::new();
        load_istio_case_with(&istio, &case, Some("nft"));
        let handed = TestNetns::new();
        let rs = plan_with(&cfg, &groups).unwrap();
        let had_ours = handed.run(|| {
            let nft = Nft::open().unwrap();
            nft.apply(&rs).unwrap();
            nft.hand_over_xt(&tables)
        });
        match had_ours {
            Ok(true) => {}
            other => {
                wrong.push(format!("{}: {other:?}", case.name));
                continue;
            }
        }
        if let Some(diff) = differing(&listing(&istio), &listing(&handed)) {
            wrong.push(format!("{}:\n{diff}", case.name));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cases differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
