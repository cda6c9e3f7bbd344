//! One error, printed once: for each kind of `redirect_core::Error`, walking its chain
//! (`Display`, then each `source()`) finds no message twice, neither equal to another nor
//! standing inside the one before it, so a chain reporter (anyhow's `{:#}`, `eyre`, a
//! program's own) prints each thing once; and the first message still names the value.

use std::io;

use redirect_core::foreign::{ForeignRules, Ours};
use redirect_core::testing::{Fake, FakeForeign};
use redirect_core::{Apply, Capture, CaptureConfig, Error, Family, Foreign, Namespace};
use redirect_kernel::{nft, routes};
use redirect_testkit::errors::assert_each_message_once;

#[test]
fn each_kind_prints_each_message_once() {
    let mut bad = CaptureConfig::istio_sidecar_default();
    bad.envoy_port = 0;
    let config: Error = bad.validated().unwrap_err().into();
    assert!(matches!(config, Error::Config(_)));
    assert_each_message_once("Config", &config, "0");

    let namespace = Namespace::open("/nonexistent/redirect-errors-test")
        .err()
        .unwrap();
    assert!(matches!(namespace, Error::Namespace(_)));
    assert_each_message_once("Namespace", &namespace, "/nonexistent/redirect-errors-test");

    let rules: Error = nft::Error::Rejected {
        what: "our table".into(),
        errno: libc::EPERM,
        cause: io::Error::from_raw_os_error(libc::EPERM),
        hint: "",
    }
    .into();
    assert!(matches!(rules, Error::Rules(_)));
    assert_each_message_once("Rules", &rules, "our table");

    let routes: Error = routes::Error::Route {
        what: "adding the TPROXY rule".into(),
        family: Family::V6,
        errno: libc::EACCES,
        cause: io::Error::from_raw_os_error(libc::EACCES),
        hint: "",
    }
    .into();
    assert!(matches!(routes, Error::Routes(_)));
    assert_each_message_once("Routes", &routes, "TPROXY rule");

    let tool = Error::Tool {
        tool: "iptables-restore".into(),
        detail: "exit 2".into(),
    };
    assert_each_message_once("Tool", &tool, "iptables-restore");
    let set = Error::IpSet {
        set: "istio-inpod-probes-v4".into(),
        op: "destroy",
        cause: io::Error::from_raw_os_error(libc::EBUSY),
    };
    assert_each_message_once("IpSet", &set, "istio-inpod-probes-v4");

    // The kernel layer's aggregate, as the layers beneath hand it up.
    let via_kernel: Error =
        redirect_kernel::Error::from(nft::Error::ReadUnsettled { tries: 10 }).into();
    assert!(matches!(via_kernel, Error::Rules(_)));
    assert_each_message_once("Rules via the kernel layer", &via_kernel, "10 reads");

    // A refusal of the one apply: foreign rules, and ours for another capture.
    let foreign = FakeForeign::new(ForeignRules {
        nft_tables: vec!["istio-proxy-nat".into()],
        chains: Vec::new(),
        unread: Vec::new(),
    });
    let pod = Namespace::with_backend(Box::new(Fake::default())).with_foreign(foreign);
    let sidecar = Capture::Sidecar(CaptureConfig::istio_sidecar_default().validated().unwrap());
    let refused = pod.apply(&sidecar).unwrap_err();
    assert!(matches!(&refused, Error::Refused(r) if r.foreign().is_some()));
    assert_each_message_once("Refused (foreign)", &refused, "istio-proxy-nat");

    // Rules that cannot be removed here, refused up front by a replace.
    let unread = "iptables-legacy IPv4 tables (nat) that no iptables-legacy-save here can read";
    let foreign = FakeForeign::new(ForeignRules {
        unread: vec![unread.into()],
        ..Default::default()
    });
    let pod = Namespace::with_backend(Box::new(Fake::default())).with_foreign(foreign);
    let refused = pod
        .apply_with(&sidecar, Apply::foreign(Foreign::Replace))
        .unwrap_err();
    assert_each_message_once("Refused (cannot replace)", &refused, unread);

    let pod = Namespace::with_backend(Box::new(Fake::default()));
    pod.apply(&sidecar).unwrap();
    let mut other = CaptureConfig::istio_sidecar_default();
    other.envoy_port = 16001;
    let refused = pod
        .apply_with(
            &Capture::Sidecar(other.validated().unwrap()),
            Apply {
                foreign: Foreign::Refuse,
                ours: Ours::RefuseOther,
            },
        )
        .unwrap_err();
    assert!(matches!(&refused, Error::Refused(r) if r.ours_differ().is_some()));
    assert_each_message_once("Refused (ours differ)", &refused, "another configuration");
}
