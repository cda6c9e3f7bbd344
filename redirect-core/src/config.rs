//! `CaptureConfig`: every parameter of Istio's capture that concerns rules
//! (`reference/istio-capture.md` §1.2–1.3), typed and validated.
//!
//! Build one with `CaptureConfig::default()` (Istio's defaults) and struct update syntax, or from
//! JSON with `from_json`; then `validate()` (done by `from_json` and by `plan`). The parsers of
//! Istio's string forms (`"15090,15021"`, `"*"`, `"10.0.0.0/8,fd00::/8"`) live here too, so every
//! shim parses lists the same way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

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

impl InterceptionMode {
    /// Istio's rule: `TPROXY` (exactly) selects TPROXY, anything else behaves as REDIRECT.
    /// We are stricter: empty or `REDIRECT` is REDIRECT, `TPROXY` is TPROXY, case-insensitive,
    /// and anything else is an error naming the value.
    pub fn parse(field: &'static str, s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "" | "REDIRECT" => Ok(InterceptionMode::Redirect),
            "TPROXY" => Ok(InterceptionMode::Tproxy),
            _ => Err(invalid(field, s, "expected REDIRECT or TPROXY")),
        }
    }
}

/// `*` (all) or an explicit list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Selection<T> {
    All,
    List(Vec<T>),
}

impl<T> Default for Selection<T> {
    fn default() -> Self {
        Selection::List(Vec::new())
    }
}

impl<T> Selection<T> {
    pub fn is_all(&self) -> bool {
        matches!(self, Selection::All)
    }

    /// True for `List([])`: nothing selected.
    pub fn is_none(&self) -> bool {
        matches!(self, Selection::List(l) if l.is_empty())
    }

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
    Id(u32),
    Name(String),
}

