//! Istio's ambient in-pod redirection: the rules the node agent programs inside an enrolled
//! pod's namespace so that its traffic reaches ztunnel, whose sockets there carry the mark
//! [`ZTUNNEL_MARK`]. Step by step as Istio's `AppendInpodRules` (istio-cni 1.29+), each step
//! named by its letter there: jumps (A), virtual interfaces (B), the connection mark of
//! ztunnel's packets (C), the probe address accepted (D, E), inbound to 15006 (F), the
//! connection mark restored on replies (G), DNS to 15053 and its conntrack zone (H), marked
//! replies and the pod's own loopback traffic accepted (I, J), outbound to 15001 (K). Replies
//! marked [`REPLY_MARK`] are routed to `lo` by policy routing ([`ROUTE_TABLE`]), which the
//! kernel layer sets up beside the table.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::builder::{dport, jump, tcp, udp, Builder};
use crate::config::check_interface;
use crate::error::Result;
use crate::ruleset::{Action, AddrMatch, CountedPath, Family, Match, PortMatch, Ruleset, Stage};

/// The mark on every socket ztunnel opens in the pod (its `DEFAULT_INPOD_MARK`, 1337).
pub const ZTUNNEL_MARK: u32 = 0x539;
/// The connection mark of connections ztunnel delivers, restored on their replies.
pub const REPLY_MARK: u32 = 0x111;
/// The bits of the packet and connection mark the rules use.
pub const MARK_MASK: u32 = 0xfff;
/// The policy routing table of marked replies: `local` everything via `lo`.
pub const ROUTE_TABLE: u32 = 100;
/// The priority of the `fwmark 0x111/0xfff lookup 100` rule.
pub const RULE_PRIORITY: u32 = 32764;
/// ztunnel's outbound capture port in the pod.
pub const OUTBOUND_PORT: u16 = 15001;
/// ztunnel's inbound plaintext port in the pod.
pub const INBOUND_PORT: u16 = 15006;
/// ztunnel's HBONE port in the pod: never redirected.
pub const HBONE_PORT: u16 = 15008;
/// ztunnel's DNS proxy port in the pod.
pub const DNS_PORT: u16 = 15053;
/// The conntrack zone of DNS between ztunnel's proxy and upstream servers (Istio #33469).
pub const DNS_ZONE: u16 = 1;

/// One ambient pod's in-pod redirection (Istio's `AmbientConfig` and `PodLevelOverrides`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmbientConfig {
    /// DNS (UDP and TCP port 53) to ztunnel's proxy: the chart's `ambient.dnsCapture`, or the
    /// pod's `ambient.istio.io/dns-capture`.
    pub dns_capture: bool,
    /// IPv6 rules and routes too (`ambient.ipv6`).
    pub ipv6: bool,
    /// `ambient.istio.io/bypass-inbound-capture=true`: outbound captured, inbound not (HBONE on
    /// 15008 still reaches ztunnel).
    pub bypass_inbound: bool,
    /// `istio.io/reroute-virtual-interfaces`: TCP arriving on these goes to 15001.
    pub virtual_interfaces: Vec<String>,
    /// The source address of kubelet's probes after the host's SNAT (`HOST_PROBE_SNAT_IP`).
    pub probe_snat_v4: Ipv4Addr,
    /// The same for IPv6 (`HOST_PROBE_SNAT_IPV6`).
    pub probe_snat_v6: Ipv6Addr,
    /// Ours, opt-in: counters on the rules that capture (inbound to 15006, outbound to 15001
    /// and 15053), and a rule that counts ztunnel's own connections (its mark) as bypassed.
    pub counters: bool,
}

impl Default for AmbientConfig {
    /// Istio's defaults: DNS captured, IPv6 on, inbound captured, no virtual interface.
    fn default() -> Self {
        AmbientConfig {
            dns_capture: true,
            ipv6: true,
            bypass_inbound: false,
            virtual_interfaces: Vec::new(),
            probe_snat_v4: Ipv4Addr::new(169, 254, 7, 127),
            probe_snat_v6: Ipv6Addr::new(
                0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
            ),
            counters: false,
        }
    }
}

