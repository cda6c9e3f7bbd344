//! The validation probe (`probe::run`) against real rules in fresh namespaces. The test process
//! is root, so configs with proxy uid/gid 0 make the probe's connection the proxy's own.

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use redirect_istio::validation::probe::{self, ProbeFailure, ProbeSpec, ProbeSuccess};
use redirect_kernel::SystemGroups;
use redirect_model::{CaptureConfig, InterceptionMode};
use redirect_testkit::{kernel_test, TestNetns};

const TIMEOUT: Duration = Duration::from_millis(500);

fn spec(ipv6: bool) -> ProbeSpec {
    ProbeSpec {
        ipv6,
        timeout: TIMEOUT,
        ..ProbeSpec::istio_default()
    }
}

/// Istio's sidecar default, with the probe's (root's) uid and gid as the proxy's.
fn root_proxy() -> CaptureConfig {
    CaptureConfig {
        proxy_uids: vec![0],
        proxy_gids: vec![0],
        ..CaptureConfig::istio_sidecar_default()
    }
}

/// Applies `cfg` (if any) in a fresh namespace and runs the probe there.
fn probe_with(cfg: Option<&CaptureConfig>, spec: &ProbeSpec) -> Result<ProbeSuccess, ProbeFailure> {
    let ns = TestNetns::new();
    ns.run(|| {
        if let Some(cfg) = cfg {
            apply_here(cfg);
        }
        probe::run(spec)
    })
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn assert_ok(result: Result<ProbeSuccess, ProbeFailure>, port: u16, orig: &str) -> ProbeSuccess {
    let ok = result.unwrap_or_else(|e| panic!("probe failed: {e}"));
    assert_eq!(ok.listener_port, port, "{ok:?}");
    assert_eq!(ok.original_dst, sa(orig), "{ok:?}");
    assert!(ok.elapsed < TIMEOUT / 2, "{ok:?}");
    ok
}

/// The timeout's fields, checked for what every timeout has; returns the last connect error's
/// errno and the message.
fn assert_timeout(result: Result<ProbeSuccess, ProbeFailure>) -> (Option<i32>, ProbeFailure) {
    let failure = match result {
        Ok(ok) => panic!("probe succeeded: {ok:?}"),
        Err(e) => e,
    };
    let ProbeFailure::Timeout {
        after,
        attempts,
        last_connect_error,
        ..
    } = &failure
    else {
        panic!("not a timeout: {failure:?}");
    };
    assert!(*after >= TIMEOUT, "{failure:?}");
    assert!(*after < TIMEOUT * 4, "{failure:?}");
    assert!(*attempts > 1, "{failure:?}");
    let errno = last_connect_error.as_ref().and_then(|e| e.raw_os_error());
    (errno, failure)
}

#[kernel_test]
fn succeeds_with_rules_for_the_probes_uid() {
    let ok = assert_ok(
        probe_with(Some(&root_proxy()), &spec(false)),
        15006,
        "127.0.0.6:15002",
    );
    assert!(ok.attempts >= 1 && ok.listen_errors.is_empty(), "{ok:?}");
}

#[kernel_test]
fn times_out_without_rules() {
    let (errno, failure) = assert_timeout(probe_with(None, &spec(false)));
    assert_eq!(errno, Some(libc::ECONNREFUSED), "{failure:?}");
    let ProbeFailure::Timeout {
        connected,
        listening,
        wrong_destinations,
        ..
    } = &failure
    else {
        unreachable!()
    };
    assert_eq!((*connected, listening.as_slice()), (0, &[15001, 15006][..]));
    assert!(wrong_destinations.is_empty(), "{failure:?}");
    let msg = failure.to_string();
    assert!(msg.starts_with("validation timeout after "), "{msg}");
    assert!(
        msg.contains(
            "; last attempt: connection refused by 127.0.0.6:15002: nothing redirected it"
        ),
        "{msg}"
    );
}

#[kernel_test]
fn reports_connections_with_other_destinations() {
    let ns = TestNetns::new();
    // No rules: the probe's own connections are refused, while another client reaches the
    // listener on 15001 directly. Not NATed, so its original destination is 127.0.0.1:15001.
    let (reply, result) = ns.run(|| {
        std::thread::scope(|s| {
            let other = s.spawn(|| {
                std::thread::sleep(TIMEOUT / 4);
                let mut stream = TcpStream::connect("127.0.0.1:15001").unwrap();
                let mut reply = String::new();
                stream.read_to_string(&mut reply).unwrap();
                reply
            });
            let result = probe::run(&spec(false));
            (other.join().unwrap(), result)
        })
    });
    // Istio's answer: the original port as ASCII digits.
    assert_eq!(reply, "15001");
    let (errno, failure) = assert_timeout(result);
    assert_eq!(errno, Some(libc::ECONNREFUSED), "{failure:?}");
    let ProbeFailure::Timeout {
        wrong_destinations, ..
    } = &failure
    else {
        unreachable!()
    };
    assert_eq!(wrong_destinations, &[sa("127.0.0.1:15001")]);
    let msg = failure.to_string();
    assert!(
        msg.contains("; connections arrived with other original destinations: 127.0.0.1:15001"),
        "{msg}"
    );
}

#[kernel_test]
fn times_out_when_the_proxy_is_another_uid() {
    // Istio's default proxy 1337; the probe runs as root, so `! --uid-owner 1337 -j RETURN`
    // passes it by.
    let cfg = CaptureConfig::istio_sidecar_default();
    let (errno, failure) = assert_timeout(probe_with(Some(&cfg), &spec(false)));
    assert_eq!(errno, Some(libc::ECONNREFUSED), "{failure:?}");
}

#[kernel_test]
fn succeeds_in_every_config_tproxy_or_no_capture() {
    // The redirect the probe relies on exists whatever is captured (§5).
    let tproxy = CaptureConfig {
        mode: InterceptionMode::Tproxy,
        ..root_proxy()
    };
    let nothing = CaptureConfig {
        proxy_uids: vec![0],
        proxy_gids: vec![0],
        ..CaptureConfig::default()
    };
    for cfg in [tproxy, nothing] {
        assert_ok(
            probe_with(Some(&cfg), &spec(false)),
            15006,
            "127.0.0.6:15002",
        );
    }
}

#[kernel_test]
fn ipv6_succeeds_with_ipv6_rules() {
    // kernel::capture::apply also puts ::6 on lo, which the connect needs to be routed at all.
    let cfg = CaptureConfig {
        ipv6: true,
        ..root_proxy()
    };
    assert_ok(probe_with(Some(&cfg), &spec(true)), 15006, "[::6]:15002");
}

#[kernel_test]
fn ipv6_times_out_with_ipv4_rules_only() {
    let ns = TestNetns::new();
    let result = ns.run(|| {
        apply_here(&root_proxy());
        // ::6 is there, so only the missing IPv6 rules can make the difference.
        redirect_kernel::routes::Routes::open()
            .unwrap()
            .ensure_lo_v6_inbound_addr()
            .unwrap();
        probe::run(&spec(true))
    });
    let (errno, failure) = assert_timeout(result);
    assert_eq!(errno, Some(libc::ECONNREFUSED), "{failure:?}");
    assert!(failure.to_string().contains("[::6]:15002"), "{failure}");
}

/// Runs the probe with rules applied and `taken` ports already bound by a plain listener
/// (no SO_REUSEPORT), which the probe cannot share.
fn probe_with_taken(taken: &[u16]) -> Result<ProbeSuccess, ProbeFailure> {
    let ns = TestNetns::new();
    ns.run(|| {
        apply_here(&root_proxy());
        let _blockers: Vec<TcpListener> = taken
            .iter()
            .map(|p| TcpListener::bind(("127.0.0.1", *p)).unwrap())
            .collect();
        probe::run(&spec(false))
    })
}

fn ports_and_errnos(errors: &[(u16, std::io::Error)]) -> Vec<(u16, Option<i32>)> {
    errors.iter().map(|(p, e)| (*p, e.raw_os_error())).collect()
}

#[kernel_test]
fn runs_on_the_free_port_when_one_is_taken() {
    // 15006 taken: the redirected connection lands on the other listener, not ours.
    let (_, failure) = assert_timeout(probe_with_taken(&[15006]));
    let ProbeFailure::Timeout {
        listening,
        listen_errors,
        connected,
        ..
    } = &failure
    else {
        unreachable!()
    };
    assert_eq!(listening, &[15001], "{failure:?}");
    assert_eq!(
        ports_and_errnos(listen_errors),
        [(15006, Some(libc::EADDRINUSE))]
    );
    assert!(*connected > 0, "{failure:?}");
    let msg = failure.to_string();
    assert!(msg.contains("could not listen on port 15006 ("), "{msg}");

    // 15001 taken: 15006 is ours, so the probe succeeds and says what it could not open.
    let ok = assert_ok(probe_with_taken(&[15001]), 15006, "127.0.0.6:15002");
    assert_eq!(
        ports_and_errnos(&ok.listen_errors),
        [(15001, Some(libc::EADDRINUSE))]
    );
}

#[kernel_test]
fn no_listener_when_both_ports_are_taken() {
    let failure = probe_with_taken(&[15001, 15006]).unwrap_err();
    let ProbeFailure::NoListener { errors } = &failure else {
        panic!("not NoListener: {failure:?}");
    };
    assert_eq!(
        ports_and_errnos(errors),
        [
            (15001, Some(libc::EADDRINUSE)),
            (15006, Some(libc::EADDRINUSE))
        ]
    );
    let msg = failure.to_string();
    assert!(
        msg.starts_with("no listener available: cannot listen on port 15001 ("),
        "{msg}"
    );
    assert!(msg.contains(", 15006 ("), "{msg}");
}

#[kernel_test]
fn custom_ports() {
    let cfg = CaptureConfig {
        envoy_port: 16001,
        inbound_capture_port: 16006,
        ..root_proxy()
    };
    let spec = ProbeSpec {
        envoy_port: 16001,
        inbound_capture_port: 16006,
        probe_port: 16002,
        ..spec(false)
    };
    assert_ok(probe_with(Some(&cfg), &spec), 16006, "127.0.0.6:16002");
}

/// Our capture for `cfg`, rules and routes, in the calling thread's namespace.
fn apply_here(cfg: &CaptureConfig) {
    let rs = redirect_testkit::plan_with(cfg, &SystemGroups).unwrap();
    redirect_kernel::capture::apply_in(
        &redirect_kernel::backend::Live::open().unwrap(),
        redirect_model::table::TABLE,
        &redirect_model::sidecar_routes(cfg),
        &rs,
    )
    .unwrap();
}
