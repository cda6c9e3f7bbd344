//! The sidecar pods' counters: for each running pod of the node that the plugin captures, its
//! namespace is found once (as repair finds it: by the pod's cgroup and address), held open
//! with its netlink sockets, and its counters read at each round in one dump. The capture is
//! the one ADD applied (the plugin's settings over the pod's annotations), so the counters are
//! attributed by where that plan puts them; a pod whose table has no counters (set up before
//! `CAPTURE_COUNTERS`) or another shape is not reported, and says why once.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::Pod;
use redirect_core::mesh::MeshDefaults;
use redirect_core::{Capture, Namespace, PathCounts};

use crate::pods::capture::{locate, Located, Reach};
use crate::telemetry::capture_counts::{CaptureCounts, PodKey, Source};

/// A pod whose counters are read: its namespace's sockets and the capture ADD applied.
struct Held {
    key: PodKey,
    ns: Namespace,
    capture: Capture,
    /// The last read found no counters where the plan puts them (logged once).
    unread: bool,
}

/// Reads the counters of the node's sidecar pods, holding each pod's namespace between rounds.
pub struct SidecarReader {
    defaults: MeshDefaults,
    held: HashMap<String, Held>,
    /// Pods the plugin does not capture, or not found: looked at again only when they change.
    skipped: HashSet<(String, String)>,
}

impl SidecarReader {
    /// A reader with the plugin's settings (its config entry): the capture ADD applied.
    pub fn new(defaults: MeshDefaults) -> SidecarReader {
        SidecarReader {
            defaults,
            held: HashMap::new(),
            skipped: HashSet::new(),
        }
    }

    /// One round over `pods` (the node's, as the pod watch lists them): each captured pod's
    /// counts, and what could not be read, one line each. Pods no longer listed are let go.
    pub fn read(
        &mut self,
        pods: &[Pod],
        reach: &Reach,
    ) -> (Vec<(PodKey, PathCounts)>, Vec<String>) {
        let (mut counts, mut problems) = (Vec::new(), Vec::new());
        let mut listed = HashSet::new();
        for pod in pods {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if !crate::pods::live(pod) || host_network(pod) {
                continue;
            }
            listed.insert(uid.clone());
            if !self.held.contains_key(&uid) {
                match self.hold(pod, &uid, reach) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        problems.push(e);
                        continue;
                    }
                }
            }
            match self.read_one(&uid) {
                Ok(Some(c)) => counts.push(c),
                Ok(None) => {}
                Err(e) => {
                    // The namespace is gone or unreadable: found again next round.
                    self.held.remove(&uid);
                    problems.push(e);
                }
            }
        }
        self.held.retain(|uid, _| listed.contains(uid));
        self.skipped.retain(|(uid, _)| listed.contains(uid));
        (counts, problems)
    }

    /// Finds and opens `pod`'s namespace, with the capture ADD applied there; `false` for a
    /// pod the plugin does not capture (remembered until the pod changes).
    fn hold(&mut self, pod: &Pod, uid: &str, reach: &Reach) -> Result<bool, String> {
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        if self.skipped.contains(&(uid.to_string(), version.clone())) {
            return Ok(false);
        }
        let label = crate::pods::label(pod);
        let target = match locate(pod, &self.defaults, reach) {
            Ok(Located::Capture(t)) => t,
            Ok(Located::NotCaptured(_)) => {
                self.skipped.insert((uid.to_string(), version));
                return Ok(false);
            }
            Err(e) => {
                self.skipped.insert((uid.to_string(), version));
                return Err(redirect_program::errors::chain(&e));
            }
        };
        let ips = crate::pods::ips(pod);
        let opened = (reach.open)(&target.ns).and_then(|ns| {
            let cfg = ns.for_pod(target.cfg, target.dual_stack, Some(&ips))?;
            Ok((ns, Capture::Sidecar(cfg)))
        });
        let (ns, capture) = opened.map_err(|e| format!("pod {label}: {e}"))?;
        let key = PodKey {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_string(),
        };
        let unread = false;
        let held = Held {
            key,
            ns,
            capture,
            unread,
        };
        self.held.insert(uid.to_string(), held);
        Ok(true)
    }

    fn read_one(&mut self, uid: &str) -> Result<Option<(PodKey, PathCounts)>, String> {
        let h = self.held.get_mut(uid).expect("held");
        let label = format!("{}/{}", h.key.namespace, h.key.name);
        match h.ns.path_counts(&h.capture) {
            Ok(Some(c)) => {
                h.unread = false;
                Ok(Some((h.key.clone(), c)))
            }
            Ok(None) => {
                if !h.unread {
                    tracing::info!(
                        "counters: pod {label}: its table has no counters where its capture \
                         puts them (set up before CAPTURE_COUNTERS, or by another config): not \
                         counted until the pod is set up again"
                    );
                }
                h.unread = true;
                Ok(None)
            }
            Err(e) => Err(format!("pod {label}: reading its counters: {e}")),
        }
    }

    /// How many pods' namespaces are held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// The sidecar pods' counters, the agent's part (`CAPTURE_COUNTERS`): a round every `every`
/// over the pods the pod informer lists (`known`), each captured as the plugin with
/// `defaults` captures it, its counts set on `counts`; a problem is logged when it first
/// appears. Runs until `stop`.
pub async fn run(
    defaults: MeshDefaults,
    known: crate::informers::KnownPods,
    counts: CaptureCounts,
    places: crate::pods::Places,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut reader = SidecarReader::new(defaults);
    let mut logged: HashSet<String> = HashSet::new();
    loop {
        let pods = known.snapshot();
        let places = places.clone();
        let round = tokio::task::spawn_blocking(move || {
            let find = |uid: &str, ip: std::net::IpAddr| {
                crate::pods::search::find(&places.proc, &places.pins, uid, ip)
            };
            let reach = Reach {
                find: &find,
                open: &Namespace::open_in,
            };
            let (read, problems) = reader.read(&pods, &reach);
            (reader, read, problems)
        })
        .await;
        let Ok((back, read, problems)) = round else {
            tracing::error!("counters: the sidecar pods' reader stopped");
            return;
        };
        reader = back;
        counts.set(Source::Sidecar, read);
        for p in &problems {
            if !logged.contains(p) {
                tracing::warn!("counters: {p}");
            }
        }
        logged = problems.into_iter().collect();
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
