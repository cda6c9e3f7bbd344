//! The test kit of the plugin's (`cni-plugin`) and the node agent's (`cni-node`) tests, shared
//! instead of copied: run the two binaries as a runtime and a DaemonSet run them, and see where
//! a real connection lands in a namespace the plugin programmed. `pki` makes the CA,
//! certificates and kubeconfigs of the stand-ins for the Kubernetes API server; `cluster` is
//! the stateful one (lists, watches, patches); `apiserver` runs a real one (etcd and
//! kube-apiserver); `host_proc` stands in for the node's `/proc`; `user_ns` makes a
//! pod in a user namespace of its own. A dev-dependency only.

#![deny(missing_docs)]

pub mod agent;
pub mod ambient;
pub mod apiserver;
pub mod cluster;
pub mod host_proc;
pub mod node;
pub mod pki;
pub mod user_ns;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::OnceLock;

use redirect_testkit::{Landings, TestNetns};

/// A process's user and system CPU time so far, all threads, in seconds (`/proc/PID/stat`
/// fields 14 and 15, at clock-tick resolution): what the benchmarks charge a process.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which may hold spaces: the state is field 3.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks / hz
}

/// The plugin's binary of this build (`target/<profile>/redirect-cni`).
pub fn plugin_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| built("cni-plugin", "redirect-cni"))
}

/// The test pods' binary of this build (`target/<profile>/testpod`): ztunnel's stand-in too.
pub fn testpod_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| built("testpod", "testpod"))
}

/// The node agent's binary of this build (`target/<profile>/redirect-cni-node`).
pub fn node_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| built("cni-node", "redirect-cni-node"))
}

/// The validator's binary of this build (`target/<profile>/redirect-validate`): its `node`
/// reads the agent's view.
pub fn validate_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| built("validator", "redirect-validate"))
}

/// `bin` of `package` in the profile folder of the test running: `cargo test` of the workspace
/// builds every binary first; a test of one package builds the other package's binary here.
fn built(package: &str, bin: &str) -> String {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests run from target/<profile>/deps");
    let path = profile_dir.join(bin);
    if !path.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", package, "--bin", bin])
            .current_dir(redirect_testkit::docs::workspace());
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p {package} --bin {bin} failed"
        );
    }
    path.to_str().expect("a UTF-8 target path").to_owned()
}

/// The status annotation the injector writes for a CNI pod.
pub const STATUS_CNI: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null}"#;

/// A Kubernetes pod's CNI_ARGS, as containerd sends them.
pub const ARGS: &str =
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u1";

/// A chained config for a pod with Istio's sidecar annotations, given by the runtime.
pub fn mesh_conf() -> String {
    serde_json::json!({"cniVersion": "1.0.0", "name": "podnet", "type": "redirect-cni", "proxy_uid": 1337,
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"sidecar.istio.io/status": STATUS_CNI}}})
    .to_string()
}

/// The runtime's variables for `cmd` on the namespace at `netns`.
pub fn cni_env<'a>(cmd: &'a str, netns: &'a str, args: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", args),
    ]
}

/// A pod namespace with an address (the primary network is up), as after the chain's first plugin.
pub fn pod_ns() -> TestNetns {
    let ns = TestNetns::new();
    ns.sh("ip link add eth0 type veth peer name peer0 && ip addr add 10.33.0.5/24 dev eth0 && ip link set eth0 up");
    ns
}

/// Output of one plugin run.
#[derive(Debug)]
pub struct Out {
    /// The exit code; -1 when a signal ended the process.
    pub code: i32,
    /// What the plugin printed: its result, or the error object.
    pub stdout: String,
    /// Its log lines.
    pub stderr: String,
}

impl Out {
    /// Stdout as JSON; the test fails, showing stdout and stderr, when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Run the plugin directly with this environment (only these variables) and stdin.
pub fn plugin(env: &[(&str, &str)], stdin: &str) -> Out {
    finish(Command::new(plugin_bin()), env, stdin, None)
}

/// Run the plugin inside `ns` (through `ip netns exec`), which plays the node's namespace: the
/// plugin's own namespace, the one its host guard protects.
pub fn plugin_in(ns: &TestNetns, env: &[(&str, &str)], stdin: &str) -> Out {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name(), plugin_bin()]);
    finish(cmd, env, stdin, None)
}

/// [`plugin`], failing the test if the plugin has not exited within `limit`.
pub fn plugin_within(limit: Duration, env: &[(&str, &str)], stdin: &str) -> Out {
    finish(Command::new(plugin_bin()), env, stdin, Some(limit))
}

