//! How a namespace's capture differs from what a config wants: our table against the plan, the
//! TPROXY policy routing and `::6` on `lo`. CNI CHECK, `inspect`, redirect-init's "already in
//! place" test and the repair controller's read-back all ask this one question, so they agree
//! on what "in place" means.

use std::fmt;

use redirect_model::{Capture, Family, Routes, Ruleset};

use crate::backend::Backend;
use crate::error::Result;
use crate::nft::{self, Difference, TableState};
use crate::routes::{TproxyRouting, TproxyState};

/// One way the namespace differs from the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Our table against the plan.
    Rules(Difference),
    /// The policy routing (the fwmark `ip rule` or the local route: a sidecar's TPROXY,
    /// ambient's replies) incomplete.
    TproxyRouting(Family),
    /// `::6/128` is not on `lo`: IPv6 inbound capture has nowhere to send the probe.
    LoV6Missing,
    /// Our table is there, but the pod should have no capture at all.
    Unwanted,
    /// Capture rules another layer wrote (Istio's) are in the namespace too, in words: both
    /// act on every packet.
    Foreign(String),
}

impl Mismatch {
    /// Whether the difference is in our table (as opposed to the routes beside it, which a
    /// run re-adds without touching the rules).
    pub fn is_rules(&self) -> bool {
        matches!(
            self,
            Mismatch::Rules(_) | Mismatch::Unwanted | Mismatch::Foreign(_)
        )
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Rules(d) => d.fmt(f),
            Mismatch::TproxyRouting(family) => write!(f, "TPROXY routing ({family}) missing"),
            Mismatch::LoV6Missing => f.write_str("::6/128 missing on lo"),
            Mismatch::Unwanted => write!(
                f,
                "table inet {} exists, but the pod should have no capture rules",
                nft::TABLE
            ),
            Mismatch::Foreign(what) => write!(
                f,
                "capture rules we did not write are here too ({what}): both act on every packet"
            ),
        }
    }
}

/// What a namespace holds beside our table, read once: the TPROXY routing per family and
/// `::6` on `lo`. `compare` judges it, `inspect` also shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutesSeen {
    /// The TPROXY rule and route of one mark and table, per family read.
    pub tproxy: Vec<(Family, TproxyState)>,
    /// `::6/128` on `lo` (false when not read).
    pub lo_v6: bool,
}

impl RoutesSeen {
    /// What `routes` asks for, and no more: its policy routing in its families, `::6` when
    /// it needs it.
    pub fn read_for(k: &dyn Backend, routes: &Routes) -> Result<RoutesSeen> {
        let tproxy = match &routes.policy {
            Some(r) => read_tproxy_of(k, r, &routes.families)?,
            None => Vec::new(),
        };
        Ok(RoutesSeen {
            tproxy,
            lo_v6: routes.lo_v6 && k.has_lo_v6()?,
        })
    }

    /// Everything, whatever a config needs: `routing` in both families, and `::6`.
    pub fn read_all(k: &dyn Backend, routing: &TproxyRouting) -> Result<RoutesSeen> {
        Ok(RoutesSeen {
            tproxy: read_tproxy_of(k, routing, &Family::ALL)?,
            lo_v6: k.has_lo_v6()?,
        })
    }

    fn tproxy_complete(&self, family: Family) -> bool {
        self.tproxy
            .iter()
            .any(|(f, st)| *f == family && st.is_complete())
    }
}

fn read_tproxy_of(
    k: &dyn Backend,
    r: &TproxyRouting,
    families: &[Family],
) -> Result<Vec<(Family, TproxyState)>> {
    families
        .iter()
        .map(|&f| Ok((f, k.read_tproxy(r, f)?)))
        .collect()
}

/// How the namespace's capture differs from `c` planned as `rs`; empty when it matches. One
/// read of its table, and only the routes `c` needs.
pub fn check(k: &dyn Backend, c: &Capture, rs: &Ruleset) -> Result<Vec<Mismatch>> {
    check_in(k, c.table(), &c.routes(), rs)
}

/// [`check`] of our table `table` and `routes` (a sidecar's config unvalidated:
/// `redirect_model::sidecar_routes`).
pub fn check_in(
    k: &dyn Backend,
    table: &str,
    routes: &Routes,
    rs: &Ruleset,
) -> Result<Vec<Mismatch>> {
    let state = k.read_named(table)?.1;
    let seen = RoutesSeen::read_for(k, routes)?;
    Ok(compare(routes, rs, state.as_ref(), &seen))
}

/// `check` on what was read already: the table (`None`: no table of ours) and the routes
/// (read with at least what `RoutesSeen::read_for` reads), against the plan `rs` and the
/// routes it needs.
pub fn compare(
    routes: &Routes,
    rs: &Ruleset,
    table: Option<&TableState>,
    seen: &RoutesSeen,
) -> Vec<Mismatch> {
    let mut out: Vec<Mismatch> = nft::compare(rs, table)
        .into_iter()
        .map(Mismatch::Rules)
        .collect();
    out.extend(compare_routes(routes, seen));
    out
}

/// The routes alone: what `routes` needs that `seen` lacks (the TPROXY policy routing of each
/// family, `::6` on `lo`).
pub fn compare_routes(routes: &Routes, seen: &RoutesSeen) -> Vec<Mismatch> {
    let mut out = Vec::new();
    if routes.policy.is_some() {
        for &family in &routes.families {
            if !seen.tproxy_complete(family) {
                out.push(Mismatch::TproxyRouting(family));
            }
        }
    }
    if routes.lo_v6 && !seen.lo_v6 {
        out.push(Mismatch::LoV6Missing);
    }
    out
}

/// For a pod outside the mesh: our table must not be there.
pub fn compare_uncaptured(table: Option<&TableState>) -> Vec<Mismatch> {
    table.map(|_| Mismatch::Unwanted).into_iter().collect()
}
