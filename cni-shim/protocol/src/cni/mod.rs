//! The CNI protocol as the plugin sees it (spec 1.1): the commands, versions, the error
//! object, CNI_ARGS, the network config on stdin and the result on stdout.

pub mod args;
mod command;
pub mod conf;
pub mod result;

use serde_json::json;

pub use command::Command;

/// The versions we speak. 0.1.0 and 0.2.0 predate chaining (no prevResult) and are refused.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// Error codes of the CNI spec, and ours (100 and up are plugin-specific).
pub mod code {
    /// The spec's: the config's `cniVersion` is not one the plugin speaks.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// The spec's: a field of the network config is not supported.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// The spec's: the container is unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// The spec's: a required environment variable (`CNI_COMMAND`, `CNI_ARGS`, ...) is
    /// missing or invalid.
    pub const INVALID_ENV: u32 = 4;
    /// The spec's: an I/O failure, such as reading stdin.
    pub const IO_FAILURE: u32 = 5;
    /// The spec's: content could not be decoded (the config on stdin is not JSON).
    pub const DECODE: u32 = 6;
    /// The spec's: the network config is invalid.
    pub const INVALID_CONFIG: u32 = 7;
    /// The spec's: a transient condition; the runtime should try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The spec's, for STATUS: the plugin cannot serve ADD now.
    pub const NOT_AVAILABLE: u32 = 50;
    /// Ours: CHECK found rules that differ from what the pod's annotations ask for.
    pub const RULES_DIFFER: u32 = 100;
    /// Ours: a pod annotation has a bad value.
    pub const BAD_ANNOTATION: u32 = 101;
    /// Ours: the Kubernetes API could not tell us about the pod.
    pub const POD_UNKNOWN: u32 = 102;
    /// Ours: refusing to program the namespace the plugin runs in (the host's).
    pub const HOST_NETNS: u32 = 103;

    /// Every code the plugin answers with, 0 (success) first.
    pub const ALL: [u32; 14] = [
        0,
        INCOMPATIBLE_VERSION,
        UNSUPPORTED_FIELD,
        UNKNOWN_CONTAINER,
        INVALID_ENV,
        IO_FAILURE,
        DECODE,
        INVALID_CONFIG,
        TRY_AGAIN_LATER,
        NOT_AVAILABLE,
        RULES_DIFFER,
        BAD_ANNOTATION,
        POD_UNKNOWN,
        HOST_NETNS,
    ];
}

/// A CNI error: printed as JSON on stdout, exit 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    /// One of the [`code`]s.
    pub code: u32,
    /// What went wrong, in one line.
    pub msg: String,
    /// Context for it: the value found, or how to fix it.
    pub details: String,
}

impl CniError {
    /// An error with `code`, its message and its details.
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The spec's error object, in the config's version (or the newest when unknown).
    pub fn to_json(&self, version: &str) -> String {
        let v = if SUPPORTED_VERSIONS.contains(&version) {
            version
        } else {
            "1.1.0"
        };
        json!({"cniVersion": v, "code": self.code, "msg": self.msg, "details": self.details})
            .to_string()
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}