impl GroupRef {
    fn parse(s: &str) -> GroupRef {
        match s.parse::<u32>() {
            Ok(id) => GroupRef::Id(id),
            Err(_) => GroupRef::Name(s.to_string()),
        }
    }
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
    #[default]
    Off,
    /// Capture all DNS (UDP and TCP port 53), whatever the server.
    All,
    /// Capture DNS to these servers only. With no server at all Istio silently disables DNS
    /// capture; so do we (see `effective`).
    Servers {
        #[serde(default)]
        v4: Vec<Ipv4Addr>,
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

    /// Parse JSON (as written by `to_json`) and validate.
    pub fn from_json(s: &str) -> Result<Self> {
        let cfg: CaptureConfig = serde_json::from_str(s).map_err(|e| Error::Config {
            field: "config",
            value: truncate(s, 80),
            expected: format!("a CaptureConfig JSON object ({e})"),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("CaptureConfig serializes")
    }

    /// Check every field; the error names the first bad field, its value, and what is accepted.
    pub fn validate(&self) -> Result<()> {
        for (field, port) in [
            ("envoy_port", self.envoy_port),
            ("inbound_capture_port", self.inbound_capture_port),
            ("inbound_tunnel_port", self.inbound_tunnel_port),
        ] {
            check_port(field, port)?;
        }
        if let Selection::List(l) = &self.inbound_ports {
            check_ports("inbound_ports", l)?;
        }
        check_ports("inbound_exclude_ports", &self.inbound_exclude_ports)?;
        check_ports("outbound_include_ports", &self.outbound_include_ports)?;
        check_ports("outbound_exclude_ports", &self.outbound_exclude_ports)?;
        if self.proxy_uids.is_empty() {
            return Err(invalid(
                "proxy_uids",
                "",
                "at least one proxy UID is needed, or the proxy's own traffic would be captured in a loop (Istio's default is 1337)",
            ));
        }
        if self.proxy_gids.is_empty() {
            return Err(invalid(
                "proxy_gids",
                "",
                "at least one proxy GID is needed (Istio uses the proxy UID when no GID is given)",
            ));
        }
        for (field, ifaces) in [
            ("exclude_interfaces", &self.exclude_interfaces),
            ("reroute_interfaces", &self.reroute_interfaces),
        ] {
            for i in ifaces {
                check_interface(field, i)?;
            }
        }
        if self.tproxy_mark == 0 || self.tproxy_mark == OUTBOUND_MARK {
            return Err(invalid(
                "tproxy_mark",
                &self.tproxy_mark.to_string(),
                "expected a non-zero packet mark other than 1338 (Istio's outbound mark); the default is 1337",
            ));
        }
        if matches!(self.tproxy_route_table, 0 | 253..=255) {
            return Err(invalid(
                "tproxy_route_table",
                &self.tproxy_route_table.to_string(),
                "expected a routing table id other than 0 (unspec), 253 (default), 254 (main) and 255 (local); the default is 133",
            ));
        }
        let lo = self.ipv4_loopback_cidr;
        if !lo.addr().is_loopback() || lo.prefix_len() < 8 {
            return Err(invalid(
                "ipv4_loopback_cidr",
                &lo.to_string(),
                "expected an IPv4 loopback CIDR inside 127.0.0.0/8 with a mask of 8 to 32 bits, e.g. 127.0.0.1/32",
            ));
        }
        if let Selection::List(groups) = &self.owner_groups_include {
            if groups.len() > MAX_OWNER_GROUPS {
                return Err(invalid(
                    "owner_groups_include",
                    &join(groups),
                    &format!("at most {MAX_OWNER_GROUPS} groups, or \"*\" for all"),
                ));
            }
            if groups.is_empty() {
                return Err(invalid(
                    "owner_groups_include",
                    "",
                    "expected \"*\" (all groups) or a list of group names or GIDs",
                ));
            }
        }
        for g in self
            .owner_groups_include
            .list()
            .iter()
            .chain(&self.owner_groups_exclude)
        {
            if let GroupRef::Name(n) = g {
                if n.is_empty() || n.contains(|c: char| c.is_whitespace() || c == ':' || c == ',') {
                    return Err(invalid(
                        "owner_groups",
                        n,
                        "expected a group name or a numeric GID",
                    ));
                }
            }
        }
        for (field, bypass, proxy) in [
            ("bypass_uids", &self.bypass_uids, &self.proxy_uids),
            ("bypass_gids", &self.bypass_gids, &self.proxy_gids),
        ] {
            if let Some(id) = bypass.iter().find(|id| proxy.contains(id)) {
                return Err(Error::BypassConflict { field, id: *id });
            }
        }
        Ok(())
    }

    /// Include CIDRs of one family (empty for `*`).
    pub fn include_cidrs(&self) -> &[IpNet] {
        self.outbound_include_cidrs.list()
    }
}

fn check_port(field: &'static str, port: u16) -> Result<()> {
    if port == 0 {
        return Err(invalid(field, "0", "expected a port from 1 to 65535"));
    }
    Ok(())
}

fn check_ports(field: &'static str, ports: &[u16]) -> Result<()> {
    ports.iter().try_for_each(|p| check_port(field, *p))
}

/// Linux interface names: 1 to 15 bytes, no '/', ':' or whitespace, not "." or "..".
fn check_interface(field: &'static str, name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.len() > 15
        || name == "."
        || name == ".."
        || name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(invalid(
            field,
            name,
            "expected a Linux interface name: 1 to 15 characters without '/', ':' or spaces",
        ));
    }
    Ok(())
}

fn invalid(field: &'static str, value: &str, expected: &str) -> Error {
    Error::Config {
        field,
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

/// Items as Istio writes a list: comma-separated, no spaces.
pub fn join<T: ListItem>(items: &[T]) -> String {
    join_with(items, ",")
}

/// Items separated by `sep`, into one buffer (no string per item: lists can hold 10,000 CIDRs).
pub fn join_with<T: ListItem>(items: &[T], sep: &str) -> String {
    let mut s = String::with_capacity(items.len() * 16);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push_str(sep);
        }
        item.push_to(&mut s);
    }
    s
}

/// An item of a list we print (ports, IDs, interfaces, groups, CIDRs).
pub trait ListItem: std::fmt::Display {
    fn push_to(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = write!(out, "{self}");
    }
}

impl ListItem for u16 {}
impl ListItem for u32 {}
impl ListItem for String {}
impl ListItem for GroupRef {}
impl ListItem for Ipv4Addr {}
impl ListItem for Ipv6Addr {}
impl ListItem for &str {}

/// IPv4 CIDRs are written digit by digit: through `core::fmt`, every piece of 10,000 of them is
/// a `memcpy` call, and musl's (the static builds') is slow for small copies: 6 ms of
/// redirect-init's 21 ms with 10,000 CIDRs.
impl ListItem for IpNet {
    fn push_to(&self, out: &mut String) {
        match self {
            IpNet::V4(n) => {
                for (i, o) in n.addr().octets().iter().enumerate() {
                    if i > 0 {
                        out.push('.');
                    }
                    push_decimal(out, *o);
                }
                out.push('/');
                push_decimal(out, n.prefix_len());
            }
            IpNet::V6(n) => {
                use std::fmt::Write;
                let _ = write!(out, "{n}");
            }
        }
    }
}

fn push_decimal(out: &mut String, v: u8) {
    if v >= 100 {
        out.push(char::from(b'0' + v / 100));
    }
    if v >= 10 {
        out.push(char::from(b'0' + v / 10 % 10));
    }
    out.push(char::from(b'0' + v % 10));
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

/// Go's `strconv.ParseBool`, which Istio uses for every boolean flag, variable and env value.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Istio's list syntax: split on commas, trim, drop empty items (a trailing comma is harmless).
pub fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|i| !i.is_empty())
}

/// Parse a port list (`"15090,15021"`); `*` is rejected here (see `parse_port_selection`).
pub fn parse_ports(field: &'static str, s: &str) -> Result<Vec<u16>> {
    split_list(s)
        .map(|p| {
            p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                invalid(
                    field,
                    p,
                    "expected a comma-separated list of ports from 1 to 65535",
                )
            })
        })
        .collect()
}

