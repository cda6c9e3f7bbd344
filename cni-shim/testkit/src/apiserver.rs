//! A real Kubernetes control plane for a test: etcd and kube-apiserver 1.20 on loopback, RBAC
//! on, service-account tokens signed by a key of the test's own, an admin token for the test's
//! setup (`kubectl`), all in a temporary folder that goes with it.
//!
//! The binaries come from `scripts/install-kube.sh` (called by
//! `scripts/install-deps.sh`): `.tools/kube/kube-apiserver` (or `REDIRECT_KUBE_APISERVER`),
//! `etcd` and `kubectl` on PATH. A missing one fails the test with the command that installs it.
//! The API server has no controller-manager, scheduler or kubelet: objects are what the test
//! writes (a pod's status too), a ServiceAccount gets no token Secret (tokens come from the
//! TokenRequest API), and a pod bound to a node is deleted only gracefully (it keeps a
//! `deletionTimestamp`, as on a cluster whose kubelet is away).

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The admin's bearer token (group `system:masters`).
const ADMIN_TOKEN: &str = "redirect-test-admin-token";

/// etcd and kube-apiserver, running until dropped.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Child,
    apiserver: Child,
    /// The API server's command (to start it again: [`ControlPlane::restart_apiserver`]).
    api_cmd: Vec<std::ffi::OsString>,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The API server's self-signed certificate and its CA, as a client's CA bundle.
    pub ca: PathBuf,
    /// A kubeconfig with the admin token.
    pub admin: PathBuf,
    /// From the first process started to `/readyz` answering 200.
    pub started_in: Duration,
}

fn workspace() -> PathBuf {
    redirect_testkit::docs::workspace()
}

