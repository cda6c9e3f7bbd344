//! A real single-node Kubernetes cluster for a test: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd and kubelet, in PID, network and mount
//! namespaces of the test's own (`scripts/lib/node-cluster.sh`, which says what it mounts where).
//!
//! The cluster stops with its [`Node`]: dropping it kills the namespaces' init (every process of
//! the node dies with it) and removes kubelet's cgroups; a test process killed outright takes the
//! node with it too (a parent-death signal, and unshare's `--kill-child`), and the next start of
//! any node cleans what that left (its folder, kubelet's cgroups). When the test fails, the node's logs (every component's,
//! each container's) are kept under `target/node-logs/<name>` (always, with
//! `REDIRECT_KEEP_NODE_LOGS=1`).
//!
//! Needs what `scripts/install-deps.sh` installs (the four Kubernetes binaries in `.tools/kube`,
//! containerd, runc, catatonit, the CNI reference plugins) and the images of
//! `scripts/build-node-images.sh target/node-images`; a missing one fails the test with the
//! command that makes it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The node's address in its network namespace (the API server's, the node agent's).
pub const NODE_IP: &str = "10.250.0.1";

/// A node as a test asks for it.
#[derive(Default, Clone)]
pub struct Options {
    /// Register the node with this taint (`KEY=true:NoSchedule`), e.g. Istio's
    /// `cni.istio.io/not-ready`.
    pub taint: Option<String>,
    /// Put a recording plugin in the node's chain (`/var/log/cni-record`: what the runtime
    /// passes, each call).
    pub record_cni: bool,
}

/// A running node; dropping it stops the cluster.
pub struct Node {
    name: String,
    dir: PathBuf,
    run: Child,
    pid: u32,
    /// From the start to the node's Ready condition.
    pub started_in: Duration,
}

fn workspace() -> PathBuf {
    redirect_testkit::docs::workspace()
}

/// `target/node-images`, where `scripts/build-node-images.sh` puts the images.
pub fn images_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    target.join("node-images")
}

fn script() -> PathBuf {
    workspace().join("scripts/lib/node-cluster.sh")
}

