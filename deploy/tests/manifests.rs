//! The Kubernetes manifests in deploy/kubernetes and deploy/openshift are valid Kubernetes YAML.
//!
//! Every `*.yaml` under deploy/ (the chart's templates aside) is parsed as a multi-document stream and each document is
//! checked: identity (apiVersion, kind, a DNS-1123 name, string-map labels and annotations),
//! structure (kinds k8s-openapi knows are deserialized into the typed struct and serialized back:
//! a key lost in the round trip is a field Kubernetes does not know, since k8s-openapi ignores
//! unknown fields; the two OpenShift/Multus CRDs are checked against their schema's field list),
//! and the references between the documents of one file (service account, role, ConfigMaps,
//! selector, volumes, images, the pinned SCC). A file beside a platform's `redirect-cni.yaml`
//! (the RBAC of one setting: a repair mode, untaint, ambient mode) may name that file's
//! ServiceAccount, since it is applied after it. The checker is tested on inline YAML; then what each repair mode needs (docs/repair.md)
//! is checked in the manifests: RBAC per mode, and the DaemonSet's capabilities and host mounts
//! for in-place repair, its node name, port, probes and scrape annotations.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

// --- finding and parsing ------------------------------------------------------------------------

/// Each platform's main manifest; the other files of its folder are applied after it.
const MAIN: &str = "redirect-cni.yaml";

fn deploy_dir() -> PathBuf {
    redirect_testkit::docs::workspace().join("deploy")
}

/// The `.yaml` files under `dir`, the Helm chart's aside (templates, not manifests).
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with("helm"))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            yaml_files(&p, out);
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
}

/// One document of a file, as JSON.
struct Doc {
    /// "#<index> <kind>/<name>", for messages.
    label: String,
    kind: String,
    name: String,
    value: Value,
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut v = v;
    for p in path {
        v = v.get(p)?;
    }
    v.as_str()
}

/// Parses `text` as a multi-document YAML stream. Empty documents (`---` with nothing after it)
/// are skipped, as kubectl skips them.
fn parse_stream(text: &str, problems: &mut Vec<String>) -> Vec<Doc> {
    let mut docs = Vec::new();
    for (i, de) in yaml_serde::Deserializer::from_str(text).enumerate() {
        // Through yaml_serde's own Value first: it rejects duplicate keys, which serde_json's
        // map would silently collapse into the last one.
        let yaml = match yaml_serde::Value::deserialize(de) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("document #{i}: YAML error: {e}"));
                break;
            }
        };
        let value = match serde_json::to_value(&yaml) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("document #{i}: not representable as JSON: {e}"));
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        let kind = str_at(&value, &["kind"]).unwrap_or("?").to_string();
        let name = str_at(&value, &["metadata", "name"])
            .unwrap_or("?")
            .to_string();
        docs.push(Doc {
            label: format!("#{i} {kind}/{name}"),
            kind,
            name,
            value,
        });
    }
    docs
}

// --- name and label syntax ----------------------------------------------------------------------

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// The name part of a label or annotation key, or a label value (non-empty here).
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// What Kubernetes requires of `metadata.name` for a kind.
fn name_ok(kind: &str, name: &str) -> (bool, &'static str) {
    match kind {
        "Namespace" => (is_dns1123_label(name), "a DNS-1123 label"),
        "Service" => (is_dns1035_label(name), "a DNS-1035 label"),
        // Kubernetes allows any path segment for RBAC objects; we hold them to the same
        // DNS-1123 subdomain as everything else.
        _ => (is_dns1123_subdomain(name), "a DNS-1123 subdomain"),
    }
}

// --- the checks of one document -----------------------------------------------------------------

/// Problems of one document, each with the JSON path it is about.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn at(&mut self, path: &str, msg: impl std::fmt::Display) {
        let path = if path.is_empty() { "(document)" } else { path };
        self.0.push(format!("{path}: {msg}"));
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `labels` and `annotations` of an object metadata at `path`.
fn check_meta_maps(meta: &Value, path: &str, p: &mut Problems) {
    for field in ["labels", "annotations"] {
        let Some(m) = meta.get(field) else { continue };
        let fpath = join(path, field);
        let Some(m) = m.as_object() else {
            p.at(&fpath, "not a map");
            continue;
        };
        for (k, v) in m {
            let kpath = format!("{fpath}.{k}");
            if !is_qualified_name(k) {
                p.at(&kpath, "the key is not a qualified name (prefix/name)");
            }
            match v.as_str() {
                None => p.at(&kpath, format!("the value {v} is not a string (quote it)")),
                Some(s) if field == "labels" && !is_label_value(s) => {
                    p.at(&kpath, format!("{s:?} is not a valid label value"))
                }
                Some(_) => {}
            }
        }
    }
}

/// Every `metadata` object in the document: the top-level one and those of templates.
fn check_all_meta_maps(v: &Value, path: &str, p: &mut Problems) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let kpath = join(path, k);
                if k == "metadata" && v.is_object() {
                    check_meta_maps(v, &kpath, p);
                }
                check_all_meta_maps(v, &kpath, p);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                check_all_meta_maps(v, &format!("{path}[{i}]"), p);
            }
        }
        _ => {}
    }
}

fn check_identity(doc: &Value, p: &mut Problems) {
    for key in ["apiVersion", "kind"] {
        match doc.get(key) {
            Some(Value::String(s)) if !s.is_empty() => {}
            Some(v) => p.at(key, format!("{v} is not a non-empty string")),
            None => p.at(key, "missing"),
        }
    }
    match doc.get("metadata") {
        Some(Value::Object(_)) => {}
        Some(v) => return p.at("metadata", format!("{v} is not a map")),
        None => return p.at("metadata", "missing"),
    }
    let kind = str_at(doc, &["kind"]).unwrap_or("");
    match doc["metadata"].get("name") {
        Some(Value::String(name)) => {
            let (ok, what) = name_ok(kind, name);
            if !ok {
                p.at("metadata.name", format!("{name:?} is not {what}"));
            }
        }
        Some(v) => p.at("metadata.name", format!("{v} is not a string")),
        None => p.at("metadata.name", "missing"),
    }
    if let Some(ns) = doc["metadata"].get("namespace") {
        match ns.as_str() {
            Some(s) if is_dns1123_label(s) => {}
            _ => p.at(
                "metadata.namespace",
                format!("{ns} is not a DNS-1123 label"),
            ),
        }
        if CLUSTER_SCOPED.contains(&kind) {
            p.at("metadata.namespace", format!("{kind} is cluster-scoped"));
        }
    }
    check_all_meta_maps(doc, "", p);
}

const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "SecurityContextConstraints",
    "FlowSchema",
    "PriorityLevelConfiguration",
];

