//! What the agent's end-to-end ambient tests share: ztunnel's stand-in, and what they read of
//! the node, the pods and the API.
#![allow(dead_code)]

pub mod ztunnel;

use cni_testkit::apiserver::ControlPlane;
use redirect_testkit::TestNetns;

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
