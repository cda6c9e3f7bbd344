//! One error type for the library and the programs on it (`redirect_core::Error` is this
//! one). Each variant holds the error of the part that failed, which names the value and the
//! fix, and is transparent: `Display` is that message and `source()` is that error's own
//! source, so a chain reporter (anyhow's `{:#}`, a program's own) prints each message once.
//! Match on the variant (and its error) when a caller needs more than the message.

use redirect_kernel::{netns, nft, routes};

use crate::capture::Refused;

/// A result whose error is this crate's [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why capture could not be planned, applied, read or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A config value that cannot be planned: the field, the value, and what is accepted.
    #[error(transparent)]
    Config(#[from] redirect_model::Error),

    /// The namespace could not be opened, is not a network namespace, or could not be entered.
    #[error(transparent)]
    Namespace(#[from] netns::Error),

    /// nftables refused our table, or a read of it did not settle.
    #[error(transparent)]
    Rules(#[from] nft::Error),

    /// The routes beside the rules (TPROXY policy routing, `::6` on `lo`) or the interfaces'
    /// addresses could not be read or written.
    #[error(transparent)]
    Routes(#[from] routes::Error),

    /// What the namespace holds needs another policy: capture rules we did not write, or
    /// ours for another capture. Nothing was changed.
    #[error(transparent)]
    Refused(#[from] Refused),

    /// A capture that cannot be handed back in Istio's form: what has no equivalent in
    /// Istio's rules, and what to do. Nothing was changed.
    #[error(transparent)]
    HandBack(#[from] crate::nft_form::Unsupported),

    /// One of Istio's IP sets (its host probe sets) could not be read or destroyed.
    #[error("IP set {set}: could not {op} it")]
    IpSet {
        /// The set's name.
        set: String,
        /// What was tried: `read` or `destroy`.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        cause: std::io::Error,
    },

    /// An external tool failed: the iptables backend's `iptables-restore`, or the node's
    /// `iptables-save` listing Istio's chains.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The binary, as run (e.g. `iptables-nft-restore`).
        tool: String,
        /// What it printed, or why it could not run, and what to do about it.
        detail: String,
    },
}

impl Error {
    /// The kernel features found missing, when nf_tables refused our table for lacking them
    /// (a program adds its own way out: `MissingFeature::message_with`).
    pub fn missing_feature(&self) -> Option<&nft::MissingFeature> {
        match self {
            Error::Rules(e) => e.missing_feature(),
            _ => None,
        }
    }
}

impl From<redirect_kernel::Error> for Error {
    fn from(e: redirect_kernel::Error) -> Self {
        match e {
            redirect_kernel::Error::Netns(e) => e.into(),
            redirect_kernel::Error::Nft(e) => e.into(),
            redirect_kernel::Error::Routes(e) => e.into(),
            redirect_kernel::Error::Model(e) => e.into(),
        }
    }
}
