//! Istio parity through the binary: for every case of `testdata/istio/iptables/`, Istio's rules
//! go into one pod namespace and `redirect-init`, run there with the case's flags and
//! environment (every other case passes its settings as variables instead of flags), into
//! another; the same real connections must end in the same place. IPv6 and DNS are derived as
//! Istio derives them: `--dual-stack` with the pod's IPv6 address, servers from resolv.conf.

mod common;

use common::{run_in, Run};
use redirect_testkit::istio::{self, list_cases, load_istio_case, probe_matrix, IstioCase};
use redirect_testkit::{kernel_test, run_probes};

/// Flags that take a value, by the case JSON's key, with the variable Istio binds to them.
const VALUE_FLAGS: &[(&str, Option<&str>)] = &[
    ("envoy-port", None),
    ("inbound-capture-port", Some("INBOUND_CAPTURE_PORT")),
    ("inbound-tunnel-port", Some("INBOUND_TUNNEL_PORT")),
    ("proxy-uid", Some("PROXY_UID")),
    ("proxy-gid", Some("PROXY_GID")),
    (
        "istio-inbound-interception-mode",
        Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
    ),
    (
        "istio-inbound-tproxy-mark",
        Some("ISTIO_INBOUND_TPROXY_MARK"),
    ),
    (
        "istio-inbound-tproxy-route-table",
        Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
    ),
    ("istio-inbound-ports", Some("ISTIO_INBOUND_PORTS")),
    (
        "istio-local-exclude-ports",
        Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
    ),
    ("istio-service-cidr", Some("ISTIO_SERVICE_CIDR")),
    (
        "istio-service-exclude-cidr",
        Some("ISTIO_SERVICE_EXCLUDE_CIDR"),
    ),
    ("istio-outbound-ports", Some("ISTIO_OUTBOUND_PORTS")),
    (
        "istio-local-outbound-ports-exclude",
        Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
    ),
    ("kube-virt-interfaces", Some("KUBE_VIRT_INTERFACES")),
    ("istio-exclude-interfaces", Some("ISTIO_EXCLUDE_INTERFACES")),
];
const BOOL_FLAGS: &[(&str, &str)] = &[
    ("redirect-dns", "ISTIO_META_DNS_CAPTURE"),
    ("capture-all-dns", "CAPTURE_ALL_DNS"),
    ("drop-invalid", "INVALID_DROP"),
];
const ENV_ONLY: &[&str] = &[
    "ISTIO_OUTBOUND_OWNER_GROUPS",
    "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE",
    "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR",
];

/// The command line and environment Istio's init container would get for a case.
fn invocation(case: &IstioCase, as_env: bool) -> Run {
    let s = |k: &str| {
        case.raw
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string()
    };
    let b = |k: &str| case.raw.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    let mut run = Run::default();
    for (key, var) in VALUE_FLAGS {
        match (as_env, var) {
            (true, Some(var)) => run.env.push((var.to_string(), s(key))),
            _ => run.args.extend([format!("--{key}"), s(key)]),
        }
    }
    for (key, alias) in BOOL_FLAGS {
        if b(key) {
            if as_env {
                run.env.push((alias.to_string(), "true".into()));
            } else {
                run.args.push(format!("--{key}"));
            }
        }
    }
    if case.enable_ipv6 {
        if as_env {
            run.env.push(("ISTIO_DUAL_STACK".into(), "true".into()));
        } else {
            run.args.push("--dual-stack".into());
        }
    }
    for k in ENV_ONLY {
        run.env.push((k.to_string(), s(k)));
    }
    for a in &case.dns_servers_v4 {
        run.resolv_conf.push_str(&format!("nameserver {a}\n"));
    }
    for a in &case.dns_servers_v6 {
        run.resolv_conf.push_str(&format!("nameserver {a}\n"));
    }
    run
}

#[kernel_test]
fn redirect_init_captures_like_istio_in_every_case() {
    let cases = list_cases();
    assert_eq!(cases.len(), 27, "Istio's iptables test data has 27 cases");
    let mut mismatches = Vec::new();
    let mut probes_run = 0;
    for (i, name) in cases.iter().enumerate() {
        let case = IstioCase::load(name);
        let probes = probe_matrix(&case);
        let theirs = istio::case_topology(&case);
        load_istio_case(&theirs.pod, &case);
        let ours = istio::case_topology(&case);
        let run = invocation(&case, i % 2 == 1);
        let ran = run_in(&ours.pod, &run);
        assert_eq!(
            ran.code, 0,
            "{name}: redirect-init {:?} env {:?} failed:\n{}",
            run.args, run.env, ran.stderr
        );
        let ipv6_line = format!("ENABLE_INBOUND_IPV6={}", case.enable_ipv6);
        assert!(
            ran.stderr.contains(&ipv6_line),
            "{name}: IPv6 not derived as {ipv6_line}:\n{}",
            ran.stderr
        );

        let want = run_probes(&theirs, &probes);
        let got = run_probes(&ours, &probes);
        for ((p, w), g) in probes.iter().zip(&want).zip(&got) {
            probes_run += 1;
            if w != g {
                mismatches.push(format!("{name}: {p}\n    istio: {w}\n    ours:  {g}"));
            }
        }
    }
    eprintln!(
        "{probes_run} probes over {} cases, {} mismatches",
        cases.len(),
        mismatches.len()
    );
    assert!(probes_run > 1000, "only {probes_run} probes");
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
