//! Table-driven bad input for redirect-init: every flag class and its variable, with empty, huge,
//! non-UTF-8, out-of-range, duplicate and conflicting values. Each bad row must exit 1 (Istio's
//! exit code for bad input), name the flag/variable or the value on stderr, and leave the pod
//! namespace byte-identical (`snapshot`). Rows where we are deliberately lenient like Istio
//! (duplicates, include+exclude of the same value, empty variables, ENVOY_PORT) are run with
//! `--dry-run` and must succeed with the same output as their canonical form.
//!
//! Huge values: execve caps one argument or `K=V` string at 128 KiB (MAX_ARG_STRLEN), so rows
//! through the binary use ~100 KiB; the 1 MB / 100k-item rows go through the same parser
//! in-process (`flags::parse` + `Settings::from_resolved`, no kernel).

mod common;

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;

use common::{run_in, snapshot, Run, BIN};
use init_shim::flags::{self, Parsed};
use init_shim::settings::Settings;
use redirect_testkit::bad_input::{assert_none, check_rows, pod_ns, short, tail, Outcome};
use redirect_testkit::{kernel_test, TestNetns};

/// One invocation and what its error must name.
struct Row {
    what: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    names: Vec<String>,
}

fn row(what: &str, args: &[&str], env: &[(&str, &str)], names: &[&str]) -> Row {
    Row {
        what: what.to_string(),
        args: args.iter().map(OsString::from).collect(),
        env: env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect(),
        names: names.iter().map(|s| s.to_string()).collect(),
    }
}

fn os(b: &[u8]) -> OsString {
    OsString::from_vec(b.to_vec())
}

/// The same bad value through the flag and through its variable; each must be named.
fn flag_and_env(
    rows: &mut Vec<Row>,
    (flag, label, var): (&str, &str, &str),
    v: &str,
    needle: &str,
) {
    rows.push(row(
        &format!("{flag}={}", short(v)),
        &[&format!("{flag}={v}")],
        &[],
        &[label, needle],
    ));
    rows.push(row(
        &format!("{var}={}", short(v)),
        &[],
        &[(var, v)],
        &[var, needle],
    ));
}

/// `flag=<prefix><bytes>` where the bytes are not UTF-8: the message must name the flag.
fn non_utf8_flag(flag: &str, prefix: &str, bytes: &[u8]) -> Row {
    let mut a = OsString::from(format!("{flag}={prefix}"));
    a.push(os(bytes));
    Row {
        what: format!("{flag}={prefix}<non-UTF-8>"),
        args: vec![a],
        env: vec![],
        names: vec![flag.to_string()],
    }
}

