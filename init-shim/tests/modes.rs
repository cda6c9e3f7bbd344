//! The binary's modes in fresh namespaces with real connections: bad input leaves the kernel as
//! it was; dry-run output loads with `nft -f` and `iptables-restore` and captures like the
//! native apply; cleanup; reconcile and force-apply; the validation probe's exit codes; the
//! iptables backend with each variant; `--network-namespace`.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::{run_in, snapshot, snapshot_effective, snapshot_effective_of, Run, BIN};
use redirect_testkit::istio::{load_istio_case, IstioCase};
use redirect_testkit::{kernel_test, run_probes, From, Outcome, Probe, Side, TestNetns, Topology};

use redirect_testkit::istio::SIDECAR_ARGS as ISTIO_ARGS;

fn istio_args_with(extra: &[&str]) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = ISTIO_ARGS.to_vec();
    v.extend(
        extra
            .iter()
            .map(|s| &*Box::leak(s.to_string().into_boxed_str())),
    );
    v
}

fn sa(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Connections that tell Istio's default capture apart from anything else, per family.
fn probes(topo: &Topology, v6: bool) -> Vec<Probe> {
    let pod = topo.pod_addr(v6);
    let peer = topo.peer_addr(v6);
    let (lo, lo6) = if v6 {
        ("::1".parse().unwrap(), "::6".parse().unwrap())
    } else {
        ("127.0.0.1".parse().unwrap(), "127.0.0.6".parse().unwrap())
    };
    let app = From::Pod {
        uid: 1000,
        gid: 1000,
    };
    let proxy = From::Pod {
        uid: 1337,
        gid: 1337,
    };
    vec![
        Probe::tcp(From::Peer, sa(pod, 8080)),
        Probe::tcp(From::Peer, sa(pod, 15021)),
        Probe::tcp(From::Peer, sa(pod, 15090)),
        Probe::tcp(app.clone(), sa(peer, 80)),
        Probe::tcp(app.clone(), sa(peer, 15020)),
        Probe::tcp(proxy.clone(), sa(peer, 80)),
        Probe::tcp(proxy, sa(lo6, 15002)).bound(lo),
        Probe::tcp(app, sa(lo, 8080)),
    ]
}

fn all_probes(topo: &Topology, v6: bool) -> Vec<Probe> {
    let mut p = probes(topo, false);
    if v6 {
        p.extend(probes(topo, true));
    }
    p
}

#[kernel_test]
fn bad_input_exits_1_names_the_value_and_leaves_the_namespace_untouched() {
    let topo = Topology::basic();
    // Something of ours is there already: bad input must not change or remove it either.
    run_in(&topo.pod, &Run::args(ISTIO_ARGS)).expect_ok("initial apply");
    let before = snapshot(&topo.pod);
    assert!(
        before.contains("redirect_capture"),
        "initial apply left no table"
    );
    let cases: Vec<(Run, Vec<&str>)> = vec![
        (
            Run::args(&istio_args_with(&["-p", "70000"])),
            vec!["--envoy-port (-p)", "70000"],
        ),
        (
            Run::args(&istio_args_with(&["-b", "70000"])),
            vec!["--istio-inbound-ports (-b)", "70000"],
        ),
        (
            Run::args(&istio_args_with(&["-x", "*"])),
            vec!["--istio-service-exclude-cidr (-x)", "*"],
        ),
        (
            Run::args(&istio_args_with(&["-i", "10.0.0.0/8,10.1.2.300/32"])),
            vec!["--istio-service-cidr (-i)", "10.1.2.300/32"],
        ),
        (
            Run::args(&istio_args_with(&["-m", "TRPOXY"])),
            vec!["--istio-inbound-interception-mode (-m)", "TRPOXY"],
        ),
        (
            Run::args(ISTIO_ARGS).env("ISTIO_OUTBOUND_OWNER_GROUPS", "java,bad group"),
            vec!["ISTIO_OUTBOUND_OWNER_GROUPS", "bad group"],
        ),
        (
            Run::args(ISTIO_ARGS).env("ISTIO_OUTBOUND_OWNER_GROUPS", "java,no-such-group"),
            vec!["no-such-group"],
        ),
        (
            Run::args(ISTIO_ARGS).env("ISTIO_META_DNS_CAPTURE", "yes"),
            vec!["ISTIO_META_DNS_CAPTURE", "yes"],
        ),
        (
            Run::args(ISTIO_ARGS).env("FORCE_IPTABLES_BINARY", "newest"),
            vec!["FORCE_IPTABLES_BINARY", "newest"],
        ),
        (
            Run::args(&istio_args_with(&["--no-such-flag"])),
            vec!["--no-such-flag"],
        ),
        (
            Run::args(&istio_args_with(&["-d", "15090,", "-u", "13x7"])),
            vec!["--proxy-uid (-u)", "13x7"],
        ),
    ];
    for (run, wants) in &cases {
        let ran = run_in(&topo.pod, run);
        assert_eq!(
            ran.code, 1,
            "{:?} {:?}: exit {}\n{}",
            run.args, run.env, ran.code, ran.stderr
        );
        for w in wants {
            assert!(
                ran.stderr.contains(w),
                "{:?} {:?}: stderr lacks {w:?}:\n{}",
                run.args,
                run.env,
                ran.stderr
            );
        }
        assert!(
            ran.stdout.is_empty(),
            "{:?}: stdout not empty: {}",
            run.args,
            ran.stdout
        );
        assert_eq!(
            snapshot(&topo.pod),
            before,
            "{:?} {:?} changed the namespace",
            run.args,
            run.env
        );
    }
    // A namespace with no address at all: Istio's "no valid local IP address", nothing applied.
    let bare = TestNetns::new();
    let bare_before = snapshot(&bare);
    let ran = run_in(&bare, &Run::args(ISTIO_ARGS));
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("no valid local IP address"),
        "{}",
        ran.stderr
    );
    assert_eq!(snapshot(&bare), bare_before);
}

