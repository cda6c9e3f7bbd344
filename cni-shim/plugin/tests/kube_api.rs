//! The Kubernetes API path of redirect-cni (`cni_plugin::kube`) against a local HTTPS stand-in
//! for the API server: a CA and a server certificate made here with rcgen, a kubeconfig with
//! `certificate-authority-data` and a bearer token in a temporary directory, and recorded pod
//! JSON from `cni-shim/testkit/fixtures/`. The stand-in answers each connection once, from a script
//! (a pod, a status code, a reset, or silence) and records every request it read.

use cni_testkit as common;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni_plugin::kube::{fetch_pod, pod_info_from_json, FetchPolicy, KubeError};
use common::pki::{pki, pki_for, pki_with, reason, status_body, write_kubeconfig, Pki, TOKEN};

use cni_testkit::fixtures::ISTIO_POD;
use cni_testkit::fixtures::NATIVE_SIDECAR_POD;
use cni_testkit::fixtures::OPENSHIFT_POD;

/// A small policy so that failing tests stay fast.
fn quick(attempts: u32) -> FetchPolicy {
    FetchPolicy {
        attempts,
        interval: Duration::from_millis(50),
        request_timeout: Duration::from_secs(3),
        deadline: Duration::from_secs(60),
    }
}

// ---------------------------------------------------------------------------------------------
// The stand-in API server

/// What the stand-in does with one connection.
#[derive(Clone, Debug)]
enum Reply {
    /// 200 with this body.
    Ok(&'static str),
    /// This status with a Kubernetes `Status` body carrying `message`.
    Status(u16, String),
    /// This status with a plain text body (as a proxy or load balancer would answer).
    Plain(u16, &'static str),
    /// Reset the TCP connection (SO_LINGER 0) before any TLS.
    Reset,
    /// Complete TLS, read the request, never answer.
    Silence,
}

struct StandIn {
    addr: SocketAddr,
    /// Replies handed out (one per connection that got as far as its reply).
    hits: Arc<AtomicUsize>,
    /// The request heads read, in order.
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl StandIn {
    /// Serves `script` in order, one reply per connection, then `then` forever.
    fn start(pki: &Pki, script: Vec<Reply>, then: Reply) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let (config, h, r, s) = (
            pki.server.clone(),
            hits.clone(),
            requests.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = tcp else { continue };
                let reply = {
                    let mut script = script.lock().unwrap();
                    script.pop_front().unwrap_or_else(|| then.clone())
                };
                let (config, h, r, s) = (config.clone(), h.clone(), r.clone(), s.clone());
                std::thread::spawn(move || serve(tcp, config, reply, &h, &r, &s));
            }
        });
        StandIn {
            addr,
            hits,
            requests,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    reply: Reply,
    hits: &AtomicUsize,
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) {
    if stop.load(Ordering::SeqCst) {
        return;
    }
    if let Reply::Reset = reply {
        hits.fetch_add(1, Ordering::SeqCst);
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket and a correctly sized `linger` value.
        let rc = unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_LINGER");
        drop(tcp);
        return;
    }
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let conn = rustls::ServerConnection::new(config).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // Reading drives the handshake; a client that rejects our certificate ends here.
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&head).into_owned());
    hits.fetch_add(1, Ordering::SeqCst);
    let (code, body) = match reply {
        Reply::Ok(body) => (200, body.to_owned()),
        Reply::Status(code, message) => (code, status_body(code, &message)),
        Reply::Plain(code, text) => (code, text.to_owned()),
        Reply::Silence => {
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            return;
        }
        Reply::Reset => unreachable!(),
    };
    let response = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        reason(code),
        body.len()
    );
    let _ = tls.write_all(response.as_bytes());
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

fn forbidden_message(ns: &str, name: &str) -> String {
    format!(
        "pods \"{name}\" is forbidden: User \"system:serviceaccount:kube-system:redirect-cni\" \
         cannot get resource \"pods\" in API group \"\" in the namespace \"{ns}\""
    )
}

