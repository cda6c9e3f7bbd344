//! Istio's ambient in-pod rules (`redirect_model::AmbientConfig`) in the kernel: programmed
//! over netlink in one table and read back equal; the nft script of the same rules, loaded by
//! `nft -f`, holds the same expressions; and real connections in fresh namespaces land where
//! the evaluator says: the app's outbound TCP on 15001, DNS on 15053, inbound on 15006, HBONE
//! and the probe address left alone, ztunnel's own marked sockets never captured.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::process::{Command, Stdio};

use redirect_kernel::nft;
use redirect_model::eval::{evaluate, Flow};
use redirect_model::{AmbientConfig, Ruleset};
use redirect_testkit::{kernel_test, run_probe, From, Outcome, Probe, Side, Topology};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

const APP: From = From::Pod {
    uid: 1000,
    gid: 1000,
};

fn variants() -> Vec<(&'static str, AmbientConfig)> {
    let d = AmbientConfig::default;
    vec![
        ("default", d()),
        (
            "dns off",
            AmbientConfig {
                dns_capture: false,
                ..d()
            },
        ),
        ("ipv4 only", AmbientConfig { ipv6: false, ..d() }),
        (
            "bypass inbound",
            AmbientConfig {
                bypass_inbound: true,
                ..d()
            },
        ),
        (
            "virtual interfaces",
            AmbientConfig {
                virtual_interfaces: vec!["tap0".into(), "tap1".into()],
                ..d()
            },
        ),
    ]
}

fn apply(topo: &Topology, rs: &Ruleset) {
    let nft = redirect_kernel::testing::nft_in(topo.pod.path());
    nft.apply(rs).unwrap();
    assert!(nft.diff(rs).unwrap().is_empty(), "read back as applied");
}

