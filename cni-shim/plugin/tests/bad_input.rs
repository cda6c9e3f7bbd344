//! Table-driven bad input for redirect-cni ADD: stdin (not JSON, non-UTF-8, huge, wrong types,
//! unsupported versions), the CNI_* environment, and every pod annotation the plugin reads. Each
//! bad row must exit 1 with a CNI error JSON on stdout carrying the documented code
//! (docs/redirect-cni.md), name the field/variable/annotation or the value, and leave the pod
//! namespace byte-identical (`snapshot`). Deliberately lenient rows (duplicate JSON keys: the last
//! wins; unknown CNI_ARGS keys) must pass the pod through unchanged.

use cni_testkit as common;

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;
use std::process::{Command, Stdio};

use common::{plugin_bin, ARGS, STATUS_CNI};
use redirect_testkit::bad_input::{assert_none, check_rows, pod_ns, short, Outcome};
use redirect_testkit::binary::snapshot;
use redirect_testkit::{kernel_test, TestNetns};
use serde_json::{json, Value};

struct Row {
    what: String,
    /// Variables that replace the defaults (`None` removes one).
    env: Vec<(&'static str, Option<OsString>)>,
    stdin: Vec<u8>,
    code: u64,
    names: Vec<String>,
}

fn mesh() -> Value {
    json!({"sidecar.istio.io/status": STATUS_CNI})
}

/// A mesh pod's config with `extra` merged in.
fn conf_with(extra: Value) -> Vec<u8> {
    let mut c = json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": mesh()}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            c[k] = v;
        }
    }
    c.to_string().into_bytes()
}