/// UTF-8 rows go through testkit's `run_in`; the others through `ip netns exec` directly.
fn run_row(ns: &TestNetns, r: &Row) -> Outcome {
    let utf8 = r.args.iter().all(|a| a.to_str().is_some())
        && r.env
            .iter()
            .all(|(k, v)| k.to_str().is_some() && v.to_str().is_some());
    if utf8 {
        let run = Run {
            args: r.args.iter().map(|a| a.to_str().unwrap().into()).collect(),
            env: r
                .env
                .iter()
                .map(|(k, v)| (k.to_str().unwrap().into(), v.to_str().unwrap().into()))
                .collect(),
            ..Run::default()
        };
        let out = run_in(ns, &run);
        return Outcome {
            code: out.code,
            stdout: out.stdout,
            stderr: out.stderr,
        };
    }
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name(), BIN])
        .args(&r.args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(r.env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run redirect-init");
    Outcome::of(&out)
}

/// Every bad row must exit 1, name what its row says on stderr, and print nothing on stdout.
fn check_bad(kind: &str, rows: &[Row]) -> Vec<String> {
    check_rows(
        kind,
        rows,
        |r| &r.what,
        run_row,
        |r, out| {
            let mut failures = Vec::new();
            if out.code != 1 {
                failures.push(format!("exit {} (want 1)\n{}", out.code, tail(&out.stderr)));
            }
            for n in &r.names {
                if !out.stderr.contains(n.as_str()) {
                    failures.push(format!(
                        "stderr lacks {:?}\n{}",
                        short(n),
                        tail(&out.stderr)
                    ));
                }
            }
            if !out.stdout.is_empty() {
                failures.push(format!("stdout not empty: {}", short(&out.stdout)));
            }
            failures
        },
    )
}

/// Values every single-port flag and variable must refuse, with what the error must show.
const BAD_PORTS: &[&str] = &["0", "65536", "-1", "abc", "80,81", "1.5", "0x50"];

/// (flag, label, variable)
const PORT_FLAGS: &[(&str, &str, Option<&str>)] = &[
    ("--envoy-port", "--envoy-port (-p)", None),
    (
        "--inbound-capture-port",
        "--inbound-capture-port (-z)",
        Some("INBOUND_CAPTURE_PORT"),
    ),
    (
        "--inbound-tunnel-port",
        "--inbound-tunnel-port (-e)",
        Some("INBOUND_TUNNEL_PORT"),
    ),
    (
        "--iptables-probe-port",
        "--iptables-probe-port",
        Some("IPTABLES_PROBE_PORT"),
    ),
];

const PORT_LIST_FLAGS: &[(&str, &str, &str)] = &[
    (
        "--istio-inbound-ports",
        "--istio-inbound-ports (-b)",
        "ISTIO_INBOUND_PORTS",
    ),
    (
        "--istio-local-exclude-ports",
        "--istio-local-exclude-ports (-d)",
        "ISTIO_LOCAL_EXCLUDE_PORTS",
    ),
    (
        "--istio-outbound-ports",
        "--istio-outbound-ports (-q)",
        "ISTIO_OUTBOUND_PORTS",
    ),
    (
        "--istio-local-outbound-ports-exclude",
        "--istio-local-outbound-ports-exclude (-o)",
        "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE",
    ),
];

const CIDR_FLAGS: &[(&str, &str, &str)] = &[
    (
        "--istio-service-cidr",
        "--istio-service-cidr (-i)",
        "ISTIO_SERVICE_CIDR",
    ),
    (
        "--istio-service-exclude-cidr",
        "--istio-service-exclude-cidr (-x)",
        "ISTIO_SERVICE_EXCLUDE_CIDR",
    ),
];

const ID_FLAGS: &[(&str, &str, &str)] = &[
    ("--proxy-uid", "--proxy-uid (-u)", "PROXY_UID"),
    ("--proxy-gid", "--proxy-gid (-g)", "PROXY_GID"),
    ("--bypass-uids", "--bypass-uids", "REDIRECT_BYPASS_UIDS"),
    ("--bypass-gids", "--bypass-gids", "REDIRECT_BYPASS_GIDS"),
];

const IFACE_FLAGS: &[(&str, &str, &str)] = &[
    (
        "--istio-exclude-interfaces",
        "--istio-exclude-interfaces (-c)",
        "ISTIO_EXCLUDE_INTERFACES",
    ),
    (
        "--kube-virt-interfaces",
        "--kube-virt-interfaces (-k)",
        "KUBE_VIRT_INTERFACES",
    ),
];

/// (flag, variable, aliases)
const BOOL_FLAGS: &[(&str, &str, &[&str])] = &[
    ("--dry-run", "DRY_RUN", &[]),
    ("--skip-rule-apply", "SKIP_RULE_APPLY", &[]),
    ("--run-validation", "RUN_VALIDATION", &[]),
    (
        "--redirect-dns",
        "REDIRECT_DNS",
        &["ISTIO_META_DNS_CAPTURE"],
    ),
    ("--capture-all-dns", "CAPTURE_ALL_DNS", &[]),
    ("--drop-invalid", "DROP_INVALID", &["INVALID_DROP"]),
    ("--dual-stack", "DUAL_STACK", &["ISTIO_DUAL_STACK"]),
    ("--cni-mode", "CNI_MODE", &[]),
    ("--reconcile", "RECONCILE", &[]),
    ("--cleanup-only", "CLEANUP_ONLY", &[]),
    ("--force-apply", "FORCE_APPLY", &[]),
    ("--native-nftables", "NATIVE_NFTABLES", &[]),
];

fn huge_digits() -> String {
    "9".repeat(100_000)
}

/// `1,2,...` up to ~100 KiB, then `bad`.
fn huge_list(bad: &str) -> String {
    let mut s = String::new();
    let mut i = 1u32;
    while s.len() < 100_000 {
        s.push_str(&format!("{},", i % 65535 + 1));
        i += 1;
    }
    s.push_str(bad);
    s
}

fn port_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (flag, label, var) in PORT_FLAGS {
        let mut bad: Vec<String> = BAD_PORTS.iter().map(|s| s.to_string()).collect();
        bad.push(String::new());
        bad.push(" ".into());
        bad.push(huge_digits());
        for v in &bad {
            let arg = format!("{flag}={v}");
            let shown = if v.len() > 100 { &v[..100] } else { v };
            let value_name = if v.trim().is_empty() {
                "\"".to_string()
            } else {
                shown.to_string()
            };
            rows.push(row(
                &format!("{flag}={}", short(v)),
                &[&arg],
                &[],
                &[label, &value_name],
            ));
            if let Some(var) = var {
                if !v.is_empty() {
                    rows.push(row(
                        &format!("{var}={}", short(v)),
                        &[],
                        &[(var, v)],
                        &[var, &value_name],
                    ));
                }
            }
        }
        // Non-UTF-8 on the command line: refused, naming the flag.
        rows.push(non_utf8_flag(flag, "", b"15\xff01"));
        // A flag that needs a value, without one.
        rows.push(row(&format!("{flag} (no value)"), &[flag], &[], &[flag]));
    }
    rows
}

