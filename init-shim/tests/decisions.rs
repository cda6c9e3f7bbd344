//! redirect-init's decisions on a fake namespace (`redirect_core::testing::Fake`, Istio's rules
//! in a `FakeForeign`): program, skip, refuse or replace, as the flags allow, and what each leaves.
//! No root and no kernel: where traffic would go is the model's evaluator over what the fake
//! holds.

use std::ffi::OsString;
use std::net::IpAddr;

use init_shim::flags::{self, Parsed};
use init_shim::run::{self, Failure};
use init_shim::settings::Settings;
use redirect_core::eval::{Flow, Verdict};
use redirect_core::foreign::{ForeignRules as IstioRules, Leftover, Variant};
use redirect_core::testing::Fake;
use redirect_core::testing::FakeForeign;
use redirect_core::Backend;
use redirect_core::Family;
use redirect_core::Namespace;

/// Istio's sidecar arguments, and more.
fn settings(extra: &[&str]) -> Settings {
    let args: Vec<OsString> = ["redirect-init", "-p", "15001", "-z", "15006", "-u", "1337"]
        .iter()
        .chain(["-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*"].iter())
        .chain(["-d", "15090,15021,15020"].iter())
        .chain(extra)
        .map(OsString::from)
        .collect();
    let env = |_: &str| None;
    match flags::parse(args, &env).expect("the flags parse") {
        Parsed::Run(r) => Settings::from_resolved(&r).expect("the settings are valid"),
        Parsed::Info(t) => panic!("{t}"),
    }
}

fn fake() -> Fake {
    Fake::with_addresses(&["10.44.0.7".parse::<IpAddr>().unwrap()])
}

fn run(fake: &Fake, istio: &FakeForeign, extra: &[&str]) -> Result<(), Failure> {
    let ns = Namespace::with_backend(Box::new(fake.clone())).with_foreign(istio.clone());
    run::run_with(settings(extra), &ns)
}

fn no_istio() -> FakeForeign {
    FakeForeign::default()
}

fn outbound_port(fake: &Fake) -> Option<u16> {
    let flow: Flow = "out tcp uid=1000 10.96.0.1:80".parse().unwrap();
    match fake.evaluate(&flow).expect("a table").verdict {
        Verdict::Redirect { port, .. } => Some(port),
        _ => None,
    }
}

fn istio_chain() -> Leftover {
    Leftover {
        family: Family::V4,
        variant: Variant::Nft,
        table: "nat".into(),
        chain: "ISTIO_OUTPUT".into(),
        rules: 9,
        jumps: 1,
    }
}

#[test]
fn a_first_run_programs_and_a_second_finds_its_rules_in_place() {
    let (fake, istio) = (fake(), no_istio());
    run(&fake, &istio, &[]).unwrap();
    assert_eq!(outbound_port(&fake), Some(15001));
    assert_eq!(fake.state().batches, 1);
    run(&fake, &istio, &[]).unwrap();
    assert_eq!(fake.state().batches, 1, "rules in place: nothing sent");
    run(&fake, &istio, &["--force-apply"]).unwrap();
    assert_eq!(
        fake.state().batches,
        1,
        "--force-apply of equal rules: the update is empty, still nothing sent"
    );
}

#[test]
fn our_rules_for_another_config_are_refused_unless_reconcile() {
    let (fake, istio) = (fake(), no_istio());
    run(&fake, &istio, &["-p", "16001"]).unwrap();
    let e = run(&fake, &istio, &[]).unwrap_err();
    assert_eq!(e.code, 1);
    assert!(
        e.message.contains("our rules for another configuration")
            && e.message.contains("--reconcile"),
        "{}",
        e.message
    );
    assert_eq!(
        outbound_port(&fake),
        Some(16001),
        "the refused run changed nothing"
    );
    run(&fake, &istio, &["--reconcile"]).unwrap();
    assert_eq!(
        outbound_port(&fake),
        Some(15001),
        "--reconcile replaced them"
    );
}

