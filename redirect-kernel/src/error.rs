//! The kernel crate's errors: a namespace that cannot be opened or entered, a netlink request
//! the kernel refused or that failed before it answered, a read that never settled. Every
//! message names what was wrong, the value, and what to do about it.

use std::io;
use std::path::PathBuf;

use redirect_model::Family;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Routing values that would reroute all traffic (checked again here, below the config's
    /// own validation, since a wrong value here blackholes the namespace).
    #[error("invalid {field}: {value:?}: {expected}")]
    UnsafeRouting {
        field: &'static str,
        value: String,
        expected: String,
    },

    /// The namespace file could not be opened.
    #[error("cannot open network namespace {path}: {source}; check that the path exists (e.g. /var/run/netns/NAME or /proc/PID/ns/net) and that the pod is still running")]
    NetnsOpen { path: PathBuf, source: io::Error },

    /// The path opened, but what it names is not a network namespace (a regular file such as
    /// the mount point a namespace left behind, a directory, another kind of namespace).
    #[error("{path} is not a network namespace ({found}); the pod's namespace is /proc/PID/ns/net or /run/netns/NAME")]
    NotNetns { path: PathBuf, found: String },

    /// `setns` into the namespace failed.
    #[error(
        "cannot enter network namespace {path}: {source}; {}",
        enter_hint(source)
    )]
    NetnsEnter { path: PathBuf, source: io::Error },

    /// The thread that ran inside the namespace panicked or could not start.
    #[error("worker thread for network namespace {path} failed: {reason}")]
    NetnsThread { path: PathBuf, reason: String },

    /// A netlink socket operation failed before the kernel answered.
    #[error("netlink {op} failed: {source}{hint}")]
    Netlink {
        op: &'static str,
        source: io::Error,
        hint: &'static str,
    },

    /// The ruleset changed while our table was read, every time it was tried: what was read
    /// could mix two states, so it is not judged.
    #[error("the nf_tables ruleset kept changing while our table was read ({tries} reads, each overtaken by another writer); nothing was judged: try again once the other writer is done")]
    ReadUnsettled { tries: usize },

    /// The kernel rejected an nf_tables message.
    #[error("the kernel rejected {what}: {source} (errno {errno}){hint}")]
    NftRejected {
        what: String,
        errno: i32,
        source: io::Error,
        hint: &'static str,
    },

    /// A routing (rtnetlink) request failed.
    #[error("{what} ({family}) failed: {source} (errno {errno}){hint}")]
    Route {
        what: String,
        family: Family,
        errno: i32,
        source: io::Error,
        hint: &'static str,
    },

    /// A request about a network interface (rtnetlink link) failed.
    #[error("{what} failed: {source} (errno {errno}){hint}")]
    Link {
        what: String,
        errno: i32,
        source: io::Error,
        hint: &'static str,
    },
}

/// A hint for an errno returned by netlink, to put after the message.
/// Why `setns` failed: EINVAL means the file is no namespace at all, not a missing privilege.
fn enter_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EINVAL) => {
            "the path is not a network namespace file (use /proc/PID/ns/net or /run/netns/NAME)"
        }
        _ => "entering a namespace needs CAP_SYS_ADMIN (run as root)",
    }
}

pub fn errno_hint(errno: i32) -> &'static str {
    match errno {
        libc::EPERM | libc::EACCES => {
            "; hint: programming netfilter needs CAP_NET_ADMIN in the pod's network namespace (run as root or grant NET_ADMIN)"
        }
        libc::ENOENT => {
            "; hint: a table, chain or set the message refers to does not exist, or the kernel lacks the nf_tables module for an expression (modprobe nf_tables nft_redir nft_tproxy nft_ct nft_nat)"
        }
        libc::EOPNOTSUPP | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT => {
            "; hint: the kernel lacks nf_tables support for this (load the nf_tables, nft_chain_nat, nft_redir, nft_tproxy and nft_ct modules, or use the iptables backend on kernels without nf_tables)"
        }
        libc::EINVAL => "; hint: the kernel found a message malformed or an expression not allowed in this chain",
        libc::EBUSY => "; hint: the object is still in use (another rule or chain refers to it)",
        libc::EEXIST => "; hint: the object exists already",
        libc::ENOSPC | libc::ENOMEM | libc::ENOBUFS => {
            "; hint: the kernel ran out of memory or socket buffer for the batch"
        }
        _ => "",
    }
}