/// A stand-in, a kubeconfig for it, and the temporary directory holding it.
struct Setup {
    server: StandIn,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

fn setup(script: Vec<Reply>, then: Reply) -> Setup {
    let pki = pki();
    let server = StandIn::start(&pki, script, then);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &server.url(), &pki.ca_pem);
    Setup {
        server,
        kubeconfig,
        _dir: dir,
    }
}

/// The error's Display and Debug, checked free of the token.
fn describe(e: &KubeError) -> String {
    let text = format!("{e} / {e:?}");
    assert!(
        !text.contains(TOKEN),
        "the token leaked into an error: {text}"
    );
    text
}

// ---------------------------------------------------------------------------------------------
// Pods

#[test]
fn fetches_an_istio_injected_pod() {
    let s = setup(vec![], Reply::Ok(ISTIO_POD));
    let pod = fetch_pod(
        &s.kubeconfig,
        "bookinfo",
        "reviews-v1-5b5d6494f4-7xk2p",
        &quick(3),
    )
    .unwrap();

    assert_eq!(s.server.hits(), 1);
    let requests = s.server.requests();
    let head = requests[0].to_ascii_lowercase();
    let request_line = requests[0].lines().next().unwrap();
    assert_eq!(
        request_line,
        "GET /api/v1/namespaces/bookinfo/pods/reviews-v1-5b5d6494f4-7xk2p HTTP/1.1"
    );
    assert!(
        requests[0]
            .lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {TOKEN}"))),
        "no bearer token in {}",
        requests[0]
    );
    assert!(head.contains("user-agent: redirect-cni/"), "{head}");

    assert_eq!(pod.namespace, "bookinfo");
    assert_eq!(pod.name, "reviews-v1-5b5d6494f4-7xk2p");
    assert!(pod.annotations["sidecar.istio.io/status"].contains("\"istio-proxy\""));
    assert_eq!(
        pod.annotations["traffic.sidecar.istio.io/excludeOutboundPorts"],
        "15020"
    );
    assert_eq!(pod.labels["security.istio.io/tlsMode"], "istio");
    assert_eq!(pod.labels["app"], "reviews");

    let spec = pod.spec.as_ref().expect("spec");
    let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["reviews", "istio-proxy"]);
    let init: Vec<_> = spec
        .init_containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["istio-validation"]);

    let proxy = spec.container("istio-proxy").unwrap();
    assert_eq!(proxy.args[..2], ["proxy", "sidecar"]);
    assert_eq!(proxy.env["ISTIO_META_DNS_CAPTURE"], "true");
    assert_eq!(proxy.env["ISTIO_META_INTERCEPTION_MODE"], "REDIRECT");
    for from_field in ["POD_NAME", "POD_NAMESPACE", "INSTANCE_IP", "GOMEMLIMIT"] {
        assert!(
            !proxy.env.contains_key(from_field),
            "{from_field} has valueFrom and must be skipped"
        );
    }
    assert_eq!(proxy.run_as_user, Some(1337));
    assert_eq!(proxy.run_as_group, Some(1337));

    let validation = spec.container("istio-validation").unwrap();
    assert!(validation.args.iter().any(|a| a == "--run-validation"));
    assert_eq!(validation.run_as_user, Some(1337));

    let app = spec.container("reviews").unwrap();
    assert_eq!(app.env["LOG_DIR"], "/tmp/logs");
    assert_eq!(app.run_as_user, None);
    assert!(app.args.is_empty());

    // The API path and the recorded-JSON path agree.
    assert_eq!(pod, pod_info_from_json(ISTIO_POD).unwrap());
}

