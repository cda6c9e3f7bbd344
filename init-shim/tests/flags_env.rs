//! Every flag and variable of istio-iptables, resolved as Istio resolves them: long and short
//! names, the variable, the aliases, the precedence (flag, then alias, then variable, then the
//! default), list syntax, derived settings, and bad values named in the error. No kernel here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use init_shim::flags::{self, Parsed, FLAGS};

/// Arguments and variables of one invocation.
type Invocation = (Vec<String>, Vec<(String, String)>);
/// Arguments, variables, and what the error must name.
type BadCase<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, Vec<&'a str>);
use init_shim::settings::{parse_go_duration, Backend, DryRunFormat, Settings};
use redirect_core::foreign::Variant;
use redirect_core::pod_facts::HostAddress;
use redirect_core::{CaptureConfig, DnsCapture, GroupRef, InterceptionMode, Selection};

fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, String> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |k: &str| map.get(k).cloned();
    let argv = std::iter::once("redirect-init")
        .chain(args.iter().copied())
        .map(Into::into);
    match flags::parse(argv, &lookup)? {
        Parsed::Run(r) => Settings::from_resolved(&r).map_err(|e| e.to_string()),
        Parsed::Info(_) => Err("help".into()),
    }
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> Settings {
    resolve(args, env).unwrap_or_else(|e| panic!("{args:?} {env:?}: {e}"))
}

fn v4_host() -> HostAddress {
    HostAddress {
        ip: "10.0.0.5".parse().unwrap(),
        ipv6: false,
    }
}

#[test]
fn no_flags_give_istio_flag_defaults() {
    let s = ok(&[], &[]);
    assert_eq!(*s.config, CaptureConfig::default());
    assert!(s.proxy_uid_from_user && s.proxy_gid_from_uid);
    assert_eq!(s.envoy_user, "istio-proxy");
    assert_eq!(
        (s.probe_port, s.probe_timeout),
        (15002, Duration::from_secs(5))
    );
    assert_eq!(s.backend, Backend::Native);
    assert_eq!(s.dry_run_format, DryRunFormat::Nft);
    assert!(!s.dry_run && !s.cleanup_only && !s.reconcile && !s.force_apply);
    assert!(!s.skip_rule_apply && !s.run_validation && !s.redirect_dns && !s.dual_stack);
    assert_eq!((s.force_iptables_binary, s.network_namespace), (None, None));
}

#[test]
fn the_injectors_command_gives_istios_sidecar_default() {
    let s = ok(redirect_testkit::istio::SIDECAR_ARGS, &[]);
    assert_eq!(*s.config, CaptureConfig::istio_sidecar_default());
    assert!(!s.proxy_uid_from_user);
}

/// One flag: its value on the command line (long, `--long=`, short) and in its variable gives
/// the same setting.
struct Case {
    key: &'static str,
    value: &'static str,
    check: fn(&Settings) -> bool,
}