/// A namespace with one veth address and nothing listening.
fn addressed_netns() -> TestNetns {
    let ns = TestNetns::new();
    ns.sh("ip link add v0 type veth peer name v1 && ip addr add 10.9.0.2/24 dev v0 && ip link set v0 up");
    ns
}

fn pipe_into(ns: &TestNetns, cmd: &str, input: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns.name(), "sh", "-c", cmd])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}\ninput:\n{input}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[kernel_test]
fn dry_run_output_loads_with_the_tools_and_captures_like_the_native_apply() {
    for (label, extra) in [
        ("istio default", vec![]),
        (
            "dual stack, dns, drop-invalid, excludes",
            vec![
                "--dual-stack",
                "--redirect-dns",
                "--drop-invalid",
                "-x",
                "10.96.0.0/12,fd00:96::/64",
                "-o",
                "9000",
            ],
        ),
    ] {
        let args = istio_args_with(&extra);
        let native = Topology::basic();
        let ran = run_in(
            &native.pod,
            &Run::args(&args).resolv("nameserver 10.96.0.10\nnameserver fd00::10\n"),
        );
        ran.expect_ok(label);
        let v6 = !extra.is_empty();

        let nft_topo = Topology::basic();
        let before = snapshot(&nft_topo.pod);
        let file = std::env::temp_dir().join(format!("rdi-dry-{}", std::process::id()));
        let dry = run_in(
            &nft_topo.pod,
            &Run::args(&[args.as_slice(), &["--dry-run"]].concat())
                .env("DRY_RUN_FILE_PATH", file.to_str().unwrap())
                .resolv("nameserver 10.96.0.10\nnameserver fd00::10\n"),
        )
        .expect_ok(label);
        assert_eq!(
            snapshot(&nft_topo.pod),
            before,
            "{label}: --dry-run changed the namespace"
        );
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            dry.stdout,
            "DRY_RUN_FILE_PATH"
        );
        let _ = std::fs::remove_file(&file);
        pipe_into(&nft_topo.pod, "nft -f -", &dry.stdout);

        let ipt_topo = Topology::basic();
        let dry = run_in(
            &ipt_topo.pod,
            &Run::args(&[args.as_slice(), &["-n", "--dry-run-format", "iptables"]].concat())
                .resolv("nameserver 10.96.0.10\nnameserver fd00::10\n"),
        )
        .expect_ok(label);
        let mut parts = dry.stdout.split(init_shim::run::IP6TABLES_MARKER);
        pipe_into(
            &ipt_topo.pod,
            "iptables-restore --noflush",
            parts.next().unwrap(),
        );
        match parts.next() {
            Some(v6_input) => pipe_into(&ipt_topo.pod, "ip6tables-restore --noflush", v6_input),
            None => assert!(!v6, "{label}: no IPv6 part"),
        }
        if v6 {
            // What Istio and we add outside the rules; a dry run adds nothing.
            for t in [&nft_topo, &ipt_topo] {
                t.pod.sh("ip -6 addr add ::6/128 dev lo");
            }
        }

        let json = run_in(
            &native.pod,
            &Run::args(&[args.as_slice(), &["-n", "--dry-run-format=json"]].concat()),
        )
        .expect_ok(label);
        let doc: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
        assert_eq!(doc["config"]["envoy_port"], 15001);
        assert_eq!(doc["config"]["ipv6"], v6);
        assert!(doc["ruleset"]["chains"]
            .as_array()
            .is_some_and(|c| !c.is_empty()));

        let want = run_probes(&native, &all_probes(&native, v6));
        assert!(
            want.contains(&Outcome::landed(
                Side::Pod,
                15006,
                Some(sa(native.pod_addr(false), 8080))
            )),
            "{label}: native apply did not capture inbound: {want:?}"
        );
        let got_nft = run_probes(&nft_topo, &all_probes(&nft_topo, v6));
        let got_ipt = run_probes(&ipt_topo, &all_probes(&ipt_topo, v6));
        assert_eq!(
            got_nft, want,
            "{label}: nft -f of the dry run differs from the native apply"
        );
        assert_eq!(
            got_ipt, want,
            "{label}: iptables-restore of the dry run differs from the native apply"
        );
    }
}