/// Walks `orig` and reports every key (with its JSON path) that is missing from `round`, the
/// same document after a typed round trip, and every scalar that changed.
///
/// Normalizations that are not errors: an explicit `null` is the same as an absent key in
/// Kubernetes, so a dropped `null` is fine; a number that comes back as the same digits in a
/// string (or the other way round) is IntOrString or a Quantity keeping its value. k8s-openapi
/// keeps empty maps and lists that were given (they are `Some(empty)`), so those need no
/// exception; a dropped `{}` or `[]` is reported like any other dropped key.
fn compare_round_trip(orig: &Value, round: &Value, path: &str, p: &mut Problems) {
    match (orig, round) {
        (Value::Object(o), Value::Object(r)) => {
            for (k, v) in o {
                let kpath = join(path, k);
                match r.get(k) {
                    Some(rv) => compare_round_trip(v, rv, &kpath, p),
                    None if v.is_null() => {}
                    None => p.at(
                        &kpath,
                        "unknown field (dropped by the typed round trip: misspelled or misplaced?)",
                    ),
                }
            }
        }
        (Value::Array(o), Value::Array(r)) if o.len() == r.len() => {
            for (i, (ov, rv)) in o.iter().zip(r).enumerate() {
                compare_round_trip(ov, rv, &format!("{path}[{i}]"), p);
            }
        }
        (o, r) if o == r => {}
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n))
            if n.to_string() == *s => {}
        (o, r) => p.at(path, format!("{o} came back as {r}")),
    }
}

fn round_trip<T: Resource + DeserializeOwned + Serialize>(doc: &Value, p: &mut Problems) {
    match serde_json::from_value::<T>(doc.clone()) {
        Ok(typed) => {
            let round = serde_json::to_value(&typed).expect("serialize");
            compare_round_trip(doc, &round, "", p);
        }
        Err(e) => p.at(
            "",
            format!("not a valid {}/{}: {e}", T::API_VERSION, T::KIND),
        ),
    }
}

/// A Kubernetes resource.Quantity: a decimal number with an optional binary (Ki..Ei), decimal
/// (n, u, m, k, M..E) or exponent suffix. k8s-openapi keeps quantities as plain strings.
fn is_quantity(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let number_ok = number.chars().filter(|c| *c == '.').count() <= 1
        && number.chars().any(|c| c.is_ascii_digit());
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e))
        .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    number_ok && suffix_ok
}

/// Every quantity map in `v`: `resources.requests`, `resources.limits` and ResourceQuota's
/// `spec.hard`.
fn check_quantities(v: &Value, path: &str, parent: &str, p: &mut Problems) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let kpath = join(path, k);
                let is_quantity_map = (parent == "resources" && (k == "requests" || k == "limits"))
                    || kpath == "spec.hard";
                if let (true, Some(q)) = (is_quantity_map, v.as_object()) {
                    for (name, q) in q {
                        let ok = match q {
                            Value::String(s) => is_quantity(s),
                            Value::Number(n) => n.as_f64().is_some(),
                            _ => false,
                        };
                        if !ok {
                            p.at(&format!("{kpath}.{name}"), format!("{q} is not a quantity"));
                        }
                    }
                }
                check_quantities(v, &kpath, k, p);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                check_quantities(v, &format!("{path}[{i}]"), "", p);
            }
        }
        _ => {}
    }
}

/// A small schema: which keys an object may have, and the schema of each (None: a leaf or a
/// value not looked into).
struct Fields(&'static [(&'static str, Option<&'static Fields>)]);

const STRATEGY: Fields = Fields(&[
    ("type", None),
    ("ranges", None),
    ("uid", None),
    ("uidRangeMin", None),
    ("uidRangeMax", None),
]);
const SELINUX_CONTEXT: Fields =
    Fields(&[("type", None), ("seLinuxOptions", Some(&SELINUX_OPTIONS))]);
const SELINUX_OPTIONS: Fields = Fields(&[
    ("level", None),
    ("role", None),
    ("type", None),
    ("user", None),
]);
/// security.openshift.io/v1 SecurityContextConstraints (openshift/api, the CRD's schema).
const SCC: Fields = Fields(&[
    ("apiVersion", None),
    ("kind", None),
    ("metadata", None),
    ("allowHostDirVolumePlugin", None),
    ("allowHostIPC", None),
    ("allowHostNetwork", None),
    ("allowHostPID", None),
    ("allowHostPorts", None),
    ("allowPrivilegeEscalation", None),
    ("allowPrivilegedContainer", None),
    ("allowedCapabilities", None),
    ("allowedFlexVolumes", None),
    ("allowedUnsafeSysctls", None),
    ("defaultAddCapabilities", None),
    ("defaultAllowPrivilegeEscalation", None),
    ("forbiddenSysctls", None),
    ("fsGroup", Some(&STRATEGY)),
    ("groups", None),
    ("priority", None),
    ("readOnlyRootFilesystem", None),
    ("requiredDropCapabilities", None),
    ("runAsUser", Some(&STRATEGY)),
    ("seLinuxContext", Some(&SELINUX_CONTEXT)),
    ("seccompProfiles", None),
    ("supplementalGroups", Some(&STRATEGY)),
    ("userNamespaceLevel", None),
    ("users", None),
    ("volumes", None),
]);
/// The CRD's `required` list (the value may be null, but the key must be there).
const SCC_REQUIRED: &[&str] = &[
    "allowHostDirVolumePlugin",
    "allowHostIPC",
    "allowHostNetwork",
    "allowHostPID",
    "allowHostPorts",
    "allowPrivilegedContainer",
    "allowedCapabilities",
    "defaultAddCapabilities",
    "priority",
    "readOnlyRootFilesystem",
    "requiredDropCapabilities",
    "volumes",
];
/// k8s.cni.cncf.io/v1 NetworkAttachmentDefinition (Multus's CRD: spec.config, a JSON string).
const NAD: Fields = Fields(&[
    ("apiVersion", None),
    ("kind", None),
    ("metadata", None),
    ("spec", Some(&NAD_SPEC)),
]);
const NAD_SPEC: Fields = Fields(&[("config", None)]);

fn check_fields(v: &Value, schema: &Fields, path: &str, p: &mut Problems) {
    let Some(m) = v.as_object() else {
        if !v.is_null() {
            p.at(path, format!("{v} is not a map"));
        }
        return;
    };
    for (k, v) in m {
        let kpath = join(path, k);
        match schema.0.iter().find(|(name, _)| name == k) {
            Some((_, Some(sub))) => check_fields(v, sub, &kpath, p),
            Some((_, None)) => {}
            None => p.at(&kpath, "unknown field (not in the CRD's schema)"),
        }
    }
}

fn check_scc(doc: &Value, p: &mut Problems) {
    check_fields(doc, &SCC, "", p);
    for key in SCC_REQUIRED {
        if doc.get(key).is_none() {
            p.at(key, "missing (required by the CRD; null is allowed)");
        }
    }
    for key in [
        "allowHostDirVolumePlugin",
        "allowHostIPC",
        "allowHostNetwork",
        "allowHostPID",
        "allowHostPorts",
        "allowPrivilegeEscalation",
        "allowPrivilegedContainer",
        "defaultAllowPrivilegeEscalation",
        "readOnlyRootFilesystem",
    ] {
        if let Some(v) = doc.get(key) {
            if !(v.is_boolean() || v.is_null()) {
                p.at(key, format!("{v} is not a boolean"));
            }
        }
    }
    for key in [
        "allowedCapabilities",
        "allowedUnsafeSysctls",
        "defaultAddCapabilities",
        "forbiddenSysctls",
        "groups",
        "requiredDropCapabilities",
        "seccompProfiles",
        "users",
        "volumes",
    ] {
        match doc.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {}
            Some(v) => p.at(key, format!("{v} is not a list of strings")),
        }
    }
    if let Some(v) = doc.get("priority") {
        if !(v.is_null() || v.is_i64()) {
            p.at("priority", format!("{v} is not an integer or null"));
        }
    }
}

