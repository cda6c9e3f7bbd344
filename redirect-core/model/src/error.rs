//! The model's errors: a configuration value that cannot be planned. Every message names the
//! field, the value, and what would be accepted.

/// The model's result type: [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a configuration cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range or malformed.
    #[error("invalid {field}: {value:?}: {expected}")]
    Config {
        /// What is at fault: a config field (`tproxy_mark`), or the flag, annotation or
        /// variable the caller parsed the value from.
        field: &'static str,
        /// The value as given (a long one cut short).
        value: String,
        /// What would be accepted instead.
        expected: String,
    },

    /// A bypass list (`bypass_uids`/`bypass_gids`, or the annotation that brought the ID) names
    /// one of the proxy's own IDs.
    #[error(
        "invalid {field}: \"{id}\": a proxy UID/GID cannot bypass capture: its loopback redirect \
         and the validation probe would stop working; list only the init containers' IDs"
    )]
    BypassConflict {
        /// The bypass list that names it (`bypass_uids`, `bypass_gids`).
        field: &'static str,
        /// Whether the ID is a UID or a GID.
        kind: IdKind,
        /// The proxy's ID found in the bypass list.
        id: u32,
    },
}

/// Which kind of ID a bypass list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// User IDs (`bypass_uids`).
    Uid,
    /// Group IDs (`bypass_gids`).
    Gid,
}
