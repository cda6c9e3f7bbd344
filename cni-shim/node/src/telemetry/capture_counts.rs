//! The capture counters on the metrics port (`CAPTURE_COUNTERS`): each pod's counts per path as
//! last read (ambient pods by the ambient pass, sidecar pods by `crate::counters`' reader),
//! encoded at each scrape as counters, per pod or summed over the node.
//!
//! The node's sums stay monotonic, as a counter must: when a pod goes, or its counts fall (its
//! table was programmed again, which zeroes its counters), what it had counted is kept in
//! `retired` and still summed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use redirect_core::{Count, CountedPath, PathCounts};

/// What `CAPTURE_COUNTERS` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CountersMode {
    /// No counters (the default): the rules carry none and nothing is read.
    #[default]
    Off,
    /// Counters summed over the node's pods, per path: no pod named on the metrics port.
    Node,
    /// Counters per pod and path: the metrics port names each pod (namespace and name).
    Pod,
}

impl CountersMode {
    /// Parses the setting's value.
    pub fn parse(s: &str) -> Result<CountersMode, String> {
        match s.trim() {
            "off" | "false" => Ok(CountersMode::Off),
            "node" => Ok(CountersMode::Node),
            "pod" => Ok(CountersMode::Pod),
            _ => Err(
                "expected off, node (summed over the node's pods) or pod (per pod: the \
                 metrics port then names every pod of the node)"
                    .into(),
            ),
        }
    }

    /// Whether the capture rules carry counters.
    pub fn on(self) -> bool {
        self != CountersMode::Off
    }
}

/// Who read a pod's counts: its kind of capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The plugin's sidecar capture, read by `crate::counters`' reader.
    Sidecar,
    /// Ambient's in-pod rules, read by the ambient pass.
    Ambient,
}

impl Source {
    fn word(self) -> &'static str {
        match self {
            Source::Sidecar => "sidecar",
            Source::Ambient => "ambient",
        }
    }
}

/// A pod, as the counters name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its UID: two pods of one name (a StatefulSet's, recreated) are two series of counts.
    pub uid: String,
}

#[derive(Debug, Default)]
struct Store {
    pods: BTreeMap<(Source, PodKey), PathCounts>,
    /// What pods that went, or whose counters were zeroed, had counted.
    retired: PathCounts,
}

/// The pods' counts as last read; clones share them. Registered on the metrics as a
/// collector, it is encoded at each scrape.
#[derive(Clone, Debug, Default)]
pub struct CaptureCounts {
    mode: CountersMode,
    store: Arc<Mutex<Store>>,
}

impl CaptureCounts {
    /// Counts encoded as `mode` says.
    pub fn new(mode: CountersMode) -> CaptureCounts {
        CaptureCounts {
            mode,
            store: Arc::default(),
        }
    }

    /// Replaces what `source` read: every pod it reads, with its counts now. A pod no longer
    /// listed, or whose counts fell, retires what it had counted.
    pub fn set(&self, source: Source, now: Vec<(PodKey, PathCounts)>) {
        let mut st = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let old: Vec<((Source, PodKey), PathCounts)> = {
            let keys: Vec<_> = st
                .pods
                .keys()
                .filter(|(s, _)| *s == source)
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| st.pods.remove(&k).map(|c| (k, c)))
                .collect()
        };
        let mut fresh: BTreeMap<(Source, PodKey), PathCounts> = BTreeMap::new();
        for (pod, counts) in now {
            fresh.insert((source, pod), counts);
        }
        for (key, was) in old {
            let kept = fresh.get(&key).is_some_and(|c| !fell(&was, c));
            if !kept {
                for (path, c) in was.iter() {
                    st.retired.add(path, c);
                }
            }
        }
        st.pods.extend(fresh);
    }

    /// The node's sums per path, retired counts included.
    pub fn node_sums(&self) -> PathCounts {
        let st = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let mut sums = st.retired;
        for counts in st.pods.values() {
            for (path, c) in counts.iter() {
                sums.add(path, c);
            }
        }
        sums
    }

    /// Each pod's counts, with who read them.
    pub fn pods(&self) -> Vec<(Source, PodKey, PathCounts)> {
        let st = self.store.lock().unwrap_or_else(|p| p.into_inner());
        st.pods
            .iter()
            .map(|((s, k), c)| (*s, k.clone(), *c))
            .collect()
    }
}