/// The kube-apiserver binary, or a panic naming how to get it.
pub fn apiserver_bin() -> PathBuf {
    let p = std::env::var_os("REDIRECT_KUBE_APISERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".tools/kube/kube-apiserver"));
    assert!(
        p.is_file(),
        "{} is missing: these tests run a real API server; run `bash scripts/install-deps.sh` \
         (it builds kube-apiserver from the distribution's source package once, about 3 minutes) \
         or set REDIRECT_KUBE_APISERVER",
        p.display()
    );
    p
}

fn on_path(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{name}` is not on PATH: run `bash scripts/install-deps.sh` (it installs etcd and kubectl)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Spawns `cmd` with its output in `log`, killed with the thread that started it should the
/// test process die without dropping the control plane.
pub(crate) fn spawn(mut cmd: Command, log: &Path) -> Child {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ControlPlane {
    /// Starts etcd and the API server and waits until the API server is ready (about 4 s).
    /// The ports are picked free just before; should another process take one in between (the
    /// API server then exits), it starts over on new ports, twice at most.
    pub fn start() -> ControlPlane {
        ControlPlane::start_with(&[])
    }

    /// [`ControlPlane::start`] with more arguments to kube-apiserver (an audit policy...).
    pub fn start_with(extra: &[String]) -> ControlPlane {
        let mut last = String::new();
        for _ in 0..3 {
            match ControlPlane::try_start(extra) {
                Ok(cp) => return cp,
                Err(e) => {
                    eprintln!("the control plane did not start, trying again: {e}");
                    last = e;
                }
            }
        }
        panic!("the control plane did not start in 3 tries; the last:\n{last}");
    }

    fn try_start(extra: &[String]) -> Result<ControlPlane, String> {
        let bin = apiserver_bin();
        on_path("etcd");
        on_path("kubectl");
        let t0 = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (client, peer, secure) = (free_port(), free_port(), free_port());
        let mut etcd = Command::new("etcd");
        etcd.args(["--name", "test", "--data-dir"])
            .arg(d.join("etcd"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=test=http://127.0.0.1:{peer}"))
            .arg("--log-level=warn");
        let etcd = spawn(etcd, &d.join("etcd.log"));

        // The service accounts' signing key, and the admin's token.
        let key = d.join("sa.key");
        let public = d.join("sa.pub");
        run(
            "openssl",
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                key.to_str().unwrap(),
            ],
        );
        run(
            "openssl",
            &[
                "ec",
                "-in",
                key.to_str().unwrap(),
                "-pubout",
                "-out",
                public.to_str().unwrap(),
            ],
        );
        std::fs::write(
            d.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n"),
        )
        .unwrap();
        let certs = d.join("certs");
        let mut api = Command::new(&bin);
        api.arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={secure}"))
            .arg("--insecure-port=0")
            .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
            .arg(format!("--cert-dir={}", certs.display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .arg("--authorization-mode=RBAC")
            .arg("--allow-privileged=true")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", public.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                key.display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/24")
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--endpoint-reconciler-type=none")
            .arg("--v=0")
            .args(extra);
        let api_cmd = std::iter::once(api.get_program())
            .chain(api.get_args())
            .map(ToOwned::to_owned)
            .collect();
        let apiserver = spawn(api, &d.join("apiserver.log"));
        let url = format!("https://127.0.0.1:{secure}");
        let ca = certs.join("apiserver.crt");
        let admin = d.join("admin.kubeconfig");
        let mut cp = ControlPlane {
            dir,
            etcd,
            apiserver,
            api_cmd,
            url,
            ca,
            admin,
            started_in: Duration::ZERO,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = cp.etcd.try_wait().unwrap() {
                return Err(format!(
                    "etcd exited ({status}):\n{}",
                    tail(&cp.dir.path().join("etcd.log"))
                ));
            }
            if let Some(status) = cp.apiserver.try_wait().unwrap() {
                return Err(format!(
                    "kube-apiserver exited ({status}):\n{}\netcd:\n{}",
                    tail(&cp.dir.path().join("apiserver.log")),
                    tail(&cp.dir.path().join("etcd.log"))
                ));
            }
            if cp.ca.is_file() && !cp.admin.is_file() {
                cp.write_kubeconfig(&cp.admin.clone(), "admin", ADMIN_TOKEN);
            }
            if cp.admin.is_file() {
                let out = cp.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "kube-apiserver not ready within 60 s:\n{}\netcd:\n{}",
                    tail(&cp.dir.path().join("apiserver.log")),
                    tail(&cp.dir.path().join("etcd.log"))
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cp.started_in = t0.elapsed();
        eprintln!(
            "control plane ready in {:.1} s ({})",
            cp.started_in.as_secs_f64(),
            cp.url
        );
        Ok(cp)
    }

    /// A kubeconfig at `path` for this server with a bearer `token`.
    pub fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n",
            self.url,
            self.ca.display()
        );
        std::fs::write(path, text).unwrap();
    }

    /// `kubectl --kubeconfig <admin> ARGS`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_in(args, None)
    }

    /// [`Self::kubectl`] with `stdin`.
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = self.kubectl_command();
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl");
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// `kubectl --kubeconfig <admin>`, to add arguments to and spawn (several at once).
    pub fn kubectl_command(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.admin)
            .env("KUBECTL_KUBERC", "false");
        cmd
    }

    /// `kubectl ARGS` that must succeed: its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl_in(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl get ... -o json` as JSON.
    pub fn get(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&a)).unwrap()
    }

    /// A token of ServiceAccount `namespace/name` (TokenRequest, one hour). Through `create
    /// --raw`, which every kubectl has (`kubectl create token` needs 1.24).
    pub fn token(&self, namespace: &str, name: &str) -> String {
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token");
        let body = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}"#;
        let out = self.kubectl_in(&["create", "--raw", &path, "-f", "-"], Some(body));
        assert!(
            out.status.success(),
            "TokenRequest for {namespace}/{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        answer["status"]["token"].as_str().unwrap().to_owned()
    }

    /// Merges `status` into the pod's status subresource, as kubelet writes it (a read, then a
    /// replace of `.../status`: `kubectl patch --subresource` needs 1.24). A replace that lost
    /// the race with another writer (409 Conflict: the node agent annotating the pod) reads
    /// again and tries again, as kubelet does.
    pub fn set_pod_status(&self, namespace: &str, name: &str, status: &serde_json::Value) {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
        let mut tries = 0;
        let out = loop {
            let mut pod = self.get(&["pod", name, "-n", namespace]);
            for (k, v) in status.as_object().unwrap() {
                pod["status"][k] = v.clone();
            }
            let out = self.kubectl_in(
                &["replace", "--raw", &path, "-f", "-"],
                Some(&pod.to_string()),
            );
            tries += 1;
            let conflict = String::from_utf8_lossy(&out.stderr).contains("(Conflict)");
            if out.status.success() || !conflict || tries == 5 {
                break out;
            }
        };
        assert!(
            out.status.success(),
            "status of {namespace}/{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A folder laid out as a pod's mounted service account: `token` of `namespace/name` and
    /// the API server's `ca.crt`.
    pub fn service_account_dir(&self, namespace: &str, name: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("token"), self.token(namespace, name)).unwrap();
        std::fs::copy(&self.ca, d.path().join("ca.crt")).unwrap();
        std::fs::write(d.path().join("namespace"), namespace).unwrap();
        d
    }

    /// A port on 127.0.0.1 inside `ns` that leads to the API server (whose port is on the
    /// test's own loopback): for a process that must run in a namespace of its own, as the
    /// node agent does where it programs the node's namespace. The forwarding threads live as
    /// long as the test process.
    pub fn forward_from(&self, ns: &redirect_testkit::TestNetns) -> u16 {
        let listener = ns.run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let port = listener.local_addr().unwrap().port();
        let to = self.port();
        std::thread::spawn(move || {
            for inbound in listener.incoming().flatten() {
                let Ok(outbound) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                pipe(&inbound, &outbound);
                pipe(&outbound, &inbound);
            }
        });
        port
    }

    /// The port the API server listens on.
    /// A namespace, created (or left as it is).
    pub fn namespace(&self, name: &str) {
        self.apply(
            &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
                .to_string(),
        );
    }

    /// `deploy/<rel>` applied as its header says ([`as_written`]) into [`SYSTEM`].
    pub fn install(&self, rel: &str) {
        let out = self.kubectl_in(&["apply", "-n", SYSTEM, "-f", "-"], Some(&as_written(rel)));
        assert!(
            out.status.success(),
            "kubectl apply {rel}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The API server's process ID (to read its `/proc` entries).
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.id()
    }

    /// The API server stopped (SIGTERM, as a rolling upgrade stops it) and started again with
    /// the same arguments and port, etcd kept; returns when `/readyz` answers 200 again, with
    /// the time the old process took to exit and the new one to be ready. Its new output goes
    /// to `apiserver-<n>.log`.
    pub fn restart_apiserver(&mut self) -> (Duration, Duration) {
        self.start_again(nix::sys::signal::Signal::SIGTERM)
    }

    /// The API server killed (SIGKILL: a crash, or the OOM killer; its connections cut at
    /// once, where a SIGTERM waits up to a minute for its watches) and started again as
    /// [`ControlPlane::restart_apiserver`] does.
    pub fn crash_apiserver(&mut self) -> (Duration, Duration) {
        self.start_again(nix::sys::signal::Signal::SIGKILL)
    }

    fn start_again(&mut self, signal: nix::sys::signal::Signal) -> (Duration, Duration) {
        let t0 = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.apiserver.id() as i32),
            signal,
        );
        let _ = self.apiserver.wait();
        let stopped = t0.elapsed();
        let n = (1..)
            .find(|n| !self.dir.path().join(format!("apiserver-{n}.log")).exists())
            .unwrap();
        let log = self.dir.path().join(format!("apiserver-{n}.log"));
        let mut cmd = Command::new(&self.api_cmd[0]);
        cmd.args(&self.api_cmd[1..]);
        self.apiserver = spawn(cmd, &log);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.kubectl(&["get", "--raw", "/readyz"]).status.success() {
            if let Some(status) = self.apiserver.try_wait().unwrap() {
                panic!(
                    "kube-apiserver exited on restart ({status}):\n{}",
                    tail(&log)
                );
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready within 120 s of its restart:\n{}",
                tail(&log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        (stopped, t0.elapsed() - stopped)
    }

    /// The API server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The API server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("apiserver.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for c in [&mut self.apiserver, &mut self.etcd] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agent's namespace in these tests.
pub const SYSTEM: &str = "redirect-system";

/// `deploy/<rel>` (a plain manifest), as written.
pub fn deploy(rel: &str) -> String {
    std::fs::read_to_string(workspace().join("deploy").join(rel))
        .unwrap_or_else(|e| panic!("deploy/{rel}: {e}"))
}

/// A file of `deploy/` as its header says to apply it: the `SET-ME` namespace replaced, into
/// [`SYSTEM`] (the NetworkAttachmentDefinition names its own).
pub fn as_written(rel: &str) -> String {
    deploy(rel).replace(
        "namespace: kube-system # SET-ME",
        &format!("namespace: {SYSTEM}"),
    )
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(from: &std::net::TcpStream, to: &std::net::TcpStream) {
    let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}
