//! Updating our table in place, against the kernel: every configuration reached from every
//! other with the table kept (same handle), the unchanged parts untouched, a stranger's rules,
//! chains and sets in our table removed, objects whose kind changed deleted and added again,
//! and nothing sent when the table already holds the plan. Each test has fresh namespaces.

use redirect_kernel::nft::{self, Applied, Changes, Difference, TABLE};
use redirect_model::{CaptureConfig, DnsCapture, InterceptionMode, Selection};
use redirect_testkit::plan;
use redirect_testkit::{kernel_test, netns::TestNetns};

fn configs() -> Vec<(&'static str, CaptureConfig)> {
    vec![
        ("istio default", CaptureConfig::istio_sidecar_default()),
        (
            "ipv6 tproxy dns",
            CaptureConfig {
                ipv6: true,
                mode: InterceptionMode::Tproxy,
                dns: DnsCapture::All,
                drop_invalid: true,
                ..CaptureConfig::istio_sidecar_default()
            },
        ),
        (
            "cidrs and ports",
            CaptureConfig {
                outbound_include_cidrs: Selection::List(vec!["10.0.0.0/8".parse().unwrap()]),
                outbound_exclude_cidrs: vec![
                    "10.96.0.0/12".parse().unwrap(),
                    "1.2.3.4/32".parse().unwrap(),
                ],
                inbound_exclude_ports: vec![15090, 15021, 15020, 9000],
                outbound_exclude_ports: vec![15020, 3306],
                bypass_uids: vec![4000],
                ..CaptureConfig::istio_sidecar_default()
            },
        ),
        ("base", CaptureConfig::default()),
    ]
}

/// The handle nft shows for our table (`table inet redirect_capture { # handle N`).
fn table_handle(ns: &TestNetns) -> String {
    let listing = ns.sh(&format!("nft -a list table inet {TABLE}"));
    listing
        .lines()
        .find(|l| l.contains(TABLE))
        .and_then(|l| l.rsplit_once("# handle "))
        .map(|(_, h)| h.trim().to_string())
        .unwrap_or_else(|| panic!("no handle for our table in {listing:?}"))
}

/// Apply in `ns`: `None` when the table was created, the changes when it was updated.
fn apply_table_in(ns: &TestNetns, cfg: &CaptureConfig) -> Option<Changes> {
    let t = nft::lower(&plan(cfg).unwrap());
    match redirect_kernel::testing::nft_in(ns.path())
        .apply_table(&t)
        .unwrap()
    {
        Applied::Created => None,
        Applied::Updated(ch) => Some(ch),
        Applied::Replaced => panic!("replaced, with no other writer"),
    }
}

fn updated(a: Applied) -> Changes {
    match a {
        Applied::Updated(ch) => ch,
        other => panic!("not an update: {other:?}"),
    }
}

#[kernel_test]
fn every_config_is_reached_from_every_other_in_place() {
    let mut updates = 0;
    for (from_name, from) in configs() {
        for (to_name, to) in configs() {
            let what = format!("{from_name} -> {to_name}");
            let ns = TestNetns::new();
            assert_eq!(
                apply_table_in(&ns, &from),
                None,
                "{what}: first apply creates"
            );
            let handle = table_handle(&ns);
            let changes = apply_table_in(&ns, &to).expect("an update");
            let rs = plan(&to).unwrap();
            assert_eq!(
                redirect_kernel::testing::nft_in(ns.path())
                    .read()
                    .unwrap()
                    .as_ref(),
                Some(&nft::expected(&rs)),
                "{what}"
            );
            assert_eq!(table_handle(&ns), handle, "{what}: the table was replaced");
            assert_eq!(ns.sh("nft list tables").lines().count(), 1, "{what}");
            if from_name == to_name {
                assert!(changes.is_empty(), "{what}: {changes:?}");
            } else {
                assert!(!changes.is_empty(), "{what}");
                updates += 1;
            }
            // And traffic-independent: a second apply of the same finds nothing to do.
            assert!(apply_table_in(&ns, &to).unwrap().is_empty(), "{what}");
        }
    }
    assert_eq!(updates, 12);
}

#[kernel_test]
fn an_update_touches_only_what_changed() {
    let ns = TestNetns::new();
    let a = CaptureConfig::istio_sidecar_default();
    let b = CaptureConfig {
        inbound_exclude_ports: vec![15090, 15021, 15020, 9000],
        ..a.clone()
    };
    apply_table_in(&ns, &a);
    let handles = ns.sh(&format!("nft -a list table inet {TABLE}"));
    let changes = apply_table_in(&ns, &b).unwrap();
    // The port list is a set: refilled, and no chain is touched.
    assert!(changes.refilled_chains.is_empty(), "{changes:?}");
    assert!(changes.recreated_chains.is_empty() && changes.deleted_chains.is_empty());
    assert_eq!(changes.refilled_sets.len(), 1, "{changes:?}");
    let after = ns.sh(&format!("nft -a list table inet {TABLE}"));
    let rule_handles = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| !l.contains("elements") && l.contains("# handle"))
            .map(|l| l.trim().to_string())
            .collect()
    };
    assert_eq!(rule_handles(&after), rule_handles(&handles));
}

