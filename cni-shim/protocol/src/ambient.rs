//! Ambient mode at ADD: the plugin asks the node agent to enroll the pod before the runtime
//! starts its containers, so that an ambient pod never runs uncaptured. One request on the
//! agent's `SOCK_SEQPACKET` socket [`SOCKET_NAME`] in the run directory: the pod, as JSON,
//! with its network namespace attached as a descriptor (what the plugin opened and judged is
//! what the agent programs); one answer. The agent decides whether the pod is ambient (it
//! watches the pods' and namespaces' labels), programs the in-pod rules and hands the pod to
//! ztunnel.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::seqpacket;

/// The agent's socket in the run directory.
pub const SOCKET_NAME: &str = "ambient.sock";
/// A request or an answer is a few hundred bytes.
pub const MAX_MESSAGE: usize = 4096;
/// How long the plugin waits for the agent (Istio's plugin: 5 s); ztunnel's own deadline
/// is 5 s, so the agent's answer may take a little longer.
pub const DEADLINE: Duration = Duration::from_secs(8);

/// What the plugin asks of the agent about a pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// ADD: enroll the pod if it is ambient.
    #[default]
    Add,
    /// CHECK: compare an ambient pod's in-pod rules in this namespace with its plan.
    Check,
}

impl Command {
    fn is_add(&self) -> bool {
        *self == Command::Add
    }
}

/// The pod the runtime is setting up (or checking).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddRequest {
    /// ADD when absent (a plugin older than CHECK's request sends none).
    #[serde(default, skip_serializing_if = "Command::is_add")]
    pub command: Command,
    /// The pod's Kubernetes namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `K8S_POD_UID`, when the runtime sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The pod's addresses, from the previous plugin's result.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// `CNI_NETNS`, for the agent's log (the descriptor is what counts).
    pub netns: String,
}

/// The agent's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum AddAnswer {
    /// In-pod rules programmed and ztunnel acknowledged the pod.
    Enrolled,
    /// Not an ambient pod: the plugin goes on as without ambient mode.
    NotAmbient {
        /// Why it is not, for the plugin's log.
        reason: String,
    },
    /// Ambient, but not enrolled: the ADD fails (the runtime tries again). For CHECK: the
    /// agent could not check.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// CHECK: the in-pod rules are the pod's plan.
    Matches,
    /// CHECK: what differs from the pod's plan.
    Differs {
        /// Each difference, in words.
        differences: Vec<String>,
    },
}

/// Sends `request` with `netns` attached to the agent listening in `run_dir`, and waits up to
/// `deadline` for its answer.
pub fn ask(
    run_dir: &Path,
    request: &AddRequest,
    netns: BorrowedFd<'_>,
    deadline: Duration,
) -> io::Result<AddAnswer> {
    let sock = seqpacket::connect(&run_dir.join(SOCKET_NAME), deadline)?;
    let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
    seqpacket::send(sock.as_fd(), &bytes, Some(netns), MAX_MESSAGE)?;
    let answer = seqpacket::recv(sock.as_fd(), MAX_MESSAGE)?;
    serde_json::from_slice(&answer.bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the agent's answer is not one this plugin knows: {e}"),
        )
    })
}
