//! Ambient mode's test node: the node's own network namespace (where the agent programs the
//! host's probe SNAT), which reaches the real API server through a forwarder; the host's
//! `/proc` with kubelet in it; ztunnel's socket folder; pods in namespaces of their own joined
//! to the node by veth pairs. For `cni-shim/node/tests/ambient.rs` and the ambient bench.

use std::path::{Path, PathBuf};

use redirect_testkit::TestNetns;
use serde_json::{json, Value};

use crate::agent::{Agent, AgentSpec};
use crate::apiserver::{ControlPlane, SYSTEM};
use crate::host_proc::FakeProc;
use crate::{cni_env, node_bin, plugin_bin, plugin_in, Out};

/// How long the kit waits for the agent.
const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The node's name.
pub const NODE: &str = "worker-3";
/// kubelet's UID in the stand-in of the host's `/proc`.
pub const KUBELET_UID: u32 = 4321;

/// A pod's namespace: `ip` on a veth whose peer is in the node's namespace (routed there,
/// with the node's address `10.77.0.1`, the pod's gateway), loopback up.
pub fn pod_netns(node: &TestNetns, ip: &str, peer: &str) -> TestNetns {
    let ns = TestNetns::with_prefix("rdamb");
    ns.sh(&format!(
        "ip link set lo up && ip link add eth0 type veth peer name {peer} netns {node} && \
         ip addr add {ip}/32 dev eth0 && ip link set eth0 up && \
         ip route add default via 10.77.0.1 dev eth0 onlink",
        node = node.name()
    ));
    node.sh(&format!(
        "ip link set {peer} up && ip addr add 10.77.0.1/32 dev {peer} && \
         ip route add {ip}/32 dev {peer}"
    ));
    ns
}

/// Gives the pod of [`pod_netns`] (its veth peer `peer` in `node`) the IPv6 address `ip6` too,
/// routed the same way (the node's `fd77::1` its gateway).
pub fn add_ipv6(node: &TestNetns, pod: &TestNetns, ip6: &str, peer: &str) {
    pod.sh(&format!(
        "ip -6 addr add {ip6}/128 dev eth0 nodad && \
         ip -6 route add fd77::1/128 dev eth0 && ip -6 route add default via fd77::1 dev eth0"
    ));
    node.sh(&format!(
        "ip -6 addr add fd77::1/128 dev {peer} nodad && ip -6 route add {ip6}/128 dev {peer}"
    ));
    // Neighbour discovery waits for the link-local addresses' duplicate detection to end.
    crate::eventually(
        "no tentative IPv6 address left",
        std::time::Duration::from_secs(10),
        || {
            let tentative = |ns: &TestNetns| ns.sh("ip -6 addr show tentative").trim().is_empty();
            (tentative(pod) && tentative(node)).then_some(())
        },
    );
}

/// A plain pod (no sidecar) on this node; returns its UID.
pub fn create_pod(cp: &ControlPlane, namespace: &str, name: &str) -> String {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": NODE, "serviceAccountName": "default",
                 "containers": [{"name": "app", "image": "app"}]}});
    let out = cp.kubectl_in(&["create", "-o", "json", "-f", "-"], Some(&pod.to_string()));
    assert!(
        out.status.success(),
        "kubectl create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// The pod Running with the one address `ip`: [`running_with`].
pub fn running(cp: &ControlPlane, namespace: &str, name: &str, ip: &str) {
    running_with(cp, namespace, name, &[ip]);
}

/// The pod Running with these addresses (the first is `podIP`), as kubelet reports them.
pub fn running_with(cp: &ControlPlane, namespace: &str, name: &str, ips: &[&str]) {
    let listed: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    cp.set_pod_status(
        namespace,
        name,
        &json!({"phase": "Running", "podIP": ips[0], "podIPs": listed}),
    );
}

/// A folder only root may write, for ztunnel's socket.
fn socket_dir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("ztunnel");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (d, dir.join("ztunnel.sock"))
}

/// How [`Node::agent_as`] starts the agent.
#[derive(Default)]
pub struct Launch<'a> {
    /// More arguments.
    pub args: &'a [&'a str],
    /// More environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// The umask it starts with (the runtime's default when `None`).
    pub umask: Option<u32>,
    /// Return at once, not when it lets ztunnel connect (an agent expected to stop).
    pub no_wait: bool,
}

/// The node: its own network namespace (the agent programs the host's probe SNAT there),
/// which reaches the API server through a forwarder; the host's `/proc` with kubelet in it.
pub struct Node {
    /// The node's own network namespace, where the agent runs.
    pub host: TestNetns,
    /// The forwarder's port in `host`, through which the agent reaches the API server.
    pub api_port: u16,
    /// The real API server, with the agent's RBAC installed.
    pub cp: ControlPlane,
    /// The agent's service account folder (token, ca.crt).
    pub sa: tempfile::TempDir,
    /// The host's `/proc` as the agent sees it, kubelet in it.
    pub proc: FakeProc,
    /// The node folder: the agent's `net`, `bin` and `run`.
    pub node: tempfile::TempDir,
    /// ztunnel's ZDS socket, in a folder only root may write.
    pub socket: PathBuf,
    _socket_dir: tempfile::TempDir,
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

impl Node {
    /// The control plane with the RBAC of `redirect-cni.yaml` and `ambient.yaml`, and the rest.
    pub fn new() -> Node {
        let cp = ControlPlane::start();
        cp.namespace(SYSTEM);
        cp.install("kubernetes/redirect-cni.yaml");
        cp.install("kubernetes/ambient.yaml");
        let sa = cp.service_account_dir(SYSTEM, "redirect-cni");
        let (_socket_dir, socket) = socket_dir();
        let host = TestNetns::with_prefix("rdnode");
        host.sh("ip link set lo up");
        let api_port = cp.forward_from(&host);
        let proc = FakeProc::new();
        proc.add_kubelet(700, KUBELET_UID);
        Node {
            host,
            api_port,
            cp,
            sa,
            proc,
            node: tempfile::tempdir().unwrap(),
            socket,
            _socket_dir,
        }
    }

