//! The names of the plan's chains. The plan follows Istio's iptables generation, and its
//! iptables rendering must create the chains Istio creates (operators, Istio's tools and its
//! leftovers scan look for them by name), so the chains carry Istio's names; the nft lowering
//! derives its own chain names from them (`table::chain_name`).

/// Inbound capture from PREROUTING: which inbound TCP goes to the proxy (nat, or mangle in
/// TPROXY mode); in raw, the conntrack zone of DNS answers.
pub const ISTIO_INBOUND: &str = "ISTIO_INBOUND";
/// REDIRECT of outbound TCP to Envoy's outbound port (`-p`, 15001).
pub const ISTIO_REDIRECT: &str = "ISTIO_REDIRECT";
/// REDIRECT of inbound TCP to the inbound capture port (`-z`, 15006).
pub const ISTIO_IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
/// Outbound capture, from nat OUTPUT: what is left alone (RETURN) and what goes to the proxy.
pub const ISTIO_OUTPUT: &str = "ISTIO_OUTPUT";
/// DNS capture: the redirect to the DNS agent (nat) and the conntrack zones of DNS flows (raw).
pub const ISTIO_OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
/// TPROXY mode: marks and accepts the packets of a connection the proxy already holds.
pub const ISTIO_DIVERT: &str = "ISTIO_DIVERT";
/// TPROXY mode: hands a new inbound connection to the proxy's inbound port.
pub const ISTIO_TPROXY: &str = "ISTIO_TPROXY";
/// Drops the packets conntrack finds invalid (`--drop-invalid`).
pub const ISTIO_DROP: &str = "ISTIO_DROP";
/// The built-in chains the plan jumps from.
pub(crate) const PREROUTING: &str = "PREROUTING";
pub(crate) const OUTPUT: &str = "OUTPUT";
