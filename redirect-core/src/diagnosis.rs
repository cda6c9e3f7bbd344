//! Why Istio's validation probe failed, in an operator's terms: which of the likely causes the
//! evidence points to, and what to do about it.
//!
//! The probe runs unprivileged, so most evidence is what its own connections saw (refused, no
//! answer, answered by someone else, redirected elsewhere), who it runs as, and whether `::6` is
//! on `lo`. When it can read nf_tables (CAP_NET_ADMIN: run as root, or `inspect` on the node), the
//! rules themselves confirm or refine the cause.

use std::fmt;
use std::io;

use serde::Serialize;

use crate::nft::{self, Difference, TableState};
use std::time::Duration;

use crate::config::CaptureConfig;
use crate::istio::xtables;
use crate::probe::{ProbeFailure, ProbeSpec};
use crate::ruleset::{Family, Ruleset};

/// The likely causes a failed probe can tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// No capture rules in the namespace.
    NoRules,
    /// Rules that are not ours (Istio's iptables or nft tables) and do not redirect the probe.
    RulesNotOurs,
    /// Our rules (or some rules) are there but for another configuration, or broken.
    RulesStale,
    /// The probe does not run as a proxy UID/GID, so the rules rightly leave it alone.
    NotProxyUid,
    /// Another process holds a capture port.
    ListenerPortTaken,
    /// IPv6 capture is missing (no IPv6 rules, or `::6` not on `lo`).
    Ipv6RulesMissing,
    /// None of the above fits the evidence.
    Unknown,
}

impl Cause {
    pub fn id(self) -> &'static str {
        match self {
            Cause::NoRules => "no_rules",
            Cause::RulesNotOurs => "rules_not_ours",
            Cause::RulesStale => "rules_stale",
            Cause::NotProxyUid => "not_proxy_uid",
            Cause::ListenerPortTaken => "listener_port_taken",
            Cause::Ipv6RulesMissing => "ipv6_rules_missing",
            Cause::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// A cause, in words, with what to do and what it rests on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    pub cause: Cause,
    pub summary: String,
    pub fix: String,
    pub evidence: Vec<String>,
}

/// What the probe's process knows besides the probe's own result.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub uid: u32,
    pub gid: u32,
    pub proxy_uids: Vec<u32>,
    pub proxy_gids: Vec<u32>,
    /// For an IPv6 probe: whether `::6` is on `lo`.
    pub lo_has_v6: Option<bool>,
    /// For an IPv6 probe that failed: whether the same probe over IPv4 passed.
    pub ipv4_probe_passed: Option<bool>,
    /// The rules, when they could be read.
    pub kernel: Option<KernelView>,
    /// Why they could not be read.
    pub kernel_unreadable: Option<String>,
}

/// The rules in the namespace, compared with what the configuration plans.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelView {
    /// Our table as read back; `None` when there is none.
    #[serde(skip)]
    pub table: Option<TableState>,
    pub our_table: bool,
    /// Families our table has chains for.
    pub our_families: Vec<Family>,
    /// Our table against the plan (`TableMissing` when there is none); empty when equal or
    /// when no plan was given.
    pub differences: Vec<Difference>,
    pub istio_nft_tables: Vec<String>,
    /// Istio's iptables chains, as `IPv4 nft nat ISTIO_OUTPUT: 9 rule(s), ...`.
    pub istio_iptables: Vec<String>,
    /// What could not be read (e.g. no iptables binary to list Istio's chains with).
    pub unread: Vec<String>,
}

impl KernelView {
    pub fn has_istio_rules(&self) -> bool {
        !self.istio_nft_tables.is_empty() || !self.istio_iptables.is_empty()
    }
}

/// Read the calling thread's namespace: our table (compared with `expected` when given; one
/// dump either way), and Istio's rules. Needs CAP_NET_ADMIN; the error says so.
pub fn read_kernel(expected: Option<&Ruleset>) -> crate::Result<KernelView> {
    let table = nft::read_back()?;
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
        istio_nft_tables: nft::istio_tables()?,
        istio_iptables,
        unread,
    })
}

const INSPECT: &str = "on the node, `redirect-validate inspect --netns /proc/<pid>/ns/net` with this pod's flags shows the rules and how they differ";

