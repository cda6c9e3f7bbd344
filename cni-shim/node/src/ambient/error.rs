//! Why a step of ambient mode failed, typed (each is retried: the controller's queue, or the
//! next pass). Each message says its own context once: an error it wraps is either its message
//! (transparent) or in it, never both in the message and as a `source()`.

use std::net::IpAddr;
use std::path::PathBuf;

use super::identity::Refused;
use crate::pods::search::FindError;

/// Why a pod could not be enrolled, released, bound or annotated.
#[derive(Debug, thiserror::Error)]
pub enum AmbientError {
    /// The agent's search found no namespace for the pod.
    #[error(transparent)]
    Find(#[from] FindError),

    /// Its rules, probe addresses or descriptor could not be put in place.
    #[error(transparent)]
    Add(#[from] AddError),

    /// A namespace is not the pod's.
    #[error(transparent)]
    Refused(#[from] Refused),

    /// The namespace bound to an enrolled pod does not hold the addresses the API now lists:
    /// it is not the pod's (the caller releases it and searches).
    #[error(
        "the namespace bound to it ({netns}) does not hold the addresses the API lists for it \
         ({api:?})"
    )]
    NotItsNamespace { netns: PathBuf, api: Vec<IpAddr> },

    /// Its annotations ask for in-pod rules that cannot be planned.
    #[error("its annotations: {error}")]
    Annotations { error: redirect_core::Error },

    /// Addresses could not be taken out of the host's probe sets.
    #[error("removing {ips:?} from the host's probe sets: {error}")]
    ProbeRemove {
        ips: Vec<IpAddr>,
        error: redirect_core::Error,
    },

    /// The annotation could not be written.
    #[error("annotating {key}={value:?}: {error}")]
    Annotate {
        key: &'static str,
        value: Option<String>,
        error: Box<kube::Error>,
    },

    /// The plugin's request could not be read: the socket failed, or what came is not a
    /// request this agent knows.
    #[error("reading the request: {error}")]
    Unreadable { error: std::io::Error },

    #[error("a request the agent cannot read: {error}")]
    BadRequest { error: serde_json::Error },

    #[error("a request must carry exactly one descriptor, the pod's network namespace")]
    Descriptors,

    /// The pod or its namespace could not be read from the API (the watch has not seen it).
    #[error("reading {what}: {error}")]
    Read {
        what: String,
        error: Box<kube::Error>,
    },

    /// A blocking task (the search of a pod's namespace) panicked or was cancelled.
    #[error("a blocking task failed: {0}")]
    Task(String),
}

/// Why a pod could not be enrolled.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The in-pod rules could not be programmed: nothing of ours is left in the pod.
    #[error("cannot program the in-pod rules in {netns}: {error}")]
    Rules {
        netns: String,
        error: redirect_core::Error,
    },
    /// The pod's addresses could not be put in the host's probe sets.
    #[error("cannot add {ips} to the host's probe SNAT sets: {error}")]
    Probe {
        ips: String,
        error: redirect_core::Error,
    },
    /// The namespace's descriptor could not be duplicated for ztunnel.
    #[error("cannot hand {netns} to ztunnel: {error}")]
    Descriptor {
        netns: String,
        error: std::io::Error,
    },
}

impl From<tokio::task::JoinError> for AmbientError {
    fn from(e: tokio::task::JoinError) -> Self {
        AmbientError::Task(e.to_string())
    }
}
