//! The plugin's log lines, on stderr and in `log_file`, cannot be forged by what a runtime or a
//! pod author passes (a pod name, a namespace name, a namespace path), and a `log_file` that is
//! not a regular file (a FIFO nobody reads, a directory) never blocks or fails an ADD.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cni_env as env, pod_ns, Out, BIN, STATUS_CNI};
use redirect_testkit::kernel_tests_enabled;

const FORGED_TIME: &str = "2026-01-01T00:00:00.000Z";

fn conf(log_file: &Path) -> String {
    serde_json::json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
        "log_file": log_file,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": STATUS_CNI}}})
    .to_string()
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rdc-logs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the plugin; fails the test if it has not exited within `limit`.
fn plugin_within(limit: Duration, vars: &[(&str, &str)], stdin: &str) -> Out {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the plugin did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every stderr line is one of ours: `level<TAB>redirect-cni<TAB>message` with no further TAB;
/// every file line is that after the time this run wrote it.
fn assert_unforged(what: &str, stderr: &str, file: &str) {
    for line in stderr.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert!(
            fields.len() == 3
                && ["debug", "info", "warn", "error"].contains(&fields[0])
                && fields[1] == "redirect-cni",
            "{what}: a stderr line not of ours: {line:?}\n{stderr}"
        );
    }
    for line in file.lines() {
        assert!(
            !line.starts_with(FORGED_TIME) && line.split('\t').count() == 4,
            "{what}: a file line not of ours: {line:?}\n{file}"
        );
    }
    assert!(
        stderr.contains("\\tFORGED") && file.contains("\\tFORGED"),
        "{what}: the forged text should be there, escaped:\n{stderr}\n{file}"
    );
}

#[test]
fn outside_strings_never_forge_a_log_line() {
    if !kernel_tests_enabled() {
        return;
    }
    let ns = pod_ns();
    let p = ns.path().to_str().unwrap().to_string();
    let dir = temp("forge");
    for brk in ["\n", "\r\n"] {
        let forged = format!("cart{brk}{FORGED_TIME}\terror\tredirect-cni\tFORGED");
        let name_args = format!("K8S_POD_NAMESPACE=default;K8S_POD_NAME={forged}");
        let ns_args = format!("K8S_POD_NAMESPACE={forged};K8S_POD_NAME=web-0");
        let bad_path = format!("/run/netns/nope{forged}");
        let ok_args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
        let cases = [
            ("K8S_POD_NAME", "ADD", p.as_str(), name_args.as_str()),
            ("K8S_POD_NAMESPACE", "ADD", p.as_str(), ns_args.as_str()),
            ("CNI_NETNS (ADD)", "ADD", bad_path.as_str(), ok_args),
            ("CNI_NETNS (DEL)", "DEL", bad_path.as_str(), ok_args),
        ];
        for (what, cmd, netns, args) in cases {
            let file = dir.join("plugin.log");
            let _ = std::fs::remove_file(&file);
            let out = plugin_within(
                Duration::from_secs(30),
                &env(cmd, netns, args),
                &conf(&file),
            );
            let logged = std::fs::read_to_string(&file).unwrap_or_default();
            assert_unforged(&format!("{what} with {brk:?}"), &out.stderr, &logged);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_file_that_is_a_fifo_or_a_directory_never_blocks_add() {
    if !kernel_tests_enabled() {
        return;
    }
    let dir = temp("fifo");
    let fifo = dir.join("plugin.log");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for (what, path, why) in [
        ("a FIFO nobody reads", &fifo, "a FIFO that nobody reads"),
        ("a directory", &dir, "Is a directory"),
    ] {
        let ns = pod_ns();
        let p = ns.path().to_str().unwrap().to_string();
        let args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0";
        let out = plugin_within(Duration::from_secs(20), &env("ADD", &p, args), &conf(path));
        assert_eq!(out.code, 0, "{what}: {}", out.stderr);
        let warned: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("log_file"))
            .collect();
        assert_eq!(
            warned.len(),
            1,
            "{what}: one line about the file:\n{}",
            out.stderr
        );
        assert!(
            warned[0].starts_with("warn\tredirect-cni\tlog_file ") && warned[0].contains(why),
            "{what}: {}",
            warned[0]
        );
        assert!(out.stderr.contains("captured"), "{what}: {}", out.stderr);
        assert!(
            ns.sh("nft list tables").contains("redirect_capture"),
            "{what}: no rules"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
