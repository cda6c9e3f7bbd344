//! `CaptureConfig`: every parameter of Istio's capture that concerns rules
//! (docs/redirect-init.md, "Flags and environment"), typed and validated.
//!
//! Build one with `CaptureConfig::default()` (Istio's defaults) and struct update syntax, or from
//! JSON with `from_json`; then `validate()` (done by `from_json` and by `plan`).
//!
//! Besides the model here: `validate` (the checks), `parse` (Istio's string forms, so every
//! shim parses lists the same way) and `join` (lists written as Istio writes them); their
//! parsers are the public module `parse` (`redirect_model::parse::split_list`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

pub mod join;
pub mod parse;
mod valid;
mod validate;

pub(crate) use validate::check_interface;

pub use join::{join, join_with, ListItem};
pub use valid::ValidConfig;

/// Istio's fixed DNS agent port (`pilot-agent` listens here when DNS capture is on).
pub const DNS_AGENT_PORT: u16 = 15053;
/// Istio's fixed "outbound mark": Envoy → application via the pod IP in TPROXY mode.
pub const OUTBOUND_MARK: u32 = 1338;
/// The most owner groups Istio accepts in an include list.
pub const MAX_OWNER_GROUPS: usize = 64;

/// How inbound traffic reaches the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum InterceptionMode {
    /// NAT REDIRECT to the inbound capture port (Istio's default).
    #[default]
    Redirect,
    /// TPROXY with a packet mark and policy routing; keeps the original destination.
    Tproxy,
}

/// `*` (all) or an explicit list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Selection<T> {
    /// Every value (`*`).
    All,
    /// Only these values; empty selects nothing.
    List(Vec<T>),
}

impl<T> Default for Selection<T> {
    fn default() -> Self {
        Selection::List(Vec::new())
    }
}

impl<T> Selection<T> {
    /// True for `*`.
    pub fn is_all(&self) -> bool {
        matches!(self, Selection::All)
    }

    /// True for `List([])`: nothing selected.
    pub fn is_none(&self) -> bool {
        matches!(self, Selection::List(l) if l.is_empty())
    }

    /// The listed values; empty for `*`, so check [`Selection::is_all`] first.
    pub fn list(&self) -> &[T] {
        match self {
            Selection::All => &[],
            Selection::List(l) => l,
        }
    }
}

impl<T: ListItem> std::fmt::Display for Selection<T> {
    /// `*`, or the list as Istio writes it (`80,443`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::All => f.write_str("*"),
            Selection::List(l) => f.write_str(&join(l)),
        }
    }
}

impl<T: Serialize> Serialize for Selection<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Selection::All => s.serialize_str("*"),
            Selection::List(l) => l.serialize(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Selection<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr<T> {
            Star(String),
            List(Vec<T>),
        }
        match Repr::deserialize(d)? {
            Repr::Star(s) if s == "*" => Ok(Selection::All),
            Repr::Star(s) => Err(serde::de::Error::custom(format!(
                "expected \"*\" or a list, got {s:?}"
            ))),
            Repr::List(l) => Ok(Selection::List(l)),
        }
    }
}

/// A group given by number or by name (names are resolved when the rules are planned).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroupRef {
    /// A numeric GID.
    Id(u32),
    /// A group name, looked up by the plan's [`crate::GroupResolver`].
    Name(String),
}

impl std::fmt::Display for GroupRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupRef::Id(id) => write!(f, "{id}"),
            GroupRef::Name(n) => f.write_str(n),
        }
    }
}

/// DNS capture (Istio's `--redirect-dns`, `--capture-all-dns` and the resolv.conf servers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsCapture {
    /// No DNS capture (the default).
    #[default]
    Off,
    /// Capture all DNS (UDP and TCP port 53), whatever the server.
    All,
    /// Capture DNS to these servers only. With no server at all Istio silently disables DNS
    /// capture; so do we (see `effective`).
    Servers {
        /// The IPv4 servers.
        #[serde(default)]
        v4: Vec<Ipv4Addr>,
        /// The IPv6 servers.
        #[serde(default)]
        v6: Vec<Ipv6Addr>,
    },
}