#[test]
fn fetches_an_openshift_pod() {
    let s = setup(vec![], Reply::Ok(OPENSHIFT_POD));
    let pod = fetch_pod(
        &s.kubeconfig,
        "bookinfo",
        "productpage-v1-7c9b5d8f6-q4m8d",
        &quick(3),
    )
    .unwrap();
    assert_eq!(s.server.hits(), 1);
    assert_eq!(pod.annotations["openshift.io/scc"], "restricted-v2");
    let spec = pod.spec.as_ref().unwrap();
    let proxy = spec.container("istio-proxy").unwrap();
    assert_eq!(proxy.run_as_user, Some(1_000_620_000));
    assert_eq!(proxy.run_as_group, None, "the SCC sets no runAsGroup");
    assert!(!proxy.env.contains_key("ISTIO_META_DNS_CAPTURE"));
    assert_eq!(
        spec.container("istio-validation").unwrap().run_as_user,
        Some(1_000_620_000)
    );
    assert_eq!(pod, pod_info_from_json(OPENSHIFT_POD).unwrap());
}

#[test]
fn fetches_a_native_sidecar_pod() {
    let s = setup(vec![], Reply::Ok(NATIVE_SIDECAR_POD));
    let pod = fetch_pod(
        &s.kubeconfig,
        "default",
        "httpbin-6f4c7d9b8-zt5wn",
        &quick(3),
    )
    .unwrap();
    assert_eq!(s.server.hits(), 1);
    let spec = pod.spec.as_ref().unwrap();
    let names: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["httpbin"]);
    let init: Vec<_> = spec
        .init_containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["istio-validation", "istio-proxy"]);
    // Found among the init containers.
    let proxy = spec.container("istio-proxy").unwrap();
    assert_eq!(proxy.env["ISTIO_META_ENABLE_HBONE"], "true");
    assert_eq!(
        (proxy.run_as_user, proxy.run_as_group),
        (Some(1337), Some(1337))
    );
    assert!(!proxy.env.contains_key("POD_NAME"));
    assert_eq!(pod, pod_info_from_json(NATIVE_SIDECAR_POD).unwrap());
}

// ---------------------------------------------------------------------------------------------
// Retries

#[test]
fn retries_503_until_the_pod_comes() {
    let s = setup(
        vec![
            Reply::Plain(503, "upstream connect error"),
            Reply::Status(
                503,
                "the server is currently unable to handle the request".into(),
            ),
            Reply::Status(429, "too many requests, please try again later".into()),
        ],
        Reply::Ok(ISTIO_POD),
    );
    let pod = fetch_pod(
        &s.kubeconfig,
        "bookinfo",
        "reviews-v1-5b5d6494f4-7xk2p",
        &quick(5),
    )
    .unwrap();
    assert_eq!(pod.name, "reviews-v1-5b5d6494f4-7xk2p");
    assert_eq!(s.server.hits(), 4);
}

#[test]
fn retries_reset_connections_until_the_pod_comes() {
    let s = setup(vec![Reply::Reset, Reply::Reset], Reply::Ok(ISTIO_POD));
    let pod = fetch_pod(
        &s.kubeconfig,
        "bookinfo",
        "reviews-v1-5b5d6494f4-7xk2p",
        &quick(5),
    )
    .unwrap();
    assert_eq!(pod.namespace, "bookinfo");
    assert_eq!(s.server.hits(), 3);
}

