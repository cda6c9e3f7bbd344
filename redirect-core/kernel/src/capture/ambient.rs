//! Ambient in-pod capture through a [`Backend`]: the reply routing (`fwmark 0x111/0xfff lookup
//! 100 pref 32764`, and `local` default via `lo` in table 100) beside the table of the in-pod
//! rules, programmed routes first and all or nothing, checked and removed the same way as
//! sidecar capture.

use redirect_model::{ambient, AmbientConfig, Family, Ruleset};

use super::Mismatch;
use crate::backend::Backend;
use crate::error::Result;
use crate::nft::{self, Applied};
use crate::routes::TproxyRouting;

/// The policy routing of the replies of connections ztunnel delivered.
pub const AMBIENT_ROUTING: TproxyRouting = TproxyRouting {
    mark: ambient::REPLY_MARK,
    mask: ambient::MARK_MASK,
    table: ambient::ROUTE_TABLE,
    priority: Some(ambient::RULE_PRIORITY),
};

fn families(cfg: &AmbientConfig) -> Vec<Family> {
    super::families_with(cfg.ipv6)
}

/// Program `rs`, planned from `cfg`: the reply routing of each family first (harmless alone:
/// only the rules mark packets for it), then the rules in one batch. When the rules fail, the
/// routing this call added is taken back.
pub fn apply(k: &dyn Backend, cfg: &AmbientConfig, rs: &Ruleset) -> Result<Applied> {
    let mut missing = Vec::new();
    for family in families(cfg) {
        if k.read_tproxy(&AMBIENT_ROUTING, family)?.is_absent() {
            missing.push(family);
        }
    }
    k.apply_tproxy(&AMBIENT_ROUTING, &families(cfg))?;
    k.apply(rs).inspect_err(|_| {
        if !missing.is_empty() {
            let _ = k.remove_tproxy(&AMBIENT_ROUTING, &missing);
        }
    })
}

/// How the namespace differs from `cfg` planned as `rs`: our table rule by rule, and the reply
/// routing of each family. Empty when ambient capture is exactly in place.
pub fn check(k: &dyn Backend, cfg: &AmbientConfig, rs: &Ruleset) -> Result<Vec<Mismatch>> {
    let table = k.read_table()?;
    let mut out: Vec<Mismatch> = nft::compare(rs, table.as_ref())
        .into_iter()
        .map(Mismatch::Rules)
        .collect();
    for family in families(cfg) {
        if !k.read_tproxy(&AMBIENT_ROUTING, family)?.is_complete() {
            out.push(Mismatch::TproxyRouting(family));
        }
    }
    Ok(out)
}

/// [`check`], skipping the table's dump when the ruleset's generation is still `seen` (the
/// generation of an earlier read that found the table equal: nothing committed since). Returns
/// the differences and the generation at which the table read back equal (`None` when it
/// differed, or the backend has no generations): pass it back next time.
pub fn check_since(
    k: &dyn Backend,
    cfg: &AmbientConfig,
    rs: &Ruleset,
    seen: Option<u32>,
) -> Result<(Vec<Mismatch>, Option<u32>)> {
    let unchanged = match (seen, k.generation()?) {
        (Some(seen), Some(now)) => seen == now,
        _ => false,
    };
    let (mut out, equal_at) = if unchanged {
        (Vec::new(), seen)
    } else {
        let (generation, table) = k.read_table_at()?;
        let out: Vec<Mismatch> = nft::compare(rs, table.as_ref())
            .into_iter()
            .map(Mismatch::Rules)
            .collect();
        let equal_at = if out.is_empty() { generation } else { None };
        (out, equal_at)
    };
    for family in families(cfg) {
        if !k.read_tproxy(&AMBIENT_ROUTING, family)?.is_complete() {
            out.push(Mismatch::TproxyRouting(family));
        }
    }
    Ok((out, equal_at))
}

/// Remove our table and the reply routing of both families.
pub fn remove(k: &dyn Backend) -> Result<()> {
    k.remove_table()?;
    k.remove_tproxy(&AMBIENT_ROUTING, &Family::ALL)
}