fn port_list_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (flag, label, var) in PORT_LIST_FLAGS {
        let mut cases: Vec<(String, &str)> = vec![
            ("80,0".into(), "\"0\""),
            ("80,65536".into(), "65536"),
            ("80,-1".into(), "-1"),
            ("80,abc".into(), "abc"),
            ("80;81".into(), "80;81"),
            ("80 81".into(), "80 81"),
            ("80-90".into(), "80-90"),
            (huge_list("70000"), "70000"),
        ];
        if *flag != "--istio-inbound-ports" {
            cases.push(("80,*".into(), "\"*\""));
        }
        for (v, needle) in &cases {
            flag_and_env(&mut rows, (flag, label, var), v, needle);
        }
        rows.push(non_utf8_flag(flag, "80,", b"\xfe\xff"));
    }
    rows
}

fn cidr_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let mut many = String::new();
    for i in 0..6000u32 {
        many.push_str(&format!("10.{}.{}.0/24,", (i >> 8) & 255, i & 255));
    }
    many.push_str("10.9.9.9/33");
    for (flag, label, var) in CIDR_FLAGS {
        let mut cases: Vec<(String, &str)> = vec![
            ("10.0.0.0/33".into(), "10.0.0.0/33"),
            ("fd00::/129".into(), "fd00::/129"),
            ("10.0.0.0/-1".into(), "10.0.0.0/-1"),
            ("10.0.0.256/8".into(), "10.0.0.256/8"),
            ("10.0.0.0/8,abc".into(), "abc"),
            ("10.0.0.0/8;10.1.0.0/16".into(), "10.0.0.0/8;10.1.0.0/16"),
            ("10.0.0.0 /8".into(), "10.0.0.0 /8"),
            ("::ffff:zz/96".into(), "::ffff:zz/96"),
            (many.clone(), "10.9.9.9/33"),
        ];
        if *flag == "--istio-service-exclude-cidr" {
            cases.push(("*".into(), "*"));
            cases.push(("10.0.0.0/8,*".into(), "*"));
        }
        for (v, needle) in &cases {
            flag_and_env(&mut rows, (flag, label, var), v, needle);
        }
        rows.push(non_utf8_flag(flag, "10.0.0.0/8,", b"\xc0\xa8"));
    }
    // Loopback CIDR (env only).
    for (v, needle) in [
        ("10.0.0.1/32", "10.0.0.1/32"),
        ("127.0.0.1/7", "127.0.0.1/7"),
        ("127.0.0.1/33", "127.0.0.1/33"),
        ("::1/128", "::1/128"),
        ("abc", "abc"),
    ] {
        rows.push(row(
            &format!("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR={v}"),
            &[],
            &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", v)],
            &["ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", needle],
        ));
    }
    rows
}

