//! The names of the plan's chains. The plan follows Istio's iptables generation, and its
//! iptables rendering must create the chains Istio creates (operators, Istio's tools and its
//! leftovers scan look for them by name), so the chains carry Istio's names; the nft lowering
//! derives its own chain names from them (`table::chain_name`).

pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
pub const ISTIO_DROP: &str = "ISTIO_DROP";
/// The built-in chains the plan jumps from.
pub(crate) const PREROUTING: &str = "PREROUTING";
pub(crate) const OUTPUT: &str = "OUTPUT";
