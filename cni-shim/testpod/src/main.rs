//! `testpod`: what the real node's test pods run (no shell, no libc in their image).
//!
//! - `testpod listen PORT[,PORT...]`: the proxy's stand-in. Listens on every address, IPv4 and
//!   IPv6, on each port; answers each connection with one line, `landed <port> <original
//!   destination>` (the destination the client asked for, `SO_ORIGINAL_DST`, or `direct` when
//!   the connection was not redirected), and prints the same line.
//! - `testpod connect ADDR:PORT [--every SECONDS]`: the app. Connects, prints the line it gets
//!   (or the error), and with `--every` does it again and again; without, exits 0 on an answer.
//! - `testpod sleep`: nothing, for ever (a container that only holds the pod).
//! - `testpod ztunnel SOCKET`: ztunnel's stand-in for ambient mode (`ztunnel.rs`).

mod ztunnel;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt, SockaddrIn, SockaddrIn6};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("listen") if args.len() == 2 => listen(&args[1]),
        Some("connect") => connect(&args[1..]),
        Some("ztunnel") if args.len() == 2 => ztunnel::run(&args[1]),
        Some("sleep") => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        _ => {
            eprintln!("usage: testpod listen PORT[,PORT...] | connect ADDR:PORT [--every SECONDS] | sleep | ztunnel SOCKET");
            2
        }
    };
    std::process::exit(code);
}

fn listen(ports: &str) -> i32 {
    let mut threads = Vec::new();
    for port in ports.split(',') {
        let Ok(port) = port.parse::<u16>() else {
            eprintln!("testpod: not a port: {port}");
            return 2;
        };
        // [::] takes IPv4 too where the kernel maps it; 0.0.0.0 is tried when it does not.
        let listener =
            TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)));
        match listener {
            Ok(l) => threads.push(std::thread::spawn(move || serve(l, port))),
            Err(e) => {
                eprintln!("testpod: cannot listen on {port}: {e}");
                return 1;
            }
        }
    }
    println!("listening on {ports}");
    for t in threads {
        let _ = t.join();
    }
    0
}

fn serve(listener: TcpListener, port: u16) {
    for conn in listener.incoming().flatten() {
        let line = format!("landed {port} {}", original(&conn));
        println!("{line}");
        let mut conn = conn;
        let _ = writeln!(conn, "{line}");
    }
}

/// Where the client meant to go, before NAT; `direct` when nothing redirected it.
pub(crate) fn original(conn: &TcpStream) -> String {
    let local = conn.local_addr().ok();
    let v6 = matches!(local, Some(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_none());
    let dst: Option<SocketAddr> = if v6 {
        getsockopt(&conn.as_fd(), sockopt::Ip6tOriginalDst)
            .ok()
            .map(|a| SockaddrIn6::from(a).into())
    } else {
        getsockopt(&conn.as_fd(), sockopt::OriginalDst)
            .ok()
            .map(|a| SockaddrIn::from(a).into())
    };
    match (dst, local) {
        (Some(d), Some(l)) if d != unmapped(l) => d.to_string(),
        _ => "direct".into(),
    }
}

fn unmapped(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => a,
        },
        v4 => v4,
    }
}

fn connect(args: &[String]) -> i32 {
    let Some(Ok(addr)) = args.first().map(|a| a.parse::<SocketAddr>()) else {
        eprintln!("testpod connect: ADDR:PORT expected");
        return 2;
    };
    let every = match args.get(1..) {
        // Fractions too: 0.05 is 20 connections a second.
        Some([flag, secs]) if flag == "--every" => match secs.parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Some(Duration::from_secs_f64(s)),
            _ => {
                eprintln!("testpod connect: --every {secs:?}: a number of seconds above 0");
                return 2;
            }
        },
        Some([]) | None => None,
        _ => {
            eprintln!("testpod connect: only --every SECONDS may follow the address");
            return 2;
        }
    };
    loop {
        let answer = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).and_then(|s| {
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            let mut line = String::new();
            BufReader::new(s).read_line(&mut line)?;
            Ok(line)
        });
        match &answer {
            Ok(line) => println!("{addr}: {}", line.trim_end()),
            Err(e) => println!("{addr}: no answer: {e}"),
        }
        match every {
            Some(d) => std::thread::sleep(d),
            None => return i32::from(answer.is_err()),
        }
    }
}