fn id_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (flag, label, var) in ID_FLAGS {
        for (v, needle) in [
            ("4294967296", "4294967296"),
            ("-1", "-1"),
            ("abc", "abc"),
            ("1337,x", "\"x\""),
            ("1337;1338", "1337;1338"),
            ("1e3", "1e3"),
            (&*"1".repeat(100_000), "1111111111111111"),
        ] {
            flag_and_env(&mut rows, (flag, label, var), v, needle);
        }
        rows.push(non_utf8_flag(flag, "", b"13\xff37"));
    }
    // A bypass ID that is the proxy's (1337 by default) would stop its loopback redirect.
    for ids in &ID_FLAGS[2..] {
        flag_and_env(&mut rows, *ids, "4000,1337", "cannot bypass capture");
    }
    rows
}

fn mode_mark_table_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let m = (
        "--istio-inbound-interception-mode",
        "--istio-inbound-interception-mode (-m)",
        "ISTIO_INBOUND_INTERCEPTION_MODE",
    );
    for v in ["TPROXYY", "redirect,tproxy", "REDIRECT TPROXY", "1", "-"] {
        rows.push(row(
            &format!("{}={v}", m.0),
            &[&format!("{}={v}", m.0)],
            &[],
            &[m.1, v],
        ));
        rows.push(row(&format!("{}={v}", m.2), &[], &[(m.2, v)], &[m.2, v]));
    }
    let t = (
        "--istio-inbound-tproxy-mark",
        "--istio-inbound-tproxy-mark (-t)",
        "ISTIO_INBOUND_TPROXY_MARK",
    );
    let r = (
        "--istio-inbound-tproxy-route-table",
        "--istio-inbound-tproxy-route-table (-r)",
        "ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
    );
    for (f, bad) in [
        (t, &["0", "1338", "4294967296", "-1", "abc", "0x539"][..]),
        (
            r,
            &["0", "253", "254", "255", "4294967296", "-1", "main"][..],
        ),
    ] {
        for v in bad {
            for extra in [&[][..], &["-m", "TPROXY", "-b", "*"][..]] {
                let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
                args.push(format!("{}={v}", f.0));
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                rows.push(row(&args.join(" "), &a, &[], &[f.1, v]));
            }
            rows.push(row(&format!("{}={v}", f.2), &[], &[(f.2, v)], &[f.2, v]));
        }
    }
    // Conflicting: TPROXY with mark 0 given through the variables.
    rows.push(row(
        "TPROXY with ISTIO_INBOUND_TPROXY_MARK=0",
        &["-b", "*"],
        &[
            ("ISTIO_INBOUND_INTERCEPTION_MODE", "TPROXY"),
            ("ISTIO_INBOUND_TPROXY_MARK", "0"),
        ],
        &["ISTIO_INBOUND_TPROXY_MARK", "\"0\""],
    ));
    rows
}

