//! The same `Ruleset` as text: an `nft -f` script (dry runs, docs, and hosts where an operator
//! wants to read or load it by hand) and `iptables-restore` input per family (the legacy
//! backend for kernels without nf_tables).

mod iptables;
mod nft;

pub use iptables::{iptables_restore, iptables_restore_all};
pub use nft::{hashed_size, nft_rule, nft_rule_in, nft_script, nft_script_named, nft_script_of};
