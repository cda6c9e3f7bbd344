//! `istio-iptables`' command line and environment, as redirect-init and the probe take them
//! (the `cli` feature): every flag with its variable and default ([`flags`](mod@flags), resolved from a
//! [`flag_table`]), the settings they become ([`settings`]), Go's boolean spelling, and
//! Istio's list syntax. The node agent declares its own settings with the same table
//! ([`flags!`](crate::cli::flags!)).

pub use redirect_istio::cli::{flag_table, flags, settings};
pub use redirect_istio::flags;
pub use redirect_istio::go::parse_bool;
pub use redirect_istio::quirks::{warnings, Quirk};
pub use redirect_model::join;
pub use redirect_model::parse::split_list;
