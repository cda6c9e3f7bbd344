//! The node agent's process (`redirect-cni-node`) as the DaemonSet runs it, against a real API
//! server: a standalone install on node folders (`net`, `bin`, `run` under one folder), its
//! stderr kept in a file for the test to read. Stopped with SIGTERM when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::apiserver::{ControlPlane, SYSTEM};

/// How the agent is started.
pub struct AgentSpec<'a> {
    /// The API server it talks to.
    pub cp: &'a ControlPlane,
    /// The service account's folder (token, ca.crt).
    pub sa: &'a Path,
    /// The host's `/proc` as the agent sees it (a `FakeProc`).
    pub proc: &'a Path,
    /// The node folder (`net`, `bin`, `run` are made in it).
    pub node: &'a Path,
    /// The node it runs on (`NODE_NAME`).
    pub node_name: &'a str,
    /// The agent's binary.
    pub bin: &'a Path,
    /// The plugin's binary, which the agent installs.
    pub plugin: &'a Path,
    /// More arguments, after the kit's.
    pub extra: &'a [&'a str],
    /// The API server's port as the agent reaches it (a forwarder's in `netns`); `None`: the
    /// server's own.
    pub api_port: Option<u16>,
    /// The network namespace it runs in (`ip netns exec`), as the node's; `None`: the test's.
    pub netns: Option<&'a str>,
    /// More environment variables (the settings that have no flag, or a test's).
    pub env: &'a [(&'a str, &'a str)],
    /// The umask it starts with (the runtime's default when `None`).
    pub umask: Option<u32>,
}

/// A running agent.
pub struct Agent {
    child: Child,
    log: PathBuf,
}

impl Agent {
    /// Starts the agent; its log is `<node>/agent-<n>.log`, `n` counting the agents started on
    /// that node folder (a restarted agent writes a new one).
    pub fn start(spec: &AgentSpec) -> Agent {
        let n = (0..)
            .find(|n| !spec.node.join(format!("agent-{n}.log")).exists())
            .unwrap();
        let log = spec.node.join(format!("agent-{n}.log"));
        let dir = |d: &str| {
            let p = spec.node.join(d);
            fs::create_dir_all(&p).unwrap();
            p
        };
        let mut cmd = match spec.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(spec.bin);
                c
            }
            None => Command::new(spec.bin),
        };
        if let Some(mask) = spec.umask {
            use std::os::unix::process::CommandExt;
            // SAFETY: umask is async-signal-safe and touches nothing but the child's mask.
            unsafe {
                cmd.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--chained-cni-plugin=false")
            .arg("--mounted-cni-net-dir")
            .arg(dir("net"))
            .arg("--cni-bin-dir")
            .arg(dir("bin"))
            .arg("--cni-agent-run-dir")
            .arg(dir("run"))
            .arg("--binary")
            .arg(spec.plugin)
            .arg("--monitoring-port=0")
            .arg("--service-account-dir")
            .arg(spec.sa)
            .arg("--repair-host-proc")
            .arg(spec.proc)
            .args(spec.extra)
            .env_clear()
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env(
                "KUBERNETES_SERVICE_PORT",
                spec.api_port.unwrap_or(spec.cp.port()).to_string(),
            )
            .env("NODE_NAME", spec.node_name)
            .env("POD_NAMESPACE", SYSTEM)
            .env("REPAIR_NETNS_DIR", "/nonexistent")
            .envs(spec.env.iter().copied())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Agent { child, log }
    }

    /// The agent's stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (30 s at most) for a log line holding every one of `words`; returns it. The
    /// failure shows the log.
    pub fn line_with(&self, words: &[&str]) -> String {
        crate::eventually_or(
            &format!("an agent line with {words:?}"),
            Duration::from_secs(30),
            || self.log(),
            || {
                self.log()
                    .lines()
                    .find(|l| words.iter().all(|w| l.contains(w)))
                    .map(str::to_owned)
            },
        )
    }

    /// The process's ID (to read its `/proc` entries).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (and its status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}