#[test]
fn gives_up_after_every_attempt_failed() {
    let s = setup(
        vec![],
        Reply::Status(503, "etcdserver: leader changed".into()),
    );
    let started = Instant::now();
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(3)).unwrap_err();
    let text = describe(&err);
    match &err {
        KubeError::Unavailable {
            server,
            attempts,
            last,
            ..
        } => {
            assert_eq!(server.trim_end_matches('/'), s.server.url());
            assert_eq!(*attempts, 3);
            assert!(last.contains("503"), "{last}");
            assert!(last.contains("leader changed"), "{last}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(s.server.hits(), 3);
    assert!(text.contains("3 attempt"), "{text}");
    // Two pauses of 50 ms between three attempts.
    assert!(started.elapsed() >= Duration::from_millis(100));
}

#[test]
fn not_found_is_not_retried() {
    let s = setup(
        vec![],
        Reply::Status(404, "pods \"reviews-gone\" not found".into()),
    );
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews-gone", &quick(5)).unwrap_err();
    describe(&err);
    assert!(
        matches!(&err, KubeError::NotFound { namespace, name } if namespace == "bookinfo" && name == "reviews-gone"),
        "{err:?}"
    );
    assert_eq!(s.server.hits(), 1);
}

#[test]
fn forbidden_is_not_retried_and_names_the_permission() {
    let s = setup(
        vec![],
        Reply::Status(403, forbidden_message("bookinfo", "reviews")),
    );
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err();
    let text = describe(&err);
    match &err {
        KubeError::Forbidden {
            namespace,
            name,
            detail,
        } => {
            assert_eq!((namespace.as_str(), name.as_str()), ("bookinfo", "reviews"));
            assert!(detail.contains("cannot get resource"), "{detail}");
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    assert!(text.contains("`get` on `pods`"), "{text}");
    assert_eq!(s.server.hits(), 1);
}

#[test]
fn unauthorized_is_not_retried() {
    let s = setup(vec![], Reply::Status(401, "Unauthorized".into()));
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err();
    let text = describe(&err);
    assert!(matches!(err, KubeError::Forbidden { .. }), "{err:?}");
    assert!(text.contains("401"), "{text}");
    assert!(text.contains("token"), "{text}");
    assert_eq!(s.server.hits(), 1);
}

#[test]
fn unreachable_server_is_unavailable() {
    // A port nothing listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("https://127.0.0.1:{port}");
    let kubeconfig = write_kubeconfig(dir.path(), &url, &pki().ca_pem);
    let started = Instant::now();
    let err = fetch_pod(&kubeconfig, "bookinfo", "reviews", &quick(3)).unwrap_err();
    let took = started.elapsed();
    let text = describe(&err);
    match &err {
        KubeError::Unavailable {
            server,
            attempts,
            elapsed,
            last,
            deadline_hit,
            ..
        } => {
            assert!(server.contains(&format!("127.0.0.1:{port}")), "{server}");
            assert_eq!(*attempts, 3);
            assert!(
                !deadline_hit,
                "3 quick attempts end well within the deadline"
            );
            assert!(*elapsed >= Duration::from_millis(100), "{elapsed:?}");
            assert!(!last.is_empty());
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("after 3 attempt"), "{text}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_silent_server_is_given_up_at_the_deadline_which_the_error_names() {
    let s = setup(vec![], Reply::Silence);
    // 30 attempts of 400 ms would take 12 s; the deadline cuts them at 1 s.
    let policy = FetchPolicy {
        attempts: 30,
        interval: Duration::from_millis(10),
        request_timeout: Duration::from_millis(400),
        deadline: Duration::from_millis(1000),
    };
    let started = Instant::now();
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &policy).unwrap_err();
    let took = started.elapsed();
    let text = describe(&err);
    match &err {
        KubeError::Unavailable {
            attempts,
            deadline_hit,
            ..
        } => {
            assert!(*deadline_hit, "{err:?}");
            assert!((2..=3).contains(attempts), "{err:?}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(
        text.contains("kube_deadline_ms") && text.contains("1000 ms"),
        "{text}"
    );
    assert!(took >= Duration::from_millis(950), "took {took:?}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    assert!(s.server.hits() <= 3, "{} requests", s.server.hits());
}

#[test]
fn a_silent_server_times_out_each_attempt() {
    let s = setup(vec![], Reply::Silence);
    let policy = FetchPolicy {
        attempts: 2,
        interval: Duration::from_millis(10),
        request_timeout: Duration::from_millis(300),
        deadline: Duration::from_secs(60),
    };
    let started = Instant::now();
    let err = fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &policy).unwrap_err();
    let took = started.elapsed();
    let text = describe(&err);
    assert!(
        matches!(&err, KubeError::Unavailable { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(
        text.contains("timeout") || text.contains("timed out"),
        "{text}"
    );
    assert_eq!(s.server.hits(), 2);
    assert!(took >= Duration::from_millis(600), "took {took:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn an_invalid_pod_name_makes_no_request() {
    let s = setup(vec![], Reply::Ok(ISTIO_POD));
    for (ns, name) in [
        ("bookinfo", "reviews?watch=true"),
        ("bookinfo", "../../secrets/x"),
        ("Bookinfo", "reviews"),
        ("", "reviews"),
        ("bookinfo", ""),
    ] {
        let err = fetch_pod(&s.kubeconfig, ns, name, &quick(3)).unwrap_err();
        assert!(
            matches!(err, KubeError::NotFound { .. }),
            "{ns}/{name}: {err:?}"
        );
    }
    assert_eq!(s.server.hits(), 0);
}

// ---------------------------------------------------------------------------------------------
// Kubeconfig and TLS

#[test]
fn a_missing_kubeconfig_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ZZZ-redirect-cni-kubeconfig");
    let err = fetch_pod(&path, "bookinfo", "reviews", &quick(3)).unwrap_err();
    let text = describe(&err);
    assert!(
        matches!(&err, KubeError::Config { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("does not exist"), "{text}");
    assert!(text.contains("installer"), "{text}");
    assert!(text.contains("`kubeconfig`"), "{text}");
}

#[test]
fn a_malformed_kubeconfig_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        // YAML that does not parse.
        "apiVersion: v1\nclusters: [\n".to_owned(),
        // Valid YAML with the token where a list belongs: the parser's message quotes it.
        format!("apiVersion: v1\nkind: Config\nusers: \"{TOKEN}\"\n"),
        format!("apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: {TOKEN}\n    username: [1, 2]\n"),
        // Parses, but names no server.
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{}}\nusers:\n- name: u\n  user:\n    token: {TOKEN}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"),
        // No current context.
        "apiVersion: v1\nkind: Config\nclusters: []\n".to_owned(),
        // Empty (an installer caught mid-write).
        String::new(),
    ];
    for (i, text) in cases.iter().enumerate() {
        let path = dir.path().join(format!("kubeconfig-{i}"));
        std::fs::write(&path, text).unwrap();
        let err = fetch_pod(&path, "bookinfo", "reviews", &quick(3)).unwrap_err();
        let shown = describe(&err);
        assert!(
            matches!(&err, KubeError::Config { path: p, .. } if *p == path),
            "case {i}: {err:?}"
        );
        assert!(
            shown.contains(&path.display().to_string()),
            "case {i}: {shown}"
        );
    }
}

#[test]
fn a_wrong_ca_fails_tls_verification_before_any_request() {
    let s = setup(vec![], Reply::Ok(ISTIO_POD));
    // The same server, but a kubeconfig trusting another CA: one with the same name (as after
    // a CA rotation; rustls sees a bad signature) and one with another name (unknown issuer).
    for (other, cause) in [
        (pki(), "BadSignature"),
        (pki_with("another CA", &["127.0.0.1"]), "UnknownIssuer"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = write_kubeconfig(dir.path(), &s.server.url(), &other.ca_pem);
        let err = fetch_pod(&kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err();
        let text = describe(&err);
        assert!(
            matches!(&err, KubeError::Config { path, .. } if *path == kubeconfig),
            "{err:?}"
        );
        assert!(text.contains("TLS verification"), "{text}");
        assert!(text.contains("failed"), "{text}");
        assert!(
            text.contains("not signed by the kubeconfig's certificate authority"),
            "{text}"
        );
        assert!(text.contains(cause), "{text}");
        assert!(text.contains("certificate-authority-data"), "{text}");
    }
    // No request (so no token) reached the server, and no retry was made.
    assert_eq!(s.server.hits(), 0);
    assert!(s.server.requests().is_empty());
}

#[test]
fn a_certificate_for_another_host_fails_tls_verification() {
    // Signed by the trusted CA, but for localhost only, and reached at 127.0.0.1.
    let pki = pki_for(&["localhost"]);
    let server = StandIn::start(&pki, vec![], Reply::Ok(ISTIO_POD));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &server.url(), &pki.ca_pem);
    let err = fetch_pod(&kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err();
    let text = describe(&err);
    assert!(matches!(err, KubeError::Config { .. }), "{err:?}");
    assert!(text.contains("TLS verification"), "{text}");
    assert!(text.contains("does not name the host"), "{text}");
    assert_eq!(server.hits(), 0);
}

// ---------------------------------------------------------------------------------------------
// Secrets

/// Everything logged at TRACE level while `f` runs, by every crate.
fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    let logs = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(logs.clone())
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    (out, logs.text())
}

#[test]
fn the_token_never_shows_in_logs() {
    // A server as the API server is: it never repeats credentials. Nothing that kube, hyper,
    // tower or we log at any level may carry the token we send.
    let s = setup(
        vec![
            Reply::Reset,
            Reply::Status(
                503,
                "the server is currently unable to handle the request".into(),
            ),
            Reply::Ok(ISTIO_POD),
            Reply::Status(403, forbidden_message("bookinfo", "reviews")),
            Reply::Plain(500, "upstream connect error"),
        ],
        Reply::Status(404, "pods \"reviews\" not found".into()),
    );
    let (results, logs) = capture_logs(|| {
        [
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).map(|_| ()),
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).map(|_| ()),
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).map(|_| ()),
        ]
    });
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(results[1], Err(KubeError::Forbidden { .. })),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(results[2], Err(KubeError::NotFound { .. })),
        "{:?}",
        results[2]
    );
    assert!(
        logs.contains("retrying") && logs.contains("kube_client"),
        "not everything was logged, so this test would see nothing: {logs}"
    );
    assert!(
        !logs.contains(TOKEN),
        "the token leaked into the logs:\n{logs}"
    );
    assert!(
        !logs.contains(&TOKEN[10..40]),
        "part of the token leaked into the logs:\n{logs}"
    );
    // The server did receive it, as a header, on every request.
    assert_eq!(s.server.hits(), 6);
    assert!(s.server.requests().iter().all(|r| r.contains(TOKEN)));
}

#[test]
fn a_token_echoed_by_the_server_is_scrubbed_from_errors_and_our_logs() {
    // A hostile or broken server repeats the token in every answer.
    let echo = format!("bad token {TOKEN}");
    let s = setup(
        vec![
            Reply::Status(503, echo.clone()),
            Reply::Status(401, echo.clone()),
            Reply::Status(403, echo.clone()),
            Reply::Status(500, echo.clone()),
        ],
        Reply::Status(500, echo.clone()),
    );
    let (errors, logs) = capture_logs(|| {
        [
            // 503 then 401: retried once, then Forbidden.
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err(),
            // 403: Forbidden.
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(5)).unwrap_err(),
            // 500, 500: Unavailable after two attempts.
            fetch_pod(&s.kubeconfig, "bookinfo", "reviews", &quick(2)).unwrap_err(),
        ]
    });
    assert!(
        matches!(errors[0], KubeError::Forbidden { .. }),
        "{:?}",
        errors[0]
    );
    assert!(
        matches!(errors[1], KubeError::Forbidden { .. }),
        "{:?}",
        errors[1]
    );
    assert!(
        matches!(errors[2], KubeError::Unavailable { attempts: 2, .. }),
        "{:?}",
        errors[2]
    );
    for e in &errors {
        let text = describe(e);
        assert!(text.contains("bad token <redacted>"), "{text}");
    }
    // Our own log lines (the retries) are scrubbed too. (kube_client's debug line
    // "Unsuccessful: ErrorResponse {..}" repeats the server's message as sent.)
    let ours: Vec<&str> = logs.lines().filter(|l| l.contains("cni_plugin")).collect();
    assert!(
        ours.iter().any(|l| l.contains("bad token <redacted>")),
        "{logs}"
    );
    assert!(ours.iter().all(|l| !l.contains(TOKEN)), "{ours:#?}");
    assert_eq!(s.server.hits(), 5);
}

/// Collects everything a tracing subscriber writes.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Proxies from the environment

/// The runtime passes its environment on to CNI plugins; an HTTPS_PROXY there (set for image
/// pulls) must not send the API request elsewhere, nor fail it. Runs again in a child process
/// (this test alone, `REDIRECT_TEST_KUBECONFIG` set), so that setting the variable does not race
/// with the other tests; the child does the request.
#[test]
fn https_proxy_from_the_environment_is_ignored() {
    if let Some(kubeconfig) = std::env::var_os("REDIRECT_TEST_KUBECONFIG") {
        assert!(std::env::var_os("HTTPS_PROXY").is_some());
        let pod = fetch_pod(
            Path::new(&kubeconfig),
            "bookinfo",
            "reviews-v1-5b5d6494f4-7xk2p",
            &quick(1),
        )
        .unwrap();
        assert_eq!(pod.name, "reviews-v1-5b5d6494f4-7xk2p");
        return;
    }
    let s = setup(vec![], Reply::Ok(ISTIO_POD));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "https_proxy_from_the_environment_is_ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDIRECT_TEST_KUBECONFIG", &s.kubeconfig)
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("https_proxy", "http://127.0.0.1:9")
        .status()
        .unwrap();
    assert!(status.success(), "the child failed: {status}");
    assert_eq!(s.server.hits(), 1);
}

// ---------------------------------------------------------------------------------------------
// Recorded JSON

#[test]
fn pod_info_from_json_rejects_what_is_not_a_pod() {
    let not_json = pod_info_from_json("{\"kind\": ").unwrap_err();
    assert!(not_json.contains("not a Kubernetes v1 Pod"), "{not_json}");
    let service = pod_info_from_json(
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "b"}}"#,
    )
    .unwrap_err();
    assert!(service.contains("Service"), "{service}");
    let nameless = pod_info_from_json(
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "b"}}"#,
    )
    .unwrap_err();
    assert!(nameless.contains("metadata.name"), "{nameless}");
    let no_namespace =
        pod_info_from_json(r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}"#)
            .unwrap_err();
    assert!(
        no_namespace.contains("metadata.namespace"),
        "{no_namespace}"
    );
}

