//! Gathering the evidence: what the probe's own process can find out in the calling thread's
//! namespace (its IDs, `::6` on `lo`, an IPv4 probe for an IPv6 failure) and, when it may read
//! nf_tables, our table against the plan and Istio's leftovers. The only part of the diagnosis
//! that touches the system; `diagnose` itself is a pure function of what is gathered here.

use std::time::Duration;

use super::{Facts, KernelView};
use crate::validation::probe::{ProbeFailure, ProbeSpec};
use crate::xtables;
use redirect_kernel::nft::{self, Nft};
use redirect_model::ValidConfig;
use redirect_model::{Family, Ruleset};

/// Read the calling thread's namespace: our table (compared with `expected` when given; one
/// dump either way), and Istio's rules. Needs CAP_NET_ADMIN; the error says so.
pub fn read_kernel(expected: Option<&Ruleset>) -> crate::Result<KernelView> {
    let nft = Nft::open()?;
    let table = nft.read()?;
    let differences = match expected {
        Some(rs) => nft::compare(rs, table.as_ref()),
        None => Vec::new(),
    };
    let our_families = match &table {
        Some(t) => Family::ALL
            .into_iter()
            .filter(|f| {
                let tag = format!("_{}_", f.nft_name());
                t.chains.iter().any(|c| c.name.contains(&tag))
            })
            .collect(),
        None => Vec::new(),
    };
    let mut unread = Vec::new();
    // Listing Istio's iptables chains runs the host's iptables-save, which may be missing.
    let istio_iptables = match xtables::find_istio_leftovers() {
        Ok(l) => l.iter().map(|l| l.to_string()).collect(),
        Err(e) => {
            unread.push(format!("Istio's iptables chains: {e}"));
            Vec::new()
        }
    };
    Ok(KernelView {
        our_table: table.is_some(),
        table,
        our_families,
        differences,
        istio_nft_tables: crate::tables::istio_tables(&nft)?,
        istio_iptables,
        unread,
    })
}

/// The facts for a failed probe, gathered in the calling thread's namespace as this process:
/// who it runs as, `::6` and an IPv4 probe for an IPv6 failure, and the rules when readable.
pub fn gather_facts(spec: &ProbeSpec, failure: &ProbeFailure, cfg: &ValidConfig) -> Facts {
    let mut facts = Facts {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        proxy_uids: cfg.proxy_uids.clone(),
        proxy_gids: cfg.proxy_gids.clone(),
        ..Facts::default()
    };
    if spec.ipv6 && matches!(failure, ProbeFailure::Timeout { .. }) {
        facts.lo_has_v6 = redirect_kernel::routes::Routes::open()
            .and_then(|r| r.has_lo_v6_inbound_addr())
            .ok();
        let v4 = ProbeSpec {
            ipv6: false,
            timeout: spec.timeout.min(Duration::from_secs(1)),
            ..spec.clone()
        };
        facts.ipv4_probe_passed = Some(crate::validation::probe::run(&v4).is_ok());
    }
    match cfg
        .plan(&redirect_kernel::SystemGroups)
        .map_err(crate::Error::from)
        .and_then(|rs| read_kernel(Some(&rs)))
    {
        Ok(k) => facts.kernel = Some(k),
        Err(e) => {
            let denied = matches!(&e, crate::Error::Rules(redirect_kernel::nft::Error::Rejected { errno, .. }) if *errno == libc::EPERM)
                || e.to_string().contains("Operation not permitted");
            facts.kernel_unreadable = Some(if denied {
                "reading nf_tables needs CAP_NET_ADMIN, which the validation container does not have".into()
            } else {
                e.to_string()
            })
        }
    }
    facts
}
