//! How a namespace's capture differs from what a config wants: our table against the plan, the
//! TPROXY policy routing and `::6` on `lo`. CNI CHECK, `inspect`, redirect-init's "already in
//! place" test and the repair controller's read-back all ask this one question, so they agree
//! on what "in place" means.

use std::fmt;
use std::path::Path;

use crate::config::CaptureConfig;
use crate::error::Result;
use crate::nft::{self, Difference, TableState};
use crate::plan::GroupResolver;
use crate::routes;
use crate::ruleset::{Family, Ruleset};

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

/// In the calling thread's namespace: how its capture differs from `cfg` planned as `rs`;
/// empty when it matches. One dump of our table.
pub fn check(cfg: &CaptureConfig, rs: &Ruleset) -> Result<Vec<Mismatch>> {
    compare(cfg, rs, nft::read_back()?.as_ref())
}

/// `check` with our table already read back (`None`: no table of ours); the routes are read
/// here.
pub fn compare(
    cfg: &CaptureConfig,
    rs: &Ruleset,
    table: Option<&TableState>,
) -> Result<Vec<Mismatch>> {
    let mut out: Vec<Mismatch> = nft::compare(rs, table)
        .into_iter()
        .map(Mismatch::Rules)
        .collect();
    if let Some(r) = super::tproxy_routing(cfg) {
        for family in rs.families() {
            if !routes::read_tproxy(&r, family)?.is_complete() {
                out.push(Mismatch::TproxyRouting(family));
            }
        }
    }
    if cfg.ipv6 && !routes::has_lo_v6_inbound_addr()? {
        out.push(Mismatch::LoV6Missing);
    }
    Ok(out)
}

/// For a pod outside the mesh: our table must not be there.
pub fn compare_uncaptured(table: Option<&TableState>) -> Vec<Mismatch> {
    table.map(|_| Mismatch::Unwanted).into_iter().collect()
}

/// Plan `cfg` and `check` inside the namespace at `netns`.
pub fn check_in(
    netns: &Path,
    cfg: &CaptureConfig,
    groups: &(dyn GroupResolver + Sync),
) -> Result<Vec<Mismatch>> {
    crate::netns::run_in(netns, || {
        let rs = crate::plan::plan_with(cfg, groups)?;
        check(cfg, &rs)
    })?
}
