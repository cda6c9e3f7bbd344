//! `phases [RUNS]` (root): where the time of one pod's capture goes, phase by phase, in a fresh
//! namespace as a pod has it (lo up, a veth with an address), next to `iptables-legacy-restore`
//! of Istio's rules in the same loop. Each run: a new namespace for ours (the library's calls
//! that redirect-init makes, each timed), a new one for the whole `redirect-init` process, a new
//! one for `iptables-legacy-restore`; medians in µs. `RESTORE` names Istio's rules
//! (default: bench-data's istio-default.restore in $DATA), `BIN` the static binaries' folder (run from a fresh copy).
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use redirect_core::{Apply, Capture, Foreign, Namespace, SystemGroups};
use redirect_testkit::TestNetns;

fn pod_ns() -> TestNetns {
    let ns = TestNetns::with_prefix("rdph");
    ns.sh("ip link set lo up && ip link add v0 type veth peer name v1 && ip addr add 10.99.0.2/24 dev v0 && ip link set v0 up");
    ns
}

fn us(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

/// The library's calls of a default redirect-init run, each timed.
fn ours(cfg: &redirect_core::ValidConfig) -> Vec<(&'static str, u64)> {
    let t_all = Instant::now();
    let t = Instant::now();
    let live = Namespace::current().unwrap();
    let open = us(t);
    let t = Instant::now();
    let addrs = live.addresses().unwrap();
    let host = redirect_core::pod_facts::detect_host_address(&addrs, false).unwrap();
    let addresses = us(t);
    let t = Instant::now();
    let cfg = cfg.clone().with_ipv6(host.ipv6);
    let rs = cfg.plan(&SystemGroups).unwrap();
    let plan = us(t);
    let t = Instant::now();
    let capture = Capture::Sidecar(cfg.clone());
    // What redirect-init's apply reads first: the foreign rules, then ours.
    assert!(live.foreign().unwrap().is_empty());
    assert!(live.read(&capture).unwrap().is_none());
    let existing = us(t);
    let t = Instant::now();
    let applied = live
        .apply_with(&capture, Apply::foreign(Foreign::Keep))
        .unwrap();
    assert_eq!(applied.ruleset, rs);
    let apply = us(t);
    vec![
        ("open sockets", open),
        ("addresses", addresses),
        ("plan", plan),
        ("read existing", existing),
        ("apply", apply),
        ("library total", us(t_all)),
    ]
}

fn whole(ns: &TestNetns, cmd: &[&str]) -> u64 {
    ns.run(|| {
        let t = Instant::now();
        let st = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        let d = us(t);
        assert!(st.success(), "{cmd:?}: {st}");
        d
    })
}

/// One redirect-cni ADD from this (the host's) namespace into a fresh pod namespace, the
/// config on stdin, as a runtime runs it.
fn add(bin: &std::path::Path, conf: &str) -> u64 {
    use std::io::Write;
    let ns = pod_ns();
    let mut cmd = Command::new(bin.join("redirect-cni"));
    cmd.env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "bench")
        .env("CNI_NETNS", ns.path())
        .env("CNI_IFNAME", "v0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.as_bytes())
        .unwrap();
    let st = child.wait().unwrap();
    let d = us(t);
    assert!(st.success(), "ADD: {st}");
    d
}

/// The binaries of `dir` copied to a new folder, run from there as from an image a node
/// unpacked (see benches/lib.sh's `our_binaries`: the files a build just wrote ran slower here).
fn fresh_copy(dir: &std::path::Path) -> PathBuf {
    let to = std::env::temp_dir().join(format!("rdphases.{}", std::process::id()));
    std::fs::create_dir_all(&to).unwrap();
    for name in ["redirect-init", "redirect-cni"] {
        std::fs::copy(dir.join(name), to.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()));
    }
    to
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().unwrap())
        .unwrap_or(50);
    let built = PathBuf::from(std::env::var("BIN").unwrap_or("target/static/x86_64".into()));
    let bin = fresh_copy(&built);
    let restore = std::env::var("RESTORE").expect("RESTORE=istio-default.restore");
    let conf =
        std::fs::read_to_string(std::env::var("CNI_CONF").expect("CNI_CONF=cni-default.json"))
            .unwrap();
    let init = bin.join("redirect-init");
    let init = init.to_str().unwrap();
    let args = [
        init,
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-x",
        "",
        "-b",
        "*",
        "-d",
        "15090,15021,15020",
        "-o",
        "15020",
    ];
    let cfg = redirect_benches::sidecar_default().validated().unwrap();
    let mut rows: Vec<(&'static str, Vec<u64>)> = Vec::new();
    for _ in 0..runs {
        let ns = pod_ns();
        let phases = ns.run(|| ours(&cfg));
        for (name, v) in phases {
            match rows.iter_mut().find(|r| r.0 == name) {
                Some(r) => r.1.push(v),
                None => rows.push((name, vec![v])),
            }
        }
        let mut push = |name: &'static str, v: u64| match rows.iter_mut().find(|r| r.0 == name) {
            Some(r) => r.1.push(v),
            None => rows.push((name, vec![v])),
        };
        push(
            "redirect-init --version (process)",
            whole(&pod_ns(), &[init, "--version"]),
        );
        push("redirect-init default (process)", whole(&pod_ns(), &args));
        let mut skip = args.to_vec();
        skip.push("--skip-rule-apply");
        push(
            "redirect-init --skip-rule-apply (process)",
            whole(&pod_ns(), &skip),
        );
        push("redirect-cni ADD (process)", add(&bin, &conf));
        push(
            "iptables-legacy-restore (process)",
            whole(
                &pod_ns(),
                &["iptables-legacy-restore", "--noflush", &restore],
            ),
        );
    }
    for (name, v) in rows {
        println!("{name:40} {:>6} µs", median(v));
    }
    let _ = std::fs::remove_dir_all(&bin);
}
