//! The repair controller's in-place decision on a fake namespace
//! (`redirect_core::testing::Fake`): it applies what the plugin's ADD would, reads it back,
//! and leaves alone the pods it would not capture or cannot place. No root and no kernel: the
//! namespace file is the test process's own, its kernel side is the fake.

use std::cell::RefCell;
use std::net::IpAddr;

use cni_node::pods::search::FindError;
use cni_node::repair::in_place::{self, Outcome, Reach, RepairError};
use redirect_core::eval::{Flow, Verdict};
use redirect_core::mesh::MeshDefaults;
use redirect_core::testing::Fake;
use redirect_core::Namespace;
use redirect_core::Netns;
use serde_json::{json, Value};

const STATUS: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}"#;
const OWN_NETNS: &str = "/proc/self/ns/net";

fn pod_ip() -> IpAddr {
    "10.44.0.7".parse().unwrap()
}

fn verdict(fake: &Fake, flow: &str) -> Verdict {
    let flow: Flow = flow.parse().unwrap();
    fake.evaluate(&flow).expect("a table to evaluate").verdict
}

fn pod(annotations: Value, ip: Option<&str>) -> k8s_openapi::api::core::v1::Pod {
    let mut p = json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1", "annotations": annotations},
        "spec": {"containers": [
            {"name": "app", "image": "app"},
            {"name": "istio-proxy", "image": "proxyv2", "securityContext": {"runAsUser": 1337, "runAsGroup": 1337}}
        ], "initContainers": [{"name": "istio-validation", "image": "proxyv2"}]},
        "status": {},
    });
    if let Some(ip) = ip {
        p["status"]["podIP"] = ip.into();
    }
    serde_json::from_value(p).unwrap()
}

fn repair(fake: &Fake, pod: &k8s_openapi::api::core::v1::Pod) -> Result<Outcome, RepairError> {
    let found = RefCell::new(Vec::new());
    let find = |uid: &str, ip: IpAddr| -> Result<Netns, FindError> {
        found.borrow_mut().push((uid.to_string(), ip));
        Ok(Netns::open(std::path::Path::new(OWN_NETNS)).unwrap())
    };
    let fake = fake.clone();
    let open = move |_: &Netns| -> redirect_core::Result<Namespace> {
        Ok(Namespace::with_backend(Box::new(fake.clone())))
    };
    let reach = Reach {
        find: &find,
        open: &open,
    };
    let out = in_place::repair_with(pod, &MeshDefaults::default(), &reach);
    if let Ok(Outcome::Repaired { .. }) = &out {
        assert_eq!(*found.borrow(), [("u-1".to_string(), pod_ip())]);
    }
    out
}

#[test]
fn repair_applies_what_add_would_and_reads_it_back() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    let mesh = json!({"sidecar.istio.io/status": STATUS});
    let out = repair(&fake, &pod(mesh.clone(), Some("10.44.0.7")));
    assert!(matches!(out, Ok(Outcome::Repaired { .. })), "{out:?}");
    assert_eq!(
        verdict(&fake, "out tcp uid=1000 10.96.0.1:80").redirect_port(),
        Some(15001)
    );

    // A kernel that takes the batch and keeps nothing (istio#56587): not repaired.
    let forgetful = Fake::with_addresses(&[pod_ip()]);
    forgetful.update(|st| st.forget_applies = true);
    let out = repair(&forgetful, &pod(mesh.clone(), Some("10.44.0.7")));
    assert!(
        matches!(&out, Err(RepairError::NotInKernel { differences, .. }) if !differences.is_empty()),
        "{out:?}"
    );

    // Refused by the kernel: an Apply error, nothing kept.
    let denied = Fake::with_addresses(&[pod_ip()]);
    denied.update(|st| st.deny_writes = true);
    let out = repair(&denied, &pod(mesh, Some("10.44.0.7")));
    assert!(matches!(out, Err(RepairError::Apply { .. })), "{out:?}");
}

#[test]
fn repair_leaves_pods_it_would_not_capture_or_cannot_place() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    let outside = json!({"sidecar.istio.io/status": STATUS, "sidecar.istio.io/inject": "false"});
    let out = repair(&fake, &pod(outside, Some("10.44.0.7")));
    assert!(matches!(out, Ok(Outcome::NotCaptured(_))), "{out:?}");
    let no_ip = json!({"sidecar.istio.io/status": STATUS});
    let out = repair(&fake, &pod(no_ip, None));
    assert!(matches!(out, Err(RepairError::Incomplete(_))), "{out:?}");
    let bad = json!({"sidecar.istio.io/status": STATUS, "traffic.sidecar.istio.io/includeInboundPorts": "x"});
    let out = repair(&fake, &pod(bad, Some("10.44.0.7")));
    assert!(
        matches!(out, Err(RepairError::Annotations { .. })),
        "{out:?}"
    );
    assert_eq!(fake.state().batches, 0, "nothing applied");
}
