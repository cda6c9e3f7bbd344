//! One node's ambient data plane, whatever asked for the change (the pod watch or the plugin's
//! ADD): each enrolled pod's namespace held open, its in-pod rules, and ztunnel told over ZDS.
//! The order is Istio's: rules in the pod, then ztunnel's ack; removal the other way round
//! (rules left alone in a pod being deleted: its namespace goes with it).
//!
//! Everything here blocks (netlink, ZDS's 5 s deadlines): the controller calls it from a
//! blocking task, one change at a time.

use std::collections::BTreeMap;
use std::net::IpAddr;

use redirect_core::{AmbientConfig, HostProbeConfig, Namespace, Netns};

use super::zds::proto::WorkloadInfo;
use super::zds::server::{Delivery, ZdsError, ZdsServer};

/// Who a pod is, for ztunnel and the logs.
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

/// Where an enrolled pod stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Rules in place, ztunnel acknowledged it: `ambient.istio.io/redirection: enabled`.
    Enabled,
    /// Rules in place, ztunnel not connected (it gets the pod with its snapshot) or it
    /// refused: `pending`.
    Pending,
}

/// What to do with rules already in the pod's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rules {
    /// Program them (a new pod).
    Apply,
    /// Program them only if they differ (a pod enrolled before the agent started).
    KeepIfSame,
    /// Leave them as they are (`AMBIENT_RECONCILE_POD_RULES_ON_STARTUP=false`).
    Leave,
}

/// Why a pod could not be enrolled.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The in-pod rules could not be programmed: nothing of ours is left in the pod.
    #[error("cannot program the in-pod rules in {netns}: {source}")]
    Rules {
        netns: String,
        #[source]
        source: redirect_core::Error,
    },
    /// The pod's addresses could not be put in the host's probe sets.
    #[error("cannot add {ips} to the host's probe SNAT sets: {source}")]
    Probe {
        ips: String,
        #[source]
        source: redirect_core::Error,
    },
    /// The namespace's descriptor could not be duplicated for ztunnel.
    #[error("cannot hand {netns} to ztunnel: {source}")]
    Descriptor {
        netns: String,
        #[source]
        source: std::io::Error,
    },
}

/// What the data plane holds of an enrolled pod.
struct Enrolled {
    pod: PodRef,
    /// The namespace held open (a `Namespace`'s netlink sockets are made for each change:
    /// they are not to be shared between threads).
    netns: Netns,
    stage: Stage,
    /// `zds.connections()` when it went pending: a later connection's snapshot carried it.
    pending_since: u64,
}

/// The node's enrolled pods, the ZDS server that hands them to ztunnel, and the host's probe
/// SNAT (kubelet's probes to an enrolled pod's addresses come from the address its rules let
/// through).
pub struct Dataplane {
    zds: ZdsServer,
    pods: BTreeMap<String, Enrolled>,
    /// `None`: kubelet was not found; probes reach the pods unchanged (and are captured).
    probe: Option<HostProbeConfig>,
}

impl Dataplane {
    pub fn new(zds: ZdsServer) -> Dataplane {
        Dataplane {
            zds,
            pods: BTreeMap::new(),
            probe: None,
        }
    }

    /// Programs the host's probe SNAT in the agent's namespace (the node's), its address sets
    /// empty: the pods enrolled after this fill them.
    pub fn set_host_probe(&mut self, cfg: HostProbeConfig) -> redirect_core::Result<()> {
        Namespace::current()?.apply_host_probe(&cfg)?;
        self.probe = Some(cfg);
        Ok(())
    }

    /// The pod's addresses as its status lists them now: new ones go into the probe sets.
    pub fn refresh_ips(&mut self, uid: &str, ips: &[IpAddr]) -> Result<(), AddError> {
        let Some(e) = self.pods.get(uid) else {
            return Ok(());
        };
        if ips.is_empty() || e.pod.ips == ips {
            return Ok(());
        }
        let mut pod = e.pod.clone();
        pod.ips = ips.to_vec();
        self.probe_add(&pod)?;
        if let Some(e) = self.pods.get_mut(uid) {
            e.pod.ips = pod.ips;
        }
        Ok(())
    }

    /// The pod's addresses into the host's probe sets (before its rules, as Istio).
    fn probe_add(&self, pod: &PodRef) -> Result<(), AddError> {
        let Some(cfg) = &self.probe else {
            return Ok(());
        };
        let ips = probed(cfg, &pod.ips).collect::<Vec<_>>();
        Namespace::current()
            .and_then(|ns| ns.host_probe_add(cfg, &ips))
            .map_err(|source| AddError::Probe {
                ips: format!("{ips:?}"),
                source,
            })
    }

    /// The pod's addresses out of the probe sets, but those another enrolled pod holds (an
    /// address handed to a new pod before the old one was released).
    fn probe_remove(&self, uid: &str, pod: &PodRef) -> Option<String> {
        let cfg = self.probe.as_ref()?;
        let ips: Vec<IpAddr> = probed(cfg, &pod.ips)
            .filter(|ip| {
                !self
                    .pods
                    .iter()
                    .any(|(u, e)| u != uid && e.pod.ips.contains(ip))
            })
            .collect();
        let removed = Namespace::current().and_then(|ns| ns.host_probe_remove(cfg, &ips));
        removed
            .err()
            .map(|e| format!("removing {ips:?} from the host's probe sets: {e}"))
    }

