//! The node's `/proc` as the agent reads it (a mounted `/host/proc`), stood in for by a folder
//! laid out like it: `<pid>/cgroup`, `<pid>/stat`, `<pid>/ns/net` as a link to a real namespace.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

/// A folder laid out like `/proc`.
pub struct FakeProc(tempfile::TempDir);

impl Default for FakeProc {
    fn default() -> FakeProc {
        FakeProc(tempfile::tempdir().unwrap())
    }
}

impl FakeProc {
    /// An empty one, in a temporary folder removed on drop.
    pub fn new() -> FakeProc {
        FakeProc::default()
    }

    /// Its folder, to give the agent as the host's `/proc`.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Process `pid`, in cgroup `cgroup`, started at `start` ticks, in namespace `ns`.
    pub fn add(&self, pid: u32, cgroup: &str, start: u64, ns: &Path) {
        let dir = self.path().join(pid.to_string());
        fs::create_dir_all(dir.join("ns")).unwrap();
        fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
        fs::write(
            dir.join("stat"),
            format!("{pid} (pause) S 1 {pid} {pid} 0 -1 4194560 97 0 0 0 0 0 0 0 20 0 1 0 {start} 1081344 1 0\n"),
        )
        .unwrap();
        symlink(ns, dir.join("ns/net")).unwrap();
    }
}

impl FakeProc {
    /// kubelet, as process `pid` running as `uid` (what ambient's probe SNAT looks for:
    /// `comm`, an argument naming kubelet, the `Uid:` line of `status`).
    pub fn add_kubelet(&self, pid: u32, uid: u32) {
        let dir = self.path().join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("comm"), "kubelet\n").unwrap();
        fs::write(
            dir.join("cmdline"),
            "/usr/bin/kubelet\0--config=/var/lib/kubelet/config.yaml\0",
        )
        .unwrap();
        fs::write(
            dir.join("status"),
            format!("Name:\tkubelet\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
    }
}

/// A cgroupfs-driver path for a pod's container.
pub fn cgroupfs(uid: &str) -> String {
    format!("/kubepods/besteffort/pod{uid}/0123456789abcdef")
}