/// The most likely cause of `failure`.
pub fn diagnose(failure: &ProbeFailure, facts: &Facts) -> Diagnosis {
    let (listen_errors, timeout) = match failure {
        ProbeFailure::NoListener { errors } => (errors, None),
        ProbeFailure::Timeout { listen_errors, .. } => (listen_errors, Some(failure)),
    };
    // Listen errors are part of the failure's text; kept apart for the NoListener case.
    let taken: Vec<u16> = listen_errors.iter().map(|(p, _)| *p).collect();
    let Some(ProbeFailure::Timeout {
        ipv6,
        probe_port,
        connected,
        last_connect_error,
        wrong_destinations,
        ..
    }) = timeout
    else {
        return port_taken(vec![failure.to_string()], &taken);
    };
    let target = if *ipv6 {
        format!("[::6]:{probe_port}")
    } else {
        format!("127.0.0.6:{probe_port}")
    };
    // The failure's own account first (attempts, connections, last error, listeners).
    let mut evidence = vec![failure.to_string()];
    if let Some(why) = &facts.kernel_unreadable {
        evidence.push(format!("rules not read ({why})"));
    }

    // Rules read and none there: nothing else matters.
    if let Some(k) = facts
        .kernel
        .as_ref()
        .filter(|k| !k.our_table && !k.has_istio_rules())
    {
        evidence.push(
            "nf_tables holds no table of ours and no Istio rules (iptables legacy or nft)".into(),
        );
        evidence.extend(k.unread.iter().map(|u| format!("not read: {u}")));
        return no_rules(evidence, &target, true);
    }
    // Who the probe runs as decides whether any rule may redirect it at all.
    let proxy = facts.proxy_uids.contains(&facts.uid) || facts.proxy_gids.contains(&facts.gid);
    if !proxy {
        return Diagnosis {
            cause: Cause::NotProxyUid,
            summary: format!(
                "the probe runs as uid {} gid {}, which is not a proxy UID or GID (proxy UIDs {}, GIDs {}): the rules let other processes' loopback traffic through, so its connection cannot be redirected",
                facts.uid,
                facts.gid,
                list(&facts.proxy_uids),
                list(&facts.proxy_gids)
            ),
            fix: "run the validation container as the proxy's user (securityContext.runAsUser, 1337 by default), or pass the UID it does run as with -u (on OpenShift, the namespace's UID range, e.g. -u 1000620000); redirect-cni takes it from the istio-proxy container's runAsUser".into(),
            evidence,
        };
    }
    if !taken.is_empty() && *connected > 0 {
        return port_taken(evidence, &taken);
    }
    if *ipv6 {
        let no_lo6 = facts.lo_has_v6 == Some(false);
        let v4_ok = facts.ipv4_probe_passed == Some(true);
        let no_v6_table = facts
            .kernel
            .as_ref()
            .is_some_and(|k| k.our_table && !k.our_families.contains(&Family::V6));
        if no_lo6 || v4_ok || no_v6_table {
            if no_lo6 {
                evidence.push("::6 is not on lo".into());
            }
            if v4_ok {
                evidence.push("the same probe over IPv4 (127.0.0.6) passed".into());
            }
            if no_v6_table {
                evidence.push("our table has IPv4 chains only".into());
            }
            return Diagnosis {
                cause: Cause::Ipv6RulesMissing,
                summary: "the pod's address is IPv6 but IPv6 capture is missing: the rules were programmed for IPv4 only, or without ::6 on lo (the address Envoy's inbound passthrough and this probe use)".into(),
                fix: "program the rules for IPv6: they follow the pod's address (Istio's ENABLE_INBOUND_IPV6; with dual-stack pods, --dual-stack / ISTIO_DUAL_STACK or the plugin's dual_stack); rerun redirect-init in the pod, or delete the pod so redirect-cni sets it up again".into(),
                evidence,
            };
        }
    }
    if let Some(k) = &facts.kernel {
        if k.our_table && !k.differences.is_empty() {
            evidence.extend(k.differences.iter().take(5).map(|d| d.to_string()));
            return Diagnosis {
                cause: Cause::RulesStale,
                summary: format!(
                    "our table is here but differs from this configuration in {} place(s): the rules are stale or were changed by hand",
                    k.differences.len()
                ),
                fix: "reapply with this configuration: redirect-init --reconcile in the pod, or delete the pod so redirect-cni sets it up again; check that the validation container has the same flags as the init container or plugin".into(),
                evidence,
            };
        }
        if !k.our_table && k.has_istio_rules() {
            evidence.extend(
                k.istio_nft_tables
                    .iter()
                    .map(|t| format!("Istio nft table {t}")),
            );
            evidence.extend(k.istio_iptables.iter().cloned());
            return Diagnosis {
                cause: Cause::RulesNotOurs,
                summary: "Istio's own rules are here, not ours, and they do not redirect the probe: they were written for another configuration (proxy UID, ports) or by another iptables variant".into(),
                fix: "replace them: redirect-init --reconcile with this pod's flags (or --cleanup-only, then apply); after moving a node from istio-cni to redirect-cni, delete the pods that istio-cni set up".into(),
                evidence,
            };
        }
    }
    if !wrong_destinations.is_empty() {
        let seen: Vec<String> = wrong_destinations.iter().map(|a| a.to_string()).collect();
        evidence.push(format!(
            "connections arrived with original destination {}",
            seen.join(", ")
        ));
        return stale(
            evidence,
            "rules redirect the probe's connections, but not as this configuration says",
        );
    }
    let errno = last_connect_error
        .as_ref()
        .and_then(io::Error::raw_os_error);
    let unanswered = last_connect_error
        .as_ref()
        .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut);
    if errno == Some(libc::ECONNREFUSED) {
        return no_rules(evidence, &target, false);
    }
    let unreachable = [libc::ENETUNREACH, libc::EADDRNOTAVAIL, libc::EHOSTUNREACH];
    if *ipv6 && errno.is_some_and(|e| unreachable.contains(&e)) {
        return Diagnosis {
            cause: Cause::Ipv6RulesMissing,
            summary: "[::6] is not reachable over lo: IPv6 capture is not set up (no IPv6 rules, or ::6 missing from lo)".into(),
            fix: "program the rules for IPv6 (they follow the pod's address; see ENABLE_INBOUND_IPV6 and dual-stack) and check that `ip -6 addr show dev lo` lists ::6".into(),
            evidence,
        };
    }
    if *connected > 0 {
        return stale(
            evidence,
            "something accepted the probe's connections but not the probe's listeners: rules redirect them to other ports than -p/-z say",
        );
    }
    if unanswered {
        return stale(
            evidence,
            "connections to the probe address got no answer: rules drop or divert them",
        );
    }
    Diagnosis {
        cause: Cause::Unknown,
        summary: "the probe failed in a way that matches no known cause".into(),
        fix: INSPECT.into(),
        evidence,
    }
}