/// Whether any path's count is lower now: the counters were zeroed in between.
fn fell(was: &PathCounts, now: &PathCounts) -> bool {
    CountedPath::ALL
        .iter()
        .any(|&p| now.get(p).packets < was.get(p).packets || now.get(p).bytes < was.get(p).bytes)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    namespace: String,
    pod: String,
    uid: String,
    capture: &'static str,
    path: &'static str,
}

const PACKETS: (&str, &str) = (
    "redirect_cni_capture_packets",
    "Packets the capture rules counted per path (in the nat stage, one per connection)",
);
const BYTES: (&str, &str) = (
    "redirect_cni_capture_bytes",
    "Bytes of the packets the capture rules counted per path",
);

/// A metric's name and help, and the part of a count it gives.
type Measure = ((&'static str, &'static str), fn(Count) -> u64);

impl Collector for CaptureCounts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let pick: [Measure; 2] = [(PACKETS, |c| c.packets), (BYTES, |c| c.bytes)];
        for ((name, help), value) in pick {
            let counter = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            match self.mode {
                CountersMode::Off => {}
                CountersMode::Node => {
                    for (path, c) in self.node_sums().iter() {
                        let labels = PathLabels { path: path.name() };
                        ConstCounter::new(value(c)).encode(family.encode_family(&labels)?)?;
                    }
                }
                CountersMode::Pod => {
                    for (source, pod, counts) in self.pods() {
                        for (path, c) in counts.iter() {
                            let labels = PodLabels {
                                namespace: pod.namespace.clone(),
                                pod: pod.name.clone(),
                                uid: pod.uid.clone(),
                                capture: source.word(),
                                path: path.name(),
                            };
                            ConstCounter::new(value(c)).encode(family.encode_family(&labels)?)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(packets: u64) -> PathCounts {
        let mut c = PathCounts::default();
        let bytes = packets * 60;
        c.add(CountedPath::OutboundCaptured, Count { packets, bytes });
        c
    }

    fn pod(name: &str) -> PodKey {
        PodKey {
            namespace: "default".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn outbound(c: &CaptureCounts) -> u64 {
        c.node_sums().get(CountedPath::OutboundCaptured).packets
    }

    #[test]
    fn the_nodes_sums_never_fall_when_a_pod_goes_or_is_zeroed() {
        let c = CaptureCounts::new(CountersMode::Node);
        c.set(
            Source::Sidecar,
            vec![(pod("a"), counts(5)), (pod("b"), counts(3))],
        );
        c.set(Source::Ambient, vec![(pod("c"), counts(2))]);
        assert_eq!(outbound(&c), 10);
        // b goes; a's table is programmed again (its counters restart from 0, then 1).
        c.set(Source::Sidecar, vec![(pod("a"), counts(1))]);
        assert_eq!(outbound(&c), 5 + 3 + 1 + 2);
        // The ambient reader does not touch the sidecar reader's pods.
        c.set(Source::Ambient, vec![]);
        assert_eq!(outbound(&c), 11);
        assert_eq!(c.pods().len(), 1);
    }

    #[test]
    fn per_pod_mode_names_pods_and_node_mode_does_not() {
        let per_pod = CaptureCounts::new(CountersMode::Pod);
        let node = CaptureCounts::new(CountersMode::Node);
        for c in [&per_pod, &node] {
            c.set(Source::Ambient, vec![(pod("web-1"), counts(7))]);
        }
        let text = |c: &CaptureCounts| {
            let mut r = prometheus_client::registry::Registry::default();
            r.register_collector(Box::new(c.clone()));
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &r).unwrap();
            s
        };
        let p = text(&per_pod);
        assert!(
            p.contains(
                "redirect_cni_capture_packets_total{namespace=\"default\",pod=\"web-1\",\
                 uid=\"uid-web-1\",capture=\"ambient\",path=\"outbound_captured\"} 7"
            ),
            "{p}"
        );
        assert!(p.contains("path=\"excluded\"} 0"), "{p}");
        let n = text(&node);
        assert!(
            n.contains("redirect_cni_capture_packets_total{path=\"outbound_captured\"} 7"),
            "{n}"
        );
        assert!(n.contains("redirect_cni_capture_bytes_total{path=\"outbound_captured\"} 420"));
        assert!(!n.contains("web-1"), "{n}");
    }

    #[test]
    fn a_bad_mode_names_the_accepted_values() {
        assert_eq!(CountersMode::parse(" pod "), Ok(CountersMode::Pod));
        assert_eq!(CountersMode::parse("false"), Ok(CountersMode::Off));
        let e = CountersMode::parse("yes").unwrap_err();
        assert!(e.contains("off, node") && e.contains("pod"), "{e}");
    }
}
