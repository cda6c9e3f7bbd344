//! Inbound capture (Istio's step 5): which inbound TCP reaches the proxy's inbound port, by
//! REDIRECT in the nat stage or by TPROXY in the mangle stage.

use super::builder::{jump, tcp, SetRegistry};
use super::sets;
use super::{
    FamilyPlanner, ISTIO_DIVERT, ISTIO_INBOUND, ISTIO_IN_REDIRECT, ISTIO_TPROXY, PREROUTING,
};
use crate::config::Selection;
use crate::ruleset::{Action, CountedPath, CtStates, Match, Stage};

/// 5. Inbound capture.
pub(super) fn inbound_capture(p: &mut FamilyPlanner<'_>, sets: &mut SetRegistry) {
    if p.cfg.inbound_ports.is_none() {
        return;
    }
    let tproxy = p.tproxy();
    let stage = if tproxy { Stage::Mangle } else { Stage::Nat };
    if tproxy {
        tproxy_chains(p);
    }
    p.b.append(stage, PREROUTING, vec![tcp()], jump(ISTIO_INBOUND));
    let ports = inbound_ports(p, stage, sets);
    inbound_to_proxy(p, stage, ports);
}

/// TPROXY's two chains: `ISTIO_DIVERT` marks and accepts the packets of a connection the
/// proxy already holds, `ISTIO_TPROXY` hands a new connection to the proxy's port.
fn tproxy_chains(p: &mut FamilyPlanner<'_>) {
    let cfg = p.cfg;
    let not_lo = p.not_lo();
    let b = &mut p.b;
    b.append(
        Stage::Mangle,
        ISTIO_DIVERT,
        vec![],
        Action::SetMark(cfg.tproxy_mark),
    );
    b.append(Stage::Mangle, ISTIO_DIVERT, vec![], Action::Accept);
    b.append_counted(
        CountedPath::InboundCaptured,
        (Stage::Mangle, ISTIO_TPROXY),
        vec![not_lo, tcp()],
        Action::Tproxy {
            port: cfg.inbound_capture_port,
            mark: cfg.tproxy_mark,
        },
    );
}

/// The port match of the capture rules: `None` for all ports (the excluded ones RETURN
/// first), or the listed ports.
fn inbound_ports(p: &mut FamilyPlanner<'_>, stage: Stage, sets: &mut SetRegistry) -> Option<Match> {
    let cfg = p.cfg;
    match &cfg.inbound_ports {
        Selection::All => {
            if !cfg.inbound_exclude_ports.is_empty() {
                let m = p.port_match(
                    sets,
                    sets::INBOUND_EXCLUDE_PORTS,
                    &cfg.inbound_exclude_ports,
                );
                p.b.append_counted(
                    CountedPath::Excluded,
                    (stage, ISTIO_INBOUND),
                    vec![tcp(), Match::DPort(m)],
                    Action::Return,
                );
            }
            None
        }
        Selection::List(ports) => {
            Some(Match::DPort(p.port_match(sets, sets::INBOUND_PORTS, ports)))
        }
    }
}

/// The capture rules themselves: TPROXY diverts established connections and tproxies new
/// ones; REDIRECT sends them to the inbound redirect chain.
fn inbound_to_proxy(p: &mut FamilyPlanner<'_>, stage: Stage, ports: Option<Match>) {
    let with = |extra: Option<Match>| -> Vec<Match> {
        std::iter::once(tcp())
            .chain(ports.clone())
            .chain(extra)
            .collect()
    };
    if p.tproxy() {
        let established = Match::CtState(CtStates::RelatedEstablished);
        p.b.append(
            stage,
            ISTIO_INBOUND,
            with(Some(established)),
            jump(ISTIO_DIVERT),
        );
        p.b.append(stage, ISTIO_INBOUND, with(None), jump(ISTIO_TPROXY));
    } else {
        p.b.append(stage, ISTIO_INBOUND, with(None), jump(ISTIO_IN_REDIRECT));
    }
}
