//! The parsers of Istio's string forms (`"15090,15021"`, `"*"`, `"10.0.0.0/8,fd00::/8"`, Go's
//! booleans, the interception mode) into the model's types. One place, so that every shim (the
//! installer, the plugin's annotations, `redirect-validate`) parses lists the same way; the
//! errors name the field, the value and what is accepted.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};

use super::validate::check_interface;
use super::{invalid, GroupRef, InterceptionMode, Selection};
use crate::error::Result;

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

impl GroupRef {
    fn parse(s: &str) -> GroupRef {
        match s.parse::<u32>() {
            Ok(id) => GroupRef::Id(id),
            Err(_) => GroupRef::Name(s.to_string()),
        }
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
    use super::*;

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
}
