//! Outbound capture (Istio's steps 6-11 and 13-16): what leaves `ISTIO_OUTPUT` untouched (our
//! bypass IDs, excluded ports, Envoy's passthrough, the proxy's own traffic, owner groups,
//! loopback and excluded destinations) and what is redirected to the proxy (included ports and
//! CIDRs, also from reroute interfaces). The RETURNs come before the redirects on purpose.

use super::builder::{gid, iif, jump, lo, tcp, udp, uid, SetRegistry};
use super::sets;
use super::{FamilyPlanner, ISTIO_IN_REDIRECT, ISTIO_OUTPUT, ISTIO_REDIRECT, OUTPUT, PREROUTING};
use crate::config::Selection;
use crate::ruleset::{Action, AddrMatch, CountedPath, Match, PortMatch, Stage};
use Stage::Nat;

impl FamilyPlanner<'_> {
    /// 6. Outbound entry, then our bypass IDs (init containers): never captured, DNS included.
    pub(super) fn outbound_entry(&mut self) {
        let cfg = self.cfg;
        self.b.append(Nat, OUTPUT, vec![], jump(ISTIO_OUTPUT));
        let bypassed = CountedPath::Bypassed;
        for u in &cfg.bypass_uids {
            let m = vec![uid(*u, false)];
            self.b
                .append_counted(bypassed, (Nat, ISTIO_OUTPUT), m, Action::Return);
        }
        for g in &cfg.bypass_gids {
            let m = vec![gid(*g, false)];
            self.b
                .append_counted(bypassed, (Nat, ISTIO_OUTPUT), m, Action::Return);
        }
    }

    /// 7. Outbound port excludes, TCP and UDP.
    pub(super) fn outbound_exclude_ports(&mut self, sets: &mut SetRegistry) {
        let cfg = self.cfg;
        if cfg.outbound_exclude_ports.is_empty() {
            return;
        }
        let m = self.port_match(
            sets,
            sets::OUTBOUND_EXCLUDE_PORTS,
            &cfg.outbound_exclude_ports,
        );
        let excluded = CountedPath::Excluded;
        self.b.append_counted(
            excluded,
            (Nat, ISTIO_OUTPUT),
            vec![tcp(), Match::DPort(m.clone())],
            Action::Return,
        );
        self.b.append_counted(
            excluded,
            (Nat, ISTIO_OUTPUT),
            vec![udp(), Match::DPort(m)],
            Action::Return,
        );
    }

    /// 8. Envoy's inbound passthrough (source 127.0.0.6 / ::6) is never captured again.
    pub(super) fn inbound_passthrough(&mut self) {
        let src6 = self.src6();
        self.b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![lo(), Match::SAddr(AddrMatch::Eq(src6))],
            Action::Return,
        );
    }

    /// 9-10. The proxy's own traffic. Istio drops the "app on loopback" RETURN when an
    /// include CIDR (of either family) is a loopback address.
    pub(super) fn proxy_traffic(&mut self) {
        let cfg = self.cfg;
        let app_lo_return = !cfg.include_cidrs().iter().any(|c| c.addr().is_loopback());
        let dns = self.dns();
        for &u in &cfg.proxy_uids {
            self.proxy_owner(|negate| uid(u, negate), dns, app_lo_return);
        }
        for &g in &cfg.proxy_gids {
            // Istio's GID redirect rule never carries the DNS port exception.
            self.proxy_owner(|negate| gid(g, negate), false, app_lo_return);
        }
    }

    /// One proxy UID's or GID's rules: its loopback traffic to another address goes back in to
    /// the proxy (Envoy calling the app through its pod IP), other owners' loopback traffic
    /// returns, and everything else of the owner returns.
    fn proxy_owner(
        &mut self,
        owner: impl Fn(bool) -> Match,
        dns_exception: bool,
        app_lo_return: bool,
    ) {
        let tunnel = self.cfg.inbound_tunnel_port;
        let dport_guard = if dns_exception {
            Match::DPort(PortMatch::NotIn(vec![53, tunnel]))
        } else {
            Match::DPort(PortMatch::Ne(tunnel))
        };
        self.b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![lo(), self.not_lo(), tcp(), dport_guard, owner(false)],
            jump(ISTIO_IN_REDIRECT),
        );
        if app_lo_return {
            let m = if self.dns() {
                vec![lo(), tcp(), Match::DPort(PortMatch::Ne(53)), owner(true)]
            } else {
                vec![lo(), owner(true)]
            };
            self.b.append(Nat, ISTIO_OUTPUT, m, Action::Return);
        }
        self.b.append_counted(
            CountedPath::Bypassed,
            (Nat, ISTIO_OUTPUT),
            vec![owner(false)],
            Action::Return,
        );
    }

    /// 11. Owner groups.
    pub(super) fn owner_groups(&mut self) {
        match self.owner_include {
            Some(include) => {
                let m = include.iter().map(|&g| gid(g, true)).collect();
                let excluded = CountedPath::Excluded;
                self.b
                    .append_counted(excluded, (Nat, ISTIO_OUTPUT), m, Action::Return);
            }
            None => {
                for &g in self.owner_exclude {
                    let m = vec![gid(g, false)];
                    let excluded = CountedPath::Excluded;
                    self.b
                        .append_counted(excluded, (Nat, ISTIO_OUTPUT), m, Action::Return);
                }
            }
        }
    }

    /// 13. Loopback destinations are never captured.
    pub(super) fn loopback_destinations(&mut self) {
        let lo_net = self.lo_net();
        self.b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![Match::DAddr(AddrMatch::Eq(lo_net))],
            Action::Return,
        );
    }

    /// 14. Excluded CIDRs.
    pub(super) fn exclude_cidrs(&mut self, sets: &mut SetRegistry) {
        let exclude = self.of_family(&self.cfg.outbound_exclude_cidrs);
        if !exclude.is_empty() {
            let m = self.cidr_match(sets, sets::EXCLUDE_CIDRS, &exclude);
            self.b.append_counted(
                CountedPath::Excluded,
                (Nat, ISTIO_OUTPUT),
                vec![Match::DAddr(m)],
                Action::Return,
            );
        }
    }

    /// 15. Included outbound ports, whatever the destination.
    pub(super) fn include_ports(&mut self, sets: &mut SetRegistry) {
        let cfg = self.cfg;
        if !cfg.outbound_include_ports.is_empty() {
            let m = self.port_match(
                sets,
                sets::OUTBOUND_INCLUDE_PORTS,
                &cfg.outbound_include_ports,
            );
            self.b.append(
                Nat,
                ISTIO_OUTPUT,
                vec![tcp(), Match::DPort(m)],
                jump(ISTIO_REDIRECT),
            );
        }
    }

    /// 16. Included CIDRs, and the same destinations from reroute interfaces.
    pub(super) fn include_cidrs(&mut self, sets: &mut SetRegistry) {
        let cfg = self.cfg;
        match &cfg.outbound_include_cidrs {
            Selection::All => {
                self.b
                    .append(Nat, ISTIO_OUTPUT, vec![], jump(ISTIO_REDIRECT));
                for i in &cfg.reroute_interfaces {
                    self.b
                        .insert(Nat, PREROUTING, 1, vec![iif(i)], jump(ISTIO_REDIRECT));
                }
            }
            Selection::List(list) => {
                let include = self.of_family(list);
                if include.is_empty() {
                    return;
                }
                let m = Match::DAddr(self.cidr_match(sets, sets::INCLUDE_CIDRS, &include));
                for i in &cfg.reroute_interfaces {
                    self.b.insert(
                        Nat,
                        PREROUTING,
                        1,
                        vec![iif(i), m.clone()],
                        jump(ISTIO_REDIRECT),
                    );
                }
                self.b
                    .append(Nat, ISTIO_OUTPUT, vec![m], jump(ISTIO_REDIRECT));
            }
        }
    }
}
