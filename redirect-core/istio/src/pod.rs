//! What capture needs to know about a Kubernetes pod, whether it came from the runtime's
//! `io.kubernetes.cri.pod-annotations` capability (annotations only) or from the API server
//! (the whole spec). `mesh` turns it into a decision and a `CaptureConfig`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A pod as capture sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    /// The pod's namespace (empty when the source does not say, as an annotations file).
    pub namespace: String,
    /// The pod's name (empty when the source does not say).
    pub name: String,
    /// `metadata.annotations`, by key.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `metadata.labels`, by key.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The containers, when the spec is known (from the API); `None` with annotations only.
    #[serde(default)]
    pub spec: Option<PodSpecInfo>,
}

/// The parts of a pod spec that decide capture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSpecInfo {
    /// `spec.containers`.
    #[serde(default)]
    pub containers: Vec<ContainerInfo>,
    /// `spec.initContainers` (native sidecars among them).
    #[serde(default)]
    pub init_containers: Vec<ContainerInfo>,
}

/// One container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// The container's name (`istio-proxy`, `istio-init`, ...).
    pub name: String,
    /// Its `args` (`proxy sidecar` for Istio's proxy).
    #[serde(default)]
    pub args: Vec<String>,
    /// `env[].value` literals only (Istio ignores `valueFrom`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `securityContext.runAsUser`.
    #[serde(default)]
    pub run_as_user: Option<i64>,
    /// `securityContext.runAsGroup`.
    #[serde(default)]
    pub run_as_group: Option<i64>,
}

impl PodSpecInfo {
    /// A container by name, among containers then init containers (native sidecars are init
    /// containers).
    pub fn container(&self, name: &str) -> Option<&ContainerInfo> {
        self.containers
            .iter()
            .chain(&self.init_containers)
            .find(|c| c.name == name)
    }
}

/// A pod read from a file an operator has at hand: `kubectl get pod -o json` output (the
/// annotations, labels and the containers' args, env values and runAsUser/runAsGroup), a JSON
/// object of annotations, or the Downward API's annotations file (`key="value"` lines).
pub fn pod_from_text(text: &str) -> Result<PodInfo, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        return match v.get("metadata") {
            Some(meta) => Ok(PodInfo {
                namespace: str_at(meta, "namespace"),
                name: str_at(meta, "name"),
                annotations: string_map(meta.get("annotations"), "metadata.annotations")?,
                labels: string_map(meta.get("labels"), "metadata.labels")?,
                spec: v.get("spec").map(spec_of),
            }),
            None => Ok(PodInfo {
                annotations: string_map(Some(&v), "the annotations object")?,
                ..PodInfo::default()
            }),
        };
    }
    let mut annotations = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "line {}: {line:?} is not key=\"value\" (the Downward API annotations file format)",
                n + 1
            )
        };
        let (key, value) = line.split_once('=').ok_or_else(bad)?;
        let value = unquote(value).ok_or_else(bad)?;
        annotations.insert(key.to_string(), value);
    }
    Ok(PodInfo {
        annotations,
        ..PodInfo::default()
    })
}

fn str_at(v: &serde_json::Value, key: &str) -> String {
    v.get(key)
        .and_then(|x| x.as_str())
        .unwrap_or_default()
        .to_string()
}

fn string_map(
    v: Option<&serde_json::Value>,
    what: &str,
) -> Result<BTreeMap<String, String>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(BTreeMap::new());
    };
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{what} is not an object"))?;
    obj.iter()
        .map(|(k, x)| match x.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(format!("{what}: {k:?} is {x}, not a string")),
        })
        .collect()
}

fn spec_of(spec: &serde_json::Value) -> PodSpecInfo {
    let containers = |key: &str| -> Vec<ContainerInfo> {
        spec.get(key)
            .and_then(|c| c.as_array())
            .map(|list| list.iter().map(container_of).collect())
            .unwrap_or_default()
    };
    PodSpecInfo {
        containers: containers("containers"),
        init_containers: containers("initContainers"),
    }
}

fn container_of(c: &serde_json::Value) -> ContainerInfo {
    let sc = c.get("securityContext");
    let id = |k: &str| sc.and_then(|s| s.get(k)).and_then(|x| x.as_i64());
    ContainerInfo {
        name: str_at(c, "name"),
        args: c
            .get("args")
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        env: c
            .get("env")
            .and_then(|e| e.as_array())
            .map(|e| {
                e.iter()
                    .filter_map(|x| {
                        Some((
                            x.get("name")?.as_str()?.to_string(),
                            x.get("value")?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        run_as_user: id("runAsUser"),
        run_as_group: id("runAsGroup"),
    }
}

/// A Go `%q` string as the Downward API writes it: `"..."` with `\"`, `\\`, `\n`, `\t` escapes.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            c @ ('"' | '\\') => c,
            _ => return None,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_file_forms() {
        let downward = "sidecar.istio.io/status=\"{\\\"containers\\\":[\\\"istio-proxy\\\"]}\"\ntraffic.sidecar.istio.io/excludeInboundPorts=\"8080\"\n";
        let p = pod_from_text(downward).unwrap();
        assert_eq!(
            p.annotations["sidecar.istio.io/status"],
            r#"{"containers":["istio-proxy"]}"#
        );
        assert_eq!(
            p.annotations["traffic.sidecar.istio.io/excludeInboundPorts"],
            "8080"
        );
        let p = pod_from_text(r#"{"a": "1", "b": "x"}"#).unwrap();
        assert_eq!(p.annotations.len(), 2);
        let pod = r#"{"metadata": {"name": "web", "namespace": "shop", "annotations": {"a": "1"}},
            "spec": {"containers": [{"name": "istio-proxy", "securityContext": {"runAsUser": 1000620000},
            "env": [{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"}, {"name": "X", "valueFrom": {}}]}]}}"#;
        let p = pod_from_text(pod).unwrap();
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("web", "shop"));
        let proxy = p.spec.as_ref().unwrap().container("istio-proxy").unwrap();
        assert_eq!(proxy.run_as_user, Some(1000620000));
        assert_eq!(proxy.env.len(), 1);
        for (bad, needle) in [
            ("{\"a\": 1}", "\"a\" is 1"),
            ("{oops", "not valid JSON"),
            ("key=unquoted", "line 1"),
            ("novalue", "line 1"),
        ] {
            let e = pod_from_text(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
