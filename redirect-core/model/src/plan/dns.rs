//! DNS capture (Istio's step 12): DNS to the chosen servers (or all DNS) goes to the agent on
//! 15053, and conntrack zones keep the proxy's own DNS flows apart from the application's. A
//! step of its own because it is the only one that writes both the nat and the raw stage.

use std::net::IpAddr;

use ipnet::IpNet;

use super::builder::{dport, jump, tcp, udp};
use super::{FamilyPlanner, ISTIO_INBOUND, ISTIO_OUTPUT, ISTIO_OUTPUT_DNS, OUTPUT, PREROUTING};
use crate::config::{DnsCapture, DNS_AGENT_PORT};
use crate::ruleset::{Action, AddrMatch, CountedPath, Family, Match, PortMatch, Stage};
use Stage::{Nat, Raw};

/// 12. DNS capture (only called when it is in effect).
pub(super) fn dns_capture(p: &mut FamilyPlanner<'_>) {
    let servers = dns_servers(p);
    dns_redirects(p, &servers);
    dns_zones(p, &servers);
}

/// The DNS destinations captured in this family: `[None]` for all DNS, else each server.
fn dns_servers(p: &FamilyPlanner<'_>) -> Vec<Option<IpNet>> {
    match (&p.cfg.dns, p.family) {
        (DnsCapture::All, _) => vec![None],
        (DnsCapture::Servers { v4, .. }, Family::V4) => v4
            .iter()
            .map(|a| Some(IpNet::from(IpAddr::V4(*a))))
            .collect(),
        (DnsCapture::Servers { v6, .. }, Family::V6) => v6
            .iter()
            .map(|a| Some(IpNet::from(IpAddr::V6(*a))))
            .collect(),
        (DnsCapture::Off, _) => Vec::new(),
    }
}

/// In nat: TCP and UDP DNS to each captured destination is redirected to the agent.
fn dns_redirects(p: &mut FamilyPlanner<'_>, servers: &[Option<IpNet>]) {
    if !servers.is_empty() {
        p.b.append(Nat, ISTIO_OUTPUT, vec![], jump(ISTIO_OUTPUT_DNS));
    }
    for proto in [tcp(), udp()] {
        for s in servers {
            let mut m = vec![proto.clone(), dport(53)];
            m.extend(s.map(|s| Match::DAddr(AddrMatch::Eq(s))));
            p.b.append_counted(
                CountedPath::OutboundCaptured,
                (Nat, ISTIO_OUTPUT_DNS),
                m,
                Action::Redirect(DNS_AGENT_PORT),
            );
        }
    }
}

/// In raw: conntrack zones keep proxy↔resolver (1) and app↔agent (2) UDP flows apart.
fn dns_zones(p: &mut FamilyPlanner<'_>, servers: &[Option<IpNet>]) {
    p.b.append(Raw, OUTPUT, vec![], jump(ISTIO_OUTPUT_DNS));
    for owner in p.proxy_owners() {
        p.b.append(
            Raw,
            ISTIO_OUTPUT_DNS,
            vec![udp(), dport(53), owner.clone()],
            Action::CtZone(1),
        );
        p.b.append(
            Raw,
            ISTIO_OUTPUT_DNS,
            vec![udp(), Match::SPort(PortMatch::Eq(DNS_AGENT_PORT)), owner],
            Action::CtZone(2),
        );
    }
    if !servers.is_empty() {
        p.b.append(Raw, PREROUTING, vec![], jump(ISTIO_INBOUND));
    }
    for s in servers {
        let mut to = vec![udp(), dport(53)];
        to.extend(s.map(|s| Match::DAddr(AddrMatch::Eq(s))));
        p.b.append(Raw, ISTIO_OUTPUT_DNS, to, Action::CtZone(2));
        let mut from = vec![udp(), Match::SPort(PortMatch::Eq(53))];
        from.extend(s.map(|s| Match::SAddr(AddrMatch::Eq(s))));
        p.b.append(Raw, ISTIO_INBOUND, from, Action::CtZone(1));
    }
}
