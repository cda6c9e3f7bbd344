//! The iptables backend against the kernel, with both iptables variants: binary selection,
//! apply (real traffic captured), refusal over existing chains, roll-back of a failed restore,
//! and finding and removing Istio's leftovers, iptables and nftables. Each test has fresh
//! network namespaces.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use redirect_istio::xtables::{self, Leftover, Variant};
use redirect_istio::Error;
use redirect_model::{AddrMatch, Family, Match, Rule, Ruleset, Stage};
use redirect_model::{CaptureConfig, InterceptionMode};
use redirect_testkit::istio::{
    self, iptables_restore_with, istio_testdata_dir, load_istio_case_with, probe_matrix, IstioCase,
};
use redirect_testkit::plan;
use redirect_testkit::{
    kernel_test, run_probe, run_probes, From, Outcome, Probe, Side, TestNetns, Topology,
};

const VARIANTS: [Variant; 2] = [Variant::Legacy, Variant::Nft];

fn bin(family: Family, variant: Variant, what: &str) -> String {
    let base = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    format!("{base}-{variant}-{what}")
}

/// `<family>-<variant>-save` in `ns`, without comments and counters.
fn save(ns: &TestNetns, family: Family, variant: Variant) -> String {
    ns.sh(&bin(family, variant, "save"))
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.find(" [") {
            Some(i) if l.starts_with(':') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// All four dumps (v4/v6 × legacy/nft).
fn save_all(ns: &TestNetns) -> Vec<String> {
    Family::ALL
        .iter()
        .flat_map(|f| VARIANTS.iter().map(move |v| save(ns, *f, *v)))
        .collect()
}

/// What a dump holds besides empty tables: user chains and rules, by table.
fn content(dump: &str) -> Vec<String> {
    let mut table = "";
    let mut out = Vec::new();
    for l in dump.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
        } else if l.starts_with("-A ") || (l.starts_with(':') && l.ends_with(" -")) {
            out.push(format!("{table}: {l}"));
        }
    }
    out
}

/// Rules per chain (`table/chain` → count) in a dump.
fn rule_counts(dump: &str) -> BTreeMap<String, usize> {
    let mut table = "";
    let mut out = BTreeMap::new();
    for l in dump.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t;
        } else if let Some(rest) = l.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or("");
            *out.entry(format!("{table}/{chain}")).or_insert(0) += 1;
        }
    }
    out
}

fn sidecar() -> Ruleset {
    plan(&CaptureConfig::istio_sidecar_default()).unwrap()
}

