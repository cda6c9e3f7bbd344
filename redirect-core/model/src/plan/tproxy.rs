//! TPROXY's marks (Istio's step 17), in the mangle stage: keep the mark across a connection,
//! let Envoy reach the application through the pod IP (the outbound mark), and keep marked,
//! passthrough and loopback traffic out of inbound capture. Only in TPROXY mode.

use super::builder::{iif, lo, tcp};
use super::{FamilyPlanner, ISTIO_INBOUND, OUTPUT, PREROUTING};
use crate::config::OUTBOUND_MARK;
use crate::ruleset::{Action, AddrMatch, Match, Stage};
use Stage::Mangle;

/// 17. TPROXY: keep marks across the connection and let Envoy reach the app via the pod IP.
pub(super) fn tproxy_marks(p: &mut FamilyPlanner<'_>) {
    let mark = p.cfg.tproxy_mark;
    let marked = || Match::Mark {
        value: mark,
        negate: false,
    };
    let not_lo = p.not_lo();
    let owners = p.proxy_owners();
    let b = &mut p.b;
    b.append(Mangle, PREROUTING, vec![tcp(), marked()], Action::SaveMark);
    b.append(Mangle, OUTPUT, vec![tcp(), lo(), marked()], Action::Return);
    for owner in owners {
        b.append(
            Mangle,
            OUTPUT,
            vec![not_lo.clone(), tcp(), lo(), owner],
            Action::SetMark(OUTBOUND_MARK),
        );
    }
    b.append(
        Mangle,
        OUTPUT,
        vec![tcp(), Match::CtMark { value: mark }],
        Action::RestoreMark,
    );
    tproxy_inbound_returns(p, marked());
}

/// Inserted at the top of mangle's `ISTIO_INBOUND`: marked packets, Envoy's passthrough
/// from `SRC6` on `lo`, and loopback packets without the outbound mark are not captured.
fn tproxy_inbound_returns(p: &mut FamilyPlanner<'_>, marked: Match) {
    let src6 = p.src6();
    let b = &mut p.b;
    b.insert(
        Mangle,
        ISTIO_INBOUND,
        1,
        vec![tcp(), marked],
        Action::Return,
    );
    b.insert(
        Mangle,
        ISTIO_INBOUND,
        2,
        vec![tcp(), Match::SAddr(AddrMatch::Eq(src6)), iif("lo")],
        Action::Return,
    );
    b.insert(
        Mangle,
        ISTIO_INBOUND,
        3,
        vec![
            tcp(),
            iif("lo"),
            Match::Mark {
                value: OUTBOUND_MARK,
                negate: true,
            },
        ],
        Action::Return,
    );
}
