//! The start-up block Istio's init container logs (operators grep for these lines): the raw
//! environment it read, then the effective variables. Same headers and keys as istio-iptables.

use std::fmt::Write;

use redirect_core::cli::join;
use redirect_core::DnsCapture;

use redirect_core::cli::settings::{Backend, Settings};

/// The variables listed under "Istio iptables environment:", as Istio lists them.
const ENVIRONMENT: &[&str] = &[
    "ENVOY_PORT",
    "INBOUND_CAPTURE_PORT",
    "ISTIO_INBOUND_INTERCEPTION_MODE",
    "ISTIO_INBOUND_TPROXY_ROUTE_TABLE",
    "ISTIO_INBOUND_PORTS",
    "ISTIO_OUTBOUND_PORTS",
    "ISTIO_LOCAL_EXCLUDE_PORTS",
    "ISTIO_EXCLUDE_INTERFACES",
    "ISTIO_SERVICE_CIDR",
    "ISTIO_SERVICE_EXCLUDE_CIDR",
    "ISTIO_META_DNS_CAPTURE",
    "INVALID_DROP",
];

/// A block on stderr: as it is (Istio's lines), or one JSON line holding it with JSON logs.
pub fn print(block: &str) {
    if redirect_program::logging::json_lines() {
        redirect_program::logging::stderr_line("info", block.trim_end());
    } else {
        eprint!("{block}");
    }
}

pub fn environment(env: &dyn Fn(&str) -> Option<String>) -> String {
    let mut s = String::from("Istio iptables environment:\n");
    for name in ENVIRONMENT {
        // The values are the pod author's: escaped, so none can forge a line of the log.
        let value = redirect_program::logging::escape(&env(name).unwrap_or_default());
        let _ = writeln!(s, "{name}={value}");
    }
    s
}

/// "Istio iptables variables:": the effective settings after derivation.
pub fn variables(s: &Settings) -> String {
    let c = &s.config;
    let (dns_v4, dns_v6) = match &c.dns {
        DnsCapture::Servers { v4, v6 } => (join(v4), join(v6)),
        _ => (String::new(), String::new()),
    };
    let backend = match s.backend {
        Backend::Native => "native-nftables-netlink",
        Backend::Iptables => "iptables",
    };
    let rows: Vec<(&str, String)> = vec![
        ("IPTABLES_VERSION", backend.into()),
        ("PROXY_PORT", c.envoy_port.to_string()),
        (
            "PROXY_INBOUND_CAPTURE_PORT",
            c.inbound_capture_port.to_string(),
        ),
        ("PROXY_TUNNEL_PORT", c.inbound_tunnel_port.to_string()),
        ("PROXY_UID", join(&c.proxy_uids)),
        ("PROXY_GID", join(&c.proxy_gids)),
        (
            "INBOUND_INTERCEPTION_MODE",
            format!("{:?}", c.mode).to_uppercase(),
        ),
        ("INBOUND_TPROXY_MARK", c.tproxy_mark.to_string()),
        (
            "INBOUND_TPROXY_ROUTE_TABLE",
            c.tproxy_route_table.to_string(),
        ),
        ("INBOUND_PORTS_INCLUDE", c.inbound_ports.to_string()),
        ("INBOUND_PORTS_EXCLUDE", join(&c.inbound_exclude_ports)),
        (
            "OUTBOUND_OWNER_GROUPS_INCLUDE",
            c.owner_groups_include.to_string(),
        ),
        (
            "OUTBOUND_OWNER_GROUPS_EXCLUDE",
            join(&c.owner_groups_exclude),
        ),
        (
            "OUTBOUND_IP_RANGES_INCLUDE",
            c.outbound_include_cidrs.to_string(),
        ),
        (
            "OUTBOUND_IP_RANGES_EXCLUDE",
            join(&c.outbound_exclude_cidrs),
        ),
        ("OUTBOUND_PORTS_INCLUDE", join(&c.outbound_include_ports)),
        ("OUTBOUND_PORTS_EXCLUDE", join(&c.outbound_exclude_ports)),
        ("KUBE_VIRT_INTERFACES", join(&c.reroute_interfaces)),
        ("ENABLE_INBOUND_IPV6", c.ipv6.to_string()),
        ("DUAL_STACK", s.dual_stack.to_string()),
        ("DNS_CAPTURE", s.redirect_dns.to_string()),
        ("DROP_INVALID", c.drop_invalid.to_string()),
        ("CAPTURE_ALL_DNS", s.capture_all_dns.to_string()),
        ("DNS_SERVERS", format!("[{dns_v4}],[{dns_v6}]")),
        (
            "NETWORK_NAMESPACE",
            s.network_namespace
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        ("EXCLUDE_INTERFACES", join(&c.exclude_interfaces)),
        (
            "OUTBOUND_IPV4_LOOPBACK_CIDR",
            c.ipv4_loopback_cidr.to_string(),
        ),
    ];
    let mut out = String::from("Istio iptables variables:\n");
    for (k, v) in rows {
        // The namespace path and interface names come from outside: one line each, always.
        let _ = writeln!(out, "{k}={}", redirect_program::logging::escape(&v));
    }
    out
}
