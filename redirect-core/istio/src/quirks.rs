//! Istio behaviours we reproduce on purpose (the same config must send every packet where
//! Istio sends it) but that surprise operators. `warnings` names the ones a config triggers,
//! so redirect-init and redirect-validate can say so instead of leaving it to a packet trace.

use redirect_model::{join, CaptureConfig, InterceptionMode, Selection};

/// One reproduced Istio quirk that applies to a config, with what it does to traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quirk {
    /// Short stable id, for docs and for tests.
    pub id: &'static str,
    /// What the quirk does to this config's traffic, and the way out when there is one.
    pub message: String,
}

/// The quirks this config runs into, in a fixed order.
pub fn warnings(cfg: &CaptureConfig) -> Vec<Quirk> {
    let mut out = Vec::new();
    let uids = &cfg.proxy_uids;
    let gid_only: Vec<u32> = cfg
        .proxy_gids
        .iter()
        .copied()
        .filter(|g| !uids.contains(g))
        .collect();
    if uids.len() > 1 {
        out.push(Quirk {
            id: "multi-uid-loopback",
            message: format!(
                "several proxy UIDs ({}): only the first ({}) has its loopback connections to the pod's own addresses redirected to the inbound port {}; the others meet the first UID's non-proxy RETURN first (Istio does the same)",
                join(uids),
                uids[0],
                cfg.inbound_capture_port
            ),
        });
    }
    if cfg.mode == InterceptionMode::Redirect && !gid_only.is_empty() {
        out.push(Quirk {
            id: "gid-only-loopback",
            message: format!(
                "proxy GIDs {} are not proxy UIDs: a proxy running under such a GID but another UID gets no loopback inbound redirect, the UID rules RETURN it first (Istio does the same)",
                join(&gid_only)
            ),
        });
    }
    let lo = cfg.ipv4_loopback_cidr;
    if lo.contains(&std::net::Ipv4Addr::new(127, 0, 0, 6)) {
        out.push(Quirk {
            id: "loopback-cidr-hides-probe",
            message: format!(
                "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR={lo} contains 127.0.0.6: the proxy's loopback redirect skips it, so the validation probe (to 127.0.0.6) can never succeed and Envoy's inbound passthrough is not redirected; use 127.0.0.1/32"
            ),
        });
    }
    if cfg.dns.effective() && !gid_only.is_empty() {
        out.push(Quirk {
            id: "gid-rule-captures-dns",
            message: format!(
                "with DNS capture, a process under proxy GID {} but not a proxy UID has its TCP DNS to loopback resolvers (such as 127.0.0.53) redirected to the inbound port: Istio's GID rule lacks the UID rule's port-53 exception",
                join(&gid_only)
            ),
        });
    }
    if cfg.mode == InterceptionMode::Tproxy
        && cfg.inbound_ports == Selection::All
        && !cfg.inbound_exclude_ports.contains(&cfg.inbound_tunnel_port)
    {
        out.push(Quirk {
            id: "tproxy-captures-tunnel-port",
            message: format!(
                "TPROXY with all inbound ports also captures the tunnel port {} (Istio's mangle chain has no RETURN for it); add it to the inbound exclude ports (-d) if something listens there",
                cfg.inbound_tunnel_port
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use redirect_model::DnsCapture;

    fn ids(cfg: &CaptureConfig) -> Vec<&'static str> {
        warnings(cfg).into_iter().map(|q| q.id).collect()
    }

    #[test]
    fn istio_default_has_no_quirk() {
        assert!(ids(&CaptureConfig::istio_sidecar_default()).is_empty());
    }

    #[test]
    fn each_quirk_has_its_trigger() {
        let base = CaptureConfig::istio_sidecar_default();
        let multi = CaptureConfig {
            proxy_uids: vec![3, 4],
            proxy_gids: vec![1, 2],
            dns: DnsCapture::All,
            ..base.clone()
        };
        assert_eq!(
            ids(&multi),
            [
                "multi-uid-loopback",
                "gid-only-loopback",
                "gid-rule-captures-dns"
            ]
        );
        let lo8 = CaptureConfig {
            ipv4_loopback_cidr: "127.0.0.1/8".parse().unwrap(),
            ..base.clone()
        };
        assert_eq!(ids(&lo8), ["loopback-cidr-hides-probe"]);
        let tproxy = CaptureConfig {
            mode: InterceptionMode::Tproxy,
            ..base.clone()
        };
        assert_eq!(ids(&tproxy), ["tproxy-captures-tunnel-port"]);
        let tproxy_excluded = CaptureConfig {
            inbound_exclude_ports: vec![15008],
            ..tproxy
        };
        assert!(ids(&tproxy_excluded).is_empty());
    }
}
