//! Why an nf_tables job failed.

use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an nf_tables request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A netlink socket operation failed before the kernel answered.
    #[error("netlink {op} failed: {source}{hint}")]
    Netlink {
        op: &'static str,
        source: io::Error,
        hint: &'static str,
    },

    /// The ruleset changed while our table was read, every time it was tried: what was read
    /// could mix two states, so it is not judged.
    #[error("the nf_tables ruleset kept changing while our table was read ({tries} reads, each overtaken by another writer); nothing was judged: try again once the other writer is done")]
    ReadUnsettled { tries: usize },

    /// The kernel rejected an nf_tables message.
    #[error("the kernel rejected {what}: {source} (errno {errno}){hint}")]
    Rejected {
        what: String,
        errno: i32,
        source: io::Error,
        hint: &'static str,
    },
}
