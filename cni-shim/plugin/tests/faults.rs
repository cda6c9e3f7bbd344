//! Fault tests of the plugin binary: the pod namespace deleted while ADD runs, no privilege,
//! ADD/DEL/CHECK racing on one namespace, ADD repeated. (The node agent's writes under
//! SIGKILL: cni-node's `faults`.)

use cni_testkit as common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cni_env, mesh_conf, plugin, plugin_bin, pod_ns, Out, Rng, ARGS};
use redirect_testkit::binary::snapshot;
use redirect_testkit::kernel_test;

fn env<'a>(cmd: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
    cni_env(cmd, netns, ARGS)
}

/// A mesh pod's conf (no prevResult, as Multus runs a standalone conf).
fn spawn(cmd: &mut Command, env: &[(&str, &str)], stdin: &str) -> Child {
    cmd.env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn redirect-cni");
    // The plugin may die before reading stdin: a broken pipe here is not the test's failure.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child
}

fn finish(child: Child, what: &str) -> Out {
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.signal().is_none(),
        "{what}: killed by signal {:?}; stderr: {}",
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr)
    );
    Out {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The host (the test process's namespace): what the plugin must never program.
fn host_state() -> String {
    let sh = |c: &str| {
        let o = Command::new("sh").args(["-c", c]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    format!(
        "{}\n{}\n{}\n{}",
        sh("nft list ruleset"),
        sh("ip rule"),
        sh("ip -6 rule"),
        sh("ip -6 addr show dev lo")
    )
}

/// A CNI error on stdout with one of `codes`; returns the code.
fn cni_error(out: &Out, codes: &[u64], what: &str) -> u64 {
    assert_eq!(out.code, 1, "{what}: exit {}: {}", out.code, out.stdout);
    let e = out.json();
    let code = e["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: no code: {e}"));
    assert!(
        codes.contains(&code),
        "{what}: code {code} not in {codes:?}: {e}\n{}",
        out.stderr
    );
    assert!(
        e["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {e}"
    );
    assert!(e["cniVersion"].is_string(), "{what}: {e}");
    code
}

#[kernel_test]
fn the_namespace_disappears_during_add() {
    let host_before = host_state();
    let conf = mesh_conf();
    let mut rng = Rng::new("netns race");
    // Delete within the time an ADD takes, so the deletion lands before, during and after.
    let probe = pod_ns();
    let t = Instant::now();
    let out = plugin(&env("ADD", probe.path().to_str().unwrap()), &conf);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let add_us = t.elapsed().as_micros() as u64;
    eprintln!("netns race: one ADD takes {add_us} us");
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    const RUNS: u32 = 30;
    for i in 0..RUNS {
        let ns = pod_ns();
        let path = ns.path().to_str().unwrap().to_string();
        let delay = Duration::from_micros(rng.below(add_us / 3 + 1));
        let name = ns.name().to_string();
        // Most runs delete in-process (umount + unlink, what `ip netns del` does, but within
        // microseconds), started just before the plugin; every 5th run uses `ip netns del`.
        let with_ip = i % 5 == 4;
        let p2 = path.clone();
        let deleter = std::thread::spawn(move || {
            std::thread::sleep(delay);
            if with_ip {
                let st = Command::new("ip")
                    .args(["netns", "del", &name])
                    .status()
                    .unwrap();
                assert!(st.success(), "ip netns del {name}");
            } else {
                nix::mount::umount2(p2.as_str(), nix::mount::MntFlags::MNT_DETACH).unwrap();
                std::fs::remove_file(&p2).unwrap();
            }
        });
        let child = spawn(&mut Command::new(plugin_bin()), &env("ADD", &path), &conf);
        let what = format!("run {i} (ns deleted after {delay:?})");
        let out = finish(child, &what);
        deleter.join().unwrap();
        assert!(
            !out.stdout.is_empty(),
            "{what}: empty stdout; stderr: {}",
            out.stderr
        );
        let key = if out.code == 0 {
            assert_eq!(
                out.json(),
                serde_json::json!({"cniVersion":"1.0.0","dns":{}}),
                "{what}"
            );
            "success".to_string()
        } else {
            // 3: the namespace was gone when opened; 5: it went while being entered/programmed.
            let code = cni_error(&out, &[3, 5], &what);
            let e = out.json();
            let text = format!("{} {}", e["msg"], e["details"]);
            assert!(
                text.contains(&path),
                "{what}: the error does not name {path}: {text}"
            );
            format!("error code {code}")
        };
        *outcomes.entry(key).or_default() += 1;
        assert_eq!(
            host_state(),
            host_before,
            "{what}: the host namespace changed"
        );
    }
    eprintln!(
        "netns race: {RUNS} ADDs raced with the deletion of their namespace (in-process umount+unlink, every 5th `ip netns del`; faults injected: {RUNS}), outcomes {outcomes:?}, \
         host state checked {RUNS} times: unchanged"
    );
}

#[kernel_test]
fn no_permission_is_a_cni_error_and_touches_nothing() {
    let ns = pod_ns();
    let path = ns.path().to_str().unwrap().to_string();
    let before = snapshot(&ns);
    let variants: [(&str, &[&str]); 3] = [
        (
            "uid 65534, no capabilities",
            &[
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ],
        ),
        (
            "root without CAP_NET_ADMIN/CAP_SYS_ADMIN",
            &["--inh-caps=-all", "--bounding-set=-net_admin,-sys_admin"],
        ),
        (
            "root without CAP_NET_ADMIN (can enter, cannot program)",
            &["--inh-caps=-all", "--bounding-set=-net_admin"],
        ),
    ];
    for (what, args) in variants {
        let mut cmd = Command::new("setpriv");
        cmd.args(args).arg(plugin_bin());
        let out = finish(spawn(&mut cmd, &env("ADD", &path), &mesh_conf()), what);
        eprintln!("{what}: exit {}: {}", out.code, out.stdout);
        assert_ne!(out.code, 0, "{what}: succeeded without privilege");
        cni_error(&out, &[3, 5], what);
        let e = out.json();
        let text = format!("{} {}", e["msg"], e["details"]).to_lowercase();
        assert!(
            text.contains("not permitted") || text.contains("eperm") || text.contains("permission"),
            "{what}: the error does not name the missing permission: {text}"
        );
        if text.contains("enter") {
            assert!(
                text.contains(&path),
                "{what}: the error does not name {path}: {text}"
            );
        }
        assert!(
            text.contains("cap_sys_admin") || text.contains("cap_net_admin"),
            "{what}: the error does not say which capability is needed: {text}"
        );
        assert_eq!(snapshot(&ns), before, "{what}: the pod namespace changed");
    }
    eprintln!("no permission: 3 unprivileged ADDs, 3 CNI errors, 3 snapshots unchanged");
}

#[kernel_test]
fn concurrent_add_del_check_on_one_namespace() {
    let ns = pod_ns();
    let path = ns.path().to_str().unwrap().to_string();
    let conf = mesh_conf();
    let out = plugin(&env("ADD", &path), &conf);
    assert_eq!(out.code, 0, "{}", out.stdout);
    let expected = ns.sh("nft list ruleset");
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    let mut procs = 0;
    for round in 0..3 {
        // 8 ADD, 8 CHECK and 4 DEL, interleaved so they start mixed.
        let order: Vec<&str> = (0..8)
            .flat_map(|i| {
                let mut v = vec!["ADD", "CHECK"];
                if i % 2 == 0 {
                    v.push("DEL");
                }
                v
            })
            .collect();
        assert_eq!(order.len(), 20);
        let children: Vec<(&str, Child)> = order
            .iter()
            .map(|c| {
                (
                    *c,
                    spawn(&mut Command::new(plugin_bin()), &env(c, &path), &conf),
                )
            })
            .collect();
        for (i, (cmd, child)) in children.into_iter().enumerate() {
            let what = format!("round {round}, {cmd} #{i}");
            let out = finish(child, &what);
            procs += 1;
            let key = if out.code == 0 {
                if cmd == "ADD" {
                    assert_eq!(
                        out.json(),
                        serde_json::json!({"cniVersion":"1.0.0","dns":{}}),
                        "{what}"
                    );
                } else {
                    assert_eq!(out.stdout, "", "{what}");
                }
                format!("{cmd} ok")
            } else {
                // CHECK: 100 when the table is missing or being replaced by a DEL/ADD in flight.
                // 11 (try again later) is the only transient error any command may return.
                let codes: &[u64] = if cmd == "CHECK" { &[100, 11] } else { &[11] };
                format!("{cmd} code {}", cni_error(&out, codes, &what))
            };
            *outcomes.entry(key).or_default() += 1;
        }
    }
    let out = plugin(&env("ADD", &path), &conf);
    assert_eq!(out.code, 0, "final ADD: {}", out.stdout);
    let out = plugin(&env("CHECK", &path), &conf);
    assert_eq!(out.code, 0, "final CHECK: {}", out.stdout);
    assert_eq!(
        ns.sh("nft list ruleset"),
        expected,
        "the table after the storm"
    );
    eprintln!(
        "concurrency: 3 rounds, {procs} racing processes, outcomes {outcomes:?}; final ADD+CHECK ok, ruleset equal"
    );
}

/// DEL must succeed when the capture is already gone (CNI spec), also when another DEL (or an
/// ADD's replace) removes it concurrently: `nft::remove` dumps the table, then deletes it, and a
/// DEL that loses the race between the two gets ENOENT, which means "already gone".
#[kernel_test]
fn racing_dels_all_succeed() {
    let ns = pod_ns();
    let path = ns.path().to_str().unwrap().to_string();
    let conf = mesh_conf();
    let mut failed = Vec::new();
    for round in 0..10 {
        let out = plugin(&env("ADD", &path), &conf);
        assert_eq!(out.code, 0, "{}", out.stdout);
        let children: Vec<(&str, Child)> = (0..16)
            .map(|i| if i % 2 == 0 { "DEL" } else { "ADD" })
            .map(|c| {
                (
                    c,
                    spawn(&mut Command::new(plugin_bin()), &env(c, &path), &conf),
                )
            })
            .collect();
        for (i, (c, child)) in children.into_iter().enumerate() {
            let out = finish(child, c);
            if out.code != 0 {
                failed.push(format!("round {round}, {c} {i}: {}", out.stdout));
            }
        }
    }
    eprintln!(
        "racing DELs: 10 rounds of 8 DEL + 8 ADD, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:#?}");
}

#[kernel_test]
fn add_repeated_is_idempotent() {
    let ns = pod_ns();
    let path = ns.path().to_str().unwrap().to_string();
    let conf = mesh_conf();
    let mut first = None;
    for i in 0..5 {
        let out = plugin(&env("ADD", &path), &conf);
        assert_eq!(out.code, 0, "ADD {i}: {}", out.stdout);
        let snap = snapshot(&ns);
        match &first {
            None => first = Some(snap),
            Some(f) => assert_eq!(&snap, f, "ADD {i} changed the namespace"),
        }
    }
    let out = plugin(&env("CHECK", &path), &conf);
    assert_eq!(out.code, 0, "CHECK: {}", out.stdout);
    eprintln!("ADD repeated: 5 ADDs, 4 snapshots compared equal to the first, CHECK ok");
}