/// Parse `*` or a port list.
pub fn parse_port_selection(field: &'static str, s: &str) -> Result<Selection<u16>> {
    if split_list(s).any(|i| i == "*") {
        return Ok(Selection::All);
    }
    parse_ports(field, s).map(Selection::List)
}

/// Parse one CIDR; a bare address means a single host, host bits are cleared.
pub fn parse_cidr(field: &'static str, s: &str) -> Result<IpNet> {
    let net = s
        .parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| {
            invalid(
                field,
                s,
                "expected a comma-separated list of CIDRs such as 10.0.0.0/8 or fd00::/8",
            )
        })?;
    Ok(net.trunc())
}

/// Parse a CIDR list; `*` is an error (exclude lists).
pub fn parse_cidrs(field: &'static str, s: &str) -> Result<Vec<IpNet>> {
    split_list(s)
        .map(|c| {
            if c == "*" {
                Err(invalid(
                    field,
                    s,
                    "\"*\" is not allowed here: excluding every destination is done by not capturing outbound at all (leave the include list empty)",
                ))
            } else {
                parse_cidr(field, c)
            }
        })
        .collect()
}

/// Parse `*` or a CIDR list (include lists).
pub fn parse_cidr_selection(field: &'static str, s: &str) -> Result<Selection<IpNet>> {
    if split_list(s).any(|i| i == "*") {
        return Ok(Selection::All);
    }
    parse_cidrs(field, s).map(Selection::List)
}

/// Parse a UID or GID list.
pub fn parse_ids(field: &'static str, s: &str) -> Result<Vec<u32>> {
    split_list(s)
        .map(|p| {
            p.parse::<u32>()
                .map_err(|_| invalid(field, p, "expected a comma-separated list of numeric IDs"))
        })
        .collect()
}

/// Parse an interface list.
pub fn parse_interfaces(field: &'static str, s: &str) -> Result<Vec<String>> {
    split_list(s)
        .map(|i| check_interface(field, i).map(|_| i.to_string()))
        .collect()
}

/// Parse `*` or a list of group names/GIDs.
pub fn parse_groups(field: &'static str, s: &str) -> Result<Selection<GroupRef>> {
    if split_list(s).any(|i| i == "*") {
        return Ok(Selection::All);
    }
    let groups: Vec<GroupRef> = split_list(s).map(GroupRef::parse).collect();
    if groups.is_empty() {
        return Err(invalid(
            field,
            s,
            "expected \"*\" or a list of group names or GIDs",
        ));
    }
    Ok(Selection::List(groups))
}

