//! The steps every plan starts with (Istio's steps 1-4): interfaces left alone or rerouted,
//! the invalid-packet drop, and the rules that exist whatever the config. They come first
//! because later steps append after them and insert before them.

use super::builder::{dport, iif, jump, oif, tcp};
use super::{
    FamilyPlanner, ISTIO_DROP, ISTIO_INBOUND, ISTIO_IN_REDIRECT, ISTIO_REDIRECT, OUTPUT, PREROUTING,
};
use crate::ruleset::{Action, CountedPath, CtStates, Match, Stage};
use Stage::{Mangle, Nat};

/// 1. Excluded interfaces: nothing is captured on them.
pub(super) fn excluded_interfaces(p: &mut FamilyPlanner<'_>) {
    let tproxy = p.tproxy();
    for i in &p.cfg.exclude_interfaces {
        let b = &mut p.b;
        let excluded = CountedPath::Excluded;
        b.append_counted(excluded, (Nat, PREROUTING), vec![iif(i)], Action::Return);
        b.append_counted(excluded, (Nat, OUTPUT), vec![oif(i)], Action::Return);
        if tproxy {
            b.append(Mangle, PREROUTING, vec![iif(i)], Action::Return);
            b.append(Mangle, OUTPUT, vec![oif(i)], Action::Return);
        }
    }
}

/// 2. Reroute (KubeVirt) interfaces: other traffic from them is not inbound capture.
pub(super) fn reroute_interfaces(p: &mut FamilyPlanner<'_>) {
    for i in &p.cfg.reroute_interfaces {
        p.b.insert(Nat, PREROUTING, 1, vec![iif(i)], Action::Return);
    }
}

/// 3. Drop conntrack-invalid packets.
pub(super) fn drop_invalid(p: &mut FamilyPlanner<'_>) {
    if p.cfg.drop_invalid {
        p.b.append(
            Mangle,
            PREROUTING,
            vec![Match::CtState(CtStates::Invalid)],
            jump(ISTIO_DROP),
        );
        p.b.append(Mangle, ISTIO_DROP, vec![], Action::Drop);
    }
}

/// 4. Always present: tunnel port RETURN and the two redirect chains.
pub(super) fn fixed_rules(p: &mut FamilyPlanner<'_>) {
    let cfg = p.cfg;
    let b = &mut p.b;
    b.append(
        Nat,
        ISTIO_INBOUND,
        vec![tcp(), dport(cfg.inbound_tunnel_port)],
        Action::Return,
    );
    b.append_counted(
        CountedPath::OutboundCaptured,
        (Nat, ISTIO_REDIRECT),
        vec![tcp()],
        Action::Redirect(cfg.envoy_port),
    );
    b.append_counted(
        CountedPath::InboundCaptured,
        (Nat, ISTIO_IN_REDIRECT),
        vec![tcp()],
        Action::Redirect(cfg.inbound_capture_port),
    );
}
