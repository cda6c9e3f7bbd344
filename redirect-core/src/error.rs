//! One error type for a user of the library ([`Error`]), the same one every part beneath
//! returns. Each variant holds the error of the part that failed, which names the value and
//! the fix, and is transparent: `Display` is that message and `source()` is that error's own
//! source, so a chain reporter (anyhow's `{:#}`, a program's own) prints each message once.
//! Match on the variant (and its error) when a caller needs more than the message.

pub use redirect_istio::{Error, Result};

/// What the variants of [`Error`] hold, for a program that tells one failure from another (its
/// exit codes, a CNI error code).
pub use redirect_istio::capture::{Refusal, Refused};
pub use redirect_kernel::netns::Error as NamespaceError;
pub use redirect_kernel::nft::Error as RulesError;
/// Kernel features our table needs that the kernel lacks (`RulesError::MissingFeature`), and
/// one such feature with its module and first Linux release.
pub use redirect_kernel::nft::{Feature as KernelFeature, MissingFeature};
pub use redirect_kernel::routes::Error as RoutesError;
pub use redirect_model::Error as ConfigError;
