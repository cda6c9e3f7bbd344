//! Why Istio's validation probe failed, in an operator's terms: which of the likely causes the
//! evidence points to, and what to do about it.
//!
//! The probe runs unprivileged, so most evidence is what its own connections saw (refused, no
//! answer, answered by someone else, redirected elsewhere), who it runs as, and whether `::6` is
//! on `lo`. When it can read nf_tables (CAP_NET_ADMIN: run as root, or `inspect` on the node), the
//! rules themselves confirm or refine the cause.
//!
//! Here: the evidence (`Facts`), the causes, and `diagnose`, which tries the checks in order;
//! `gather` collects the facts from the system, `causes` tells each cause in words.

use std::fmt;
use std::io;
use std::mem::take;
use std::net::SocketAddr;

use serde::Serialize;

use crate::validation::probe::ProbeFailure;
use redirect_kernel::nft::{Difference, TableState};
use redirect_model::Family;

use causes::{
    ipv6_not_programmed, ipv6_unreachable, no_rules, not_proxy_uid, port_taken, rules_not_ours,
    stale, table_differs, unknown,
};

mod causes;
mod gather;

pub use gather::{gather_facts, read_kernel};

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
    /// The cause's stable name, as in JSON output (`no_rules`, `rules_stale`, ...).
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
    /// The cause the evidence points to.
    pub cause: Cause,
    /// What happened, in one sentence.
    pub summary: String,
    /// What to do about it.
    pub fix: String,
    /// What the diagnosis rests on: the failure's own account first, then what else was seen.
    pub evidence: Vec<String>,
}

/// What the probe's process knows besides the probe's own result.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// The UID the probe ran as.
    pub uid: u32,
    /// The GID the probe ran as.
    pub gid: u32,
    /// The config's proxy UIDs (`-u`), which the rules let through to the redirect.
    pub proxy_uids: Vec<u32>,
    /// The config's proxy GIDs (`-g`).
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
    /// Whether our table is there.
    pub our_table: bool,
    /// Families our table has chains for.
    pub our_families: Vec<Family>,
    /// Our table against the plan (`TableMissing` when there is none); empty when equal or
    /// when no plan was given.
    pub differences: Vec<Difference>,
    /// Istio's nftables tables (`inet istio-*`).
    pub istio_nft_tables: Vec<String>,
    /// Istio's iptables chains, as `IPv4 nft nat ISTIO_OUTPUT: 9 rule(s), ...`.
    pub istio_iptables: Vec<String>,
    /// What could not be read (e.g. no iptables binary to list Istio's chains with).
    pub unread: Vec<String>,
}

impl KernelView {
    /// Whether Istio's rules are there, as nft tables or iptables chains.
    pub fn has_istio_rules(&self) -> bool {
        !self.istio_nft_tables.is_empty() || !self.istio_iptables.is_empty()
    }
}

/// The parts of a timed-out probe that tell the causes apart.
struct TimedOut<'a> {
    ipv6: bool,
    connected: u32,
    /// The capture ports the probe could not listen on.
    taken: Vec<u16>,
    last_connect_error: Option<&'a io::Error>,
    wrong_destinations: &'a [SocketAddr],
    /// Where the probe connected to, for the texts.
    target: String,
}

/// A check: the diagnosis when its evidence holds (adding to the evidence), else `None`.
type Check = fn(&TimedOut, &Facts, &mut Vec<String>) -> Option<Diagnosis>;

/// The most likely cause of `failure`.
pub fn diagnose(failure: &ProbeFailure, facts: &Facts) -> Diagnosis {
    let t = match failure {
        ProbeFailure::NoListener { errors } => {
            // Listen errors are part of the failure's text.
            let taken: Vec<u16> = errors.iter().map(|(p, _)| *p).collect();
            return port_taken(vec![failure.to_string()], &taken);
        }
        ProbeFailure::Timeout {
            ipv6,
            probe_port,
            connected,
            listen_errors,
            last_connect_error,
            wrong_destinations,
            ..
        } => TimedOut {
            ipv6: *ipv6,
            connected: *connected,
            taken: listen_errors.iter().map(|(p, _)| *p).collect(),
            last_connect_error: last_connect_error.as_ref(),
            wrong_destinations,
            target: if *ipv6 {
                format!("[::6]:{probe_port}")
            } else {
                format!("127.0.0.6:{probe_port}")
            },
        },
    };
    // The failure's own account first (attempts, connections, last error, listeners).
    let mut evidence = vec![failure.to_string()];
    if let Some(why) = &facts.kernel_unreadable {
        evidence.push(format!("rules not read ({why})"));
    }
    // In this order: each check is only reached when the ones before found nothing.
    let checks: [Check; 6] = [
        confirmed_no_rules,
        not_proxy,
        listener_taken,
        ipv6_missing,
        rules_read,
        connections,
    ];
    for check in checks {
        if let Some(d) = check(&t, facts, &mut evidence) {
            return d;
        }
    }
    unknown(evidence)
}

/// Rules read and none there: nothing else matters.
fn confirmed_no_rules(
    t: &TimedOut,
    facts: &Facts,
    evidence: &mut Vec<String>,
) -> Option<Diagnosis> {
    let k = facts
        .kernel
        .as_ref()
        .filter(|k| !k.our_table && !k.has_istio_rules())?;
    evidence.push(
        "nf_tables holds no table of ours and no Istio rules (iptables legacy or nft)".into(),
    );
    evidence.extend(k.unread.iter().map(|u| format!("not read: {u}")));
    Some(no_rules(take(evidence), &t.target, true))
}

