//! The bad-input harness the programs' tests share: each bad row runs against one pod
//! namespace, is judged by the caller (its exit code, and what its error must name), and
//! must leave the namespace exactly as it was ([`snapshot`]); a row
//! that changed it is reported and the namespace put back, so the next row starts alike.

use crate::binary::snapshot;
use crate::TestNetns;

/// What one run of a program gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The exit code; -1 when a signal ended the process.
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error, where a panic would show.
    pub stderr: String,
}

impl Outcome {
    /// The outcome of a finished process.
    pub fn of(out: &std::process::Output) -> Outcome {
        Outcome {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A pod's namespace after its primary network (a veth with 10.33.0.5/24, up), so that a row
/// accepted by mistake would really apply.
pub fn pod_ns() -> TestNetns {
    let ns = TestNetns::new();
    ns.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.33.0.5/24 dev eth0 && ip link set eth0 up");
    ns
}

/// Runs every row of `kind` in one fresh [`pod_ns`]: `run` runs it, `judge` lists what is
/// wrong with its outcome (`what` names the row in messages); then the namespace must be as
/// before. Returns every failure and prints the counts.
pub fn check_rows<R>(
    kind: &str,
    rows: &[R],
    what: impl Fn(&R) -> &str,
    run: impl Fn(&TestNetns, &R) -> Outcome,
    judge: impl Fn(&R, &Outcome) -> Vec<String>,
) -> Vec<String> {
    let ns = pod_ns();
    let before = snapshot(&ns);
    let mut failures = Vec::new();
    for r in rows {
        let out = run(&ns, r);
        let what = what(r);
        if out.stderr.contains("panicked") {
            failures.push(format!("{what}: panic\n{}", tail(&out.stderr)));
        }
        failures.extend(judge(r, &out).into_iter().map(|f| format!("{what}: {f}")));
        let after = snapshot(&ns);
        if after != before {
            failures.push(format!("{what}: the namespace changed:\n{after}"));
            ns.sh("nft flush ruleset; ip rule flush; ip rule add from all lookup main pref 32766; ip rule add from all lookup default pref 32767; ip addr del ::6/128 dev lo 2>/dev/null; true");
        }
    }
    eprintln!(
        "{kind}: {} rows tried, {} states compared, {} failures",
        rows.len(),
        rows.len(),
        failures.len()
    );
    failures
}

/// Fails the test with every failure, one per line.
pub fn assert_none(failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `s` cut to 300 bytes for a message, saying how long it was.
pub fn short(s: &str) -> String {
    if s.len() <= 300 {
        return s.to_string();
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes)", &s[..end], s.len())
}

/// The last three lines of `s`, [`short`].
pub fn tail(s: &str) -> String {
    let t: Vec<&str> = s.lines().rev().take(3).collect();
    short(&t.into_iter().rev().collect::<Vec<_>>().join("\n"))
}