fn at(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Inbound to 8080 and 15021, outbound as the app (1000) and as the proxy (1337).
fn sidecar_probes(topo: &Topology, v6: bool) -> Vec<Probe> {
    let (pod, peer) = (topo.pod_addr(v6), topo.peer_addr(v6));
    vec![
        Probe::tcp(From::Peer, at(pod, 8080)),
        Probe::tcp(From::Peer, at(pod, 15021)),
        Probe::tcp(
            From::Pod {
                uid: 1000,
                gid: 1000,
            },
            at(peer, 80),
        ),
        Probe::tcp(
            From::Pod {
                uid: 1337,
                gid: 1337,
            },
            at(peer, 80),
        ),
    ]
}

fn captured(topo: &Topology, v6: bool) -> Vec<Outcome> {
    let (pod, peer) = (topo.pod_addr(v6), topo.peer_addr(v6));
    vec![
        Outcome::landed(Side::Pod, 15006, Some(at(pod, 8080))),
        Outcome::landed(Side::Pod, 15021, None),
        Outcome::landed(Side::Pod, 15001, Some(at(peer, 80))),
        Outcome::landed(Side::Peer, 80, None),
    ]
}

fn uncaptured() -> Vec<Outcome> {
    vec![
        Outcome::landed(Side::Pod, 8080, None),
        Outcome::landed(Side::Pod, 15021, None),
        Outcome::landed(Side::Peer, 80, None),
        Outcome::landed(Side::Peer, 80, None),
    ]
}

#[test]
fn force_iptables_binary_is_parsed_and_bad_values_are_named() {
    assert_eq!(Variant::parse("FORCE_IPTABLES_BINARY", "").unwrap(), None);
    assert_eq!(
        Variant::parse("FORCE_IPTABLES_BINARY", "nft").unwrap(),
        Some(Variant::Nft)
    );
    assert_eq!(
        Variant::parse("FORCE_IPTABLES_BINARY", "legacy").unwrap(),
        Some(Variant::Legacy)
    );
    let err = Variant::parse("FORCE_IPTABLES_BINARY", "iptables-nft").unwrap_err();
    assert!(
        matches!(&err, redirect_model::Error::Config { field: "FORCE_IPTABLES_BINARY", value, .. } if value == "iptables-nft"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("\"iptables-nft\""), "{msg}");
    assert!(msg.contains("\"legacy\" or \"nft\""), "{msg}");
}

/// Istio's sidecar default with each variant forced: the ISTIO chains hold the planned rules,
/// only in that variant, and real connections are captured; removing them restores traffic.
#[kernel_test]
fn apply_with_each_variant_captures_real_traffic() {
    let rs = sidecar();
    for variant in VARIANTS {
        let topo = Topology::basic();
        let tools =
            redirect_testkit::run_in(topo.pod.path(), || xtables::apply(&rs, Some(variant)))
                .unwrap();
        assert_eq!(tools.len(), 1, "{variant}");
        assert_eq!(tools[0].family, Family::V4);
        assert_eq!(tools[0].variant, variant);
        assert_eq!(tools[0].save, bin(Family::V4, variant, "save"));
        assert_eq!(tools[0].restore, bin(Family::V4, variant, "restore"));
        assert_eq!(tools[0].lock_wait, variant == Variant::Legacy);

        let dump = save(&topo.pod, Family::V4, variant);
        let counts = rule_counts(&dump);
        let want: BTreeMap<String, usize> = [
            ("nat/PREROUTING", 1),
            ("nat/OUTPUT", 1),
            ("nat/ISTIO_INBOUND", 5),
            ("nat/ISTIO_IN_REDIRECT", 1),
            ("nat/ISTIO_REDIRECT", 1),
            ("nat/ISTIO_OUTPUT", 9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(counts, want, "{variant}:\n{dump}");
        let other = match variant {
            Variant::Legacy => Variant::Nft,
            Variant::Nft => Variant::Legacy,
        };
        assert!(
            content(&save(&topo.pod, Family::V4, other)).is_empty(),
            "{variant}: the other variant was written"
        );

        let probes = sidecar_probes(&topo, false);
        assert_eq!(
            run_probes(&topo, &probes),
            captured(&topo, false),
            "{variant}"
        );

        // Not idempotent, as Istio without --reconcile: a second apply is refused.
        assert!(
            redirect_testkit::run_in(topo.pod.path(), || xtables::apply(&rs, Some(variant)))
                .is_err()
        );

        // Our own iptables rules have Istio's shape: the leftover cleanup removes them.
        let removed =
            redirect_testkit::run_in(topo.pod.path(), xtables::remove_istio_leftovers).unwrap();
        assert_eq!(removed.len(), 4, "{variant}: {removed:#?}");
        assert!(removed
            .iter()
            .all(|l| l.variant == variant && l.table == "nat"));
        assert!(content(&save(&topo.pod, Family::V4, variant)).is_empty());
        assert_eq!(run_probes(&topo, &probes), uncaptured(), "{variant}");
    }
}

/// Without a forced variant in a fresh namespace: nft for both families, v6 traffic captured.
#[kernel_test]
fn apply_picks_nft_for_both_families_in_a_fresh_namespace() {
    let rs = plan(&CaptureConfig {
        ipv6: true,
        ..CaptureConfig::istio_sidecar_default()
    })
    .unwrap();
    let topo = Topology::basic();
    let tools = redirect_testkit::run_in(topo.pod.path(), || xtables::apply(&rs, None)).unwrap();
    let got: Vec<(Family, Variant, &str)> = tools
        .iter()
        .map(|t| (t.family, t.variant, t.restore.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Family::V4, Variant::Nft, "iptables-nft-restore"),
            (Family::V6, Variant::Nft, "ip6tables-nft-restore"),
        ]
    );
    let v6 = save(&topo.pod, Family::V6, Variant::Nft);
    assert_eq!(rule_counts(&v6).get("nat/ISTIO_OUTPUT"), Some(&9), "{v6}");
    assert_eq!(
        run_probes(&topo, &sidecar_probes(&topo, true)),
        captured(&topo, true)
    );
    // Legacy stayed untouched: detection never probed it (it held no rules).
    for f in Family::ALL {
        assert_eq!(save(&topo.pod, f, Variant::Legacy), "", "{f}");
    }
}

#[kernel_test]
fn detect_prefers_legacy_only_when_it_holds_rules() {
    let detect = |ns: &TestNetns, f: Family, force: Option<Variant>| {
        redirect_testkit::run_in(ns.path(), || xtables::detect(f, force))
            .unwrap_or_else(|e| panic!("{f} {force:?}: {e}"))
    };

    let fresh = TestNetns::new();
    for f in Family::ALL {
        let t = detect(&fresh, f, None);
        assert_eq!(t.variant, Variant::Nft, "{f}");
        assert_eq!(t.save, bin(f, Variant::Nft, "save"));
        assert!(!t.lock_wait);
        assert!(t.version.starts_with("1."), "{}", t.version);
        assert_eq!(
            t.binary(),
            bin(f, Variant::Nft, "save").trim_end_matches("-save")
        );
    }
    // Twice: probing left nothing that flips the choice (istio/istio#61020).
    assert_eq!(detect(&fresh, Family::V4, None).variant, Variant::Nft);
    assert_eq!(save(&fresh, Family::V4, Variant::Legacy), "");

    let legacy = TestNetns::new();
    legacy.sh("iptables-legacy -t filter -A INPUT -p 255 -j ACCEPT");
    let t = detect(&legacy, Family::V4, None);
    assert_eq!(t.variant, Variant::Legacy);
    assert_eq!(t.save, "iptables-legacy-save");
    assert_eq!(t.restore, "iptables-legacy-restore");
    assert!(t.lock_wait, "legacy {} locks", t.version);
    // Per family: v6 legacy holds no rules.
    assert_eq!(detect(&legacy, Family::V6, None).variant, Variant::Nft);

    let nft_only = TestNetns::new();
    nft_only.sh("iptables-nft -t filter -A INPUT -p 255 -j ACCEPT");
    assert_eq!(detect(&nft_only, Family::V4, None).variant, Variant::Nft);

    // Forced: that variant, whatever the namespace holds.
    assert_eq!(
        detect(&legacy, Family::V4, Some(Variant::Nft)).variant,
        Variant::Nft
    );
    let t = detect(&fresh, Family::V6, Some(Variant::Legacy));
    assert_eq!(
        (t.variant, t.save.as_str()),
        (Variant::Legacy, "ip6tables-legacy-save")
    );
}

/// Istio's chains are there (CNI `basic`, loaded with each variant): apply refuses, naming the
/// tool and the chains, and no dump of either variant or family changes.
#[kernel_test]
fn apply_over_istio_chains_fails_and_changes_nothing() {
    let rs = sidecar();
    let basic = istio_testdata_dir().join("cni/basic.restore");
    for variant in VARIANTS {
        let ns = TestNetns::new();
        iptables_restore_with(&ns, false, &basic, Some(&variant.to_string()));
        let before = save_all(&ns);
        assert!(before.iter().any(|d| d.contains("ISTIO_OUTPUT")));
        let err = redirect_testkit::run_in(ns.path(), || xtables::apply(&rs, None)).unwrap_err();
        eprintln!("{variant}: {err}");
        match &err {
            Error::Tool { tool, detail } => {
                assert_eq!(tool, &bin(Family::V4, variant, "restore"), "{err}");
                assert!(
                    detail.contains(&format!("IPv4 {variant} nat/ISTIO_INBOUND")),
                    "{err}"
                );
                assert!(detail.contains("remove_istio_leftovers"), "{err}");
            }
            other => panic!("{variant}: not a tool error: {other:?}"),
        }
        assert_eq!(save_all(&ns), before, "{variant}: the namespace changed");

        // Forcing the other variant does not layer our rules over Istio's either. (Its
        // detection adds and deletes a test rule, which may create an empty table there.)
        let other = match variant {
            Variant::Legacy => Variant::Nft,
            Variant::Nft => Variant::Legacy,
        };
        let err =
            redirect_testkit::run_in(ns.path(), || xtables::apply(&rs, Some(other))).unwrap_err();
        let Error::Tool { tool, detail } = &err else {
            panic!("{variant}: {err:?}")
        };
        assert_eq!(tool, &bin(Family::V4, other, "restore"), "{err}");
        assert!(
            detail.contains(&format!("IPv4 {variant} nat/ISTIO_OUTPUT")),
            "{err}"
        );
        let content_of = |d: &Vec<String>| d.iter().map(|d| content(d)).collect::<Vec<_>>();
        assert_eq!(content_of(&save_all(&ns)), content_of(&before), "{variant}");
    }
}

/// A ruleset whose nat table cannot load (a v6 address in a v4 rule): mangle, written first,
/// is rolled back; and a v6 failure rolls back v4.
#[kernel_test]
fn failed_restore_rolls_back_every_table_and_family() {
    let broken = |rs: &mut Ruleset, family: Family, addr: &str| {
        let chain = rs
            .chains
            .iter_mut()
            .find(|c| c.family == family && c.stage == Stage::Nat && c.name == "ISTIO_OUTPUT")
            .unwrap();
        chain.rules.push(Rule::new(
            vec![Match::DAddr(AddrMatch::Eq(addr.parse().unwrap()))],
            redirect_model::Action::Return,
        ));
    };
    let mut tproxy = plan(&CaptureConfig {
        mode: InterceptionMode::Tproxy,
        ..CaptureConfig::istio_sidecar_default()
    })
    .unwrap();
    broken(&mut tproxy, Family::V4, "fd00::/8");
    let mut dual = plan(&CaptureConfig {
        ipv6: true,
        ..CaptureConfig::istio_sidecar_default()
    })
    .unwrap();
    broken(&mut dual, Family::V6, "10.0.0.0/8");

    for variant in VARIANTS {
        for (name, rs, failing) in [("tproxy", &tproxy, Family::V4), ("dual", &dual, Family::V6)] {
            let ns = TestNetns::new();
            // Someone else's rule, which must survive the roll-back.
            ns.sh(&format!(
                "{} -t nat -A OUTPUT -p udp --dport 9 -j RETURN",
                bin(Family::V4, variant, "restore").replace("-restore", "")
            ));
            let before: Vec<Vec<String>> = save_all(&ns).iter().map(|d| content(d)).collect();
            let err = redirect_testkit::run_in(ns.path(), || xtables::apply(rs, Some(variant)))
                .unwrap_err();
            eprintln!("{name} {variant}: {err}");
            let Error::Tool { tool, detail } = &err else {
                panic!("{name} {variant}: {err:?}")
            };
            assert_eq!(tool, &bin(failing, variant, "restore"), "{err}");
            assert!(detail.contains("input line"), "{err}");
            assert!(detail.contains("rolled back"), "{err}");
            assert!(!detail.contains("FAILED"), "{err}");
            let after: Vec<Vec<String>> = save_all(&ns).iter().map(|d| content(d)).collect();
            assert_eq!(after, before, "{name} {variant}: {err}");
        }
    }
}

/// The leftovers Istio's restore file implies: per table, each `-N` chain with its rule count
/// and the jumps to it from any chain (Istio's own included), and per built-in chain its non-jump rules.
fn expected_leftovers(path: &std::path::Path, family: Family, variant: Variant) -> Vec<Leftover> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for section in text.split('*').filter(|s| !s.trim().is_empty()) {
        let table = section.lines().next().unwrap().trim().to_string();
        let rules: Vec<(String, String)> = section
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("-A ").or_else(|| l.strip_prefix("-I "))?;
                let (chain, spec) = rest.split_once(' ')?;
                Some((chain.to_string(), spec.to_string()))
            })
            .collect();
        let target = |spec: &str| {
            let t: Vec<&str> = spec.split_whitespace().collect();
            t.iter()
                .position(|x| *x == "-j")
                .and_then(|i| t.get(i + 1))
                .map(|s| s.to_string())
        };
        let leftover = |chain: &str, rules: usize, jumps: usize| Leftover {
            family,
            variant,
            table: table.clone(),
            chain: chain.to_string(),
            rules,
            jumps,
        };
        for l in section.lines() {
            if let Some(chain) = l.strip_prefix("-N ") {
                let chain = chain.trim();
                let n = rules.iter().filter(|(c, _)| c == chain).count();
                let jumps = rules
                    .iter()
                    .filter(|(_, s)| target(s).as_deref() == Some(chain))
                    .count();
                out.push(leftover(chain, n, jumps));
            }
        }
        for builtin in ["PREROUTING", "OUTPUT"] {
            let n = rules
                .iter()
                .filter(|(c, s)| {
                    c == builtin && !target(s).is_some_and(|t| t.starts_with("ISTIO_"))
                })
                .count();
            if n > 0 {
                out.push(leftover(builtin, n, 0));
            }
        }
    }
    out
}