fn iface_bool_duration_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let long = "a".repeat(16);
    for (flag, label, var) in IFACE_FLAGS {
        for v in ["eth0/1", &*long, "a:b", ".", "..", "eth 0", "eth0,x\ty"] {
            let needle = v.split(',').next_back().unwrap();
            let needle = format!("{needle:?}");
            let needle = needle.trim_matches('"');
            rows.push(row(
                &format!("{flag}={v}"),
                &[&format!("{flag}={v}")],
                &[],
                &[label, needle],
            ));
            rows.push(row(&format!("{var}={v}"), &[], &[(var, v)], &[var, needle]));
        }
    }
    for (flag, var, aliases) in BOOL_FLAGS {
        for v in ["maybe", "yes", "2", "TrUe", ""] {
            let arg = format!("{flag}={v}");
            let needle = if v.is_empty() { flag } else { v };
            rows.push(row(&arg, &[&arg], &[], &[flag, needle]));
            if !v.is_empty() {
                for name in std::iter::once(var).chain(aliases.iter()) {
                    rows.push(row(&format!("{name}={v}"), &[], &[(name, v)], &[name, v]));
                }
            }
        }
        // A Go bool flag takes its value only with '=': `--flag false` leaves `false` as an
        // unexpected positional argument.
        rows.push(row(
            &format!("{flag} false"),
            &[flag, "false"],
            &[],
            &["false"],
        ));
    }
    for v in [
        "5",
        "5x",
        "-5s",
        "s",
        "1..5s",
        "5 s",
        "ms5",
        &*huge_digits(),
    ] {
        let arg = format!("--probe-timeout={v}");
        let needle = &v[..v.len().min(100)];
        rows.push(row(
            &short(&arg),
            &[&arg],
            &[],
            &["--probe-timeout", needle],
        ));
        rows.push(row(
            &short(&format!("PROBE_TIMEOUT={v}")),
            &[],
            &[("PROBE_TIMEOUT", v)],
            &["PROBE_TIMEOUT", needle],
        ));
    }
    rows.push(row(
        "--probe-timeout=",
        &["--probe-timeout="],
        &[],
        &["--probe-timeout"],
    ));
    rows
}

