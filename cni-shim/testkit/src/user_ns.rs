//! A pod with `hostUsers: false`, as a runtime makes it: a process in new user and network
//! namespaces, the pod's root mapped to UID and GID 100000 on the node (written from here, as
//! the runtime writes the maps: root of the node's user namespace needs no `newuidmap`).

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pod's process; killed on drop (its namespaces go with it).
pub struct UserNsPod(Child);

impl UserNsPod {
    /// Starts it and waits until its user namespace is made, then maps it.
    pub fn start() -> UserNsPod {
        let pod = UserNsPod(
            Command::new("unshare")
                .args(["--user", "--net", "--", "sleep", "120"])
                .stdin(Stdio::null())
                .spawn()
                .expect("unshare (util-linux)"),
        );
        let ours = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
        let deadline = Instant::now() + Duration::from_secs(5);
        // `unshare` execs sleep once the namespaces are made.
        while std::fs::metadata(pod.ns("user")).map(|m| m.ino()).ok() == Some(ours) {
            assert!(Instant::now() < deadline, "no user namespace made");
            std::thread::sleep(Duration::from_millis(10));
        }
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", pod.pid()), "0 100000 65536\n").unwrap();
        }
        pod
    }

    /// The process's PID on the node.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// `/proc/<pid>/ns/<kind>`.
    pub fn ns(&self, kind: &str) -> String {
        format!("/proc/{}/ns/{kind}", self.pid())
    }

    /// `sh -c script` in the pod's network namespace; panics with its stderr if it fails.
    pub fn sh(&self, script: &str) {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns("net")))
            .args(["sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "in the pod's namespace: {script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for UserNsPod {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
