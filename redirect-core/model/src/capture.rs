//! [`Capture`]: one namespace's capture as one value, whichever kind it is: a sidecar's (a
//! validated [`CaptureConfig`]), ambient's in-pod redirection to ztunnel ([`AmbientConfig`]),
//! or the host's probe SNAT with the pod addresses its sets hold ([`HostProbeConfig`]). Each
//! kind knows its plan ([`Capture::plan`], called the same way for every kind), the table of
//! ours it lives in ([`Capture::table`]), what a rendering says it is ([`Capture::what`]) and
//! the routes it needs beside the table ([`Capture::routes`]); the kernel applies, checks,
//! reads and removes every kind through the same path.

use std::net::IpAddr;

use crate::config::{InterceptionMode, ValidConfig};
use crate::error::Result;
use crate::plan::{ambient, GroupResolver};
use crate::ruleset::{Family, Ruleset};
use crate::table::{HOST_PROBE_TABLE, TABLE};
use crate::{AmbientConfig, HostProbeConfig};

/// One namespace's capture. See the module's comment.
// A capture is made once per change to a namespace: its size does not matter, a box would.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Capture {
    /// A sidecar's capture (Istio's `istio-iptables`), validated.
    Sidecar(ValidConfig),
    /// Ambient's in-pod rules: the pod's traffic to ztunnel.
    Ambient(AmbientConfig),
    /// The host's probe SNAT: kubelet's probes to `members` leave with the address the pods'
    /// in-pod rules let through.
    HostProbe {
        /// Whose connections get which source address.
        config: HostProbeConfig,
        /// The enrolled pods' addresses the sets hold.
        members: Vec<IpAddr>,
    },
}

impl From<ValidConfig> for Capture {
    fn from(cfg: ValidConfig) -> Self {
        Capture::Sidecar(cfg)
    }
}

impl From<AmbientConfig> for Capture {
    fn from(cfg: AmbientConfig) -> Self {
        Capture::Ambient(cfg)
    }
}

/// Mark-based local routing: packets whose mark under `mask` is `mark` are looked up in route
/// table `table`, which holds one `local` default route via `lo`. A sidecar's TPROXY uses it
/// (Istio: mark 1337, the full mask, table 133); ambient's in-pod replies too (mark 0x111 under
/// 0xfff, table 100, the rule at priority 32764).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyRouting {
    /// The packet mark the rule matches.
    pub mark: u32,
    /// The bits of the packet mark compared (`u32::MAX`: all, as `ip rule add fwmark N` does).
    pub mask: u32,
    /// The route table looked up.
    pub table: u32,
    /// The rule's priority; `None` lets the kernel pick one below the last rule.
    pub priority: Option<u32>,
}

/// What a capture needs beside its table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    /// The policy routing, in each of `families`.
    pub policy: Option<PolicyRouting>,
    /// The families the policy routing is in.
    pub families: Vec<Family>,
    /// `::6/128` on `lo` (a sidecar's IPv6 inbound capture).
    pub lo_v6: bool,
}

impl Capture {
    /// The rules, each kind planned from its own config: a sidecar's with `groups` resolving
    /// its owner groups (the others have none). A value that cannot be planned is an error
    /// naming it.
    pub fn plan(&self, groups: &dyn GroupResolver) -> Result<Ruleset> {
        match self {
            Capture::Sidecar(cfg) => cfg.plan(groups),
            Capture::Ambient(cfg) => cfg.plan(),
            Capture::HostProbe { config, members } => config.plan_with(members),
        }
    }

