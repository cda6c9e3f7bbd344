//! Pods with `hostUsers: false`: the runtime makes the pod's network namespace inside a user
//! namespace of its own (the pod's root mapped to an unprivileged range). The plugin, root in
//! the node's user namespace, holds every capability over it: ADD programs the capture there,
//! CHECK reads it back, DEL removes it, as for any pod.

use cni_testkit as common;

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cni_env, mesh_conf, plugin, ARGS};
use redirect_testkit::kernel_tests_enabled;

/// A process in a new user namespace (its root mapped to 100000, as a runtime maps a
/// `hostUsers: false` pod) and a new network namespace owned by it.
struct UserNsPod(Child);

impl UserNsPod {
    fn start() -> UserNsPod {
        // Unmapped at first; the map is written from here, as the runtime writes it (root of
        // the node's user namespace needs no newuidmap).
        let child = Command::new("unshare")
            .args(["--user", "--net", "--", "sleep", "60"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let pod = UserNsPod(child);
        let ours = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
        let deadline = Instant::now() + Duration::from_secs(5);
        // `unshare` execs sleep once the namespaces are made.
        while std::fs::metadata(pod.path("user")).map(|m| m.ino()).ok() == Some(ours) {
            assert!(Instant::now() < deadline, "no user namespace made");
            std::thread::sleep(Duration::from_millis(10));
        }
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", pod.0.id()), "0 100000 65536\n").unwrap();
        }
        // The pod's interface and address, as the primary CNI gives them.
        let script = "ip link set lo up && ip link add eth0 type veth peer name peer0 && ip link set peer0 up && \
                      ip addr add 10.88.0.2/24 dev eth0 && ip link set eth0 up && \
                      ip route add default dev eth0";
        let out = Command::new("nsenter")
            .arg(format!("--net={}", pod.path("net")))
            .args(["sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        pod
    }

    fn path(&self, kind: &str) -> String {
        format!("/proc/{}/ns/{kind}", self.0.id())
    }
}

impl Drop for UserNsPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

#[test]
fn a_pod_in_a_user_namespace_is_captured_checked_and_released() {
    if !kernel_tests_enabled() {
        return;
    }
    let pod = UserNsPod::start();
    let netns = pod.path("net");
    // The pod's root is UID 100000 on the node: the namespace really is another user's.
    let map = std::fs::read_to_string(format!("/proc/{}/uid_map", pod.0.id())).unwrap();
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
