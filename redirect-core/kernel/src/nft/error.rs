//! Why an nf_tables job failed.

use std::io;

use super::feature::Feature;

/// A result whose error is, by default, an nf_tables [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an nf_tables request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A netlink socket operation failed before the kernel answered.
    #[error("netlink {op} failed: {cause}{hint}")]
    Netlink {
        /// The operation, in words ("send nf_tables batch", "dumped elements").
        op: &'static str,
        /// The socket's error (in the message: not a `source()`, so that a chain reporter
        /// prints it once).
        cause: io::Error,
        /// What to do about the socket's errno ("; hint: ..."), or empty.
        hint: &'static str,
    },

    /// The ruleset changed while our table was read, every time it was tried: what was read
    /// could mix two states, so it is not judged.
    #[error("the nf_tables ruleset kept changing while our table was read ({tries} reads, each overtaken by another writer); nothing was judged: try again once the other writer is done")]
    ReadUnsettled {
        /// How many reads were tried.
        tries: usize,
    },

    /// The kernel rejected an nf_tables message.
    #[error("the kernel rejected {what}: {cause} (errno {errno}){hint}")]
    Rejected {
        /// The message refused, in words ("add set ip-exclude-cidrs", "a dump of our rules").
        what: String,
        /// The kernel's errno.
        errno: i32,
        /// The errno as an error (in the message, not a `source()`).
        cause: io::Error,
        /// What to do about the errno ("; hint: ..."), or empty.
        hint: &'static str,
    },

    /// The kernel lacks nf_tables features our table needs (a check-only probe found which):
    /// nothing was committed.
    #[error(transparent)]
    MissingFeature(MissingFeature),
}

impl Error {
    /// The missing features, when this is [`Error::MissingFeature`].
    pub fn missing_feature(&self) -> Option<&MissingFeature> {
        match self {
            Error::MissingFeature(m) => Some(m),
            _ => None,
        }
    }
}

/// Kernel features our table needs and the kernel lacks, with the way out this layer knows
/// (the modules to load); a program adds its own ([`MissingFeature::message_with`]).
#[derive(Debug, thiserror::Error)]
#[error("{}", self.message_with(None))]
pub struct MissingFeature {
    /// What is missing, the first first (never empty).
    pub features: Vec<Feature>,
    /// The message the kernel refused and its errno, when the features were looked for after
    /// a refusal; `None` when found before anything was sent.
    pub refused: Option<(String, i32)>,
}

impl MissingFeature {
    /// The modules to load, each once, in order.
    pub fn modules(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for f in &self.features {
            if !out.contains(&f.module.as_ref()) {
                out.push(&f.module);
            }
        }
        out
    }

    /// The message, with `alternative` (a program's other way out, "use --backend iptables")
    /// after the modules to load.
    pub fn message_with(&self, alternative: Option<&str>) -> String {
        let names: Vec<String> = self.features.iter().map(|f| f.to_string()).collect();
        let modules = self.modules();
        let mut out = format!(
            "the kernel lacks {}: load {} with 'modprobe {}'",
            names.join(" and "),
            if modules.len() == 1 { "it" } else { "them" },
            modules.join(" ")
        );
        if let Some(alt) = alternative {
            out.push_str(", or ");
            out.push_str(alt);
        }
        if let Some((what, errno)) = &self.refused {
            let cause = io::Error::from_raw_os_error(*errno);
            out.push_str(&format!(
                "; nf_tables refused {what}: {cause} (errno {errno})"
            ));
        }
        out
    }
}