#[kernel_test]
fn cleanup_only_removes_ours_and_istios_leftovers() {
    let topo = Topology::basic();
    let pristine = snapshot(&topo.pod);
    run_in(
        &topo.pod,
        &Run::args(&istio_args_with(&["-m", "TPROXY", "--dual-stack"])),
    )
    .expect_ok("tproxy apply");
    let applied = snapshot(&topo.pod);
    for what in ["redirect_capture", "lookup 133", "::6/128"] {
        assert!(applied.contains(what), "apply left no {what}:\n{applied}");
    }
    run_in(&topo.pod, &Run::args(&["--cleanup-only"])).expect_ok("cleanup");
    assert_eq!(
        snapshot(&topo.pod),
        pristine,
        "cleanup left something of ours"
    );

    // Istio's own rules: iptables chains (the tproxy case, both families, routes) and its nft tables.
    let case = IstioCase::load("tproxy");
    load_istio_case(&topo.pod, &case);
    topo.pod.sh("nft add table inet istio-proxy-nat; nft add chain inet istio-proxy-nat output '{ type nat hook output priority -100; }'; nft add rule inet istio-proxy-nat output tcp dport 80 redirect to :15001");
    let loaded = snapshot(&topo.pod);
    assert!(
        loaded.contains("ISTIO_OUTPUT") && loaded.contains("istio-proxy-nat"),
        "{loaded}"
    );
    let ran = run_in(&topo.pod, &Run::args(&["--cleanup-only"])).expect_ok("cleanup of Istio's");
    assert!(ran.stderr.contains("istio-proxy-nat"), "{}", ran.stderr);
    assert_eq!(
        snapshot_effective(&topo.pod),
        snapshot_effective_of(&pristine),
        "cleanup left some of Istio's rules"
    );
}

