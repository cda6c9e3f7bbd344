//! The installer's error type: each message names what was wrong, the value or path, and what to
//! do about it. No message ever carries the service-account token.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line could not be parsed (clap's message).
    #[error("{0}")]
    Usage(String),

    #[error("invalid value {value:?} for {setting}: {reason}")]
    InvalidSetting {
        setting: &'static str,
        value: String,
        reason: String,
    },

    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("{path} is not a CNI config that can be chained into: {reason}")]
    BadCniConfig { path: PathBuf, reason: String },

    /// The kubeconfig cannot be made (no API server given) or written.
    #[error("{0}")]
    Kubeconfig(String),

    /// The service account's token or CA, which the kubeconfig carries, cannot be read.
    #[error("{0}")]
    ServiceAccount(String),

    #[error("cannot set up the watch: {0}")]
    Watch(String),

    /// The run directory could let another user change what the plugin and the agent read.
    #[error("the run directory {path} (CNI_AGENT_RUN_DIR) is {what}: another user could replace the plugin's kubeconfig, the agent's status file or the install record in it; make it a directory owned by root with mode 0755 (chown root:root; chmod 0755), below folders only root may write (or sticky ones, as /tmp), and start the agent again")]
    UnsafeRunDir { path: PathBuf, what: String },

    /// Something the agent will not remove sits where it writes its status file.
    #[error("{path} is a directory, where the agent writes its status file (the plugin's STATUS reads it): remove it and start the agent again")]
    StatusPathTaken { path: PathBuf },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
