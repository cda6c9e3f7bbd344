//! redirect-validate as Istio runs it and as an operator does: the real binary, in fresh pod-like
//! namespaces, with real connections.
//!
//! - The probe (default mode) as the proxy UID: passes with rules, fails with exit 126 and the
//!   right diagnosis without rules, as another UID, for an IPv6 pod with IPv4-only rules, and
//!   with a capture port taken.
//! - `inspect`: a clean comparison after apply; a rule deleted by hand is named; annotations as
//!   the expected configuration; Istio's leftovers noticed.
//! - `explain`: the verdict and the path, in text and JSON.
//! - Bad input: exit 1, a message naming the value, the namespace unchanged.

use std::io::Read;
use std::net::TcpListener;

use redirect_core::Capture;
use redirect_core::CaptureConfig;
use redirect_testkit::binary::{run_in, snapshot, Ran, Run};
use redirect_testkit::istio::SIDECAR_ARGS;
use redirect_testkit::{kernel_test, TestNetns};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_redirect-validate");

/// Istio's validation container arguments for the default sidecar: istio-init's, after
/// `--run-validation --skip-rule-apply`.
fn validation_args() -> Vec<&'static str> {
    let mut args = vec!["--run-validation", "--skip-rule-apply"];
    args.extend_from_slice(SIDECAR_ARGS);
    args
}

/// A pod namespace with `eth0` holding `addr` (a veth whose peer stays in the namespace).
fn pod(addr: &str) -> TestNetns {
    let ns = TestNetns::with_prefix("rdv");
    let family = if addr.contains(':') { "-6" } else { "-4" };
    ns.sh(&format!(
        "ip link add eth0 type veth peer name peer0 && ip {family} addr add {addr} dev eth0 nodad 2>/dev/null || ip {family} addr add {addr} dev eth0; ip link set eth0 up; ip link set peer0 up"
    ));
    ns
}

fn apply(ns: &TestNetns, cfg: &CaptureConfig) {
    let config = cfg
        .clone()
        .validated()
        .unwrap_or_else(|e| panic!("config: {e}"));
    redirect_core::Namespace::open(ns.path())
        .and_then(|pod| pod.apply(&Capture::Sidecar(config.clone())))
        .unwrap_or_else(|e| panic!("apply: {e}"));
}

fn validate(ns: &TestNetns, extra: &[&str], uid: u32) -> Ran {
    let mut args = validation_args();
    args.extend_from_slice(extra);
    run_in(BIN, ns, &Run::args(&args).user(uid, uid))
}

fn json(r: &Ran) -> Value {
    serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\nstderr:\n{}", r.stdout, r.stderr))
}

fn cause(r: &Ran) -> String {
    json(r)["diagnosis"]["cause"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[kernel_test]
fn probe_passes_with_rules_in_place() {
    let ns = pod("10.77.0.2/24");
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let r = validate(&ns, &["--probe-timeout", "5s"], 1337);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("Validation passed, iptables rules established"),
        "{}",
        r.stderr
    );
    let r = validate(&ns, &["--probe-timeout", "5s", "--json"], 1337);
    let v = json(&r);
    assert_eq!((r.code, v["passed"].as_bool()), (0, Some(true)), "{v}");
    assert_eq!(v["listener_port"], 15006);
    // "Well within the timeout": the first attempt is redirected.
    assert!(v["elapsed_ms"].as_u64().unwrap() < 1000, "{v}");
}

#[kernel_test]
fn probe_without_rules_is_126_no_rules() {
    let ns = pod("10.77.0.2/24");
    let r = validate(&ns, &["--probe-timeout", "1s"], 1337);
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert!(
        r.stderr.contains("iptables validation failed"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("diagnosis: no_rules"), "{}", r.stderr);
    assert!(
        r.stderr.contains("fix: the rules were never programmed"),
        "{}",
        r.stderr
    );
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 1337);
    assert_eq!(r.code, 126);
    assert_eq!(cause(&r), "no_rules");
    assert!(json(&r)["elapsed_ms"].as_u64().unwrap() >= 1000);
    // Run as root, the probe reads nf_tables and confirms it.
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 0);
    assert_eq!(cause(&r), "no_rules", "{}", r.stdout);
    assert!(
        r.stdout.contains("confirmed by reading nf_tables"),
        "{}",
        r.stdout
    );
}

