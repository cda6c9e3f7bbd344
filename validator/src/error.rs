//! What can go wrong before redirect-validate has an answer, typed: each message names the flag
//! or file and the value, and what to give instead. A failed probe is not an error: it is the
//! answer (exit 126, with its diagnosis).

use std::net::IpAddr;
use std::path::PathBuf;

use redirect_core::eval::FlowError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Istio's flags or variables (typed by the core, which names the flag), planning, or
    /// reading the pod's address.
    #[error(transparent)]
    Core(#[from] redirect_core::Error),

    #[error("--{flag} {value:?}: {item:?} is not an IP address; expected e.g. 10.244.1.7,fd00::7")]
    IpList {
        flag: &'static str,
        value: String,
        item: String,
    },

    #[error("--pod-ip {0:?}: no usable address (loopback and link-local ones do not count)")]
    NoPodAddress(Vec<IpAddr>),

    #[error("--flow")]
    Flow(#[from] FlowError),

    #[error("--annotations {file}: {reason}")]
    AnnotationsFile { file: PathBuf, reason: String },

    /// The annotations ask for something the mesh mapping refuses.
    #[error("--annotations: {0}")]
    Annotation(redirect_core::mesh::MeshError),

    /// The annotations alone do not decide the capture.
    #[error("--annotations: {0}; give the whole pod (`kubectl get pod -o json`) or the proxy UID with -u")]
    AnnotationsNeedPod(String),

    #[error("--netns {path}: cannot open it; give the pod's namespace file, e.g. /proc/<pid of a pod process>/ns/net")]
    Netns {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("the namespace has no usable address: cannot tell IPv4 from IPv6 rules")]
    NoNamespaceAddress,

    #[error("--redirect-dns without --capture-all-dns captures DNS to the pod's resolv.conf servers: give them with --nameservers (or --netns /proc/<pid>/ns/net, whose resolv.conf is read)")]
    NameserversNeeded,

    /// A flag of `trace` with a value it cannot use.
    #[error("--{flag} {value:?}: expected {want}")]
    TraceArg {
        flag: &'static str,
        value: String,
        want: &'static str,
    },

    /// `trace` saw no packet of the flow.
    #[error("no packet of the flow was seen within {timeout:?}: {hint}")]
    NoPacket {
        timeout: std::time::Duration,
        hint: &'static str,
    },

    /// `trace` was interrupted (SIGINT, SIGTERM); its table was removed.
    #[error("interrupted: the trace table was removed, nothing else changed")]
    Interrupted,

    /// Reading the namespace's rules failed (nf_tables needs CAP_NET_ADMIN there).
    #[error("{0} (inspect reads nf_tables over netlink: run it as root on the node)")]
    KernelRead(redirect_core::Error),
}

impl From<redirect_core::error::ConfigError> for Error {
    fn from(e: redirect_core::error::ConfigError) -> Self {
        Error::Core(e.into())
    }
}

/// The kernel crate's errors, as the Istio crate's.
macro_rules! core_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Core(e.into())
            }
        }
    )*};
}

core_from!(
    redirect_core::error::NamespaceError,
    redirect_core::error::RulesError,
    redirect_core::error::RoutesError
);

#[cfg(test)]
mod tests {
    //! One error, printed once: each variant that wraps another says its own context (the flag,
    //! the path) and leaves the inner error to `source()`; walking the chain finds no message
    //! twice, and the stderr line (`redirect_program::errors::chain`) shows each once.
    //! `Core` (transparent) and `KernelRead` hold the core's `Error`, whose own chain
    //! `redirect_core`'s tests walk: left out.

    use super::Error;
    use redirect_core::eval::Flow;
    use redirect_testkit::errors::{assert_each_message_once, assert_shown_once};

    fn assert_once(kind: &str, e: &Error, names: &str) {
        let msgs = assert_each_message_once(kind, e, names);
        assert!(msgs.len() > 1, "{kind}: no source: {msgs:?}");
        assert_shown_once(kind, &redirect_program::errors::chain(e), &msgs);
    }

    #[test]
    fn each_wrapping_variant_prints_each_message_once() {
        let flow = "sideways tcp 10.0.0.1:80".parse::<Flow>().unwrap_err();
        let flow = Error::from(flow);
        assert_once("Flow", &flow, "--flow");
        assert!(
            redirect_program::errors::chain(&flow).contains("sideways"),
            "the flow given reaches the stderr line"
        );

        let netns = Error::Netns {
            path: "/nonexistent/ns".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_once("Netns", &netns, "/nonexistent/ns");
    }
}
