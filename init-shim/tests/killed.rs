//! A `redirect-init` killed at any moment (SIGKILL: the kubelet's, the OOM killer's) never
//! leaves the rules without the routes they need: TPROXY's policy routing is in place before
//! the table that marks packets for it is committed, so "the table is there" implies "its
//! routes are there". The next run (the init container's restart) completes what is missing.
//! `REDIRECT_RACE_RUNS` sets the number of kills (default 150).

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;
use redirect_testkit::istio::SIDECAR_ARGS;
use redirect_testkit::{kernel_test, TestNetns};

/// Istio's sidecar arguments with inbound TPROXY (mark 1337, route table 133).
fn args() -> Vec<&'static str> {
    SIDECAR_ARGS
        .iter()
        .map(|a| if *a == "REDIRECT" { "TPROXY" } else { a })
        .collect()
}

fn kills() -> usize {
    redirect_testkit::race_runs(150)
}

fn pod() -> TestNetns {
    let ns = TestNetns::with_prefix("rdkill");
    ns.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.66.0.2/24 dev eth0 && ip link set eth0 up");
    ns
}

/// (our table, the fwmark rule, the local route of table 133).
fn state(ns: &TestNetns) -> (bool, bool, bool) {
    let out = ns.sh(
        "nft list tables; echo ---; ip rule; echo ---; ip route show table 133 2>/dev/null; true",
    );
    let parts: Vec<&str> = out.split("---").collect();
    (
        parts[0].contains("redirect_capture"),
        parts[1].contains("fwmark 0x539 lookup 133"),
        parts[2].contains("local default dev lo"),
    )
}

fn run(ns: &TestNetns) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name(), BIN])
        .args(args())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

#[kernel_test]
fn a_killed_run_never_leaves_the_table_without_its_routes_and_the_next_run_completes_it() {
    // How long a whole run takes here and now (a few milliseconds, more on a loaded machine),
    // so that the kills spread over all of it.
    let mut whole: Vec<Duration> = (0..5)
        .map(|_| {
            let ns = pod();
            let start = Instant::now();
            assert!(run(&ns).status().unwrap().success(), "an uninterrupted run");
            start.elapsed()
        })
        .collect();
    whole.sort();
    let step = (whole[2] * 6 / 5 / 120).max(Duration::from_micros(50));
    let (mut table_seen, mut nothing_seen, mut kills_done) = (0, 0, 0);
    for i in 0..kills() as u32 {
        let ns = pod();
        let mut child = run(&ns).spawn().unwrap();
        // `ip netns exec` execs the program in place, so the PID is redirect-init's; spread
        // the kill over the whole run, and a little after, in 120 steps.
        std::thread::sleep(step * (i % 120));
        if child.kill().is_ok() {
            kills_done += 1;
        }
        let _ = child.wait();
        let (table, rule, route) = state(&ns);
        assert!(
            !table || (rule && route),
            "kill {i}: the table is there without its TPROXY routing (rule {rule}, route {route})"
        );
        if table {
            table_seen += 1;
        } else if !rule && !route {
            nothing_seen += 1;
        }
        // The restart completes the capture, whatever the kill left.
        let status = run(&ns).status().unwrap();
        assert!(status.success(), "kill {i}: the next run failed: {status}");
        assert_eq!(
            state(&ns),
            (true, true, true),
            "kill {i}: after the next run"
        );
    }
    eprintln!(
        "{kills_done} kills, {step:?} apart (a run takes {:?}): {table_seen} left the table \
         (with its routes), {nothing_seen} left nothing",
        whole[2]
    );
    assert!(
        table_seen > 0 && nothing_seen > 0,
        "the kills should land both before and after the commit: {table_seen} tables, {nothing_seen} empty"
    );
}