impl DnsCapture {
    /// Whether DNS capture is in effect (Istio: redirect-dns and (capture-all or ≥1 server)).
    pub fn effective(&self) -> bool {
        match self {
            DnsCapture::Off => false,
            DnsCapture::All => true,
            DnsCapture::Servers { v4, v6 } => !v4.is_empty() || !v6.is_empty(),
        }
    }

    /// Build from Istio's inputs: servers split by family.
    pub fn from_istio(redirect_dns: bool, capture_all: bool, servers: &[IpAddr]) -> DnsCapture {
        if !redirect_dns {
            return DnsCapture::Off;
        }
        if capture_all {
            return DnsCapture::All;
        }
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for s in servers {
            match s {
                IpAddr::V4(a) => v4.push(*a),
                IpAddr::V6(a) => v6.push(*a),
            }
        }
        DnsCapture::Servers { v4, v6 }
    }
}

/// Everything that decides a pod's capture rules. Field names follow Istio's flags; defaults
/// are Istio's defaults for the sidecar injector's invocation where Istio has one, otherwise
/// Istio's flag defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureConfig {
    /// `-p`: where outbound TCP is redirected (Envoy's outbound listener).
    pub envoy_port: u16,
    /// `-z`: where inbound TCP is redirected or tproxied.
    pub inbound_capture_port: u16,
    /// `-e`: the HBONE tunnel port, never captured inbound and excluded from the loopback path.
    pub inbound_tunnel_port: u16,
    /// `-u`: UIDs whose traffic is the proxy's own (never captured outbound).
    pub proxy_uids: Vec<u32>,
    /// `-g`: GIDs whose traffic is the proxy's own.
    pub proxy_gids: Vec<u32>,
    /// `-m`.
    pub mode: InterceptionMode,
    /// `-b`: inbound ports to capture, `*` for all; empty = no inbound capture.
    pub inbound_ports: Selection<u16>,
    /// `-d`: inbound ports not captured (only used with `inbound_ports = *`).
    pub inbound_exclude_ports: Vec<u16>,
    /// `-i`: outbound destinations to capture, `*` for all; empty = none by CIDR.
    pub outbound_include_cidrs: Selection<IpNet>,
    /// `-x`: outbound destinations never captured.
    pub outbound_exclude_cidrs: Vec<IpNet>,
    /// `-q`: outbound TCP ports captured whatever the destination.
    pub outbound_include_ports: Vec<u16>,
    /// `-o`: outbound TCP and UDP ports never captured.
    pub outbound_exclude_ports: Vec<u16>,
    /// `-c`: interfaces on which nothing is captured.
    pub exclude_interfaces: Vec<String>,
    /// `-k`: interfaces whose inbound traffic is treated as outbound (KubeVirt VMs).
    pub reroute_interfaces: Vec<String>,
    /// `-t`: TPROXY packet mark.
    pub tproxy_mark: u32,
    /// `-r`: TPROXY policy-routing table.
    pub tproxy_route_table: u32,
    /// DNS capture to the agent on port 15053.
    pub dns: DnsCapture,
    /// `--drop-invalid`: drop packets conntrack finds INVALID.
    pub drop_invalid: bool,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS`: only these groups' traffic is captured (`*` = all).
    pub owner_groups_include: Selection<GroupRef>,
    /// `ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE`: these groups' traffic is not captured (only with
    /// include `*`).
    pub owner_groups_exclude: Vec<GroupRef>,
    /// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`.
    pub ipv4_loopback_cidr: Ipv4Net,
    /// Whether IPv6 rules are programmed. With false, no rule touches IPv6 traffic.
    pub ipv6: bool,
    /// Ours: UIDs whose outbound traffic (DNS included) is never captured, checked before
    /// anything else; for init containers that must reach the network before the proxy runs.
    pub bypass_uids: Vec<u32>,
    /// Ours: the same by GID.
    pub bypass_gids: Vec<u32>,
    /// Ours, opt-in: a counter on each rule that decides a path (inbound or outbound captured,
    /// bypassed by the proxy's owner, excluded), read back per path (`CountedPath`).
    pub counters: bool,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            envoy_port: 15001,
            inbound_capture_port: 15006,
            inbound_tunnel_port: 15008,
            proxy_uids: vec![1337],
            proxy_gids: vec![1337],
            mode: InterceptionMode::Redirect,
            inbound_ports: Selection::List(Vec::new()),
            inbound_exclude_ports: Vec::new(),
            outbound_include_cidrs: Selection::List(Vec::new()),
            outbound_exclude_cidrs: Vec::new(),
            outbound_include_ports: Vec::new(),
            outbound_exclude_ports: Vec::new(),
            exclude_interfaces: Vec::new(),
            reroute_interfaces: Vec::new(),
            tproxy_mark: 1337,
            tproxy_route_table: 133,
            dns: DnsCapture::Off,
            drop_invalid: false,
            owner_groups_include: Selection::All,
            owner_groups_exclude: Vec::new(),
            ipv4_loopback_cidr: Ipv4Net::new(Ipv4Addr::LOCALHOST, 32).expect("valid /32"),
            ipv6: false,
            bypass_uids: Vec::new(),
            bypass_gids: Vec::new(),
            counters: false,
        }
    }
}

