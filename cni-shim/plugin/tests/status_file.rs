//! STATUS reads the node agent's status file (`<cni_agent_run_dir>/agent-ready`) as the
//! agent's own or not at all: whatever else sits at that path (a FIFO, a link to /dev/zero or
//! to a secret, a directory, a 50 MB file, a file of another user, a hard link to a secret)
//! answers "not ready" (code 50) at once, quotes nothing of it, and never blocks. A kernel test:
//! STATUS asks nf_tables in this namespace (CAP_NET_ADMIN), and a file of another user is made.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use cni_testkit::{plugin_within, Out};
use redirect_testkit::kernel_test;

const SECRET: &str = "hunter2-secret-line";

fn status(run: &Path) -> Out {
    let conf = serde_json::json!({"cniVersion": "1.1.0", "name": "podnet", "type": "redirect-cni",
        "cni_agent_run_dir": run});
    plugin_within(
        Duration::from_secs(5),
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/opt/cni/bin")],
        &conf.to_string(),
    )
}

fn not_ready(run: &Path, what: &str, needle: &str) {
    let started = Instant::now();
    let out = status(run);
    let took = started.elapsed();
    assert_eq!(out.code, 1, "{what}: exit {}: {}", out.code, out.stdout);
    let e = out.json();
    assert_eq!(e["code"], 50, "{what}: {e}");
    let text = format!("{} {}", e["msg"], e["details"]);
    assert!(text.contains(needle), "{what}: {text}");
    assert!(
        !text.contains(SECRET),
        "{what}: the secret is quoted: {text}"
    );
    assert!(!out.stderr.contains(SECRET), "{what}: the secret is logged");
    assert!(
        took < Duration::from_secs(2),
        "{what}: STATUS took {took:?}"
    );
}

#[kernel_test]
fn anything_but_the_agents_file_is_not_ready_and_quoted_nowhere() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    fs::create_dir(&run).unwrap();
    let ready = run.join("agent-ready");
    let secret = d.path().join("secret");
    fs::write(&secret, format!("{SECRET}\n")).unwrap();

    // The agent's own words pass, and no file at all is "no agent here".
    fs::write(&ready, "ready\n").unwrap();
    assert_eq!(status(&run).code, 0);
    fs::write(&ready, "not ready: the CNI config is not written yet\n").unwrap();
    not_ready(
        &run,
        "the agent's not ready",
        "the CNI config is not written yet",
    );
    fs::remove_file(&ready).unwrap();
    assert_eq!(status(&run).code, 0);

    nix::unistd::mkfifo(&ready, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    not_ready(&run, "a FIFO nobody writes", "a FIFO");
    fs::remove_file(&ready).unwrap();

    symlink("/dev/zero", &ready).unwrap();
    not_ready(&run, "a link to /dev/zero", "symbolic link");
    fs::remove_file(&ready).unwrap();

    symlink(&secret, &ready).unwrap();
    not_ready(&run, "a link to a secret", "symbolic link");
    fs::remove_file(&ready).unwrap();

    fs::hard_link(&secret, &ready).unwrap();
    not_ready(
        &run,
        "a hard link to a secret",
        "does not hold what the agent writes",
    );
    fs::remove_file(&ready).unwrap();

    fs::write(&ready, vec![b'r'; 50 << 20]).unwrap();
    not_ready(&run, "a 50 MB file", "does not hold what the agent writes");
    fs::remove_file(&ready).unwrap();

    fs::write(&ready, format!("ready\n{SECRET}\n")).unwrap();
    not_ready(
        &run,
        "more than the agent writes",
        "does not hold what the agent writes",
    );
    fs::remove_file(&ready).unwrap();

    fs::create_dir(&ready).unwrap();
    not_ready(&run, "a directory", "a directory");
    fs::remove_dir(&ready).unwrap();

    fs::write(&ready, "ready\n").unwrap();
    fs::set_permissions(&ready, fs::Permissions::from_mode(0o644)).unwrap();
    nix::unistd::chown(&ready, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    not_ready(&run, "another user's file", "owned by UID 4242");
}
