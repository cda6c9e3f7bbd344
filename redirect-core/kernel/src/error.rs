//! The kernel crate's errors, one enum per module (`netns::Error`, `nft::Error`,
//! `routes::Error`), and this one over them for a job that needs several. Every message names
//! what was wrong, the value, and what to do about it.

/// A result whose error is, by default, the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a job over several of the kernel's parts failed: the error of the part that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A network namespace could not be opened, judged or entered.
    #[error(transparent)]
    Netns(#[from] crate::netns::Error),
    /// An nf_tables job (our table, other tables) failed.
    #[error(transparent)]
    Nft(#[from] crate::nft::Error),
    /// A routing job (TPROXY rules and routes, `::6` on `lo`, the addresses) failed.
    #[error(transparent)]
    Routes(#[from] crate::routes::Error),
    /// A value the model refused (a host probe address that cannot be a pod's).
    #[error(transparent)]
    Model(#[from] redirect_model::Error),
}

impl Error {
    /// The kernel features found missing, when nf_tables refused our table for lacking them.
    pub fn missing_feature(&self) -> Option<&crate::nft::MissingFeature> {
        match self {
            Error::Nft(e) => e.missing_feature(),
            _ => None,
        }
    }
}

/// A hint for an errno returned by netlink, to put after the message.
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
