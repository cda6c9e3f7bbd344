//! The plugin invoked directly, as runtimes do: VERSION with podman's dummy env, CNI 1.1.0
//! STATUS and GC, DEL in every degenerate form, podman's ADD without a Kubernetes pod, a
//! Multus-style standalone `.conf`, pods outside the mesh, the host namespace guard, and bad
//! input of every kind (a CNI error with the right code naming the value, nothing applied).

use cni_testkit as common;

use common::{cni_env as env, plugin, pod_ns, Out, ARGS, STATUS_CNI};
use redirect_testkit::{kernel_test, TestNetns};

fn conf(version: &str, annotations: Option<serde_json::Value>, extra: serde_json::Value) -> String {
    let mut c = serde_json::json!({"cniVersion": version, "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337});
    if let Some(a) = annotations {
        c["runtimeConfig"] = serde_json::json!({"io.kubernetes.cri.pod-annotations": a});
    }
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            c[k] = v;
        }
    }
    c.to_string()
}

fn mesh_annotations() -> serde_json::Value {
    serde_json::json!({"sidecar.istio.io/status": STATUS_CNI})
}

fn state(ns: &TestNetns) -> String {
    format!(
        "{}\n{}\n{}",
        ns.sh("nft list ruleset"),
        ns.sh("ip rule; ip -6 rule"),
        ns.sh("ip addr show dev lo")
    )
}

fn assert_cni_error(out: &Out, code: u64, names: &[&str], what: &str) {
    assert_eq!(out.code, 1, "{what}: exit {}: {}", out.code, out.stdout);
    let e = out.json();
    assert_eq!(e["code"], code, "{what}: {e}");
    let text = format!("{} {}", e["msg"], e["details"]);
    for n in names {
        assert!(text.contains(n), "{what}: error lacks {n:?}: {text}");
    }
    assert!(e["cniVersion"].is_string(), "{what}: {e}");
}