fn misc_rows() -> Vec<Row> {
    let sixty_five: Vec<String> = (1000..1065).map(|g| g.to_string()).collect();
    let sixty_five = sixty_five.join(",");
    let mut rows = vec![
        row(
            "owner group with a space",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,bad group")],
            &["ISTIO_OUTBOUND_OWNER_GROUPS", "bad group"],
        ),
        row(
            "owner group with a colon",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", "a:b")],
            &["ISTIO_OUTBOUND_OWNER_GROUPS", "a:b"],
        ),
        row(
            "owner groups: only commas",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", ",,,")],
            &["ISTIO_OUTBOUND_OWNER_GROUPS", ",,,"],
        ),
        row(
            "65 owner groups",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", &sixty_five)],
            &["ISTIO_OUTBOUND_OWNER_GROUPS", "64"],
        ),
        row(
            "unknown owner group",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,no-such-group")],
            &["no-such-group"],
        ),
        row(
            "exclude groups '*'",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "*")],
            &["ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "*"],
        ),
        row(
            "exclude group with a space",
            &[],
            &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "a b")],
            &["a b"],
        ),
        row(
            "--backend foo",
            &["--backend=foo"],
            &[],
            &["--backend", "foo"],
        ),
        row(
            "REDIRECT_BACKEND=foo",
            &[],
            &[("REDIRECT_BACKEND", "foo")],
            &["REDIRECT_BACKEND", "foo"],
        ),
        row(
            "--native-nftables with --backend iptables",
            &["--native-nftables", "--backend", "iptables"],
            &[],
            &["--backend", "--native-nftables"],
        ),
        row(
            "--force-iptables-binary foo",
            &["--force-iptables-binary=foo"],
            &[],
            &["--force-iptables-binary", "foo"],
        ),
        row(
            "FORCE_IPTABLES_BINARY=foo",
            &[],
            &[("FORCE_IPTABLES_BINARY", "foo")],
            &["FORCE_IPTABLES_BINARY", "foo"],
        ),
        row(
            "--dry-run-format yaml",
            &["--dry-run-format=yaml"],
            &[],
            &["--dry-run-format", "yaml"],
        ),
        row(
            "DRY_RUN_FORMAT=yaml",
            &[],
            &[("DRY_RUN_FORMAT", "yaml")],
            &["DRY_RUN_FORMAT", "yaml"],
        ),
        row(
            "unknown flag",
            &["--no-such-flag"],
            &[],
            &["--no-such-flag"],
        ),
        row("unknown short flag", &["-Z", "1"], &[], &["-Z"]),
        row("positional argument", &["extra"], &[], &["extra"]),
        row("-p -1 (separate)", &["-p", "-1"], &[], &["-1"]),
        row(
            "--network-namespace missing",
            &["--network-namespace", "/nonexistent/netns-rdi"],
            &[],
            &["/nonexistent/netns-rdi"],
        ),
        row(
            "--network-namespace a regular file",
            &["--network-namespace", "/etc/hostname"],
            &[],
            &["/etc/hostname"],
        ),
        row(
            "--network-namespace a directory",
            &["--network-namespace", "/etc"],
            &[],
            &["/etc"],
        ),
        row(
            "huge unknown flag",
            &[&format!("--{}", "x".repeat(100_000))],
            &[],
            &["--xxxxxxxx"],
        ),
    ];
    rows.push(row(
        "--log_as_json not a Go bool",
        &["--log_as_json=maybe"],
        &[],
        &["--log_as_json", "maybe"],
    ));
    rows.push(row(
        "--log_output_level with an unknown level",
        &["--log_output_level=default:loud"],
        &[],
        &["--log_output_level", "loud"],
    ));
    let mut a = OsString::from("--");
    a.push(os(b"bad\xffflag"));
    rows.push(Row {
        what: "non-UTF-8 unknown flag".into(),
        args: vec![a],
        env: vec![],
        names: vec!["bad".into()],
    });
    rows
}

fn run_kind(kind: &str, rows: Vec<Row>) {
    assert_none(check_bad(kind, &rows));
}

#[kernel_test]
fn bad_ports() {
    run_kind("ports", port_rows());
}

#[kernel_test]
fn bad_port_lists() {
    run_kind("port lists", port_list_rows());
}

#[kernel_test]
fn bad_cidrs() {
    run_kind("CIDR lists", cidr_rows());
}

#[kernel_test]
fn bad_uids_gids() {
    run_kind("uids/gids", id_rows());
}

#[kernel_test]
fn bad_modes_marks_route_tables() {
    run_kind("modes/marks/tables", mode_mark_table_rows());
}

#[kernel_test]
fn bad_interfaces_booleans_durations() {
    run_kind("interfaces/booleans/durations", iface_bool_duration_rows());
}

#[kernel_test]
fn bad_groups_backends_and_command_line() {
    run_kind("groups/backends/command line", misc_rows());
}

// ---- Deliberately lenient rows (as Istio): they succeed, the same as their canonical form.

