//! An ambient pod with `hostUsers: false` (issue 46): its network namespace belongs to a user
//! namespace of its own (root mapped to 100000, as the runtime maps it). The agent finds it
//! through the host's `/proc` as any pod, enrolls it (in-pod rules, ztunnel told, annotation
//! `enabled`) and releases it when labelled `none`. Against a real API server.

use cni_testkit as common;

mod support;

use std::path::Path;
use std::time::Duration;

use common::ambient::{create_pod, running, Node};
use common::host_proc::cgroupfs;
use common::user_ns::UserNsPod;
use redirect_testkit::kernel_test;
use support::redirection;
use support::ztunnel::TestZtunnel;

/// A `hostUsers: false` pod with its address on a veth whose peer `peer` is in the node's
/// namespace (as `common::ambient::pod_netns` wires a pod).
fn user_ns_pod(n: &Node, ip: &str, peer: &str) -> UserNsPod {
    let pod = UserNsPod::start();
    n.host.sh(&format!(
        "ip link add {peer} type veth peer name eth0 netns {} && ip link set {peer} up && \
         ip addr add 10.77.0.1/32 dev {peer} && ip route add {ip}/32 dev {peer}",
        pod.pid()
    ));
    pod.sh(&format!(
        "ip link set lo up && ip addr add {ip}/32 dev eth0 && ip link set eth0 up && \
         ip route add default via 10.77.0.1 dev eth0 onlink"
    ));
    pod
}

fn has_rules(netns: &Path) -> bool {
    redirect_kernel::testing::nft_in(netns)
        .read()
        .unwrap()
        .is_some()
}

#[kernel_test]
fn an_ambient_pod_in_a_user_namespace_is_found_enrolled_and_released() {
    let n = Node::new();
    n.ambient_namespace("shop");
    let uid = create_pod(&n.cp, "shop", "web");
    let pod = user_ns_pod(&n, "10.77.0.2", "vweb");
    let netns = std::path::PathBuf::from(pod.ns("net"));
    n.proc.add(4100, &cgroupfs(&uid), 100, &netns);
    running(&n.cp, "shop", "web", "10.77.0.2");
    let z = TestZtunnel::start(&n.socket);
    let _agent = n.agent();
    common::eventually("web enrolled and served", Duration::from_secs(30), || {
        (redirection(&n.cp, "shop", "web").as_deref() == Some("enabled") && z.serves(&uid))
            .then_some(())
    });
    assert!(has_rules(&netns), "enrolled without its in-pod rules");

    support::opt_out(&n.cp, "shop", "web");
    common::eventually("web released", Duration::from_secs(30), || {
        (!z.serves(&uid) && !has_rules(&netns)).then_some(())
    });
}