#[kernel_test]
fn reconcile_and_force_apply() {
    // Istio's rules in place: refused without --reconcile, replaced with it.
    let topo = Topology::basic();
    load_istio_case(&topo.pod, &IstioCase::load("ipnets"));
    let before = snapshot(&topo.pod);
    let ran = run_in(&topo.pod, &Run::args(ISTIO_ARGS));
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("--reconcile") && ran.stderr.contains("ISTIO_OUTPUT"),
        "{}",
        ran.stderr
    );
    assert_eq!(snapshot(&topo.pod), before);
    run_in(&topo.pod, &Run::args(&istio_args_with(&["--reconcile"])))
        .expect_ok("reconcile over Istio");
    let after = snapshot(&topo.pod);
    assert!(
        !after.contains("ISTIO_") && after.contains("redirect_capture"),
        "{after}"
    );
    let got = run_probes(&topo, &probes(&topo, false));
    assert_eq!(
        got[0],
        Outcome::landed(Side::Pod, 15006, Some(sa(topo.pod_addr(false), 8080)))
    );
    assert_eq!(
        got[3],
        Outcome::landed(Side::Pod, 15001, Some(sa(topo.peer_addr(false), 80)))
    );

    // Ours for the same config: nothing to do, unless forced.
    let ran = run_in(&topo.pod, &Run::args(ISTIO_ARGS)).expect_ok("same again");
    assert!(ran.stderr.contains("already in place"), "{}", ran.stderr);
    let ran =
        run_in(&topo.pod, &Run::args(&istio_args_with(&["--force-apply"]))).expect_ok("forced");
    assert!(ran.stderr.contains("applied"), "{}", ran.stderr);

    // Ours for another config: refused without --reconcile (naming the difference), replaced with it.
    let before = snapshot(&topo.pod);
    let other = istio_args_with(&["-d", "15090,15021"]);
    let ran = run_in(&topo.pod, &Run::args(&other));
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("inbound-exclude-ports") && ran.stderr.contains("--reconcile"),
        "{}",
        ran.stderr
    );
    assert_eq!(snapshot(&topo.pod), before);
    run_in(
        &topo.pod,
        &Run::args(&[other.as_slice(), &["--reconcile"]].concat()),
    )
    .expect_ok("reconcile");
    let got = run_probes(
        &topo,
        &[Probe::tcp(From::Peer, sa(topo.pod_addr(false), 15020))],
    );
    assert_eq!(
        got[0],
        Outcome::landed(Side::Pod, 15006, Some(sa(topo.pod_addr(false), 15020))),
        "15020 is captured now"
    );
}

#[kernel_test]
fn validation_exits_0_with_rules_and_126_without() {
    let probe_args = [
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "--run-validation",
        "--skip-rule-apply",
        "--probe-timeout",
        "1s",
    ];
    // A pod before its proxy starts: an address, nothing listening on the capture ports.
    let pod = addressed_netns();
    let ran = run_in(&pod, &Run::args(&probe_args).user(1337, 1337));
    assert_eq!(ran.code, 126, "no rules: {}", ran.stderr);
    assert!(
        ran.stderr.contains("validation failed") && ran.stderr.contains("timeout"),
        "{}",
        ran.stderr
    );
    // What the probe saw, the diagnosis and the fix, each on its own line.
    let lines: Vec<&str> = ran.stderr.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("error\tiptables validation failed"))
        .unwrap_or_else(|| panic!("no error line: {}", ran.stderr));
    assert!(
        lines
            .get(at + 1)
            .is_some_and(|l| l.starts_with("error\tdiagnosis: "))
            && lines
                .get(at + 2)
                .is_some_and(|l| l.starts_with("error\tfix: ")),
        "{}",
        ran.stderr
    );

    run_in(&pod, &Run::args(ISTIO_ARGS)).expect_ok("apply");
    let ran = run_in(&pod, &Run::args(&probe_args).user(1337, 1337));
    assert_eq!(ran.code, 0, "rules applied: {}", ran.stderr);
    assert!(ran.stderr.contains("Validation passed"), "{}", ran.stderr);

    let ran = run_in(&pod, &Run::args(&probe_args).user(1000, 1000));
    assert_eq!(ran.code, 126, "not the proxy uid: {}", ran.stderr);
    assert!(ran.stderr.contains("timeout"), "{}", ran.stderr);

    // Apply and validate in one run (root, so the proxy UID is 0 here).
    let other = addressed_netns();
    let ran = run_in(
        &other,
        &Run::args(&[
            "-u",
            "0",
            "-b",
            "*",
            "-i",
            "*",
            "--run-validation",
            "--probe-timeout",
            "2s",
        ]),
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stderr.contains("Validation passed"), "{}", ran.stderr);
}