/// Parse the IPv4 loopback CIDR (`ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`).
pub fn parse_loopback_cidr(field: &'static str, s: &str) -> Result<Ipv4Net> {
    let net: Ipv4Net = s.trim().parse().map_err(|_| {
        invalid(
            field,
            s,
            "expected an IPv4 loopback CIDR such as 127.0.0.1/32",
        )
    })?;
    if !net.addr().is_loopback() || net.prefix_len() < 8 {
        return Err(invalid(
            field,
            s,
            "expected an IPv4 loopback CIDR inside 127.0.0.0/8 with a mask of 8 to 32 bits",
        ));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {

    /// The CIDR writer prints what `Display` prints, for every octet value and prefix length.
    #[test]
    fn cidrs_are_written_as_display_writes_them() {
        let mut nets: Vec<IpNet> = Vec::new();
        for v in [0u8, 1, 9, 10, 42, 99, 100, 199, 200, 255] {
            for p in [0u8, 1, 8, 9, 10, 24, 25, 31, 32] {
                let a = Ipv4Addr::new(v, 255 - v, v / 3, v / 7);
                nets.push(IpNet::V4(Ipv4Net::new(a, p).unwrap()));
            }
        }
        nets.push("fd00::/8".parse().unwrap());
        nets.push("::1/128".parse().unwrap());
        let want: Vec<String> = nets.iter().map(|n| n.to_string()).collect();
        assert_eq!(join(&nets), want.join(","));
        assert_eq!(
            join_with(&nets[..2], ", "),
            format!("{}, {}", want[0], want[1])
        );
    }

    use super::*;

    #[test]
    fn defaults_validate_and_round_trip() {
        for cfg in [
            CaptureConfig::default(),
            CaptureConfig::istio_sidecar_default(),
        ] {
            cfg.validate().unwrap();
            let back = CaptureConfig::from_json(&cfg.to_json()).unwrap();
            assert_eq!(back, cfg);
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
    fn lists_parse_as_istio() {
        assert_eq!(parse_ports("p", "6000,7000,").unwrap(), vec![6000, 7000]);
        assert_eq!(parse_ports("p", " 1 , 2 ").unwrap(), vec![1, 2]);
        assert_eq!(parse_port_selection("p", "*").unwrap(), Selection::All);
        assert_eq!(
            parse_port_selection("p", "").unwrap(),
            Selection::List(vec![])
        );
        assert_eq!(
            parse_cidr_selection("i", "10.1.2.3/8, fd00::1/8").unwrap(),
            Selection::List(vec![
                "10.0.0.0/8".parse().unwrap(),
                "fd00::/8".parse().unwrap()
            ])
        );
        assert_eq!(
            parse_cidrs("x", "1.2.3.4").unwrap(),
            vec!["1.2.3.4/32".parse().unwrap()]
        );
        assert_eq!(
            parse_groups("g", "java,202").unwrap(),
            Selection::List(vec![GroupRef::Name("java".into()), GroupRef::Id(202)])
        );
    }

    #[test]
    fn bad_values_name_field_value_and_fix() {
        let e = parse_ports("istio-inbound-ports", "80,70000")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("istio-inbound-ports") && e.contains("70000") && e.contains("1 to 65535"),
            "{e}"
        );
        let e = parse_cidrs("istio-service-exclude-cidr", "*")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("istio-service-exclude-cidr") && e.contains("not allowed"),
            "{e}"
        );
        let e = parse_cidrs("x", "10.0.0.0/33").unwrap_err().to_string();
        assert!(e.contains("10.0.0.0/33"), "{e}");
        let e = parse_loopback_cidr("l", "10.0.0.1/32")
            .unwrap_err()
            .to_string();
        assert!(e.contains("loopback"), "{e}");
        let e = InterceptionMode::parse("m", "tproxi")
            .unwrap_err()
            .to_string();
        assert!(e.contains("tproxi") && e.contains("TPROXY"), "{e}");
        let e = parse_interfaces("c", "eth0,this-name-is-too-long")
            .unwrap_err()
            .to_string();
        assert!(e.contains("this-name-is-too-long"), "{e}");
    }

    #[test]
    fn validate_rejects_each_bad_field() {
        let base = CaptureConfig::default();
        let cases: Vec<(CaptureConfig, &str)> = vec![
            (
                CaptureConfig {
                    envoy_port: 0,
                    ..base.clone()
                },
                "envoy_port",
            ),
            (
                CaptureConfig {
                    proxy_uids: vec![],
                    ..base.clone()
                },
                "proxy_uids",
            ),
            (
                CaptureConfig {
                    proxy_gids: vec![],
                    ..base.clone()
                },
                "proxy_gids",
            ),
            (
                CaptureConfig {
                    tproxy_mark: 0,
                    ..base.clone()
                },
                "tproxy_mark",
            ),
            (
                CaptureConfig {
                    tproxy_mark: 1338,
                    ..base.clone()
                },
                "tproxy_mark",
            ),
            (
                CaptureConfig {
                    tproxy_route_table: 254,
                    ..base.clone()
                },
                "tproxy_route_table",
            ),
            (
                CaptureConfig {
                    ipv4_loopback_cidr: "127.0.0.0/7".parse().unwrap(),
                    ..base.clone()
                },
                "ipv4_loopback_cidr",
            ),
            (
                CaptureConfig {
                    exclude_interfaces: vec!["a/b".into()],
                    ..base.clone()
                },
                "exclude_interfaces",
            ),
            (
                CaptureConfig {
                    owner_groups_include: Selection::List((0..65).map(GroupRef::Id).collect()),
                    ..base.clone()
                },
                "owner_groups_include",
            ),
            (
                CaptureConfig {
                    inbound_exclude_ports: vec![0],
                    ..base.clone()
                },
                "inbound_exclude_ports",
            ),
        ];
        for (cfg, field) in cases {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
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