fn check_nad(doc: &Value, p: &mut Problems) {
    check_fields(doc, &NAD, "", p);
    if let Some(config) = doc.get("spec").and_then(|s| s.get("config")) {
        match config.as_str().map(serde_json::from_str::<Value>) {
            Some(Ok(Value::Object(_))) => {}
            Some(Ok(_)) | Some(Err(_)) => p.at("spec.config", "not a JSON object in a string"),
            None => p.at("spec.config", "not a string"),
        }
    }
}

/// The structure check of one document: typed round trip, or the CRD's field list.
fn check_structure(doc: &Value, p: &mut Problems) {
    use k8s_openapi::api::{apps, core, flowcontrol, networking, policy, rbac, scheduling};
    let api_version = str_at(doc, &["apiVersion"]).unwrap_or("");
    let kind = str_at(doc, &["kind"]).unwrap_or("");
    macro_rules! typed {
        ($($t:ty),* $(,)?) => {
            $(
                if api_version == <$t>::API_VERSION && kind == <$t>::KIND {
                    return round_trip::<$t>(doc, p);
                }
            )*
        };
    }
    typed!(
        core::v1::ConfigMap,
        core::v1::Namespace,
        core::v1::Pod,
        core::v1::ResourceQuota,
        core::v1::LimitRange,
        core::v1::Secret,
        core::v1::Service,
        core::v1::ServiceAccount,
        apps::v1::DaemonSet,
        apps::v1::Deployment,
        apps::v1::StatefulSet,
        rbac::v1::ClusterRole,
        rbac::v1::ClusterRoleBinding,
        rbac::v1::Role,
        rbac::v1::RoleBinding,
        scheduling::v1::PriorityClass,
        policy::v1::PodDisruptionBudget,
        networking::v1::NetworkPolicy,
        flowcontrol::v1::FlowSchema,
        flowcontrol::v1::PriorityLevelConfiguration,
    );
    // The CRDs: their metadata is an ObjectMeta all the same.
    let crd: Option<fn(&Value, &mut Problems)> = match (api_version, kind) {
        ("security.openshift.io/v1", "SecurityContextConstraints") => Some(check_scc),
        ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition") => Some(check_nad),
        _ => None,
    };
    let Some(check) = crd else {
        return p.at(
            "",
            format!("unknown apiVersion/kind {api_version}/{kind} (a typo, or a kind this test must learn)"),
        );
    };
    check(doc, p);
    if let Some(meta) = doc.get("metadata") {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        match serde_json::from_value::<ObjectMeta>(meta.clone()) {
            Ok(m) => {
                let round = serde_json::to_value(&m).expect("serialize");
                compare_round_trip(meta, &round, "metadata", p);
            }
            Err(e) => p.at("metadata", format!("not an ObjectMeta: {e}")),
        }
    }
}

// --- the references between the documents of one file -------------------------------------------