/// Flush and delete every chain of every table, both families, with `variant`'s binaries.
fn flush_all(ns: &TestNetns, variant: Variant) {
    for f in Family::ALL {
        let ipt = bin(f, variant, "restore").replace("-restore", "");
        for t in ["filter", "nat", "mangle", "raw"] {
            ns.sh(&format!("{ipt} -t {t} -F && {ipt} -t {t} -X"));
        }
    }
    for dump in save_all(ns) {
        assert!(content(&dump).is_empty(), "{dump}");
    }
}

fn sorted(mut v: Vec<Leftover>) -> Vec<Leftover> {
    v.sort_by_key(|l| format!("{:?}", l));
    v
}

/// Istio's `tproxy` (mangle, nat and raw, v4 and v6; exclude interface, TPROXY tail) and
/// `basic-exclude-nic` cases, loaded with each variant: found as Istio's files imply, removed
/// completely (no ISTIO chain, no rule left in any dump), and every probe of the case's matrix
/// ends as it did before Istio's rules were loaded.
#[kernel_test]
fn istio_leftovers_are_found_and_removed_for_both_variants() {
    for name in ["tproxy", "basic-exclude-nic"] {
        let case = IstioCase::load(name);
        let probes = probe_matrix(&case);
        for variant in VARIANTS {
            // "No rules" = the case's routes and addresses (`::6` on lo, TPROXY routing)
            // without any iptables rule: loaded, then flushed with iptables itself.
            let reference = istio::case_topology(&case);
            load_istio_case_with(&reference.pod, &case, Some(&variant.to_string()));
            flush_all(&reference.pod, variant);
            let baseline = run_probes(&reference, &probes);

            let topo = istio::case_topology(&case);
            load_istio_case_with(&topo.pod, &case, Some(&variant.to_string()));
            let with_rules = run_probes(&topo, &probes);
            assert_ne!(
                with_rules, baseline,
                "{name} {variant}: the rules change nothing"
            );

            let mut want = expected_leftovers(&case.restore_path(), Family::V4, variant);
            if case.enable_ipv6 {
                want.extend(expected_leftovers(
                    &case.restore6_path(),
                    Family::V6,
                    variant,
                ));
            }
            let found =
                redirect_testkit::run_in(topo.pod.path(), xtables::find_istio_leftovers).unwrap();
            assert_eq!(sorted(found.clone()), sorted(want), "{name} {variant}");

            let removed =
                redirect_testkit::run_in(topo.pod.path(), xtables::remove_istio_leftovers).unwrap();
            assert_eq!(removed, found, "{name} {variant}");
            for dump in save_all(&topo.pod) {
                assert!(!dump.contains("ISTIO_"), "{name} {variant}:\n{dump}");
                assert!(
                    !dump.lines().any(|l| l.starts_with("-A ")),
                    "{name} {variant}: rules left:\n{dump}"
                );
            }
            let again =
                redirect_testkit::run_in(topo.pod.path(), xtables::remove_istio_leftovers).unwrap();
            assert!(again.is_empty(), "{name} {variant}: {again:#?}");

            let after = run_probes(&topo, &probes);
            let diffs: Vec<String> = probes
                .iter()
                .zip(baseline.iter().zip(&after))
                .filter(|(_, (b, a))| b != a)
                .map(|(p, (b, a))| format!("{p}: without rules {b}, after removal {a}"))
                .collect();
            assert!(diffs.is_empty(), "{name} {variant}:\n{}", diffs.join("\n"));
        }
    }
    let _ = istio::APP_ID;
}

