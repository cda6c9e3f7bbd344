//! The names of the plan's sets, as the chains' names are in `chains`. A CIDR set's name
//! carries its family ([`cidr_set`]: `ip-exclude-cidrs`, `ip6-include-cidrs`); a port set is
//! one for both families.

use crate::ruleset::Family;

/// Inbound ports captured (`-b` with a list).
pub const INBOUND_PORTS: &str = "inbound-ports";
/// Inbound ports never captured (`-d`).
pub const INBOUND_EXCLUDE_PORTS: &str = "inbound-exclude-ports";
/// Outbound ports never captured (`-o`).
pub const OUTBOUND_EXCLUDE_PORTS: &str = "outbound-exclude-ports";
/// Outbound ports always captured (`-q`).
pub const OUTBOUND_INCLUDE_PORTS: &str = "outbound-include-ports";
/// Outbound CIDRs never captured (`-x`), per family.
pub const EXCLUDE_CIDRS: &str = "exclude-cidrs";
/// Outbound CIDRs captured (`-i` with a list), per family.
pub const INCLUDE_CIDRS: &str = "include-cidrs";

/// The name of the CIDR set `name` in `family`.
pub fn cidr_set(family: Family, name: &str) -> String {
    format!("{}-{}", family.nft_name(), name)
}