/// Every non-empty line of `stderr` as a JSON object; panics naming one that is not.
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Istio's injector adds `--log_as_json` with `global.logAsJson`: each line on stderr is then a
/// JSON object (the diagnosis too), and `--log_output_level` of the proxy's scopes is passed
/// over; a bad value for either is refused by name before any probe.
#[kernel_test]
fn log_as_json_gives_json_lines_and_bad_log_flags_are_refused() {
    let ns = pod("10.77.0.2/24");
    let r = validate(
        &ns,
        &[
            "--probe-timeout",
            "1s",
            "--log_as_json",
            "--log_output_level=default:info,ads:debug",
        ],
        1337,
    );
    assert_eq!(r.code, 126, "{}", r.stderr);
    let lines = json_lines(&r.stderr);
    let msgs: Vec<&str> = lines.iter().filter_map(|l| l["msg"].as_str()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("iptables validation failed")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter().any(|m| m.starts_with("diagnosis: no_rules")),
        "{msgs:?}"
    );
    assert!(lines
        .iter()
        .all(|l| l["level"] == "error" && l["time"].is_string()));
    for (flag, named) in [
        ("--log_as_json=maybe", "maybe"),
        ("--log_output_level=default:loud", "loud"),
    ] {
        let r = validate(&ns, &["--probe-timeout", "1s", flag], 1337);
        assert_eq!(r.code, 1, "{flag}: {}", r.stderr);
        assert!(r.stderr.contains(named), "{flag}: {}", r.stderr);
        assert!(
            !r.stderr.contains("validation failed"),
            "{flag}: {}",
            r.stderr
        );
    }
}

#[kernel_test]
fn probe_as_another_uid_is_126_not_proxy_uid() {
    let ns = pod("10.77.0.2/24");
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 1000);
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert_eq!(cause(&r), "not_proxy_uid", "{}", r.stdout);
    let summary = json(&r)["diagnosis"]["summary"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        summary.contains("uid 1000") && summary.contains("1337"),
        "{summary}"
    );
    // The same UID passes once it is the proxy's (OpenShift's random UIDs).
    let mut args = validation_args();
    let u = args.iter().position(|a| *a == "-u").unwrap();
    args[u + 1] = "1000";
    args.extend(["--probe-timeout", "1s"]);
    let mut cfg = CaptureConfig::istio_sidecar_default();
    cfg.proxy_uids = vec![1000];
    cfg.proxy_gids = vec![1000];
    apply(&ns, &cfg);
    let r = run_in(BIN, &ns, &Run::args(&args).user(1000, 1000));
    assert_eq!(r.code, 0, "{}", r.stderr);
}

/// An IPv6 pod that missed the plugin has no rules at all: `no_rules`, whose fix is the
/// repair (before: `ipv6_rules_missing`, which sent operators after dual-stack settings).
#[kernel_test]
fn ipv6_pod_without_rules_is_126_no_rules() {
    let ns = pod("fd77::2/64");
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 1337);
    assert_eq!(r.code, 126, "{}", r.stderr);
    let v = json(&r);
    assert_eq!(v["target"], "[::6]:15002");
    assert_eq!(cause(&r), "no_rules", "{v}");
    let d = &v["diagnosis"];
    assert!(d["evidence"].to_string().contains("either family"), "{v}");
    assert!(
        d["fix"].as_str().unwrap().contains(
            "repair controller (redirect-cni-node) programs such a pod in place by default"
        ),
        "{v}"
    );
}

