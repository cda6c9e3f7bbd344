//! Pods with `hostUsers: false`: the runtime makes the pod's network namespace inside a user
//! namespace of its own (the pod's root mapped to an unprivileged range). The plugin, root in
//! the node's user namespace, holds every capability over it: ADD programs the capture there,
//! CHECK reads it back, DEL removes it, as for any pod.

use cni_testkit as common;

use std::time::Duration;

use common::user_ns::UserNsPod;
use common::{cni_env, mesh_conf, plugin, ARGS};
use redirect_testkit::kernel_test;

/// A `hostUsers: false` pod with its interface and address, as the primary CNI gives them.
fn user_ns_pod() -> UserNsPod {
    let pod = UserNsPod::start();
    pod.sh(
        "ip link set lo up && ip link add eth0 type veth peer name peer0 && \
         ip link set peer0 up && ip addr add 10.88.0.2/24 dev eth0 && ip link set eth0 up && \
         ip route add default dev eth0",
    );
    pod
}

/// Where an app's connection to 10.88.0.9:80 from the pod lands: on a listener of the proxy's
/// outbound port 15001, or nowhere (nothing answers on the veth).
fn lands(netns: &str) -> &'static str {
    redirect_testkit::run_in(std::path::Path::new(netns), || {
        let proxy = std::net::TcpListener::bind("0.0.0.0:15001").unwrap();
        proxy.set_nonblocking(true).unwrap();
        let to = "10.88.0.9:80".parse().unwrap();
        let _ = std::net::TcpStream::connect_timeout(&to, Duration::from_millis(500));
        match proxy.accept() {
            Ok(_) => "the proxy's 15001",
            Err(_) => "nowhere",
        }
    })
}

#[kernel_test]
fn a_pod_in_a_user_namespace_is_captured_checked_and_released() {
    let pod = user_ns_pod();
    let netns = pod.ns("net");
    // The pod's root is UID 100000 on the node: the namespace really is another user's.
    let map = std::fs::read_to_string(format!("/proc/{}/uid_map", pod.pid())).unwrap();
    assert!(map.split_whitespace().eq(["0", "100000", "65536"]), "{map}");
    let tables = || {
        redirect_kernel::testing::nft_in(std::path::Path::new(&netns))
            .read()
            .unwrap()
            .map(|t| t.chains.len())
    };
    assert_eq!(tables(), None);
    for (cmd, then) in [("ADD", true), ("CHECK", true), ("DEL", false)] {
        let out = plugin(&cni_env(cmd, &netns, ARGS), &mesh_conf());
        assert_eq!(out.code, 0, "{cmd}: {}{}", out.stdout, out.stderr);
        assert_eq!(tables().is_some(), then, "{cmd}: {}", out.stderr);
        if cmd == "ADD" {
            assert_eq!(lands(&netns), "the proxy's 15001", "captured");
        }
    }
    assert_eq!(lands(&netns), "nowhere", "released, but still captured");
}
