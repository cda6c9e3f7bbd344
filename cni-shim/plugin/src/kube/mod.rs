//! Fetching a pod from the Kubernetes API with the kubeconfig the installer wrote, with
//! bounded retries, when the runtime did not send the pod's annotations or the proxy UID must
//! come from the spec.
//!
//! This is the plugin's slow path. The common path (annotations from the runtime's
//! `io.kubernetes.cri.pod-annotations` capability) never calls it, so nothing here runs, and no
//! async runtime starts, unless [`fetch_pod`] is called: it builds a current-thread tokio runtime
//! for the one request and shuts it down before returning.
//!
//! Behaviour, after Istio's `istio-cni` (docs/redirect-cni.md, "Which pods, and their settings"):
//! - `GET /api/v1/namespaces/<ns>/pods/<name>`, up to [`FetchPolicy::attempts`] times,
//!   [`FetchPolicy::interval`] apart, each bounded by [`FetchPolicy::request_timeout`], and all
//!   of it by [`FetchPolicy::deadline`] (Istio has no such bound: 30 x (5 s + 1 s) is longer
//!   than the 2 minutes kubelet gives the runtime for a sandbox, so the ADD would be abandoned
//!   with a timeout that names nothing).
//! - Unlike Istio (which retries every error), a 404, 401 or 403 answer or a TLS certificate
//!   verification failure ends at once: retrying cannot change them within one ADD.
//! - The kubeconfig is read once per call, for its current context. `HTTPS_PROXY` and friends
//!   from the environment (a runtime's proxy for image pulls) are ignored: the API server is
//!   reached directly unless the kubeconfig's cluster names a `proxy-url`.
//! - Credentials (bearer token, token file contents, password) never appear in an error or a
//!   log line of ours: every message is scrubbed of them.

mod fetch;
mod secret;

use std::path::PathBuf;
use std::time::Duration;

pub use cni_protocol::pod::{pod_info, pod_info_from_json};
pub use fetch::{fetch_namespace_labels, fetch_pod};

/// How hard to try to get the pod.
#[derive(Clone, Debug)]
pub struct FetchPolicy {
    /// How many GETs at most (at least one is always made).
    pub attempts: u32,
    /// The pause between two attempts.
    pub interval: Duration,
    /// The bound on one attempt: connect, TLS handshake, request and response.
    pub request_timeout: Duration,
    /// The bound on everything: no attempt starts, and none runs, past it.
    pub deadline: Duration,
}

/// The default [`FetchPolicy::deadline`]: half of the 2 minutes kubelet gives the runtime.
pub use cni_protocol::cni::conf::DEFAULT_KUBE_DEADLINE as DEFAULT_DEADLINE;

impl Default for FetchPolicy {
    /// Istio's: 30 attempts, 1 s apart; each request bounded by 5 s. Ours: all within 60 s.
    fn default() -> Self {
        FetchPolicy {
            attempts: 30,
            interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            deadline: DEFAULT_DEADLINE,
        }
    }
}

fn deadline_note(hit: bool, deadline: &Duration) -> String {
    if hit {
        format!(
            ", the plugin's deadline for the API (`kube_deadline_ms`: {} ms)",
            deadline.as_millis()
        )
    } else {
        String::new()
    }
}

/// Why the pod could not be fetched. No variant ever holds a credential.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig is missing, unreadable or invalid, or its certificate authority does not
    /// verify the API server: `reason` says what is wrong and what to do. Not retried.
    #[error("kubeconfig {path}: {reason}")]
    Config {
        /// The kubeconfig file.
        path: PathBuf,
        /// What is wrong, and what to do.
        reason: String,
    },

    /// The pod does not exist (404), or its namespace/name cannot be a Kubernetes name (then
    /// no request is made). Not retried.
    #[error(
        "pod {namespace}/{name} not found: the API server answered 404 Not Found (or the name is \
         not a valid Kubernetes name); check K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS"
    )]
    NotFound {
        /// The pod's namespace, from CNI_ARGS.
        namespace: String,
        /// The pod's name, from CNI_ARGS.
        name: String,
    },

    /// The API server refused the request (401 or 403). Not retried.
    #[error(
        "not allowed to get pod {namespace}/{name}: {detail}; the service account whose token \
         is in the kubeconfig needs the RBAC permission `get` on `pods` (apiGroups [\"\"]) in \
         every namespace, through a ClusterRole and ClusterRoleBinding"
    )]
    Forbidden {
        /// The pod's namespace, from CNI_ARGS.
        namespace: String,
        /// The pod's name, from CNI_ARGS.
        name: String,
        /// The status (401 or 403), the API server's message and what to check.
        detail: String,
    },

    /// The API server could not be reached, timed out or kept failing (5xx, 429, reset
    /// connections) through every attempt, or until the deadline.
    #[error(
        "API server {server} did not return the pod after {attempts} attempt(s) over \
         {elapsed:?}{}; last error: {last}; check that this node reaches the API server at the \
         kubeconfig's `server` address", deadline_note(*.deadline_hit, .deadline)
    )]
    Unavailable {
        /// The API server's address from the kubeconfig, or `(not contacted)`.
        server: String,
        /// The attempts made.
        attempts: u32,
        /// The policy's deadline (the request timeout, for a namespace's labels).
        deadline: Duration,
        /// Whether the deadline is what ended the attempts.
        deadline_hit: bool,
        /// From the first attempt to the last failure, rounded to milliseconds.
        elapsed: Duration,
        /// The last error seen, scrubbed of credentials.
        last: String,
    },
}
