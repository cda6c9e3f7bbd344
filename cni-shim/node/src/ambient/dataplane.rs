//! One node's ambient data plane, whatever asked for the change (the pod watch, the plugin's
//! ADD, the periodic pass): each enrolled pod's namespace held open, its in-pod rules, the
//! host's probe SNAT sets, and ztunnel told over ZDS. The order is Istio's: rules in the pod,
//! then ztunnel's ack; removal the other way round (rules left alone in a pod being deleted:
//! its namespace goes with it).
//!
//! What it reports is read back, never remembered: a pod's stage is what the current ZDS
//! connection acked, its rules are what the last read found, the host table is what the
//! kernel holds. [`Dataplane::pass`] reads everything back and converges the difference (a
//! deleted table recreated, a pod's rules reprogrammed, what ztunnel has not acked sent
//! again), each repair returned for the log and the metrics.
//!
//! Everything here blocks (netlink, ZDS's 5 s deadlines): it lives on a thread of its own
//! (`dataplane_thread`), where the controller's calls are served one change at a time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use redirect_core::foreign::ForeignRules;
use redirect_core::{AmbientConfig, Apply, Capture, Foreign, HostProbeConfig, Namespace, Netns};

use crate::adopt::AdoptIstio;

pub(crate) use crate::node_view::{
    HostView, ReadBack, Repair, RepairKind, SyntheticView, ZtunnelView,
};
use redirect_core::synthetic::Outcome;

use super::branch_eni::{self, BranchEniRules};
use super::error::{AddError, AmbientError};
use super::identity::Binding;
use super::listeners::{self, PodListeners};
use super::synthetic::{self, Checked, SyntheticCheck};
use zds::proto::WorkloadInfo;
use zds::server::{Delivery, Held, ZdsError, ZdsServer};

/// Ambient's policy over what a namespace holds when nothing is adopted (`ADOPT_ISTIO` keep or
/// off), and always for the host's probe table: capture rules another layer wrote (Istio's
/// in-pod rules, its host probe chain) are kept as they are, and nothing is read for them (at
/// no cost per pass); our own tables are updated in place. With `ADOPT_ISTIO=replace` a pod's
/// rules are applied with `Foreign::Replace` ([`Dataplane::apply_pod`]), and Istio's host
/// rules are removed once ours hold ([`Dataplane::set_host_probe`]).
const AMBIENT_POLICY: Apply = Apply::foreign(Foreign::Keep);

/// Who a pod is, for ztunnel and the logs; `ips` are the addresses checked to be its
/// namespace's (those in the host's probe sets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub service_account: String,
    pub ips: Vec<IpAddr>,
}

impl PodRef {
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn info(&self) -> WorkloadInfo {
        WorkloadInfo {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
        }
    }
}

/// Where an enrolled pod stands with ztunnel, as the current connection's answers say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The current connection acked it: `ambient.istio.io/redirection: enabled`.
    Enabled,
    /// A ztunnel is connected and has not acked it (refused, or not sent yet): `pending`.
    Pending,
    /// No ztunnel is connected: nobody to ask (the annotation is left as it is).
    Disconnected,
}

/// What to do with rules already in the pod's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// Program them (a new pod).
    Apply,
    /// Program them only if they differ (a pod enrolled before the agent started).
    KeepIfSame,
    /// Leave them as they are (`AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=false`); a table
    /// someone deletes later is still put back.
    Leave,
}

/// What the data plane holds of an enrolled pod.
struct Enrolled {
    pod: PodRef,
    /// The namespace held open; `None`: not found (ztunnel is told to keep the pod).
    netns: Option<Netns>,
    /// Its netlink sockets, kept open for the passes (opened at the first one).
    kernel: Option<Namespace>,
    /// The ruleset generation at which its table last read back equal.
    seen: Option<u32>,
    binding: Option<Binding>,
    cfg: AmbientConfig,
    /// The rules were left as found at start: only a missing table is put back.
    leave: bool,
    rules: Option<ReadBack>,
    repair: Option<Repair>,
    /// ztunnel's listeners in its namespace, as last read.
    listeners: PodListeners,
    /// The last synthetic check (`AMBIENT_SYNTHETIC_CHECK`).
    synthetic: Option<Checked>,
    /// The last pass found its sandbox torn down (logged once).
    torn_down: bool,
    /// Its counters per path as last read (`CAPTURE_COUNTERS`), and when.
    counts: Option<(redirect_core::PathCounts, Instant)>,
}

impl Enrolled {
    /// Reads its counters (`CAPTURE_COUNTERS`) when its table is `equal` to the plan (each
    /// counter sits where the plan puts it), at most once `every`: a read is a rule dump.
    fn read_counts(&mut self, equal: bool, every: std::time::Duration) {
        let due = self.counts.is_none_or(|(_, at)| at.elapsed() >= every);
        if !self.cfg.counters || !equal {
            self.counts = None;
        } else if let (true, Some(ns)) = (due, &self.kernel) {
            let read = ns.path_counts(&Capture::Ambient(self.cfg.clone()));
            self.counts = read.ok().flatten().map(|c| (c, Instant::now()));
        }
    }

    /// Opens its netlink sockets (`kernel`) unless they are open: `None` for a pod whose
    /// namespace is not held.
    fn open_kernel(&mut self) -> Option<redirect_core::Result<()>> {
        let netns = self.netns.as_ref()?;
        if self.kernel.is_none() {
            match namespace(netns) {
                Ok(ns) => self.kernel = Some(ns),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(()))
    }
}

/// One pod as the data plane holds it, for the node view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PodState {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
    /// The namespace held (where it was found), `None` while ztunnel keeps the pod unseen.
    pub netns: Option<String>,
    pub binding: Option<Binding>,
    pub rules: Option<ReadBack>,
    pub repair: Option<Repair>,
    pub ztunnel: ZtunnelView,
    pub synthetic_check: Option<SyntheticView>,
}