fn names_of<'a>(docs: &'a [Doc], kind: &str) -> BTreeSet<&'a str> {
    docs.iter()
        .filter(|d| d.kind == kind)
        .map(|d| d.name.as_str())
        .collect()
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Every `configMapRef`, `configMapKeyRef` and `configMap` volume source in `v`, with its path.
fn configmap_refs<'a>(v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value, bool)>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let kpath = join(path, k);
                match k.as_str() {
                    "configMapRef" | "configMap" => out.push((kpath.clone(), v, false)),
                    "configMapKeyRef" => out.push((kpath.clone(), v, true)),
                    _ => {}
                }
                configmap_refs(v, &kpath, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                configmap_refs(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// A label selector's match of `labels`.
fn selector_matches(sel: &Value, labels: &Map<String, Value>) -> bool {
    let ml = sel.get("matchLabels").and_then(Value::as_object);
    let ok_labels = ml.is_none_or(|ml| ml.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let ok_exprs = arr(sel.get("matchExpressions").unwrap_or(&Value::Null))
        .iter()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<&Value> = arr(&e["values"]).iter().collect();
            let have = labels.get(key);
            match e["operator"].as_str() {
                Some("In") => have.is_some_and(|h| values.contains(&h)),
                Some("NotIn") => have.is_none_or(|h| !values.contains(&h)),
                Some("Exists") => have.is_some(),
                Some("DoesNotExist") => have.is_none(),
                _ => false,
            }
        });
    ok_labels && ok_exprs
}

/// The service accounts a ClusterRole is bound to by the file's ClusterRoleBindings, as
/// (namespace, name).
fn bound_service_accounts<'a>(docs: &'a [Doc], role: &str) -> Vec<(&'a str, &'a str)> {
    docs.iter()
        .filter(|d| d.kind == "ClusterRoleBinding")
        .filter(|d| {
            d.value["roleRef"]["kind"] == "ClusterRole" && d.value["roleRef"]["name"] == role
        })
        .flat_map(|d| arr(&d.value["subjects"]))
        .filter(|s| s["kind"] == "ServiceAccount")
        .map(|s| {
            (
                s["namespace"].as_str().unwrap_or(""),
                s["name"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

/// Whether a rule grants `use` on the SCC `scc`.
fn grants_use(rule: &Value, scc: &str) -> bool {
    let has = |field: &str, want: &str| {
        arr(&rule[field])
            .iter()
            .any(|v| v.as_str() == Some(want) || v.as_str() == Some("*"))
    };
    let names = arr(&rule["resourceNames"]);
    has("apiGroups", "security.openshift.io")
        && has("resources", "securitycontextconstraints")
        && has("verbs", "use")
        && (names.is_empty() || names.iter().any(|n| n.as_str() == Some(scc)))
}

/// The problems of the references in one file, keyed by document label. `base` holds the
/// documents of the file this one is applied after (their ServiceAccounts count as present).
fn check_references(docs: &[Doc], base: &[Doc], raw: &str, out: &mut Vec<(String, Problems)>) {
    let mut service_accounts = names_of(docs, "ServiceAccount");
    service_accounts.extend(names_of(base, "ServiceAccount"));
    let cluster_roles = names_of(docs, "ClusterRole");
    let sccs = names_of(docs, "SecurityContextConstraints");
    let configmaps: BTreeMap<&str, &Value> = docs
        .iter()
        .filter(|d| d.kind == "ConfigMap")
        .map(|d| (d.name.as_str(), &d.value))
        .collect();
    let mut sa_subjects = 0;
    for doc in docs {
        let mut p = Problems::default();
        let v = &doc.value;

        if doc.kind == "ClusterRoleBinding" || doc.kind == "RoleBinding" {
            let rr = &v["roleRef"];
            if rr["apiGroup"] != "rbac.authorization.k8s.io" {
                p.at("roleRef.apiGroup", "not rbac.authorization.k8s.io");
            }
            let role_kind = rr["kind"].as_str().unwrap_or("");
            let role_name = rr["name"].as_str().unwrap_or("");
            if !names_of(docs, role_kind).contains(role_name) {
                p.at(
                    "roleRef",
                    format!("names {role_kind} {role_name:?}, which is not in this file"),
                );
            }
            for (i, s) in arr(&v["subjects"]).iter().enumerate() {
                if s["kind"] != "ServiceAccount" {
                    continue;
                }
                sa_subjects += 1;
                let name = s["name"].as_str().unwrap_or("");
                if !service_accounts.contains(name) {
                    p.at(
                        &format!("subjects[{i}].name"),
                        format!("ServiceAccount {name:?} is not in this file"),
                    );
                }
                if doc.kind == "ClusterRoleBinding" && s["namespace"].as_str().is_none() {
                    p.at(&format!("subjects[{i}].namespace"), "missing");
                }
            }
        }

        let mut refs = Vec::new();
        configmap_refs(v, "", &mut refs);
        for (path, r, keyed) in refs {
            let name = r["name"].as_str().unwrap_or("");
            match configmaps.get(name) {
                None => p.at(
                    &join(&path, "name"),
                    format!("ConfigMap {name:?} is not in this file"),
                ),
                Some(cm) if keyed && r["optional"] != true => {
                    let key = r["key"].as_str().unwrap_or("");
                    if cm["data"].get(key).is_none() && cm["binaryData"].get(key).is_none() {
                        p.at(
                            &join(&path, "key"),
                            format!("ConfigMap {name:?} has no key {key:?}"),
                        );
                    }
                }
                Some(_) => {}
            }
        }

        if let Some(template) = v.get("spec").and_then(|s| s.get("template")) {
            check_pod_template(
                docs,
                doc,
                template,
                &service_accounts,
                &sccs,
                &cluster_roles,
                &mut p,
            );
        }
        if !p.0.is_empty() {
            out.push((doc.label.clone(), p));
        }
    }
    // docs/deploy/README.md: the binding's namespace is the one line to replace, and the sed that
    // replaces it matches "namespace: kube-system # SET-ME".
    let marked = raw.matches("namespace: kube-system # SET-ME").count();
    if marked < sa_subjects {
        let mut p = Problems::default();
        p.at(
            "subjects[*].namespace",
            format!(
                "{sa_subjects} ServiceAccount subject(s) but {marked} line(s) \
                 `namespace: kube-system # SET-ME` (see docs/deploy/README.md)"
            ),
        );
        out.push(("(file)".into(), p));
    }
}

fn check_pod_template(
    docs: &[Doc],
    doc: &Doc,
    template: &Value,
    service_accounts: &BTreeSet<&str>,
    sccs: &BTreeSet<&str>,
    cluster_roles: &BTreeSet<&str>,
    p: &mut Problems,
) {
    let v = &doc.value;
    let empty = Map::new();
    let labels = template["metadata"]["labels"].as_object().unwrap_or(&empty);
    match v["spec"].get("selector") {
        None => p.at("spec.selector", "missing"),
        Some(sel) if sel.get("matchLabels").is_none() && sel.get("matchExpressions").is_none() => {
            p.at("spec.selector", "empty: it would select every pod")
        }
        Some(sel) if !selector_matches(sel, labels) => p.at(
            "spec.selector",
            "does not match spec.template.metadata.labels",
        ),
        Some(_) => {}
    }
    let spec = &template["spec"];
    let sa = spec["serviceAccountName"].as_str();
    match sa {
        None => p.at(
            "spec.template.spec.serviceAccountName",
            "missing (the pod would run as \"default\")",
        ),
        Some(sa) if !service_accounts.contains(sa) => p.at(
            "spec.template.spec.serviceAccountName",
            format!("ServiceAccount {sa:?} is not in this file"),
        ),
        Some(_) => {}
    }

    let mut volumes = BTreeSet::new();
    for (i, vol) in arr(&spec["volumes"]).iter().enumerate() {
        let name = vol["name"].as_str().unwrap_or("");
        let path = format!("spec.template.spec.volumes[{i}].name");
        if !is_dns1123_label(name) {
            p.at(&path, format!("{name:?} is not a DNS-1123 label"));
        }
        if !volumes.insert(name) {
            p.at(&path, format!("volume {name:?} twice"));
        }
    }
    let mut used_volumes = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in arr(&spec[list]).iter().enumerate() {
            let cpath = format!("spec.template.spec.{list}[{i}]");
            let name = c["name"].as_str().unwrap_or("");
            if !is_dns1123_label(name) {
                p.at(
                    &join(&cpath, "name"),
                    format!("{name:?} is not a DNS-1123 label"),
                );
            }
            if c["image"].as_str().is_none_or(|s| s.trim().is_empty()) {
                p.at(&join(&cpath, "image"), "not set");
            }
            let mut mount_paths = BTreeSet::new();
            for (j, m) in arr(&c["volumeMounts"]).iter().enumerate() {
                let mpath = format!("{cpath}.volumeMounts[{j}]");
                let name = m["name"].as_str().unwrap_or("");
                if !volumes.contains(name) {
                    p.at(
                        &join(&mpath, "name"),
                        format!("no volume {name:?} in spec.template.spec.volumes"),
                    );
                }
                used_volumes.insert(name);
                if !mount_paths.insert(m["mountPath"].as_str().unwrap_or("")) {
                    p.at(&join(&mpath, "mountPath"), "mounted twice");
                }
            }
        }
    }
    for unused in volumes.difference(&used_volumes) {
        p.at(
            "spec.template.spec.volumes",
            format!("volume {unused:?} is mounted by no container"),
        );
    }

    // OpenShift: the SCC the pod pins must be in the file, and usable by the pod's account.
    let Some(scc) = template["metadata"]["annotations"]["openshift.io/required-scc"].as_str()
    else {
        return;
    };
    let apath = "spec.template.metadata.annotations.openshift.io/required-scc";
    if !sccs.contains(scc) {
        return p.at(
            apath,
            format!("SecurityContextConstraints {scc:?} is not in this file"),
        );
    }
    let Some(sa) = sa else { return };
    let scc_doc = &docs
        .iter()
        .find(|d| d.kind == "SecurityContextConstraints" && d.name == scc)
        .expect("in the file")
        .value;
    // The namespaces the account is bound in (the SET-ME placeholder, see the README).
    let namespaces: BTreeSet<&str> = cluster_roles
        .iter()
        .flat_map(|r| bound_service_accounts(docs, r))
        .filter(|(_, n)| *n == sa)
        .map(|(ns, _)| ns)
        .collect();
    let in_users = arr(&scc_doc["users"]).iter().any(|u| {
        namespaces
            .iter()
            .any(|ns| u.as_str() == Some(&format!("system:serviceaccount:{ns}:{sa}")))
    });
    let in_groups = arr(&scc_doc["groups"]).iter().any(|g| {
        g == "system:serviceaccounts"
            || namespaces
                .iter()
                .any(|ns| g.as_str() == Some(&format!("system:serviceaccounts:{ns}")))
    });
    let by_role = docs
        .iter()
        .filter(|d| d.kind == "ClusterRole")
        .filter(|d| arr(&d.value["rules"]).iter().any(|r| grants_use(r, scc)))
        .any(|d| {
            bound_service_accounts(docs, &d.name)
                .iter()
                .any(|(_, n)| *n == sa)
        });
    if !(in_users || in_groups || by_role) {
        p.at(
            apath,
            format!(
                "ServiceAccount {sa:?} may not use SCC {scc:?}: not in its users or groups, and no \
                 bound ClusterRole grants `use` on it"
            ),
        );
    }
    check_pod_fits_scc(spec, scc_doc, p);
}

/// The parts of the pod spec that the SCC would refuse at admission.
fn check_pod_fits_scc(spec: &Value, scc: &Value, p: &mut Problems) {
    let s = "spec.template.spec";
    let flag = |k: &str| scc[k] == true;
    for (pod_key, scc_key) in [
        ("hostNetwork", "allowHostNetwork"),
        ("hostPID", "allowHostPID"),
        ("hostIPC", "allowHostIPC"),
    ] {
        if spec[pod_key] == true && !flag(scc_key) {
            p.at(
                &join(s, pod_key),
                format!("the SCC does not allow it ({scc_key})"),
            );
        }
    }
    let allowed: Vec<&str> = arr(&scc["volumes"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for (i, vol) in arr(&spec["volumes"]).iter().enumerate() {
        for (k, _) in vol.as_object().into_iter().flatten() {
            if k == "name" {
                continue;
            }
            if !allowed.contains(&"*") && !allowed.contains(&k.as_str()) {
                p.at(
                    &format!("{s}.volumes[{i}].{k}"),
                    "a volume type the SCC does not allow",
                );
            }
            if k == "hostPath" && !flag("allowHostDirVolumePlugin") {
                p.at(
                    &format!("{s}.volumes[{i}].{k}"),
                    "the SCC does not allow it (allowHostDirVolumePlugin)",
                );
            }
        }
    }
    let seccomp: Vec<&str> = arr(&scc["seccompProfiles"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let allowed_caps: Vec<&str> = arr(&scc["allowedCapabilities"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for list in ["initContainers", "containers"] {
        for (i, c) in arr(&spec[list]).iter().enumerate() {
            // A hostNetwork pod's container ports are host ports (the API server defaults
            // hostPort to containerPort), which the SCC must allow.
            for (j, port) in arr(&c["ports"]).iter().enumerate() {
                let host_port = port.get("hostPort").is_some_and(|h| h != 0)
                    || (spec["hostNetwork"] == true && port.get("containerPort").is_some());
                if host_port && !flag("allowHostPorts") {
                    p.at(
                        &format!("{s}.{list}[{i}].ports[{j}]"),
                        "a host port (hostPort, or any port of a hostNetwork pod): the SCC \
                         does not allow it (allowHostPorts)",
                    );
                }
            }
            let sc = &c["securityContext"];
            let cpath = format!("{s}.{list}[{i}].securityContext");
            if sc["privileged"] == true && !flag("allowPrivilegedContainer") {
                p.at(&join(&cpath, "privileged"), "the SCC does not allow it");
            }
            for cap in arr(&sc["capabilities"]["add"])
                .iter()
                .filter_map(Value::as_str)
            {
                if !allowed_caps.contains(&"*") && !allowed_caps.contains(&cap) {
                    p.at(
                        &join(&cpath, "capabilities.add"),
                        format!("{cap} is not in the SCC's allowedCapabilities"),
                    );
                }
            }
            let profile = match sc["seccompProfile"]["type"].as_str() {
                Some("RuntimeDefault") => Some("runtime/default".to_string()),
                Some("Unconfined") => Some("unconfined".to_string()),
                Some("Localhost") => sc["seccompProfile"]["localhostProfile"]
                    .as_str()
                    .map(|l| format!("localhost/{l}")),
                _ => None,
            };
            if let Some(profile) = profile {
                if !seccomp.contains(&"*") && !seccomp.contains(&profile.as_str()) {
                    p.at(
                        &join(&cpath, "seccompProfile"),
                        format!("{profile} is not in the SCC's seccompProfiles"),
                    );
                }
            }
            if sc.get("seLinuxOptions").is_some() && scc["seLinuxContext"]["type"] != "RunAsAny" {
                p.at(
                    &join(&cpath, "seLinuxOptions"),
                    "custom SELinux options need seLinuxContext RunAsAny",
                );
            }
            if sc["runAsUser"] == 0 && scc["runAsUser"]["type"] == "MustRunAsNonRoot" {
                p.at(&join(&cpath, "runAsUser"), "the SCC requires non-root");
            }
        }
    }
}

// --- one file -----------------------------------------------------------------------------------

/// Every problem of one manifest file, each naming the file, the document and the path.
fn check_file(file: &str, text: &str) -> Vec<String> {
    check_file_after(file, text, &[])
}

/// [`check_file`] for a file applied after the documents `base`.
fn check_file_after(file: &str, text: &str, base: &[Doc]) -> Vec<String> {
    let mut stream = Vec::new();
    let docs = parse_stream(text, &mut stream);
    let mut out: Vec<String> = stream.into_iter().map(|m| format!("{file}: {m}")).collect();
    if docs.is_empty() && out.is_empty() {
        out.push(format!("{file}: no document"));
    }
    let mut seen = BTreeSet::new();
    for doc in &docs {
        let mut p = Problems::default();
        check_identity(&doc.value, &mut p);
        if p.0.is_empty() {
            check_structure(&doc.value, &mut p);
            check_quantities(&doc.value, "", "", &mut p);
        }
        let api_version = str_at(&doc.value, &["apiVersion"]).unwrap_or("");
        if !seen.insert((api_version.to_string(), doc.kind.clone(), doc.name.clone())) {
            p.at("metadata.name", "a second document of this kind and name");
        }
        out.extend(p.0.iter().map(|m| format!("{file}: {}: {m}", doc.label)));
    }
    let mut refs = Vec::new();
    check_references(&docs, base, text, &mut refs);
    for (label, p) in refs {
        out.extend(p.0.iter().map(|m| format!("{file}: {label}: {m}")));
    }
    out
}

// --- the tests ----------------------------------------------------------------------------------

#[test]
fn every_manifest_in_deploy_is_valid_kubernetes_yaml() {
    let dir = deploy_dir();
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    let rel: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    for known in [
        "kubernetes/redirect-cni.yaml",
        "kubernetes/resourcequota-critical-pods.yaml",
        "kubernetes/repair-delete-pods.yaml",
        "kubernetes/repair-label-pods.yaml",
        "kubernetes/untaint-node.yaml",
        "kubernetes/ambient.yaml",
        "kubernetes/flowcontrol.yaml",
        "openshift/redirect-cni.yaml",
        "openshift/network-attachment-definition.yaml",
        "openshift/repair-delete-pods.yaml",
        "openshift/repair-label-pods.yaml",
        "openshift/untaint-node.yaml",
        "openshift/ambient.yaml",
    ] {
        assert!(
            rel.iter().any(|r| r == known),
            "{known} not found in {rel:?}"
        );
    }
    let mut problems = Vec::new();
    let mut kinds = BTreeSet::new();
    for (path, rel) in files.iter().zip(&rel) {
        let text = std::fs::read_to_string(path).unwrap();
        let label = format!("deploy/{rel}");
        // The mode files beside a platform's main manifest are applied after it.
        let main = path.with_file_name(MAIN);
        let base = if path.file_name() != main.file_name() && main.exists() {
            parse_stream(&std::fs::read_to_string(&main).unwrap(), &mut Vec::new())
        } else {
            Vec::new()
        };
        problems.extend(check_file_after(&label, &text, &base));
        let mut ignored = Vec::new();
        for d in parse_stream(&text, &mut ignored) {
            kinds.insert(d.kind);
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s) in deploy/:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The test looked at what it should have.
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ResourceQuota",
        "SecurityContextConstraints",
        "NetworkAttachmentDefinition",
        "FlowSchema",
        "PriorityLevelConfiguration",
    ] {
        assert!(kinds.contains(kind), "no {kind} seen: {kinds:?}");
    }
}

/// A valid file to break in the negative tests.
const GOOD: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata:
  name: sa
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
data:
  A: "1"
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: role
rules:
  - apiGroups: ["security.openshift.io"]
    resources: ["securitycontextconstraints"]
    resourceNames: ["scc"]
    verbs: ["use"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: role
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: role
subjects:
  - kind: ServiceAccount
    name: sa
    namespace: kube-system # SET-ME
---
apiVersion: security.openshift.io/v1
kind: SecurityContextConstraints
metadata:
  name: scc
allowHostDirVolumePlugin: true
allowHostIPC: false
allowHostNetwork: true
allowHostPID: false
allowHostPorts: false
allowPrivilegedContainer: false
allowedCapabilities: []
defaultAddCapabilities: []
requiredDropCapabilities: ["ALL"]
priority: null
readOnlyRootFilesystem: false
seccompProfiles: ["runtime/default"]
seLinuxContext:
  type: RunAsAny
volumes: ["hostPath"]
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: ds
spec:
  selector:
    matchLabels:
      app: x
  updateStrategy:
    rollingUpdate:
      maxUnavailable: 1
  template:
    metadata:
      labels:
        app: x
      annotations:
        openshift.io/required-scc: scc
    spec:
      serviceAccountName: sa
      hostNetwork: true
      containers:
        - name: c
          image: example.org/x:1
          envFrom:
            - configMapRef:
                name: cfg
          env:
            - name: A
              valueFrom:
                configMapKeyRef:
                  name: cfg
                  key: A
          resources:
            requests:
              cpu: 10m
          securityContext:
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: v
              mountPath: /v
      volumes:
        - name: v
          hostPath:
            path: /v
"#;

/// `GOOD` with `from` replaced by `to` (which must occur).
fn broken(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from:?} is not in GOOD");
    GOOD.replacen(from, to, 1)
}

#[track_caller]
fn assert_problem(text: &str, expected: &[&str]) {
    let problems = check_file("test.yaml", text);
    assert!(
        problems
            .iter()
            .any(|p| expected.iter().all(|e| p.contains(e))),
        "no problem containing all of {expected:?} in:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_accepts_a_valid_file() {
    let problems = check_file("test.yaml", GOOD);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_reports_a_misspelled_field_with_its_path() {
    assert_problem(
        &broken("serviceAccountName: sa", "serviceAcountName: sa"),
        &[
            "test.yaml: #5 DaemonSet/ds",
            "spec.template.spec.serviceAcountName: unknown field",
        ],
    );
    // And a field in the wrong place, deep down.
    assert_problem(
        &broken(
            "          hostPath:\n",
            "          hostPath:\n            typo: 1\n",
        ),
        &[
            "DaemonSet/ds",
            "spec.template.spec.volumes[0].hostPath.typo: unknown field",
        ],
    );
    // In a CRD.
    assert_problem(
        &broken("allowHostIPC: false", "allowHostIpc: false"),
        &[
            "SecurityContextConstraints/scc",
            "allowHostIpc: unknown field",
        ],
    );
    assert_problem(
        &broken("priority: null\n", ""),
        &["SecurityContextConstraints/scc", "priority: missing"],
    );
}

#[test]
fn the_checker_reports_a_wrong_api_version_or_kind() {
    assert_problem(
        &broken("apiVersion: apps/v1", "apiVersion: apps/v1beta2"),
        &[
            "#5 DaemonSet/ds",
            "unknown apiVersion/kind apps/v1beta2/DaemonSet",
        ],
    );
    assert_problem(
        &broken("kind: ConfigMap", "kind: ConfigMapp"),
        &["#1 ConfigMapp/cfg", "unknown apiVersion/kind v1/ConfigMapp"],
    );
    assert_problem(
        &broken(
            "apiVersion: v1\nkind: ServiceAccount",
            "kind: ServiceAccount",
        ),
        &["#0 ServiceAccount/sa", "apiVersion: missing"],
    );
}

#[test]
fn the_checker_reports_dangling_references() {
    assert_problem(
        &broken(
            "                name: cfg",
            "                name: cfg-typo",
        ),
        &[
            "DaemonSet/ds",
            "envFrom[0].configMapRef.name",
            "ConfigMap \"cfg-typo\" is not in this file",
        ],
    );
    assert_problem(
        &broken("key: A", "key: B"),
        &["configMapKeyRef.key", "has no key \"B\""],
    );
    assert_problem(
        &broken("serviceAccountName: sa", "serviceAccountName: other"),
        &[
            "spec.template.spec.serviceAccountName",
            "\"other\" is not in this file",
        ],
    );
    assert_problem(
        &broken(
            "  kind: ClusterRole\n  name: role",
            "  kind: ClusterRole\n  name: nope",
        ),
        &["ClusterRoleBinding/role", "roleRef", "\"nope\""],
    );
    assert_problem(
        &broken(
            "- name: v\n          hostPath",
            "- name: w\n          hostPath",
        ),
        &["volumeMounts[0].name", "no volume \"v\""],
    );
    assert_problem(
        &broken(
            "      labels:\n        app: x",
            "      labels:\n        app: y",
        ),
        &["spec.selector", "does not match"],
    );
    assert_problem(
        &broken("image: example.org/x:1", "image: \"\""),
        &["containers[0].image: not set"],
    );
    assert_problem(
        &broken(
            "openshift.io/required-scc: scc",
            "openshift.io/required-scc: other",
        ),
        &["required-scc", "\"other\" is not in this file"],
    );
    assert_problem(
        &broken("verbs: [\"use\"]", "verbs: [\"get\"]"),
        &["required-scc", "may not use SCC \"scc\""],
    );
    assert_problem(
        &broken("namespace: kube-system # SET-ME", "namespace: kube-system"),
        &["# SET-ME"],
    );
}

#[test]
fn the_checker_reports_yaml_errors_and_bad_names() {
    assert_problem(
        &broken("  A: \"1\"", "  A: \"1"),
        &["test.yaml: document #1: YAML error"],
    );
    assert_problem(
        &broken("data:\n  A: \"1\"", "data:\n  A: \"1\"\n  A: \"2\""),
        &["YAML error", "duplicate"],
    );
    assert_problem(
        &broken("name: cfg\n", "name: Cfg_1\n"),
        &[
            "ConfigMap/Cfg_1",
            "metadata.name",
            "not a DNS-1123 subdomain",
        ],
    );
    assert_problem(
        &broken(
            "        app: x\n      annotations",
            "        app: 1\n      annotations",
        ),
        &["spec.template.metadata.labels.app", "not a string"],
    );
    assert_problem(
        &broken("  A: \"1\"", "  A: 1"),
        &["ConfigMap/cfg", "not a valid v1/ConfigMap"],
    );
    assert_problem(
        &broken("cpu: 10m", "cpu: 10mm"),
        &["resources.requests.cpu", "\"10mm\" is not a quantity"],
    );
    assert_problem(
        &format!("{GOOD}---\napiVersion: example.org/v1\nkind: Widget\nmetadata:\n  name: w\n"),
        &["Widget/w", "unknown apiVersion/kind"],
    );
}

#[test]
fn the_checker_reports_what_the_scc_would_refuse() {
    assert_problem(
        &broken("allowHostNetwork: true", "allowHostNetwork: false"),
        &["spec.template.spec.hostNetwork", "allowHostNetwork"],
    );
    assert_problem(
        &broken("volumes: [\"hostPath\"]", "volumes: [\"configMap\"]"),
        &["volumes[0].hostPath", "does not allow"],
    );
    assert_problem(
        &broken("type: RuntimeDefault", "type: Unconfined"),
        &["seccompProfile", "unconfined"],
    );
    // A hostNetwork pod's container port is a host port.
    let with_port = broken(
        "          resources:\n",
        "          ports:\n            - containerPort: 15014\n          resources:\n",
    );
    assert_problem(&with_port, &["containers[0].ports[0]", "allowHostPorts"]);
    let allowed = with_port.replacen("allowHostPorts: false", "allowHostPorts: true", 1);
    let problems = check_file("test.yaml", &allowed);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_mode_file_may_name_the_main_files_service_account_and_nothing_else() {
    let mode_file = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: extra
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: extra
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: extra
subjects:
  - kind: ServiceAccount
    name: sa
    namespace: kube-system # SET-ME
"#;
    let base = parse_stream(GOOD, &mut Vec::new());
    let problems = check_file_after("mode.yaml", mode_file, &base);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // On its own, or naming another account, the ServiceAccount is dangling.
    assert!(check_file("mode.yaml", mode_file)
        .iter()
        .any(|p| p.contains("ServiceAccount \"sa\" is not in this file")));
    let other = mode_file.replace("name: sa", "name: other");
    assert!(check_file_after("mode.yaml", &other, &base)
        .iter()
        .any(|p| p.contains("ServiceAccount \"other\" is not in this file")));
}

/// The paths the image puts its binaries at, from the Containerfile's `COPY` lines
/// (`COPY [--flags] SRC... DEST/`): DEST joined with each SRC's file name.
fn image_binaries(containerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in containerfile.lines() {
        let Some(rest) = line.trim().strip_prefix("COPY ") else {
            continue;
        };
        let words: Vec<&str> = rest
            .split_whitespace()
            .filter(|w| !w.starts_with("--"))
            .collect();
        if let Some((dest, srcs)) = words.split_last() {
            for s in srcs {
                let name = s.rsplit('/').next().unwrap_or(s);
                out.push(format!("{}/{name}", dest.trim_end_matches('/')));
            }
        }
    }
    out
}

/// Every container the manifests run starts a binary the image built from `Containerfile`
/// holds, so the manifests and the image cannot drift apart.
#[test]
fn the_manifests_run_what_the_image_holds() {
    let containerfile =
        std::fs::read_to_string(redirect_testkit::docs::workspace().join("Containerfile"))
            .expect("Containerfile at the repository root");
    assert!(containerfile.lines().any(|l| l.trim() == "FROM scratch"));
    let held = image_binaries(&containerfile);
    assert_eq!(
        held,
        [
            "/usr/local/bin/redirect-cni",
            "/usr/local/bin/redirect-cni-node",
            "/usr/local/bin/redirect-init",
            "/usr/local/bin/redirect-validate"
        ]
    );
    let mut files = Vec::new();
    yaml_files(&deploy_dir(), &mut files);
    let mut commands = 0;
    for f in &files {
        let mut problems = Vec::new();
        for d in parse_stream(&std::fs::read_to_string(f).unwrap(), &mut problems) {
            let containers = d
                .value
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for c in containers {
                let cmd = c.pointer("/command/0").and_then(Value::as_str);
                let cmd = cmd.unwrap_or_else(|| panic!("{}: {}: no command", f.display(), d.label));
                assert!(
                    held.iter().any(|h| h == cmd),
                    "{}: {} runs {cmd}, which the image does not hold ({held:?})",
                    f.display(),
                    d.label
                );
                commands += 1;
            }
        }
    }
    assert_eq!(commands, 2, "one installer per mode");
}

// --- what each repair mode needs (docs/repair.md) -----------------------------------------------

/// Whether `rule` grants `verb` on `resource` (or `resource/subresource`) of the core API group,
/// for every object (no `resourceNames`).
fn grants_core(rule: &Value, resource: &str, verb: &str) -> bool {
    let has = |field: &str, want: &str| {
        arr(&rule[field])
            .iter()
            .any(|v| v.as_str() == Some(want) || v.as_str() == Some("*"))
    };
    has("apiGroups", "")
        && has("resources", resource)
        && has("verbs", verb)
        && arr(&rule["resourceNames"]).is_empty()
}

/// Whether the ClusterRoles that `docs` bind to the ServiceAccount `sa` grant `verb` on
/// `resource` (core group).
fn account_may(docs: &[Doc], sa: &str, resource: &str, verb: &str) -> bool {
    docs.iter()
        .filter(|d| d.kind == "ClusterRole")
        .filter(|d| {
            bound_service_accounts(docs, &d.name)
                .iter()
                .any(|(_, n)| *n == sa)
        })
        .flat_map(|d| arr(&d.value["rules"]))
        .any(|r| grants_core(r, resource, verb))
}

/// A container's variable: its `env` entry (the value, or `fieldRef:<path>`), else the value of
/// a ConfigMap it takes with `envFrom`.
fn container_var(docs: &[Doc], c: &Value, name: &str) -> Option<String> {
    if let Some(e) = arr(&c["env"]).iter().find(|e| e["name"] == name) {
        if let Some(v) = e["value"].as_str() {
            return Some(v.to_string());
        }
        return e["valueFrom"]["fieldRef"]["fieldPath"]
            .as_str()
            .map(|p| format!("fieldRef:{p}"));
    }
    arr(&c["envFrom"]).iter().find_map(|from| {
        let cm = from["configMapRef"]["name"].as_str()?;
        let doc = docs
            .iter()
            .find(|d| d.kind == "ConfigMap" && d.name == cm)?;
        doc.value["data"][name].as_str().map(str::to_string)
    })
}

/// The DaemonSet's volume mounted at `mount_path` in `c`: (the mount, the volume).
fn mount_at<'a>(spec: &'a Value, c: &'a Value, mount_path: &str) -> Option<(&'a Value, &'a Value)> {
    let m = arr(&c["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"] == mount_path)?;
    let v = arr(&spec["volumes"])
        .iter()
        .find(|v| v["name"] == m["name"])?;
    Some((m, v))
}

/// The problems of one platform's folder: see the test below.
fn repair_mode_problems(platform: &str) -> Vec<String> {
    let dir = deploy_dir().join(platform);
    let mut out = Vec::new();
    let load = |file: &str, out: &mut Vec<String>| -> Vec<Doc> {
        let path = dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => parse_stream(&text, out),
            Err(e) => {
                out.push(format!("{platform}/{file}: {e}"));
                Vec::new()
            }
        }
    };
    let main = load(MAIN, &mut out);
    let Some(ds) = main.iter().find(|d| d.kind == "DaemonSet") else {
        out.push(format!("{platform}/{MAIN}: no DaemonSet"));
        return out;
    };
    let spec = &ds.value["spec"]["template"]["spec"];
    let sa = spec["serviceAccountName"].as_str().unwrap_or("default");
    let at = |what: &str| format!("{platform}/{MAIN}: {what}");

    // RBAC: the default (repair in place) has what the controller needs, and none of the other
    // modes' rights; each mode's file adds its own to the same account.
    for (resource, verb) in [
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("events", "create"),
        ("events", "patch"),
    ] {
        if !account_may(&main, sa, resource, verb) {
            out.push(at(&format!(
                "ServiceAccount {sa} may not {verb} {resource}"
            )));
        }
    }
    // Each file, and what it grants: (resource, verbs) per rule.
    type Grants = &'static [(&'static str, &'static [&'static str])];
    let modes: [(&str, Grants); 4] = [
        ("repair-delete-pods.yaml", &[("pods", &["delete"])]),
        ("repair-label-pods.yaml", &[("pods/status", &["patch"])]),
        ("untaint-node.yaml", &[("nodes", &["get", "patch"])]),
        (
            "ambient.yaml",
            &[
                ("namespaces", &["get", "list", "watch"]),
                ("pods/status", &["patch"]),
            ],
        ),
    ];
    for (file, grants) in modes {
        let docs = load(file, &mut out);
        for (resource, verbs) in grants {
            for verb in verbs.iter() {
                if *verb != "get" && account_may(&main, sa, resource, verb) {
                    out.push(at(&format!(
                        "the default grants {verb} on {resource}, which only {file} should"
                    )));
                }
                if !account_may(&docs, sa, resource, verb) {
                    out.push(format!(
                        "{platform}/{file}: ServiceAccount {sa} may not {verb} {resource}"
                    ));
                }
            }
        }
    }

    // The node agent's container.
    let Some(c) = arr(&spec["containers"])
        .iter()
        .find(|c| c["command"][0] == "/usr/local/bin/redirect-cni-node")
    else {
        out.push(at("no container runs `redirect-cni-node`"));
        return out;
    };
    let defaults = cni_node::Settings::default();
    let caps: Vec<&str> = arr(&c["securityContext"]["capabilities"]["add"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for cap in ["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN"] {
        if !caps.contains(&cap) {
            out.push(at(&format!(
                "the installer's container does not add {cap} (in-place repair needs it)"
            )));
        }
    }
    let proc = container_var(&main, c, "REPAIR_HOST_PROC")
        .unwrap_or_else(|| defaults.repair.places.proc.display().to_string());
    match mount_at(spec, c, &proc) {
        Some((m, v)) if v["hostPath"]["path"] == "/proc" && m["readOnly"] == true => {}
        Some(_) => out.push(at(&format!(
            "{proc} (REPAIR_HOST_PROC) is not the host's /proc mounted read-only"
        ))),
        None => out.push(at(&format!(
            "nothing is mounted at {proc} (REPAIR_HOST_PROC): mount the host's /proc there"
        ))),
    }
    let pins = container_var(&main, c, "REPAIR_NETNS_DIR")
        .unwrap_or_else(|| defaults.repair.places.pins.display().to_string());
    match mount_at(spec, c, &pins) {
        Some((m, v))
            if v["hostPath"]["path"] == "/var/run/netns"
                && m["readOnly"] == true
                && m["mountPropagation"] == "HostToContainer" => {}
        _ => out.push(at(&format!(
            "{pins} (REPAIR_NETNS_DIR) is not the host's /var/run/netns, read-only, \
             HostToContainer"
        ))),
    }
    let node = container_var(&main, c, "NODE_NAME")
        .or_else(|| container_var(&main, c, "REPAIR_NODE_NAME"));
    if node.as_deref() != Some("fieldRef:spec.nodeName") {
        out.push(at(&format!(
            "NODE_NAME or REPAIR_NODE_NAME is {node:?}, not the pod's spec.nodeName"
        )));
    }
    for (name, want) in [
        ("REPAIR_ENABLED", "true"),
        ("REPAIR_REPAIR_PODS", "true"),
        ("REPAIR_DELETE_PODS", "false"),
        ("REPAIR_LABEL_PODS", "false"),
    ] {
        let got = container_var(&main, c, name);
        if got.as_deref() != Some(want) {
            out.push(at(&format!("{name} is {got:?}, not {want:?}")));
        }
    }

    // The endpoints: one port, the same in the variable, the container, the probes and the
    // scrape annotations.
    let port = container_var(&main, c, "MONITORING_PORT")
        .unwrap_or_else(|| defaults.monitoring_port.to_string());
    let declared = arr(&c["ports"])
        .iter()
        .find(|p| p["containerPort"].as_u64().map(|n| n.to_string()) == Some(port.clone()));
    let Some(declared) = declared else {
        out.push(at(&format!(
            "no container port {port} (MONITORING_PORT) is declared"
        )));
        return out;
    };
    let port_name = declared["name"].as_str().unwrap_or("");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        let probe_port = get["port"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| get["port"].to_string());
        if get["path"] != path || (probe_port != port && probe_port != port_name) {
            out.push(at(&format!(
                "{probe} is not an httpGet of {path} on port {port} ({port_name}): {get}"
            )));
        }
    }
    let annotations = &ds.value["spec"]["template"]["metadata"]["annotations"];
    for (key, want) in [
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", port.as_str()),
        ("prometheus.io/path", "/metrics"),
    ] {
        if annotations[key] != want {
            out.push(at(&format!(
                "the pod template's annotation {key} is {}, not {want:?}",
                annotations[key]
            )));
        }
    }
    out
}

/// docs/repair.md's promises about the manifests, per platform: the default ClusterRole lets the
/// controller list and watch pods and record Events, and no more than that (delete, status
/// patch, node patch and ambient mode's namespaces list and watch are in their setting's file,
/// each bound to the same account); the
/// DaemonSet has what in-place repair needs (SYS_ADMIN, SYS_PTRACE, NET_ADMIN, the host's /proc
/// read-only at REPAIR_HOST_PROC, /var/run/netns), the node's name from the downward API, the
/// mode of Istio's chart, and one monitoring port for the probes and the scrape annotations.
#[test]
fn each_repair_mode_has_its_rbac_and_the_daemonset_what_in_place_repair_needs() {
    let mut problems = Vec::new();
    for platform in ["kubernetes", "openshift"] {
        problems.extend(repair_mode_problems(platform));
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