impl AmbientConfig {
    /// The in-pod rules, IPv4 then (with [`Self::ipv6`]) IPv6; an interface name that Linux
    /// would refuse is an error naming it.
    pub fn plan(&self) -> Result<Ruleset> {
        for i in &self.virtual_interfaces {
            check_interface("virtual_interfaces", i)?;
        }
        let mut chains = self.family(Family::V4);
        if self.ipv6 {
            chains.extend(self.family(Family::V6));
        }
        Ok(Ruleset {
            chains,
            sets: Vec::new(),
        })
    }

    fn family(&self, family: Family) -> Vec<crate::ruleset::Chain> {
        let mut b = Builder::counting(family, self.counters);
        self.jumps(&mut b);
        self.inbound(&mut b, family);
        self.outbound(&mut b, family);
        b.finish()
    }

    /// A: the built-in chains jump to ours (raw only when DNS is captured).
    fn jumps(&self, b: &mut Builder) {
        use Stage::*;
        b.append(Mangle, "PREROUTING", vec![], jump(PRERT));
        b.append(Mangle, "OUTPUT", vec![], jump(OUTPUT));
        b.append(Nat, "OUTPUT", vec![], jump(OUTPUT));
        if b.counts() {
            // Not in Istio's rules: ztunnel's packets pass the chain anyway (every later rule
            // accepts them or skips them); this RETURN first only counts them.
            let m = vec![ztunnel(false)];
            b.append_counted(CountedPath::Bypassed, (Nat, OUTPUT), m, Action::Return);
        }
        if self.dns_capture {
            b.append(Raw, "PREROUTING", vec![], jump(PRERT));
            b.append(Raw, "OUTPUT", vec![], jump(OUTPUT));
        }
        b.append(Nat, "PREROUTING", vec![], jump(PRERT));
    }

    /// B, C, D, E, F: what arrives, and the probe replies.
    fn inbound(&self, b: &mut Builder, family: Family) {
        use Stage::*;
        for vif in &self.virtual_interfaces {
            let on = || vec![iif(vif), tcp()];
            let rerouted = CountedPath::OutboundCaptured;
            b.append_counted(
                rerouted,
                (Nat, PRERT),
                on(),
                Action::Redirect(OUTBOUND_PORT),
            );
            b.append(Nat, PRERT, on(), Action::Return);
        }
        b.append(
            Mangle,
            PRERT,
            vec![ztunnel(false)],
            Action::SetCtMarkBits {
                value: REPLY_MARK,
                mask: MARK_MASK,
            },
        );
        let probe = self.probe(family);
        if !self.bypass_inbound {
            let from_probe = vec![Match::SAddr(AddrMatch::Eq(probe)), tcp()];
            b.append(Nat, PRERT, from_probe, Action::Accept);
        }
        let to_probe = vec![Match::DAddr(AddrMatch::Eq(probe)), tcp()];
        b.append(Nat, OUTPUT, to_probe, Action::Accept);
        if !self.bypass_inbound {
            let m = vec![
                not_loopback(family),
                tcp(),
                not_port(HBONE_PORT),
                ztunnel(true),
            ];
            let inbound = CountedPath::InboundCaptured;
            b.append_counted(inbound, (Nat, PRERT), m, Action::Redirect(INBOUND_PORT));
        }
    }

    /// G, H, I, J, K: replies, DNS, the pod's own loopback traffic, outbound.
    fn outbound(&self, b: &mut Builder, family: Family) {
        use Stage::*;
        let replies = Match::CtMarkBits {
            value: REPLY_MARK,
            mask: MARK_MASK,
        };
        b.append(Mangle, OUTPUT, vec![replies], Action::RestoreMark);
        if self.dns_capture {
            let not_lo = Match::Oif {
                name: "lo".into(),
                negate: true,
            };
            let udp_dns = vec![not_lo, udp(), ztunnel(true), dport(53)];
            let dns = CountedPath::OutboundCaptured;
            b.append_counted(dns, (Nat, OUTPUT), udp_dns, Action::Redirect(DNS_PORT));
            let tcp_dns = vec![not_loopback(family), tcp(), dport(53), ztunnel(true)];
            b.append_counted(dns, (Nat, OUTPUT), tcp_dns, Action::Redirect(DNS_PORT));
            let to_upstream = vec![udp(), ztunnel(false), dport(53)];
            b.append(Raw, OUTPUT, to_upstream, Action::CtZone(DNS_ZONE));
            let from_upstream = vec![udp(), ztunnel(true), Match::SPort(PortMatch::Eq(53))];
            b.append(Raw, PRERT, from_upstream, Action::CtZone(DNS_ZONE));
        }
        let marked_reply = Match::MarkBits {
            value: REPLY_MARK,
            mask: MARK_MASK,
            negate: false,
        };
        b.append(Nat, OUTPUT, vec![tcp(), marked_reply], Action::Accept);
        let own = vec![not_loopback(family), iif_out_lo()];
        b.append(Nat, OUTPUT, own, Action::Accept);
        let out = vec![not_loopback(family), tcp(), ztunnel(true)];
        let outbound = CountedPath::OutboundCaptured;
        b.append_counted(
            outbound,
            (Nat, OUTPUT),
            out,
            Action::Redirect(OUTBOUND_PORT),
        );
    }