#[test]
fn env_from_a_reference_hides_an_earlier_literal() {
    let pod = pod_info_from_json(
        r#"{
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "b"},
            "spec": {"containers": [{"name": "istio-proxy", "env": [
                {"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
                {"name": "ISTIO_META_DNS_CAPTURE", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "k"}}},
                {"name": "INVALID_DROP", "value": "false"},
                {"name": "INVALID_DROP", "value": "true"},
                {"name": "EMPTY"}
            ]}]}
        }"#,
    )
    .unwrap();
    let proxy = pod.spec.as_ref().unwrap().container("istio-proxy").unwrap();
    assert!(!proxy.env.contains_key("ISTIO_META_DNS_CAPTURE"));
    assert_eq!(
        proxy.env["INVALID_DROP"], "true",
        "the later definition wins"
    );
    assert_eq!(proxy.env["EMPTY"], "");
    assert_eq!(proxy.run_as_user, None);
}

/// The plugin end to end on the API path: the runtime sends no annotations, so ADD reads the
/// pod from the stand-in and takes the proxy UID from istio-proxy's runAsUser (OpenShift's
/// per-namespace UID), and the rules in the pod's namespace carry it.
#[redirect_testkit::kernel_test]
fn plugin_add_reads_the_pod_when_the_runtime_sends_no_annotations() {
    let s = setup(
        vec![Reply::Status(503, "warming up".into())],
        Reply::Ok(OPENSHIFT_POD),
    );
    let ns = redirect_testkit::TestNetns::new();
    ns.sh("ip link add eth0 type veth peer name p0 && ip addr add 10.44.0.5/24 dev eth0 && ip link set eth0 up");
    let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "kubeconfig": s.kubeconfig, "kube_attempts": 3, "kube_interval_ms": 50});
    let mut child = std::process::Command::new(common::plugin_bin())
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_NETNS", ns.path())
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=bookinfo;K8S_POD_NAME=productpage-v1-7c9b5d8f6-q4m8d",
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ADD failed: {}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(s.server.hits(), 2, "one 503, then the pod");
    assert!(
        stderr.contains("reading the pod from the Kubernetes API"),
        "{stderr}"
    );
    let table = ns.sh("nft list table inet redirect_capture");
    assert!(
        table.contains("skuid 1000620000"),
        "the proxy UID is not OpenShift's:\n{table}"
    );
    assert!(
        !table.contains("skuid 1337 "),
        "1337 used as the proxy UID:\n{table}"
    );
}

