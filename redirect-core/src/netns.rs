//! Running code inside another network namespace (a pod's), without moving the caller.
//!
//! `setns(2)` changes the namespace of the calling *thread* only, and it stays changed until
//! that thread exits or switches back. Rust gives no guarantee about which thread runs what
//! next (thread pools, async runtimes, test harnesses reuse threads), so switching the caller's
//! thread could leak the pod's namespace into unrelated work, or fail to switch back. Instead
//! [`run_in`] gives the closure a dedicated, short-lived thread that enters the namespace and
//! dies with it; the caller's thread never changes namespace.
//!
//! Netlink sockets belong to the namespace of the thread that created them, so code run inside
//! opens its own sockets (as `routes` does).

use std::any::Any;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sched::{setns, CloneFlags};

use crate::error::{Error, Result};

/// Runs `f` in the network namespace at `path` (e.g. `/var/run/netns/NAME` or
/// `/proc/PID/ns/net`) on a dedicated thread and returns what `f` returns.
///
/// The namespace file is opened before the thread starts, so a missing path fails fast with
/// [`Error::NetnsOpen`]. A failing `setns` gives [`Error::NetnsEnter`] and `f` does not run.
/// A panic in `f` becomes [`Error::NetnsThread`]. `f` may borrow from the caller (scoped thread).
pub fn run_in<T: Send, F: FnOnce() -> T + Send>(path: &Path, f: F) -> Result<T> {
    let ns = File::open(path).map_err(|source| Error::NetnsOpen {
        path: path.to_owned(),
        source,
    })?;
    run_in_file(&ns, path, f)
}

/// [`run_in`] for a namespace file the caller holds open, so the namespace checked earlier is
/// the one entered (a `/proc/PID/...` path could name another namespace by then). `path` only
/// names it in errors.
pub fn run_in_file<T: Send, F: FnOnce() -> T + Send>(ns: &File, path: &Path, f: F) -> Result<T> {
    let thread_error = |reason: String| Error::NetnsThread {
        path: path.to_owned(),
        reason,
    };

    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("redirect-netns".into())
            .spawn_scoped(scope, || -> Result<T> {
                setns(ns, CloneFlags::CLONE_NEWNET).map_err(|errno| Error::NetnsEnter {
                    path: path.to_owned(),
                    source: io::Error::from(errno),
                })?;
                Ok(f())
            })
            .map_err(|e| thread_error(format!("cannot start the thread: {e}")))?;
        // Joining explicitly keeps a panic from propagating out of `scope`.
        worker
            .join()
            .map_err(|panic| thread_error(format!("panicked: {}", panic_message(&*panic))))?
    })
}

/// Identity of a network namespace: the device and inode of its nsfs file. Two paths name the
/// same namespace exactly when their ids are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

/// The id of the network namespace the calling thread is in.
pub fn current_netns_id() -> io::Result<NetnsId> {
    netns_id_of(Path::new("/proc/thread-self/ns/net"))
}

/// The id of the namespace file the caller holds open.
pub fn netns_id_of_file(f: &File) -> io::Result<NetnsId> {
    let meta = f.metadata()?;
    Ok(NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// The id of the network namespace that the namespace file at `path` refers to.
pub fn netns_id_of(path: &Path) -> io::Result<NetnsId> {
    let meta = std::fs::metadata(path)?;
    Ok(NetnsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(a panic payload that is not a string)"
    }
}

/// Whether `path` is a namespace file (nsfs: `/proc/PID/ns/net` or a bind mount of it under
/// `/run/netns`), not a regular file or a directory that merely exists.
pub fn is_namespace_file(path: &Path) -> io::Result<bool> {
    let fs = nix::sys::statfs::statfs(path).map_err(io::Error::from)?;
    Ok(fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}
