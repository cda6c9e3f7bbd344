//! The plugin's log lines, on stderr and in `log_file`, cannot be forged by what a runtime or a
//! pod author passes (a pod name, a namespace name, a namespace path), and a `log_file` that is
//! not a regular file (a FIFO nobody reads, a directory) never blocks or fails an ADD.

use cni_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{cni_env as env, plugin_within, pod_ns, STATUS_CNI};
use redirect_testkit::kernel_test;

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

#[kernel_test]
fn outside_strings_never_forge_a_log_line() {
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

#[kernel_test]
fn a_log_file_that_is_a_fifo_or_a_directory_never_blocks_add() {
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
