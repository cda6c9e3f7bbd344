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

/// 6. Outbound entry, then our bypass IDs (init containers): never captured, DNS included.
pub(super) fn outbound_entry(p: &mut FamilyPlanner<'_>) {
    let cfg = p.cfg;
    p.b.append(Nat, OUTPUT, vec![], jump(ISTIO_OUTPUT));
    let bypassed = CountedPath::Bypassed;
    for u in &cfg.bypass_uids {
        let m = vec![uid(*u, false)];
        p.b.append_counted(bypassed, (Nat, ISTIO_OUTPUT), m, Action::Return);
    }
    for g in &cfg.bypass_gids {
        let m = vec![gid(*g, false)];
        p.b.append_counted(bypassed, (Nat, ISTIO_OUTPUT), m, Action::Return);
    }
}

/// 7. Outbound port excludes, TCP and UDP.
pub(super) fn outbound_exclude_ports(p: &mut FamilyPlanner<'_>, sets: &mut SetRegistry) {
    let cfg = p.cfg;
    if cfg.outbound_exclude_ports.is_empty() {
        return;
    }
    let m = p.port_match(
        sets,
        sets::OUTBOUND_EXCLUDE_PORTS,
        &cfg.outbound_exclude_ports,
    );
    let excluded = CountedPath::Excluded;
    p.b.append_counted(
        excluded,
        (Nat, ISTIO_OUTPUT),
        vec![tcp(), Match::DPort(m.clone())],
        Action::Return,
    );
    p.b.append_counted(
        excluded,
        (Nat, ISTIO_OUTPUT),
        vec![udp(), Match::DPort(m)],
        Action::Return,
    );
}

/// 8. Envoy's inbound passthrough (source 127.0.0.6 / ::6) is never captured again.
pub(super) fn inbound_passthrough(p: &mut FamilyPlanner<'_>) {
    let src6 = p.src6();
    p.b.append(
        Nat,
        ISTIO_OUTPUT,
        vec![lo(), Match::SAddr(AddrMatch::Eq(src6))],
        Action::Return,
    );
}

/// 9-10. The proxy's own traffic. Istio drops the "app on loopback" RETURN when an
/// include CIDR (of either family) is a loopback address.
pub(super) fn proxy_traffic(p: &mut FamilyPlanner<'_>) {
    let cfg = p.cfg;
    let app_lo_return = !cfg.include_cidrs().iter().any(|c| c.addr().is_loopback());
    let dns = p.dns();
    for &u in &cfg.proxy_uids {
        proxy_owner(p, |negate| uid(u, negate), dns, app_lo_return);
    }
    for &g in &cfg.proxy_gids {
        // Istio's GID redirect rule never carries the DNS port exception.
        proxy_owner(p, |negate| gid(g, negate), false, app_lo_return);
    }
}

/// One proxy UID's or GID's rules: its loopback traffic to another address goes back in to
/// the proxy (Envoy calling the app through its pod IP), other owners' loopback traffic
/// returns, and everything else of the owner returns.
fn proxy_owner(
    p: &mut FamilyPlanner<'_>,
    owner: impl Fn(bool) -> Match,
    dns_exception: bool,
    app_lo_return: bool,
) {
    let tunnel = p.cfg.inbound_tunnel_port;
    let dport_guard = if dns_exception {
        Match::DPort(PortMatch::NotIn(vec![53, tunnel]))
    } else {
        Match::DPort(PortMatch::Ne(tunnel))
    };
    p.b.append(
        Nat,
        ISTIO_OUTPUT,
        vec![lo(), p.not_lo(), tcp(), dport_guard, owner(false)],
        jump(ISTIO_IN_REDIRECT),
    );
    if app_lo_return {
        let m = if p.dns() {
            vec![lo(), tcp(), Match::DPort(PortMatch::Ne(53)), owner(true)]
        } else {
            vec![lo(), owner(true)]
        };
        p.b.append(Nat, ISTIO_OUTPUT, m, Action::Return);
    }
    p.b.append_counted(
        CountedPath::Bypassed,
        (Nat, ISTIO_OUTPUT),
        vec![owner(false)],
        Action::Return,
    );
}

/// 11. Owner groups.
pub(super) fn owner_groups(p: &mut FamilyPlanner<'_>) {
    match p.owner_include {
        Some(include) => {
            let m = include.iter().map(|&g| gid(g, true)).collect();
            let excluded = CountedPath::Excluded;
            p.b.append_counted(excluded, (Nat, ISTIO_OUTPUT), m, Action::Return);
        }
        None => {
            for &g in p.owner_exclude {
                let m = vec![gid(g, false)];
                let excluded = CountedPath::Excluded;
                p.b.append_counted(excluded, (Nat, ISTIO_OUTPUT), m, Action::Return);
            }
        }
    }
}

/// 13. Loopback destinations are never captured.
pub(super) fn loopback_destinations(p: &mut FamilyPlanner<'_>) {
    let lo_net = p.lo_net();
    p.b.append(
        Nat,
        ISTIO_OUTPUT,
        vec![Match::DAddr(AddrMatch::Eq(lo_net))],
        Action::Return,
    );
}

/// 14. Excluded CIDRs.
pub(super) fn exclude_cidrs(p: &mut FamilyPlanner<'_>, sets: &mut SetRegistry) {
    let exclude = p.of_family(&p.cfg.outbound_exclude_cidrs);
    if !exclude.is_empty() {
        let m = p.cidr_match(sets, sets::EXCLUDE_CIDRS, &exclude);
        p.b.append_counted(
            CountedPath::Excluded,
            (Nat, ISTIO_OUTPUT),
            vec![Match::DAddr(m)],
            Action::Return,
        );
    }
}

/// 15. Included outbound ports, whatever the destination.
pub(super) fn include_ports(p: &mut FamilyPlanner<'_>, sets: &mut SetRegistry) {
    let cfg = p.cfg;
    if !cfg.outbound_include_ports.is_empty() {
        let m = p.port_match(
            sets,
            sets::OUTBOUND_INCLUDE_PORTS,
            &cfg.outbound_include_ports,
        );
        p.b.append(
            Nat,
            ISTIO_OUTPUT,
            vec![tcp(), Match::DPort(m)],
            jump(ISTIO_REDIRECT),
        );
    }
}

/// 16. Included CIDRs, and the same destinations from reroute interfaces.
pub(super) fn include_cidrs(p: &mut FamilyPlanner<'_>, sets: &mut SetRegistry) {
    let cfg = p.cfg;
    match &cfg.outbound_include_cidrs {
        Selection::All => {
            p.b.append(Nat, ISTIO_OUTPUT, vec![], jump(ISTIO_REDIRECT));
            for i in &cfg.reroute_interfaces {
                p.b.insert(Nat, PREROUTING, 1, vec![iif(i)], jump(ISTIO_REDIRECT));
            }
        }
        Selection::List(list) => {
            let include = p.of_family(list);
            if include.is_empty() {
                return;
            }
            let m = Match::DAddr(p.cidr_match(sets, sets::INCLUDE_CIDRS, &include));
            for i in &cfg.reroute_interfaces {
                p.b.insert(
                    Nat,
                    PREROUTING,
                    1,
                    vec![iif(i), m.clone()],
                    jump(ISTIO_REDIRECT),
                );
            }
            p.b.append(Nat, ISTIO_OUTPUT, vec![m], jump(ISTIO_REDIRECT));
        }
    }
}
