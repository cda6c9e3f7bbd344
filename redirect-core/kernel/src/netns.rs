//! Running code inside another network namespace (a pod's), without moving the caller.
//!
//! `setns(2)` changes the namespace of the calling *thread* only, and it stays changed until
//! that thread exits or switches back. Rust gives no guarantee about which thread runs what
//! next (thread pools, async runtimes, test harnesses reuse threads), so switching the caller's
//! thread could leak the pod's namespace into unrelated work, or fail to switch back. Instead
//! [`Netns::run`] gives the closure a dedicated, short-lived thread that enters the namespace
//! and dies with it; the caller's thread never changes namespace.
//!
//! Netlink sockets belong to the namespace of the thread that created them, so a handle
//! opened in a namespace (`Nft::open_in`, `Routes::open_in`) creates its socket on such a
//! thread and then serves from any thread.
//!
//! A path is named once: [`Netns::open`] opens it, judges the open descriptor (an nsfs file of
//! a network namespace; its device and inode for the host guard) and enters that descriptor,
//! never the path again. The plugin, `redirect-init --network-namespace`, `inspect --netns`
//! and the repair controller all go through it.

use std::any::Any;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{setns, CloneFlags};

type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a namespace could not be opened, judged or entered.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The namespace file could not be opened.
    #[error("cannot open network namespace {path}: {cause}; check that the path exists (e.g. /var/run/netns/NAME or /proc/PID/ns/net) and that the pod is still running")]
    Open {
        /// The path given.
        path: PathBuf,
        /// The open's error (in the message, not a `source()`).
        cause: io::Error,
    },

    /// The path opened, but what it names is not a network namespace (a regular file such as
    /// the mount point a namespace left behind, a directory, another kind of namespace).
    #[error("{path} is not a network namespace ({found}); the pod's namespace is /proc/PID/ns/net or /run/netns/NAME")]
    NotNetns {
        /// The path given.
        path: PathBuf,
        /// What the path names instead, in words ("a directory").
        found: String,
    },

    /// `setns` into the namespace failed.
    #[error(
        "cannot enter network namespace {path}: {cause}; {}",
        enter_hint(cause)
    )]
    Enter {
        /// The path the namespace was opened by.
        path: PathBuf,
        /// `setns`'s error (in the message, not a `source()`).
        cause: io::Error,
    },

    /// The thread that ran inside the namespace panicked or could not start.
    #[error("worker thread for network namespace {path} failed: {reason}")]
    Thread {
        /// The path the namespace was opened by.
        path: PathBuf,
        /// The panic's message, or why the thread could not start.
        reason: String,
    },
}

/// Why `setns` failed: EINVAL means the file is no namespace at all, not a missing privilege.
fn enter_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EINVAL) => {
            "the path is not a network namespace file (use /proc/PID/ns/net or /run/netns/NAME)"
        }
        _ => "entering a namespace needs CAP_SYS_ADMIN (run as root)",
    }
}

/// A network namespace held open: the descriptor that was judged is the one entered, so a
/// path whose target changes between two system calls (a `/proc/PID/ns/net` whose PID was
/// reused, a symlink swapped under us) can never send the work somewhere else. Open it once
/// with [`Netns::open`], judge it (`id`, `is_current`), and [`Netns::run`] in it.
#[derive(Debug)]
pub struct Netns {
    file: File,
    path: PathBuf,
    id: NetnsId,
}

impl std::os::fd::AsFd for Netns {
    /// The descriptor held (to hand the namespace to another process).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl Netns {
    /// Opens the namespace file at `path` and checks, on the open descriptor, that it is a
    /// network namespace: [`Error::Open`] when it cannot be opened (missing: the pod is
    /// gone), [`Error::NotNetns`] when it is something else (the empty mount point a namespace
    /// leaves when it is unmounted, a directory, another kind of namespace).
    pub fn open(path: &Path) -> Result<Netns> {
        let file = File::open(path).map_err(|cause| Error::Open {
            path: path.to_owned(),
            cause,
        })?;
        Netns::from_file(file, path)
    }