/// What one pass read and put right.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Each repair, with the pod's label (or `host`).
    pub repairs: Vec<(String, Repair)>,
    /// What could not be read or put right (tried again on the next pass).
    pub problems: Vec<String>,
    /// Pods whose rules were read back.
    pub checked: usize,
    /// The synthetic check of this pass: the pod's label, whether its last check was ok
    /// (`None`: its first), and the outcome.
    pub synthetic: Option<(String, Option<bool>, Outcome)>,
    pub took: std::time::Duration,
}

/// The node's enrolled pods, the ZDS server that hands them to ztunnel, and the host's probe
/// SNAT (kubelet's probes to an enrolled pod's addresses come from the address its rules let
/// through).
pub struct Dataplane {
    zds: ZdsServer,
    pods: BTreeMap<String, Enrolled>,
    /// `None`: kubelet was not found; probes reach the pods unchanged (and are captured).
    probe: Option<HostProbeConfig>,
    host: HostView,
    /// Repairs made between passes (an ADD that found the host table gone), reported by the
    /// next pass.
    between: Vec<(String, Repair)>,
    /// `ADOPT_ISTIO`: what to do with Istio's in-pod and host rules.
    adopt: AdoptIstio,
    /// Where each adopted pod's form is recorded for a hand-back (`crate::adopted_forms`).
    records: Option<PathBuf>,
    /// The ip rules for kubelet's probes to pods behind an AWS branch ENI.
    branch_eni: BranchEniRules,
    /// `AMBIENT_CHECK_LISTENERS`: ztunnel's listeners read in each acked pod.
    check_listeners: bool,
    /// `AMBIENT_SYNTHETIC_CHECK`, and the pod the last rotation checked.
    synthetic: SyntheticCheck,
    synthetic_last: Option<String>,
    /// The node's ruleset generation at which the host table last read back equal.
    host_seen: Option<u32>,
    /// `CAPTURE_COUNTERS_INTERVAL`: how often a pod's counters are read.
    counters_every: std::time::Duration,
}

/// `CAPTURE_COUNTERS_INTERVAL`'s default.
const DEFAULT_COUNTERS_EVERY: std::time::Duration = std::time::Duration::from_secs(15);

impl Dataplane {
    pub fn new(zds: ZdsServer) -> Dataplane {
        Dataplane {
            zds,
            pods: BTreeMap::new(),
            probe: None,
            host: HostView::default(),
            between: Vec::new(),
            adopt: AdoptIstio::Off,
            records: None,
            branch_eni: BranchEniRules::new(false),
            check_listeners: false,
            synthetic: SyntheticCheck::Off,
            synthetic_last: None,
            host_seen: None,
            counters_every: DEFAULT_COUNTERS_EVERY,
        }
    }

    /// The same, reading each pod's counters (`CAPTURE_COUNTERS`, when its rules carry them) at
    /// most once every `every` (`CAPTURE_COUNTERS_INTERVAL`): a read is a dump of its rules.
    pub fn with_counters_every(mut self, every: std::time::Duration) -> Dataplane {
        self.counters_every = every;
        self
    }

    /// The same, reading ztunnel's listeners in each acked pod when `enabled`
    /// (`AMBIENT_CHECK_LISTENERS`): a pod lacking them is `pending`, and sent again.
    pub fn with_listener_check(mut self, enabled: bool) -> Dataplane {
        self.check_listeners = enabled;
        self
    }

    /// The same, with a synthetic check each pass as `setting` says (`AMBIENT_SYNTHETIC_CHECK`).
    pub fn with_synthetic_check(mut self, setting: SyntheticCheck) -> Dataplane {
        self.synthetic = setting;
        self
    }

    /// The synthetic check of this pass: the pod the setting picks (one `enabled` pod in
    /// turn, or the one named) with its namespace held. Observational: no state changes.
    fn synthetic_check(&mut self, report: &mut PassReport) {
        if !self.synthetic.is_on() {
            return;
        }
        let candidates: Vec<(String, String, bool)> = self
            .pods
            .iter()
            .filter(|(_, e)| e.netns.is_some())
            .map(|(u, e)| {
                (
                    u.clone(),
                    e.pod.label(),
                    self.stage(u) == Some(Stage::Enabled),
                )
            })
            .collect();
        let last = self.synthetic_last.as_deref();
        let Some(uid) = synthetic::pick(&self.synthetic, &candidates, last).map(str::to_owned)
        else {
            return;
        };
        let Some(e) = self.pods.get_mut(&uid) else {
            return;
        };
        let Some(netns) = e.netns.as_ref() else {
            return;
        };
        let checked = synthetic::run(netns, &e.pod.ips);
        let before = e.synthetic.as_ref().map(|c| c.outcome.is_ok());
        report.synthetic = Some((e.pod.label(), before, checked.outcome.clone()));
        e.synthetic = Some(checked);
        self.synthetic_last = Some(uid);
    }

    /// The same, with the ip rules for pods behind an AWS branch ENI when `enabled`
    /// (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`); off, any of ours left on the node are removed.
    pub fn with_branch_eni(mut self, enabled: bool) -> Dataplane {
        self.branch_eni = BranchEniRules::new(enabled);
        self
    }

    /// The branch-ENI probe rules brought to every enrolled pod's addresses: what changed.
    fn converge_branch_eni(&mut self) -> Result<redirect_core::branch_eni::Changed, String> {
        let ips: Vec<IpAddr> = self
            .pods
            .values()
            .flat_map(|e| e.pod.ips.iter().copied())
            .collect();
        let changed = self.branch_eni.converge(&ips).map_err(|e| e.to_string());
        self.host.branch_eni_rules = self
            .branch_eni
            .found
            .iter()
            .flat_map(|b| b.rules())
            .map(|r| r.to_string())
            .collect();
        changed
    }