/// Rules of someone else's, in tables without ISTIO chains, look like Istio's exclude rules
/// but stay.
#[kernel_test]
fn leftover_cleanup_leaves_tables_without_istio_chains_alone() {
    for variant in VARIANTS {
        let ns = TestNetns::new();
        let ipt = bin(Family::V4, variant, "restore").replace("-restore", "");
        ns.sh(&format!("{ipt} -t nat -A PREROUTING -i eth1 -j RETURN"));
        ns.sh(&format!("{ipt} -t mangle -N ISTIO_X"));
        ns.sh(&format!("{ipt} -t mangle -A OUTPUT -o eth1 -j RETURN"));
        let found = redirect_testkit::run_in(ns.path(), xtables::find_istio_leftovers).unwrap();
        let removed = redirect_testkit::run_in(ns.path(), xtables::remove_istio_leftovers).unwrap();
        assert_eq!(removed, found);
        // The empty ISTIO_X chain and the shaped rule beside it go; nat is untouched.
        let chains: Vec<&str> = removed.iter().map(|l| l.chain.as_str()).collect();
        assert_eq!(chains, ["ISTIO_X", "OUTPUT"], "{variant}: {removed:#?}");
        let dump = save(&ns, Family::V4, variant);
        assert_eq!(
            content(&dump),
            vec!["nat: -A PREROUTING -i eth1 -j RETURN".to_string()],
            "{variant}"
        );
    }
}

