//! containerd 2 for one test, in namespaces of its own: `unshare` makes a PID namespace (its
//! init, catatonit, takes every process of it along when it dies: containerd, the shims, the
//! pause processes), a network namespace (the bridge and the pods' veths never touch the
//! machine's) and a private mount namespace, in which `<dir>/run` is mounted over /run and
//! `<dir>/varlib` over /var/lib (containerd's state and root, the shims' sockets, the pods'
//! namespaces, host-local's leases, libcni's cache). The CRI socket is a file under `<dir>/run`,
//! so the test reaches it from the machine's side.
//!
//! The CNI bin folder holds sid's reference plugins and `redirect-cni`: a wrapper that logs each
//! call (its start time, `CNI_COMMAND`, the container, the exit code, the stdin it got) to
//! `<dir>/calls.log` and runs this build's plugin.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cni_testkit::node::run_checked;
use cri_client::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, StatusRequest,
};
use cri_client::Cri;

/// The deliberately broken set-ups (`REDIRECT_CRI_BREAK`), each of which a test must catch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Broken {
    /// `unchained`: the conflist has no `redirect-cni`.
    Unchained,
    /// `status-ready`: the wrapper answers STATUS with success without running the plugin.
    StatusAlwaysReady,
}

impl Broken {
    fn from_env() -> Option<Broken> {
        match std::env::var("REDIRECT_CRI_BREAK").as_deref() {
            Err(_) | Ok("") => None,
            Ok("unchained") => Some(Broken::Unchained),
            Ok("status-ready") => Some(Broken::StatusAlwaysReady),
            Ok(other) => panic!("REDIRECT_CRI_BREAK={other}: expected unchained or status-ready"),
        }
    }
}

/// One call of our plugin, as the wrapper logged it.
#[derive(Debug, Clone)]
pub struct Call {
    /// When it started (seconds since the epoch).
    pub at: f64,
    /// `CNI_COMMAND`.
    pub command: String,
    /// `CNI_CONTAINERID` (empty for STATUS and GC).
    pub container: String,
    /// The exit code (1 with a CNI error, whose code is in [`Call::answer`]).
    pub code: i32,
    /// The file holding its stdin.
    pub stdin: PathBuf,
}

impl Call {
    /// What the plugin wrote to stdout, as JSON (`Null` when nothing).
    pub fn answer(&self) -> serde_json::Value {
        let mut out = self.stdin.clone().into_os_string();
        out.push(".out");
        let text = std::fs::read_to_string(out).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }
}

pub struct Containerd {
    name: String,
    dir: PathBuf,
    launcher: Child,
    init: u32,
    pub rt: tokio::runtime::Runtime,
    pub cri: Cri,
    pub started: Instant,
}

/// `$W/.tools/containerd2`, checked.
fn tools() -> PathBuf {
    let t = workspace().join(".tools/containerd2");
    for f in [
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "cni/bridge",
        "cni/host-local",
        "cni/loopback",
    ] {
        assert!(
            t.join(f).is_file(),
            "{} is missing: run `bash scripts/install-deps.sh` (scripts/install-containerd2.sh \
             .tools/containerd2 fetches containerd 2 from Debian sid once)",
            t.join(f).display()
        );
    }
    for b in ["runc", "catatonit", "unshare", "python3"] {
        assert!(
            which(b).is_some(),
            "{b} is missing: run `bash scripts/install-deps.sh`"
        );
    }
    t
}

pub fn workspace() -> PathBuf {
    redirect_testkit::docs::workspace()
}

fn which(b: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(b))
            .find(|p| p.is_file())
    })
}

pub fn log(what: impl std::fmt::Display) {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    eprintln!("[cri {t:.3}] {what}");
}

/// The cgroup the test's sandboxes go under (cgroupfs), removed at the end.
fn cgroup_parent(name: &str) -> String {
    format!("/rdcri-{name}")
}