/// Spawn `cmd` with only `env`, write `stdin`, wait (at most `limit`), and collect the output.
fn finish(mut cmd: Command, env: &[(&str, &str)], stdin: &str, limit: Option<Duration>) -> Out {
    cmd.env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn redirect-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    if let Some(limit) = limit {
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the plugin did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The node agent standalone on the node folders `node/{net,bin,run}` (made here when
/// missing), copying this build's plugin: the arguments after `redirect-cni-node`.
pub fn install_args(node: &Path) -> Vec<String> {
    let p = |d: &str| {
        let dir = node.join(d);
        std::fs::create_dir_all(&dir).unwrap();
        dir.to_str().unwrap().to_owned()
    };
    [
        "--chained-cni-plugin=false",
        "--mounted-cni-net-dir",
        &p("net"),
        "--cni-bin-dir",
        &p("bin"),
        "--cni-agent-run-dir",
        &p("run"),
        "--binary",
        plugin_bin(),
    ]
    .map(String::from)
    .to_vec()
}

/// Listeners in `ns` on `ports` (the kit's `Landings`); `probe` answers where a connection
/// landed as (listener port, original destination), or `None`.
pub fn listen(ns: &TestNetns, ports: &[u16]) -> Landings {
    let l = Landings::new();
    l.listen(ns, "pod", ports);
    l
}

/// Where a connection from a namespace lands.
pub trait Probe {
    /// Connects from `from` (as `uid`, else root) to `dst`: the port of the listener that
    /// accepted it and the original destination it saw, or `None` when it landed nowhere.
    fn probe(
        &self,
        from: &TestNetns,
        uid: Option<u32>,
        dst: SocketAddr,
    ) -> Option<(u16, SocketAddr)>;
}

impl Probe for Landings {
    fn probe(
        &self,
        from: &TestNetns,
        uid: Option<u32>,
        dst: SocketAddr,
    ) -> Option<(u16, SocketAddr)> {
        self.connect(from, uid, dst).ok().map(|l| (l.port, l.orig))
    }
}

/// Where `scripts/build-static.sh` leaves the static binaries of this machine's architecture.
pub fn static_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("REDIRECT_STATIC_DIR") {
        return PathBuf::from(d);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| redirect_testkit::docs::workspace().join("target"));
    target.join("static").join(std::env::consts::ARCH)
}

/// The static binary `name` in [`static_dir`]; the test fails, saying how to build it, when
/// it is missing.
pub fn static_bin(name: &str) -> PathBuf {
    let p = static_dir().join(name);
    assert!(
        p.is_file(),
        "the static release binary {} is missing: run `bash scripts/build-static.sh` first \
         (scripts/test.sh does), or set REDIRECT_STATIC_DIR",
        p.display()
    );
    p
}

/// A small deterministic PRNG (xorshift), seeded from the clock and printed.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `FAULTS_SEED` when set, else from the clock; prints the seed after `what`,
    /// so that a failing run can be repeated.
    pub fn new(what: &str) -> Rng {
        let seed = std::env::var("FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    | 1
            });
        eprintln!("{what}: FAULTS_SEED={seed}");
        Rng(seed)
    }
    /// The next number, below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Recorded pod objects, as the API server returns them.
pub mod fixtures {
    /// A pod with Istio's injected sidecar (`istio-init` replaced by the CNI's validation).
    pub const ISTIO_POD: &str = include_str!("../fixtures/pod-istio-sidecar.json");
    /// The same on OpenShift: the proxy's UID from the namespace's range, in `runAsUser`.
    pub const OPENSHIFT_POD: &str = include_str!("../fixtures/pod-openshift.json");
    /// A native sidecar (the proxy as a restartable init container).
    pub const NATIVE_SIDECAR_POD: &str = include_str!("../fixtures/pod-native-sidecar.json");

    /// [`ISTIO_POD`] as a user creates it on a real API server: named `namespace/name`, bound
    /// to `node`, without what the server fills in (uid, resourceVersion, status...) and without
    /// the token volume's mounts (the test servers run without the ServiceAccount admission
    /// plugin that adds the volume).
    pub fn istio_pod_to_create(namespace: &str, name: &str, node: &str) -> serde_json::Value {
        let mut pod: serde_json::Value = serde_json::from_str(ISTIO_POD).unwrap();
        let meta = pod["metadata"].as_object_mut().unwrap();
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "ownerReferences",
            "generateName",
        ] {
            meta.remove(k);
        }
        meta.insert("name".into(), name.into());
        meta.insert("namespace".into(), namespace.into());
        pod.as_object_mut().unwrap().remove("status");
        pod["spec"]["nodeName"] = node.into();
        let volumes: Vec<serde_json::Value> = pod["spec"]["volumes"]
            .as_array()
            .map(|v| v.iter().map(|v| v["name"].clone()).collect())
            .unwrap_or_default();
        for kind in ["containers", "initContainers"] {
            for c in pod["spec"][kind].as_array_mut().into_iter().flatten() {
                if let Some(m) = c["volumeMounts"].as_array_mut() {
                    m.retain(|m| volumes.contains(&m["name"]));
                }
            }
        }
        pod
    }
}

/// `f` every 50 ms until it gives a value; the test fails naming `what` after `within`.
pub fn eventually<T>(what: &str, within: Duration, f: impl FnMut() -> Option<T>) -> T {
    eventually_or(what, within, String::new, f)
}

/// [`eventually`], whose failure also shows `context()` as it is then (an agent's log).
pub fn eventually_or<T>(
    what: &str,
    within: Duration,
    context: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET path` on `127.0.0.1:port` from inside `ns` (an agent's monitoring port): the status
/// code and the body; `None` when nothing answers.
pub fn http_get(ns: &TestNetns, port: u16, path: &str) -> Option<(u16, String)> {
    let path = path.to_owned();
    ns.run(move || {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let code = text.get(9..12)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((code, body))
    })
}

/// `GET path` on the unix socket `socket` (the agent's node view): the status code and the
/// body; `None` when nothing answers.
pub fn unix_get(socket: &std::path::Path, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// The sum of the samples of metric `name` in `text` (OpenMetrics) whose labels include every
/// one of `labels` (`a="b"`); 0 when there is none.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name && labels.iter().all(|want| rest.contains(want))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}