fn down(dir: &Path) {
    let out = Command::new("bash")
        .arg(script())
        .arg("down")
        .arg(dir)
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "stopping the node in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Node {
    /// Starts the node `name` (one per test; its folder is `<tmp>/rdnode-<name>`) and waits
    /// until it is Ready (about 20 s).
    pub fn start(name: &str, opts: &Options) -> Node {
        for bin in [
            "kube-apiserver",
            "kubelet",
            "kube-scheduler",
            "kube-controller-manager",
        ] {
            let p = workspace().join(".tools/kube").join(bin);
            assert!(
                p.is_file(),
                "{} is missing: the real node's tests need it; run `bash scripts/install-deps.sh` \
                 (it builds the four Kubernetes binaries from the distribution's source once, \
                 about 5 minutes)",
                p.display()
            );
        }
        let images = images_dir();
        let tars = ["pause.tar", "redirect.tar", "testpod.tar"];
        for t in tars {
            assert!(
                images.join(t).is_file(),
                "{} is missing: run `bash scripts/build-static.sh && bash \
                 scripts/build-node-images.sh {}` (scripts/test.sh does)",
                images.join(t).display(),
                images.display()
            );
        }
        sweep_dead_nodes();
        let dir = std::env::temp_dir().join(format!("rdnode-{name}"));
        // What a killed run of this test left.
        down(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("images")).unwrap();
        for t in tars {
            std::os::unix::fs::symlink(images.join(t), dir.join("images").join(t)).unwrap();
        }
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("run").arg(&dir);
        if let Some(t) = &opts.taint {
            cmd.args(["--taint", t]);
        }
        if opts.record_cni {
            cmd.arg("--record-cni");
        }
        let start = Instant::now();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let run = crate::apiserver::spawn(cmd, &dir.join("logs/launcher.log"));
        let mut node = Node {
            name: name.into(),
            dir,
            run,
            pid: 0,
            started_in: Duration::ZERO,
        };
        node.pid = node.wait_for_init();
        std::fs::write(node.dir.join("init.pid"), node.pid.to_string()).unwrap();
        node.wait_ready(start);
        node.started_in = start.elapsed();
        eprintln!(
            "node {name} Ready in {:.1} s",
            node.started_in.as_secs_f64()
        );
        node
    }

    /// catatonit's PID on the host: unshare's child.
    fn wait_for_init(&mut self) -> u32 {
        let unshare = self.run.id();
        let children = format!("/proc/{unshare}/task/{unshare}/children");
        let start = Instant::now();
        loop {
            // Until the script execs unshare, its children are the commands of its setup.
            let init = std::fs::read_to_string(&children).ok().and_then(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .find(|p| {
                        std::fs::read_to_string(format!("/proc/{p}/comm"))
                            .is_ok_and(|c| c.trim() == "catatonit")
                    })
            });
            if let Some(pid) = init {
                return pid;
            }
            if let Ok(Some(status)) = self.run.try_wait() {
                panic!(
                    "the node's launcher exited ({status}) before its init started: {}",
                    self.tail("init.log")
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the node's init did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_ready(&mut self, start: Instant) {
        while !self.dir.join("ready").exists() {
            let failed = std::fs::read_to_string(self.dir.join("failed")).ok();
            let exited = self.run.try_wait().ok().flatten();
            if failed.is_some() || exited.is_some() || start.elapsed() > Duration::from_secs(180) {
                let why = failed.unwrap_or_else(|| match exited {
                    Some(s) => format!("its init exited ({s})"),
                    None => "not Ready within 180 s".into(),
                });
                self.keep_logs();
                panic!("the node did not come up: {why}\n{}", self.tail("node.log"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn tail(&self, log: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join("logs").join(log)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The node's folder (its /var/log is `varlog`, /run `run`, /etc/cni/net.d is
    /// `etc-up/cni/net.d` once written).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the host's process `pid` runs in one of this node's pods: its cgroup is under
    /// the node's kubelet root (`/rdnode-<folder>`, `scripts/lib/node-cluster.sh`), which tells
    /// two nodes' pods of the same name apart.
    pub fn runs(&self, pid: u32) -> bool {
        let root = format!(
            "/rdnode-{}/",
            self.dir.file_name().unwrap_or_default().to_string_lossy()
        );
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&root))
    }

    /// The PID (on the host) of the node's init; its namespaces are the node's.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `program args` in the node's network namespace (the host's files).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t").arg(self.pid.to_string()).arg("-n").arg(program);
        c
    }

    /// `sh -c script` in the node's network and mount namespaces (the node's view of /etc,
    /// /var, /run, /opt).
    pub fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-n", "-m", "sh", "-c", script])
            .output()
            .unwrap()
    }

    /// kubectl as the cluster's admin; its output, whether it succeeded or not.
    pub fn kubectl_output(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = self.command("kubectl");
        c.arg("--kubeconfig")
            .arg(self.dir.join("pki/admin.kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.join("kubectl-cache"))
            .arg("--request-timeout=20s")
            .args(args);
        run_with_stdin(c, stdin)
    }

    /// kubectl as the cluster's admin; its stdout, the test failing when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        checked(
            &format!("kubectl {args:?}"),
            self.kubectl_output(args, None),
        )
    }

    /// `kubectl apply -f -` of `manifest`.
    pub fn apply(&self, manifest: &str) -> String {
        checked(
            "kubectl apply",
            self.kubectl_output(&["apply", "-f", "-"], Some(manifest)),
        )
    }

    /// The object as JSON (`kubectl get -o json`), `None` when it does not exist.
    pub fn get(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        let out = self.kubectl_output(&all, None);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("NotFound"), "kubectl {all:?}: {err}");
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).unwrap())
    }

    /// helm with the cluster's admin credentials, from the repository's root.
    pub fn helm(&self, args: &[&str]) -> String {
        let mut c = self.command(workspace().join(".tools/helm"));
        let home = self.dir.join("helm");
        c.current_dir(workspace())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .arg("--kubeconfig")
            .arg(self.dir.join("pki/admin.kubeconfig"))
            .args(args);
        checked(&format!("helm {args:?}"), run_with_stdin(c, None))
    }

    /// The node agent's /metrics (on the node's address, port 15014).
    pub fn metrics(&self) -> String {
        let out = self
            .command("curl")
            .args([
                "-fsS",
                "--max-time",
                "5",
                &format!("http://{NODE_IP}:15014/metrics"),
            ])
            .output()
            .unwrap();
        checked("the node agent's /metrics", out)
    }

    /// The sum of a metric's samples whose labels include every one of `labels`
    /// (`name{a="b"}`), 0 when there is none.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series, ""));
                n == name && labels.iter().all(|want| rest.contains(want))
            })
            .map(|(_, v)| v.parse::<f64>().unwrap())
            .sum()
    }

    /// A file as the node sees it (its mount namespace), `None` when there is none.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(format!("/proc/{}/root{path}", self.pid)).ok()
    }

    /// The node's logs, copied where a failed test's output says.
    fn keep_logs(&self) -> PathBuf {
        let target = images_dir()
            .parent()
            .unwrap()
            .join("node-logs")
            .join(&self.name);
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir_all(&target).unwrap();
        for (from, to) in [
            ("logs", "components"),
            ("varlog/pods", "pods"),
            ("varlog/cni-record", "cni-record"),
        ] {
            let _ = Command::new("cp")
                .arg("-rL")
                .arg(self.dir.join(from))
                .arg(target.join(to))
                .status();
        }
        eprintln!("the node's logs are in {}", target.display());
        target
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("REDIRECT_KEEP_NODE_LOGS").is_some() {
            self.keep_logs();
        }
        let _ = self.run.kill();
        let _ = self.run.wait();
        down(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The folders and cgroups of nodes whose init is dead (a test process killed outright).
fn sweep_dead_nodes() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let named = dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("rdnode-"));
        let Ok(pid) = std::fs::read_to_string(dir.join("init.pid")) else {
            continue;
        };
        let alive = std::fs::read_to_string(format!("/proc/{}/comm", pid.trim()))
            .is_ok_and(|c| c.trim() == "catatonit");
        if named && !alive {
            down(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

fn run_with_stdin(mut c: Command, stdin: Option<&str>) -> Output {
    use std::io::Write;
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs `cmd` and returns its stdout; panics naming `what`, with the exit status and both outputs,
/// when it fails or cannot start.
pub fn run_checked(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    checked(what, out)
}

fn checked(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
