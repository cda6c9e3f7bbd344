//! Istio ambient's probe SNAT, in the host's namespace: kubelet's TCP connections to an
//! enrolled pod's address leave the host with the source [`HostProbeConfig::snat_v4`]
//! (`169.254.7.127`) or its IPv6 twin, which the pod's in-pod rules let through uncaptured
//! (`AmbientConfig::probe_snat_v4`/`_v6` must be the same addresses). Istio's form is the table
//! `inet istio-ambient-nat`: a set of pod addresses per family, filled at run time as pods are
//! enrolled, and `meta l4proto tcp meta skuid <kubelet> ip daddr @set snat ip to <address>` in a
//! nat POSTROUTING chain. Ours is the same in our layout, in its own table
//! ([`crate::table::HOST_PROBE_TABLE`]): a base chain `nat_postrouting` (priority `srcnat`,
//! 100) that dispatches per family to `nat_ip_postrouting` / `nat_ip6_postrouting`, and the sets
//! `ip-inpod-probes` / `ip6-inpod-probes` ([`HostProbeConfig::set_name`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::builder::{tcp, uid, Builder};
use super::sets::cidr_set;
use crate::error::{Error, Result};
use crate::ruleset::{Action, AddrMatch, Family, Match, NamedSet, Ruleset, SetElements, Stage};

/// The sets' name, after the family's prefix (`ip-inpod-probes`), as Istio's
/// `istio-inpod-probes-v4`.
pub const PROBE_SET: &str = "inpod-probes";

/// The host's probe SNAT: whose connections (kubelet's UID) get which source address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProbeConfig {
    /// kubelet's real UID on the host (Istio finds it in the host's `/proc`:
    /// `redirect_istio::ambient::kubelet_uid`).
    pub kubelet_uid: u32,
    /// The source of kubelet's IPv4 probes (`HOST_PROBE_SNAT_IP`).
    pub snat_v4: Ipv4Addr,
    /// The source of kubelet's IPv6 probes (`HOST_PROBE_SNAT_IPV6`); `None`: IPv4 only (no
    /// IPv6 set or rule, and an IPv6 pod address is refused).
    pub snat_v6: Option<Ipv6Addr>,
}

impl HostProbeConfig {
    /// Istio's addresses (`169.254.7.127`, `fd16:9254:7127:1337:ffff:ffff:ffff:ffff`, the
    /// defaults of `AmbientConfig`), IPv6 on, for kubelet's UID.
    pub fn new(kubelet_uid: u32) -> Self {
        let pod = crate::AmbientConfig::default();
        HostProbeConfig {
            kubelet_uid,
            snat_v4: pod.probe_snat_v4,
            snat_v6: Some(pod.probe_snat_v6),
        }
    }

    /// IPv4, and IPv6 when [`Self::snat_v6`] is set.
    pub fn families(&self) -> Vec<Family> {
        match self.snat_v6 {
            Some(_) => vec![Family::V4, Family::V6],
            None => vec![Family::V4],
        }
    }

    /// The name of the set of pod addresses of `family` (`ip-inpod-probes`).
    pub fn set_name(family: Family) -> String {
        cidr_set(family, PROBE_SET)
    }

    /// The table's plan, its sets empty: what the node agent programs at start. An SNAT
    /// address that cannot be a packet's source is an error naming it.
    pub fn plan(&self) -> Result<Ruleset> {
        self.plan_with(&[])
    }

    /// The plan with `pods` in the sets (a dry run, or what a table holding them reads back
    /// as); each address is checked as [`Self::family_of`] does.
    pub fn plan_with(&self, pods: &[IpAddr]) -> Result<Ruleset> {
        check_snat("snat_v4", IpAddr::V4(self.snat_v4))?;
        if let Some(a) = self.snat_v6 {
            check_snat("snat_v6", IpAddr::V6(a))?;
        }
        let mut rs = Ruleset::default();
        for family in self.families() {
            let mut members = Vec::new();
            for &ip in pods {
                if self.family_of(ip)? == family && !members.contains(&ip) {
                    members.push(ip);
                }
            }
            rs.sets.push(NamedSet {
                name: Self::set_name(family),
                family: Some(family),
                elements: SetElements::Addrs(members),
            });
            rs.chains.extend(self.chain(family));
        }
        Ok(rs)
    }

    /// The family whose set a pod address goes in; an error naming the address when it cannot
    /// be a pod's (unspecified, loopback, multicast, broadcast, IPv4-mapped) or when it is IPv6
    /// and IPv6 is off.
    pub fn family_of(&self, ip: IpAddr) -> Result<Family> {
        let bad = |expected: &str| Error::Config {
            field: "pod address",
            value: ip.to_string(),
            expected: expected.into(),
        };
        if !unicast(ip) {
            return Err(bad(
                "a pod's unicast address (not unspecified, loopback, multicast or broadcast)",
            ));
        }
        match ip {
            IpAddr::V4(_) => Ok(Family::V4),
            IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Err(bad(
                "an IPv4 pod address written as IPv4, not IPv4-mapped IPv6 (::ffff:a.b.c.d)",
            )),
            IpAddr::V6(_) if self.snat_v6.is_none() => Err(bad(
                "an IPv4 address: IPv6 is off in this HostProbeConfig (snat_v6 is None); set snat_v6 (Istio's fd16:9254:7127:1337:ffff:ffff:ffff:ffff) and apply it again to SNAT IPv6 pods' probes",
            )),
            IpAddr::V6(_) => Ok(Family::V6),
        }
    }

