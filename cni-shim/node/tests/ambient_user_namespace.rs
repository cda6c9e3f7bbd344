//! An ambient pod with `hostUsers: false` (issue 46): its network namespace belongs to a user
//! namespace of its own (root mapped to 100000, as the runtime maps it). The agent finds it
//! through the host's `/proc` as any pod, enrolls it (in-pod rules, ztunnel told, annotation
//! `enabled`) and releases it when labelled `none`. Against a real API server.

use cni_testkit as common;

mod support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::ambient::{create_pod, running, Node};
use common::host_proc::cgroupfs;
use redirect_testkit::kernel_tests_enabled;
use support::redirection;
use support::ztunnel::TestZtunnel;

/// A process in new user and network namespaces, mapped as a runtime maps them; killed on drop.
struct UserNsPod(Child);

impl Drop for UserNsPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pod's namespaces, and its address on a veth whose peer `peer` is in the node's
/// namespace (as `common::ambient::pod_netns` wires a pod).
fn user_ns_pod(n: &Node, ip: &str, peer: &str) -> UserNsPod {
    let pod = UserNsPod(
        Command::new("unshare")
            .args(["--user", "--net", "--", "sleep", "120"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)"),
    );
    let pid = pod.0.id();
    let ours = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::metadata(format!("/proc/{pid}/ns/user"))
        .map(|m| m.ino())
        .ok()
        == Some(ours)
    {
        assert!(Instant::now() < deadline, "no user namespace made");
        std::thread::sleep(Duration::from_millis(10));
    }
    for map in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{map}"), "0 100000 65536\n").unwrap();
    }
    n.host.sh(&format!(
        "ip link add {peer} type veth peer name eth0 netns {pid} && ip link set {peer} up && \
         ip addr add 10.77.0.1/32 dev {peer} && ip route add {ip}/32 dev {peer}"
    ));
    let inside = format!(
        "ip link set lo up && ip addr add {ip}/32 dev eth0 && ip link set eth0 up && \
         ip route add default via 10.77.0.1 dev eth0 onlink"
    );
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["sh", "-c", &inside])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    pod
}

fn has_rules(netns: &Path) -> bool {
    redirect_kernel::testing::nft_in(netns)
        .read()
        .unwrap()
        .is_some()
}

#[test]
fn an_ambient_pod_in_a_user_namespace_is_found_enrolled_and_released() {
    if !kernel_tests_enabled() {
        return;
    }
    let n = Node::new();
    n.ambient_namespace("shop");
    let uid = create_pod(&n.cp, "shop", "web");
    let pod = user_ns_pod(&n, "10.77.0.2", "vweb");
    let netns = std::path::PathBuf::from(format!("/proc/{}/ns/net", pod.0.id()));
    n.proc.add(4100, &cgroupfs(&uid), 100, &netns);
    running(&n.cp, "shop", "web", "10.77.0.2");
    let z = TestZtunnel::start(&n.socket);
    let _agent = n.agent();
    common::eventually("web enrolled and served", Duration::from_secs(30), || {
        (redirection(&n.cp, "shop", "web").as_deref() == Some("enabled") && z.serves(&uid))
            .then_some(())
    });
    assert!(has_rules(&netns), "enrolled without its in-pod rules");

    n.cp.kubectl_ok(&[
        "label",
        "pod",
        "web",
        "-n",
        "shop",
        "istio.io/dataplane-mode=none",
    ]);
    common::eventually("web released", Duration::from_secs(30), || {
        (!z.serves(&uid) && !has_rules(&netns)).then_some(())
    });
}
