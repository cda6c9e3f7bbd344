//! The node agent's atomic writes under SIGKILL: a writer replacing a file over and over is
//! killed at random moments; the file is always one whole version, never a mix, and no
//! temporary file is left behind.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cni_testkit::Rng;

const WRITER_ENV: &str = "FAULTS_WRITER";
const SIZE: usize = 1 << 20;

/// The child side of `installer_killed_mid_write`: write all-A and all-B alternately for ever,
/// printing a line after each write.
fn writer_child(target: &Path) -> ! {
    use cni_node::atomic_file::{write_atomic, FileAttrs};
    let a = vec![b'A'; SIZE];
    let b = vec![b'B'; SIZE];
    let mut out = std::io::stdout();
    writeln!(out, "ready").unwrap();
    for i in 0u64.. {
        let contents = if i % 2 == 0 { &b } else { &a };
        write_atomic(target, contents, FileAttrs::mode(0o644)).unwrap();
        let _ = writeln!(out, "wrote {i}");
    }
    unreachable!()
}

fn temp_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(cni_node::atomic_file::TEMP_MARKER))
        .collect();
    v.sort();
    v
}

#[test]
fn installer_killed_mid_write() {
    if let Ok(target) = std::env::var(WRITER_ENV) {
        writer_child(Path::new(&target));
    }
    use cni_node::atomic_file::{write_atomic, FileAttrs};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let target = dir.path().join("10-redirect.conflist");
    write_atomic(&target, &vec![b'A'; SIZE], FileAttrs::mode(0o644)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng::new("killed writer");
    const KILLS: u32 = 50;
    let (mut all_a, mut all_b, mut writes_seen) = (0, 0, 0u64);
    let started = Instant::now();
    for k in 0..KILLS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "installer_killed_mid_write",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WRITER_ENV, &target)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Wait until the child is about to write, then kill it 0–20 ms later.
        loop {
            let l = lines.next().expect("child exited before writing").unwrap();
            if l.ends_with("ready") {
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        writes_seen += lines
            .map_while(Result::ok)
            .filter(|l| l.starts_with("wrote"))
            .count() as u64;
        let got = std::fs::read(&target).unwrap();
        assert_eq!(
            got.len(),
            SIZE,
            "kill {k}: torn file of {} bytes",
            got.len()
        );
        if got.iter().all(|&c| c == b'A') {
            all_a += 1;
        } else if got.iter().all(|&c| c == b'B') {
            all_b += 1;
        } else {
            panic!("kill {k}: the file mixes A and B");
        }
    }
    // What a killed writer leaves: its temporary file (hidden, named with its pid and a
    // counter). No CNI runtime reads it, and the next writer (another pid) is not blocked.
    let left = temp_files(dir.path());
    write_atomic(&target, b"after", FileAttrs::mode(0o644)).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"after");
    assert_eq!(
        temp_files(dir.path()),
        left,
        "the next write changed the leftovers"
    );
    let others: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.contains(cni_node::atomic_file::TEMP_MARKER))
        .collect();
    assert_eq!(others, ["10-redirect.conflist"]);
    eprintln!(
        "killed writer: {KILLS} SIGKILLs in {:?}, {writes_seen} complete writes by the children, \
         target checked {KILLS} times (all-A {all_a}, all-B {all_b}, never torn/empty); \
         {} temp files left behind (not removed by later writes): {:?}",
        started.elapsed(),
        left.len(),
        left.iter().take(3).collect::<Vec<_>>()
    );
}
