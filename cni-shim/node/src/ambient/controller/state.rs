//! The ambient controller's memory of the cluster: this node's pods and every namespace's
//! labels as the watch brought them (or the API at ADD), the queue of pods to look at, and
//! what the agent wrote that the watch has not brought back yet. Apart from the controller's
//! loop because it is plain data, tested without a cluster.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod};
use kube::runtime::watcher::Event;

use crate::ambient::pods;
use crate::node_view::PassState;
use crate::pods::not_listed;
use crate::pods::queue::{Backoff, Queue};

/// The controller's memory of the cluster.
pub(super) struct State {
    pub(super) pods: HashMap<String, Pod>,
    pub(super) namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Whether each watch has listed once; enrollment starts when both have.
    pub(super) listed: (bool, bool),
    pub(super) started: bool,
    pub(super) queue: Queue,
    /// The pods of the listing under way (a relist after the watch failed).
    pub(super) listing: Option<HashSet<String>>,
    /// The resourceVersion of the agent's last write to each pod whose watch event has not
    /// come yet.
    pub(super) written: HashMap<String, String>,
    pub(super) passes: PassState,
}

impl State {
    /// Nothing known yet; failed pods retried without end (backoff up to 30 s), as Istio.
    pub(super) fn new() -> State {
        State {
            pods: HashMap::new(),
            namespaces: HashMap::new(),
            listed: (false, false),
            started: false,
            queue: Queue::new(u32::MAX, Backoff::default()),
            listing: None,
            written: HashMap::new(),
            passes: PassState::default(),
        }
    }

