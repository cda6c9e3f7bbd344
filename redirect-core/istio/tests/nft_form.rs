//! Istio's native nftables form, built by us, against Istio's own goldens
//! (`testdata/istio/nftables/`, 28 cases):
//!
//! - its rules, text for text, equal what each golden leaves in each chain once its inserts are
//!   placed (no kernel);
//! - written over netlink in place of our table, the tables equal, expression for expression
//!   (`nft --debug=netlink list ruleset`), what `nft -f <golden>` makes of the golden in a fresh
//!   namespace, and our table is gone.

mod common;

use std::collections::BTreeMap;

use common::config_of;
use redirect_istio::nft_form::IstioNft;
use redirect_kernel::nft::Nft;
use redirect_testkit::istio::{group_file, group_gid, istio_testdata_dir, IstioCase};
use redirect_testkit::{kernel_test, plan_with, TestNetns};

fn cases() -> Vec<(IstioCase, String)> {
    let dir = istio_testdata_dir().join("nftables");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".golden").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 28, "Istio's nftables test data has 28 cases");
    names
        .into_iter()
        .map(|n| {
            let golden = std::fs::read_to_string(dir.join(format!("{n}.golden"))).unwrap();
            (IstioCase::load_from(&dir, &n), golden)
        })
        .collect()
}

/// What a golden leaves: each chain's declaration and its rules in order, by "table chain".
/// Addresses are compared as addresses: Istio writes a resolver as `/etc/resolv.conf` spells
/// it (`::127.0.0.53`), where the kernel holds the same bytes.
fn final_state(golden: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut chains: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in golden.lines() {
        let words: Vec<String> = line
            .split(' ')
            .map(|w| match w.parse::<ipnet::IpNet>() {
                Ok(n) => n.to_string(),
                Err(_) => w.to_string(),
            })
            .collect();
        let w: Vec<&str> = words.iter().map(String::as_str).collect();
        match w.as_slice() {
            ["add", "chain", "inet", t, c, decl @ ..] => {
                let e = chains.entry(format!("{t} {c}")).or_default();
                e.0 = decl.join(" ");
            }
            ["add", "rule", "inet", t, c, rule @ ..] => {
                chains
                    .entry(format!("{t} {c}"))
                    .or_default()
                    .1
                    .push(rule.join(" "));
            }
            ["insert", "rule", "inet", t, c, "index", i, rule @ ..] => {
                let rules = &mut chains.entry(format!("{t} {c}")).or_default().1;
                rules.insert(i.parse().unwrap(), rule.join(" "));
            }
            ["add" | "flush", "table", ..] | [""] => {}
            _ => panic!("a golden line this test does not know: {line}"),
        }
    }
    chains
}

fn ours(nft: &IstioNft) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out = BTreeMap::new();
    for t in &nft.tables {
        for c in &t.chains {
            let decl = match c.base {
                Some(b) => format!(
                    "{{ type {} hook {} priority {} ; }}",
                    b.kind.name(),
                    match b.hook {
                        redirect_model::Hook::Prerouting => "prerouting",
                        redirect_model::Hook::Output => "output",
                        redirect_model::Hook::Postrouting => "postrouting",
                    },
                    b.priority
                ),
                None => String::new(),
            };
            let rules = c
                .rules
                .iter()
                .map(|r| redirect_istio::nft_form::RuleText(r).to_string())
                .collect();
            out.insert(format!("{} {}", t.table.name(), c.name), (decl, rules));
        }
    }
    out
}

#[test]
fn istios_rules_equal_what_each_golden_leaves_in_each_chain() {
    let mut wrong = Vec::new();
    for (case, golden) in cases() {
        let built = IstioNft::build(&config_of(&case)).unwrap();
        let (want, got) = (final_state(&golden), ours(&built));
        if want != got {
            wrong.push(format!(
                "{}:\n  Istio: {want:#?}\n  ours:  {got:#?}",
                case.name
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cases differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// `nft --debug=netlink list ruleset` without rule handles: every expression of every rule.
fn expressions(ns: &TestNetns) -> String {
    ns.sh("nft --debug=netlink list ruleset")
        .lines()
        .map(|l| match l.strip_prefix("inet ") {
            // `inet <table> <chain> <handle> [<position>]`: the handles are the kernel's.
            Some(rest) if !rest.contains('@') => {
                let w: Vec<&str> = rest.split(' ').take(2).collect();
                format!("inet {}", w.join(" "))
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `nft -f <golden>` in `ns`, where `/etc/group` also names Istio's test groups (a private
/// mount namespace; the real file is never touched).
fn nft_load(ns: &TestNetns, case: &str) {
    let path = istio_testdata_dir().join(format!("nftables/{case}.golden"));
    let group = group_file();
    ns.sh(&format!(
        "unshare -m --propagation private sh -c 'mount --bind {} /etc/group && nft -f {}'",
        group.display(),
        path.display()
    ));
    let _ = std::fs::remove_file(group);
}

#[kernel_test]
fn handed_back_tables_are_what_nft_makes_of_each_golden_and_ours_is_gone() {
    let groups = |n: &str| group_gid(n);
    let mut wrong = Vec::new();
    for (case, _) in cases() {
        let cfg = config_of(&case);
        let tables = IstioNft::build(&cfg).unwrap().lower(&groups).unwrap();
        let istio = TestNetns::new();
        nft_load(&istio, &case.name);
        let handed = TestNetns::new();
        let rs = plan_with(&cfg, &groups).unwrap();
        let had_ours = handed.run(|| {
            let nft = Nft::open().unwrap();
            nft.apply(&rs).unwrap();
            nft.hand_over(&tables).unwrap()
        });
        assert!(had_ours, "{}: our table was not there to remove", case.name);
        let (want, got) = (expressions(&istio), expressions(&handed));
        let text = |ns: &TestNetns| ns.sh("nft list ruleset");
        if want != got || text(&istio) != text(&handed) {
            wrong.push(format!(
                "{}:\n--- nft -f\n{want}\n--- ours\n{got}",
                case.name
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cases differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