    /// The agent with ambient mode on (no repair), in the node's namespace; returned once it
    /// lets ztunnel connect.
    pub fn agent(&self) -> Agent {
        self.agent_with(&[])
    }

    /// [`Node::agent`] with more arguments.
    pub fn agent_with(&self, more: &[&str]) -> Agent {
        self.agent_as(&Launch {
            args: more,
            ..Launch::default()
        })
    }

    /// The agent launched as `launch` says; returned once it lets ztunnel connect, unless
    /// `launch.no_wait`.
    pub fn agent_as(&self, launch: &Launch) -> Agent {
        let address = format!("--ztunnel-uds-address={}", self.socket.display());
        let mut extra = vec!["--ambient-enabled", "--repair-enabled=false", &address];
        extra.extend_from_slice(launch.args);
        let agent = Agent::start(&AgentSpec {
            cp: &self.cp,
            sa: self.sa.path(),
            proc: self.proc.path(),
            node: self.node.path(),
            node_name: NODE,
            bin: Path::new(node_bin()),
            plugin: Path::new(plugin_bin()),
            extra: &extra,
            api_port: Some(self.api_port),
            netns: Some(self.host.name()),
            env: launch.env,
            umask: launch.umask,
        });
        if !launch.no_wait {
            agent.line_with(&["ambient:", "enrolled at start; ztunnel may connect"]);
        }
        agent
    }

    /// The plugin's socket in the agent's run directory.
    pub fn plugin_socket(&self) -> PathBuf {
        self.node.path().join("run").join(cni_plugin_socket_name())
    }

    /// Namespace `name`, created and labelled `istio.io/dataplane-mode=ambient`.
    pub fn ambient_namespace(&self, name: &str) {
        self.cp.namespace(name);
        self.cp.kubectl_ok(&[
            "label",
            "namespace",
            name,
            "istio.io/dataplane-mode=ambient",
        ]);
    }

    /// The plugin's ADD of `namespace/name` in `ns`, with the config the agent installed.
    pub fn add(&self, ns: &TestNetns, namespace: &str, name: &str, uid: &str) -> Out {
        self.cni("ADD", ns, namespace, name, uid, &[])
    }

    /// The plugin's `command` (ADD, CHECK, DEL) of `namespace/name` in `ns`, with the config
    /// the agent installed and, when `ips` are given, a previous plugin's result listing them
    /// (as a chained plugin gets them).
    pub fn cni(
        &self,
        command: &str,
        ns: &TestNetns,
        namespace: &str,
        name: &str,
        uid: &str,
        ips: &[&str],
    ) -> Out {
        let conf_path = self.node.path().join("net/redirect-cni.conf");
        // The installer writes it once the agent is up.
        let text = crate::eventually("the plugin's config installed", WAIT, || {
            std::fs::read_to_string(&conf_path).ok()
        });
        let mut conf: Value = serde_json::from_str(&text).unwrap();
        if !ips.is_empty() {
            let listed: Vec<Value> = ips
                .iter()
                .map(|ip| {
                    let len = if ip.contains(':') { 128 } else { 32 };
                    json!({"address": format!("{ip}/{len}")})
                })
                .collect();
            conf["prevResult"] = json!({"cniVersion": conf["cniVersion"], "ips": listed});
        }
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID={uid}"
        );
        // In the node's namespace: the kubeconfig the agent wrote names the forwarder there.
        plugin_in(
            &self.host,
            &cni_env(command, ns.path().to_str().unwrap(), &args),
            &conf.to_string(),
        )
    }
}

/// The plugin's ambient socket's name (`cni_plugin::ambient::SOCKET_NAME`; the kit does not
/// link the plugin).
fn cni_plugin_socket_name() -> &'static str {
    "ambient.sock"
}

/// `testpod ztunnel`, ztunnel's stand-in as on the real node (a process of its own), on the
/// agent's ZDS socket; killed when dropped.
pub struct ZtunnelProcess(std::process::Child);

impl ZtunnelProcess {
    /// Starts it on the agent's ZDS socket at `socket`.
    pub fn start(socket: &Path) -> ZtunnelProcess {
        let child = std::process::Command::new(crate::testpod_bin())
            .arg("ztunnel")
            .arg(socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ZtunnelProcess(child)
    }

    /// Kills it and waits for it to end (dropping it does too).
    pub fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ZtunnelProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
