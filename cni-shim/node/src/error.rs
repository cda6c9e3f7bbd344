//! The installer's error type: each message names what was wrong, the value or path, and what to
//! do about it. No message ever carries the service-account token.

use std::io;
use std::path::PathBuf;

/// What stopped the installer or the agent; the message says what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line could not be parsed (clap's message).
    #[error("{0}")]
    Usage(String),

    /// A setting's value cannot be used (also one the agent finds unusable at start, such as
    /// a monitoring port already taken).
    #[error("invalid value {value:?} for {setting}: {reason}")]
    InvalidSetting {
        /// The variable or flag the value came from (e.g. `MONITORING_PORT`).
        setting: &'static str,
        /// The value refused.
        value: String,
        /// Why it was refused, usually with what is expected.
        reason: String,
    },

    /// A file system call failed.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done, as a verb (`write`, `remove`, ...).
        action: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: io::Error,
    },

    /// The CNI config chosen to chain into cannot take our entry: runtimes do not read a file
    /// of its name, or it does not parse as a config.
    #[error("{path} is not a CNI config that can be chained into: {reason}")]
    BadCniConfig {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The kubeconfig cannot be made (no API server given) or written.
    #[error("{0}")]
    Kubeconfig(String),

    /// The service account's token or CA, which the kubeconfig carries, cannot be read.
    #[error("{0}")]
    ServiceAccount(String),

    /// What keeps the installation in place, or the agent, could not be set up (the stop
    /// pipe, inotify, the signal handlers, the agent's thread or its listener).
    #[error("cannot set up the watch: {0}")]
    Watch(String),

    /// The API server could not be asked what a command needs (the node's pods, for the
    /// hand-back).
    #[error("{0}")]
    Api(String),

    /// The run directory could let another user change what the plugin and the agent read.
    #[error("the run directory {path} (CNI_AGENT_RUN_DIR) is {what}: another user could replace the plugin's kubeconfig, the agent's status file or the install record in it; make it a directory owned by root with mode 0755 (chown root:root; chmod 0755), below folders only root may write (or sticky ones, as /tmp), and start the agent again")]
    UnsafeRunDir {
        /// The run directory.
        path: PathBuf,
        /// What makes it unsafe (a symbolic link, its owner, its mode or a parent's).
        what: String,
    },

    /// Something the agent will not remove sits where it writes its status file.
    #[error("{path} is a directory, where the agent writes its status file (the plugin's STATUS reads it): remove it and start the agent again")]
    StatusPathTaken {
        /// Where the status file goes.
        path: PathBuf,
    },
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

/// `std::result::Result` with this crate's [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;