impl CaptureConfig {
    /// What Istio's sidecar injector asks for by default:
    /// `-p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x "" -b '*' -d 15090,15021,15020`.
    pub fn istio_sidecar_default() -> Self {
        CaptureConfig {
            inbound_ports: Selection::All,
            inbound_exclude_ports: vec![15090, 15021, 15020],
            outbound_include_cidrs: Selection::All,
            ..CaptureConfig::default()
        }
    }

    /// Check every field; the error names the first bad field, its value, and what is accepted.
    pub fn validate(&self) -> Result<()> {
        validate::validate(self)
    }

    /// Check every field (see [`CaptureConfig::validate`]) and keep the proof.
    pub fn validated(self) -> Result<ValidConfig> {
        ValidConfig::of(self)
    }

    /// Parse JSON (as written by `to_json`) and validate: the config, ready to plan.
    pub fn from_json(s: &str) -> Result<ValidConfig> {
        let cfg: CaptureConfig = serde_json::from_str(s).map_err(|e| Error::Config {
            field: "config",
            value: truncate(s, 80),
            expected: format!("a CaptureConfig JSON object ({e})"),
        })?;
        cfg.validated()
    }

    /// The config as pretty-printed JSON, which [`CaptureConfig::from_json`] reads back.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("CaptureConfig serializes")
    }

    /// Include CIDRs of one family (empty for `*`).
    pub fn include_cidrs(&self) -> &[IpNet] {
        self.outbound_include_cidrs.list()
    }
}

fn invalid(field: &'static str, value: &str, expected: &str) -> Error {
    Error::Config {
        field,
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip() {
        for cfg in [
            CaptureConfig::default(),
            CaptureConfig::istio_sidecar_default(),
        ] {
            cfg.validate().unwrap();
            let back = CaptureConfig::from_json(&cfg.to_json()).unwrap();
            assert_eq!(*back, cfg);
        }
    }

    #[test]
    fn selection_json() {
        let cfg = CaptureConfig::istio_sidecar_default();
        let v: serde_json::Value = serde_json::from_str(&cfg.to_json()).unwrap();
        assert_eq!(v["inbound_ports"], "*");
        assert_eq!(
            v["inbound_exclude_ports"],
            serde_json::json!([15090, 15021, 15020])
        );
        let err = CaptureConfig::from_json(r#"{"inbound_ports":"all"}"#).unwrap_err();
        assert!(err.to_string().contains("\"*\" or a list"), "{err}");
    }

    #[test]
    fn unknown_json_field_is_named() {
        let err = CaptureConfig::from_json(r#"{"envoy_prot": 1}"#).unwrap_err();
        assert!(err.to_string().contains("envoy_prot"), "{err}");
    }

    #[test]
    fn dns_effective_as_istio() {
        assert!(!DnsCapture::from_istio(true, false, &[]).effective());
        assert!(DnsCapture::from_istio(true, true, &[]).effective());
        assert!(!DnsCapture::from_istio(false, true, &[]).effective());
        let d = DnsCapture::from_istio(true, false, &["127.0.0.53".parse().unwrap()]);
        assert!(d.effective());
    }
}
