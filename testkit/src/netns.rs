//! Fresh named network namespaces for tests, and running code inside them.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

const NETNS_DIR: &str = "/run/netns";
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh network namespace, bind-mounted at `/run/netns/<name>` (so `ip netns exec <name>`
/// and `ip -n <name>` reach it), with `lo` up. Unmounted and removed on drop; the kernel frees
/// the namespace once nothing uses it any more.
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    path: PathBuf,
}

impl TestNetns {
    /// A new namespace named `rdt-<pid>-<counter>`.
    pub fn new() -> TestNetns {
        TestNetns::with_prefix("rdt")
    }

    /// A new namespace named `<prefix>-<pid>-<counter>`.
    pub fn with_prefix(prefix: &str) -> TestNetns {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let path = Path::new(NETNS_DIR).join(&name);
        fs::create_dir_all(NETNS_DIR)
            .unwrap_or_else(|e| panic!("cannot create {NETNS_DIR}: {e} (kernel tests need root)"));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        // From here on, Drop cleans up whatever exists.
        let ns = TestNetns { name, path };
        let result = std::thread::scope(|s| {
            s.spawn(|| -> Result<(), String> {
                unshare(CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("unshare(CLONE_NEWNET): {e}"))?;
                mount(
                    Some("/proc/thread-self/ns/net"),
                    &ns.path,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|e| format!("bind-mount the namespace on {}: {e}", ns.path.display()))?;
                crate::sock::set_link_up("lo").map_err(|e| format!("lo up: {e}"))
            })
            .join()
            .unwrap_or_else(|_| Err("namespace setup thread panicked".into()))
        });
        if let Err(e) = result {
            panic!("cannot create network namespace {}: {e}", ns.name);
        }
        ns
    }

    /// The namespace's name (for `ip netns exec` / `ip -n`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file, `/run/netns/<name>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a scoped thread that entered this namespace; the caller's thread never changes
    /// namespace. A panic in `f` is propagated.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        in_netns(&self.path, f)
    }

    /// Runs `cmd` with `sh -c` inside the namespace (`ip netns exec`); returns its stdout and
    /// panics with its status, stdout and stderr if it fails. For tests only.
    pub fn sh(&self, cmd: &str) -> String {
        self.try_sh(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`TestNetns::sh`], but returns the failure as a message.
    pub fn try_sh(&self, cmd: &str) -> Result<String, String> {
        run_command(
            Command::new("ip")
                .args(["netns", "exec", &self.name, "sh", "-c", cmd])
                .stdin(Stdio::null()),
            None,
            &format!("in netns {}: sh -c {cmd:?}", self.name),
        )
    }

    /// Runs `ip -n <name> [-6] -batch -` with the given commands (one `ip` command per line,
    /// without the leading `ip`); panics naming the failing line.
    pub fn ip_batch(&self, family6: bool, lines: &[String]) {
        if lines.is_empty() {
            return;
        }
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name]);
        if family6 {
            cmd.arg("-6");
        }
        cmd.args(["-batch", "-"]);
        let input = lines.join("\n") + "\n";
        run_command(
            &mut cmd,
            Some(input.as_bytes()),
            &format!("in netns {}: ip -batch with\n{input}", self.name),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Default for TestNetns {
    fn default() -> Self {
        TestNetns::new()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        let _ = fs::remove_file(&self.path);
    }
}

/// Runs `f` on a scoped thread that `setns`ed into the network namespace at `path`.
pub(crate) fn in_netns<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> T {
    let file = File::open(path)
        .unwrap_or_else(|e| panic!("cannot open network namespace {}: {e}", path.display()));
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| {
                panic!(
                    "cannot enter network namespace {}: {e} (needs CAP_SYS_ADMIN)",
                    path.display()
                )
            });
            drop(file);
            f()
        });
        match handle.join() {
            Ok(v) => v,
            Err(payload) => std::panic::resume_unwind(payload),
        }
    })
}

/// Switches the credentials of the calling thread only (raw syscalls: glibc's wrappers would
/// change every thread of the process). Clears supplementary groups first.
pub fn become_ids(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: plain syscalls with integer arguments (and a null list for setgroups).
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs a command (with optional stdin), returning stdout, or a message with status, stdout and
/// stderr.
pub(crate) fn run_command(
    cmd: &mut Command,
    stdin: Option<&[u8]>,
    what: &str,
) -> Result<String, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {what}: {e}"))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input)
            .map_err(|e| format!("cannot write stdin of {what}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot wait for {what}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "command failed ({}) {what}\n--- stdout\n{stdout}--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
