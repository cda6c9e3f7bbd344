//! One error type for a user of the library. Each variant holds the error of the part that
//! failed, which names the value and the fix, and is transparent: `Display` is that message and
//! `source()` is that error's own source, so a chain reporter (anyhow's `{:#}`, a program's own)
//! prints each message once. Match on the variant (and its error) when a caller needs more than
//! the message.

use redirect_kernel::{netns, nft, routes};

/// The layers' own errors, for a program that tells one failure from another (its exit codes):
/// each is also what a variant of [`Error`] holds.
pub use redirect_istio::{Error as IstioError, Result as IstioResult};
pub use redirect_kernel::netns::Error as NamespaceError;
pub use redirect_kernel::nft::Error as RulesError;
/// Kernel features our table needs that the kernel lacks (`RulesError::MissingFeature`), and
/// one such feature with its module and first Linux release.
pub use redirect_kernel::nft::{Feature as KernelFeature, MissingFeature};
pub use redirect_kernel::routes::Error as RoutesError;
pub use redirect_kernel::{Error as KernelError, Result as KernelResult};
pub use redirect_model::Error as ConfigError;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why capture could not be planned, applied, read or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A config value that cannot be planned: the field, the value, and what is accepted.
    #[error(transparent)]
    Config(redirect_model::Error),

    /// The namespace could not be opened, is not a network namespace, or could not be entered.
    #[error(transparent)]
    Namespace(netns::Error),

    /// nftables refused our table, or a read of it did not settle.
    #[error(transparent)]
    Rules(nft::Error),

    /// The routes beside the rules (TPROXY policy routing, `::6` on `lo`) or the interfaces'
    /// addresses could not be read or written.
    #[error(transparent)]
    Routes(routes::Error),

    /// An external tool failed: the iptables backend's `iptables-restore`, which only the
    /// Istio layer runs.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The binary, as run.
        tool: String,
        /// What it printed, or why it could not run.
        detail: String,
    },
}

impl Error {
    /// The kernel features found missing, when nf_tables refused our table for lacking them.
    pub fn missing_feature(&self) -> Option<&MissingFeature> {
        match self {
            Error::Rules(e) => e.missing_feature(),
            _ => None,
        }
    }
}

impl From<redirect_model::Error> for Error {
    fn from(e: redirect_model::Error) -> Self {
        Error::Config(e)
    }
}

impl From<netns::Error> for Error {
    fn from(e: netns::Error) -> Self {
        Error::Namespace(e)
    }
}

impl From<nft::Error> for Error {
    fn from(e: nft::Error) -> Self {
        Error::Rules(e)
    }
}

impl From<routes::Error> for Error {
    fn from(e: routes::Error) -> Self {
        Error::Routes(e)
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

impl From<redirect_istio::Error> for Error {
    fn from(e: redirect_istio::Error) -> Self {
        match e {
            redirect_istio::Error::Model(e) => e.into(),
            redirect_istio::Error::Kernel(e) => e.into(),
            redirect_istio::Error::Tool { tool, detail } => Error::Tool { tool, detail },
        }
    }
}