#[test]
fn version_with_podmans_dummy_env() {
    let out = plugin(
        &[
            ("CNI_COMMAND", "VERSION"),
            ("CNI_PATH", "dummy"),
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
        ],
        r#"{"cniVersion":"1.0.0"}"#,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v = out.json();
    assert_eq!(v["cniVersion"], "1.0.0");
    let list: Vec<&str> = v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(list, ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    // No stdin at all: the newest version answers.
    let out = plugin(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.json()["cniVersion"], "1.1.0");
}

#[kernel_test]
fn status_and_gc_of_cni_1_1() {
    let c = conf("1.1.0", None, serde_json::json!({}));
    let out = plugin(
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")],
        &c,
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "STATUS: {}",
        out.stderr
    );
    assert!(out.stderr.contains("ready"), "{}", out.stderr);
    let gc = serde_json::json!({"cniVersion":"1.1.0","name":"podnet","type":"redirect-cni","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]});
    let out = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
        &gc.to_string(),
    );
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "GC: {}",
        out.stderr
    );
    assert!(out.stderr.contains("nothing to collect"), "{}", out.stderr);
    // STATUS with a bad config is an error, not "ready".
    let out = plugin(
        &[("CNI_COMMAND", "STATUS")],
        r#"{"cniVersion":"1.1.0","proxy_uid":"x"}"#,
    );
    assert_cni_error(&out, 7, &["proxy_uid"], "STATUS bad config");
}

/// A command the config's version does not have is refused, code 1 naming both, as libcni's
/// skel (Istio's plugin) refuses it: CHECK from 0.4.0, STATUS and GC from 1.1.0.
#[test]
fn each_command_needs_the_version_that_has_it() {
    for (cmd, version, since) in [
        ("CHECK", "0.3.0", "0.4.0"),
        ("CHECK", "0.3.1", "0.4.0"),
        ("STATUS", "0.4.0", "1.1.0"),
        ("STATUS", "1.0.0", "1.1.0"),
        ("GC", "1.0.0", "1.1.0"),
    ] {
        let c = conf(version, Some(mesh_annotations()), serde_json::json!({}));
        let out = plugin(&env(cmd, "/run/netns/no-such-pod-rdc", ARGS), &c);
        let what = format!("{cmd} with cniVersion {version}");
        assert_cni_error(&out, 1, &[cmd, version, since], &what);
        assert_eq!(out.json()["cniVersion"], version, "{what}");
    }
    // From those versions on, the same calls are answered as usual (a pod whose namespace is
    // gone: CHECK says so, STATUS is ready).
    let c = conf("0.4.0", Some(mesh_annotations()), serde_json::json!({}));
    let out = plugin(&env("CHECK", "/run/netns/no-such-pod-rdc", ARGS), &c);
    assert_cni_error(&out, 3, &["no-such-pod-rdc"], "CHECK 0.4.0");
}

#[test]
fn del_succeeds_without_a_namespace_a_prev_result_or_twice() {
    let c = conf("1.0.0", Some(mesh_annotations()), serde_json::json!({}));
    for netns in ["", "/run/netns/does-not-exist-rdc"] {
        let out = plugin(&env("DEL", netns, ARGS), &c);
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, ""),
            "DEL netns={netns:?}: {}",
            out.stderr
        );
    }
    // containerd's second DEL: no netns, no prevResult, stripped CNI_ARGS.
    let out = plugin(
        &[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")],
        &conf("1.0.0", None, serde_json::json!({})),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[kernel_test]
fn podman_add_without_a_kubernetes_pod_passes_the_result_through() {
    let ns = pod_ns();
    let before = state(&ns);
    let prev = serde_json::json!({"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:0a:21:00:05","sandbox":ns.path()}],
        "ips":[{"address":"10.33.0.5/24","gateway":"10.33.0.1","interface":0}],"dns":{}});
    let c = conf("1.0.0", None, serde_json::json!({"prevResult": prev}));
    let out = plugin(
        &env(
            "ADD",
            ns.path().to_str().unwrap(),
            "IgnoreUnknown=1;K8S_POD_NAME=box",
        ),
        &c,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json(),
        prev,
        "the previous result must come back unchanged"
    );
    assert_eq!(state(&ns), before, "a non-Kubernetes container was touched");
}

#[kernel_test]
fn multus_standalone_conf_add_check_del() {
    let ns = pod_ns();
    let p = ns.path().to_str().unwrap().to_string();
    // Multus runs a standalone .conf as a plugin of its own: no prevResult.
    let c = conf(
        "1.0.0",
        Some(mesh_annotations()),
        serde_json::json!({"exclude_namespaces": ["kube-system"]}),
    );
    let out = plugin(&env("ADD", &p, ARGS), &c);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.json(),
        serde_json::json!({"cniVersion":"1.0.0","dns":{}})
    );
    assert!(
        ns.sh("nft list tables").contains("redirect_capture"),
        "no table after ADD"
    );
    let out = plugin(&env("CHECK", &p, ARGS), &c);
    assert_eq!(out.code, 0, "CHECK: {}", out.stdout);
    // The same pod with other annotations: CHECK must see the difference.
    let other = conf(
        "1.0.0",
        Some(
            serde_json::json!({"sidecar.istio.io/status": STATUS_CNI, "traffic.sidecar.istio.io/excludeInboundPorts": "9999"}),
        ),
        serde_json::json!({}),
    );
    let out = plugin(&env("CHECK", &p, ARGS), &other);
    assert_cni_error(
        &out,
        100,
        // The difference in the set's own terms (the port), not raw keys.
        &["differ", "inbound-exclude-ports", r#"missing [\"9999\"]"#],
        "CHECK with other annotations",
    );
    let out = plugin(&env("DEL", &p, ARGS), &c);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        !ns.sh("nft list tables").contains("redirect_capture"),
        "DEL left the table"
    );
}