#[test]
fn rules_that_cannot_be_removed_are_not_replaced_and_nothing_is_programmed() {
    let fake = fake();
    let unread = "iptables-legacy IPv4 tables (nat) that no iptables-legacy-save here can read";
    let istio = FakeForeign::new(IstioRules {
        unread: vec![unread.into()],
        ..Default::default()
    });
    let e = run(&fake, &istio, &["--reconcile"]).unwrap_err();
    assert!(
        e.message.contains("cannot be replaced here"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains(unread),
        "names what it found: {}",
        e.message
    );
    assert!(
        e.message.contains("iptables-legacy-save"),
        "says the way: {}",
        e.message
    );
    assert_eq!(fake.state().batches, 0, "nothing programmed");
    assert!(!istio.rules().is_empty(), "what was there is left alone");
    // Refused by default too, naming them.
    let e = run(&fake, &istio, &[]).unwrap_err();
    assert!(e.message.contains(unread), "{}", e.message);
}

#[test]
fn istio_rules_are_refused_then_replaced_after_ours_are_in() {
    let fake = fake();
    let istio = FakeForeign::new(IstioRules {
        nft_tables: vec!["istio-proxy-nat".into()],
        chains: vec![istio_chain()],
        unread: Vec::new(),
    });
    let e = run(&fake, &istio, &["--force-apply"]).unwrap_err();
    assert!(e.message.contains("Istio's capture rules"), "{}", e.message);
    assert_eq!(fake.state().batches, 0, "nothing programmed");
    assert!(!istio.rules().is_empty(), "Istio's rules left alone");
    run(&fake, &istio, &["--reconcile"]).unwrap();
    assert_eq!(outbound_port(&fake), Some(15001));
    assert!(istio.rules().is_empty(), "Istio's rules removed");
}

#[test]
fn tproxy_adds_its_routing_and_cleanup_takes_everything_back() {
    let (fake, istio) = (fake(), no_istio());
    run(&fake, &istio, &["-m", "TPROXY"]).unwrap();
    let st = fake.state();
    assert!(st.table.is_some() && st.tproxy.len() == 1, "{st:?}");
    run(&fake, &istio, &["--cleanup-only"]).unwrap();
    let st = fake.state();
    assert!(st.table.is_none() && st.tproxy.is_empty(), "{st:?}");
}

#[test]
fn dry_runs_and_a_refusing_kernel_leave_the_namespace_as_it_was() {
    let (fake, istio) = (fake(), no_istio());
    run(&fake, &istio, &["--dry-run"]).unwrap();
    assert_eq!(fake.state().batches, 0);
    fake.update(|st| st.deny_writes = true);
    let e = run(&fake, &istio, &[]).unwrap_err();
    assert_eq!(e.code, 1);
    assert!(
        e.message.contains("Operation not permitted"),
        "{}",
        e.message
    );
    assert!(fake.read_table().unwrap().is_none());
}

/// A kernel without nftables' tproxy expression: redirect-init fails (exit 1) naming the
/// feature, its module and the iptables backend, and leaves no table and no route (the qemu
/// test without nft_tproxy expects this line on stderr).
#[test]
fn a_kernel_without_a_feature_is_named_with_the_iptables_way_out() {
    let (fake, istio) = (fake(), no_istio());
    fake.update(|st| {
        st.missing_features = vec![redirect_core::error::KernelFeature {
            name: "nftables' tproxy expression".into(),
            module: "nft_tproxy".into(),
            since: Some("4.19"),
        }]
    });
    let e = run(&fake, &istio, &["-m", "TPROXY"]).unwrap_err();
    assert_eq!(e.code, 1);
    assert_eq!(
        e.message,
        "the kernel lacks nftables' tproxy expression (module nft_tproxy, Linux 4.19 or later): \
         load it with 'modprobe nft_tproxy', or use --backend iptables (istio-iptables' TPROXY \
         target, module xt_TPROXY)"
    );
    let st = fake.state();
    assert!(st.table.is_none(), "{st:?}");
    assert!(st.tproxy.values().all(|t| t.is_absent()), "{st:?}");
}