    /// The table of ours the capture lives in: a pod's (`redirect_capture`), or the host's
    /// (`redirect_ambient_host`), so that the two never replace each other.
    pub fn table(&self) -> &'static str {
        match self {
            Capture::Sidecar(_) | Capture::Ambient(_) => TABLE,
            Capture::HostProbe { .. } => HOST_PROBE_TABLE,
        }
    }

    /// What a rendering of it says it is.
    pub fn what(&self) -> &'static str {
        match self {
            Capture::Sidecar(_) => "sidecar capture rules",
            Capture::Ambient(_) => "ambient in-pod rules (to ztunnel)",
            Capture::HostProbe { .. } => "ambient host probe SNAT (kubelet's probes)",
        }
    }

    /// The routes it needs beside its table: a sidecar's TPROXY routing (only with tproxied
    /// inbound capture) and `::6` on `lo` with IPv6; ambient's reply routing; nothing for the
    /// host's probe SNAT.
    pub fn routes(&self) -> Routes {
        match self {
            Capture::Sidecar(cfg) => sidecar_routes(cfg),
            Capture::Ambient(cfg) => Routes {
                policy: Some(AMBIENT_ROUTING),
                families: families(cfg.ipv6),
                lo_v6: false,
            },
            Capture::HostProbe { .. } => Routes::default(),
        }
    }
}

/// The policy routing of the replies of connections ztunnel delivered (ambient's in-pod rules
/// mark them).
pub const AMBIENT_ROUTING: PolicyRouting = PolicyRouting {
    mark: ambient::REPLY_MARK,
    mask: ambient::MARK_MASK,
    table: ambient::ROUTE_TABLE,
    priority: Some(ambient::RULE_PRIORITY),
};

/// The TPROXY mark and route table a sidecar's config names, whether or not it uses them.
pub fn sidecar_routing(cfg: &crate::CaptureConfig) -> PolicyRouting {
    PolicyRouting {
        mark: cfg.tproxy_mark,
        mask: u32::MAX,
        table: cfg.tproxy_route_table,
        priority: None,
    }
}

/// The routes a sidecar's config needs: TPROXY routing only with tproxied inbound capture, in
/// each family; `::6` on `lo` with IPv6.
pub fn sidecar_routes(cfg: &crate::CaptureConfig) -> Routes {
    Routes {
        policy: (cfg.mode == InterceptionMode::Tproxy && !cfg.inbound_ports.is_none())
            .then(|| sidecar_routing(cfg)),
        families: families(cfg.ipv6),
        lo_v6: cfg.ipv6,
    }
}

/// IPv4, and IPv6 with `ipv6`.
fn families(ipv6: bool) -> Vec<Family> {
    if ipv6 {
        vec![Family::V4, Family::V6]
    } else {
        vec![Family::V4]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CaptureConfig, NoGroupDatabase};

    #[test]
    fn each_kind_plans_the_same_way_into_its_own_table_with_its_own_routes() {
        let sidecar = Capture::Sidecar(ValidConfig::istio_sidecar_default());
        let ambient = Capture::Ambient(AmbientConfig::default());
        let host = Capture::HostProbe {
            config: HostProbeConfig::new(1000),
            members: vec!["10.0.0.2".parse().unwrap()],
        };
        for c in [&sidecar, &ambient, &host] {
            assert!(
                !c.plan(&NoGroupDatabase).unwrap().chains.is_empty(),
                "{c:?}"
            );
        }
        assert_eq!(
            [sidecar.table(), ambient.table(), host.table()],
            [TABLE, TABLE, HOST_PROBE_TABLE]
        );
        assert_eq!(
            sidecar.routes(),
            Routes {
                policy: None,
                families: vec![Family::V4],
                lo_v6: false
            }
        );
        assert_eq!(ambient.routes().policy, Some(AMBIENT_ROUTING));
        assert_eq!(ambient.routes().families, [Family::V4, Family::V6]);
        assert_eq!(host.routes(), Routes::default());
        let members = host.plan(&NoGroupDatabase).unwrap();
        assert!(members
            .sets
            .iter()
            .any(|s| format!("{s:?}").contains("10.0.0.2")));

        let mut tproxy = CaptureConfig::istio_sidecar_default();
        tproxy.mode = InterceptionMode::Tproxy;
        tproxy.ipv6 = true;
        let tproxy = Capture::Sidecar(tproxy.validated().unwrap());
        let r = tproxy.routes();
        assert_eq!(
            r.policy.map(|p| (p.mark, p.table)),
            Some((1337, 133)),
            "{r:?}"
        );
        assert!(r.lo_v6);
    }
}