#[kernel_test]
fn strangers_in_our_table_are_reported_and_removed_by_the_next_apply() {
    let ns = TestNetns::new();
    let cfg = CaptureConfig::istio_sidecar_default();
    let rs = plan(&cfg).unwrap();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .unwrap();
    ns.sh(&format!(
        "nft add rule inet {TABLE} nat_ip_istio_output meta l4proto udp limit rate 10/second counter accept"
    ));
    ns.sh(&format!("nft add chain inet {TABLE} stranger"));
    ns.sh(&format!(
        "nft 'add set inet {TABLE} stranger-set {{ type ipv4_addr; elements = {{ 192.0.2.1 }} ; }}'"
    ));
    let diff = redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap();
    let text: Vec<String> = diff.iter().map(|d| d.to_string()).collect();
    // The stranger's rule is shown in nft syntax where it can be, and its limit by name with
    // its raw attributes: nothing is dropped.
    assert!(
        diff.iter()
            .any(|d| matches!(d, Difference::RuleUnexpected { rule, .. }
            if rule.starts_with("meta l4proto udp [ limit ") && rule.ends_with("counter accept"))),
        "{text:#?}"
    );
    assert!(diff.contains(&Difference::ChainUnexpected {
        chain: "stranger".into()
    }));
    assert!(diff.contains(&Difference::SetUnexpected {
        set: "stranger-set".into()
    }));
    let changes = updated(
        redirect_kernel::testing::nft_in(ns.path())
            .apply_table(&nft::lower(&rs))
            .unwrap(),
    );
    assert_eq!(changes.refilled_chains, ["nat_ip_istio_output"]);
    assert_eq!(changes.deleted_chains, ["stranger"]);
    assert_eq!(changes.deleted_sets, ["stranger-set"]);
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap()
        .is_empty());
}

#[kernel_test]
fn objects_whose_kind_changed_are_deleted_and_added_again() {
    let ns = TestNetns::new();
    let cfg = CaptureConfig {
        outbound_exclude_cidrs: vec![
            "10.96.0.0/12".parse().unwrap(),
            "1.2.3.4/32".parse().unwrap(),
        ],
        ..CaptureConfig::istio_sidecar_default()
    };
    let rs = plan(&cfg).unwrap();
    // Our table as another version might have left it: the exclude set keyed by port, the
    // output base chain as a regular chain, and a chain of ours that jumps to it and looks
    // the set up (references the kernel counts).
    let script = format!(
        "table inet {TABLE} {{
           set ip-exclude-cidrs {{ type inet_service; elements = {{ 53 }} }}
           chain nat_output {{ }}
           chain nat_ip_istio_output {{ th dport @ip-exclude-cidrs return; jump nat_output; }}
         }}"
    );
    ns.try_sh(&format!("nft -f - <<'EOF'\n{script}\nEOF"))
        .unwrap_or_else(|e| panic!("{e}"));
    let changes = updated(
        redirect_kernel::testing::nft_in(ns.path())
            .apply_table(&nft::lower(&rs))
            .unwrap(),
    );
    assert_eq!(changes.recreated_sets, ["ip-exclude-cidrs"], "{changes:?}");
    assert_eq!(changes.recreated_chains, ["nat_output"], "{changes:?}");
    assert!(changes
        .refilled_chains
        .contains(&"nat_ip_istio_output".to_string()));
    assert_eq!(
        redirect_kernel::testing::nft_in(ns.path()).read().unwrap(),
        Some(nft::expected(&rs))
    );
}

/// Writers racing on one namespace, each with its own configuration: every apply succeeds
/// (re-reading when the ruleset moved, replacing the table when it keeps moving) and the table
/// ends equal to one of the plans, never to a mix.
#[kernel_test]
fn racing_writers_all_succeed_and_leave_one_whole_plan() {
    let ns = TestNetns::new();
    let plans: Vec<_> = configs()
        .into_iter()
        .map(|(_, c)| plan(&c).unwrap())
        .collect();
    let outcomes = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for w in 0..8 {
            let (ns, plans, outcomes) = (&ns, &plans, &outcomes);
            s.spawn(move || {
                for round in 0..10 {
                    let t = nft::lower(&plans[(w + round) % plans.len()]);
                    let r = redirect_kernel::testing::nft_in(ns.path()).apply_table(&t);
                    outcomes.lock().unwrap().push(r.map_err(|e| e.to_string()));
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let failed: Vec<_> = outcomes.iter().filter(|o| o.is_err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    let replaced = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Applied::Replaced)))
        .count();
    eprintln!("80 racing applies: all succeeded, {replaced} fell back to a replace");
    let state = redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .unwrap();
    assert!(
        plans.iter().any(|rs| state == nft::expected(rs)),
        "the table is no plan whole"
    );
}