fn flag_cases() -> Vec<Case> {
    vec![
        Case {
            key: "envoy-port",
            value: "16001",
            check: |s| s.config.envoy_port == 16001,
        },
        Case {
            key: "inbound-capture-port",
            value: "16006",
            check: |s| s.config.inbound_capture_port == 16006,
        },
        Case {
            key: "inbound-tunnel-port",
            value: "16008",
            check: |s| s.config.inbound_tunnel_port == 16008,
        },
        Case {
            key: "proxy-uid",
            value: "3,4",
            check: |s| {
                s.config.proxy_uids == [3, 4]
                    && s.config.proxy_gids == [3, 4]
                    && !s.proxy_uid_from_user
            },
        },
        Case {
            key: "proxy-gid",
            value: "1,2",
            check: |s| s.config.proxy_gids == [1, 2] && !s.proxy_gid_from_uid,
        },
        Case {
            key: "istio-inbound-interception-mode",
            value: "TPROXY",
            check: |s| s.config.mode == InterceptionMode::Tproxy,
        },
        Case {
            key: "istio-inbound-ports",
            value: "80,443",
            check: |s| s.config.inbound_ports == Selection::List(vec![80, 443]),
        },
        Case {
            key: "istio-local-exclude-ports",
            value: "15090,15021,",
            check: |s| s.config.inbound_exclude_ports == [15090, 15021],
        },
        Case {
            key: "istio-exclude-interfaces",
            value: "eth1,eth2",
            check: |s| s.config.exclude_interfaces == ["eth1", "eth2"],
        },
        Case {
            key: "istio-service-cidr",
            value: "10.0.0.0/8, fd00::/8",
            check: |s| {
                s.config.outbound_include_cidrs
                    == Selection::List(vec![
                        "10.0.0.0/8".parse().unwrap(),
                        "fd00::/8".parse().unwrap(),
                    ])
            },
        },
        Case {
            key: "istio-service-exclude-cidr",
            value: "10.96.0.1/12",
            check: |s| {
                s.config.outbound_exclude_cidrs
                    == vec!["10.96.0.0/12".parse::<ipnet::IpNet>().unwrap()]
            },
        },
        Case {
            key: "istio-outbound-ports",
            value: "3306",
            check: |s| s.config.outbound_include_ports == [3306],
        },
        Case {
            key: "istio-local-outbound-ports-exclude",
            value: "15020,9000",
            check: |s| s.config.outbound_exclude_ports == [15020, 9000],
        },
        Case {
            key: "kube-virt-interfaces",
            value: "tap0",
            check: |s| s.config.reroute_interfaces == ["tap0"],
        },
        Case {
            key: "istio-inbound-tproxy-mark",
            value: "1400",
            check: |s| s.config.tproxy_mark == 1400,
        },
        Case {
            key: "istio-inbound-tproxy-route-table",
            value: "140",
            check: |s| s.config.tproxy_route_table == 140,
        },
        Case {
            key: "dry-run",
            value: "true",
            check: |s| s.dry_run,
        },
        Case {
            key: "iptables-probe-port",
            value: "16002",
            check: |s| s.probe_port == 16002,
        },
        Case {
            key: "probe-timeout",
            value: "1m30s",
            check: |s| s.probe_timeout == Duration::from_secs(90),
        },
        Case {
            key: "skip-rule-apply",
            value: "true",
            check: |s| s.skip_rule_apply,
        },
        Case {
            key: "run-validation",
            value: "true",
            check: |s| s.run_validation,
        },
        Case {
            key: "redirect-dns",
            value: "true",
            check: |s| s.redirect_dns,
        },
        Case {
            key: "capture-all-dns",
            value: "true",
            check: |s| s.capture_all_dns,
        },
        Case {
            key: "drop-invalid",
            value: "true",
            check: |s| s.config.drop_invalid,
        },
        Case {
            key: "dual-stack",
            value: "true",
            check: |s| s.dual_stack,
        },
        Case {
            key: "network-namespace",
            value: "/run/netns/pod",
            check: |s| {
                s.network_namespace.as_deref() == Some(std::path::Path::new("/run/netns/pod"))
            },
        },
        Case {
            key: "cni-mode",
            value: "true",
            check: |_| true,
        },
        Case {
            key: "reconcile",
            value: "true",
            check: |s| s.reconcile,
        },
        Case {
            key: "cleanup-only",
            value: "true",
            check: |s| s.cleanup_only,
        },
        Case {
            key: "force-apply",
            value: "true",
            check: |s| s.force_apply,
        },
        Case {
            key: "native-nftables",
            value: "true",
            check: |s| s.backend == Backend::Native,
        },
        Case {
            key: "force-iptables-binary",
            value: "legacy",
            check: |s| s.force_iptables_binary == Some(Variant::Legacy),
        },
        Case {
            key: "backend",
            value: "iptables",
            check: |s| s.backend == Backend::Iptables,
        },
        Case {
            key: "dry-run-format",
            value: "json",
            check: |s| s.dry_run_format == DryRunFormat::Json,
        },
        Case {
            key: "bypass-uids",
            value: "4000, 4001",
            check: |s| s.config.bypass_uids == [4000, 4001],
        },
        Case {
            key: "bypass-gids",
            value: "4100",
            check: |s| s.config.bypass_gids == [4100],
        },
    ]
}