    /// The same after pod `label` came or went, logged: a failure costs the pod kubelet's
    /// probes (if it is behind a branch ENI) until a pass puts it right, not its enrollment.
    fn branch_eni_after(&mut self, label: &str) {
        match self.converge_branch_eni() {
            Ok(c) if c == Default::default() => {}
            Ok(c) => tracing::info!(
                "ambient: pod {label}: branch-ENI probe rules {}",
                branch_eni::words(&c)
            ),
            Err(e) => tracing::warn!(
                "ambient: pod {label}: the branch-ENI probe rules: {e}; kubelet's probes to a \
                 pod behind a branch ENI may fail until the next pass"
            ),
        }
    }

    /// The same, taking Istio's rules over as `adopt` says (`ADOPT_ISTIO`), each adopted
    /// pod's form recorded in `records` (the run dir's `adopted/`).
    pub fn with_adoption(mut self, adopt: AdoptIstio, records: Option<PathBuf>) -> Dataplane {
        self.adopt = adopt;
        self.records = records;
        self
    }

    /// Applies ambient `cfg` in a pod's namespace: with `ADOPT_ISTIO=replace`, Istio's in-pod
    /// rules found there are removed once ours hold (those that cannot be removed here are
    /// kept, with a warning); returns what of Istio's went.
    fn apply_pod(
        adopt: AdoptIstio,
        ns: &Namespace,
        cfg: &AmbientConfig,
        label: &str,
    ) -> redirect_core::Result<ForeignRules> {
        let capture = Capture::Ambient(cfg.clone());
        if adopt != AdoptIstio::Replace {
            ns.apply_with(&capture, AMBIENT_POLICY)?;
            return Ok(ForeignRules::default());
        }
        match ns.apply_with(&capture, Apply::foreign(Foreign::Replace)) {
            Ok(applied) => Ok(applied.foreign_removed),
            Err(redirect_core::Error::Refused(r)) if r.foreign().is_some() => {
                tracing::warn!(
                    "ambient: pod {label}: Istio's in-pod rules are kept beside ours: {r}"
                );
                ns.apply_with(&capture, AMBIENT_POLICY)?;
                Ok(ForeignRules::default())
            }
            Err(e) => Err(e),
        }
    }

    /// The repair that records an adoption, logged, and the form the pod held recorded for
    /// a hand-back.
    fn adopted(
        records: Option<&Path>,
        (uid, label): (&str, &str),
        removed: &ForeignRules,
    ) -> Option<Repair> {
        if removed.is_empty() {
            return None;
        }
        if let Some(dir) = records {
            if let Err(e) =
                crate::adopted_forms::record(dir, uid, crate::adopted_forms::form(removed))
            {
                let e = redirect_program::errors::chain(&e);
                tracing::warn!(
                    "ambient: pod {label}: its form is not recorded for a hand-back: {e}"
                );
            }
        }
        tracing::info!(
            "ambient: pod {label} adopted: it held Istio's in-pod rules ({removed}), removed once \
             ours held"
        );
        Some(Repair {
            at: SystemTime::now(),
            kind: RepairKind::Adopted,
            why: format!("held Istio's in-pod rules ({removed}): replaced by ours"),
        })
    }

    /// Programs the host's probe SNAT in the agent's namespace (the node's), its address sets
    /// empty: the pods enrolled after this fill them.
    pub fn set_host_probe(&mut self, cfg: HostProbeConfig) -> redirect_core::Result<()> {
        Namespace::current()?.apply_with(
            &Capture::HostProbe {
                config: cfg.clone(),
                members: Vec::new(),
            },
            AMBIENT_POLICY,
        )?;
        self.probe = Some(cfg);
        self.host.configured = true;
        self.host.members = Some(Vec::new());
        self.host.checked_at = Some(SystemTime::now());
        if self.adopt == AdoptIstio::Replace {
            self.remove_istio_host();
        }
        Ok(())
    }

    /// Istio's probe SNAT on the node (its chain or table, its IP sets), removed now that ours
    /// holds: both would SNAT the same probes, and Istio's would stay forever. A failure is
    /// logged, not fatal: Istio's rules SNAT to the same address as ours.
    fn remove_istio_host(&mut self) {
        let went = Namespace::current().and_then(|ns| ns.remove_istio_host());
        match went {
            Ok(went) if went.is_empty() => {}
            Ok(went) => {
                let unread = &went.rules.unread;
                let mut removed = went.clone();
                removed.rules.unread = Vec::new();
                if !removed.is_empty() {
                    tracing::info!(
                        "ambient: Istio's host probe rules removed, ours hold: {removed}"
                    );
                    self.between.push((
                        "host".into(),
                        Repair {
                            at: SystemTime::now(),
                            kind: RepairKind::Adopted,
                            why: format!("Istio's host probe rules removed: {removed}"),
                        },
                    ));
                }
                if !unread.is_empty() {
                    tracing::warn!(
                        "ambient: the node also holds {}: Istio's probe SNAT may be there; it \
                         SNATs to the same address as ours, and stays",
                        unread.join("; ")
                    );
                }
            }
            Err(e) => tracing::error!(
                "ambient: Istio's host probe rules could not be removed ({}); they SNAT the same \
                 probes as ours and stay",
                redirect_program::errors::chain(&e)
            ),
        }
    }

    pub fn zds(&self) -> &ZdsServer {
        &self.zds
    }

