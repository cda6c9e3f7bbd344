//! What the plugin's event to the node agent costs it (`cni_plugin::events::Event::send`), and
//! each log line it forwards (`LogLine::send`): one non-blocking datagram, with no agent (no
//! socket in the run directory), an agent that reads, and an agent that does not read (its
//! socket bound, its queue full). No root needed.

use std::os::unix::net::UnixDatagram;
use std::path::Path;

use cni_plugin::events::{Event, LogLine, Phases, SOCKET_NAME};
use criterion::{criterion_group, criterion_main, Criterion};

fn event() -> Event {
    Event {
        command: "ADD".into(),
        code: 0,
        pod: Some("shop/web-7d9f8b6c5d-x2k4q".into()),
        total_us: 1_650,
        phases: Phases {
            config_us: Some(45),
            apply_us: Some(900),
            ..Phases::default()
        },
    }
}

fn run_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("rd-bench-events-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Fills the queue of the socket at `path` until a send would block.
fn fill(path: &Path) -> usize {
    let s = UnixDatagram::unbound().unwrap();
    s.set_nonblocking(true).unwrap();
    let mut n = 0;
    while s.send_to(b"x", path).is_ok() {
        n += 1;
    }
    n
}

fn bench(c: &mut Criterion) {
    let e = event();
    let mut g = c.benchmark_group("event_send");

    let absent = run_dir("absent");
    g.bench_function("no agent", |b| b.iter(|| e.send(&absent)));

    let reading = run_dir("reading");
    let sock = UnixDatagram::bind(reading.join(SOCKET_NAME)).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while sock.recv(&mut buf).is_ok() {}
    });
    g.bench_function("agent reading", |b| b.iter(|| e.send(&reading)));

    let hung = run_dir("hung");
    let _bound = UnixDatagram::bind(hung.join(SOCKET_NAME)).unwrap();
    assert!(fill(&hung.join(SOCKET_NAME)) > 0);
    g.bench_function("agent not reading, queue full", |b| {
        b.iter(|| e.send(&hung))
    });
    g.finish();
    // A forwarded log line (an ADD forwards about three).
    let line = || LogLine {
        level: "info".into(),
        command: "ADD".into(),
        pod: Some("shop/web-7d9f8b6c5d-x2k4q".into()),
        line: "ADD shop/web-7d9f8b6c5d-x2k4q: end: captured (1.7 ms)".into(),
    };
    let mut g = c.benchmark_group("log_line_send");
    g.bench_function("no agent", |b| b.iter(|| line().send(&absent)));
    g.bench_function("agent reading", |b| b.iter(|| line().send(&reading)));
    g.bench_function("agent not reading, queue full", |b| {
        b.iter(|| line().send(&hung))
    });
    g.finish();
    for d in [absent, reading, hung] {
        let _ = std::fs::remove_dir_all(d);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