/// Kills what a previous run of `name` left (its init, from `init.pid`), removes its cgroups
/// and its folder.
fn sweep(name: &str, dir: &Path) {
    if let Ok(pid) = std::fs::read_to_string(dir.join("init.pid")) {
        let pid = pid.trim();
        if std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "catatonit")
        {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
            for _ in 0..100 {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    remove_cgroups(name);
    let _ = std::fs::remove_dir_all(dir);
}

fn remove_cgroups(name: &str) {
    let root = cgroup_parent(name);
    for _ in 0..50 {
        let mut left = false;
        let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for h in hierarchies.flatten() {
            let top = h.path().join(root.trim_start_matches('/'));
            if top.is_dir() {
                left |= !remove_tree(&top);
            }
        }
        if !left {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes a cgroup and its children, deepest first; whether it is gone.
fn remove_tree(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// The wrapper `redirect-cni` in the bin folder: it logs every call and runs `real`.
fn wrapper(dir: &Path, real: &str, broken: Option<Broken>) -> String {
    let status_ready = if broken == Some(Broken::StatusAlwaysReady) {
        // The broken case: STATUS succeeds whatever the agent says.
        "[ \"$CNI_COMMAND\" = STATUS ] && { echo \"$start STATUS - 0 $in\" >>\"$d/calls.log\"; exit 0; }\n"
    } else {
        ""
    };
    format!(
        r#"#!/bin/sh
# Logs each call of redirect-cni (start time, command, container, exit code, its stdin's file),
# then answers as the real plugin does.
d={dir}
mkdir -p "$d/calls"
start=$(date +%s.%N)
in=$(mktemp "$d/calls/$start-${{CNI_COMMAND:-none}}-XXXXXX")
cat >"$in"
{status_ready}{real} <"$in" >"$in.out"
rc=$?
echo "$start ${{CNI_COMMAND:-none}} ${{CNI_CONTAINERID:--}} $rc $in" >>"$d/calls.log"
cat "$in.out"
exit $rc
"#,
        dir = dir.display()
    )
}

fn conflist(dir: &Path, broken: Option<Broken>) -> String {
    let ours = serde_json::json!({
        "type": "redirect-cni",
        "proxy_uid": 1337,
        "cni_agent_run_dir": dir.join("agent-run"),
        "log_file": dir.join("redirect-cni.log"),
        "plugin_log_level": "debug",
        "capabilities": {"io.kubernetes.cri.pod-annotations": true}
    });
    let mut plugins = vec![serde_json::json!({
        "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
        "ipam": {"type": "host-local", "subnet": "10.88.7.0/24", "routes": [{"dst": "0.0.0.0/0"}]}
    })];
    if broken != Some(Broken::Unchained) {
        plugins.push(ours);
    }
    serde_json::to_string_pretty(
        &serde_json::json!({"cniVersion": "1.1.0", "name": "podnet", "plugins": plugins}),
    )
    .unwrap()
}

fn config(dir: &Path) -> String {
    format!(
        r#"version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "{dir}/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = 'localhost/pause:test'
[plugins.'io.containerd.cri.v1.runtime']
  disable_apparmor = true
  # The sandbox's oom_score_adj is -998, lower than the test's own, which the machine may not
  # allow (no CAP_SYS_RESOURCE in a container): kept at the test's, as on the real node.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{dir}/cni-bin']
    conf_dir = '{dir}/net.d'
"#,
        dir = dir.display()
    )
}

fn init_script(dir: &Path, tools: &Path) -> String {
    format!(
        r#"set -eu
mount --bind {dir}/run /run
mount --bind {dir}/varlib /var/lib
ip link set lo up
export PATH={tools}:$PATH
exec containerd --config {dir}/containerd.toml
"#,
        dir = dir.display(),
        tools = tools.display()
    )
}

impl Containerd {
    /// Starts containerd 2 for the test `name` (its folder is `<tmp>/rdcri-<name>`), with the
    /// pause image imported; the agent's readiness file is not written.
    pub fn start(name: &str) -> Containerd {
        let tools = tools();
        let broken = Broken::from_env();
        if let Some(b) = broken {
            log(format!("REDIRECT_CRI_BREAK: {b:?}"));
        }
        let dir = std::env::temp_dir().join(format!("rdcri-{name}"));
        sweep(name, &dir);
        for d in [
            "run",
            "varlib",
            "cni-bin",
            "net.d",
            "agent-run",
            "calls",
            "images",
            "opt",
            "logs",
        ] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        for p in ["bridge", "host-local", "loopback", "portmap"] {
            std::fs::copy(tools.join("cni").join(p), dir.join("cni-bin").join(p)).unwrap();
        }
        let w = dir.join("cni-bin/redirect-cni");
        std::fs::write(&w, wrapper(&dir, cni_testkit::plugin_bin(), broken)).unwrap();
        run_checked("chmod", Command::new("chmod").arg("755").arg(&w));
        std::fs::write(dir.join("net.d/10-podnet.conflist"), conflist(&dir, broken)).unwrap();
        std::fs::write(dir.join("containerd.toml"), config(&dir)).unwrap();
        std::fs::write(dir.join("init.sh"), init_script(&dir, &tools)).unwrap();
        pause_image(&dir);

        let started = Instant::now();
        let log_file = File::create(dir.join("containerd.log")).unwrap();
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--mount",
            "--net",
            "--propagation",
            "private",
            "catatonit",
            "--",
            "sh",
        ])
        .arg(dir.join("init.sh"))
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file);
        let launcher = cmd.spawn().expect("unshare starts");
        let init = wait_for_init(&launcher, &dir);
        std::fs::write(dir.join("init.pid"), init.to_string()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let sock = dir.join("run/containerd/containerd.sock");
        let cri = connect(&rt, &sock, &dir);
        log(format!(
            "containerd 2 answers the CRI in {} ms",
            started.elapsed().as_millis()
        ));
        let mut c = Containerd {
            name: name.into(),
            dir,
            launcher,
            init,
            rt,
            cri,
            started,
        };
        c.import_pause(&tools, &sock);
        c
    }

    /// The test's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `fut`'s answer, logged with its time; a CRI error fails the test.
    pub fn rpc<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> T {
        self.try_rpc(what, fut)
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", self.tail()))
    }

    /// `fut`'s answer or the CRI's error, logged with its time.
    pub fn try_rpc<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        let t = Instant::now();
        let r = self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(120), fut)
                .await
                .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer in 120 s")))
        });
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        match &r {
            Ok(_) => log(format!("{what}: ok in {ms:.0} ms")),
            Err(e) => log(format!(
                "{what}: {:?} in {ms:.0} ms: {}",
                e.code(),
                e.message()
            )),
        }
        r.map(tonic::Response::into_inner)
    }

    /// The CRI `Status`: the NetworkReady condition's status, reason and message.
    pub fn network_ready(&self) -> (bool, String, String) {
        let mut rt = self.cri.runtime.clone();
        let s = self.rpc("Status", rt.status(StatusRequest { verbose: false }));
        let c = s
            .status
            .expect("a status")
            .conditions
            .into_iter()
            .find(|c| c.r#type == "NetworkReady")
            .expect("a NetworkReady condition");
        (c.status, c.reason, c.message)
    }

    /// A sandbox config as kubelet sends it for `pod`, with these annotations.
    pub fn sandbox_config(&self, pod: &str, annotations: &[(&str, &str)]) -> PodSandboxConfig {
        let annotations: HashMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.into(),
                uid: format!("uid-{pod}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: pod.into(),
            log_directory: self.dir.join("logs").join(pod).display().to_string(),
            annotations,
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent(&self.name),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Pod as i32,
                        pid: NamespaceMode::Pod as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The path, from the machine's side, of a path in containerd's mount namespace. /var/run
    /// is a link to /run, and an absolute link met under /proc/PID/root leads back to the
    /// machine's root: it is followed here.
    pub fn host_path(&self, inside: &str) -> PathBuf {
        let inside = match inside.strip_prefix("/var/run/") {
            Some(rest) => format!("/run/{rest}"),
            None => inside.to_string(),
        };
        PathBuf::from(format!("/proc/{}/root{inside}", self.init))
    }

    /// Our plugin's calls so far, in the order they started.
    pub fn calls(&self) -> Vec<Call> {
        let text = std::fs::read_to_string(self.dir.join("calls.log")).unwrap_or_default();
        let mut calls: Vec<Call> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert_eq!(f.len(), 5, "a line of calls.log: {l}");
                Call {
                    at: f[0].parse().unwrap(),
                    command: f[1].into(),
                    container: f[2].into(),
                    code: f[3].parse().unwrap(),
                    stdin: f[4].into(),
                }
            })
            .collect();
        calls.sort_by(|a, b| a.at.total_cmp(&b.at));
        calls
    }

    /// Writes the agent's readiness file as the agent does (a new file renamed over the old).
    pub fn set_agent(&self, readiness: &cni_protocol::events::Readiness) {
        let run = self.dir.join("agent-run");
        let tmp = run.join(".agent-ready.tmp");
        std::fs::write(&tmp, readiness.text()).unwrap();
        std::fs::rename(&tmp, run.join(cni_protocol::events::READY_NAME)).unwrap();
        log(format!(
            "the agent's readiness file: {:?}",
            readiness.text()
        ));
    }

    /// The last lines of containerd's log and of our plugin's, for a failure's message.
    pub fn tail(&self) -> String {
        let mut s = String::new();
        for (what, f) in [
            ("containerd", "containerd.log"),
            ("redirect-cni", "redirect-cni.log"),
            ("calls", "calls.log"),
        ] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s.push_str(&format!("--- {what} ({}):\n", self.dir.join(f).display()));
            s.push_str(&lines[lines.len().saturating_sub(25)..].join("\n"));
            s.push('\n');
        }
        s
    }

    fn import_pause(&mut self, tools: &Path, sock: &Path) {
        let t = Instant::now();
        run_checked(
            "importing the pause image",
            Command::new(tools.join("ctr"))
                .arg("-a")
                .arg(sock)
                .args(["-n", "k8s.io", "images", "import"])
                .arg(self.dir.join("images/pause.tar")),
        );
        log(format!(
            "pause image imported in {} ms",
            t.elapsed().as_millis()
        ));
    }
}

