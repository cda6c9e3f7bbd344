//! Capture in one namespace, through a [`Backend`] (the kernel, or a fake in tests): a planned
//! ruleset programmed with the routes it needs beside it (TPROXY policy routing when inbound is
//! tproxied, `::6` on `lo` with IPv6), checked against a config (`check`), removed, or cleaned
//! up whatever config put it there. Nothing here is Istio's: the Istio layer's policies (what
//! a run may do over rules already there, IPv6 from a pod's addresses) are built on it.
//! `host_probe` is the one job on the host's namespace: ambient's probe SNAT table.

pub mod ambient;
mod check;
pub mod host_probe;

pub use check::{check, compare, compare_uncaptured, Mismatch, RoutesSeen};

use redirect_model::{CaptureConfig, Family, InterceptionMode, Ruleset};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::nft::Applied;
use crate::routes::TproxyRouting;

/// The TPROXY mark and route table a config names, whether or not it uses them.
pub fn routing_of(cfg: &CaptureConfig) -> TproxyRouting {
    TproxyRouting {
        mark: cfg.tproxy_mark,
        mask: u32::MAX,
        table: cfg.tproxy_route_table,
        priority: None,
    }
}

/// The TPROXY routing a config needs, if any (only with tproxied inbound capture).
pub fn tproxy_routing(cfg: &CaptureConfig) -> Option<TproxyRouting> {
    (cfg.mode == InterceptionMode::Tproxy && !cfg.inbound_ports.is_none()).then(|| routing_of(cfg))
}

fn families(cfg: &CaptureConfig) -> Vec<Family> {
    families_with(cfg.ipv6)
}

/// IPv4, and IPv6 with `ipv6`.
fn families_with(ipv6: bool) -> Vec<Family> {
    if ipv6 {
        vec![Family::V4, Family::V6]
    } else {
        vec![Family::V4]
    }
}

/// Program `rs`, planned from `cfg`, with its routes. The routes go first, then the rules
/// (atomically): the routes are harmless without the rules (nothing marks packets for them),
/// so a process killed at any point never leaves rules whose TPROXY routing is missing, and a
/// retry converges (both steps are idempotent). When the rules fail, the routes this call
/// added are taken back.
pub fn apply(k: &dyn Backend, cfg: &CaptureConfig, rs: &Ruleset) -> Result<Applied> {
    routes_then(k, cfg, || k.apply(rs))
}

/// Ensure the routes `cfg` needs, then run `rules`. When `rules` fails, the routes this call
/// added are removed again (best effort), so a failed apply leaves the namespace as it was.
pub fn routes_then<T, E: From<Error>>(
    k: &dyn Backend,
    cfg: &CaptureConfig,
    rules: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    let missing = MissingRoutes::read(k, cfg)?;
    apply_routes(k, cfg)?;
    rules().inspect_err(|_| missing.remove(k, cfg))
}

/// The routes a config needs that a namespace lacks entirely (partial ones are not ours to
/// take away).
struct MissingRoutes {
    tproxy: Vec<Family>,
    lo_v6: bool,
}

impl MissingRoutes {
    /// Read only what `cfg` needs: nothing at all for a REDIRECT capture over IPv4.
    fn read(k: &dyn Backend, cfg: &CaptureConfig) -> Result<MissingRoutes> {
        let mut tproxy = Vec::new();
        if let Some(r) = tproxy_routing(cfg) {
            for family in families(cfg) {
                if k.read_tproxy(&r, family)?.is_absent() {
                    tproxy.push(family);
                }
            }
        }
        Ok(MissingRoutes {
            tproxy,
            lo_v6: cfg.ipv6 && !k.has_lo_v6()?,
        })
    }

    fn remove(&self, k: &dyn Backend, cfg: &CaptureConfig) {
        if let (Some(r), false) = (tproxy_routing(cfg), self.tproxy.is_empty()) {
            let _ = k.remove_tproxy(&r, &self.tproxy);
        }
        if self.lo_v6 {
            let _ = k.remove_lo_v6();
        }
    }
}

/// The routes beside the rules, whatever backend programmed the rules: `::6` on `lo` with
/// IPv6, TPROXY policy routing with tproxied inbound capture.
pub fn apply_routes(k: &dyn Backend, cfg: &CaptureConfig) -> Result<()> {
    if cfg.ipv6 {
        k.ensure_lo_v6()?;
    }
    if let Some(r) = tproxy_routing(cfg) {
        k.apply_tproxy(&r, &families(cfg))?;
    }
    Ok(())
}

/// Remove our table and the routes this config would have added.
pub fn remove(k: &dyn Backend, cfg: &CaptureConfig) -> Result<()> {
    k.remove_table()?;
    if let Some(r) = tproxy_routing(cfg) {
        k.remove_tproxy(&r, &families(cfg))?;
    }
    if cfg.ipv6 {
        k.remove_lo_v6()?;
    }
    Ok(())
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