// ---------------------------------------------------------------------------------------------
// The plugin's log lines from the API path

/// The retries of the kube client (`tracing` events in `cni_plugin::kube`) are the plugin's log
/// lines: on stderr and in the log file, in its format, at `log_level` debug. Before one
/// subscriber served the whole process, they went nowhere.
#[test]
fn the_plugins_log_carries_the_kube_clients_retries() {
    // An API server that refuses connections: the port of a listener already closed.
    let refused = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", refused.local_addr().unwrap());
    drop(refused);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &url, &pki().ca_pem);
    let log = dir.path().join("plugin.log");
    let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "kubeconfig": kubeconfig, "kube_attempts": 3, "kube_interval_ms": 50,
        "log_level": "debug", "log_file": log});
    let args = "K8S_POD_NAMESPACE=bookinfo;K8S_POD_NAME=reviews-v1";
    let out = common::plugin(
        &common::cni_env("ADD", "/nonexistent", args),
        &conf.to_string(),
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.json()["code"], 102, "{out:?}");
    let retry = "debug\tredirect-cni\tgetting the pod failed; retrying in 50ms";
    let retries: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with(retry))
        .collect();
    assert_eq!(retries.len(), 2, "3 attempts, 2 retries:\n{}", out.stderr);
    for (n, line) in retries.iter().enumerate() {
        let fields = format!("server={url}/ attempt={} attempts=3 error=", n + 1);
        assert!(line.contains(&fields), "{fields:?} not in {line:?}");
    }
    // The kube client's own lines: its failures (error) show, named by their target; nothing
    // of another crate below warn does, though ours show from debug.
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("error\tredirect-cni\tkube_client::")),
        "{}",
        out.stderr
    );
    for line in out.stderr.lines() {
        let (level, rest) = line.split_once('\t').unwrap();
        let message = rest.strip_prefix("redirect-cni\t").unwrap();
        let other_crate = message.split_once(": ").is_some_and(|(t, _)| {
            t.contains("::") && !t.contains(' ') && !t.starts_with("cni_plugin")
        });
        assert!(
            !(other_crate && matches!(level, "debug" | "info")),
            "{line:?}"
        );
    }
    let file = std::fs::read_to_string(&log).unwrap();
    let stamped: Vec<&str> = file
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(_, line)| line))
        .filter(|l| l.starts_with(retry))
        .collect();
    assert_eq!(stamped, retries, "the file has other lines:\n{file}");
    assert!(!out.stdout.contains(retry), "a log line on stdout");
}

/// A warning of the API path shows at the default level (info): nothing else is configured.
#[test]
fn the_plugins_log_carries_the_kube_paths_warnings_at_the_default_level() {
    let conf = serde_json::json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni",
        "kubeconfig": "/nonexistent/kubeconfig"});
    let args = "K8S_POD_NAMESPACE=Book_Info;K8S_POD_NAME=reviews-v1";
    let out = common::plugin(
        &common::cni_env("ADD", "/nonexistent", args),
        &conf.to_string(),
    );
    assert_eq!(out.code, 1, "{out:?}");
    let warning = "warn\tredirect-cni\tnot a valid Kubernetes namespace or pod name; the API \
         server is not asked namespace=\"Book_Info\" name=\"reviews-v1\"";
    assert!(
        out.stderr.lines().any(|l| l == warning),
        "{warning:?} not in:\n{}",
        out.stderr
    );
}