/// Istio's injector adds `--log_as_json` with `global.logAsJson`: every line redirect-init
/// writes on stderr is then one JSON object (its start-up block one line), for an apply and for
/// a failed validation.
#[kernel_test]
fn log_as_json_makes_every_stderr_line_a_json_object() {
    let objects = |stderr: &str| -> Vec<serde_json::Value> {
        stderr
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    };
    let pod = addressed_netns();
    let ran = run_in(
        &pod,
        &Run::args(&istio_args_with(&[
            "--log_as_json",
            "--log_output_level=default:debug,ads:warn",
        ])),
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines = objects(&ran.stderr);
    let msg = |l: &serde_json::Value| l["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        lines
            .iter()
            .any(|l| msg(l).starts_with("Istio iptables environment:\n")),
        "{lines:?}"
    );
    assert!(snapshot(&pod).contains("redirect"), "nothing applied");

    let other = addressed_netns();
    let ran = run_in(
        &other,
        &Run::args(&[
            "-u",
            "1337",
            "--run-validation",
            "--skip-rule-apply",
            "--probe-timeout",
            "1s",
            "--log_as_json",
        ])
        .user(1337, 1337),
    );
    assert_eq!(ran.code, 126, "{}", ran.stderr);
    assert!(
        objects(&ran.stderr)
            .iter()
            .any(|l| l["level"] == "error" && msg(l).starts_with("iptables validation failed")),
        "{}",
        ran.stderr
    );
}

#[kernel_test]
fn iptables_backend_with_each_variant() {
    for variant in ["legacy", "nft"] {
        let topo = Topology::basic();
        let pristine = snapshot(&topo.pod);
        let ran = run_in(
            &topo.pod,
            &Run::args(&istio_args_with(&["--backend", "iptables"]))
                .env("FORCE_IPTABLES_BINARY", variant),
        );
        assert_eq!(ran.code, 0, "{variant}: {}", ran.stderr);
        assert!(
            ran.stdout.contains("-A ISTIO_OUTPUT"),
            "{variant}: {}",
            ran.stdout
        );
        let save = topo.pod.sh(&format!("iptables-{variant}-save"));
        assert!(
            save.contains(":ISTIO_OUTPUT") && save.contains("-j ISTIO_IN_REDIRECT"),
            "{variant}: {save}"
        );
        assert!(
            !snapshot(&topo.pod).contains("redirect_capture"),
            "{variant}: native table created too"
        );
        let got = run_probes(&topo, &probes(&topo, false));
        assert_eq!(
            got[0],
            Outcome::landed(Side::Pod, 15006, Some(sa(topo.pod_addr(false), 8080))),
            "{variant}"
        );
        assert_eq!(
            got[3],
            Outcome::landed(Side::Pod, 15001, Some(sa(topo.peer_addr(false), 80))),
            "{variant}"
        );
        run_in(&topo.pod, &Run::args(&["--cleanup-only"])).expect_ok("cleanup");
        assert_eq!(
            snapshot_effective(&topo.pod),
            snapshot_effective_of(&pristine),
            "{variant}: cleanup left rules"
        );
    }
}

#[kernel_test]
fn network_namespace_flag_acts_in_that_namespace() {
    let topo = Topology::basic();
    // Run from another namespace (not the host's), so a mistake cannot touch the host.
    let outer = TestNetns::new();
    let outer_before = snapshot(&outer);
    let ns_flag = format!("--network-namespace={}", topo.pod.path().display());
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", outer.name(), BIN])
        .args(ISTIO_ARGS)
        .arg(&ns_flag)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        snapshot(&outer),
        outer_before,
        "the caller's namespace was changed"
    );
    let got = run_probes(&topo, &probes(&topo, false));
    assert_eq!(
        got[0],
        Outcome::landed(Side::Pod, 15006, Some(sa(topo.pod_addr(false), 8080)))
    );
}