fn no_rules(evidence: Vec<String>, target: &str, confirmed: bool) -> Diagnosis {
    Diagnosis {
        cause: Cause::NoRules,
        summary: format!(
            "no capture rules in this pod's network namespace: the connection to {target} was refused, not redirected{}",
            if confirmed { " (confirmed by reading nf_tables)" } else { "" }
        ),
        fix: format!(
            "the rules were never programmed: the pod was most likely scheduled before redirect-cni was installed on its node (or its init container did not run). Delete the pod so it is set up again; with istio-cni's repair controller this happens on its own. To confirm: {INSPECT}"
        ),
        evidence,
    }
}

fn stale(evidence: Vec<String>, why: &str) -> Diagnosis {
    Diagnosis {
        cause: Cause::RulesStale,
        summary: format!("rules are present but not as this configuration plans: {why}"),
        fix: format!(
            "check that the validation container has the same -p/-z/-u flags as the init container or plugin, and reapply (redirect-init --reconcile, or delete the pod). {INSPECT}"
        ),
        evidence,
    }
}

fn port_taken(evidence: Vec<String>, ports: &[u16]) -> Diagnosis {
    let ports: Vec<u32> = ports.iter().map(|p| u32::from(*p)).collect();
    Diagnosis {
        cause: Cause::ListenerPortTaken,
        summary: format!(
            "cannot listen on port {}: another process holds it, so the probe's redirected connections go to that process instead",
            list(&ports)
        ),
        fix: "validation must run before the proxy starts (as an init container); find the holder with `ss -ltnp` in the pod, and check that no other container listens on the -p/-z ports".into(),
        evidence,
    }
}