/// (what, lenient invocation, canonical invocation, whether the output is the same text: a
/// repeated CIDR becomes an nft set of one element and a repeated UID repeats its rules, as
/// Istio repeats them; both capture the same packets)
type Lenient = (&'static str, Row, Row, bool);

fn lenient_rows() -> Vec<Lenient> {
    let r = |a: &[&str], e: &[(&str, &str)]| row("", a, e, &[]);
    vec![
        (
            "repeated flag: last wins",
            r(&["-p", "1", "-p", "15001"], &[]),
            r(&["-p", "15001"], &[]),
            true,
        ),
        (
            "repeated port in a list",
            r(&["-b", "80,80,443"], &[]),
            r(&["-b", "80,443"], &[]),
            true,
        ),
        (
            "repeated CIDR",
            r(&["-i", "10.0.0.0/8,10.0.0.0/8"], &[]),
            r(&["-i", "10.0.0.0/8"], &[]),
            false,
        ),
        (
            "repeated uid",
            r(&["-u", "1337,1337"], &[]),
            r(&["-u", "1337"], &[]),
            false,
        ),
        (
            "include and exclude the same inbound port",
            r(&["-b", "80", "-d", "80"], &[]),
            r(&["-b", "80"], &[]),
            true,
        ),
        (
            "empty items and spaces in a list",
            r(&["-b", " 80, ,443,"], &[]),
            r(&["-b", "80,443"], &[]),
            true,
        ),
        (
            "empty variable counts as unset",
            r(&[], &[("INBOUND_CAPTURE_PORT", "")]),
            r(&[], &[]),
            true,
        ),
        (
            "ENVOY_PORT is not bound (as in Istio)",
            r(&[], &[("ENVOY_PORT", "0")]),
            r(&[], &[]),
            true,
        ),
        (
            "flag wins over a bad variable",
            r(&["-z", "15006"], &[("INBOUND_CAPTURE_PORT", "0")]),
            r(&["-z", "15006"], &[]),
            true,
        ),
        (
            "-m empty is REDIRECT",
            r(&["-m", ""], &[]),
            r(&["-m", "REDIRECT"], &[]),
            true,
        ),
    ]
}

fn dry(r: &Row) -> Row {
    let mut args = vec![OsString::from("--dry-run")];
    args.extend(r.args.iter().cloned());
    Row {
        what: r.what.clone(),
        args,
        env: r.env.clone(),
        names: vec![],
    }
}

#[kernel_test]
fn lenient_rows_succeed_like_their_canonical_form() {
    let ns = pod_ns();
    let before = snapshot(&ns);
    let mut failures = Vec::new();
    let rows = lenient_rows();
    for (what, lenient, canonical, same) in &rows {
        let a = run_row(&ns, &dry(lenient));
        let b = run_row(&ns, &dry(canonical));
        if a.code != 0 || b.code != 0 {
            failures.push(format!(
                "{what}: exit {} / {}\n{}{}",
                a.code,
                b.code,
                tail(&a.stderr),
                tail(&b.stderr)
            ));
        } else if *same && a.stdout != b.stdout {
            failures.push(format!(
                "{what}: output differs from the canonical form:\n{}\n--- vs ---\n{}",
                a.stdout, b.stdout
            ));
        }
        if snapshot(&ns) != before {
            failures.push(format!("{what}: dry-run changed the namespace"));
        }
    }
    eprintln!(
        "lenient: {} rows tried, {} states compared",
        rows.len(),
        rows.len()
    );
    assert_none(failures);
}

// ---- 1 MB values and 100k-item lists: in-process, through the binary's own parser.

fn resolve(args: &[String], env: &[(&str, String)]) -> Result<Settings, String> {
    let map: HashMap<&str, String> = env.iter().cloned().collect();
    let lookup = |k: &str| map.get(k).cloned();
    let argv = std::iter::once("redirect-init".to_string())
        .chain(args.iter().cloned())
        .map(OsString::from);
    match flags::parse(argv, &lookup)? {
        Parsed::Run(r) => Settings::from_resolved(&r).map_err(|e| e.to_string()),
        Parsed::Info(_) => Err("help".into()),
    }
}

/// Arguments, variables, what the error must name.
type HugeCase<'a> = (Vec<String>, Vec<(&'a str, String)>, Vec<&'a str>);