    /// Enrolls `pod` in `netns` (checked to be its, as `binding` says) with `cfg`: its
    /// addresses into the probe sets, the rules as `rules` says, then ztunnel. With no
    /// namespace (not found after the agent's restart), ztunnel is told to keep the pod. A pod
    /// already enrolled is enrolled again in the namespace given (a new sandbox of the same
    /// pod). Returns the stage reached and ztunnel's refusal if it refused.
    pub fn enroll(
        &mut self,
        pod: &PodRef,
        netns: Option<(Netns, Binding)>,
        cfg: &AmbientConfig,
        rules: Rules,
    ) -> Result<(Stage, Option<ZdsError>), AddError> {
        let Some((netns, binding)) = netns else {
            return Ok((self.enroll_kept(pod, cfg, rules), None));
        };
        let where_ = netns.path().display().to_string();
        let fd = netns.try_clone_fd().map_err(|error| AddError::Descriptor {
            netns: where_.clone(),
            error,
        })?;
        let failed = |error| AddError::Rules {
            netns: where_.clone(),
            error,
        };
        let ns = namespace(&netns).map_err(failed)?;
        let mut pod = pod.clone();
        if pod.ips.is_empty() && binding == Binding::Search {
            // Found by its cgroup before kubelet wrote its status: its own addresses.
            pod.ips = super::identity::own_addresses(&netns).unwrap_or_default();
        }
        let pod = &pod;
        self.probe_add(&pod.ips)?;
        let differences = match rules {
            Rules::Apply => vec!["a new pod".to_string()],
            Rules::KeepIfSame => differences(&ns, &Capture::Ambient(cfg.clone())),
            Rules::Leave => Vec::new(),
        };
        let mut adopted = None;
        if !differences.is_empty() {
            let label = pod.label();
            let removed = Self::apply_pod(self.adopt, &ns, cfg, &label).map_err(failed)?;
            adopted = Self::adopted(self.records.as_deref(), (&pod.uid, &label), &removed);
        }
        if let Some(r) = &adopted {
            self.between.push((pod.label(), r.clone()));
        }
        self.pods.insert(
            pod.uid.clone(),
            Enrolled {
                pod: pod.clone(),
                netns: Some(netns),
                kernel: Some(ns),
                seen: None,
                binding: Some(binding),
                cfg: cfg.clone(),
                leave: rules == Rules::Leave,
                rules: Some(ReadBack {
                    at: SystemTime::now(),
                    differences: Vec::new(),
                }),
                repair: adopted,
                listeners: PodListeners::default(),
                synthetic: None,
                torn_down: false,
                counts: None,
            },
        );
        self.branch_eni_after(&pod.label());
        self.zds.set(&pod.uid, pod.info(), Some(fd));
        let refused = self.sync(&pod.uid);
        if let Some(Err(e)) = self.read_listeners(&pod.uid) {
            tracing::warn!("ambient: pod {}: {e}", pod.label());
        }
        Ok((self.stage(&pod.uid).unwrap_or(Stage::Pending), refused))
    }

    /// A pod whose namespace was not found (after the agent's restart): ztunnel is told to
    /// keep it as it has it.
    fn enroll_kept(&mut self, pod: &PodRef, cfg: &AmbientConfig, rules: Rules) -> Stage {
        self.zds.keep(&pod.uid, pod.info());
        self.pods.insert(
            pod.uid.clone(),
            Enrolled {
                pod: pod.clone(),
                netns: None,
                kernel: None,
                seen: None,
                binding: None,
                cfg: cfg.clone(),
                leave: rules == Rules::Leave,
                rules: None,
                repair: None,
                listeners: PodListeners::default(),
                synthetic: None,
                torn_down: false,
                counts: None,
            },
        );
        self.stage(&pod.uid).unwrap_or(Stage::Pending)
    }

    /// Reads ztunnel's listeners in pod `uid`'s namespace when the current connection acked
    /// it (and `AMBIENT_CHECK_LISTENERS` is on): the ports missing, or why they could not be
    /// read; `None` when not read.
    fn read_listeners(
        &mut self,
        uid: &str,
    ) -> Option<Result<Vec<redirect_core::listeners::Port>, String>> {
        if !self.check_listeners || !self.zds.held(uid).acked {
            return None;
        }
        let e = self.pods.get_mut(uid)?;
        let netns = e.netns.as_ref()?;
        let wanted = listeners::wanted(&e.cfg);
        Some(e.listeners.read(netns, &wanted).map_err(|why| {
            format!("ztunnel's listeners in its namespace could not be read: {why}")
        }))
    }