#[kernel_test]
fn ipv6_pod_with_ipv4_rules_is_126_ipv6_rules_missing() {
    let ns = pod("fd77::2/64");
    // IPv4 rules only, as for an IPv4 pod.
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 1337);
    assert_eq!(r.code, 126, "{}", r.stderr);
    let v = json(&r);
    assert_eq!(v["target"], "[::6]:15002");
    assert_eq!(cause(&r), "ipv6_rules_missing", "{v}");
    let evidence = v["diagnosis"]["evidence"].to_string();
    assert!(
        evidence.contains("over IPv4 (127.0.0.6) passed"),
        "{evidence}"
    );
    assert!(evidence.contains("::6 is not on lo"), "{evidence}");
    // With IPv6 rules (and ::6 on lo) the same pod passes.
    let cfg = CaptureConfig {
        ipv6: true,
        ..CaptureConfig::istio_sidecar_default()
    };
    apply(&ns, &cfg);
    let r = validate(&ns, &["--probe-timeout", "5s"], 1337);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[kernel_test]
fn taken_capture_port_is_126_listener_port_taken() {
    let ns = pod("10.77.0.2/24");
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    // Another process holds 15006 without SO_REUSEPORT and answers every connection.
    let held = ns.run(|| TcpListener::bind("127.0.0.1:15006").unwrap());
    std::thread::spawn(move || {
        for mut s in held.incoming().flatten() {
            let _ = s.read(&mut [0u8; 16]);
        }
    });
    let r = validate(&ns, &["--probe-timeout", "1s", "--json"], 1337);
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert_eq!(cause(&r), "listener_port_taken", "{}", r.stdout);
    assert!(
        r.stdout.contains("cannot listen on port 15006"),
        "{}",
        r.stdout
    );
}

#[kernel_test]
fn bad_flags_exit_1_name_the_value_and_touch_nothing() {
    let ns = pod("10.77.0.2/24");
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let before = snapshot(&ns);
    let cases: &[(&[&str], &str)] = &[
        (&["-p", "notaport"], "notaport"),
        (&["--probe-timeout", "5"], "--probe-timeout"),
        (&["-m", "SIDEWAYS"], "SIDEWAYS"),
        (&["--no-such-flag"], "--no-such-flag"),
        (&["-u", "13x7"], "13x7"),
    ];
    for (args, needle) in cases {
        let r = validate(&ns, args, 1337);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
    }
    for (args, needle) in [
        (
            vec!["explain", "--flow", "sideways tcp 10.0.0.1:80"],
            "sideways",
        ),
        (
            vec![
                "explain",
                "--flow",
                "out tcp 10.0.0.1:80",
                "--pod-ip",
                "ten",
            ],
            "ten",
        ),
        (
            vec!["inspect", "--netns", "/nonexistent/ns"],
            "/nonexistent/ns",
        ),
        (
            vec![
                "inspect",
                "--netns",
                ns.path().to_str().unwrap(),
                "--annotations",
                "/nonexistent/a",
            ],
            "/nonexistent/a",
        ),
    ] {
        let r = run_in(BIN, &ns, &Run::args(&args));
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
    }
    assert_eq!(snapshot(&ns), before, "a failed run changed the namespace");
}

fn inspect(ns: &TestNetns, extra: &[&str]) -> Ran {
    let path = ns.path().to_str().unwrap().to_string();
    let mut args = vec!["inspect", "--netns", path.as_str()];
    args.extend_from_slice(extra);
    // From the host namespace, as an operator on the node.
    let r = std::process::Command::new(BIN)
        .args(&args)
        .output()
        .unwrap();
    Ran {
        code: r.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
    }
}

