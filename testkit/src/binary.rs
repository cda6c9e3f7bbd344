//! Running one of our programs inside a test namespace (as a given user, with a private
//! `/etc/group` and `/etc/resolv.conf`), and reading the namespace's whole capture-related state
//! so a test can tell whether anything changed. Used by the suites of redirect-init and
//! redirect-validate.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use super::istio::group_file;
use super::TestNetns;

static FILES: AtomicU32 = AtomicU32::new(0);

fn temp_file(stem: &str, content: &str) -> PathBuf {
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("rdi-{stem}-{}-{n}", std::process::id()));
    std::fs::write(&p, content).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p
}

/// How to run the binary.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// The program's arguments.
    pub args: Vec<String>,
    /// The variables it gets besides `PATH` (the rest of the environment is cleared).
    pub env: Vec<(String, String)>,
    /// The content of `/etc/resolv.conf` the binary sees (default: an empty file).
    pub resolv_conf: String,
    /// Run as this uid/gid (no supplementary groups), like Istio's validation container.
    pub as_user: Option<(u32, u32)>,
}

impl Run {
    /// A run with these arguments and the defaults for the rest.
    pub fn args(args: &[&str]) -> Run {
        Run {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Run::default()
        }
    }

    /// The same run with the variable `k` set to `v`.
    pub fn env(mut self, k: &str, v: &str) -> Run {
        self.env.push((k.into(), v.into()));
        self
    }

    /// The same run with `text` as its `/etc/resolv.conf`.
    pub fn resolv(mut self, text: &str) -> Run {
        self.resolv_conf = text.into();
        self
    }

    /// The same run as `uid`/`gid`, without supplementary groups.
    pub fn user(mut self, uid: u32, gid: u32) -> Run {
        self.as_user = Some((uid, gid));
        self
    }
}

/// The binary's result.
#[derive(Debug)]
pub struct Ran {
    /// The exit code; -1 when a signal ended the process.
    pub code: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Ran {
    /// The result, after failing the test (naming `what`, with stderr) unless the exit code is 0.
    pub fn expect_ok(self, what: &str) -> Ran {
        assert_eq!(self.code, 0, "{what}: exit {}\n{}", self.code, self.stderr);
        self
    }
}

/// Run the program `bin` inside `ns` (through `ip netns exec`), in a private mount namespace whose
/// `/etc/group` also knows `java` and `ftp` (Istio's owner-group test cases name them) and
/// whose `/etc/resolv.conf` is `run.resolv_conf`. The environment is cleared except PATH.
pub fn run_in(bin: &str, ns: &TestNetns, run: &Run) -> Ran {
    let group_file = group_file();
    let resolv_file = temp_file("resolv", &run.resolv_conf);
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        ns.name(),
        "unshare",
        "-m",
        "--propagation",
        "private",
    ]);
    cmd.args([
        "sh",
        "-c",
        r#"g="$0"; r="$1"; shift; mount --bind "$g" /etc/group && mount --bind "$r" /etc/resolv.conf && exec "$@""#,
    ]);
    cmd.arg(&group_file).arg(&resolv_file);
    if let Some((uid, gid)) = run.as_user {
        cmd.args([
            "setpriv",
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
        ]);
    }
    cmd.arg(bin).args(&run.args);
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in &run.env {
        cmd.env(k, v);
    }
    let out: Output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin} in {}: {e}", ns.name()));
    let _ = std::fs::remove_file(&group_file);
    let _ = std::fs::remove_file(&resolv_file);
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Everything capture may touch in a namespace, as text: the nftables ruleset, both iptables
/// variants in both families, policy routing rules, route tables and addresses.
pub fn snapshot(ns: &TestNetns) -> String {
    let mut out = String::new();
    for cmd in [
        "nft list ruleset",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
        "iptables-nft-save",
        "ip6tables-nft-save",
        "ip -4 rule",
        "ip -6 rule",
        "ip -4 route show table all",
        "ip -6 route show table all",
        "ip addr",
    ] {
        let text = ns
            .try_sh(cmd)
            .unwrap_or_else(|e| format!("({cmd} failed: {e})"));
        // iptables-save prints a timestamp comment; it is not state.
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        out.push_str(&format!("== {cmd}\n{text}"));
    }
    out
}

/// `snapshot` without what cannot touch a packet: iptables tables and nft tables that hold no
/// rule, only built-in chains with the ACCEPT policy (iptables creates them on first use and
/// neither Istio's cleanup nor ours removes them).
pub fn snapshot_effective(ns: &TestNetns) -> String {
    snapshot_effective_of(&snapshot(ns))
}

/// [`snapshot_effective`] of a [`snapshot`] taken earlier.
pub fn snapshot_effective_of(snap: &str) -> String {
    let mut out = String::new();
    let mut section = String::new();
    let mut block: Vec<&str> = Vec::new();
    let flush = |out: &mut String, section: &str, block: &mut Vec<&str>| {
        let has_rules = if section.contains("-save") {
            block
                .iter()
                .any(|l| l.starts_with("-A") || (l.starts_with(':') && !l.contains(" ACCEPT ")))
        } else if section.contains("nft list") {
            block.iter().any(|l| {
                let t = l.trim();
                !(t.is_empty()
                    || t == "}"
                    || t.starts_with("table ")
                    || t.starts_with("chain ")
                    || t.starts_with("type ") && t.ends_with("policy accept;"))
            })
        } else {
            true
        };
        if has_rules {
            for l in block.iter() {
                out.push_str(l);
                out.push('\n');
            }
        }
        block.clear();
    };
    for line in snap.lines() {
        if let Some(name) = line.strip_prefix("== ") {
            flush(&mut out, &section, &mut block);
            section = name.to_string();
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let starts_block = if section.contains("-save") {
            line.starts_with('*')
        } else if section.contains("nft list") {
            line.starts_with("table ")
        } else {
            false
        };
        if starts_block {
            flush(&mut out, &section, &mut block);
        }
        block.push(line);
    }
    flush(&mut out, &section, &mut block);
    out
}
