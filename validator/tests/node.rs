//! `redirect-validate node` against agents that answer badly (issue 47, item 7): each test is a
//! one-connection server (TCP on 127.0.0.1, or a unix socket) that answers as a broken, slow or
//! hostile agent would, and the program must end, within its deadline and its memory, with a
//! clear message, printing nothing raw from the answer.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redirect-validate");
/// The agent's socket when no flag names another (the chart's CNI_AGENT_RUN_DIR).
const DEFAULT_SOCKET: &str = "/var/run/redirect-cni/debug.sock";

/// A node view with one pod that needs attention; `why` is ztunnel's refusal.
fn view(name: &str, why: &str) -> String {
    serde_json::json!({
        "node": "worker-3", "at": "2026-11-27T22:00:00Z",
        "pods": [
            {"namespace": "shop", "name": name, "uid": "u2", "kind": "ambient",
             "state": "pending", "attention": format!("ztunnel refused it: {why}"),
             "ips": [], "rules": {"at": "2026-11-27T22:00:00Z", "differences": []},
             "last_repair": null,
             "ztunnel": {"connection": 3, "acked": false, "refused": why}}
        ]
    })
    .to_string()
}

/// Reads the request's head (up to its blank line).
fn read_request<S: std::io::Read>(s: S) {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while r.read_line(&mut line).is_ok_and(|n| n > 0) {
        if line == "\r\n" {
            return;
        }
        line.clear();
    }
}

/// An agent on 127.0.0.1 that `answer`s one connection, after reading its request.
fn tcp_agent(answer: impl FnOnce(&mut TcpStream) + Send + 'static) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            read_request(&s);
            answer(&mut s);
        }
    });
    url
}

/// An agent on a unix socket in a fresh folder; the socket's path.
fn unix_agent(
    answer: impl FnOnce(&mut std::os::unix::net::UnixStream) + Send + 'static,
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "rdnode-view-{}-{:?}",
        std::process::id(),
        Instant::now()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("debug.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            read_request(&s);
            answer(&mut s);
        }
    });
    path
}

/// `redirect-validate node args`, killed (and the test failed) if it runs past `limit`; its
/// output and how long it ran.
fn node(args: &[&str], limit: Duration) -> (Output, Duration) {
    let (out, took, _) = node_measured(args, limit);
    (out, took)
}

/// [`node`], and the highest resident memory seen in its `/proc` status (VmHWM, sampled every
/// few milliseconds until it exits: a lower bound of its peak), in KiB.
fn node_measured(args: &[&str], limit: Duration) -> (Output, Duration, u64) {
    let start = Instant::now();
    let child = Command::new(BIN)
        .arg("node")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let status = format!("/proc/{pid}/status");
    let mut peak = 0;
    loop {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(out) => return (out.unwrap(), start.elapsed(), peak),
            Err(mpsc::RecvTimeoutError::Timeout) if start.elapsed() < limit => {
                let hwm = std::fs::read_to_string(&status)
                    .ok()
                    .and_then(|t| {
                        t.lines()
                            .find_map(|l| l.strip_prefix("VmHWM:"))
                            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                    })
                    .unwrap_or(0);
                peak = peak.max(hwm);
            }
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                panic!("redirect-validate node {args:?} still running after {limit:?}: killed");
            }
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A chunked answer whose chunk boundaries fall inside multibyte characters is joined whole:
/// the names come out as they were (it panicked, slicing text by byte counts).
#[test]
fn a_chunked_answer_cut_inside_a_character_is_joined_whole() {
    let body = view("café-ünïcödé", "ネームスペース not found");
    let bytes = body.as_bytes().to_vec();
    // Cut right after the first byte of 'é' and inside the katakana.
    let mut cuts = [body.find('é').unwrap() + 1, body.find('ネ').unwrap() + 2];
    cuts.sort();
    let [cut1, cut2] = cuts;
    let agent = tcp_agent(move |s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
        for part in [&bytes[..cut1], &bytes[cut1..cut2], &bytes[cut2..]] {
            let _ = write!(s, "{:x}\r\n", part.len());
            let _ = s.write_all(part);
            let _ = s.write_all(b"\r\n");
        }
        let _ = s.write_all(b"0\r\n\r\n");
    });
    let (out, _) = node(&["--agent", &agent], Duration::from_secs(20));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(stdout.contains("shop/café-ünïcödé"), "{stdout}");
    assert!(
        stdout.contains("ztunnel refused it: ネームスペース not found"),
        "{stdout}"
    );
}

/// An answer that is not UTF-8 is refused, naming where it stops being text.
#[test]
fn an_answer_that_is_not_utf8_is_refused_naming_the_offset() {
    let agent = tcp_agent(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{\"a\":\xff}");
    });
    let (out, _) = node(&["--agent", &agent], Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not UTF-8") && stderr.contains("byte 5") && stderr.contains(&agent),
        "{stderr}"
    );
}