    fn probe(&self, family: Family) -> IpNet {
        let a = match family {
            Family::V4 => IpAddr::V4(self.probe_snat_v4),
            Family::V6 => IpAddr::V6(self.probe_snat_v6),
        };
        IpNet::from(a)
    }
}

/// Istio's chain names in each stage.
const PRERT: &str = "ISTIO_PRERT";

/// Whether a chain of our table, by its name, is one only the ambient in-pod rules have
/// (`ISTIO_PRERT`, which sidecar capture never makes): the table is the node agent's.
pub fn is_ambient_chain(name: &str) -> bool {
    name.ends_with(&format!("_{}", PRERT.to_ascii_lowercase()))
}
const OUTPUT: &str = "ISTIO_OUTPUT";

/// ztunnel's own packets (`negate`: not ztunnel's).
fn ztunnel(negate: bool) -> Match {
    Match::MarkBits {
        value: ZTUNNEL_MARK,
        mask: MARK_MASK,
        negate,
    }
}

fn not_loopback(family: Family) -> Match {
    let lo = match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        Family::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    Match::DAddr(AddrMatch::Ne(IpNet::from(lo)))
}

fn not_port(p: u16) -> Match {
    Match::DPort(PortMatch::Ne(p))
}

fn iif(name: &str) -> Match {
    Match::Iif {
        name: name.into(),
        negate: false,
    }
}