/// Istio's native nftables tables (a golden loaded with `nft -f`, plus an ambient one) are
/// listed and deleted; our table and tables of other families or names stay.
#[kernel_test]
fn istio_nft_tables_are_removed_and_ours_kept() {
    let ns = TestNetns::new();
    let rs = sidecar();
    redirect_kernel::testing::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .unwrap();
    let golden = istio_testdata_dir().join("nftables/tproxy.golden");
    ns.sh(&format!("nft -f {}", golden.display()));
    ns.sh("nft add table inet istio-ambient-nat; nft add table ip istio-v4only; nft add table inet istioish");

    let mut listed =
        redirect_istio::tables::istio_tables(&redirect_kernel::testing::nft_in(ns.path())).unwrap();
    listed.sort();
    assert_eq!(
        listed,
        [
            "istio-ambient-nat",
            "istio-proxy-mangle",
            "istio-proxy-nat",
            "istio-proxy-raw"
        ]
    );
    let mut removed =
        redirect_istio::tables::remove_istio_tables(&redirect_kernel::testing::nft_in(ns.path()))
            .unwrap();
    removed.sort();
    assert_eq!(removed, listed);

    let tables = ns.sh("nft list tables");
    assert!(
        !tables.contains("istio-proxy") && !tables.contains("istio-ambient"),
        "{tables}"
    );
    for kept in ["ip istio-v4only", "inet istioish", "inet redirect_capture"] {
        assert!(
            tables.contains(&format!("table {kept}\n")),
            "{kept}: {tables}"
        );
    }
    assert!(redirect_kernel::testing::nft_in(ns.path())
        .diff(&rs)
        .unwrap()
        .is_empty());
    assert!(
        redirect_istio::tables::remove_istio_tables(&redirect_kernel::testing::nft_in(ns.path()))
            .unwrap()
            .is_empty()
    );

    // And it makes a difference to traffic: Istio's nat table captured outbound.
    let topo = Topology::basic();
    topo.pod.sh(&format!(
        "nft -f {}",
        istio_testdata_dir()
            .join("nftables/kube-virt-interfaces.golden")
            .display()
    ));
    let probe = Probe::tcp(
        From::Pod {
            uid: 1000,
            gid: 1000,
        },
        at(topo.peer_addr(false), 80),
    );
    assert_eq!(
        run_probe(&topo, &probe),
        Outcome::landed(Side::Pod, 15001, Some(at(topo.peer_addr(false), 80)))
    );
    redirect_istio::tables::remove_istio_tables(&redirect_kernel::testing::nft_in(topo.pod.path()))
        .unwrap();
    assert_eq!(
        run_probe(&topo, &probe),
        Outcome::landed(Side::Peer, 80, None)
    );
}