/// A 100 MB answer (valid JSON, no length given, as a stream) is refused at the cap, without
/// reading on, in memory a 64 MiB container has (it took 221 MiB and printed the table).
#[test]
fn a_100_mb_answer_is_refused_at_the_cap() {
    let agent = tcp_agent(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"node\": \"n\", \"pods\": [], \"pad\": \"");
        let pad = vec![b'x'; 1 << 20];
        for _ in 0..100 {
            if s.write_all(&pad).is_err() {
                return;
            }
        }
        let _ = s.write_all(b"\"}");
    });
    let (out, took, peak) = node_measured(&["--agent", &agent], Duration::from_secs(30));
    let stderr = text(&out.stderr);
    eprintln!(
        "100 MB answer: exit {:?} after {took:?}, peak RSS (VmHWM) {peak} KiB",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the answer exceeds 16 MiB") && stderr.contains(&agent),
        "{stderr}"
    );
    assert!(
        peak < 48 * 1024,
        "peak RSS {peak} KiB: not within a 64 MiB container"
    );

    // Said at once when the answer gives its length.
    let agent = tcp_agent(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 104857600\r\n\r\n{");
        std::thread::sleep(Duration::from_secs(30));
    });
    let (out, took) = node(&["--agent", &agent], Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the answer exceeds 16 MiB") && stderr.contains("104857600"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    // And a chunked one, counted as it comes.
    let agent = tcp_agent(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let pad = vec![b' '; 1 << 20];
        for _ in 0..100 {
            if write!(s, "{:x}\r\n", pad.len()).is_err()
                || s.write_all(&pad).is_err()
                || s.write_all(b"\r\n").is_err()
            {
                return;
            }
        }
    });
    let (out, _) = node(&["--agent", &agent], Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the answer exceeds 16 MiB"), "{stderr}");
}

/// A server that sends a byte a second forever: the fetch ends at its deadline (15 s for the
/// whole fetch), saying so, however often bytes come (each read was bounded, never the fetch).
#[test]
fn a_trickling_agent_is_given_up_at_the_deadline() {
    let agent = tcp_agent(|s| {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\n");
        loop {
            if s.write_all(b"X").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let (out, took) = node(&["--agent", &agent], Duration::from_secs(25));
    let stderr = text(&out.stderr);
    eprintln!(
        "trickle: exit {:?} after {took:?}: {stderr}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        took >= Duration::from_secs(14) && took < Duration::from_secs(17),
        "{took:?}"
    );
    assert!(
        stderr.contains(&agent) && stderr.contains("15 s"),
        "{stderr}"
    );
}

/// ztunnel's refusal text (and a pod's name) holding terminal escapes: what is printed holds
/// none of them raw, in the table, in `--json`, or on stderr.
#[test]
fn escapes_in_the_answer_reach_the_terminal_escaped() {
    let forged = "\u{1b}[2J\u{1b}[Hall good\u{9b}31m\u{7f}\u{202e}";
    let body = view("web\u{1b}[1A", forged);
    for json in [false, true] {
        let body = body.clone();
        let agent = tcp_agent(move |s| {
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        });
        let mut args = vec!["--agent", agent.as_str()];
        if json {
            args.push("--json");
        }
        let (out, _) = node(&args, Duration::from_secs(20));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
        for raw in ['\u{1b}', '\u{9b}', '\u{7f}', '\u{202e}'] {
            assert!(
                !stdout.contains(raw) && !stderr.contains(raw),
                "{raw:?} printed raw (--json {json}): {stdout:?}"
            );
        }
        if json {
            // The same document, its controls written as JSON escapes.
            let back: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(back["pods"][0]["ztunnel"]["refused"], forged, "{stdout}");
        } else {
            assert!(
                stdout.contains("ztunnel refused it: \\u{1b}[2J\\u{1b}[Hall good\\u{9b}31m"),
                "{stdout}"
            );
            assert!(stdout.contains("shop/web\\u{1b}[1A"), "{stdout}");
        }
    }

    // A refusal's text quoted in an error is escaped too.
    let agent = tcp_agent(|s| {
        let body = "not found\u{1b}[2K\rall good\n";
        let _ = write!(
            s,
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    });
    let (out, _) = node(&["--agent", &agent], Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("404") && stderr.contains("not found\\u{1b}[2K"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\r'),
        "{stderr:?}"
    );
}

/// The agent's socket is read as the agent serves it (hyper, a length given), and is the
/// default target.
#[test]
fn the_agents_socket_is_read_and_is_the_default() {
    let body = view("api", "no");
    let socket = unix_agent(move |s| {
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\ndate: now\r\n\r\n{body}",
            body.len()
        );
    });
    let (out, _) = node(
        &["--socket", socket.to_str().unwrap()],
        Duration::from_secs(20),
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("! shop/api: ztunnel refused it: no"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(socket.parent().unwrap());

    if std::path::Path::new(DEFAULT_SOCKET).exists() {
        eprintln!("NOTICE: {DEFAULT_SOCKET} exists here (an agent on this machine): its refusal not tested");
        return;
    }
    let (out, _) = node(&[], Duration::from_secs(20));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(DEFAULT_SOCKET) && stderr.contains("kubectl -n istio-system exec"),
        "{stderr}"
    );
}