#[kernel_test]
fn inspect_compares_and_names_a_deleted_rule() {
    let ns = pod("10.77.0.2/24");
    let flags: Vec<&str> = SIDECAR_ARGS.to_vec();
    // Nothing there yet: the table is missing.
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("absent"), "{}", r.stdout);
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("expected (Istio's flags): the rules match"),
        "{}",
        r.stdout
    );
    // Readable: the proxy's loopback redirect, in nft syntax.
    assert!(
        r.stdout.contains("oifname \"lo\" ip daddr != 127.0.0.1/32 meta l4proto tcp th dport != 15008 meta skuid 1337 jump nat_ip_istio_in_redirect"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("set inbound-exclude-ports { 15020, 15021, 15090 }"),
        "{}",
        r.stdout
    );
    // Delete that rule by hand.
    let listing = ns.sh("nft -a list chain inet redirect_capture nat_ip_istio_output");
    let handle = listing
        .lines()
        .find(|l| l.contains("skuid 1337") && l.contains("istio_in_redirect"))
        .and_then(|l| l.rsplit("# handle ").next())
        .unwrap_or_else(|| panic!("no such rule in:\n{listing}"))
        .trim()
        .to_string();
    ns.sh(&format!(
        "nft delete rule inet redirect_capture nat_ip_istio_output handle {handle}"
    ));
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("chain nat_ip_istio_output: rule 2 is missing: oifname \"lo\" ip daddr != 127.0.0.1/32 meta l4proto tcp th dport != 15008 meta skuid 1337 jump nat_ip_istio_in_redirect"),
        "{}",
        r.stdout
    );
    let v: Value =
        serde_json::from_str(&inspect(&ns, &[&flags[..], &["--json"]].concat()).stdout).unwrap();
    assert_eq!(v["equal"], false);
    assert!(!v["differences"].as_array().unwrap().is_empty());
    // Without a configuration, inspect only shows what is there.
    let r = inspect(&ns, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("expected: not given"), "{}", r.stdout);
}

/// A dormant table captures nothing whatever its rules: inspect says so and counts it.
#[kernel_test]
fn inspect_names_a_dormant_table() {
    let ns = pod("10.77.0.2/24");
    let flags: Vec<&str> = SIDECAR_ARGS.to_vec();
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    ns.sh("nft add table inet redirect_capture '{ flags dormant; }'");
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("table inet redirect_capture: flags dormant (its chains are unhooked: nothing is captured)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("- table inet redirect_capture has flags dormant but the plan has none: a dormant table hooks no chain"),
        "{}",
        r.stdout
    );
    let v: Value =
        serde_json::from_str(&inspect(&ns, &[&flags[..], &["--json"]].concat()).stdout).unwrap();
    assert_eq!(v["table_flags"], "dormant", "{v}");
    assert_eq!(v["equal"], false, "{v}");
    // Applied again, the table is active and equal.
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

#[kernel_test]
fn inspect_with_annotations_and_istio_leftovers() {
    let ns = pod("10.77.0.2/24");
    let status = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#;
    let file = std::env::temp_dir().join(format!("rdv-annotations-{}", std::process::id()));
    let downward = format!(
        "sidecar.istio.io/status={}\ntraffic.sidecar.istio.io/excludeInboundPorts=\"8080\"\n",
        serde_json::to_string(status).unwrap()
    );
    std::fs::write(&file, downward).unwrap();
    let mut cfg = CaptureConfig::istio_sidecar_default();
    cfg.inbound_exclude_ports = vec![8080, 15020, 15021, 15090];
    cfg.outbound_exclude_ports = vec![15020];
    apply(&ns, &cfg);
    let a = file.to_str().unwrap();
    let r = inspect(&ns, &["--annotations", a]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("expected (the pod's annotations): the rules match"),
        "{}",
        r.stdout
    );
    // Other annotations: the port set differs.
    std::fs::write(
        &file,
        format!(
            "sidecar.istio.io/status={}\n",
            serde_json::to_string(status).unwrap()
        ),
    )
    .unwrap();
    let r = inspect(&ns, &["--annotations", a]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("set inbound-exclude-ports"),
        "{}",
        r.stdout
    );
    // Istio's chains beside ours are noticed, with every jump to each (one from OUTPUT, one
    // from ISTIO_OUTPUT).
    ns.sh("iptables-nft -t nat -N ISTIO_OUTPUT && iptables-nft -t nat -A OUTPUT -p tcp -j ISTIO_OUTPUT && iptables-nft -t nat -N ISTIO_REDIRECT && iptables-nft -t nat -A ISTIO_OUTPUT -j ISTIO_REDIRECT");
    let r = inspect(&ns, &[]);
    assert!(
        r.stdout
            .contains("nat ISTIO_OUTPUT: 1 rule(s), 1 jump(s) to it")
            && r.stdout
                .contains("nat ISTIO_REDIRECT: 0 rule(s), 1 jump(s) to it"),
        "{}",
        r.stdout
    );
    let _ = std::fs::remove_file(&file);
}

/// `::6` missing on `lo` of an IPv6 pod is a difference for `inspect`, as for CNI CHECK: both
/// ask `capture::check`.
#[kernel_test]
fn inspect_counts_a_missing_lo_v6_address() {
    let ns = pod("fd00:77::2/64");
    let mut cfg = CaptureConfig::istio_sidecar_default();
    cfg.ipv6 = true;
    apply(&ns, &cfg);
    let flags: Vec<&str> = [SIDECAR_ARGS, &["--dual-stack"]].concat();
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("::6 on lo: yes"), "{}", r.stdout);
    ns.sh("ip -6 addr del ::6/128 dev lo");
    let r = inspect(&ns, &flags);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("::6 on lo: no") && r.stdout.contains("  - ::6/128 missing on lo"),
        "{}",
        r.stdout
    );
}

