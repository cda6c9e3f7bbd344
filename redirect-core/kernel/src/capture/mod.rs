//! Capture in one namespace, through a [`Backend`] (the kernel, or a fake in tests), one path
//! for every kind ([`Capture`]: a sidecar's, ambient's in-pod rules, the host's probe SNAT):
//! the routes the kind needs (`Capture::routes`), then its table in one atomic batch, the
//! routes taken back when the table is refused ([`apply`]); how a namespace differs from it
//! ([`check`], [`check_since`]); its table read back ([`read`]); removed ([`remove`]); the host
//! probe's members added and removed at run time ([`add_members`], [`remove_members`]); and
//! whatever capture left, whichever config put it there ([`cleanup`]). Nothing here is Istio's:
//! the Istio layer's policies (what a run may do over rules already there, IPv6 from a pod's
//! addresses) are built on it.

mod check;

pub use check::{check, check_in, compare, compare_uncaptured, Mismatch, RoutesSeen};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use redirect_model::table::HOST_PROBE_TABLE;
use redirect_model::{Capture, Family, HostProbeConfig, PathCounts, Routes, Ruleset};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::nft::{Applied, TableState};
use crate::routes::TproxyRouting;

/// The TPROXY mark and route table a sidecar's config names, whether or not it uses them.
pub use redirect_model::sidecar_routing as routing_of;

/// Program `rs`, planned from `c`, with the routes `c` needs. The routes go first, then the
/// rules (atomically): the routes are harmless without the rules (nothing marks packets for
/// them), so a process killed at any point never leaves rules whose routing is missing, and a
/// retry converges (both steps are idempotent). When the rules fail, the routes this call added
/// are taken back.
pub fn apply(k: &dyn Backend, c: &Capture, rs: &Ruleset) -> Result<Applied> {
    apply_in(k, c.table(), &c.routes(), rs)
}

/// [`apply`] of a ruleset into our table `table` with `routes`: for a caller that holds a
/// sidecar's config unvalidated (`redirect_model::sidecar_routes`).
pub fn apply_in(k: &dyn Backend, table: &str, routes: &Routes, rs: &Ruleset) -> Result<Applied> {
    routes_then(k, routes, || k.apply_named(table, rs))
}

/// Ensure `routes`, then run `rules`. When `rules` fails, the routes this call added are
/// removed again (best effort), so a failed apply leaves the namespace as it was.
pub fn routes_then<T, E: From<Error>>(
    k: &dyn Backend,
    routes: &Routes,
    rules: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let missing = MissingRoutes::read(k, routes)?;
    apply_routes(k, routes)?;
    rules().inspect_err(|_| missing.remove(k, routes))
}

/// The routes a capture needs that a namespace lacks entirely (partial ones are not ours to
/// take away).
struct MissingRoutes {
    policy: Vec<Family>,
    lo_v6: bool,
}

impl MissingRoutes {
    /// Read only what `routes` asks for: nothing at all for a REDIRECT capture over IPv4.
    fn read(k: &dyn Backend, routes: &Routes) -> Result<MissingRoutes> {
        let mut policy = Vec::new();
        if let Some(r) = &routes.policy {
            for &family in &routes.families {
                if k.read_tproxy(r, family)?.is_absent() {
                    policy.push(family);
                }
            }
        }
        Ok(MissingRoutes {
            policy,
            lo_v6: routes.lo_v6 && !k.has_lo_v6()?,
        })
    }

    fn remove(&self, k: &dyn Backend, routes: &Routes) {
        if let (Some(r), false) = (&routes.policy, self.policy.is_empty()) {
            let _ = k.remove_tproxy(r, &self.policy);
        }
        if self.lo_v6 {
            let _ = k.remove_lo_v6();
        }
    }
}

/// Add what `routes` asks for, whatever backend programmed the rules: `::6` on `lo`, the
/// policy routing in each family.
pub fn apply_routes(k: &dyn Backend, routes: &Routes) -> Result<()> {
    if routes.lo_v6 {
        k.ensure_lo_v6()?;
    }
    if let Some(r) = &routes.policy {
        k.apply_tproxy(r, &routes.families)?;
    }
    Ok(())
}

/// Remove `c`'s table and the routes it would have added.
pub fn remove(k: &dyn Backend, c: &Capture) -> Result<()> {
    k.remove_named(c.table())?;
    let routes = c.routes();
    if let Some(r) = &routes.policy {
        k.remove_tproxy(r, &routes.families)?;
    }
    if routes.lo_v6 {
        k.remove_lo_v6()?;
    }
    Ok(())
}

/// `c`'s table as the kernel holds it, one consistent read; `None` when there is none.
pub fn read(k: &dyn Backend, c: &Capture) -> Result<Option<TableState>> {
    Ok(k.read_named(c.table())?.1)
}

