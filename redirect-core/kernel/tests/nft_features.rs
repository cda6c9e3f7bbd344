//! A kernel that lacks a feature our table needs: the check-only probe that names it commits
//! nothing, a refused apply names the feature, and a capture that fails so leaves the namespace
//! as it was (no routes, no table). The kernel tests use fresh network namespaces (root).

use redirect_kernel::backend::Backend;
use redirect_kernel::capture;
use redirect_kernel::fake::Fake;
use redirect_kernel::nft::{self, feature, Expr, Foreign, NftChain, NftTable, PROBE_TABLE};
use redirect_model::{Capture, CaptureConfig, Family, InterceptionMode};
use redirect_testkit::{kernel_test, netns::TestNetns, plan};

fn tproxy_config() -> CaptureConfig {
    CaptureConfig {
        mode: InterceptionMode::Tproxy,
        ..CaptureConfig::istio_sidecar_default()
    }
}

/// Our default table with one more chain whose one rule uses an expression no kernel has.
fn with_bogus_expression() -> NftTable {
    let mut t = nft::lower(&plan(&CaptureConfig::istio_sidecar_default()).unwrap());
    t.chains.push(NftChain {
        name: "bogus".into(),
        base: None,
        rules: vec![vec![
            Expr::Foreign(Foreign {
                name: "nosuchexpr".into(),
                attrs: vec![],
            }),
            Expr::Redir,
        ]],
    });
    t
}

fn tables(ns: &TestNetns) -> String {
    ns.sh("nft list tables")
}

/// A check-only batch (no end message) of a table that would be created leaves nothing: the
/// table does not exist afterwards and the ruleset's generation has not moved.
#[kernel_test]
fn the_probe_commits_nothing() {
    let ns = TestNetns::new();
    let nft = redirect_kernel::testing::nft_in(ns.path());
    let before = nft.generation().unwrap();
    let t = nft::lower(&plan(&tproxy_config()).unwrap());
    assert_eq!(
        nft.missing_features(&t).unwrap(),
        vec![],
        "this kernel has them all"
    );
    assert_eq!(nft.generation().unwrap(), before, "nothing was committed");
    assert!(!tables(&ns).contains(PROBE_TABLE), "{}", tables(&ns));
    assert_eq!(nft.read().unwrap(), None);
}

/// An expression the kernel does not know is named, with its module; nothing is committed.
#[kernel_test]
fn the_probe_names_an_unknown_expression() {
    let ns = TestNetns::new();
    let nft = redirect_kernel::testing::nft_in(ns.path());
    let before = nft.generation().unwrap();
    let missing = nft.missing_features(&with_bogus_expression()).unwrap();
    let names: Vec<_> = missing.iter().map(|f| f.module.as_ref()).collect();
    assert_eq!(names, ["nft_nosuchexpr"]);
    assert_eq!(nft.generation().unwrap(), before);
    assert!(!tables(&ns).contains(PROBE_TABLE));
}

/// The kernel refuses the apply (ENOENT, for the rule): the error names the missing feature
/// and the refused rule, and no table is left.
#[kernel_test]
fn a_refused_apply_names_the_missing_feature() {
    let ns = TestNetns::new();
    let nft = redirect_kernel::testing::nft_in(ns.path());
    let err = nft.apply_table(&with_bogus_expression()).unwrap_err();
    let m = err.missing_feature().unwrap_or_else(|| panic!("{err}"));
    let (what, errno) = m.refused.clone().unwrap();
    assert_eq!(errno, libc::ENOENT);
    assert!(what.contains("chain bogus"), "{what}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "the kernel lacks nftables' nosuchexpr expression (module nft_nosuchexpr): \
             load it with 'modprobe nft_nosuchexpr'; nf_tables refused rule 1 of chain bogus"
        ),
        "{text}"
    );
    assert_eq!(nft.read().unwrap(), None);
    assert!(!tables(&ns).contains(PROBE_TABLE));
}

/// A refusal that is no missing feature (a jump to a chain that does not exist: ENOENT too)
/// stays the kernel's refusal.
#[kernel_test]
fn a_refusal_for_another_cause_is_not_called_a_missing_feature() {
    let ns = TestNetns::new();
    let nft = redirect_kernel::testing::nft_in(ns.path());
    let mut t = nft::lower(&plan(&CaptureConfig::istio_sidecar_default()).unwrap());
    t.chains[0]
        .rules
        .push(vec![Expr::Verdict(nft::Verdict::Jump(
            "NO_SUCH_CHAIN".into(),
        ))]);
    match nft.apply_table(&t).unwrap_err() {
        nft::Error::Rejected { errno, .. } => assert_eq!(errno, libc::ENOENT),
        e => panic!("{e}"),
    }
}

/// With TPROXY's routes to add, the rules refused for a missing feature: the routes this apply
/// added are gone again, and there is no table.
#[kernel_test]
fn a_missing_feature_leaves_no_routes_and_no_table() {
    let ns = TestNetns::new();
    let live = redirect_kernel::testing::live_in(ns.path());
    let routes = Capture::Sidecar(tproxy_config().validated().unwrap()).routes();
    let r = routes.policy.unwrap();
    let err = capture::routes_then(&live, &routes, || {
        live.nft
            .apply_table(&with_bogus_expression())
            .map_err(redirect_kernel::Error::from)
    })
    .unwrap_err();
    assert!(err.to_string().contains("nft_nosuchexpr"), "{err}");
    for family in Family::ALL {
        assert!(
            live.read_tproxy(&r, family).unwrap().is_absent(),
            "{family:?}"
        );
    }
    assert_eq!(live.read_table().unwrap(), None);
}

/// A capture refused for a missing feature, in a namespace that lacks its routes: the error
/// names the feature and nothing is left (the routes the apply added are taken back).
#[test]
fn a_missing_feature_fails_the_capture_and_leaves_nothing() {
    let fake = Fake::default();
    fake.update(|s| s.missing_features = vec![feature::TPROXY]);
    let c = Capture::Sidecar(tproxy_config().validated().unwrap());
    let rs = c.plan(&redirect_model::NoGroupDatabase).unwrap();
    let err = capture::apply(&fake, &c, &rs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the kernel lacks nftables' tproxy expression (module nft_tproxy, Linux 4.19 or later): \
         load it with 'modprobe nft_tproxy'"
    );
    let st = fake.state();
    assert!(st.tproxy.values().all(|t| t.is_absent()), "{:?}", st.tproxy);
    assert!(st.table.is_none());
}

/// On a kernel with every feature, the check passes and the capture applies.
#[kernel_test]
fn a_kernel_with_every_feature_applies() {
    let ns = TestNetns::new();
    let live = redirect_kernel::testing::live_in(ns.path());
    let c = Capture::Sidecar(tproxy_config().validated().unwrap());
    let rs = c.plan(&redirect_model::NoGroupDatabase).unwrap();
    live.nft.check_features(c.table(), &rs).unwrap();
    capture::apply(&live, &c, &rs).unwrap();
    assert!(live.nft.diff(&rs).unwrap().is_empty());
}
