use super::*;
use crate::config::{CaptureConfig, DnsCapture, InterceptionMode, Selection};
use crate::plan::plan;

fn eval(cfg: &CaptureConfig, flow: &str) -> Evaluation {
    let rs = plan(cfg).unwrap();
    evaluate(&rs, &flow.parse::<Flow>().unwrap())
}

fn redirect(port: u16, to: &str) -> Verdict {
    Verdict::Redirect {
        port,
        to: to.parse().unwrap(),
    }
}

#[test]
fn istio_sidecar_default_verdicts() {
    let cfg = CaptureConfig::istio_sidecar_default();
    let cases = [
        (
            "out tcp uid=1000 10.1.2.3:80",
            redirect(15001, "127.0.0.1:15001"),
        ),
        ("out tcp uid=1337 10.1.2.3:80", Verdict::Pass),
        ("out tcp gid=1337 uid=5 10.1.2.3:80", Verdict::Pass),
        // Istio's validation probe.
        (
            "out tcp uid=1337 127.0.0.6:15002",
            redirect(15006, "127.0.0.1:15006"),
        ),
        // The same from another UID meets the `-o lo ! --uid-owner` RETURN.
        ("out tcp uid=1000 127.0.0.6:15002", Verdict::Pass),
        ("out tcp uid=1000 127.0.0.1:8080", Verdict::Pass),
        ("out udp uid=1000 10.96.0.10:53", Verdict::Pass),
        (
            "in tcp 10.77.0.2:8080 src=10.0.0.9",
            redirect(15006, "10.77.0.2:15006"),
        ),
        ("in tcp 10.77.0.2:15021", Verdict::Pass),
        ("in tcp 10.77.0.2:15008", Verdict::Pass),
        ("in udp 10.77.0.2:8080", Verdict::Pass),
        ("in tcp 10.77.0.2:8080 ct=established", Verdict::Pass),
        // Envoy's passthrough to the app from 127.0.0.6.
        (
            "out tcp uid=1337 10.77.0.2:8080 src=127.0.0.6 oif=lo",
            Verdict::Pass,
        ),
        // The proxy calling its own pod's address over lo is inbound traffic.
        (
            "out tcp uid=1337 10.77.0.2:8080 oif=lo",
            redirect(15006, "127.0.0.1:15006"),
        ),
        // IPv6 off: an IPv6 flow meets no rule.
        ("out tcp uid=1000 [fd00::1]:80", Verdict::Pass),
    ];
    for (flow, want) in cases {
        let e = eval(&cfg, flow);
        assert_eq!(e.verdict, want, "{flow}\n{e:#?}");
    }
}

#[test]
fn path_names_the_rules_crossed() {
    let e = eval(
        &CaptureConfig::istio_sidecar_default(),
        "out tcp uid=1000 10.1.2.3:80",
    );
    let path: Vec<String> = e.path().map(|s| s.to_string()).collect();
    assert_eq!(
        path,
        [
            "ip nat OUTPUT > OUTPUT #1: jump nat_ip_istio_output",
            "ip nat OUTPUT > ISTIO_OUTPUT #9: jump nat_ip_istio_redirect",
            "ip nat OUTPUT > ISTIO_REDIRECT #1: meta l4proto tcp redirect to :15001",
        ],
        "{:#?}",
        e.steps
    );
    // Every rule before the match was tested and did not match.
    assert_eq!(e.steps.iter().filter(|s| !s.matched).count(), 8);
}

#[test]
fn dns_tproxy_and_ipv6() {
    let cfg = CaptureConfig {
        mode: InterceptionMode::Tproxy,
        dns: DnsCapture::All,
        ipv6: true,
        outbound_exclude_cidrs: vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()],
        ..CaptureConfig::istio_sidecar_default()
    };
    let e = eval(&cfg, "out udp uid=1000 192.168.0.10:53");
    assert_eq!(e.verdict, redirect(15053, "127.0.0.1:15053"));
    assert_eq!(e.ct_zone, Some(2));
    let e = eval(&cfg, "out udp uid=1337 192.168.0.10:53");
    assert_eq!((e.verdict, e.ct_zone), (Verdict::Pass, Some(1)));
    let e = eval(&cfg, "in tcp 10.77.0.2:8080");
    assert_eq!(
        e.verdict,
        Verdict::Tproxy {
            port: 15006,
            mark: 1337
        }
    );
    assert_eq!(e.mark, 1337);
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 10.9.9.9:80").verdict,
        Verdict::Pass
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 [2001:db8::1]:80").verdict,
        redirect(15001, "[::1]:15001")
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 [fd00::1]:80").verdict,
        Verdict::Pass
    );
    assert_eq!(
        eval(&cfg, "in tcp [fd77::2]:8080").verdict,
        Verdict::Tproxy {
            port: 15006,
            mark: 1337
        }
    );
}

#[test]
fn drop_invalid_and_include_lists() {
    let cfg = CaptureConfig {
        drop_invalid: true,
        outbound_include_cidrs: Selection::List(vec!["10.96.0.0/12".parse().unwrap()]),
        outbound_include_ports: vec![5432],
        bypass_uids: vec![4000],
        ..CaptureConfig::istio_sidecar_default()
    };
    assert_eq!(
        eval(&cfg, "in tcp 10.77.0.2:80 ct=invalid").verdict,
        Verdict::Drop
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 10.96.0.1:443").verdict,
        redirect(15001, "127.0.0.1:15001")
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 10.1.0.1:443").verdict,
        Verdict::Pass
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=1000 10.1.0.1:5432").verdict,
        redirect(15001, "127.0.0.1:15001")
    );
    assert_eq!(
        eval(&cfg, "out tcp uid=4000 10.96.0.1:443").verdict,
        Verdict::Pass
    );
}

#[test]
fn flows_parse_and_print() {
    for text in [
        "out tcp 10.1.2.3:80 uid=1000 gid=1000 oif=eth0",
        "in udp [fd00::2]:53 src=[fd00::9]:4000 iif=eth1 mark=0x539 ct=established",
        "out tcp 127.0.0.6:15002 src=127.0.0.1 uid=1337",
    ] {
        let f: Flow = text.parse().unwrap();
        assert_eq!(f.to_string(), text);
        assert_eq!(f.to_string().parse::<Flow>().unwrap(), f);
    }
    let f: Flow = "tcp uid=7 out 10.0.0.1:443".parse().unwrap();
    assert_eq!(f.direction, Direction::Out);
    assert_eq!(f.uid, Some(7));
    let bad = [
        ("tcp 10.0.0.1:80", "direction"),
        ("out tcp", "destination"),
        ("out tcp 10.0.0.1", "\"10.0.0.1\""),
        ("out tcp 10.0.0.1:80 uid=x", "uid=\"x\""),
        ("out tcp 10.0.0.1:80 color=red", "\"color\""),
        ("in tcp 10.0.0.1:80 uid=5", "'out' flow"),
        ("out tcp 10.0.0.1:80 src=::1", "different address families"),
        ("out out 10.0.0.1:80", "twice"),
        // A repeated key is refused, not judged as its last value.
        (
            "out tcp uid=1000 10.0.0.1:80 uid=1337",
            "uid= is given twice (\"uid=1337\")",
        ),
        (
            "in tcp 10.0.0.1:80 src=10.0.0.9 src=10.0.0.8",
            "src= is given twice",
        ),
        ("out tcp 10.0.0.1:0", "port is 0"),
    ];
    for (text, needle) in bad {
        let e = text.parse::<Flow>().unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains(text), "{text}: {e}");
    }
}
