//! `CaptureConfig::validate` (which calls [`validate`]): every field checked, in a fixed order,
//! so the error names the first bad field, its value, and what is accepted. Apart from the model because each check
//! carries the words an operator reads, and the checks are most of the text.

use super::{invalid, join, CaptureConfig, GroupRef, Selection, MAX_OWNER_GROUPS, OUTBOUND_MARK};
use crate::error::{Error, IdKind, Result};

/// Check every field; the error names the first bad field, its value, and what is accepted.
pub(super) fn validate(cfg: &CaptureConfig) -> Result<()> {
    check_port_fields(cfg)?;
    check_proxy_ids(cfg)?;
    check_interfaces(cfg)?;
    check_tproxy(cfg)?;
    check_loopback(cfg)?;
    check_owner_groups(cfg)?;
    check_bypass(cfg)
}

fn check_port_fields(cfg: &CaptureConfig) -> Result<()> {
    for (field, port) in [
        ("envoy_port", cfg.envoy_port),
        ("inbound_capture_port", cfg.inbound_capture_port),
        ("inbound_tunnel_port", cfg.inbound_tunnel_port),
    ] {
        check_port(field, port)?;
    }
    if let Selection::List(l) = &cfg.inbound_ports {
        check_ports("inbound_ports", l)?;
    }
    check_ports("inbound_exclude_ports", &cfg.inbound_exclude_ports)?;
    check_ports("outbound_include_ports", &cfg.outbound_include_ports)?;
    check_ports("outbound_exclude_ports", &cfg.outbound_exclude_ports)
}

pub(super) fn check_proxy_ids(cfg: &CaptureConfig) -> Result<()> {
    if cfg.proxy_uids.is_empty() {
        return Err(invalid(
            "proxy_uids",
            "",
            "at least one proxy UID is needed, or the proxy's own traffic would be captured in a loop (Istio's default is 1337)",
        ));
    }
    if cfg.proxy_gids.is_empty() {
        return Err(invalid(
            "proxy_gids",
            "",
            "at least one proxy GID is needed (Istio uses the proxy UID when no GID is given)",
        ));
    }
    Ok(())
}

fn check_interfaces(cfg: &CaptureConfig) -> Result<()> {
    for (field, ifaces) in [
        ("exclude_interfaces", &cfg.exclude_interfaces),
        ("reroute_interfaces", &cfg.reroute_interfaces),
    ] {
        for i in ifaces {
            check_interface(field, i)?;
        }
    }
    Ok(())
}

/// The TPROXY mark and routing table, whatever the mode.
fn check_tproxy(cfg: &CaptureConfig) -> Result<()> {
    if cfg.tproxy_mark == 0 || cfg.tproxy_mark == OUTBOUND_MARK {
        return Err(invalid(
            "tproxy_mark",
            &cfg.tproxy_mark.to_string(),
            "expected a non-zero packet mark other than 1338 (Istio's outbound mark); the default is 1337",
        ));
    }
    if matches!(cfg.tproxy_route_table, 0 | 253..=255) {
        return Err(invalid(
            "tproxy_route_table",
            &cfg.tproxy_route_table.to_string(),
            "expected a routing table id other than 0 (unspec), 253 (default), 254 (main) and 255 (local); the default is 133",
        ));
    }
    Ok(())
}

fn check_loopback(cfg: &CaptureConfig) -> Result<()> {
    let lo = cfg.ipv4_loopback_cidr;
    if !lo.addr().is_loopback() || lo.prefix_len() < 8 {
        return Err(invalid(
            "ipv4_loopback_cidr",
            &lo.to_string(),
            "expected an IPv4 loopback CIDR inside 127.0.0.0/8 with a mask of 8 to 32 bits, e.g. 127.0.0.1/32",
        ));
    }
    Ok(())
}

fn check_owner_groups(cfg: &CaptureConfig) -> Result<()> {
    if let Selection::List(groups) = &cfg.owner_groups_include {
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
    for g in cfg
        .owner_groups_include
        .list()
        .iter()
        .chain(&cfg.owner_groups_exclude)
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
    Ok(())
}

/// A bypass ID that is also a proxy ID is an error variant of its own, so that callers can
/// name where the ID came from (the plugin: an annotation or its own config).
pub(super) fn check_bypass(cfg: &CaptureConfig) -> Result<()> {
    for (field, kind, bypass, proxy) in [
        (
            "bypass_uids",
            IdKind::Uid,
            &cfg.bypass_uids,
            &cfg.proxy_uids,
        ),
        (
            "bypass_gids",
            IdKind::Gid,
            &cfg.bypass_gids,
            &cfg.proxy_gids,
        ),
    ] {
        if let Some(id) = bypass.iter().find(|id| proxy.contains(id)) {
            return Err(Error::BypassConflict {
                field,
                kind,
                id: *id,
            });
        }
    }
    Ok(())
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
pub(crate) fn check_interface(field: &'static str, name: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
