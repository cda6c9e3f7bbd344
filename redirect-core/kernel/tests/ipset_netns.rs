//! IP sets over netlink against the kernel, in a fresh network namespace, compared with what the
//! `ipset` binary sees: a set of Istio's name is found, refused while a rule matches it,
//! destroyed once none does, and someone else's set stays.

use redirect_kernel::ipset;
use redirect_testkit::{kernel_test, run_in, TestNetns};

const ISTIO: &str = "istio-inpod-probes-v4";

fn listed(ns: &TestNetns) -> Vec<String> {
    ns.sh("ipset list -n").lines().map(str::to_owned).collect()
}

#[kernel_test]
fn a_set_is_found_refused_while_matched_and_destroyed_once_free() {
    let ns = TestNetns::new();
    assert!(!run_in(ns.path(), || ipset::exists(ISTIO)).unwrap());
    ns.sh(&format!(
        "ipset create {ISTIO} hash:ip && ipset add {ISTIO} 10.60.0.2"
    ));
    ns.sh("ipset create mine hash:ip");
    ns.sh(&format!(
        "iptables-nft -t nat -A POSTROUTING -m set --match-set {ISTIO} dst -j SNAT --to-source 169.254.7.127"
    ));
    assert!(run_in(ns.path(), || ipset::exists(ISTIO)).unwrap());

    let busy = run_in(ns.path(), || ipset::destroy(ISTIO)).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");
    assert_eq!(
        listed(&ns),
        [ISTIO, "mine"],
        "nothing destroyed while matched"
    );

    ns.sh("iptables-nft -t nat -F POSTROUTING");
    assert!(run_in(ns.path(), || ipset::destroy(ISTIO)).unwrap());
    assert_eq!(listed(&ns), ["mine"], "only that set went");
    assert!(!run_in(ns.path(), || ipset::destroy(ISTIO)).unwrap());
    assert!(!run_in(ns.path(), || ipset::exists(ISTIO)).unwrap());
    // A request with no name would destroy every set: refused before it is sent.
    let e = run_in(ns.path(), || ipset::destroy("")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert_eq!(listed(&ns), ["mine"]);
}
