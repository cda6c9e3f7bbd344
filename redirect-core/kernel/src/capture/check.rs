//! How a namespace's capture differs from what a config wants: our table against the plan, the
//! TPROXY policy routing and `::6` on `lo`. CNI CHECK, `inspect`, redirect-init's "already in
//! place" test and the repair controller's read-back all ask this one question, so they agree
//! on what "in place" means.

use std::fmt;

use redirect_model::{CaptureConfig, Family, Ruleset};

use crate::backend::Backend;
use crate::error::Result;
use crate::nft::{self, Difference, TableState};
use crate::routes::{TproxyRouting, TproxyState};

/// One way the namespace differs from the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// Our table against the plan.
    Rules(Difference),
    /// TPROXY policy routing (the fwmark `ip rule` or the local route) incomplete.
    TproxyRouting(Family),
    /// `::6/128` is not on `lo`: IPv6 inbound capture has nowhere to send the probe.
    LoV6Missing,
    /// Our table is there, but the pod should have no capture at all.
    Unwanted,
}

impl Mismatch {
    /// Whether the difference is in our table (as opposed to the routes beside it, which a
    /// run re-adds without touching the rules).
    pub fn is_rules(&self) -> bool {
        matches!(self, Mismatch::Rules(_) | Mismatch::Unwanted)
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
    /// What `cfg` planned as `rs` needs, and no more: the TPROXY routing of its families when
    /// it tproxies inbound, `::6` with IPv6.
    pub fn read_for(k: &dyn Backend, cfg: &CaptureConfig, rs: &Ruleset) -> Result<RoutesSeen> {
        let tproxy = match super::tproxy_routing(cfg) {
            Some(r) => read_tproxy_of(k, &r, &rs.families())?,
            None => Vec::new(),
        };
        Ok(RoutesSeen {
            tproxy,
            lo_v6: cfg.ipv6 && k.has_lo_v6()?,
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

/// How the namespace's capture differs from `cfg` planned as `rs`; empty when it matches. One
/// read of our table, and only the routes `cfg` needs.
pub fn check(k: &dyn Backend, cfg: &CaptureConfig, rs: &Ruleset) -> Result<Vec<Mismatch>> {
    let table = k.read_table()?;
    let routes = RoutesSeen::read_for(k, cfg, rs)?;
    Ok(compare(cfg, rs, table.as_ref(), &routes))
}

/// `check` on what was read already: our table (`None`: no table of ours) and the routes
/// (read with at least what `RoutesSeen::read_for` reads).
pub fn compare(
    cfg: &CaptureConfig,
    rs: &Ruleset,
    table: Option<&TableState>,
    routes: &RoutesSeen,
) -> Vec<Mismatch> {
    let mut out: Vec<Mismatch> = nft::compare(rs, table)
        .into_iter()
        .map(Mismatch::Rules)
        .collect();
    if super::tproxy_routing(cfg).is_some() {
        for family in rs.families() {
            if !routes.tproxy_complete(family) {
                out.push(Mismatch::TproxyRouting(family));
            }
        }
    }
    if cfg.ipv6 && !routes.lo_v6 {
        out.push(Mismatch::LoV6Missing);
    }
    out
}

/// For a pod outside the mesh: our table must not be there.
pub fn compare_uncaptured(table: Option<&TableState>) -> Vec<Mismatch> {
    table.map(|_| Mismatch::Unwanted).into_iter().collect()
}