#[kernel_test]
fn explain_prints_the_verdict_and_the_path() {
    let ns = TestNetns::with_prefix("rdv");
    let flags: Vec<&str> = SIDECAR_ARGS.to_vec();
    let mut args = vec!["explain"];
    args.extend(&flags);
    args.extend([
        "--flow",
        "out tcp uid=1000 10.1.2.3:80",
        "--flow",
        "in tcp 10.77.0.2:15021",
    ]);
    // No privilege needed.
    let r = run_in(BIN, &ns, &Run::args(&args).user(1000, 1000));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("verdict: redirected to port 15001 (127.0.0.1:15001)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("the proxy's outbound listener (-p)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("ip nat OUTPUT > ISTIO_REDIRECT #1: meta l4proto tcp redirect to :15001"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("verdict: passed (not captured)"),
        "{}",
        r.stdout
    );
    args.push("--json");
    let r = run_in(BIN, &ns, &Run::args(&args).user(1000, 1000));
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v[0]["verdict"]["kind"], "redirect");
    assert_eq!(v[0]["verdict"]["port"], 15001);
    assert_eq!(v[1]["verdict"]["kind"], "pass");
    assert!(v[0]["steps"].as_array().unwrap().len() > 3);
    // The proxy calling its own pod's address goes through lo: inbound capture.
    let mut args = vec!["explain"];
    args.extend(&flags);
    args.extend([
        "--pod-ip",
        "10.77.0.2",
        "--flow",
        "out tcp uid=1337 10.77.0.2:8080",
    ]);
    let r = run_in(BIN, &ns, &Run::args(&args).user(1000, 1000));
    assert!(r.stdout.contains("oif=lo"), "{}", r.stdout);
    assert!(
        r.stdout.contains("redirected to port 15006"),
        "{}",
        r.stdout
    );
}