/// [`check`], skipping the table's dump when the ruleset's generation is still `seen` (the
/// generation of an earlier read that found the table equal: nothing committed since); the
/// routes are read each time. Returns the differences and the generation at which the table
/// read back equal (`None` when it differed, or the backend has no generations): pass it back
/// next time.
pub fn check_since(
    k: &dyn Backend,
    c: &Capture,
    rs: &Ruleset,
    seen: Option<u32>,
) -> Result<(Vec<Mismatch>, Option<u32>)> {
    let routes = c.routes();
    if let Some(seen) = unchanged_since(k, seen)? {
        // Equal at `seen`, nothing committed since: the table is as it read back, only the
        // routes (which no generation covers) are read.
        return Ok((check_routes(k, c)?, Some(seen)));
    }
    let (generation, table) = k.read_named(c.table())?;
    let found = RoutesSeen::read_for(k, &routes)?;
    let out = compare(&routes, rs, table.as_ref(), &found);
    let equal_at = if out.iter().any(Mismatch::is_rules) {
        None
    } else {
        generation
    };
    Ok((out, equal_at))
}

/// `c`'s counters (counters on), summed per path by where `rs`, its plan, puts the counted
/// rules; `None` when the table's counters are not exactly there (no counters, or a table of
/// another shape).
pub fn path_counts(k: &dyn Backend, c: &Capture, rs: &Ruleset) -> Result<Option<PathCounts>> {
    let read = k.read_counters(c.table())?;
    Ok(crate::nft::path_counts(
        &read,
        &crate::nft::counted_rules(rs),
    ))
}

/// The routes `c` needs that the namespace lacks, read without its table.
pub fn check_routes(k: &dyn Backend, c: &Capture) -> Result<Vec<Mismatch>> {
    let routes = c.routes();
    let found = RoutesSeen::read_for(k, &routes)?;
    Ok(check::compare_routes(&routes, &found))
}

/// `seen` when the namespace's ruleset generation is still `seen` (nothing was committed
/// since our table last read back equal), else `None`.
pub fn unchanged_since(k: &dyn Backend, seen: Option<u32>) -> Result<Option<u32>> {
    Ok(match (seen, k.generation()?) {
        (Some(seen), Some(now)) if seen == now => Some(seen),
        _ => None,
    })
}

/// Add pod addresses to the host probe's sets of `cfg`, in one batch. When the table is not
/// there (a firewall reload flushed the ruleset), the table is created with them, in one batch
/// too (never an empty table left by a refused member), and `true` says so: it holds these
/// addresses only. An address that cannot be a pod's, or an IPv6 one when `cfg` has IPv6 off,
/// is an error naming it, and nothing is sent.
pub fn add_members(k: &dyn Backend, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<bool> {
    let rs = cfg.plan_with(pods)?;
    if pods.is_empty() {
        return Ok(false);
    }
    if k.read_named(HOST_PROBE_TABLE)?.1.is_none() {
        let c = Capture::HostProbe {
            config: cfg.clone(),
            members: pods.to_vec(),
        };
        return apply(k, &c, &rs).map(|_| true);
    }
    k.add_elements(HOST_PROBE_TABLE, &rs.sets).map(|()| false)
}

/// Remove pod addresses from the host probe's sets, in one batch; addresses not there are
/// skipped. How many went. Bad addresses as for [`add_members`].
pub fn remove_members(k: &dyn Backend, cfg: &HostProbeConfig, pods: &[IpAddr]) -> Result<usize> {
    let rs = cfg.plan_with(pods)?;
    if pods.is_empty() {
        return Ok(0);
    }
    k.remove_elements(HOST_PROBE_TABLE, &rs.sets)
}

/// The addresses in the host probe's sets, IPv4 first, each sorted; `None` when the table is
/// not there.
pub fn members(k: &dyn Backend) -> Result<Option<Vec<IpAddr>>> {
    Ok(k.read_named(HOST_PROBE_TABLE)?.1.map(|t| members_of(&t)))
}

/// Every address key of every set, IPv4 first.
fn members_of(t: &TableState) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = t
        .sets
        .iter()
        .flat_map(|s| &s.elements)
        .filter_map(|e| match e.key.len() {
            4 => <[u8; 4]>::try_from(e.key.as_slice())
                .ok()
                .map(|k| IpAddr::V4(Ipv4Addr::from(k))),
            16 => <[u8; 16]>::try_from(e.key.as_slice())
                .ok()
                .map(|k| IpAddr::V6(Ipv6Addr::from(k))),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// What `cleanup` found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Our nftables table.
    pub table: bool,
    /// The TPROXY `ip rule` / local route, per family that had any.
    pub tproxy: Vec<Family>,
    /// `::6/128` on `lo`.
    pub lo_v6: bool,
}

/// Remove everything capture may have left, whatever config put it there: our table, TPROXY
/// routing with this mark and table in both families, and `::6` on `lo`.
pub fn cleanup(k: &dyn Backend, routing: &TproxyRouting) -> Result<Cleaned> {
    let mut done = Cleaned {
        table: k.remove_table()?,
        ..Cleaned::default()
    };
    for family in Family::ALL {
        if !k.read_tproxy(routing, family)?.is_absent() {
            k.remove_tproxy(routing, &[family])?;
            done.tproxy.push(family);
        }
    }
    if k.has_lo_v6()? {
        k.remove_lo_v6()?;
        done.lo_v6 = true;
    }
    Ok(done)
}