#[kernel_test]
fn each_variant_applies_reads_back_and_loads_the_same_with_nft() {
    for (name, cfg) in variants() {
        let rs = cfg.plan().unwrap();
        let ns = redirect_testkit::TestNetns::new();
        let nft = redirect_kernel::testing::nft_in(ns.path());
        nft.apply(&rs).unwrap();
        let diff = nft.diff(&rs).unwrap();
        assert!(diff.is_empty(), "{name}: {diff:?}");
        // The script, loaded by nft into a fresh namespace, is the same table, expression by
        // expression (so the renderer and the netlink encoder say the same thing).
        let fresh = redirect_testkit::TestNetns::new();
        let mut child = Command::new("ip")
            .args(["netns", "exec", fresh.name(), "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let script = redirect_model::render::nft_script(&rs);
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{name}: nft -f: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
        let loaded = redirect_kernel::testing::nft_in(fresh.path())
            .read()
            .unwrap()
            .unwrap();
        let ours = nft.read().unwrap().unwrap();
        assert_eq!(
            rules(&loaded),
            rules(&ours),
            "{name}: nft -f differs\n{script}"
        );
        // And removed whole.
        assert!(nft.remove().unwrap());
        assert!(nft.read().unwrap().is_none(), "{name}");
    }
}

/// Each chain's rules as text, with what nft's own encoding adds and ours leaves out: the
/// family check of an `ip`/`ip6` match (our base chains dispatch by family already) and an
/// interface name padded to 16 bytes (ours ends at its NUL).
fn rules(t: &nft::TableState) -> Vec<(String, Vec<String>)> {
    let unpad = |text: String| -> String {
        let mut out = text;
        for (op, word) in [("neq", "!= "), ("eq", "")] {
            for key in ["iifname", "oifname"] {
                let head = format!("[ meta load {key} => reg 1 ] [ cmp {op} reg 1 0x");
                while let Some(at) = out.find(&head) {
                    let rest = &out[at + head.len()..];
                    let end = rest.find(" ]").unwrap();
                    let bytes: Vec<u8> = (0..end / 2)
                        .map(|i| u8::from_str_radix(&rest[2 * i..2 * i + 2], 16).unwrap())
                        .take_while(|b| *b != 0)
                        .collect();
                    let name = String::from_utf8(bytes).unwrap();
                    let tail = rest[end + 2..].to_string();
                    out = format!("{}{key} {word}\"{name}\"{tail}", &out[..at]);
                }
            }
        }
        out
    };
    t.chains
        .iter()
        .map(|c| {
            let texts = c
                .rules
                .iter()
                .map(|r| {
                    let text = nft::text::exprs(r)
                        .replace("meta nfproto ipv4 ip ", "ip ")
                        .replace("meta nfproto ipv6 ip6 ", "ip6 ");
                    unpad(text)
                })
                .collect();
            (c.name.clone(), texts)
        })
        .collect()
}

/// A TCP connection from the pod by a socket carrying `mark` (as ztunnel's do); the listener's
/// landing line.
fn marked_connect(topo: &Topology, mark: u32, dst: SocketAddr) -> String {
    topo.pod.run(move || {
        use nix::sys::socket::{
            connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType,
            SockaddrStorage,
        };
        let fam = if dst.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let s = socket(fam, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
        setsockopt(&s, sockopt::Mark, &mark).unwrap();
        connect(s.as_raw_fd(), &SockaddrStorage::from(dst)).unwrap();
        // SAFETY: a connected socket this closure owns, handed to TcpStream.
        let stream = unsafe { TcpStream::from_raw_fd(s.into_raw_fd()) };
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).unwrap();
        line
    })
}

/// The evaluator's redirect port for the flow a probe makes (none: not redirected).
fn evaluated(rs: &Ruleset, flow: &str) -> Option<u16> {
    evaluate(rs, &flow.parse::<Flow>().unwrap())
        .verdict
        .redirect_port()
}

#[kernel_test]
fn connections_land_where_the_evaluator_says() {
    let rs = AmbientConfig::default().plan().unwrap();
    let topo = Topology::basic();
    apply(&topo, &rs);
    let landed = |side, port, orig: Option<&str>| Outcome::landed(side, port, orig.map(sa));
    // (probe, where it lands, the evaluator's flow for it).
    let cases: Vec<(Probe, Outcome, &str)> = vec![
        (
            Probe::tcp(APP, sa("10.77.0.1:80")),
            landed(Side::Pod, 15001, Some("10.77.0.1:80")),
            "out tcp uid=1000 10.77.0.1:80",
        ),
        (
            Probe::tcp(APP, sa("[fd77::1]:80")),
            landed(Side::Pod, 15001, Some("[fd77::1]:80")),
            "out tcp uid=1000 [fd77::1]:80",
        ),
        (
            Probe::tcp(APP, sa("10.77.0.1:53")),
            landed(Side::Pod, 15053, Some("10.77.0.1:53")),
            "out tcp uid=1000 10.77.0.1:53",
        ),
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:8080")),
            landed(Side::Pod, 15006, Some("10.77.0.2:8080")),
            "in tcp 10.77.0.2:8080 src=10.77.0.1",
        ),
        (
            Probe::tcp(From::Peer, sa("[fd77::2]:8080")),
            landed(Side::Pod, 15006, Some("[fd77::2]:8080")),
            "in tcp [fd77::2]:8080 src=fd77::1",
        ),
        // HBONE reaches ztunnel's own listener; the app's loopback and own address stay.
        (
            Probe::tcp(From::Peer, sa("10.77.0.2:15008")),
            landed(Side::Pod, 15008, None),
            "in tcp 10.77.0.2:15008 src=10.77.0.1",
        ),
        (
            Probe::tcp(APP, sa("127.0.0.1:8080")),
            landed(Side::Pod, 8080, None),
            "out tcp uid=1000 127.0.0.1:8080",
        ),
        (
            Probe::tcp(APP, sa("10.77.0.2:8080")),
            landed(Side::Pod, 8080, None),
            "out tcp uid=1000 10.77.0.2:8080 oif=lo",
        ),
    ];
    for (probe, want, flow) in cases {
        let got = run_probe(&topo, &probe);
        assert_eq!(got, want, "{probe}");
        let port = match &want {
            Outcome::Landed {
                port,
                orig: Some(_),
                ..
            } => Some(*port),
            _ => None,
        };
        assert_eq!(evaluated(&rs, flow), port, "the evaluator on {flow}");
    }
    // UDP DNS from the app reaches the DNS proxy's port.
    let dns = run_probe(&topo, &Probe::udp(APP, sa("10.77.0.1:53")));
    assert!(
        matches!(
            dns,
            Outcome::Landed {
                side: Side::Pod,
                port: 15053,
                ..
            }
        ),
        "{dns}"
    );
    assert_eq!(evaluated(&rs, "out udp uid=1000 10.77.0.1:53"), Some(15053));
    // ztunnel's own sockets (mark 0x539) go where they connect.
    for dst in ["10.77.0.1:80", "[fd77::1]:80"] {
        let line = marked_connect(&topo, 0x539, sa(dst));
        assert!(line.contains("side=peer port=80"), "{dst}: {line}");
        let flow = format!("out tcp mark=0x539 {dst}");
        assert_eq!(evaluated(&rs, &flow), None, "{flow}");
    }
    // Another mark is the app's: captured.
    let line = marked_connect(&topo, 0x538, sa("10.77.0.1:80"));
    assert!(line.contains("side=pod port=15001"), "{line}");
}

#[kernel_test]
fn bypass_inbound_leaves_inbound_to_the_app() {
    let cfg = AmbientConfig {
        bypass_inbound: true,
        ..AmbientConfig::default()
    };
    let topo = Topology::basic();
    apply(&topo, &cfg.plan().unwrap());
    let inbound = run_probe(&topo, &Probe::tcp(From::Peer, sa("10.77.0.2:8080")));
    assert_eq!(inbound, Outcome::landed(Side::Pod, 8080, None));
    let outbound = run_probe(&topo, &Probe::tcp(APP, sa("10.77.0.1:80")));
    assert_eq!(
        outbound,
        Outcome::landed(Side::Pod, 15001, Some(sa("10.77.0.1:80")))
    );
}
