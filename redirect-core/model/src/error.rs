//! The model's errors: a configuration value that cannot be planned. Every message names the
//! field, the value, and what would be accepted.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range or malformed.
    #[error("invalid {field}: {value:?}: {expected}")]
    Config {
        field: &'static str,
        value: String,
        expected: String,
    },

    /// A bypass list (`bypass_uids`/`bypass_gids`, or the annotation that brought the ID) names
    /// one of the proxy's own IDs.
    #[error(
        "invalid {field}: \"{id}\": a proxy UID/GID cannot bypass capture: its loopback redirect \
         and the validation probe would stop working; list only the init containers' IDs"
    )]
    BypassConflict {
        field: &'static str,
        kind: IdKind,
        id: u32,
    },
}

/// Which kind of ID a bypass list holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Uid,
    Gid,
}