#[test]
fn megabyte_values_and_100k_item_lists_are_refused_by_name() {
    let mb_digits = "7".repeat(1 << 20);
    let mut ports_100k = "80,".repeat(100_000);
    ports_100k.push_str("70000");
    let mut cidrs_100k = "10.0.0.0/8,".repeat(100_000);
    cidrs_100k.push_str("10.0.0.0/33");
    let mut ids_100k = "1,".repeat(100_000);
    ids_100k.push_str("x1");
    let mut ifaces_100k = "eth0,".repeat(100_000);
    ifaces_100k.push_str("a/b");
    let mut groups = "1000,".repeat(100_000);
    groups.push('1');
    let cases: Vec<HugeCase> = vec![
        (
            vec![format!("--envoy-port={mb_digits}")],
            vec![],
            vec!["--envoy-port (-p)", "7777777"],
        ),
        (
            vec![],
            vec![("INBOUND_CAPTURE_PORT", mb_digits.clone())],
            vec!["INBOUND_CAPTURE_PORT"],
        ),
        (
            vec![format!("-b{ports_100k}")],
            vec![],
            vec!["--istio-inbound-ports (-b)", "70000"],
        ),
        (
            vec![],
            vec![("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", ports_100k.clone())],
            vec!["ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", "70000"],
        ),
        (
            vec![format!("-i{cidrs_100k}")],
            vec![],
            vec!["--istio-service-cidr (-i)", "10.0.0.0/33"],
        ),
        (
            vec![],
            vec![("ISTIO_SERVICE_EXCLUDE_CIDR", cidrs_100k.clone())],
            vec!["ISTIO_SERVICE_EXCLUDE_CIDR", "10.0.0.0/33"],
        ),
        (
            vec![format!("-u{ids_100k}")],
            vec![],
            vec!["--proxy-uid (-u)", "x1"],
        ),
        (
            vec![format!("-c{ifaces_100k}")],
            vec![],
            vec!["--istio-exclude-interfaces (-c)", "a/b"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS", groups)],
            vec!["ISTIO_OUTBOUND_OWNER_GROUPS", "64"],
        ),
        (
            vec![format!("--probe-timeout={mb_digits}s")],
            vec![],
            vec!["--probe-timeout"],
        ),
        (
            vec![format!("-m{}", "X".repeat(1 << 20))],
            vec![],
            vec!["--istio-inbound-interception-mode (-m)", "XXXX"],
        ),
    ];
    let mut failures = Vec::new();
    for (args, env, names) in &cases {
        let what = short(&format!("{args:?} {env:?}"));
        match resolve(args, env) {
            Ok(_) => failures.push(format!("{what}: accepted")),
            Err(e) => {
                for n in names {
                    if !e.contains(n) {
                        failures.push(format!("{what}: error lacks {n:?}: {}", short(&e)));
                    }
                }
            }
        }
    }
    eprintln!(
        "huge (in-process): {} rows tried, 0 states compared",
        cases.len()
    );
    assert_none(failures);
}

// ---- Non-UTF-8 environment values.

/// Read as unset they would drop the setting silently (the default capture applied); `main`
/// refuses them by name before anything runs (Istio's Go reads the bytes and fails to parse them).
fn non_utf8_env_rows() -> Vec<Row> {
    [
        "ISTIO_SERVICE_CIDR",
        "INBOUND_CAPTURE_PORT",
        "ISTIO_INBOUND_PORTS",
        "ISTIO_INBOUND_INTERCEPTION_MODE",
        "PROXY_UID",
        "ISTIO_OUTBOUND_OWNER_GROUPS",
    ]
    .iter()
    .map(|var| Row {
        what: format!("{var}=<non-UTF-8>"),
        args: vec![],
        env: vec![(OsString::from(var), os(b"10.0.0.0/8\xff"))],
        names: vec![var.to_string()],
    })
    .collect()
}

#[kernel_test]
fn non_utf8_env_values_are_refused_by_name() {
    run_kind("non-UTF-8 env", non_utf8_env_rows());
}