/// iptables-nft's tables read and emptied over netlink, with no binary (what the node agent,
/// whose image has none, does): for Istio's cases loaded with `iptables-nft-restore`, plus a
/// rule and a chain of someone else's, the netlink read finds what `iptables-nft-save` finds,
/// and the netlink removal leaves exactly what the binaries' removal leaves in a twin.
/// Istio's TPROXY tail (mangle's CONNMARK rules, an xtables target) is the one shape the
/// netlink read does not know: in `tproxy` it finds the chains and jumps, not those rules.
#[kernel_test]
fn iptables_nft_chains_are_read_and_removed_over_netlink_as_the_binaries_do() {
    let key = |l: &Leftover| {
        (
            l.family.to_string(),
            l.table.clone(),
            l.chain.clone(),
            l.rules,
            l.jumps,
        )
    };
    let netlink = |ns: &TestNetns| {
        redirect_testkit::run_in(ns.path(), || {
            let nft = redirect_kernel::nft::Nft::open().unwrap();
            nft.xtables_chains(&Family::ALL, "ISTIO_").unwrap().chains
        })
    };
    let xt_key = |c: &redirect_kernel::nft::XtChain| {
        (
            c.family.to_string(),
            c.table.clone(),
            c.chain.clone(),
            c.rules,
            c.jumps,
        )
    };
    for name in [
        "basic-exclude-nic",
        "ipnets-with-kube-virt-interfaces",
        "tproxy",
    ] {
        let case = IstioCase::load(name);
        let twins: Vec<Topology> = (0..2)
            .map(|_| {
                let t = istio::case_topology(&case);
                load_istio_case_with(&t.pod, &case, Some("nft"));
                t.pod.sh(
                    "iptables-nft -t nat -N MINE && iptables-nft -t nat -A MINE -i eth1 -j RETURN",
                );
                t.pod
                    .sh("iptables-nft -t nat -A POSTROUTING -o eth0 -j MINE");
                t
            })
            .collect();
        let (by_binary, by_netlink) = (&twins[0].pod, &twins[1].pod);

        let mut want: Vec<_> =
            redirect_testkit::run_in(by_binary.path(), xtables::find_istio_leftovers)
                .unwrap()
                .iter()
                .map(key)
                .collect();
        let mut got: Vec<_> = netlink(by_netlink).iter().map(xt_key).collect();
        want.sort();
        got.sort();
        if name == "tproxy" {
            let chains = |v: &[(String, String, String, usize, usize)]| {
                v.iter()
                    .filter(|k| k.2.starts_with("ISTIO_"))
                    .cloned()
                    .collect::<Vec<_>>()
            };
            assert_eq!(chains(&got), chains(&want), "{name}");
            assert!(!chains(&got).is_empty(), "{name}");
        } else {
            assert_eq!(
                got, want,
                "{name}: the netlink read equals iptables-nft-save's"
            );
        }

        redirect_testkit::run_in(by_binary.path(), xtables::remove_istio_leftovers).unwrap();
        let removed = redirect_testkit::run_in(by_netlink.path(), || {
            let nft = redirect_kernel::nft::Nft::open().unwrap();
            nft.remove_xtables_chains(&Family::ALL, "ISTIO_").unwrap()
        });
        assert_eq!(
            removed.iter().map(xt_key).collect::<Vec<_>>().len(),
            got.len(),
            "{name}: removed what it found"
        );
        assert!(
            netlink(by_netlink).is_empty(),
            "{name}: nothing left to find"
        );
        for f in Family::ALL {
            let (a, b) = (
                save(by_binary, f, Variant::Nft),
                save(by_netlink, f, Variant::Nft),
            );
            let (a, b) = (content(&a), content(&b));
            if name == "tproxy" {
                // The TPROXY tail stays with the netlink removal: everything else is equal.
                let rest = |v: &[String]| {
                    v.iter()
                        .filter(|l| {
                            !l.contains("CONNMARK") && !l.contains("MARK") && !l.contains("-m mark")
                        })
                        .cloned()
                        .collect::<Vec<_>>()
                };
                assert_eq!(rest(&b), rest(&a), "{name} {f}");
            } else {
                assert_eq!(
                    b, a,
                    "{name} {f}: the same rules left as the binaries leave"
                );
            }
            assert!(b.iter().all(|l| !l.contains("ISTIO_")), "{name} {f}: {b:?}");
        }
        assert!(
            content(&save(by_netlink, Family::V4, Variant::Nft))
                .iter()
                .any(|l| l.contains("-A MINE -i eth1 -j RETURN")),
            "someone else's chain stays"
        );
    }
}
