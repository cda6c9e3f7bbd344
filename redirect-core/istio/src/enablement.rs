//! Istio's ambient enablement selectors (`ambient.enablementSelectors`,
//! `AMBIENT_ENABLEMENT_SELECTOR`, the plugin's `enablement_selectors`): a list of terms, each a
//! pod selector and a namespace selector in Kubernetes' `LabelSelector` form, a pod enrolled when
//! any term matches both its labels and its namespace's. An empty selector matches everything,
//! as in Istio (`labels.Everything()`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The label Istio's default terms read.
const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// A Kubernetes `LabelSelector`: every `matchLabels` pair and every expression must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    /// Each key with exactly this value.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub match_labels: BTreeMap<String, String>,
    /// Each requirement.
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: Operator,
    /// The values of `In` and `NotIn` (none for the other two).
    #[serde(
        default,
        deserialize_with = "null_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<String>,
}

/// Kubernetes' set-based operators, as a `LabelSelector` spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    /// The key is there with one of the values.
    In,
    /// The key is absent, or there with none of the values.
    NotIn,
    /// The key is there.
    Exists,
    /// The key is absent.
    DoesNotExist,
}

/// One term: the pod's labels against `pod_selector`, its namespace's against
/// `namespace_selector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnablementSelector {
    /// Matched against the pod's labels (empty: every pod).
    #[serde(default, deserialize_with = "null_default")]
    pub pod_selector: LabelSelector,
    /// Matched against the labels of the pod's namespace (empty: every namespace).
    #[serde(default, deserialize_with = "null_default")]
    pub namespace_selector: LabelSelector,
}

/// The terms, checked as Kubernetes checks a `LabelSelector` (Istio's agent refuses to start
/// on one it cannot compile, and so do we).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct EnablementSelectors(Vec<EnablementSelector>);

/// A selector Kubernetes would refuse, named by its place in the list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("enablement selector {term}, {side}: {problem}")]
pub struct SelectorError {
    /// The term's index (from 0).
    pub term: usize,
    /// `podSelector` or `namespaceSelector`.
    pub side: &'static str,
    /// What Kubernetes would say of it.
    pub problem: String,
}

impl Default for EnablementSelectors {
    /// Istio's chart default.
    fn default() -> Self {
        Self::istio_default()
    }
}

impl EnablementSelectors {
    /// Istio's chart default (1.25 and later): the pod labelled `istio.io/dataplane-mode=ambient`,
    /// or a pod not labelled `none` in a namespace labelled `ambient`.
    pub fn istio_default() -> Self {
        let ambient = || LabelSelector {
            match_labels: BTreeMap::from([(DATAPLANE_MODE.into(), "ambient".into())]),
            match_expressions: Vec::new(),
        };
        Self(vec![
            EnablementSelector {
                pod_selector: ambient(),
                namespace_selector: LabelSelector::default(),
            },
            EnablementSelector {
                pod_selector: LabelSelector {
                    match_labels: BTreeMap::new(),
                    match_expressions: vec![Requirement {
                        key: DATAPLANE_MODE.into(),
                        operator: Operator::NotIn,
                        values: vec!["none".into()],
                    }],
                },
                namespace_selector: ambient(),
            },
        ])
    }

    /// The terms, checked.
    pub fn new(terms: Vec<EnablementSelector>) -> Result<Self, SelectorError> {
        for (term, t) in terms.iter().enumerate() {
            for (side, s) in [
                ("podSelector", &t.pod_selector),
                ("namespaceSelector", &t.namespace_selector),
            ] {
                s.check().map_err(|problem| SelectorError {
                    term,
                    side,
                    problem,
                })?;
            }
        }
        Ok(Self(terms))
    }

    /// The terms.
    pub fn terms(&self) -> &[EnablementSelector] {
        &self.0
    }

    /// Whether these are Istio's default terms.
    pub fn is_istio_default(&self) -> bool {
        *self == Self::istio_default()
    }

    /// Whether any term matches the pod's labels and its namespace's.
    pub fn matches(
        &self,
        pod: &BTreeMap<String, String>,
        namespace: &BTreeMap<String, String>,
    ) -> bool {
        self.0
            .iter()
            .any(|t| t.pod_selector.matches(pod) && t.namespace_selector.matches(namespace))
    }
}

impl<'de> Deserialize<'de> for EnablementSelectors {
    /// A list of terms; one Kubernetes would refuse is an error naming it.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let terms = Option::<Vec<EnablementSelector>>::deserialize(d)?.unwrap_or_default();
        Self::new(terms).map_err(serde::de::Error::custom)
    }
}

impl LabelSelector {
    /// Whether the labels satisfy every pair and every requirement (an empty selector: yes).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// What `metav1.LabelSelectorAsSelector` refuses: a bad key or value, values given to
    /// `Exists`/`DoesNotExist` or missing from `In`/`NotIn`.
    fn check(&self) -> Result<(), String> {
        for (k, v) in &self.match_labels {
            check_key(k).map_err(|why| format!("matchLabels key {k:?}: {why}"))?;
            check_value(v).map_err(|why| format!("matchLabels {k:?} value {v:?}: {why}"))?;
        }
        for r in &self.match_expressions {
            let key = &r.key;
            check_key(key).map_err(|why| format!("matchExpressions key {key:?}: {why}"))?;
            let op = r.operator;
            match (op, r.values.is_empty()) {
                (Operator::In | Operator::NotIn, true) => {
                    return Err(format!(
                        "matchExpressions key {key:?}: operator {op:?} needs at least one value"
                    ))
                }
                (Operator::Exists | Operator::DoesNotExist, false) => {
                    return Err(format!(
                        "matchExpressions key {key:?}: operator {op:?} takes no values (give none)"
                    ))
                }
                _ => {}
            }
            for v in &r.values {
                check_value(v)
                    .map_err(|why| format!("matchExpressions key {key:?} value {v:?}: {why}"))?;
            }
        }
        Ok(())
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        let listed = || {
            let values: BTreeSet<&String> = self.values.iter().collect();
            got.is_some_and(|v| values.contains(v))
        };
        match self.operator {
            Operator::In => listed(),
            Operator::NotIn => !listed(),
            Operator::Exists => got.is_some(),
            Operator::DoesNotExist => got.is_none(),
        }
    }
}

/// A null is the empty value, as Go's decoders make it.
fn null_default<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn check_key(key: &str) -> Result<(), &'static str> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
                return Err("the prefix must be a DNS subdomain (lower case, such as istio.io)");
            }
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err("the name part must not be empty");
    }
    check_value(name)
}

/// A label value (or a key's name part): up to 63 characters, alphanumeric at both ends,
/// `-`, `_` and `.` between.
fn check_value(v: &str) -> Result<(), &'static str> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > 63 {
        return Err("at most 63 characters");
    }
    if !v
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || !alnum(v.chars().next())
        || !alnum(v.chars().last())
    {
        return Err(
            "letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
        );
    }
    Ok(())
}