/// `explain --annotations`: the pod decided as redirect-cni decides it. An init container's
/// bypass UID passes, the app is captured, a pod outside the mesh has nothing captured, and a
/// bypass UID that is the proxy's is refused, naming the annotation.
#[test]
fn explain_plans_from_a_pods_annotations() {
    let dir = std::env::temp_dir().join(format!("rdv-explain-ann-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, json: Value| {
        let p = dir.join(name);
        std::fs::write(&p, json.to_string()).unwrap();
        p.to_str().unwrap().to_string()
    };
    let status = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#;
    let mesh = write(
        "mesh.json",
        serde_json::json!({"sidecar.istio.io/status": status, "redirect.io/bypass-uids": "1337",
                           "traffic.sidecar.istio.io/excludeOutboundPorts": "5432"}),
    );
    let outside = write("outside.json", serde_json::json!({"app": "x"}));
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("explain")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let flows = [
        "--flow",
        "out udp uid=1337 10.96.0.10:53",
        "--flow",
        "out tcp uid=1000 10.96.0.10:80",
        "--flow",
        "out tcp uid=1000 10.96.0.11:5432",
        "--json",
    ];
    let (code, stdout, stderr) =
        run(&[&["--annotations", &mesh, "-u", "1000650001"][..], &flows].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v[0]["verdict"]["kind"], "pass", "the bypass UID: {stdout}");
    assert_eq!(v[1]["verdict"]["kind"], "redirect", "{stdout}");
    assert_eq!(v[1]["verdict"]["port"], 15001, "{stdout}");
    assert_eq!(
        v[2]["verdict"]["kind"], "pass",
        "the annotation's port: {stdout}"
    );
    // The init container's TCP: passed with the bypass, captured by Istio's flags alone.
    let (code, stdout, _) = run(&[
        "--annotations",
        &mesh,
        "-u",
        "1000650001",
        "--flow",
        "out tcp uid=1337 10.96.0.10:443",
    ]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("verdict: passed (not captured)"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&[
        "-u",
        "1000650001",
        "-i",
        "*",
        "--flow",
        "out tcp uid=1337 10.96.0.10:443",
    ]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("redirected to port 15001"),
        "without the bypass: {stdout}"
    );

    let (code, stdout, stderr) = run(&[&["--annotations", &outside][..], &flows].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("the pod is not captured"), "{stderr}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .all(|f| f["verdict"]["kind"] == "pass"),
        "{stdout}"
    );

    let (code, _, stderr) = run(&[&["--annotations", &mesh, "-u", "1337"][..], &flows].concat());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("redirect.io/bypass-uids") && stderr.contains("1337"),
        "{stderr}"
    );
    let missing = dir.join("missing.json");
    let (code, _, stderr) = run(&[
        "--annotations",
        missing.to_str().unwrap(),
        "--flow",
        "out tcp 10.0.0.1:80",
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("missing.json"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run as root the probe reads the rules, and tells stale rules of ours from Istio's.
#[kernel_test]
fn probe_tells_stale_rules_from_istio_rules() {
    // Our table for proxy UID 1337; the validation says the proxy is uid 0 (root).
    let ns = pod("10.77.0.2/24");
    apply(&ns, &CaptureConfig::istio_sidecar_default());
    let mut args = validation_args();
    let u = args.iter().position(|a| *a == "-u").unwrap();
    args[u + 1] = "0";
    args.extend(["--probe-timeout", "1s", "--json"]);
    let r = run_in(BIN, &ns, &Run::args(&args).user(0, 0));
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert_eq!(cause(&r), "rules_stale", "{}", r.stdout);
    assert!(
        r.stdout.contains("meta skuid"),
        "the differences are listed: {}",
        r.stdout
    );
    // Istio's rules for uid 1337 (iptables-nft), none of ours.
    let ns = pod("10.77.0.2/24");
    ns.sh("iptables-nft -t nat -N ISTIO_OUTPUT && iptables-nft -t nat -A OUTPUT -p tcp -j ISTIO_OUTPUT && iptables-nft -t nat -A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN");
    let r = run_in(BIN, &ns, &Run::args(&args).user(0, 0));
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert_eq!(cause(&r), "rules_not_ours", "{}", r.stdout);
    assert!(r.stdout.contains("ISTIO_OUTPUT"), "{}", r.stdout);
}
