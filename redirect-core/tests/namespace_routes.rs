//! The routes beside the rules: `Namespace::apply` puts TPROXY's policy routing and `::6` on `lo`
//! in place before the table (so a killed process never leaves the rules without them: see
//! init-shim's `killed` test), and takes back what it added when the rules then fail, so a
//! failed apply leaves the namespace as it was.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redirect_core::{Capture, CaptureConfig, InterceptionMode, Namespace};
use redirect_testkit::{kernel_test, TestNetns};

/// Another process holding our table's name with `flags owner`: nobody else may change it, so
/// our apply is refused (EPERM) after the routes went in. Dropped, the table goes with it.
struct OwnedTable(Child);

impl OwnedTable {
    fn hold(ns: &TestNetns) -> OwnedTable {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "nft", "-i"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.as_mut().unwrap();
        stdin
            .write_all(b"add table inet redirect_capture { flags owner; }\n")
            .unwrap();
        stdin.flush().unwrap();
        let start = Instant::now();
        while !ns.sh("nft list tables").contains("redirect_capture") {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "nft -i made no table"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        OwnedTable(child)
    }
}

impl Drop for OwnedTable {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

fn routes(ns: &TestNetns) -> String {
    ns.sh("ip rule; ip -6 rule; ip route show table 133 2>/dev/null; ip -6 route show table 133 2>/dev/null; ip -6 addr show dev lo; true")
}

#[kernel_test]
fn a_failed_apply_takes_back_the_routes_it_added() {
    let ns = TestNetns::new();
    let cfg = CaptureConfig {
        mode: InterceptionMode::Tproxy,
        ipv6: true,
        ..CaptureConfig::istio_sidecar_default()
    }
    .validated()
    .unwrap();
    let before = routes(&ns);
    {
        let _owned = OwnedTable::hold(&ns);
        let err = Namespace::open(ns.path())
            .and_then(|pod| pod.apply(&Capture::Sidecar(cfg.clone())))
            .unwrap_err();
        assert!(err.to_string().contains("Operation not permitted"), "{err}");
        assert_eq!(routes(&ns), before, "the failed apply left routes behind");
    }
    // The other owner gone, the same apply goes through: routes and rules.
    Namespace::open(ns.path())
        .and_then(|pod| pod.apply(&Capture::Sidecar(cfg.clone())))
        .unwrap();
    let after = routes(&ns);
    assert!(
        after.contains("fwmark 0x539 lookup 133") && after.contains("::6/128"),
        "{after}"
    );
    assert!(ns.sh("nft list tables").contains("redirect_capture"));
}