#[test]
fn every_flag_works_by_long_name_short_name_and_variable() {
    let cases = flag_cases();
    let covered: Vec<&str> = cases.iter().map(|c| c.key).collect();
    for f in FLAGS.iter().filter(|f| f.long) {
        assert!(
            covered.contains(&f.key),
            "flag --{} has no case here",
            f.key
        );
    }
    let mut forms = 0;
    for c in &cases {
        let f = FLAGS.iter().find(|f| f.key == c.key).unwrap();
        let long = format!("--{}", c.key);
        let long_eq = format!("--{}={}", c.key, c.value);
        let mut tries: Vec<Invocation> = vec![(vec![long_eq], vec![])];
        if !f.boolean {
            tries.push((vec![long.clone(), c.value.into()], vec![]));
        } else {
            tries.push((vec![long.clone()], vec![]));
        }
        match (f.short, f.boolean) {
            (Some(short), false) => tries.push((vec![format!("-{short}"), c.value.into()], vec![])),
            (Some(short), true) => tries.push((vec![format!("-{short}")], vec![])),
            (None, _) => {}
        }
        if let Some(env) = f.env {
            tries.push((vec![], vec![(env.into(), c.value.into())]));
        }
        for a in f.aliases {
            tries.push((vec![], vec![(a.to_string(), c.value.into())]));
        }
        for (args, env) in tries {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let e: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let s = ok(&a, &e);
            assert!((c.check)(&s), "{} via {args:?} {env:?} not applied", c.key);
            forms += 1;
        }
        // And the default does not satisfy the check, so the check can fail.
        if !matches!(c.key, "cni-mode" | "native-nftables") {
            assert!(
                !(c.check)(&ok(&[], &[])),
                "{}: check passes on the default",
                c.key
            );
        }
    }
    assert!(forms > 100, "only {forms} forms tried");
}

#[test]
fn envoy_port_has_no_variable_as_in_istio() {
    assert_eq!(ok(&[], &[("ENVOY_PORT", "16001")]).config.envoy_port, 15001);
}

#[test]
fn precedence_is_flag_then_alias_then_variable_then_default() {
    for (flag, var, alias, get) in [
        (
            "redirect-dns",
            "REDIRECT_DNS",
            "ISTIO_META_DNS_CAPTURE",
            (|s: &Settings| s.redirect_dns) as fn(&Settings) -> bool,
        ),
        ("drop-invalid", "DROP_INVALID", "INVALID_DROP", |s| {
            s.config.drop_invalid
        }),
        ("dual-stack", "DUAL_STACK", "ISTIO_DUAL_STACK", |s| {
            s.dual_stack
        }),
    ] {
        assert!(get(&ok(&[], &[(var, "true")])), "{var}");
        assert!(
            get(&ok(&[], &[(alias, "true"), (var, "false")])),
            "{alias} wins over {var}"
        );
        assert!(
            !get(&ok(&[], &[(alias, "false"), (var, "true")])),
            "{alias}=false wins over {var}"
        );
        let off = format!("--{flag}=false");
        assert!(
            !get(&ok(&[&off], &[(alias, "true"), (var, "true")])),
            "--{flag}=false wins"
        );
        // An empty variable is no variable (Go's os.Getenv sees "" either way).
        assert!(
            get(&ok(&[], &[(alias, ""), (var, "true")])),
            "empty {alias} ignored"
        );
    }
    let s = ok(&["-b", "80"], &[("ISTIO_INBOUND_PORTS", "90")]);
    assert_eq!(s.config.inbound_ports, Selection::List(vec![80]));
    let s = ok(&["-b", "80", "-b", "81"], &[]);
    assert_eq!(
        s.config.inbound_ports,
        Selection::List(vec![81]),
        "last flag wins"
    );
}