    /// Every acked pod's listeners read; a pod lacking some is sent to ztunnel again (a
    /// `del`, then its add) when its backoff allows, and read once more.
    fn converge_listeners(&mut self, report: &mut PassReport) {
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            let lacking = match self.read_listeners(&uid) {
                None => continue,
                Some(Ok(m)) if m.is_empty() => continue,
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    report.problems.push(format!("pod {uid}: {e}"));
                    continue;
                }
            };
            let Some(e) = self.pods.get_mut(&uid) else {
                continue;
            };
            let label = e.pod.label();
            if !e.listeners.resend_due(Instant::now()) {
                continue;
            }
            let sent = self.zds.readd(&uid);
            let after = self.read_listeners(&uid);
            let outcome = match (&sent, &after) {
                (Err(err), _) => format!(
                    "sending it again failed: {}",
                    redirect_program::errors::chain(err)
                ),
                (Ok(Delivery::Queued), _) => "no ztunnel to send it to now".into(),
                (Ok(Delivery::Acked), Some(Ok(m))) if m.is_empty() => {
                    "sent again (del, add): acked, and its listeners are back".into()
                }
                (Ok(Delivery::Acked), Some(Ok(m))) => format!(
                    "sent again (del, add): acked, but {} still missing",
                    listeners::words(m)
                ),
                (Ok(Delivery::Acked), _) => "sent again (del, add): acked".into(),
            };
            let repair = Repair {
                at: SystemTime::now(),
                kind: RepairKind::Listeners,
                why: format!(
                    "ztunnel acked it but its listeners {} were missing in its namespace; {outcome}",
                    listeners::words(&lacking)
                ),
            };
            if let Some(e) = self.pods.get_mut(&uid) {
                e.repair = Some(repair.clone());
            }
            report.repairs.push((label, repair));
        }
    }

    /// Sends the pod to ztunnel unless the current connection acked it; its refusal.
    fn sync(&self, uid: &str) -> Option<ZdsError> {
        self.zds.sync(uid).err()
    }

    /// The pod's addresses into the host's probe sets (before its rules, as Istio). When the
    /// table is gone (a firewall reload), it comes back with every enrolled pod's addresses
    /// and these, in one batch.
    fn probe_add(&mut self, ips: &[IpAddr]) -> Result<(), AddError> {
        let Some(cfg) = &self.probe else {
            return Ok(());
        };
        let ips: Vec<IpAddr> = probed(cfg, ips).collect();
        let added = Namespace::current().and_then(|ns| ns.add_members(cfg, &ips));
        if matches!(added, Ok(false)) {
            return Ok(());
        }
        // The table was gone (created with these addresses alone), or the add failed: the
        // table brought to every enrolled pod's addresses.
        let gone = matches!(added, Ok(true));
        match self.converge_host(&ips, gone) {
            Ok(repair) => {
                self.between.extend(repair.map(|r| ("host".to_string(), r)));
                Ok(())
            }
            Err(error) => Err(AddError::Probe {
                ips: format!("{ips:?}"),
                error,
            }),
        }
    }

    /// Reads the host table back and brings it to every enrolled pod's addresses (with
    /// `extra`): recreated whole when it is gone, the missing addresses added and those of no
    /// enrolled pod removed otherwise. Returns the repair made, if one was needed.
    fn converge_host(
        &mut self,
        extra: &[IpAddr],
        was_gone: bool,
    ) -> redirect_core::Result<Option<Repair>> {
        let Some(cfg) = self.probe.clone() else {
            return Ok(None);
        };
        let mut want: Vec<IpAddr> = self
            .pods
            .values()
            .flat_map(|e| probed(&cfg, &e.pod.ips))
            .chain(probed(&cfg, extra))
            .collect();
        want.sort();
        want.dedup();
        let ns = Namespace::current()?;
        let held = ns.members()?;
        let differs = match &held {
            Some(h) => self.host_differs(&ns, &cfg, h)?,
            None => None,
        };
        let repair = match (held, differs) {
            (None, _) => {
                let why = format!(
                    "the host's probe table was gone (a firewall reload?): recreated with {} \
                     address(es)",
                    want.len()
                );
                Some(reprogram_host(&ns, &cfg, &want, why)?)
            }
            // The table is there: read whole (flags, chains, rules) against its plan with the
            // members it holds; one that differs (chains flushed, made dormant, a rule put
            // before ours) is programmed whole again, with every enrolled pod's addresses.
            (Some(_), Some(found)) => {
                self.host_seen = None;
                let why = format!(
                    "the host's probe table differed from its plan ({}): programmed again with \
                     {} address(es)",
                    summary(&found),
                    want.len()
                );
                Some(reprogram_host(&ns, &cfg, &want, why)?)
            }
            (Some(held), None) => self.converge_members(&ns, &cfg, (&want, &held), was_gone)?,
        };
        self.host.members = Some(want);
        self.host.checked_at = Some(SystemTime::now());
        if repair.is_some() {
            self.host.repair.clone_from(&repair);
        }
        Ok(repair)
    }

    /// The host table's sets brought from `held` to `want`: the missing addresses added,
    /// those of no enrolled pod removed; the repair, if any.
    fn converge_members(
        &self,
        ns: &Namespace,
        cfg: &HostProbeConfig,
        (want, held): (&[IpAddr], &[IpAddr]),
        was_gone: bool,
    ) -> redirect_core::Result<Option<Repair>> {
        let missing: Vec<IpAddr> = want
            .iter()
            .copied()
            .filter(|ip| !held.contains(ip))
            .collect();
        // A pod whose addresses the agent does not know (kept in ztunnel unseen) may own any
        // member: none is taken for stale then.
        let unknown = self.pods.values().any(|e| e.pod.ips.is_empty());
        let stale: Vec<IpAddr> = held
            .iter()
            .copied()
            .filter(|_| !unknown)
            .filter(|ip| !want.contains(ip))
            .collect();
        ns.add_members(cfg, &missing)?;
        ns.remove_members(cfg, &stale)?;
        let at = SystemTime::now();
        Ok(if was_gone {
            Some(Repair {
                at,
                kind: RepairKind::HostTable,
                why: format!(
                    "the host's probe table was gone (a firewall reload?): recreated at an ADD, \
                     with {} address(es)",
                    want.len()
                ),
            })
        } else {
            (!missing.is_empty() || !stale.is_empty()).then(|| Repair {
                at,
                kind: RepairKind::HostMembers,
                why: format!(
                    "the host's probe sets lacked {missing:?} and held {stale:?} of no enrolled \
                     pod"
                ),
            })
        })
    }

    /// How the host's probe table differs from its plan with the members it holds (`None`:
    /// equal). Its dump is skipped while the node's ruleset generation has not moved since it
    /// last read back equal.
    fn host_differs(
        &mut self,
        ns: &Namespace,
        cfg: &HostProbeConfig,
        held: &[IpAddr],
    ) -> redirect_core::Result<Option<Vec<String>>> {
        let host = Capture::HostProbe {
            config: cfg.clone(),
            members: held.to_vec(),
        };
        let (found, seen) = ns.check_since(&host, self.host_seen)?;
        self.host_seen = seen;
        Ok((!found.is_empty()).then(|| found.iter().map(|m| m.to_string()).collect()))
    }

    /// The pod's addresses out of the probe sets, but those another enrolled pod holds (an
    /// address handed to a new pod before the old one was released).
    fn probe_remove(&self, uid: &str, ips: &[IpAddr]) -> Option<AmbientError> {
        let cfg = self.probe.as_ref()?;
        let ips: Vec<IpAddr> = probed(cfg, ips)
            .filter(|ip| {
                !self
                    .pods
                    .iter()
                    .any(|(u, e)| u != uid && e.pod.ips.contains(ip))
            })
            .collect();
        let removed = Namespace::current().and_then(|ns| ns.remove_members(cfg, &ips));
        removed
            .err()
            .map(|error| AmbientError::ProbeRemove { ips, error })
    }

    /// The addresses the API lists for an enrolled pod, once it lists them: checked against
    /// the namespace held, then they replace the checked ones (in the probe sets too).
    /// [`AmbientError::NotItsNamespace`] when the namespace does not hold them: it is not the
    /// pod's, and the caller releases it.
    pub fn confirm(&mut self, uid: &str, api: &[IpAddr]) -> Result<bool, AmbientError> {
        let Some(e) = self.pods.get(uid) else {
            return Ok(false);
        };
        let unconfirmed = matches!(
            e.binding,
            Some(Binding::RequestAddresses | Binding::NamespaceAddresses)
        );
        if api.is_empty() || (e.pod.ips == api && !unconfirmed) {
            return Ok(false);
        }
        let Some(netns) = &e.netns else {
            return Ok(false);
        };
        if !super::identity::holds(netns, api)? {
            return Err(AmbientError::NotItsNamespace {
                netns: netns.path().to_owned(),
                api: api.to_vec(),
            });
        }
        let old = e.pod.ips.clone();
        if let Some(e) = self.pods.get_mut(uid) {
            e.pod.ips = api.to_vec();
            e.binding = Some(Binding::ApiAddresses);
        }
        if old != api {
            self.probe_add(api)?;
            let label = self
                .pods
                .get(uid)
                .map(|e| e.pod.label())
                .unwrap_or_default();
            self.branch_eni_after(&label);
            let gone: Vec<IpAddr> = old.into_iter().filter(|ip| !api.contains(ip)).collect();
            if let Some(p) = self.probe_remove(uid, &gone) {
                return Err(p);
            }
        }
        Ok(true)
    }

    /// Pod `uid`'s in-pod settings, from its annotations now: when they differ from those it
    /// was enrolled with (`ambient.istio.io/dns-capture` changed, say), its rules are
    /// programmed with them in place and its listeners read again. Returns the settings it
    /// had when they changed. A kept pod (namespace not found) only takes them.
    pub fn reconfigure(
        &mut self,
        uid: &str,
        cfg: &AmbientConfig,
    ) -> Result<Option<AmbientConfig>, AddError> {
        let adopt = self.adopt;
        let Some(e) = self.pods.get_mut(uid) else {
            return Ok(None);
        };
        if e.cfg == *cfg {
            return Ok(None);
        }
        if let Some(opened) = e.open_kernel() {
            let failed = |error| AddError::Rules {
                netns: e
                    .netns
                    .as_ref()
                    .map(|n| n.path().display().to_string())
                    .unwrap_or_default(),
                error,
            };
            opened.map_err(failed)?;
            let ns = e.kernel.as_ref().expect("opened above");
            Self::apply_pod(adopt, ns, cfg, &e.pod.label()).map_err(failed)?;
            e.seen = None;
            e.leave = false;
        }
        let was = std::mem::replace(&mut e.cfg, cfg.clone());
        if let Some(Err(why)) = self.read_listeners(uid) {
            tracing::warn!("ambient: pod {uid}: {why}");
        }
        Ok(Some(was))
    }

    /// The namespace of a pod ztunnel was told to keep, found at last: its rules checked (and
    /// programmed when they differ), then sent to ztunnel.
    pub fn adopt(&mut self, uid: &str, netns: Netns, binding: Binding) -> Result<Repair, AddError> {
        let Some(e) = self.pods.get(uid) else {
            return Ok(Repair {
                at: SystemTime::now(),
                kind: RepairKind::Namespace,
                why: "released meanwhile".into(),
            });
        };
        let (pod, cfg) = (e.pod.clone(), e.cfg.clone());
        let rules = if e.leave {
            Rules::Leave
        } else {
            Rules::KeepIfSame
        };
        let at = netns.path().display().to_string();
        self.enroll(&pod, Some((netns, binding)), &cfg, rules)?;
        let repair = Repair {
            at: SystemTime::now(),
            kind: RepairKind::Namespace,
            why: format!("its namespace found at {at}; handed to ztunnel"),
        };
        if let Some(e) = self.pods.get_mut(uid) {
            e.repair = Some(repair.clone());
        }
        Ok(repair)
    }

    /// Releases the pod `uid`: its addresses out of the probe sets, ztunnel told, then
    /// (unless the pod is being deleted) its rules removed. Returns the pod as it was
    /// enrolled, or `None` if it was not.
    pub fn remove(&mut self, uid: &str, deleting: bool) -> Option<(PodRef, Vec<String>)> {
        let mut problems = Vec::new();
        if let Some(p) = self
            .pods
            .get(uid)
            .and_then(|e| self.probe_remove(uid, &e.pod.ips))
        {
            problems.push(p.to_string());
        }
        if let Err(e) = self.zds.del(uid) {
            problems.push(redirect_program::errors::chain(&e));
        }
        let enrolled = self.pods.remove(uid)?;
        self.branch_eni_after(&enrolled.pod.label());
        if !deleting {
            if let Some(netns) = &enrolled.netns {
                let capture = Capture::Ambient(enrolled.cfg.clone());
                if let Err(e) = namespace(netns).and_then(|ns| ns.remove(&capture)) {
                    problems.push(format!("removing the in-pod rules: {e}"));
                }
            }
        }
        Some((enrolled.pod, problems))
    }

    /// One pass: the host table, every pod's rules and what the current ztunnel acked, read
    /// back; every difference put right.
    pub fn pass(&mut self) -> PassReport {
        let started = Instant::now();
        let mut report = PassReport {
            repairs: std::mem::take(&mut self.between),
            ..PassReport::default()
        };
        match self.converge_host(&[], false) {
            Ok(Some(r)) => report.repairs.push(("host".into(), r)),
            Ok(None) => {}
            Err(e) => report.problems.push(format!("the host's probe table: {e}")),
        }
        match self.converge_branch_eni() {
            Ok(c) if c == Default::default() => {}
            Ok(c) => report.repairs.push((
                "host".into(),
                Repair {
                    at: SystemTime::now(),
                    kind: RepairKind::ProbeRoutes,
                    why: format!(
                        "the branch-ENI probe rules differed: {}",
                        branch_eni::words(&c)
                    ),
                },
            )),
            Err(e) => report
                .problems
                .push(format!("the branch-ENI probe rules: {e}")),
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            if let Some(r) = self.converge_rules(uid, &mut report) {
                report.repairs.push(r);
            }
        }
        self.zds.check_alive();
        for uid in self.zds.unacked() {
            let Some(label) = self.pods.get(&uid).map(|e| e.pod.label()) else {
                continue;
            };
            let held_before = self.zds.held(&uid);
            match self.zds.sync(&uid) {
                Ok(Delivery::Acked) => {
                    let repair = Repair {
                        at: SystemTime::now(),
                        kind: RepairKind::Resent,
                        why: match held_before.refused {
                            Some(e) => format!("ztunnel had refused it ({e}); it acked it now"),
                            None => "ztunnel's connection had not acked it; it acked it now".into(),
                        },
                    };
                    if let Some(e) = self.pods.get_mut(&uid) {
                        e.repair = Some(repair.clone());
                    }
                    report.repairs.push((label, repair));
                }
                Ok(Delivery::Queued) => {}
                Err(e) => report.problems.push(format!(
                    "pod {label}: {}",
                    redirect_program::errors::chain(&e)
                )),
            }
        }
        self.converge_listeners(&mut report);
        self.synthetic_check(&mut report);
        for (uid, sent) in self.zds.release_leftovers() {
            if let Err(e) = sent {
                report.problems.push(format!(
                    "released pod {uid}: {}",
                    redirect_program::errors::chain(&e)
                ));
            }
        }
        report.took = started.elapsed();
        report
    }

    /// Reads pod `uid`'s rules back and programs them again when they differ (or, for rules
    /// left as found at start, when the table is gone).
    fn converge_rules(&mut self, uid: &str, report: &mut PassReport) -> Option<(String, Repair)> {
        // Fields borrowed apart: no copy of the record folder per pod and pass.
        let (adopt, records) = (self.adopt, self.records.as_deref());
        let counters_every = self.counters_every;
        let e = self.pods.get_mut(uid)?;
        let label = e.pod.label();
        if let Err(err) = e.open_kernel()? {
            report.problems.push(format!("pod {label}: {err}"));
            return None;
        }
        let ns = e.kernel.as_ref()?;
        report.checked += 1;
        let found = if e.leave {
            match ns.read(&Capture::Ambient(e.cfg.clone())) {
                Ok(Some(_)) => Vec::new(),
                Ok(None) => vec!["our table is gone".to_string()],
                Err(err) => vec![format!("cannot read the table: {err}")],
            }
        } else {
            // The table's dump only when something was committed in the namespace since it
            // last read back equal (the generation moved); the reply routing every time.
            let (found, seen) = since(ns, &e.cfg, e.seen);
            e.seen = seen;
            found
        };
        let now = SystemTime::now();
        if !found.is_empty() && torn_down(ns, &e.pod.ips) {
            // The runtime's DEL took our rules out of a sandbox it tears down (a restart):
            // nothing to repair there; the runtime's next ADD enrolls the new one.
            if !e.torn_down {
                tracing::info!(
                    "ambient: pod {label}: its namespace no longer holds its addresses (the \
                     sandbox is torn down): its rules are not put back"
                );
            }
            e.torn_down = true;
            e.rules = Some(ReadBack {
                at: now,
                differences: vec![TORN_DOWN.into()],
            });
            return None;
        }
        e.torn_down = false;
        let mut repair = None;
        let mut left = found.clone();
        if !found.is_empty() {
            match Self::apply_pod(adopt, ns, &e.cfg, &label) {
                Ok(removed) => {
                    // Read back once more: what is there now, and the generation to trust.
                    let (after, seen) = since(ns, &e.cfg, None);
                    e.seen = seen;
                    left = after;
                    repair = Self::adopted(records, (uid, &label), &removed).or(Some(Repair {
                        at: now,
                        kind: RepairKind::PodRules,
                        why: summary(&found),
                    }));
                }
                Err(err) => report
                    .problems
                    .push(format!("pod {label}: reprogramming its rules: {err}")),
            }
        }
        e.read_counts(left.is_empty(), counters_every);
        e.rules = Some(ReadBack {
            at: now,
            differences: left,
        });
        if let Some(r) = &repair {
            e.repair = Some(r.clone());
        }
        repair.map(|r| (label, r))
    }

    /// Each enrolled pod's counters per path as the last pass read them (`CAPTURE_COUNTERS`).
    pub fn counts(
        &self,
    ) -> Vec<(
        crate::telemetry::capture_counts::PodKey,
        redirect_core::PathCounts,
    )> {
        let key = |p: &PodRef| crate::telemetry::capture_counts::PodKey {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        };
        let pods = self.pods.values();
        pods.filter_map(|e| Some((key(&e.pod), e.counts?.0)))
            .collect()
    }

    /// The stage of an enrolled pod, from what the current ZDS connection acked and, with
    /// `AMBIENT_CHECK_LISTENERS`, whether ztunnel's listeners were there at the last read.
    pub fn stage(&self, uid: &str) -> Option<Stage> {
        let e = self.pods.get(uid)?;
        let held = self.zds.held(uid);
        let lacking = self.check_listeners && e.listeners.lacking();
        Some(match (held.connection, held.acked) {
            (None, _) => Stage::Disconnected,
            (Some(_), true) if lacking => Stage::Pending,
            (Some(_), true) => Stage::Enabled,
            (Some(_), false) => Stage::Pending,
        })
    }

    /// The ztunnel listeners the last read found missing in pod `uid` (none when not read).
    pub fn listeners_missing(&self, uid: &str) -> Vec<redirect_core::listeners::Port> {
        self.pods
            .get(uid)
            .map(|e| e.listeners.missing().to_vec())
            .unwrap_or_default()
    }

    /// The enrolled pods' UIDs.
    pub fn enrolled(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// The pods ztunnel is told to keep, whose namespace the agent does not hold.
    pub fn kept(&self) -> Vec<PodRef> {
        self.pods
            .values()
            .filter(|e| e.netns.is_none())
            .map(|e| e.pod.clone())
            .collect()
    }

    /// The pod enrolled under `uid`.
    pub fn pod(&self, uid: &str) -> Option<&PodRef> {
        self.pods.get(uid).map(|e| &e.pod)
    }

    /// The enrolled pod (other than `except`) bound to namespace `id`.
    pub fn bound_to(&self, id: redirect_core::NetnsId, except: &str) -> Option<String> {
        self.pods
            .iter()
            .find(|(u, e)| *u != except && e.netns.as_ref().is_some_and(|n| n.id() == id))
            .map(|(_, e)| e.pod.label())
    }

    /// The enrolled pod `uid`'s namespace identity.
    pub fn netns_id(&self, uid: &str) -> Option<redirect_core::NetnsId> {
        self.pods.get(uid)?.netns.as_ref().map(|n| n.id())
    }

    /// Every enrolled pod as held and last read back, for the node view.
    pub fn states(&self) -> Vec<PodState> {
        self.pods
            .values()
            .map(|e| {
                let Held {
                    connection,
                    acked,
                    refused,
                } = self.zds.held(&e.pod.uid);
                PodState {
                    uid: e.pod.uid.clone(),
                    namespace: e.pod.namespace.clone(),
                    name: e.pod.name.clone(),
                    ips: e.pod.ips.clone(),
                    netns: e.netns.as_ref().map(|n| n.path().display().to_string()),
                    binding: e.binding,
                    rules: e.rules.clone(),
                    repair: e.repair.clone(),
                    ztunnel: ZtunnelView {
                        connection,
                        acked,
                        refused,
                        listeners: if self.check_listeners && acked {
                            e.listeners.view()
                        } else {
                            None
                        },
                    },
                    synthetic_check: e.synthetic.as_ref().map(Checked::view),
                }
            })
            .collect()
    }

    /// The host table as last read back.
    pub fn host(&self) -> HostView {
        self.host.clone()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }
}

