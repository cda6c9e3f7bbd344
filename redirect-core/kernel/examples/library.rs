//! The library crates (redirect-model, redirect-kernel) used directly: Istio's default sidecar capture (`-p 15001 -z 15006 -u 1337 -m
//! REDIRECT -i '*' -b '*' -d 15090,15021,15020`) planned, programmed over netlink into a
//! throwaway network namespace, read back, exercised with real connections, and removed. Run as
//! root: `cargo run -p redirect-kernel --example library`. (The project's demo is
//! `bash scripts/demo.sh`.)

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use redirect_model::render::nft_script;
use redirect_model::{plan, CaptureConfig};
use redirect_testkit::TestNetns;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("library example: needs root (it creates a network namespace and programs nftables in it)");
        std::process::exit(1);
    }
    let cfg = CaptureConfig::istio_sidecar_default();
    let rs = plan(&cfg).expect("Istio's defaults are valid");
    println!(
        "== plan for Istio's default sidecar config: {} rules",
        rs.rule_count()
    );
    println!("{}", nft_script(&rs));

    let ns = TestNetns::new();
    println!("== throwaway namespace {}", ns.path().display());
    ns.sh("ip link add d0 type veth peer name d1 && ip addr add 10.99.0.1/24 dev d0 && ip link set d0 up && ip link set d1 up");

    let t = Instant::now();
    redirect_testkit::nft_in(ns.path())
        .apply(&rs)
        .map(|_| ())
        .expect("apply");
    println!(
        "== applied over netlink in {:?} (one atomic batch, every ACK checked)",
        t.elapsed()
    );
    let diff = redirect_testkit::nft_in(ns.path())
        .diff(&rs)
        .expect("read back");
    println!(
        "== read back: {}",
        if diff.is_empty() {
            "equal to the plan".to_string()
        } else {
            format!("{diff:?}")
        }
    );

    let results = redirect_kernel::netns::Netns::open(ns.path())
        .and_then(|ns| {
            ns.run(|| {
                let listener = TcpListener::bind("0.0.0.0:15001").expect("bind 15001");
                listener.set_nonblocking(true).unwrap();
                let dst = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 99, 0, 2), 80));
                let app = probe(&listener, dst, 1000);
                let proxy = probe(&listener, dst, 1337);
                (app, proxy)
            })
        })
        .expect("enter namespace");
    println!("== app (uid 1000) -> 10.99.0.2:80: {}", results.0);
    println!("== proxy (uid 1337) -> 10.99.0.2:80: {}", results.1);

    redirect_testkit::nft_in(ns.path())
        .remove()
        .expect("remove");
    println!(
        "== removed: table present = {}",
        redirect_testkit::nft_in(ns.path())
            .read()
            .unwrap()
            .is_some()
    );
    let ok = results
        .0
        .starts_with("redirected to 15001, original destination 10.99.0.2:80")
        && !results.1.starts_with("redirected");
    if !ok {
        eprintln!("demo: unexpected outcome");
        std::process::exit(1);
    }
    println!("== demo passed");
}

/// Connect to `dst` as `uid` from a thread of our own and say where the connection landed.
fn probe(listener: &TcpListener, dst: SocketAddr, uid: u32) -> String {
    std::thread::scope(|s| {
        let client = s.spawn(move || {
            // Per-thread credentials: the raw syscall changes this thread only.
            unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
            match TcpStream::connect_timeout(&dst, Duration::from_millis(300)) {
                Ok(mut c) => {
                    let mut b = String::new();
                    let _ = c.read_to_string(&mut b);
                    b
                }
                Err(e) => format!("not redirected ({e})"),
            }
        });
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline && !client.is_finished() {
            if let Ok((mut conn, _)) = listener.accept() {
                let orig = original_dst(&conn);
                let _ = conn.write_all(
                    format!("redirected to 15001, original destination {orig}").as_bytes(),
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        client
            .join()
            .unwrap_or_else(|_| "client thread failed".into())
    })
}

fn original_dst(conn: &TcpStream) -> String {
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            80,
            &mut addr as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return "unknown".into();
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    format!("{ip}:{}", u16::from_be(addr.sin_port))
}