fn list(ids: &[u32]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The facts for a failed probe, gathered in the calling thread's namespace as this process:
/// who it runs as, `::6` and an IPv4 probe for an IPv6 failure, and the rules when readable.
pub fn gather_facts(spec: &ProbeSpec, failure: &ProbeFailure, cfg: &CaptureConfig) -> Facts {
    let mut facts = Facts {
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        proxy_uids: cfg.proxy_uids.clone(),
        proxy_gids: cfg.proxy_gids.clone(),
        ..Facts::default()
    };
    if spec.ipv6 && matches!(failure, ProbeFailure::Timeout { .. }) {
        facts.lo_has_v6 = crate::routes::has_lo_v6_inbound_addr().ok();
        let v4 = ProbeSpec {
            ipv6: false,
            timeout: spec.timeout.min(Duration::from_secs(1)),
            ..spec.clone()
        };
        facts.ipv4_probe_passed = Some(crate::probe::run(&v4).is_ok());
    }
    match crate::plan(cfg).and_then(|rs| read_kernel(Some(&rs))) {
        Ok(k) => facts.kernel = Some(k),
        Err(e) => {
            let denied = matches!(&e, crate::Error::NftRejected { errno, .. } if *errno == libc::EPERM)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn timeout(ipv6: bool, errno: Option<i32>, connected: u32) -> ProbeFailure {
        ProbeFailure::Timeout {
            after: Duration::from_secs(1),
            ipv6,
            probe_port: 15002,
            attempts: 10,
            connected,
            listening: vec![15001, 15006],
            listen_errors: Vec::new(),
            last_connect_error: errno.map(io::Error::from_raw_os_error),
            wrong_destinations: Vec::new(),
        }
    }

    fn proxy() -> Facts {
        Facts {
            uid: 1337,
            gid: 1337,
            proxy_uids: vec![1337],
            proxy_gids: vec![1337],
            ..Facts::default()
        }
    }

    #[test]
    fn each_cause_from_its_evidence() {
        let refused = timeout(false, Some(libc::ECONNREFUSED), 0);
        assert_eq!(diagnose(&refused, &proxy()).cause, Cause::NoRules);
        let other = Facts {
            uid: 1000,
            gid: 1000,
            ..proxy()
        };
        assert_eq!(diagnose(&refused, &other).cause, Cause::NotProxyUid);
        // A proxy GID is enough, as the rules match either.
        let by_gid = Facts { uid: 5, ..proxy() };
        assert_eq!(diagnose(&refused, &by_gid).cause, Cause::NoRules);
        // Confirmed empty wins over the UID: with no rules nothing else matters.
        let empty = Facts {
            kernel: Some(KernelView::default()),
            ..other.clone()
        };
        let d = diagnose(&refused, &empty);
        assert_eq!(d.cause, Cause::NoRules);
        assert!(d.summary.contains("confirmed"), "{}", d.summary);
        let stale = Facts {
            kernel: Some(KernelView {
                our_table: true,
                our_families: vec![Family::V4],
                differences: vec![Difference::ChainMissing {
                    chain: "nat_ip_istio_output".into(),
                }],
                ..KernelView::default()
            }),
            ..proxy()
        };
        let d = diagnose(&refused, &stale);
        assert_eq!(d.cause, Cause::RulesStale);
        assert!(d.evidence.iter().any(|e| e.contains("nat_ip_istio_output")));
        let istio = Facts {
            kernel: Some(KernelView {
                istio_iptables: vec![
                    "IPv4 legacy nat ISTIO_OUTPUT: 3 rule(s), 1 jump(s) to it".into()
                ],
                ..KernelView::default()
            }),
            ..proxy()
        };
        assert_eq!(diagnose(&refused, &istio).cause, Cause::RulesNotOurs);
        let dropped = timeout(false, Some(libc::ETIMEDOUT), 0);
        let mut f = timeout(false, None, 0);
        assert_eq!(diagnose(&dropped, &proxy()).cause, Cause::RulesStale);
        // Nothing known at all.
        assert_eq!(diagnose(&f, &proxy()).cause, Cause::Unknown);
        if let ProbeFailure::Timeout {
            last_connect_error, ..
        } = &mut f
        {
            *last_connect_error = Some(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
        }
        assert_eq!(diagnose(&f, &proxy()).cause, Cause::RulesStale);
        if let ProbeFailure::Timeout {
            wrong_destinations, ..
        } = &mut f
        {
            wrong_destinations.push(SocketAddr::from(([127, 0, 0, 6], 80)));
        }
        assert_eq!(diagnose(&f, &proxy()).cause, Cause::RulesStale);
        let v6 = timeout(true, Some(libc::ENETUNREACH), 0);
        assert_eq!(diagnose(&v6, &proxy()).cause, Cause::Ipv6RulesMissing);
        let v6_refused = timeout(true, Some(libc::ECONNREFUSED), 0);
        let v4_works = Facts {
            ipv4_probe_passed: Some(true),
            lo_has_v6: Some(true),
            ..proxy()
        };
        assert_eq!(
            diagnose(&v6_refused, &v4_works).cause,
            Cause::Ipv6RulesMissing
        );
        let mut taken = timeout(false, None, 3);
        if let ProbeFailure::Timeout { listen_errors, .. } = &mut taken {
            listen_errors.push((15006, io::Error::from_raw_os_error(libc::EADDRINUSE)));
        }
        let d = diagnose(&taken, &proxy());
        assert_eq!(d.cause, Cause::ListenerPortTaken);
        assert!(d.summary.contains("15006"), "{}", d.summary);
        let none = ProbeFailure::NoListener {
            errors: vec![(15001, io::Error::from_raw_os_error(libc::EADDRINUSE))],
        };
        assert_eq!(diagnose(&none, &proxy()).cause, Cause::ListenerPortTaken);
    }
}