fn ann(k: &str, v: &str) -> Vec<u8> {
    let mut a = mesh();
    a[k] = v.into();
    conf_with(json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": a}}))
}

fn row(what: &str, stdin: Vec<u8>, code: u64, names: &[&str]) -> Row {
    Row {
        what: what.into(),
        env: vec![],
        stdin,
        code,
        names: names.iter().map(|s| s.to_string()).collect(),
    }
}

fn env_row(what: &str, k: &'static str, v: Option<OsString>, code: u64, names: &[&str]) -> Row {
    Row {
        env: vec![(k, v)],
        ..row(what, conf_with(json!({})), code, names)
    }
}

fn plugin(ns: &TestNetns, r: &Row) -> Outcome {
    let mut env: Vec<(&str, Option<OsString>)> = vec![
        ("CNI_COMMAND", Some("ADD".into())),
        ("CNI_CONTAINERID", Some("c0ffee".into())),
        ("CNI_NETNS", Some(ns.path().as_os_str().to_owned())),
        ("CNI_IFNAME", Some("eth0".into())),
        ("CNI_PATH", Some("/opt/cni/bin".into())),
        ("CNI_ARGS", Some(ARGS.into())),
    ];
    for (k, v) in &r.env {
        env.retain(|(e, _)| e != k);
        env.push((k, v.clone()));
    }
    let mut cmd = Command::new(plugin_bin());
    cmd.env_clear();
    for (k, v) in &env {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redirect-cni");
    let mut stdin = child.stdin.take().unwrap();
    let data = r.stdin.clone();
    // A big stdin must not deadlock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    Outcome::of(&out)
}

/// Every bad row must exit 1 with the CNI error object on stdout: the row's code, a
/// cniVersion, and a message naming what the row says.
fn check_bad(kind: &str, rows: &[Row]) -> Vec<String> {
    check_rows(kind, rows, |r| &r.what, plugin, judge)
}

fn judge(r: &Row, out: &Outcome) -> Vec<String> {
    let mut failures = Vec::new();
    if out.code != 1 {
        failures.push(format!(
            "exit {} (want 1): {} {}",
            out.code,
            short(&out.stdout),
            short(&out.stderr)
        ));
    }
    let e = match serde_json::from_str::<Value>(&out.stdout) {
        Ok(e) => e,
        Err(e) => {
            failures.push(format!("stdout is not JSON ({e}): {}", short(&out.stdout)));
            return failures;
        }
    };
    if e["code"] != r.code {
        failures.push(format!(
            "code {} (want {}): {}",
            e["code"],
            r.code,
            short(&e.to_string())
        ));
    }
    if !e["cniVersion"].is_string() {
        failures.push(format!("no cniVersion in {}", short(&e.to_string())));
    }
    let text = format!("{} {}", e["msg"], e["details"]);
    for n in &r.names {
        if !text.contains(n.as_str()) {
            failures.push(format!("error lacks {:?}: {}", short(n), short(&text)));
        }
    }
    failures
}

fn run_kind(kind: &str, rows: Vec<Row>) {
    assert_none(check_bad(kind, &rows));
}

fn stdin_rows() -> Vec<Row> {
    let big_list: Vec<String> = (0..100_000).map(|i| format!("ns-{i}")).collect();
    let mut rows = vec![
        row("not JSON", b"{cniVersion: 1.0.0".to_vec(), 6, &["not JSON"]),
        row("empty stdin", vec![], 6, &["not JSON"]),
        row("only whitespace", b"  \n".to_vec(), 6, &["not JSON"]),
        row(
            "non-UTF-8 bytes",
            b"\xff\xfe{\"cniVersion\":\"1.0.0\"}".to_vec(),
            6,
            &["not JSON"],
        ),
        row(
            "non-UTF-8 inside a JSON string",
            b"{\"cniVersion\":\"1.0.0\",\"name\":\"po\xffd\"}".to_vec(),
            6,
            &["not JSON"],
        ),
        row(
            "1 MB of garbage",
            vec![b'x'; 1 << 20],
            6,
            &["not JSON", "xxxxxxxx"],
        ),
        row(
            "truncated JSON",
            conf_with(json!({}))[..40].to_vec(),
            6,
            &["not JSON"],
        ),
        row("JSON array", b"[1]".to_vec(), 7, &["JSON object"]),
        row("JSON null", b"null".to_vec(), 7, &["JSON object"]),
        row("JSON string", b"\"1.0.0\"".to_vec(), 7, &["JSON object"]),
        row(
            "no cniVersion",
            br#"{"name":"x"}"#.to_vec(),
            1,
            &["cniVersion"],
        ),
        row(
            "cniVersion 2.0.0",
            conf_with(json!({"cniVersion": "2.0.0"})),
            1,
            &["2.0.0"],
        ),
        row(
            "cniVersion 0.2.0 (pre-chaining)",
            conf_with(json!({"cniVersion": "0.2.0"})),
            1,
            &["0.2.0"],
        ),
        row(
            "cniVersion empty",
            conf_with(json!({"cniVersion": ""})),
            1,
            &["cniVersion"],
        ),
        row(
            "cniVersion 1 MB",
            conf_with(json!({"cniVersion": "9".repeat(1 << 20)})),
            1,
            &["cniVersion", "9999999"],
        ),
        row(
            "cniVersion a number",
            conf_with(json!({"cniVersion": 1})),
            7,
            &["cniVersion"],
        ),
        row(
            "cniVersion null: read as missing",
            conf_with(json!({"cniVersion": null})),
            1,
            &["cniVersion"],
        ),
        row(
            "duplicate cniVersion: the last (bad) one wins",
            br#"{"cniVersion":"1.0.0","cniVersion":"9.9.9","name":"n"}"#.to_vec(),
            1,
            &["9.9.9"],
        ),
        row(
            "huge list then a bad field",
            conf_with(json!({"exclude_namespaces": big_list, "proxy_uid": "1337"})),
            7,
            &["proxy_uid", "1337"],
        ),
    ];
    for (field, v, want) in [
        ("name", json!(5), "5"),
        ("type", json!([]), "[]"),
        ("prevResult", json!("x"), "x"),
        ("prevResult", json!([]), "[]"),
        ("runtimeConfig", json!("x"), "x"),
        (
            "runtimeConfig",
            json!({"io.kubernetes.cri.pod-annotations": "x"}),
            "x",
        ),
        (
            "runtimeConfig",
            json!({"io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": 1}}),
            "sidecar.istio.io/status",
        ),
        ("proxy_uid", json!("1337"), "1337"),
        ("proxy_uid", json!(-1), "-1"),
        ("proxy_uid", json!(4294967296u64), "4294967296"),
        ("proxy_uid", json!(1.5), "1.5"),
        ("proxy_gid", json!(true), "true"),
        ("proxy_gid", json!(4294967296u64), "4294967296"),
        ("bypass_uids", json!("1000"), "1000"),
        ("bypass_uids", json!([1, "x"]), "x"),
        ("bypass_uids", json!([-1]), "-1"),
        ("bypass_uids", json!([4294967296u64]), "4294967296"),
        ("bypass_gids", json!({"a": 1}), "a"),
        ("bypass_gids", json!([null]), "null"),
        ("kube_attempts", json!("30"), "30"),
        ("kube_attempts", json!(-1), "-1"),
        ("kube_attempts", json!(4294967296u64), "4294967296"),
        ("kube_interval_ms", json!("1000"), "1000"),
        ("dns_capture", json!("yes"), "yes"),
        ("dual_stack", json!(1), "1"),
        ("drop_invalid", json!("true"), "true"),
        ("allow_host_netns", json!("true"), "true"),
        ("native_nftables", json!("true"), "true"),
        ("ambient_enabled", json!(0), "0"),
        ("exclude_namespaces", json!("kube-system"), "kube-system"),
        ("exclude_namespaces", json!([1]), "1"),
        ("plugin_log_level", json!("loud"), "loud"),
        ("log_level", json!(3), "3"),
        ("log_file", json!(5), "5"),
        ("kubeconfig", json!(false), "false"),
        ("cni_agent_run_dir", json!([]), "[]"),
        ("pod_namespace", json!(7), "7"),
        ("kubernetes", json!("x"), "x"),
        (
            "kubernetes",
            json!({"exclude_namespaces": "x"}),
            "exclude_namespaces",
        ),
    ] {
        // The legacy block's fields are named without the "kubernetes." prefix.
        let field_name = if want == "exclude_namespaces" {
            want
        } else {
            field
        };
        rows.push(row(
            &format!("{field}: {}", short(&v.to_string())),
            conf_with(json!({ field: v })),
            7,
            &[field_name, want],
        ));
    }
    rows
}

fn conflict_rows() -> Vec<Row> {
    vec![
        row(
            "config: proxy_uid also a bypass uid",
            conf_with(json!({"proxy_uid": 1337, "bypass_uids": [1000, 1337]})),
            7,
            &["bypass_uids", "1337"],
        ),
        row(
            "config: proxy_gid also a bypass gid",
            conf_with(json!({"proxy_gid": 1337, "bypass_gids": [1337]})),
            7,
            &["bypass_gids", "1337"],
        ),
    ]
}

fn env_rows() -> Vec<Row> {
    let os = |b: &[u8]| Some(OsString::from_vec(b.to_vec()));
    let s = |v: &str| Some(OsString::from(v));
    let mut huge_args = "IgnoreUnknown=1;".repeat(6000);
    huge_args.push_str("K8S_POD_NAMESPACE=default;K8S_POD_NAME");
    vec![
        env_row(
            "CNI_COMMAND missing",
            "CNI_COMMAND",
            None,
            4,
            &["CNI_COMMAND"],
        ),
        env_row(
            "CNI_COMMAND empty",
            "CNI_COMMAND",
            s(""),
            4,
            &["CNI_COMMAND"],
        ),
        env_row(
            "CNI_COMMAND lower case",
            "CNI_COMMAND",
            s("add"),
            4,
            &["CNI_COMMAND", "add"],
        ),
        env_row(
            "CNI_COMMAND unknown",
            "CNI_COMMAND",
            s("ATTACH"),
            4,
            &["CNI_COMMAND", "ATTACH"],
        ),
        env_row(
            "CNI_COMMAND with a space",
            "CNI_COMMAND",
            s("ADD "),
            4,
            &["CNI_COMMAND", "ADD "],
        ),
        env_row(
            "CNI_COMMAND huge",
            "CNI_COMMAND",
            s(&"A".repeat(100_000)),
            4,
            &["CNI_COMMAND", "AAAAAAAA"],
        ),
        env_row(
            "CNI_COMMAND non-UTF-8",
            "CNI_COMMAND",
            os(b"AD\xffD"),
            4,
            &["CNI_COMMAND"],
        ),
        env_row("CNI_NETNS missing", "CNI_NETNS", None, 4, &["CNI_NETNS"]),
        env_row("CNI_NETNS empty", "CNI_NETNS", s(""), 4, &["CNI_NETNS"]),
        env_row(
            "CNI_NETNS nonexistent",
            "CNI_NETNS",
            s("/run/netns/no-such-pod-rdb"),
            3,
            &["CNI_NETNS", "no-such-pod-rdb"],
        ),
        env_row(
            "CNI_NETNS a relative path",
            "CNI_NETNS",
            s("no-such-rdb"),
            3,
            &["CNI_NETNS", "no-such-rdb"],
        ),
        env_row(
            "CNI_NETNS the host's",
            "CNI_NETNS",
            s("/proc/self/ns/net"),
            103,
            &["CNI_NETNS", "/proc/self/ns/net"],
        ),
        env_row(
            "CNI_NETNS huge",
            "CNI_NETNS",
            s(&format!("/{}", "n".repeat(100_000))),
            3,
            &["CNI_NETNS", "nnnnnnnn"],
        ),
        env_row(
            "CNI_NETNS non-UTF-8",
            "CNI_NETNS",
            os(b"/run/netns/\xffno"),
            4,
            &["CNI_NETNS"],
        ),
        env_row(
            "CNI_ARGS pair without '='",
            "CNI_ARGS",
            s("K8S_POD_NAMESPACE=default;K8S_POD_NAME"),
            4,
            &["CNI_ARGS", "K8S_POD_NAME"],
        ),
        env_row(
            "CNI_ARGS empty key",
            "CNI_ARGS",
            s("=x;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"),
            4,
            &["CNI_ARGS", "=x"],
        ),
        env_row(
            "CNI_ARGS huge, bad at the end",
            "CNI_ARGS",
            s(&huge_args),
            4,
            &["CNI_ARGS", "K8S_POD_NAME"],
        ),
    ]
}

fn annotation_rows() -> Vec<Row> {
    let mut big = "80,".repeat(100_000);
    big.push_str("70000");
    let long_if = "a".repeat(16);
    let cases: Vec<(&str, &str, &str)> = vec![
        ("sidecar.istio.io/interceptionMode", "TPROXYY", "TPROXYY"),
        (
            "sidecar.istio.io/interceptionMode",
            "redirect tproxy",
            "redirect tproxy",
        ),
        ("sidecar.istio.io/interceptionMode", "NONE", "NONE"),
        (
            "traffic.sidecar.istio.io/includeOutboundIPRanges",
            "10.0.0.0/33",
            "10.0.0.0/33",
        ),
        (
            "traffic.sidecar.istio.io/includeOutboundIPRanges",
            "fd00::/129",
            "fd00::/129",
        ),
        (
            "traffic.sidecar.istio.io/includeOutboundIPRanges",
            "10.0.0.0/8,abc",
            "abc",
        ),
        (
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "10.0.0.0/40",
            "10.0.0.0/40",
        ),
        ("traffic.sidecar.istio.io/excludeOutboundIPRanges", "*", "*"),
        (
            "traffic.sidecar.istio.io/excludeOutboundIPRanges",
            "10.0.0.256/8",
            "10.0.0.256/8",
        ),
        (
            "traffic.sidecar.istio.io/includeInboundPorts",
            "80,65536",
            "65536",
        ),
        ("traffic.sidecar.istio.io/includeInboundPorts", "0", "0"),
        ("traffic.sidecar.istio.io/includeInboundPorts", "-1", "-1"),
        (
            "traffic.sidecar.istio.io/includeInboundPorts",
            "http",
            "http",
        ),
        (
            "traffic.sidecar.istio.io/includeInboundPorts",
            &big,
            "70000",
        ),
        ("traffic.sidecar.istio.io/excludeInboundPorts", "0", "0"),
        (
            "traffic.sidecar.istio.io/excludeInboundPorts",
            "80;81",
            "80;81",
        ),
        (
            "traffic.sidecar.istio.io/includeOutboundPorts",
            "65536",
            "65536",
        ),
        ("traffic.sidecar.istio.io/includeOutboundPorts", "x", "x"),
        ("traffic.sidecar.istio.io/excludeOutboundPorts", "-1", "-1"),
        ("traffic.sidecar.istio.io/excludeInterfaces", "a/b", "a/b"),
        (
            "traffic.sidecar.istio.io/excludeInterfaces",
            &long_if,
            &long_if,
        ),
        ("istio.io/reroute-virtual-interfaces", "a:b", "a:b"),
        ("traffic.sidecar.istio.io/kubevirtInterfaces", "..", ".."),
        ("redirect.io/bypass-uids", "1337", "1337"),
        ("redirect.io/bypass-uids", "1000,x", "x"),
        ("redirect.io/bypass-uids", "4294967296", "4294967296"),
        ("redirect.io/bypass-uids", "-1", "-1"),
        ("redirect.io/bypass-gids", "1337", "1337"),
        ("redirect.io/bypass-gids", "g1", "g1"),
    ];
    cases
        .into_iter()
        .map(|(k, v, needle)| {
            let short_key = k.rsplit('/').next().unwrap();
            row(
                &format!("{k}={}", short(v)),
                ann(k, v),
                101,
                &[short_key, needle],
            )
        })
        .collect()
}

#[kernel_test]
fn bad_stdin() {
    run_kind("stdin", stdin_rows());
}

#[kernel_test]
fn bad_env() {
    run_kind("env", env_rows());
}

#[kernel_test]
fn bad_annotations() {
    run_kind("annotations", annotation_rows());
}

#[kernel_test]
fn config_bypass_conflict_names_the_config_field() {
    run_kind("conflicts", conflict_rows());
}

/// A failed ADD is in the plugin's log file too (with the pod), not only on stderr: the log file
/// is where an operator looks on the node.
#[kernel_test]
fn a_failed_add_is_written_to_the_log_file() {
    let ns = pod_ns();
    let log = std::env::temp_dir().join(format!("rdc-errlog-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut a = mesh();
    a["sidecar.istio.io/interceptionMode"] = "TPROXYY".into();
    let stdin = conf_with(json!({"log_file": log,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": a}}));
    let out = plugin(&ns, &row("bad mode, logged", stdin, 101, &[]));
    assert_eq!(out.code, 1, "{}", out.stdout);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.contains("\terror\t"))
        .unwrap_or_else(|| panic!("no error line in the log file: {text:?}"));
    for needle in [
        "ADD",
        "sidecar.istio.io/interceptionMode",
        "TPROXYY",
        "CNI error 101",
    ] {
        assert!(line.contains(needle), "{needle} not in {line:?}");
    }
    // Once, on stderr too.
    assert_eq!(out.stderr.matches("TPROXYY").count(), 1, "{}", out.stderr);
    let _ = std::fs::remove_file(&log);
}

/// CNI_NETNS that exists but is not a namespace file.
fn not_a_netns_rows() -> Vec<Row> {
    let s = |v: &str| Some(OsString::from(v));
    vec![
        env_row(
            "CNI_NETNS a regular file",
            "CNI_NETNS",
            s("/etc/hostname"),
            3,
            &["CNI_NETNS", "/etc/hostname"],
        ),
        env_row(
            "CNI_NETNS a directory",
            "CNI_NETNS",
            s("/etc"),
            3,
            &["CNI_NETNS", "/etc"],
        ),
    ]
}

#[kernel_test]
fn cni_netns_not_a_namespace_is_code_3() {
    run_kind("CNI_NETNS not a namespace", not_a_netns_rows());
}

/// Lenient rows: a pod outside the mesh (no status annotation) is passed through, whatever
/// else is odd; duplicate keys keep the last value (serde_json, like Go's encoding/json).
#[kernel_test]
fn lenient_rows_pass_the_pod_through() {
    let ns = pod_ns();
    let before = snapshot(&ns);
    let not_mesh = br#"{"cniVersion":"1.0.0","name":"a","name":"b","type":"redirect-cni","proxy_uid":"x","proxy_uid":1337,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{}}}"#.to_vec();
    let rows = vec![
        row(
            "duplicate keys, the last valid: not in the mesh",
            not_mesh.clone(),
            0,
            &[],
        ),
        Row {
            env: vec![(
                "CNI_ARGS",
                Some(
                    "IgnoreUnknown=1;FOO=bar;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;;".into(),
                ),
            )],
            ..row(
                "unknown CNI_ARGS keys and empty pairs",
                not_mesh.clone(),
                0,
                &[],
            )
        },
        Row {
            env: vec![("CNI_ARGS", Some("K8S_POD_NAME=web-0".into()))],
            ..row(
                "no K8S_POD_NAMESPACE: not a Kubernetes pod",
                conf_with(json!({})),
                0,
                &[],
            )
        },
        row(
            "kube_attempts 0 means 1",
            conf_with(
                json!({"kube_attempts": 0, "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {}}}),
            ),
            0,
            &[],
        ),
        row(
            "sidecar.istio.io/inject maybe: not false",
            {
                let mut a = json!({"sidecar.istio.io/inject": "maybe"});
                a["x"] = "y".into();
                conf_with(json!({"runtimeConfig": {"io.kubernetes.cri.pod-annotations": a}}))
            },
            0,
            &[],
        ),
    ];
    let mut failures = Vec::new();
    for r in &rows {
        let out = plugin(&ns, r);
        if out.code != 0 {
            failures.push(format!(
                "{}: exit {}: {} {}",
                r.what,
                out.code,
                out.stdout,
                short(&out.stderr)
            ));
        }
        if snapshot(&ns) != before {
            failures.push(format!("{}: the namespace changed", r.what));
        }
    }
    eprintln!(
        "lenient: {} rows tried, {} states compared",
        rows.len(),
        rows.len()
    );
    assert_none(failures);
}

fn non_utf8_cni_args_rows() -> Vec<Row> {
    vec![Row {
        env: vec![(
            "CNI_ARGS",
            Some(OsString::from_vec(
                b"K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-\xff0".to_vec(),
            )),
        )],
        ..row("CNI_ARGS non-UTF-8", conf_with(json!({})), 4, &["CNI_ARGS"])
    }]
}

#[kernel_test]
fn non_utf8_cni_args_is_refused_by_name() {
    run_kind("non-UTF-8 CNI_ARGS", non_utf8_cni_args_rows());
}
