//! `REPAIR_LABEL_SELECTORS` and `REPAIR_FIELD_SELECTORS` matched on the node, over the pods the
//! shared pod informer holds (the API server no longer filters them for repair alone): the
//! selector grammar of Kubernetes (`key`, `!key`, `key=value`, `key!=value`, `key in (a,b)`,
//! `key notin (a,b)`; fields `field=value`, `field!=value` over the fields a pod selects on).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Label {
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A pod field compared with a value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Field {
    path: &'static str,
    value: String,
    equal: bool,
}

/// The pods a controller takes: every requirement holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFilter {
    labels: Vec<Label>,
    fields: Vec<Field>,
}

/// The fields the API server lets a pod be selected by.
const POD_FIELDS: [&str; 10] = [
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

impl PodFilter {
    /// A filter no pod meets.
    pub fn none() -> PodFilter {
        PodFilter {
            labels: vec![Label::Exists(String::new()), Label::Absent(String::new())],
            fields: Vec::new(),
        }
    }

    /// Parses both selectors; an error names the requirement that cannot be read and why.
    pub fn parse(labels: &str, fields: &str) -> Result<PodFilter, String> {
        let labels = split(labels)
            .into_iter()
            .map(|r| label(&r))
            .collect::<Result<_, _>>()?;
        let fields = split(fields)
            .into_iter()
            .map(|r| field(&r))
            .collect::<Result<_, _>>()?;
        Ok(PodFilter { labels, fields })
    }

    /// Whether `pod` meets every requirement.
    pub fn matches(&self, pod: &Pod) -> bool {
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        self.labels.iter().all(|l| match l {
            Label::Exists(k) => labels.contains_key(k),
            Label::Absent(k) => !labels.contains_key(k),
            Label::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Label::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        }) && self
            .fields
            .iter()
            .all(|f| (field_value(pod, f.path) == f.value) == f.equal)
    }
}

/// The requirements, split at the commas outside parentheses.
fn split(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0u32);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

fn label(r: &str) -> Result<Label, String> {
    let bad = |why: &str| format!("label requirement {r:?}: {why}");
    if let Some((k, v)) = r.split_once("!=") {
        return Ok(Label::NotIn(
            key(k).map_err(|w| bad(&w))?,
            vec![v.trim().into()],
        ));
    }
    if let Some((k, v)) = r.split_once('=') {
        let v = v.strip_prefix('=').unwrap_or(v);
        return Ok(Label::In(
            key(k).map_err(|w| bad(&w))?,
            vec![v.trim().into()],
        ));
    }
    let words: Vec<&str> = r.splitn(2, char::is_whitespace).collect();
    if let [k, rest] = words.as_slice() {
        let rest = rest.trim();
        let (op, set) = rest
            .split_once('(')
            .ok_or_else(|| bad("expected `in (...)` or `notin (...)`"))?;
        let set = set
            .strip_suffix(')')
            .ok_or_else(|| bad("a `(` without `)`"))?;
        let values = set.split(',').map(|v| v.trim().to_string()).collect();
        return match op.trim() {
            "in" => Ok(Label::In(key(k).map_err(|w| bad(&w))?, values)),
            "notin" => Ok(Label::NotIn(key(k).map_err(|w| bad(&w))?, values)),
            other => Err(bad(&format!("unknown operator {other:?}"))),
        };
    }
    match r.strip_prefix('!') {
        Some(k) => Ok(Label::Absent(key(k).map_err(|w| bad(&w))?)),
        None => Ok(Label::Exists(key(r).map_err(|w| bad(&w))?)),
    }
}

fn key(k: &str) -> Result<String, String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_string())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

fn field(r: &str) -> Result<Field, String> {
    let (path, value, equal) = match r.split_once("!=") {
        Some((p, v)) => (p, v, false),
        None => match r.split_once('=') {
            Some((p, v)) => (p, v.strip_prefix('=').unwrap_or(v), true),
            None => {
                return Err(format!(
                    "field requirement {r:?}: expected field=value or field!=value"
                ))
            }
        },
    };
    let path = POD_FIELDS
        .into_iter()
        .find(|f| *f == path.trim())
        .ok_or_else(|| {
            format!(
                "field requirement {r:?}: pods are selected by {} only",
                POD_FIELDS.join(", ")
            )
        })?;
    Ok(Field {
        path,
        value: value.trim().to_string(),
        equal,
    })
}

/// A selectable field's value, as the API server writes it ("" when unset).
fn field_value(pod: &Pod, path: &str) -> String {
    let (m, spec, status) = (&pod.metadata, pod.spec.as_ref(), pod.status.as_ref());
    let s = |v: Option<&String>| v.cloned().unwrap_or_default();
    match path {
        "metadata.name" => s(m.name.as_ref()),
        "metadata.namespace" => s(m.namespace.as_ref()),
        "spec.nodeName" => s(spec.and_then(|p| p.node_name.as_ref())),
        "spec.restartPolicy" => s(spec.and_then(|p| p.restart_policy.as_ref())),
        "spec.schedulerName" => s(spec.and_then(|p| p.scheduler_name.as_ref())),
        "spec.serviceAccountName" => s(spec.and_then(|p| p.service_account_name.as_ref())),
        "spec.hostNetwork" => spec
            .and_then(|p| p.host_network)
            .unwrap_or(false)
            .to_string(),
        "status.phase" => s(status.and_then(|p| p.phase.as_ref())),
        "status.podIP" => s(status.and_then(|p| p.pod_ip.as_ref())),
        "status.nominatedNodeName" => s(status.and_then(|p| p.nominated_node_name.as_ref())),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": labels},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn label_and_field_requirements_match_as_the_api_server_does() {
        let p = pod(
            serde_json::json!({"app": "web", "tier": "front"}),
            "Running",
        );
        let yes = [
            ("", ""),
            ("app=web", ""),
            ("app==web,tier", ""),
            ("app in (web, api),!canary", "status.phase=Running"),
            (
                "tier notin (back)",
                "metadata.namespace==shop,spec.nodeName!=n2",
            ),
        ];
        for (l, f) in yes {
            assert!(PodFilter::parse(l, f).unwrap().matches(&p), "{l:?} {f:?}");
        }
        let no = [
            ("app=api", ""),
            ("app!=web", ""),
            ("canary", ""),
            ("!app", ""),
            ("tier in (back)", ""),
            ("", "status.phase=Pending"),
            ("", "metadata.name!=web"),
        ];
        for (l, f) in no {
            assert!(!PodFilter::parse(l, f).unwrap().matches(&p), "{l:?} {f:?}");
        }
    }

    #[test]
    fn a_requirement_that_cannot_be_read_is_named() {
        let e = PodFilter::parse("app in web", "").unwrap_err();
        assert!(e.contains("app in web"), "{e}");
        let e = PodFilter::parse("", "spec.containers=x").unwrap_err();
        assert!(
            e.contains("spec.containers") && e.contains("status.phase"),
            "{e}"
        );
        let e = PodFilter::parse("a b=c", "").unwrap_err();
        assert!(e.contains("a b"), "{e}");
    }
}