/// `localhost/pause:test`: the distribution's static catatonit in pause mode, as
/// `scripts/build-node-images.sh` makes it for the real node's tests.
fn pause_image(dir: &Path) {
    let catatonit = which("catatonit").unwrap();
    run_checked(
        "building the pause image",
        Command::new("python3")
            .arg(workspace().join("scripts/lib/oci-image.py"))
            .arg(dir.join("images/pause.tar"))
            .arg("localhost/pause:test")
            .arg("--file")
            .arg(format!("{}:/catatonit", catatonit.display()))
            .args(["--entrypoint", r#"["/catatonit", "-P"]"#]),
    );
}

/// catatonit's PID on the machine: unshare's child.
fn wait_for_init(launcher: &Child, dir: &Path) -> u32 {
    let unshare = launcher.id();
    let start = Instant::now();
    loop {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().find_map(|p| p.parse().ok()) {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "containerd's namespaces did not start: {}",
            std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Connects once the socket answers (containerd loads its plugins first: about a second).
fn connect(rt: &tokio::runtime::Runtime, sock: &Path, dir: &Path) -> Cri {
    let start = Instant::now();
    loop {
        if sock.exists() {
            if let Ok(c) = rt.block_on(cri_client::connect(sock)) {
                let mut v = c.runtime.clone();
                let ok = rt.block_on(v.version(cri_client::v1::VersionRequest {
                    version: "v1".into(),
                }));
                if let Ok(v) = ok {
                    let v = v.into_inner();
                    log(format!(
                        "{} {} (CRI {})",
                        v.runtime_name, v.runtime_version, v.runtime_api_version
                    ));
                    return c;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "containerd did not answer on {} within 30 s:\n{}",
            sock.display(),
            std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("REDIRECT_KEEP_CRI_LOGS").is_some() {
            let keep = workspace().join("target/cri-logs").join(&self.name);
            let _ = std::fs::remove_dir_all(&keep);
            let _ = std::fs::create_dir_all(&keep);
            for f in ["containerd.log", "redirect-cni.log", "calls.log", "net.d"] {
                if !self.dir.join(f).exists() {
                    continue;
                }
                let _ = Command::new("cp")
                    .arg("-r")
                    .arg(self.dir.join(f))
                    .arg(&keep)
                    .status();
            }
            eprintln!(
                "containerd's and the plugin's logs are in {}",
                keep.display()
            );
        }
        // Killing the namespaces' init kills containerd, the shims and the sandboxes; their
        // mounts go with the mount namespace.
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
        sweep(&self.name, &self.dir);
        log(format!(
            "containerd stopped and cleaned up after {:.1} s",
            self.started.elapsed().as_secs_f64()
        ));
    }
}