    /// [`Netns::open`] for a file the caller opened; `path` names it in errors and logs.
    pub fn from_file(file: File, path: &Path) -> Result<Netns> {
        let not = |found: String| Error::NotNetns {
            path: path.to_owned(),
            found,
        };
        let io = |cause: io::Error| Error::Open {
            path: path.to_owned(),
            cause,
        };
        let meta = file.metadata().map_err(io)?;
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| io(e.into()))?;
        if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
            return Err(not(kind_of(&meta)));
        }
        match namespace_type(&file) {
            Ok(t) if t == libc::CLONE_NEWNET => {}
            Ok(t) => return Err(not(format!("a namespace of another kind (type {t:#x})"))),
            Err(e) => {
                return Err(not(format!(
                    "a namespace file whose type cannot be read: {e}"
                )))
            }
        }
        Ok(Netns {
            id: NetnsId {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            file,
            path: path.to_owned(),
        })
    }

    /// The namespace's identity, read from the open descriptor.
    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// The path it was opened by (for messages: it may name something else by now).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same namespace held by a second descriptor (dup: the same namespace whatever the
    /// path names by now).
    pub fn try_clone(&self) -> Result<Netns> {
        let file = self.file.try_clone().map_err(|cause| Error::Open {
            path: self.path.clone(),
            cause,
        })?;
        Ok(Netns {
            file,
            path: self.path.clone(),
            id: self.id,
        })
    }

    /// A second descriptor of the same namespace (for another process: ztunnel gets one).
    pub fn try_clone_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        Ok(self.file.try_clone()?.into())
    }

    /// Whether this is the namespace the calling thread is in (the node's, for the plugin).
    pub fn is_current(&self) -> io::Result<bool> {
        Ok(current_netns_id()? == self.id)
    }

    /// Runs `f` in this namespace on a dedicated thread and returns what `f` returns: see the
    /// module's comment. A failing `setns` gives [`Error::Enter`] and `f` does not run; a
    /// panic in `f` becomes [`Error::Thread`]. `f` may borrow from the caller.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T> {
        run_in_file(&self.file, &self.path, f)
    }
}

/// What a file that is not a namespace is, in words.
fn kind_of(meta: &std::fs::Metadata) -> String {
    let t = meta.file_type();
    if t.is_file() && meta.len() == 0 {
        "an empty regular file, as the mount point of an unmounted namespace is".into()
    } else if t.is_file() {
        "a regular file".into()
    } else if t.is_dir() {
        "a directory".into()
    } else {
        "not a namespace file".into()
    }
}

/// The `ioctl` the macro defines is `pub`: a private module keeps it inside the crate.
mod ioctl {
    // NS_GET_NSTYPE (linux/nsfs.h): _IO(0xb7, 0x3); the namespace's CLONE_NEW* type.
    nix::ioctl_none!(ns_get_nstype, 0xb7, 0x3);
}
use ioctl::ns_get_nstype;

/// The `CLONE_NEW*` type of an open namespace file (Linux 4.11+).
fn namespace_type(file: &File) -> io::Result<libc::c_int> {
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the type; the descriptor is open
    // for the duration of the call (borrowed from `file`).
    unsafe { ns_get_nstype(file.as_raw_fd()) }.map_err(io::Error::from)
}

/// Runs `f` in the namespace of a file the caller holds open; `path` only names it in errors.
fn run_in_file<T: Send, F: FnOnce() -> T + Send>(ns: &File, path: &Path, f: F) -> Result<T> {
    let thread_error = |reason: String| Error::Thread {
        path: path.to_owned(),
        reason,
    };

    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("redirect-netns".into())
            .spawn_scoped(scope, || -> Result<T> {
                setns(ns, CloneFlags::CLONE_NEWNET).map_err(|errno| Error::Enter {
                    path: path.to_owned(),
                    cause: io::Error::from(errno),
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
    /// The device of the nsfs file (`st_dev`).
    pub dev: u64,
    /// The inode of the nsfs file (`st_ino`): unique per namespace on that device.
    pub ino: u64,
}

/// The id of the network namespace the calling thread is in.
pub fn current_netns_id() -> io::Result<NetnsId> {
    netns_id_of(Path::new("/proc/thread-self/ns/net"))
}

/// The id of the network namespace that the namespace file at `path` refers to now (for tests
/// and reports; to judge a namespace before entering it, hold it: [`Netns::id`]).
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