fn iif_out_lo() -> Match {
    Match::Oif {
        name: "lo".into(),
        negate: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::{evaluate, Flow, Verdict};

    fn verdict(cfg: &AmbientConfig, flow: &str) -> Verdict {
        let rs = cfg.plan().unwrap();
        let e = evaluate(&rs, &flow.parse::<Flow>().unwrap());
        e.verdict
    }

    fn to(port: u16, addr: &str) -> Verdict {
        Verdict::Redirect {
            port,
            to: addr.parse().unwrap(),
        }
    }

    /// Where Istio's in-pod rules send each flow (default: DNS on, IPv6 on).
    #[test]
    fn default_verdicts() {
        let cfg = AmbientConfig::default();
        let cases = [
            // The app's outbound TCP, DNS over UDP and TCP.
            ("out tcp uid=1000 10.1.2.3:80", to(15001, "127.0.0.1:15001")),
            (
                "out udp uid=1000 10.96.0.10:53",
                to(15053, "127.0.0.1:15053"),
            ),
            (
                "out tcp uid=1000 10.96.0.10:53",
                to(15053, "127.0.0.1:15053"),
            ),
            ("out udp uid=1000 10.96.0.10:5353", Verdict::Pass),
            // ztunnel's own sockets (mark 0x539, other bits ignored).
            ("out tcp mark=0x539 10.1.2.3:80", Verdict::Pass),
            ("out tcp mark=0x1539 10.1.2.3:80", Verdict::Pass),
            ("out udp mark=0x539 10.96.0.10:53", Verdict::Pass),
            // The app to itself: loopback, and its own address over lo.
            ("out tcp uid=1000 127.0.0.1:8080", Verdict::Pass),
            ("out tcp uid=1000 10.77.0.2:8080 oif=lo", Verdict::Pass),
            // Replies of connections ztunnel delivered (mark restored from the connection).
            ("out tcp uid=1000 10.1.2.3:80 mark=0x111", Verdict::Pass),
            // Inbound: to 15006 but HBONE, the probe source, ztunnel's own.
            (
                "in tcp 10.77.0.2:8080 src=10.0.0.9",
                to(15006, "10.77.0.2:15006"),
            ),
            ("in tcp 10.77.0.2:15008 src=10.0.0.9", Verdict::Pass),
            ("in tcp 10.77.0.2:8080 src=169.254.7.127", Verdict::Pass),
            (
                "in tcp 10.77.0.2:8080 src=10.0.0.9 mark=0x539",
                Verdict::Pass,
            ),
            ("in udp 10.77.0.2:8080 src=10.0.0.9", Verdict::Pass),
            // Replies to the probe address go out as they are.
            ("out tcp uid=1000 169.254.7.127:40000", Verdict::Pass),
            // IPv6 alike.
            ("out tcp uid=1000 [fd00::1]:80", to(15001, "[::1]:15001")),
            (
                "in tcp [fd00::2]:8080 src=fd00::9",
                to(15006, "[fd00::2]:15006"),
            ),
            (
                "in tcp [fd00::2]:8080 src=fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
                Verdict::Pass,
            ),
            ("out udp uid=1000 [fd00::10]:53", to(15053, "[::1]:15053")),
        ];
        for (flow, want) in cases {
            assert_eq!(verdict(&cfg, flow), want, "{flow}");
        }
    }

    #[test]
    fn switches_change_what_they_name_only() {
        let no_dns = AmbientConfig {
            dns_capture: false,
            ..AmbientConfig::default()
        };
        assert_eq!(
            verdict(&no_dns, "out udp uid=1000 10.96.0.10:53"),
            Verdict::Pass
        );
        assert_eq!(
            verdict(&no_dns, "out tcp uid=1000 10.96.0.10:53"),
            to(15001, "127.0.0.1:15001"),
            "TCP DNS is ordinary outbound traffic then"
        );
        let rs = no_dns.plan().unwrap();
        assert!(
            rs.chains.iter().all(|c| c.stage != Stage::Raw),
            "no raw chains without DNS capture"
        );

        let bypass = AmbientConfig {
            bypass_inbound: true,
            ..AmbientConfig::default()
        };
        assert_eq!(
            verdict(&bypass, "in tcp 10.77.0.2:8080 src=10.0.0.9"),
            Verdict::Pass
        );
        assert_eq!(
            verdict(&bypass, "out tcp uid=1000 10.1.2.3:80"),
            to(15001, "127.0.0.1:15001")
        );

        let vifs = AmbientConfig {
            virtual_interfaces: vec!["tap0".into()],
            ..AmbientConfig::default()
        };
        assert_eq!(
            verdict(&vifs, "in tcp 10.1.2.3:80 src=10.0.0.9 iif=tap0"),
            to(15001, "10.1.2.3:15001")
        );
        assert_eq!(
            verdict(&vifs, "in tcp 10.77.0.2:8080 src=10.0.0.9 iif=eth0"),
            to(15006, "10.77.0.2:15006")
        );

        let v4_only = AmbientConfig {
            ipv6: false,
            ..AmbientConfig::default()
        };
        assert_eq!(
            verdict(&v4_only, "out tcp uid=1000 [fd00::1]:80"),
            Verdict::Pass
        );
        assert_eq!(v4_only.plan().unwrap().families(), [Family::V4]);
    }

    #[test]
    fn a_bad_interface_name_is_an_error_naming_it() {
        let cfg = AmbientConfig {
            virtual_interfaces: vec!["a/b".into()],
            ..AmbientConfig::default()
        };
        let err = cfg.plan().unwrap_err().to_string();
        assert!(
            err.contains("virtual_interfaces") && err.contains("a/b"),
            "{err}"
        );
    }

    /// The renderings say what Istio's rules say, in each syntax.
    #[test]
    fn renderings_of_the_masked_marks() {
        let rs = AmbientConfig::default().plan().unwrap();
        let ipt = crate::render::iptables_restore(&rs, Family::V4);
        for line in [
            "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
            "-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark",
            "-j CT --zone 1",
        ] {
            assert!(ipt.contains(line), "{line} in\n{ipt}");
        }
        let nft = crate::render::nft_script(&rs);
        for text in [
            "meta mark & 0xfff == 0x539 ct mark set ct mark & 0xfffff000 | 0x111",
            "ct mark & 0xfff == 0x111 meta mark set ct mark",
            "meta mark & 0xfff != 0x539",
        ] {
            assert!(nft.contains(text), "{text} in\n{nft}");
        }
    }
}