    pub(super) fn namespace_labels(&self, pod: &Pod) -> BTreeMap<String, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        self.namespaces.get(ns).cloned().unwrap_or_default()
    }

    /// The addresses other live pods of the node (than `uid`) list in their status, with whose
    /// they are: a namespace holding one of them is not `uid`'s.
    pub(super) fn address_owners(&self, uid: &str) -> HashMap<IpAddr, String> {
        self.pods
            .iter()
            .filter(|(u, p)| *u != uid && pods::live(p))
            .flat_map(|(_, p)| pods::ips(p).into_iter().map(|ip| (ip, pods::label(p))))
            .collect()
    }

    /// Whether the watch's `pod` came before the agent's last write to it (whose answer the
    /// cache holds already): events come in order, so until the one of that write arrives,
    /// each is older. A listing replaces everything (its objects are the latest).
    fn older_than_written(&self, pod: &Pod) -> bool {
        let (Some(uid), Some(rv)) = (&pod.metadata.uid, &pod.metadata.resource_version) else {
            return false;
        };
        self.written.get(uid).is_some_and(|w| w != rv)
    }

    /// A pod read from the API at ADD, before the watch brings it: kept (and not taken for
    /// deleted by a listing under way).
    pub(super) fn remember(&mut self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.clone() {
            if let Some(seen) = self.listing.as_mut() {
                seen.insert(uid.clone());
            }
            self.pods.entry(uid).or_insert_with(|| pod.clone());
        }
    }

    /// Istio's type of a watch event (`nodeagent_reconcile_events_total`): `add` for an object
    /// not known yet, `update`, `delete`; none for a listing's start and end.
    pub(super) fn event_type<K: kube::Resource>(
        event: &Event<K>,
        known: impl Fn(&K) -> bool,
    ) -> Option<&'static str> {
        match event {
            Event::Apply(o) | Event::InitApply(o) if known(o) => Some("update"),
            Event::Apply(_) | Event::InitApply(_) => Some("add"),
            Event::Delete(_) => Some("delete"),
            Event::Init | Event::InitDone => None,
        }
    }

    pub(super) fn on_pod(&mut self, event: Event<Pod>) {
        match event {
            Event::Apply(p) if self.older_than_written(&p) => {}
            Event::Apply(p) | Event::InitApply(p) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    self.written.remove(&uid);
                    if let Some(seen) = self.listing.as_mut() {
                        seen.insert(uid.clone());
                    }
                    self.pods.insert(uid.clone(), p);
                    self.queue.add(&uid);
                }
            }
            Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    self.pods.remove(uid);
                    self.queue.add(uid);
                }
            }
            Event::Init => {
                self.listing = Some(HashSet::new());
                self.written.clear();
            }
            Event::InitDone => {
                // A pod deleted while the watch was down has no Delete event: the listing
                // is the truth.
                if let Some(seen) = self.listing.take() {
                    for uid in not_listed(self.pods.keys(), &seen) {
                        self.pods.remove(&uid);
                        self.queue.add(&uid);
                    }
                }
                self.listed.0 = true;
            }
        }
    }

    pub(super) fn on_namespace(&mut self, event: Event<KubeNamespace>) {
        let changed = match event {
            Event::Apply(n) | Event::InitApply(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                let labels = n.metadata.labels.clone().unwrap_or_default();
                (self.namespaces.insert(name.clone(), labels.clone()) != Some(labels))
                    .then_some(name)
            }
            Event::Delete(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                self.namespaces.remove(&name).map(|_| name)
            }
            Event::Init => None,
            Event::InitDone => {
                self.listed.1 = true;
                None
            }
        };
        if let Some(ns) = changed {
            let uids: Vec<String> = self
                .pods
                .iter()
                .filter(|(_, p)| p.metadata.namespace.as_deref() == Some(&ns))
                .map(|(u, _)| u.clone())
                .collect();
            for uid in uids {
                self.queue.add(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn pod(uid: &str, ns: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "namespace": ns, "uid": uid}
        }))
        .unwrap()
    }

    fn state() -> State {
        State::new()
    }

    fn drain(s: &mut State) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(u) = s.queue.pop(Instant::now()) {
            s.queue.forget(&u);
            out.push(u);
        }
        out.sort();
        out
    }

    #[test]
    fn a_relist_drops_the_pods_it_no_longer_names_but_those_read_at_add() {
        let mut s = state();
        s.on_pod(Event::Init);
        s.on_pod(Event::InitApply(pod("a", "shop")));
        s.on_pod(Event::InitApply(pod("b", "shop")));
        s.on_pod(Event::InitDone);
        assert_eq!(drain(&mut s), ["a", "b"]);
        // The watch failed; b was deleted meanwhile, c read from the API at ADD during the
        // new listing.
        s.on_pod(Event::Init);
        s.remember(&pod("c", "shop"));
        s.on_pod(Event::InitApply(pod("a", "shop")));
        s.on_pod(Event::InitDone);
        assert_eq!(drain(&mut s), ["a", "b"], "b queued to be released");
        let mut kept: Vec<&String> = s.pods.keys().collect();
        kept.sort();
        assert_eq!(kept, ["a", "c"]);
    }

    #[test]
    fn a_namespace_label_change_queues_its_pods_only() {
        let mut s = state();
        s.on_pod(Event::Apply(pod("a", "shop")));
        s.on_pod(Event::Apply(pod("b", "other")));
        drain(&mut s);
        let ns: KubeNamespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shop", "labels": {"istio.io/dataplane-mode": "ambient"}}
        }))
        .unwrap();
        s.on_namespace(Event::Apply(ns.clone()));
        assert_eq!(drain(&mut s), ["a"]);
        s.on_namespace(Event::Apply(ns));
        assert!(
            drain(&mut s).is_empty(),
            "the same labels again queue nothing"
        );
    }

    #[test]
    fn the_watchs_events_older_than_the_agents_write_are_skipped() {
        let mut s = state();
        let at = |rv: &str, value: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "a", "namespace": "shop", "uid": "a", "resourceVersion": rv,
                             "annotations": {"ambient.istio.io/redirection": value}}
            }))
            .unwrap()
        };
        s.on_pod(Event::Apply(at("1", "pending")));
        // The agent wrote enabled (the server answered with version 3).
        s.written.insert("a".into(), "3".into());
        s.pods.insert("a".into(), at("3", "enabled"));
        // The watch brings version 2 (pending) late: skipped; then 3, the write: taken.
        s.on_pod(Event::Apply(at("2", "pending")));
        assert_eq!(pods::redirection(&s.pods["a"]), Some("enabled"));
        s.on_pod(Event::Apply(at("3", "enabled")));
        assert!(s.written.is_empty());
        s.on_pod(Event::Apply(at("4", "pending")));
        assert_eq!(
            pods::redirection(&s.pods["a"]),
            Some("pending"),
            "a later write is taken"
        );
        // A relist takes everything.
        s.written.insert("a".into(), "9".into());
        s.on_pod(Event::Init);
        s.on_pod(Event::InitApply(at("5", "enabled")));
        s.on_pod(Event::InitDone);
        assert_eq!(s.pods["a"].metadata.resource_version.as_deref(), Some("5"));
    }

    #[test]
    fn the_addresses_of_other_live_pods_have_owners() {
        let mut s = state();
        let with_ip = |uid: &str, ip: &str, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "namespace": "shop", "uid": uid},
                "status": {"phase": phase, "podIP": ip}
            }))
            .unwrap()
        };
        s.on_pod(Event::Apply(with_ip("a", "10.0.0.1", "Running")));
        s.on_pod(Event::Apply(with_ip("b", "10.0.0.2", "Running")));
        s.on_pod(Event::Apply(with_ip("c", "10.0.0.3", "Succeeded")));
        let owners = s.address_owners("a");
        assert_eq!(
            owners.get(&"10.0.0.2".parse().unwrap()).map(String::as_str),
            Some("shop/b")
        );
        assert!(
            !owners.contains_key(&"10.0.0.1".parse().unwrap()),
            "its own"
        );
        assert!(
            !owners.contains_key(&"10.0.0.3".parse().unwrap()),
            "an ended pod's"
        );
    }
}
