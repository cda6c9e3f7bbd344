//! Settings Istio derives instead of taking them as flags (docs/redirect-init.md, "Flags and environment"):
//! the pod's own address (which decides IPv6), the DNS servers of `/etc/resolv.conf`, and the
//! proxy UID of the `ENVOY_USER` account. Shared by redirect-init and the CNI plugin.

use std::net::IpAddr;
use std::path::Path;

use crate::error::{Error, Result};

/// Istio's UID for the proxy when `ENVOY_USER` does not resolve.
pub const DEFAULT_PROXY_UID: u32 = 1337;

/// The address Istio picks as the pod's ("HostIP"), and whether that turns IPv6 rules on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAddress {
    /// The address picked.
    pub ip: IpAddr,
    /// Istio's `ENABLE_INBOUND_IPV6`.
    pub ipv6: bool,
}

/// Istio's rule: skip loopback and link-local addresses; without dual-stack the first address
/// left decides the family; with dual-stack any IPv6 address turns IPv6 on (and is the one
/// reported). The kernel lists IPv4 before IPv6, so a single-stack pod with both kinds of
/// address gets IPv4 rules only, as with Istio.
pub fn host_address(addrs: &[IpAddr], dual_stack: bool) -> Option<HostAddress> {
    let usable: Vec<IpAddr> = addrs.iter().copied().filter(is_usable).collect();
    let first = *usable.first()?;
    if dual_stack {
        if let Some(v6) = usable.iter().find(|a| a.is_ipv6()) {
            return Some(HostAddress {
                ip: *v6,
                ipv6: true,
            });
        }
    }
    Some(HostAddress {
        ip: first,
        ipv6: first.is_ipv6(),
    })
}

fn is_usable(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified(),
        IpAddr::V6(v6) => {
            let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
            let multicast_link_local = (v6.segments()[0] & 0xff0f) == 0xff02;
            !v6.is_loopback() && !link_local && !multicast_link_local && !v6.is_unspecified()
        }
    }
}

/// `host_address` over a namespace's addresses (`Backend::addresses`,
/// `Routes::interface_addresses`); no usable address is Istio's error.
pub fn detect_host_address(addrs: &[IpAddr], dual_stack: bool) -> Result<HostAddress> {
    host_address(addrs, dual_stack).ok_or_else(|| Error::from(redirect_model::Error::Config {
        field: "pod address",
        value: addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(","),
        expected: "no valid local IP address found: the network namespace needs an address that is neither loopback nor link-local (is this the pod's namespace, and has its network been set up?)".into(),
    }))
}

/// The `nameserver` lines of a resolv.conf, in order, and the lines that did not parse.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nameservers {
    /// The `nameserver` addresses, in file order (zones dropped).
    pub servers: Vec<IpAddr>,
    /// `nameserver` lines without a valid address, as written (comments stripped).
    pub ignored: Vec<String>,
}

/// Parse resolv.conf text. `nameserver` takes one address; a zone (`fe80::1%eth0`) is dropped
/// with the address kept; comments start with `#` or `;`.
pub fn parse_resolv_conf(text: &str) -> Nameservers {
    let mut out = Nameservers::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(value) = words.next() else {
            out.ignored.push(line.to_string());
            continue;
        };
        let addr = value.split('%').next().unwrap_or(value);
        match addr.parse::<IpAddr>() {
            Ok(ip) => out.servers.push(ip),
            Err(_) => out.ignored.push(line.to_string()),
        }
    }
    out
}

/// Read and parse a resolv.conf; a missing file has no servers (Istio then disables DNS
/// capture with a warning), any other read error is reported.
pub fn read_resolv_conf(path: &Path) -> Result<Nameservers> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(parse_resolv_conf(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Nameservers::default()),
        Err(e) => Err(Error::from(redirect_model::Error::Config {
            field: "resolv.conf",
            value: path.display().to_string(),
            expected: format!("a readable resolv.conf ({e})"),
        })),
    }
}

/// The UID of a user account, as Istio resolves `ENVOY_USER`; `None` when it does not exist.
pub fn uid_of_user(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn host_address_follows_istio() {
        let v4_then_v6 = ips(&["127.0.0.1", "10.1.0.5", "::1", "fe80::1", "fd00::5"]);
        let single = host_address(&v4_then_v6, false).unwrap();
        assert_eq!((single.ip, single.ipv6), (ips(&["10.1.0.5"])[0], false));
        let dual = host_address(&v4_then_v6, true).unwrap();
        assert_eq!((dual.ip, dual.ipv6), (ips(&["fd00::5"])[0], true));
        let v6_only = host_address(&ips(&["::1", "fe80::2", "fd00::7"]), false).unwrap();
        assert!(v6_only.ipv6);
        assert_eq!(
            host_address(&ips(&["127.0.0.1", "::1", "fe80::1"]), true),
            None
        );
        assert_eq!(host_address(&ips(&["169.254.1.1"]), false), None);
    }

    #[test]
    fn resolv_conf_nameservers() {
        let ns = parse_resolv_conf(
            "# generated\nsearch default.svc.cluster.local\nnameserver 10.96.0.10\n\
             nameserver fd00::10 # v6\n;nameserver 1.1.1.1\nnameserver fe80::1%eth0\n\
             nameserver bogus\nnameserver\noptions ndots:5\n",
        );
        assert_eq!(ns.servers, ips(&["10.96.0.10", "fd00::10", "fe80::1"]));
        assert_eq!(ns.ignored, vec!["nameserver bogus", "nameserver"]);
    }

    #[test]
    fn users_resolve_through_the_system() {
        assert_eq!(uid_of_user("root"), Some(0));
        assert_eq!(uid_of_user("no-such-user-redirect"), None);
    }
}
