//! New TCP connections per second through the captured outbound path of a network namespace.
//!
//! A listener on 0.0.0.0:PORT stands in for the proxy; a client thread running as a non-proxy
//! uid connects to `PREFIX.X.Y:80`, which only succeeds if the namespace's nat OUTPUT rules
//! redirect it to the listener. Prints one JSON line; exits 1 if more than 1% of the
//! connections fail or the listener did not accept about as many as the client made.
//!
//! Usage: connrate --netns /run/netns/NAME --seconds S [--uid 1000] [--port 15001]
//! [--dst-prefix 10.1]

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{setsockopt, sockopt};
use redirect_testkit::netns::become_ids;

/// Short, so that missing rules show up as failures within the run instead of stalling it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

struct Args {
    netns: String,
    seconds: f64,
    uid: u32,
    port: u16,
    prefix: [u8; 2],
}

fn main() {
    let args = parse_args();
    let accepted = Arc::new(AtomicU64::new(0));

    // The listener is never joined: it blocks in accept() and ends with the process.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    {
        let (ns, port, accepted) = (open_netns(&args.netns), args.port, accepted.clone());
        thread::spawn(move || {
            enter(&ns);
            let listener = listen(port)
                .unwrap_or_else(|e| fail(&format!("cannot listen on 0.0.0.0:{port}: {e}")));
            ready_tx.send(()).expect("main thread waits");
            loop {
                // Dropping the accepted socket closes it at once; reset ones still count.
                if listener.accept().is_ok() {
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    ready_rx.recv().expect("listener thread reports readiness");

    let ns = open_netns(&args.netns);
    let (uid, prefix, seconds) = (args.uid, args.prefix, args.seconds);
    let client = thread::spawn(move || {
        enter(&ns);
        // Thread-only credential change (raw syscalls): uid 1337 would bypass the capture.
        become_ids(uid, uid).unwrap_or_else(|e| fail(&format!("cannot become uid {uid}: {e}")));
        run_client(prefix, Duration::from_secs_f64(seconds))
    });
    let (ok, failed, elapsed, first_err) = client.join().expect("client thread panicked");

    // Give the listener a moment to drain its accept queue before comparing counts.
    let deadline = Instant::now() + Duration::from_secs(1);
    while accepted.load(Ordering::Relaxed) < ok && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let accepted = accepted.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    println!(
        "{{\"connections\": {ok}, \"seconds\": {secs:.3}, \"per_second\": {:.0}, \"failures\": {failed}, \"accepted\": {accepted}}}",
        ok as f64 / secs
    );

    let total = ok + failed;
    if total == 0 || failed * 100 > total {
        let err = first_err.unwrap_or_default();
        fail(&format!(
            "{failed} of {total} connections failed (first error: {err}); are the capture rules loaded?"
        ));
    }
    // Accepted ones prove the traffic reached the listener rather than something else on :80.
    if accepted.abs_diff(ok) * 100 > ok {
        fail(&format!(
            "client made {ok} connections but listener accepted {accepted}"
        ));
    }
}

/// Connects and resets until `duration` has passed: (successes, failures, elapsed, first error).
fn run_client(prefix: [u8; 2], duration: Duration) -> (u64, u64, Duration, Option<String>) {
    // SO_LINGER {on, 0}: close() sends RST, so no TIME_WAIT piles up on the client side.
    let reset = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let (mut ok, mut failed, mut first_err) = (0u64, 0u64, None);
    let start = Instant::now();
    let mut i: u32 = 0;
    while start.elapsed() < duration {
        // 65,536 destinations in rotation, so conntrack tuples rarely repeat.
        let [_, _, x, y] = i.to_be_bytes();
        i = i.wrapping_add(1);
        let dst = SocketAddr::from(([prefix[0], prefix[1], x, y], 80));
        match TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT) {
            Ok(s) => {
                setsockopt(&s, sockopt::Linger, &reset)
                    .unwrap_or_else(|e| fail(&format!("SO_LINGER: {e}")));
                ok += 1;
            }
            Err(e) => {
                failed += 1;
                first_err.get_or_insert_with(|| format!("{dst}: {e}"));
            }
        }
    }
    (ok, failed, start.elapsed(), first_err)
}

fn open_netns(path: &str) -> File {
    File::open(path).unwrap_or_else(|e| fail(&format!("cannot open --netns {path}: {e}")))
}

/// A listener with the largest backlog the kernel allows: std's 128 overflows when the
/// acceptor is briefly descheduled, and each dropped SYN then costs a 1 s retransmission.
fn listen(port: u16) -> nix::Result<TcpListener> {
    use nix::sys::socket::{bind, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(fd.as_raw_fd(), &SockaddrIn::new(0, 0, 0, 0, port))?;
    nix::sys::socket::listen(&fd, Backlog::MAXCONN)?;
    Ok(TcpListener::from(fd))
}

/// Moves the calling thread into the namespace (needs CAP_SYS_ADMIN, so before dropping ids).
fn enter(ns: &File) {
    setns(ns, CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| fail(&format!("cannot enter network namespace: {e}")));
}

fn parse_args() -> Args {
    let mut args = Args {
        netns: String::new(),
        seconds: 0.0,
        uid: 1000,
        port: 15001,
        prefix: [10, 1],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let bad = || -> ! { fail(&format!("bad value for {flag}: {value:?}")) };
        match flag.as_str() {
            "--netns" => args.netns = value.clone(),
            "--seconds" => {
                args.seconds = value.parse().unwrap_or_else(|_| bad());
                if !(args.seconds > 0.0 && args.seconds.is_finite()) {
                    bad()
                }
            }
            "--uid" => args.uid = value.parse().unwrap_or_else(|_| bad()),
            "--port" => args.port = value.parse().unwrap_or_else(|_| bad()),
            "--dst-prefix" => {
                let parts: Vec<u8> = value
                    .split('.')
                    .map(|p| p.parse().unwrap_or_else(|_| bad()))
                    .collect();
                args.prefix = parts.try_into().unwrap_or_else(|_| bad());
            }
            _ => fail(&format!("unknown argument {flag:?}")),
        }
    }
    if args.netns.is_empty() || args.seconds == 0.0 {
        fail("usage: connrate --netns /run/netns/NAME --seconds S [--uid 1000] [--port 15001] [--dst-prefix 10.1]");
    }
    args
}

fn fail(msg: &str) -> ! {
    eprintln!("connrate: {msg}");
    std::process::exit(1)
}
