//! Each cause told in an operator's words: what happened and what to do. Kept apart from the
//! decision (`diagnose`) so the order of the checks reads without the long texts in between.

use super::{Cause, Diagnosis, Facts, KernelView};

pub(super) const INSPECT: &str = "on the node, `redirect-validate inspect --netns /proc/<pid>/ns/net` with this pod's flags shows the rules and how they differ";

pub(super) fn no_rules(evidence: Vec<String>, target: &str, confirmed: bool) -> Diagnosis {
    Diagnosis {
        cause: Cause::NoRules,
        summary: format!(
            "no capture rules in this pod's network namespace: the connection to {target} was refused, not redirected{}",
            if confirmed { " (confirmed by reading nf_tables)" } else { "" }
        ),
        fix: format!(
            "the rules were never programmed: the pod was most likely scheduled before redirect-cni was installed on its node (or its init container did not run). The node agent's repair controller (redirect-cni-node) programs such a pod in place by default, and it passes at this container's next restart; without the controller, delete the pod so it is set up again. To confirm: {INSPECT}"
        ),
        evidence,
    }
}

pub(super) fn not_proxy_uid(facts: &Facts, evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
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
    }
}

/// IPv6 capture missing, from what the process saw of `::6`, the IPv4 probe or our table.
pub(super) fn ipv6_not_programmed(evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
        cause: Cause::Ipv6RulesMissing,
        summary: "the pod's address is IPv6 but IPv6 capture is missing: the rules were programmed for IPv4 only, or without ::6 on lo (the address Envoy's inbound passthrough and this probe use)".into(),
        fix: "program the rules for IPv6: they follow the pod's address (Istio's ENABLE_INBOUND_IPV6; with dual-stack pods, --dual-stack / ISTIO_DUAL_STACK or the plugin's dual_stack); rerun redirect-init in the pod, or delete the pod so redirect-cni sets it up again".into(),
        evidence,
    }
}

/// IPv6 capture missing, from the probe's own connect error.
pub(super) fn ipv6_unreachable(evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
        cause: Cause::Ipv6RulesMissing,
        summary: "[::6] is not reachable over lo: IPv6 capture is not set up (no IPv6 rules, or ::6 missing from lo)".into(),
        fix: "program the rules for IPv6 (they follow the pod's address; see ENABLE_INBOUND_IPV6 and dual-stack) and check that `ip -6 addr show dev lo` lists ::6".into(),
        evidence,
    }
}

/// Our table, read, differs from the plan.
pub(super) fn table_differs(k: &KernelView, evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
        cause: Cause::RulesStale,
        summary: format!(
            "our table is here but differs from this configuration in {} place(s): the rules are stale or were changed by hand",
            k.differences.len()
        ),
        fix: "reapply with this configuration: redirect-init --reconcile in the pod, or delete the pod so redirect-cni sets it up again; check that the validation container has the same flags as the init container or plugin".into(),
        evidence,
    }
}

pub(super) fn rules_not_ours(evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
        cause: Cause::RulesNotOurs,
        summary: "Istio's own rules are here, not ours, and they do not redirect the probe: they were written for another configuration (proxy UID, ports) or by another iptables variant".into(),
        fix: "replace them: redirect-init --reconcile with this pod's flags (or --cleanup-only, then apply); after moving a node from istio-cni to redirect-cni, delete the pods that istio-cni set up".into(),
        evidence,
    }
}

/// Rules are there (the connections say so) but not as planned.
pub(super) fn stale(evidence: Vec<String>, why: &str) -> Diagnosis {
    Diagnosis {
        cause: Cause::RulesStale,
        summary: format!("rules are present but not as this configuration plans: {why}"),
        fix: format!(
            "check that the validation container has the same -p/-z/-u flags as the init container or plugin, and reapply (redirect-init --reconcile, or delete the pod). {INSPECT}"
        ),
        evidence,
    }
}

pub(super) fn port_taken(evidence: Vec<String>, ports: &[u16]) -> Diagnosis {
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

pub(super) fn unknown(evidence: Vec<String>) -> Diagnosis {
    Diagnosis {
        cause: Cause::Unknown,
        summary: "the probe failed in a way that matches no known cause".into(),
        fix: INSPECT.into(),
        evidence,
    }
}

fn list(ids: &[u32]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