#[kernel_test]
fn pods_outside_the_mesh_are_passed_through() {
    let ns = pod_ns();
    let p = ns.path().to_str().unwrap().to_string();
    let before = state(&ns);
    let cases = [
        (
            "no status annotation",
            conf(
                "0.4.0",
                Some(serde_json::json!({"app": "web"})),
                serde_json::json!({}),
            ),
            ARGS,
        ),
        (
            "inject false",
            conf(
                "0.4.0",
                Some(
                    serde_json::json!({"sidecar.istio.io/status": STATUS_CNI, "sidecar.istio.io/inject": "false"}),
                ),
                serde_json::json!({}),
            ),
            ARGS,
        ),
        (
            "istio-init pod",
            conf(
                "0.4.0",
                Some(
                    serde_json::json!({"sidecar.istio.io/status": r#"{"initContainers":["istio-init"],"containers":["istio-proxy"]}"#}),
                ),
                serde_json::json!({}),
            ),
            ARGS,
        ),
        (
            "excluded namespace",
            conf(
                "0.4.0",
                Some(mesh_annotations()),
                serde_json::json!({"exclude_namespaces": ["kube-system"]}),
            ),
            "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1",
        ),
        (
            "own DaemonSet pod",
            conf(
                "0.4.0",
                Some(mesh_annotations()),
                serde_json::json!({"pod_namespace": "istio-system"}),
            ),
            "K8S_POD_NAMESPACE=istio-system;K8S_POD_NAME=redirect-cni-node-x7k2p",
        ),
    ];
    for (what, c, args) in cases {
        let out = plugin(&env("ADD", &p, args), &c);
        assert_eq!(out.code, 0, "{what}: {}", out.stdout);
        assert_eq!(
            out.json(),
            serde_json::json!({"cniVersion":"0.4.0","dns":{}}),
            "{what}"
        );
        assert_eq!(state(&ns), before, "{what}: the namespace was touched");
    }
}

#[kernel_test]
fn the_plugin_refuses_its_own_namespace() {
    // The plugin runs in "node" and is handed node's own namespace as the pod's.
    let node = pod_ns();
    let before = state(&node);
    let c = conf("1.0.0", Some(mesh_annotations()), serde_json::json!({}));
    let out = common::plugin_in(&node, &env("ADD", node.path().to_str().unwrap(), ARGS), &c);
    assert_cni_error(
        &out,
        103,
        &[
            "namespace the plugin runs in",
            node.path().to_str().unwrap(),
        ],
        "host netns",
    );
    assert_eq!(
        state(&node),
        before,
        "the plugin's own namespace was programmed"
    );
}

#[kernel_test]
fn bad_input_is_a_cni_error_naming_the_value_and_applies_nothing() {
    let ns = pod_ns();
    let p = ns.path().to_str().unwrap().to_string();
    let before = state(&ns);
    let bad_ann = |k: &str, v: &str| {
        let mut a = mesh_annotations();
        a[k] = v.into();
        conf("1.0.0", Some(a), serde_json::json!({}))
    };
    let cases: Vec<(&str, String, &str, u64, Vec<&str>)> = vec![
        (
            "not JSON",
            "{cniVersion: 1.0.0".into(),
            ARGS,
            6,
            vec!["not JSON"],
        ),
        ("empty stdin", String::new(), ARGS, 6, vec!["not JSON"]),
        (
            "unknown cniVersion",
            conf("2.0.0", Some(mesh_annotations()), serde_json::json!({})),
            ARGS,
            1,
            vec!["2.0.0", "0.4.0"],
        ),
        (
            "wrong type",
            conf(
                "1.0.0",
                Some(mesh_annotations()),
                serde_json::json!({"exclude_namespaces": "kube-system"}),
            ),
            ARGS,
            7,
            vec!["exclude_namespaces", "kube-system"],
        ),
        (
            "negative uid",
            conf(
                "1.0.0",
                Some(mesh_annotations()),
                serde_json::json!({"proxy_uid": -5}),
            ),
            ARGS,
            7,
            vec!["proxy_uid", "-5"],
        ),
        (
            "bad CNI_ARGS",
            conf("1.0.0", Some(mesh_annotations()), serde_json::json!({})),
            "K8S_POD_NAMESPACE=default;K8S_POD_NAME",
            4,
            vec!["CNI_ARGS", "K8S_POD_NAME"],
        ),
        (
            "bad mode",
            bad_ann("sidecar.istio.io/interceptionMode", "TPROXYY"),
            ARGS,
            101,
            vec!["sidecar.istio.io/interceptionMode", "TPROXYY"],
        ),
        (
            "bad port",
            bad_ann("traffic.sidecar.istio.io/includeInboundPorts", "80,99999"),
            ARGS,
            101,
            vec!["includeInboundPorts", "99999"],
        ),
        (
            "bad cidr",
            bad_ann(
                "traffic.sidecar.istio.io/excludeOutboundIPRanges",
                "10.0.0.0/40",
            ),
            ARGS,
            101,
            vec!["excludeOutboundIPRanges", "10.0.0.0/40"],
        ),
        (
            "bypass the proxy",
            bad_ann("redirect.io/bypass-uids", "1337"),
            ARGS,
            101,
            vec!["redirect.io/bypass-uids", "1337"],
        ),
    ];
    for (what, stdin, args, code, names) in &cases {
        let out = plugin(&env("ADD", &p, args), stdin);
        assert_cni_error(&out, *code, names, what);
        assert_eq!(state(&ns), before, "{what}: the namespace was touched");
    }
    // A missing namespace for a mesh pod is "unknown container", not a crash.
    let out = plugin(
        &env("ADD", "/run/netns/no-such-pod-rdc", ARGS),
        &conf("1.0.0", Some(mesh_annotations()), serde_json::json!({})),
    );
    assert_cni_error(&out, 3, &["no-such-pod-rdc"], "missing netns");
}

/// The pod's addresses come from the previous plugin's result when it has them (no rtnetlink
/// read): a namespace with no address of its own is captured for the result's IPv4 address, and
/// the result's IPv6 address alone turns IPv6 rules on; the result's order does not matter
/// (IPv4 first, as the kernel lists them). Without a result, the namespace's addresses decide,
/// and a namespace with none is refused naming it.
#[kernel_test]
fn the_previous_results_addresses_decide_ipv6() {
    let result = |ips: &[&str]| {
        let ips: Vec<serde_json::Value> = ips
            .iter()
            .map(|a| serde_json::json!({"address": a, "interface": 0}))
            .collect();
        serde_json::json!({"prevResult": {"cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "x"}], "ips": ips}})
    };
    let has_ip6_chains = |ns: &TestNetns| ns.sh("nft list ruleset").contains("nat_ip6_");
    let cases: [(&[&str], Option<bool>); 4] = [
        (&["10.33.0.9/24"], Some(false)),
        (&["fd33::9/64"], Some(true)),
        (&["fd33::9/64", "10.33.0.9/24"], Some(false)),
        (&[], None),
    ];
    for (ips, ipv6) in cases {
        // A namespace without any address: only the result can say.
        let ns = TestNetns::new();
        ns.sh("ip link set lo up");
        let path = ns.path().to_str().unwrap().to_owned();
        let out = plugin(
            &env("ADD", &path, ARGS),
            &conf("1.0.0", Some(mesh_annotations()), result(ips)),
        );
        match ipv6 {
            Some(v6) => {
                assert_eq!(out.code, 0, "{ips:?}: {}", out.stdout);
                assert_eq!(has_ip6_chains(&ns), v6, "{ips:?}: {}", state(&ns));
                let check = plugin(
                    &env("CHECK", &path, ARGS),
                    &conf("1.0.0", Some(mesh_annotations()), result(ips)),
                );
                assert_eq!(check.code, 0, "{ips:?}: CHECK {}", check.stdout);
            }
            None => {
                assert_cni_error(
                    &out,
                    7,
                    &["no valid local IP address"],
                    "no address anywhere",
                );
                assert!(
                    !ns.sh("nft list ruleset").contains("redirect"),
                    "nothing applied"
                );
            }
        }
    }
}
