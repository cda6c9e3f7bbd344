//! The Istio crate's errors: the model's and the kernel's, and a tool (an iptables binary) that
//! failed. Every message names what was wrong, the value, and what to do about it.

/// A result whose error is this crate's [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in this crate: a bad config value, the kernel, or an iptables tool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value that cannot be planned.
    #[error(transparent)]
    Model(#[from] redirect_model::Error),

    /// The kernel refused, or a namespace could not be entered.
    #[error(transparent)]
    Kernel(#[from] redirect_kernel::Error),

    /// A rendered ruleset could not be loaded by an external tool, or the tool is missing.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The binary that failed, e.g. `iptables-nft-restore`.
        tool: String,
        /// What went wrong, and what to do about it.
        detail: String,
    },
}

impl Error {
    /// The kernel features found missing, when nf_tables refused our table for lacking them
    /// (a program adds its own way out: `MissingFeature::message_with`).
    pub fn missing_feature(&self) -> Option<&redirect_kernel::nft::MissingFeature> {
        match self {
            Error::Kernel(e) => e.missing_feature(),
            _ => None,
        }
    }
}

impl From<redirect_kernel::nft::Error> for Error {
    fn from(e: redirect_kernel::nft::Error) -> Self {
        Error::Kernel(e.into())
    }
}

impl From<redirect_kernel::routes::Error> for Error {
    fn from(e: redirect_kernel::routes::Error) -> Self {
        Error::Kernel(e.into())
    }
}

impl From<redirect_kernel::netns::Error> for Error {
    fn from(e: redirect_kernel::netns::Error) -> Self {
        Error::Kernel(e.into())
    }
}
