//! The plugin's decisions on a fake namespace
//! (`redirect_core::testing::Fake`): which pods are captured with which rules, what CHECK and DEL
//! say, which errors leave everything as it was. No root and no kernel: the namespace file is
//! the test process's own (`allow_host_netns`), its kernel side is the fake, and where traffic
//! would go is the model's evaluator over what the fake holds.

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni_plugin::plugin::{self, Invocation};
use redirect_core::eval::{Flow, Verdict};
use redirect_core::testing::Fake;
use redirect_core::Family;
use redirect_core::Namespace;
use redirect_core::Netns;
use serde_json::{json, Value};

const STATUS: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}"#;
const OWN_NETNS: &str = "/proc/self/ns/net";

fn pod_ip() -> IpAddr {
    "10.44.0.7".parse().unwrap()
}

/// The config the runtime sends for a pod with these annotations (the sidecar's status added).
fn conf(extra: &[(&str, &str)], fields: Value) -> Vec<u8> {
    let mut ann: BTreeMap<&str, &str> = [("sidecar.istio.io/status", STATUS)].into();
    ann.extend(extra.iter().copied());
    let mut c = json!({
        "cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "proxy_uid": 1337, "allow_host_netns": true,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": ann},
    });
    for (k, v) in fields.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::to_vec(&c).unwrap()
}

/// Runs the plugin: (exit code 0 or 1, stdout), the kernel side being `fake`.
fn plugin(fake: &Fake, command: &str, stdin: &[u8]) -> (i32, String) {
    let env = |name: &str| -> Option<String> {
        match name {
            "CNI_COMMAND" => Some(command.into()),
            "CNI_NETNS" => Some(OWN_NETNS.into()),
            "CNI_ARGS" => Some("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0".into()),
            "CNI_CONTAINERID" => Some("c1".into()),
            "CNI_IFNAME" => Some("eth0".into()),
            _ => None,
        }
    };
    let fake = fake.clone();
    let open = move |_: &Netns| -> redirect_core::Result<Namespace> {
        Ok(Namespace::with_backend(Box::new(fake.clone())))
    };
    let inv = Invocation {
        env: &env,
        stdin,
        env_error: None,
        kernel: &open,
        started: std::time::Instant::now(),
    };
    match plugin::run(&inv) {
        Ok(out) => (0, out),
        Err((e, version)) => (1, e.to_json(&version)),
    }
}

fn verdict(fake: &Fake, flow: &str) -> Verdict {
    let flow: Flow = flow.parse().unwrap();
    fake.evaluate(&flow)
        .unwrap_or_else(|| panic!("no table to evaluate {flow:?}"))
        .verdict
}

fn code(out: &str) -> u64 {
    serde_json::from_str::<Value>(out).unwrap()["code"]
        .as_u64()
        .unwrap()
}

#[test]
fn add_captures_a_mesh_pod_as_its_annotations_say() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    let (rc, out) = plugin(&fake, "ADD", &conf(&[], json!({})));
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        out, r#"{"cniVersion":"1.0.0","dns":{}}"#,
        "the passthrough result"
    );
    let app_out = verdict(&fake, "out tcp uid=1000 10.96.0.1:80");
    assert_eq!(app_out.redirect_port(), Some(15001), "{app_out:?}");
    let proxy_out = verdict(&fake, "out tcp uid=1337 10.96.0.1:80");
    assert_eq!(proxy_out, Verdict::Pass, "the proxy's own traffic");
    let inbound = verdict(&fake, "in tcp 10.44.0.7:8080");
    assert_eq!(inbound.redirect_port(), Some(15006), "{inbound:?}");
    let st = fake.state();
    assert_eq!(st.batches, 1);
    assert!(
        !st.lo_v6 && st.tproxy.is_empty(),
        "no routes for REDIRECT over IPv4"
    );

    // A second ADD with the same annotations sends nothing; CHECK agrees.
    assert_eq!(plugin(&fake, "ADD", &conf(&[], json!({}))).0, 0);
    assert_eq!(fake.state().batches, 1, "the second ADD sent a batch");
    assert_eq!(plugin(&fake, "CHECK", &conf(&[], json!({}))).0, 0);
}