#[test]
fn env_only_settings() {
    let s = ok(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")]);
    assert_eq!(
        s.config.owner_groups_include,
        Selection::List(vec![GroupRef::Name("java".into()), GroupRef::Id(202)])
    );
    let s = ok(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")]);
    assert_eq!(s.config.owner_groups_include, Selection::All);
    assert_eq!(
        s.config.owner_groups_exclude,
        [GroupRef::Id(888), GroupRef::Name("ftp".into())]
    );
    let s = ok(&[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/8")]);
    assert_eq!(s.config.ipv4_loopback_cidr.to_string(), "127.0.0.1/8");
    let s = ok(&[], &[("DRY_RUN_FILE_PATH", "/tmp/x")]);
    assert_eq!(
        s.dry_run_file.as_deref(),
        Some(std::path::Path::new("/tmp/x"))
    );
    let s = ok(&[], &[("ENVOY_USER", "root")]);
    assert_eq!(s.envoy_user, "root");
}

#[test]
fn derived_settings_follow_istio() {
    // ENVOY_USER resolves: UID and GID from it.
    let mut s = ok(&[], &[("ENVOY_USER", "root")]);
    let uid = redirect_core::pod_facts::uid_of_user("root");
    let w = s.finish(&v4_host(), uid, &[]).unwrap();
    assert_eq!(
        (s.config.proxy_uids.clone(), s.config.proxy_gids.clone()),
        (vec![0], vec![0])
    );
    assert!(w.is_empty(), "{w:?}");
    // Unknown user: 1337 with a warning naming the user.
    let mut s = ok(&[], &[("ENVOY_USER", "no-such-user")]);
    let w = s.finish(&v4_host(), None, &[]).unwrap();
    assert_eq!(s.config.proxy_uids, [1337]);
    assert!(w.iter().any(|l| l.contains("no-such-user")), "{w:?}");
    // -g given, -u from the user: the GIDs stay.
    let mut s = ok(&["-g", "5"], &[]);
    s.finish(&v4_host(), Some(7), &[]).unwrap();
    assert_eq!(
        (s.config.proxy_uids.clone(), s.config.proxy_gids.clone()),
        (vec![7], vec![5])
    );
    // IPv6 comes from the pod's address.
    let mut s = ok(&[], &[]);
    let v6 = HostAddress {
        ip: "fd00::5".parse().unwrap(),
        ipv6: true,
    };
    s.finish(&v6, None, &[]).unwrap();
    assert!(s.config.ipv6);
    // DNS servers from resolv.conf, split by family.
    let servers: Vec<IpAddr> = vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()];
    let mut s = ok(&["--redirect-dns"], &[]);
    s.finish(&v4_host(), None, &servers).unwrap();
    assert_eq!(
        s.config.dns,
        DnsCapture::Servers {
            v4: vec!["10.96.0.10".parse().unwrap()],
            v6: vec!["fd00::10".parse().unwrap()]
        }
    );
    // capture-all ignores the servers; redirect-dns without servers is off, with a warning.
    let mut s = ok(&["--redirect-dns", "--capture-all-dns"], &[]);
    s.finish(&v4_host(), None, &servers).unwrap();
    assert_eq!(s.config.dns, DnsCapture::All);
    let mut s = ok(&[], &[("ISTIO_META_DNS_CAPTURE", "true")]);
    let w = s.finish(&v4_host(), None, &[]).unwrap();
    assert!(!s.config.dns.effective());
    assert!(w.iter().any(|l| l.contains("DNS is not captured")), "{w:?}");
    // A reproduced Istio quirk is a warning.
    let mut s = ok(&["-u", "3,4"], &[]);
    let w = s.finish(&v4_host(), None, &[]).unwrap();
    assert!(w.iter().any(|l| l.contains("multi-uid-loopback")), "{w:?}");
}

#[test]
fn bad_values_name_the_flag_or_variable_and_the_value() {
    let many_groups = (0..65).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let table: Vec<BadCase> = vec![
        (
            vec!["-p", "70000"],
            vec![],
            vec!["--envoy-port (-p)", "70000"],
        ),
        (
            vec!["-z", "0"],
            vec![],
            vec!["--inbound-capture-port (-z)", "\"0\""],
        ),
        (
            vec!["-b", "70000"],
            vec![],
            vec!["--istio-inbound-ports (-b)", "70000"],
        ),
        (
            vec!["-d", "80,x"],
            vec![],
            vec!["--istio-local-exclude-ports (-d)", "\"x\""],
        ),
        (
            vec!["-x", "*"],
            vec![],
            vec!["--istio-service-exclude-cidr (-x)", "\"*\""],
        ),
        (
            vec!["-i", "10.0.0.0/33"],
            vec![],
            vec!["--istio-service-cidr (-i)", "10.0.0.0/33"],
        ),
        (
            vec!["-i", "10.0.0.0/8,bogus"],
            vec![],
            vec!["--istio-service-cidr (-i)", "bogus"],
        ),
        (
            vec!["-m", "FOO"],
            vec![],
            vec!["--istio-inbound-interception-mode (-m)", "FOO", "TPROXY"],
        ),
        (vec!["-u", "abc"], vec![], vec!["--proxy-uid (-u)", "abc"]),
        (vec!["-g", "1x"], vec![], vec!["--proxy-gid (-g)", "1x"]),
        (
            vec!["-c", "a/b"],
            vec![],
            vec!["--istio-exclude-interfaces (-c)", "a/b"],
        ),
        (
            vec!["-k", "way-too-long-interface-name"],
            vec![],
            vec!["--kube-virt-interfaces (-k)", "way-too-long"],
        ),
        (
            vec!["-t", "x"],
            vec![],
            vec!["--istio-inbound-tproxy-mark (-t)", "x"],
        ),
        (
            vec!["-r", "254"],
            vec![],
            vec!["--istio-inbound-tproxy-route-table (-r)", "254"],
        ),
        (
            vec!["--probe-timeout", "5"],
            vec![],
            vec!["--probe-timeout", "\"5\"", "5s"],
        ),
        (
            vec!["--iptables-probe-port", "65536"],
            vec![],
            vec!["--iptables-probe-port", "65536"],
        ),
        (
            vec!["--dry-run=maybe"],
            vec![],
            vec!["--dry-run (-n)", "maybe"],
        ),
        (
            vec!["--force-iptables-binary", "nf"],
            vec![],
            vec!["--force-iptables-binary", "nf", "legacy"],
        ),
        (vec!["--backend", "ebpf"], vec![], vec!["--backend", "ebpf"]),
        (
            vec!["--backend", "iptables", "--native-nftables"],
            vec![],
            vec!["--native-nftables", "iptables"],
        ),
        (
            vec!["--dry-run-format", "yaml"],
            vec![],
            vec!["--dry-run-format", "yaml"],
        ),
        (
            vec![],
            vec![("ISTIO_INBOUND_PORTS", "abc")],
            vec!["ISTIO_INBOUND_PORTS", "abc"],
        ),
        (
            vec![],
            vec![("ISTIO_SERVICE_EXCLUDE_CIDR", "*")],
            vec!["ISTIO_SERVICE_EXCLUDE_CIDR", "*"],
        ),
        (
            vec![],
            vec![("REDIRECT_DNS", "yes")],
            vec!["REDIRECT_DNS", "yes"],
        ),
        (
            vec![],
            vec![("ISTIO_META_DNS_CAPTURE", "on")],
            vec!["ISTIO_META_DNS_CAPTURE", "on"],
        ),
        (
            vec![],
            vec![("FORCE_IPTABLES_BINARY", "both")],
            vec!["FORCE_IPTABLES_BINARY", "both"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS", &many_groups)],
            vec!["ISTIO_OUTBOUND_OWNER_GROUPS", "at most 64"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS", "java,bad group")],
            vec!["ISTIO_OUTBOUND_OWNER_GROUPS", "bad group"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "*")],
            vec!["ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "*"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32")],
            vec!["ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32"],
        ),
        (
            vec![],
            vec![("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/4")],
            vec!["ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.1/4"],
        ),
        (vec!["--no-such-flag"], vec![], vec!["--no-such-flag"]),
        (vec!["-p"], vec![], vec!["--envoy-port"]),
    ];
    for (args, env, wants) in &table {
        let err = match resolve(args, env) {
            Ok(s) => panic!("{args:?} {env:?} accepted: {:?}", s.config),
            Err(e) => e,
        };
        for w in wants {
            assert!(
                err.contains(w),
                "{args:?} {env:?}: error {err:?} lacks {w:?}"
            );
        }
    }
}

#[test]
fn go_durations() {
    for (s, d) in [
        ("5s", 5000),
        ("500ms", 500),
        ("1m30s", 90_000),
        ("1.5s", 1500),
        ("0", 0),
        ("2h", 7_200_000),
    ] {
        assert_eq!(parse_go_duration(s), Some(Duration::from_millis(d)), "{s}");
    }
    for s in ["", "5", "s", "5x", "-1s", "1.2.3s"] {
        assert_eq!(parse_go_duration(s), None, "{s}");
    }
}