    pub fn zds(&self) -> &ZdsServer {
        &self.zds
    }

    /// Enrolls `pod` in `netns` with `cfg`: the rules as `rules` says, then ztunnel. A pod already enrolled is enrolled again in the namespace
    /// given (a new sandbox of the same pod). Returns the stage reached; a refused ZDS request
    /// leaves the pod `Pending`, to be sent again with the next snapshot.
    pub fn add(
        &mut self,
        pod: &PodRef,
        netns: Netns,
        cfg: &AmbientConfig,
        rules: Rules,
    ) -> Result<(Stage, Option<ZdsError>), AddError> {
        let where_ = netns.path().display().to_string();
        let fd = netns
            .try_clone_fd()
            .map_err(|source| AddError::Descriptor {
                netns: where_.clone(),
                source,
            })?;
        let failed = |source| AddError::Rules {
            netns: where_.clone(),
            source,
        };
        let ns = namespace(&netns).map_err(failed)?;
        self.probe_add(pod)?;
        let program = match rules {
            Rules::Apply => true,
            Rules::KeepIfSame => !ns.check_ambient(cfg).is_ok_and(|d| d.is_empty()),
            Rules::Leave => false,
        };
        if program {
            ns.apply_ambient(cfg).map_err(failed)?;
        }
        let (stage, refused) = self.send(pod, fd);
        let pending_since = self.zds.connections();
        self.pods.insert(
            pod.uid.clone(),
            Enrolled {
                pod: pod.clone(),
                netns,
                stage,
                pending_since,
            },
        );
        Ok((stage, refused))
    }

    /// Sends a pending pod to ztunnel again (after a nack, or a failed connection).
    pub fn resend(&mut self, uid: &str) -> Option<(Stage, Option<ZdsError>)> {
        let e = self.pods.get(uid)?;
        let fd = e.netns.try_clone_fd().ok()?;
        let pod = e.pod.clone();
        let (stage, refused) = self.send(&pod, fd);
        let connections = self.zds.connections();
        let e = self.pods.get_mut(uid)?;
        e.stage = stage;
        e.pending_since = connections;
        Some((stage, refused))
    }

    fn send(&self, pod: &PodRef, fd: std::os::fd::OwnedFd) -> (Stage, Option<ZdsError>) {
        match self.zds.add(&pod.uid, pod.info(), fd) {
            Ok(Delivery::Acked) => (Stage::Enabled, None),
            Ok(Delivery::Queued) => (Stage::Pending, None),
            Err(e) => (Stage::Pending, Some(e)),
        }
    }

    /// Tells ztunnel to keep serving a pod whose namespace the agent cannot find (after a
    /// restart): its next snapshot says `keep`.
    pub fn keep(&self, pod: &PodRef) {
        self.zds.keep(&pod.uid, pod.info());
    }

    /// Releases the pod `uid`: its addresses out of the probe sets, ztunnel told, then (unless the pod is being deleted) its rules
    /// removed. Returns the pod as it was enrolled, or `None` if it was not.
    pub fn remove(&mut self, uid: &str, deleting: bool) -> Option<(PodRef, Vec<String>)> {
        let mut problems = Vec::new();
        if let Some(p) = self
            .pods
            .get(uid)
            .and_then(|e| self.probe_remove(uid, &e.pod))
        {
            problems.push(p);
        }
        if let Err(e) = self.zds.del(uid) {
            problems.push(e.to_string());
        }
        let enrolled = self.pods.remove(uid)?;
        if !deleting {
            if let Err(e) = namespace(&enrolled.netns).and_then(|ns| ns.remove_ambient()) {
                problems.push(format!("removing the in-pod rules: {e}"));
            }
        }
        Some((enrolled.pod, problems))
    }

    /// The stage of an enrolled pod; a pending pod turns `Enabled` once a ztunnel that
    /// connected after it went pending got it in its snapshot.
    pub fn stage(&mut self, uid: &str) -> Option<Stage> {
        let (connected, connections) = (self.zds.connected(), self.zds.connections());
        let e = self.pods.get_mut(uid)?;
        if e.stage == Stage::Pending && connected && connections > e.pending_since {
            e.stage = Stage::Enabled;
        }
        Some(e.stage)
    }

    /// The enrolled pods' UIDs.
    pub fn enrolled(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// The pod enrolled under `uid`.
    pub fn pod(&self, uid: &str) -> Option<&PodRef> {
        self.pods.get(uid).map(|e| &e.pod)
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
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
        .map_err(|source| redirect_core::kernel::netns::Error::Open {
            path: netns.path().to_owned(),
            source,
        })?;
    let copy = Netns::from_file(std::fs::File::from(fd), netns.path())?;
    Namespace::from_netns(copy)
}