/// Who the probe runs as decides whether any rule may redirect it at all.
fn not_proxy(_: &TimedOut, facts: &Facts, evidence: &mut Vec<String>) -> Option<Diagnosis> {
    let proxy = facts.proxy_uids.contains(&facts.uid) || facts.proxy_gids.contains(&facts.gid);
    (!proxy).then(|| not_proxy_uid(facts, take(evidence)))
}

/// A capture port held by someone else, who answered the probe's connections.
fn listener_taken(t: &TimedOut, _: &Facts, evidence: &mut Vec<String>) -> Option<Diagnosis> {
    (!t.taken.is_empty() && t.connected > 0).then(|| port_taken(take(evidence), &t.taken))
}

/// An IPv6 probe where `::6`, the IPv4 probe or our table shows IPv6 capture missing.
fn ipv6_missing(t: &TimedOut, facts: &Facts, evidence: &mut Vec<String>) -> Option<Diagnosis> {
    if !t.ipv6 {
        return None;
    }
    let no_lo6 = facts.lo_has_v6 == Some(false);
    let v4_ok = facts.ipv4_probe_passed == Some(true);
    let no_v6_table = facts
        .kernel
        .as_ref()
        .is_some_and(|k| k.our_table && !k.our_families.contains(&Family::V6));
    if !(no_lo6 || v4_ok || no_v6_table) {
        return None;
    }
    // Neither ::6 nor IPv4 capture: not an IPv6 problem, no capture at all (the pod missed
    // the plugin). `no_rules` leads to the fix for that.
    let our_table = facts.kernel.as_ref().is_some_and(|k| k.our_table);
    if no_lo6 && facts.ipv4_probe_passed == Some(false) && !our_table {
        evidence.push("::6 is not on lo".into());
        evidence.push(
            "the same probe over IPv4 (127.0.0.6) failed too: nothing is captured in either family"
                .into(),
        );
        return Some(no_rules(take(evidence), &t.target, false));
    }
    if no_lo6 {
        evidence.push("::6 is not on lo".into());
    }
    if v4_ok {
        evidence.push("the same probe over IPv4 (127.0.0.6) passed".into());
    }
    if no_v6_table {
        evidence.push("our table has IPv4 chains only".into());
    }
    Some(ipv6_not_programmed(take(evidence)))
}

/// The rules, when read: our table differs from the plan, or only Istio's rules are there.
fn rules_read(_: &TimedOut, facts: &Facts, evidence: &mut Vec<String>) -> Option<Diagnosis> {
    let k = facts.kernel.as_ref()?;
    if k.our_table && !k.differences.is_empty() {
        evidence.extend(k.differences.iter().take(5).map(|d| d.to_string()));
        return Some(table_differs(k, take(evidence)));
    }
    if !k.our_table && k.has_istio_rules() {
        evidence.extend(
            k.istio_nft_tables
                .iter()
                .map(|t| format!("Istio nft table {t}")),
        );
        evidence.extend(k.istio_iptables.iter().cloned());
        return Some(rules_not_ours(take(evidence)));
    }
    None
}

/// What the probe's connections saw: redirected elsewhere, refused, unreachable, answered by
/// someone else, or not answered.
fn connections(t: &TimedOut, _: &Facts, evidence: &mut Vec<String>) -> Option<Diagnosis> {
    if !t.wrong_destinations.is_empty() {
        let seen: Vec<String> = t.wrong_destinations.iter().map(|a| a.to_string()).collect();
        evidence.push(format!(
            "connections arrived with original destination {}",
            seen.join(", ")
        ));
        return Some(stale(
            take(evidence),
            "rules redirect the probe's connections, but not as this configuration says",
        ));
    }
    let errno = t.last_connect_error.and_then(io::Error::raw_os_error);
    let unanswered = t
        .last_connect_error
        .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut);
    if errno == Some(libc::ECONNREFUSED) {
        return Some(no_rules(take(evidence), &t.target, false));
    }
    let unreachable = [libc::ENETUNREACH, libc::EADDRNOTAVAIL, libc::EHOSTUNREACH];
    if t.ipv6 && errno.is_some_and(|e| unreachable.contains(&e)) {
        return Some(ipv6_unreachable(take(evidence)));
    }
    if t.connected > 0 {
        return Some(stale(
            take(evidence),
            "something accepted the probe's connections but not the probe's listeners: rules redirect them to other ports than -p/-z say",
        ));
    }
    if unanswered {
        return Some(stale(
            take(evidence),
            "connections to the probe address got no answer: rules drop or divert them",
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
        // An IPv6 pod with no capture at all: no ::6, and IPv4 not captured either.
        let nothing = Facts {
            ipv4_probe_passed: Some(false),
            lo_has_v6: Some(false),
            ..proxy()
        };
        let d = diagnose(&v6, &nothing);
        assert_eq!(d.cause, Cause::NoRules, "{d:?}");
        assert!(
            d.evidence.iter().any(|e| e.contains("either family")),
            "{d:?}"
        );
        // ::6 missing while IPv4 is captured stays an IPv6 problem.
        let v4_only = Facts {
            ipv4_probe_passed: Some(true),
            lo_has_v6: Some(false),
            ..proxy()
        };
        assert_eq!(diagnose(&v6, &v4_only).cause, Cause::Ipv6RulesMissing);
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