/// How `ns`'s ambient rules differ from `cfg`'s plan, in words (empty: equal); a read that
/// fails is a difference too.
fn differences(ns: &Namespace, capture: &Capture) -> Vec<String> {
    match ns.check(capture) {
        Ok(d) => d.iter().map(|m| m.to_string()).collect(),
        Err(e) => vec![format!("cannot read the rules back: {e}")],
    }
}

/// [`Namespace::check_since`] of the ambient capture `cfg`, a read that fails counting as a difference.
fn since(ns: &Namespace, cfg: &AmbientConfig, seen: Option<u32>) -> (Vec<String>, Option<u32>) {
    match ns.check_since(&Capture::Ambient(cfg.clone()), seen) {
        Ok((d, seen)) => (d.iter().map(|m| m.to_string()).collect(), seen),
        Err(e) => (vec![format!("cannot read the rules back: {e}")], None),
    }
}

/// The host's probe table programmed whole with `members`: the repair, saying `why`.
fn reprogram_host(
    ns: &Namespace,
    cfg: &HostProbeConfig,
    members: &[IpAddr],
    why: String,
) -> redirect_core::Result<Repair> {
    let host = Capture::HostProbe {
        config: cfg.clone(),
        members: members.to_vec(),
    };
    ns.apply_with(&host, AMBIENT_POLICY)?;
    Ok(Repair {
        at: SystemTime::now(),
        kind: RepairKind::HostTable,
        why,
    })
}

