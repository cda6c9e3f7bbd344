//! Why an nf_tables job failed.

use std::io;

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
}
