//! The kernel test kit held against known facts about Istio's rules, and every Istio
//! `istio-iptables` case run through its probe matrix.
//!
//! Kernel tests (`#[kernel_test]`): ignored with their reason unless run with
//! `--include-ignored`, as root.

use std::net::SocketAddr;
use std::time::Instant;

use redirect_testkit::istio::{self, IstioCase};
use redirect_testkit::{
    kernel_test, run_probe, run_probe_report, run_probes_report, From, Outcome, Probe, Side,
    Topology,
};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn app() -> From {
    From::Pod {
        uid: 1000,
        gid: 1000,
    }
}

fn proxy() -> From {
    From::Pod {
        uid: 1337,
        gid: 1337,
    }
}

fn landed(side: Side, port: u16, orig: Option<&str>) -> Outcome {
    Outcome::landed(side, port, orig.map(sa))
}

#[kernel_test]
fn without_rules_nothing_is_diverted() {
    let topo = Topology::basic();
    let cases = [
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
            landed(Side::Pod, 8080, None),
        ),
        (
            Probe::tcp(From::Peer, sa("[fd77::2]:8080")),
            landed(Side::Pod, 8080, None),
        ),
        (
            Probe::tcp(app(), sa("10.77.0.1:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::tcp(app(), sa("[fd77::1]:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::udp(app(), sa("10.77.0.1:53")),
            landed(Side::Peer, 53, None),
        ),
        (
            Probe::udp(app(), sa("127.0.0.53:53")),
            landed(Side::Pod, 53, None),
        ),
        (Probe::tcp(app(), sa("10.77.0.1:81")), Outcome::Refused),
        (Probe::udp(app(), sa("10.77.0.1:54")), Outcome::Refused),
        (
            Probe::tcp(proxy(), sa("127.0.0.6:15002")).bound("127.0.0.1".parse().unwrap()),
            Outcome::Refused,
        ),
        (
            Probe::tcp(From::PeerVia("eth0".into()), sa("10.77.0.2:8080")),
            landed(Side::Pod, 8080, None),
        ),
        // Not local to the pod, and the pod does not forward: dropped.
        (
            Probe::tcp(From::PeerVia("eth0".into()), sa("192.0.2.9:80")),
            Outcome::Timeout,
        ),
    ];
    for (probe, want) in &cases {
        assert_eq!(&run_probe(&topo, probe), want, "{probe}");
    }
    // The local address of an undiverted connection is its destination.
    let r = run_probe_report(&topo, &Probe::tcp(From::Peer, sa("10.77.0.2:8080")));
    assert_eq!(r.local, Some(sa("10.77.0.2:8080")));
}

#[kernel_test]
fn istio_cni_basic_lands_where_istio_says() {
    let topo = Topology::basic();
    let case = IstioCase::load_cni("basic");
    istio::iptables_restore(&topo.pod, false, &case.restore_path());
    let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let cases = [
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
            landed(Side::Pod, 15006, Some("10.77.0.2:8080")),
        ),
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:15021")),
            landed(Side::Pod, 15021, None),
        ),
        (
            Probe::tcp(app(), sa("10.77.0.1:80")),
            landed(Side::Pod, 15001, Some("10.77.0.1:80")),
        ),
        (
            Probe::tcp(proxy(), sa("10.77.0.1:80")),
            landed(Side::Peer, 80, None),
        ),
        (
            Probe::tcp(proxy(), sa("127.0.0.6:15002")).bound(lo),
            landed(Side::Pod, 15006, Some("127.0.0.6:15002")),
        ),
        (
            Probe::tcp(app(), sa("127.0.0.6:15002")).bound(lo),
            Outcome::Refused,
        ),
        // The CNI default excludes outbound 15020.
        (
            Probe::tcp(app(), sa("10.77.0.1:15020")),
            landed(Side::Peer, 15020, None),
        ),
        // IPv6 has no rules in this case.
        (
            Probe::tcp(app(), sa("[fd77::1]:80")),
            landed(Side::Peer, 80, None),
        ),
    ];
    for (probe, want) in &cases {
        assert_eq!(&run_probe(&topo, probe), want, "{probe}");
    }
}