/// What the node view says of a pod whose sandbox was torn down.
pub(crate) const TORN_DOWN: &str =
    "its namespace no longer holds its addresses: the sandbox is torn down (its rules are not put back; the runtime's next ADD enrolls the new one)";

/// Whether a pod's namespace no longer holds any of its addresses: the runtime tore the
/// sandbox down (its interface is gone), as at a sandbox restart. A pod whose addresses are
/// not known yet is never taken for torn down.
fn torn_down(ns: &Namespace, ips: &[IpAddr]) -> bool {
    !ips.is_empty()
        && ns
            .addresses()
            .is_ok_and(|held| !ips.iter().any(|ip| held.contains(ip)))
}

/// The first differences, for a log line.
fn summary(found: &[String]) -> String {
    let mut s = found.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if found.len() > 3 {
        s.push_str(&format!("; and {} more", found.len() - 3));
    }
    s
}

/// The addresses of `ips` the probe SNAT covers: IPv6 ones only with its IPv6 address.
fn probed<'a>(cfg: &'a HostProbeConfig, ips: &'a [IpAddr]) -> impl Iterator<Item = IpAddr> + 'a {
    ips.iter()
        .copied()
        .filter(|ip| ip.is_ipv4() || cfg.snat_v6.is_some())
}

/// A `Namespace` on a second descriptor of `netns`.
fn namespace(netns: &Netns) -> redirect_core::Result<Namespace> {
    let fd = netns
        .try_clone_fd()
        .map_err(|cause| redirect_core::error::NamespaceError::Open {
            path: netns.path().to_owned(),
            cause,
        })?;
    let copy = Netns::from_file(std::fs::File::from(fd), netns.path())?;
    Namespace::from_netns(copy)
}