#[test]
fn add_follows_the_annotations_and_the_pods_addresses() {
    let v6: IpAddr = "fd00::7".parse().unwrap();
    let fake = Fake::with_addresses(&[pod_ip(), v6]);
    let stdin = conf(
        &[
            ("sidecar.istio.io/interceptionMode", "TPROXY"),
            ("traffic.sidecar.istio.io/excludeInboundPorts", "8080"),
        ],
        json!({"dual_stack": true}),
    );
    assert_eq!(plugin(&fake, "ADD", &stdin).0, 0);
    let st = fake.state();
    assert_eq!(
        st.ruleset.as_ref().unwrap().families(),
        vec![Family::V4, Family::V6],
        "dual stack with an IPv6 address"
    );
    assert!(st.lo_v6, "::6 on lo with IPv6");
    assert_eq!(st.tproxy.len(), 2, "TPROXY routing in both families");
    assert!(matches!(
        verdict(&fake, "in tcp 10.44.0.7:9090"),
        Verdict::Tproxy { port: 15006, .. }
    ));
    assert_eq!(
        verdict(&fake, "in tcp 10.44.0.7:8080"),
        Verdict::Pass,
        "the excluded inbound port"
    );
}

#[test]
fn pods_outside_the_mesh_and_bad_annotations_change_nothing() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    let skip = conf(&[("sidecar.istio.io/inject", "false")], json!({}));
    assert_eq!(plugin(&fake, "ADD", &skip).0, 0);
    let bad = conf(
        &[("traffic.sidecar.istio.io/includeInboundPorts", "80,x")],
        json!({}),
    );
    let (rc, out) = plugin(&fake, "ADD", &bad);
    assert_eq!((rc, code(&out)), (1, 101), "{out}");
    assert!(
        out.contains("includeInboundPorts") && out.contains("x"),
        "{out}"
    );
    let conflict = conf(&[], json!({"bypass_uids": [1337]}));
    let (rc, out) = plugin(&fake, "ADD", &conflict);
    assert_eq!(
        (rc, code(&out)),
        (1, 7),
        "the plugin config's own conflict: {out}"
    );
    let st = fake.state();
    assert_eq!((st.batches, st.table.is_none()), (0, true), "{st:?}");
}

#[test]
fn check_names_a_tampered_table_and_del_removes_ours() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    assert_eq!(plugin(&fake, "ADD", &conf(&[], json!({}))).0, 0);
    fake.update(|st| st.table.as_mut().unwrap().flags = 1);
    let (rc, out) = plugin(&fake, "CHECK", &conf(&[], json!({})));
    assert_eq!((rc, code(&out)), (1, 100), "{out}");
    assert!(out.contains("dormant"), "{out}");
    // ADD restores it (the in-place update clears the flags).
    assert_eq!(plugin(&fake, "ADD", &conf(&[], json!({}))).0, 0);
    assert_eq!(plugin(&fake, "CHECK", &conf(&[], json!({}))).0, 0);
    assert_eq!(plugin(&fake, "DEL", &conf(&[], json!({}))).0, 0);
    assert!(fake.state().table.is_none(), "DEL left our table");
}

#[test]
fn a_kernel_that_refuses_is_an_io_error_naming_the_step() {
    let fake = Fake::with_addresses(&[pod_ip()]);
    fake.update(|st| st.deny_writes = true);
    let (rc, out) = plugin(&fake, "ADD", &conf(&[], json!({})));
    assert_eq!((rc, code(&out)), (1, 5), "{out}");
    assert!(out.contains("programming the pod's capture"), "{out}");
    assert!(fake.state().table.is_none());
}