    /// nat POSTROUTING of one family: kubelet's TCP to a member gets the SNAT address.
    fn chain(&self, family: Family) -> Vec<crate::ruleset::Chain> {
        let to = match (family, self.snat_v6) {
            (Family::V6, Some(a)) => IpAddr::V6(a),
            _ => IpAddr::V4(self.snat_v4),
        };
        let members = Match::DAddr(AddrMatch::InSet(Self::set_name(family)));
        let mut b = Builder::new(family);
        let matches = vec![tcp(), uid(self.kubelet_uid, false), members];
        b.append(Stage::Nat, "POSTROUTING", matches, Action::Snat(to));
        b.finish()
    }
}

fn unicast(ip: IpAddr) -> bool {
    let never = ip.is_unspecified() || ip.is_loopback() || ip.is_multicast();
    !never && ip != IpAddr::V4(Ipv4Addr::BROADCAST)
}

/// An SNAT address must be one a packet can come from.
fn check_snat(field: &'static str, a: IpAddr) -> Result<()> {
    if unicast(a) {
        return Ok(());
    }
    Err(Error::Config {
        field,
        value: a.to_string(),
        expected: "a unicast address for kubelet's probes to come from, the same as the pods' probe_snat (Istio's 169.254.7.127 and fd16:9254:7127:1337:ffff:ffff:ffff:ffff)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{evaluate, Flow, Verdict};

    fn eval(rs: &Ruleset, flow: &str) -> (Verdict, Option<IpAddr>) {
        let e = evaluate(rs, &flow.parse::<Flow>().unwrap());
        (e.verdict, e.snat)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// kubelet's TCP to a member is SNATed; another UID, another address, UDP are not.
    #[test]
    fn kubelet_to_a_member_is_snated_and_nothing_else() {
        let cfg = HostProbeConfig::new(0);
        let rs = cfg.plan_with(&[ip("10.77.0.2"), ip("fd00::2")]).unwrap();
        let v4 = Some(ip("169.254.7.127"));
        let v6 = Some(ip("fd16:9254:7127:1337:ffff:ffff:ffff:ffff"));
        let cases = [
            ("out tcp uid=0 10.77.0.2:8080", v4),
            ("out tcp uid=0 [fd00::2]:8080", v6),
            ("out tcp uid=1000 10.77.0.2:8080", None),
            ("out tcp uid=0 10.77.0.3:8080", None),
            ("out udp uid=0 10.77.0.2:8080", None),
            ("in tcp 10.77.0.2:8080 src=10.0.0.9", None),
        ];
        for (flow, want) in cases {
            assert_eq!(eval(&rs, flow), (Verdict::Pass, want), "{flow}");
        }
        let empty = cfg.plan().unwrap();
        assert_eq!(eval(&empty, "out tcp uid=0 10.77.0.2:8080").1, None);
    }

    #[test]
    fn the_layout_and_its_renderings() {
        let rs = HostProbeConfig::new(42).plan().unwrap();
        assert_eq!(rs.families(), [Family::V4, Family::V6]);
        let nft = crate::render::nft_script_named(&rs, crate::table::HOST_PROBE_TABLE, "x");
        for text in [
            "table inet redirect_ambient_host {",
            "set ip-inpod-probes { type ipv4_addr; }",
            "set ip6-inpod-probes { type ipv6_addr; }",
            "type nat hook postrouting priority 100; policy accept;",
            "meta l4proto tcp meta skuid 42 ip daddr @ip-inpod-probes snat ip to 169.254.7.127",
            "ip6 daddr @ip6-inpod-probes snat ip6 to fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
        ] {
            assert!(nft.contains(text), "{text} in\n{nft}");
        }
        let with = HostProbeConfig::new(42)
            .plan_with(&[ip("10.77.0.2"), ip("10.77.0.3")])
            .unwrap();
        let ipt = crate::render::iptables_restore(&with, Family::V4);
        for line in [
            "-A POSTROUTING -p tcp -m owner --uid-owner 42 -d 10.77.0.2 -j SNAT --to-source 169.254.7.127",
            "-A POSTROUTING -p tcp -m owner --uid-owner 42 -d 10.77.0.3 -j SNAT --to-source 169.254.7.127",
        ] {
            assert!(ipt.contains(line), "{line} in\n{ipt}");
        }
    }

    #[test]
    fn bad_addresses_are_errors_naming_them() {
        let v4_only = HostProbeConfig {
            snat_v6: None,
            ..HostProbeConfig::new(0)
        };
        assert_eq!(v4_only.plan().unwrap().families(), [Family::V4]);
        let e = v4_only.family_of(ip("fd00::2")).unwrap_err().to_string();
        assert!(e.contains("fd00::2") && e.contains("snat_v6"), "{e}");
        let e = v4_only.plan_with(&[ip("fd00::2")]).unwrap_err().to_string();
        assert!(e.contains("IPv6 is off"), "{e}");
        for bad in [
            "0.0.0.0",
            "127.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::ffff:10.0.0.1",
        ] {
            let e = HostProbeConfig::new(0).family_of(ip(bad)).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        let e = HostProbeConfig {
            snat_v4: Ipv4Addr::UNSPECIFIED,
            ..HostProbeConfig::new(0)
        };
        let e = e.plan().unwrap_err().to_string();
        assert!(e.contains("snat_v4") && e.contains("0.0.0.0"), "{e}");
    }
}
