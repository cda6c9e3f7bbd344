//! What the agent's end-to-end ambient tests share: ztunnel's stand-in, and what they read of
//! the node, the pods and the API.
#![allow(dead_code)]

pub mod ztunnel;

use cni_testkit::ambient::{create_pod, pod_netns, running, Node};
use cni_testkit::apiserver::ControlPlane;
use cni_testkit::host_proc::cgroupfs;
use redirect_testkit::TestNetns;

/// A pod of namespace `shop` on the node: created, its namespace with `ip` (its veth peer
/// `v<name>` in the node), a process of it in the host's `/proc` (pid `pid`); running with its
/// address when `status` (else only the plugin's ADD enrolls it).
pub struct TestPod {
    pub uid: String,
    pub name: String,
    pub ip: String,
    pub netns: TestNetns,
}

pub fn pod(n: &Node, name: &str, ip: &str, pid: u32, status: bool) -> TestPod {
    let uid = create_pod(&n.cp, "shop", name);
    let netns = pod_netns(&n.host, ip, &format!("v{name}"));
    n.proc.add(pid, &cgroupfs(&uid), 100, netns.path());
    if status {
        running(&n.cp, "shop", name, ip);
    }
    TestPod {
        uid,
        name: name.into(),
        ip: ip.into(),
        netns,
    }
}

impl TestPod {
    /// Its `ambient.istio.io/redirection`.
    pub fn annotation(&self, n: &Node) -> Option<String> {
        redirection(&n.cp, "shop", &self.name)
    }

    /// The plugin's `command` (ADD, CHECK, DEL) for it, as the runtime calls it.
    pub fn cni(&self, n: &Node, command: &str) -> cni_testkit::Out {
        n.cni(
            command,
            &self.netns,
            "shop",
            &self.name,
            &self.uid,
            &[self.ip.as_str()],
        )
    }

    pub fn add(&self, n: &Node) -> cni_testkit::Out {
        self.cni(n, "ADD")
    }
}

/// A connection from the node as `uid` (kubelet's, or any other process's) to `ip`:8080, as
/// "nowhere (connect: ...)" when it fails within 2 s.
pub fn connect_as(node: &TestNetns, uid: u32, ip: &str) -> Result<std::net::TcpStream, String> {
    let to = std::net::SocketAddr::new(ip.parse().unwrap(), 8080);
    node.run(move || {
        redirect_testkit::netns::become_ids(uid, uid).unwrap();
        std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(2))
    })
    .map_err(|e| format!("nowhere (connect: {e})"))
}

/// The source of the connection `app` accepts, if one is waiting.
pub fn accepted(app: &std::net::TcpListener) -> Option<String> {
    app.accept()
        .ok()
        .map(|(_, from)| format!("app from {}", from.ip()))
}

/// Labels pod `name` of `namespace` `istio.io/dataplane-mode=none`: out of ambient.
pub fn opt_out(cp: &ControlPlane, namespace: &str, name: &str) {
    cp.kubectl_ok(&[
        "label",
        "pod",
        name,
        "-n",
        namespace,
        "istio.io/dataplane-mode=none",
    ]);
}

/// The pod addresses in the node's probe SNAT sets.
pub fn probe_members(node: &TestNetns) -> Vec<String> {
    let ns = redirect_core::Namespace::open(node.path()).unwrap();
    let members = ns.members().unwrap().unwrap_or_default();
    members.iter().map(|a| a.to_string()).collect()
}

/// Whether our table is in `ns`.
pub fn has_rules(ns: &TestNetns) -> bool {
    redirect_kernel::testing::nft_in(ns.path())
        .read()
        .unwrap()
        .is_some()
}

/// The pod's `ambient.istio.io/redirection` annotation.
pub fn redirection(cp: &ControlPlane, namespace: &str, name: &str) -> Option<String> {
    let pod = cp.get(&["pod", name, "-n", namespace]);
    pod["metadata"]["annotations"]["ambient.istio.io/redirection"]
        .as_str()
        .map(str::to_owned)
}

/// The pod's `metadata.resourceVersion`: it changes with every write.
pub fn resource_version(cp: &ControlPlane, namespace: &str, name: &str) -> String {
    let pod = cp.get(&["pod", name, "-n", namespace]);
    pod["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The process's threads and open descriptors.
pub fn threads_and_fds(pid: u32) -> (usize, usize) {
    let count = |d: String| std::fs::read_dir(d).map(|d| d.count()).unwrap_or(0);
    (
        count(format!("/proc/{pid}/task")),
        count(format!("/proc/{pid}/fd")),
    )
}
