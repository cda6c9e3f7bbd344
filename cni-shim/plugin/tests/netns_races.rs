//! The namespace the plugin checks is the namespace it enters. A `CNI_NETNS` whose target
//! changes between two system calls (a `/proc/<pid>/ns/net` whose PID is reused, a symlink that
//! is swapped) must never make ADD program, or DEL clean, the node's own namespace; and DEL of a
//! sandbox that is gone (a stale mount point, a path that is no namespace any more) succeeds,
//! while ADD and CHECK fail clearly.
//!
//! The node is played by a namespace of its own: the plugin runs inside it (`ip netns exec`),
//! so its host guard protects that namespace. `REDIRECT_RACE_RUNS` sets the number of runs of
//! each race (default 1000).

use cni_testkit as common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use common::{cni_env as env, mesh_conf, plugin, plugin_in, pod_ns, Out, ARGS};
use redirect_testkit::{kernel_test, TestNetns};

const TABLE: &str = "redirect_capture";

fn runs() -> usize {
    redirect_testkit::race_runs(1000)
}

/// The stand-in node: a namespace with an address of its own, as a node has, so a plugin that
/// entered it by mistake would find an address and program it.
fn node_ns() -> TestNetns {
    let ns = TestNetns::with_prefix("rdnode");
    ns.sh("ip link add ens3 type veth peer name peer3 && ip addr add 10.44.0.1/24 dev ens3 && ip link set ens3 up");
    ns
}

fn has_table(ns: &TestNetns) -> bool {
    ns.sh("nft list tables").contains(TABLE)
}

/// A symlink swapped between two targets as fast as one thread can, atomically each time
/// (a new link renamed over the old one), until dropped.
struct Flipper {
    link: PathBuf,
    stop: Arc<AtomicBool>,
    flips: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Flipper {
    fn start(tag: &str, a: &Path, b: &Path) -> Flipper {
        let dir = std::env::temp_dir().join(format!("rdc-flip-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("netns");
        symlink(a, &link).unwrap();
        let (stop, flips) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let thread = {
            let (stop, flips, link) = (stop.clone(), flips.clone(), link.clone());
            let (a, b) = (a.to_owned(), b.to_owned());
            let tmp = dir.join("netns.next");
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for target in [&b, &a] {
                        let _ = std::fs::remove_file(&tmp);
                        symlink(target, &tmp).unwrap();
                        std::fs::rename(&tmp, &link).unwrap();
                        flips.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        Flipper {
            link,
            stop,
            flips,
            thread: Some(thread),
        }
    }

    fn path(&self) -> &str {
        self.link.to_str().unwrap()
    }
}

impl Drop for Flipper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.link.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn cni_code(out: &Out) -> Option<u64> {
    (out.code != 0).then(|| out.json()["code"].as_u64().unwrap_or(0))
}

#[kernel_test]
fn add_through_a_flipping_symlink_never_programs_the_node() {
    let node = node_ns();
    let pod = pod_ns();
    let flip = Flipper::start("add", pod.path(), node.path());
    let (mut captured, mut refused) = (0, 0);
    for i in 0..runs() {
        let out = plugin_in(&node, &env("ADD", flip.path(), ARGS), &mesh_conf());
        match cni_code(&out) {
            None => captured += 1,
            // HOST_NETNS: the plugin saw its own namespace and refused.
            Some(103) => refused += 1,
            Some(c) => panic!("ADD {i}: unexpected CNI error {c}: {}", out.stdout),
        }
        if i % 100 == 99 {
            assert!(
                !has_table(&node),
                "after {} ADDs ({captured} captured, {refused} refused): the node's own \
                 namespace holds table inet {TABLE}",
                i + 1
            );
        }
    }
    let flips = flip.flips.load(Ordering::Relaxed);
    drop(flip);
    assert!(
        !has_table(&node),
        "the node's own namespace holds our table"
    );
    assert!(has_table(&pod), "the pod was never captured");
    eprintln!("{captured} ADDs captured the pod, {refused} refused the node; {flips} flips");
    assert!(
        captured > 0 && refused > 0,
        "the race was not exercised: {captured} captured, {refused} refused"
    );
}

#[kernel_test]
fn del_through_a_flipping_symlink_never_cleans_the_node() {
    let node = node_ns();
    let pod = pod_ns();
    // The node has a table of that name (a test node, or a second runtime's plugin): a DEL
    // aimed at a pod must never delete it.
    node.sh(&format!("nft add table inet {TABLE}"));
    let flip = Flipper::start("del", pod.path(), node.path());
    for i in 0..runs() {
        if i % 50 == 0 {
            pod.sh(&format!("nft add table inet {TABLE}"));
        }
        let out = plugin_in(&node, &env("DEL", flip.path(), ARGS), &mesh_conf());
        assert_eq!(out.code, 0, "DEL {i}: {}\n{}", out.stdout, out.stderr);
        if i % 100 == 99 {
            assert!(
                has_table(&node),
                "after {} DELs the node's own table is gone",
                i + 1
            );
        }
    }
    drop(flip);
    assert!(has_table(&node), "a DEL deleted the node's own table");
}

/// The empty file a namespace's bind mount leaves once it is unmounted (the runtime tore the
/// sandbox down and a DEL comes late), and a directory: paths that exist but are no namespace.
struct Stale {
    file: PathBuf,
    dir: PathBuf,
}

impl Stale {
    fn new() -> Stale {
        let ns = TestNetns::with_prefix("rdstale");
        let file = std::env::temp_dir().join(format!("rdc-stale-{}", std::process::id()));
        // The mount point as the runtime leaves it: an empty file.
        std::fs::write(&file, "").unwrap();
        std::process::Command::new("mount")
            .args([
                "--bind",
                ns.path().to_str().unwrap(),
                file.to_str().unwrap(),
            ])
            .status()
            .unwrap();
        let s = std::process::Command::new("umount")
            .arg(&file)
            .status()
            .unwrap();
        assert!(s.success(), "umount {}", file.display());
        let dir = std::env::temp_dir().join(format!("rdc-stale-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Stale { file, dir }
    }
}

impl Drop for Stale {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[kernel_test]
fn del_of_a_sandbox_that_is_gone_succeeds_add_and_check_fail_clearly() {
    let stale = Stale::new();
    let mnt = "/proc/self/ns/mnt";
    let paths = [
        (stale.file.to_str().unwrap(), "stale mount point"),
        (stale.dir.to_str().unwrap(), "directory"),
        (mnt, "a mount namespace"),
    ];
    for (path, what) in paths {
        let out = plugin(&env("DEL", path, ARGS), &mesh_conf());
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, ""),
            "DEL of a {what}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("nothing to remove"),
            "DEL of a {what} says why it did nothing: {}",
            out.stderr
        );
        for cmd in ["ADD", "CHECK"] {
            let out = plugin(&env(cmd, path, ARGS), &mesh_conf());
            assert_eq!(out.code, 1, "{cmd} of a {what}: {}", out.stderr);
            let e = out.json();
            assert_eq!(e["code"], 3, "{cmd} of a {what}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(path) && text.contains("not a network namespace"),
                "{cmd} of a {what}: {text}"
            );
        }
    }
}