/// Facts of single cases, checked inside the all-cases run.
fn case_facts(case: &str) -> Vec<(Probe, Outcome)> {
    let via = |i: &str| From::PeerVia(i.to_string());
    match case {
        "kube-virt-interfaces" => vec![
            // Arriving on a reroute interface: sent to the outbound port like outbound traffic.
            (
                Probe::tcp(via("eth1"), sa("192.0.2.9:80")),
                landed(Side::Pod, 15001, Some("192.0.2.9:80")),
            ),
            (
                Probe::tcp(via("eth2"), sa("10.77.0.2:8080")),
                landed(Side::Pod, 15001, Some("10.77.0.2:8080")),
            ),
            (
                Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
                landed(Side::Pod, 8080, None),
            ),
        ],
        "basic-exclude-nic" => vec![
            (
                Probe::tcp(app(), sa("10.77.1.1:80")),
                landed(Side::Peer, 80, None),
            ),
            (
                Probe::tcp(via("not-istio-nic"), sa("10.77.0.2:8080")),
                landed(Side::Pod, 8080, None),
            ),
        ],
        "tproxy" => vec![
            // Outbound include CIDR captured, but not through the excluded interface.
            (
                Probe::tcp(app(), sa("9.9.0.1:80")),
                landed(Side::Pod, 15001, Some("9.9.0.1:80")),
            ),
            (
                Probe::tcp(app(), sa("9.9.0.2:80")),
                landed(Side::Peer, 80, None),
            ),
            (
                Probe::tcp(app(), sa("1.1.0.1:80")),
                landed(Side::Peer, 80, None),
            ),
            (
                Probe::udp(app(), sa("127.0.0.53:53")),
                landed(Side::Pod, 15053, None),
            ),
            (
                Probe::tcp(via("not-istio-nic"), sa("10.77.0.2:8080")),
                landed(Side::Pod, 8080, None),
            ),
        ],
        "dns-uid-gid" => {
            let lo = "127.0.0.1".parse().unwrap();
            vec![
                // Only the FIRST proxy uid gets the loopback redirect: uid 4 (and any proxy gid)
                // RETURNs at uid 3's `-o lo ... ! --uid-owner 3 -j RETURN` first.
                (
                    Probe::tcp(From::Pod { uid: 3, gid: 1000 }, sa("127.0.0.6:15002")).bound(lo),
                    landed(Side::Pod, 15006, Some("127.0.0.6:15002")),
                ),
                (
                    Probe::tcp(From::Pod { uid: 4, gid: 1000 }, sa("127.0.0.6:15002")).bound(lo),
                    Outcome::Refused,
                ),
                // DNS capture: UDP to the resolver lands on the agent (un-NATed replies through
                // conntrack zone 2), the proxy's own DNS is left alone.
                (
                    Probe::udp(app(), sa("127.0.0.53:53")),
                    landed(Side::Pod, 15053, None),
                ),
                (
                    Probe::udp(From::Pod { uid: 3, gid: 1000 }, sa("127.0.0.53:53")),
                    landed(Side::Pod, 53, None),
                ),
                (
                    Probe::udp(app(), sa("[::127.0.0.53]:53")),
                    landed(Side::Pod, 15053, None),
                ),
                // The GID redirect rule has `! --dport 15008` only, without the 53 exception.
                (
                    Probe::tcp(From::Pod { uid: 1000, gid: 1 }, sa("127.0.0.53:53")),
                    landed(Side::Pod, 15006, Some("127.0.0.53:53")),
                ),
            ]
        }
        "host-ipv4-loopback-cidr" => vec![
            // 127.0.0.6 is inside 127.0.0.1/8, so the validation path is not redirected.
            (
                Probe::tcp(proxy(), sa("127.0.0.6:15002")).bound("127.0.0.1".parse().unwrap()),
                Outcome::Refused,
            ),
        ],
        "loopback-outbound-iprange" => vec![(
            Probe::tcp(app(), sa("127.1.2.3:80")),
            landed(Side::Pod, 15001, Some("127.1.2.3:80")),
        )],
        "outbound-owner-groups" => vec![
            // The test base has no outbound capture, so group membership changes nothing.
            (
                Probe::tcp(
                    From::Pod {
                        uid: 1000,
                        gid: istio::JAVA_GID,
                    },
                    sa("10.77.0.1:80"),
                ),
                landed(Side::Peer, 80, None),
            ),
        ],
        _ => Vec::new(),
    }
}

#[kernel_test]
fn every_istio_case_gives_definite_outcomes() {
    let started = Instant::now();
    let names = istio::list_cases();
    assert_eq!(names.len(), 27, "expected Istio's 27 istio-iptables cases");
    let mut failures = Vec::new();
    let mut total = 0;
    for name in &names {
        let t0 = Instant::now();
        let case = IstioCase::load(name);
        let topo = istio::case_topology(&case);
        istio::load_istio_case(&topo.pod, &case);
        let matrix = istio::probe_matrix(&case);
        let reports = run_probes_report(&topo, &matrix);
        total += matrix.len();
        let mut counts = std::collections::BTreeMap::<String, usize>::new();
        for (probe, report) in matrix.iter().zip(&reports) {
            println!("{name:<40} {:<52} {}", probe.to_string(), report.outcome);
            let kind = match &report.outcome {
                Outcome::Landed { side, port, .. } => format!("{side}:{port}"),
                o => o.to_string(),
            };
            *counts.entry(kind).or_default() += 1;
            if !report.outcome.is_definite() {
                failures.push(format!("{name}: {probe}: {}", report.outcome));
            }
        }
        // TPROXY keeps the original destination as the local address.
        if name == "tproxy" || name == "inbound-ports-tproxy" {
            let port = case.inbound_port_list().first().copied().unwrap_or(8080);
            for v6 in case.families() {
                let dst = SocketAddr::new(topo.pod_addr(v6), port);
                let r = run_probe_report(&topo, &Probe::tcp(From::Peer, dst));
                if r.outcome != Outcome::landed(Side::Pod, 15006, Some(dst)) || r.local != Some(dst)
                {
                    failures.push(format!(
                        "{name}: TPROXY of {dst}: got {} with local {:?}, want pod:15006 with local {dst}",
                        r.outcome, r.local
                    ));
                }
            }
        }
        for (probe, want) in case_facts(name) {
            let got = run_probe(&topo, &probe);
            if got != want {
                failures.push(format!("{name}: {probe}: got {got}, want {want}"));
            }
        }
        println!(
            "== {name}: {} probes in {:?}: {}",
            matrix.len(),
            t0.elapsed(),
            counts
                .iter()
                .map(|(k, n)| format!("{k}×{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!(
        "== {} cases, {total} probes in {:?}",
        names.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
