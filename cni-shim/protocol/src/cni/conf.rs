//! The network config on stdin: the spec's fields, istio-cni's fields (same names, so an
//! istio-cni entry works as ours), and our own. Unknown fields are ignored; a known field of
//! the wrong type is an error naming the field, the value and the expected type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use redirect_core::ambient::EnablementSelectors;
use redirect_core::mesh::MeshDefaults;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::{code, CniError, SUPPORTED_VERSIONS};

/// The default bound on the plugin's pod read from the API (`kube_deadline_ms`): half of the 2
/// minutes kubelet gives the runtime for a sandbox.
pub const DEFAULT_KUBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The runtime capability that carries every pod annotation (containerd ≥ 1.5, CRI-O).
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";
/// Where the installer keeps its files (kubeconfig) unless the config says otherwise.
pub const DEFAULT_RUN_DIR: &str = "/var/run/redirect-cni";
/// The kubeconfig the node agent's installer writes in the run directory, which the plugin
/// reads pods with unless the config names another.
pub const KUBECONFIG_NAME: &str = "redirect-cni-kubeconfig";

/// The parsed config. Its fields come from stdin by serde's derive; the few that depend on
/// more than one field (the log level, the run directory and kubeconfig, istio-cni ≤ 1.23's
/// `kubernetes` object) are derived by [`parse`] from the raw ones at the end.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct NetConf {
    /// `cniVersion`: the spec version the runtime speaks, which the result and errors are
    /// printed in.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The network's name (the spec's `name`).
    pub name: String,
    /// `type`: the name of the plugin's binary (the spec's).
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The previous plugin's result, passed back unchanged.
    #[serde(rename = "prevResult")]
    pub prev_result: Option<Value>,
    /// Annotations from the runtime, when it sends the capability.
    #[serde(rename = "runtimeConfig", deserialize_with = "runtime_annotations")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    /// `plugin_log_level`, else `log_level`, else `info`.
    #[serde(skip)]
    pub log_level: String,
    /// A file the log lines also go to, besides stderr.
    pub log_file: Option<PathBuf>,
    /// JSON log lines (Istio's `--log_as_json`; the installer's `LOG_AS_JSON`).
    pub log_as_json: bool,
    /// `cni_agent_run_dir`, else [`DEFAULT_RUN_DIR`].
    #[serde(skip)]
    pub run_dir: PathBuf,
    /// `kubeconfig`, else `kubernetes.kubeconfig`, else the run directory's.
    #[serde(skip)]
    pub kubeconfig: PathBuf,
    /// Its own and `kubernetes.exclude_namespaces`.
    pub exclude_namespaces: Vec<String>,
    /// The namespace of our DaemonSet (its own pods are skipped).
    pub pod_namespace: Option<String>,
    /// What a pod gets when its spec does not say (`proxy_uid`, `proxy_gid`, `dns_capture`,
    /// `dual_stack`, `drop_invalid`), and the bypass IDs of every pod (`bypass_uids`,
    /// `bypass_gids`).
    #[serde(flatten)]
    pub mesh: MeshDefaults,
    /// Allow programming the namespace the plugin itself runs in (never in a real cluster).
    pub allow_host_netns: bool,
    /// How many times the pod is read from the Kubernetes API before giving up (30, Istio's
    /// value; at least 1).
    #[serde(default = "default_kube_attempts")]
    pub kube_attempts: u32,
    /// The pause between two of those attempts, in milliseconds (1000).
    #[serde(default = "default_kube_interval_ms", deserialize_with = "u32_wide")]
    pub kube_interval_ms: u64,
    /// The bound on the whole pod read, every attempt and pause included, in milliseconds
    /// (1 to 110,000; [`DEFAULT_KUBE_DEADLINE`] when not given).
    #[serde(
        default = "default_kube_deadline_ms",
        deserialize_with = "kube_deadline"
    )]
    pub kube_deadline_ms: u64,
    /// istio-cni's ambient mode: ADD and CHECK of a pod without a sidecar ask the node agent
    /// about it ([`crate::ambient`]).
    pub ambient_enabled: bool,
    /// Istio's `enablement_selectors`: which pods ambient mode enrolls when the plugin decides
    /// alone (the agent away); Istio's default when not given.
    pub enablement_selectors: EnablementSelectors,
    // The raw fields the derived ones above come from.
    plugin_log_level: Option<String>,
    #[serde(rename = "log_level")]
    log_level_field: Option<String>,
    cni_agent_run_dir: Option<PathBuf>,
    #[serde(rename = "kubeconfig")]
    kubeconfig_field: Option<PathBuf>,
    kubernetes: Option<Legacy>,
    native_nftables: bool,
    enable_ambient_detection_retry: bool,
}

/// istio-cni ≤ 1.23 kept these under "kubernetes".
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
struct Legacy {
    kubeconfig: Option<PathBuf>,
    exclude_namespaces: Vec<String>,
}

/// `runtimeConfig`: only the capability that carries the pod's annotations is read.
#[derive(Deserialize)]
struct RuntimeConfig {
    #[serde(rename = "io.kubernetes.cri.pod-annotations", default)]
    annotations: Option<BTreeMap<String, String>>,
}

fn runtime_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<BTreeMap<String, String>>, D::Error> {
    Ok(Option::<RuntimeConfig>::deserialize(d)?.and_then(|r| r.annotations))
}

/// A number read as a `u32`, kept as a `u64`.
fn u32_wide<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    Ok(u64::from(u32::deserialize(d)?))
}

/// `kube_deadline_ms`, within its bounds.
fn kube_deadline<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let ms = u64::deserialize(d)?;
    if (1..=KUBE_DEADLINE_MAX).contains(&ms) {
        Ok(ms)
    } else {
        Err(serde::de::Error::custom(KUBE_DEADLINE_EXPECTED))
    }
}

fn default_kube_attempts() -> u32 {
    30
}

fn default_kube_interval_ms() -> u64 {
    1000
}

fn default_kube_deadline_ms() -> u64 {
    DEFAULT_KUBE_DEADLINE.as_millis() as u64
}

/// Every field of ours or istio-cni's that we read, for the reference docs.
pub const FIELDS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "prevResult",
    "runtimeConfig",
    "capabilities",
    "plugin_log_level",
    "log_level",
    "log_file",
    "log_as_json",
    "cni_agent_run_dir",
    "kubeconfig",
    "kubernetes",
    "exclude_namespaces",
    "pod_namespace",
    "proxy_uid",
    "proxy_gid",
    "dns_capture",
    "dual_stack",
    "drop_invalid",
    "bypass_uids",
    "bypass_gids",
    "allow_host_netns",
    "kube_attempts",
    "kube_interval_ms",
    "kube_deadline_ms",
    "ambient_enabled",
    "enablement_selectors",
    "native_nftables",
    "enable_ambient_detection_retry",
];

/// Every key read inside an object field: `(field, key)`. Documented as `field.key` (or both
/// names in one paragraph).
pub const NESTED_FIELDS: &[(&str, &str)] = &[
    ("kubernetes", "kubeconfig"),
    ("kubernetes", "exclude_namespaces"),
    ("runtimeConfig", POD_ANNOTATIONS_CAPABILITY),
];

fn invalid(field: &str, v: &Value, expected: &str) -> CniError {
    let mut shown = v.to_string();
    if shown.len() > 80 {
        shown.truncate(80);
        shown.push_str("...");
    }
    CniError::new(
        code::INVALID_CONFIG,
        format!("network config field {field:?} is {shown}: expected {expected}"),
        format!("fix the {field:?} field of the redirect-cni entry in the CNI config"),
    )
}

/// What a field takes, in words, for the error about a value of the wrong type. `element`: the
/// value is an item of the field's list.
fn expected(field: &str, element: bool) -> &'static str {
    match field {
        "proxy_uid" | "proxy_gid" | "kube_attempts" | "kube_interval_ms" => {
            "a number from 0 to 4294967295"
        }
        "bypass_uids" | "bypass_gids" => "a list of numeric IDs",
        "exclude_namespaces" => "a list of strings",
        "dns_capture"
        | "dual_stack"
        | "drop_invalid"
        | "allow_host_netns"
        | "ambient_enabled"
        | "native_nftables"
        | "log_as_json"
        | "enable_ambient_detection_retry" => "true or false",
        "kube_deadline_ms" => KUBE_DEADLINE_EXPECTED,
        "prevResult" => "a result object",
        "kubernetes" | "runtimeConfig" => "an object",
        f if f == RUNTIME_ANNOTATIONS && !element => "an object of annotations",
        f if f.starts_with(RUNTIME_ANNOTATIONS) => "a string (annotation values are strings)",
        _ => "a string",
    }
}

const RUNTIME_ANNOTATIONS: &str = "runtimeConfig.io.kubernetes.cri.pod-annotations";

/// `kube_deadline_ms`: the bound on the whole pod read, 1 ms to 110 s (kubelet gives the
/// runtime 2 minutes for a sandbox; a budget past that would be cut off unnamed).
const KUBE_DEADLINE_MAX: u64 = 110_000;
const KUBE_DEADLINE_EXPECTED: &str =
    "milliseconds from 1 to 110000 (110 s, under kubelet's 2-minute runtime timeout)";

/// The config error for what serde refused: the field (a list's item is named by its list,
/// istio-cni's `kubernetes.X` as `X`, as before), the value found, and what it takes.
fn refused(value: &Value, e: serde_path_to_error::Error<serde_json::Error>) -> CniError {
    let mut pointer = String::new();
    let mut names: Vec<String> = Vec::new();
    let mut element = false;
    for seg in e.path().iter() {
        match seg {
            serde_path_to_error::Segment::Map { key } => {
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                names.push(key.clone());
                element = false;
            }
            serde_path_to_error::Segment::Seq { index } => {
                pointer.push_str(&format!("/{index}"));
                element = true;
            }
            _ => {}
        }
    }
    if names.first().map(String::as_str) == Some("enablement_selectors") {
        // Kubernetes' word on the selector (which term, which key) says more than its type.
        let found = value.pointer("/enablement_selectors").unwrap_or(value);
        let why = format!("Istio's enablement selectors ({})", e.inner());
        return invalid("enablement_selectors", found, &why);
    }
    if names.len() == 2 && names[0] == "kubernetes" {
        names.remove(0);
    }
    let field = names.join(".");
    let found = value.pointer(&pointer).unwrap_or(value);
    invalid(&field, found, expected(&field, element))
}

/// Deserialize `value` as `T`, a refusal as the config error naming the field.
fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, CniError> {
    serde_path_to_error::deserialize(value).map_err(|e| refused(value, e))
}

/// Parse stdin.
pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        let text = String::from_utf8_lossy(stdin);
        let shown: String = text.chars().take(80).collect();
        CniError::new(
            code::DECODE,
            format!("the network config on stdin is not JSON: {e}"),
            format!("stdin began with {shown:?}"),
        )
    })?;
    let Value::Object(mut map) = value else {
        return Err(invalid("(config)", &value, "a JSON object"));
    };
    // A null is a field not given, at the top and in the objects read by key.
    drop_nulls(&mut map);
    for key in ["kubernetes", "runtimeConfig"] {
        if let Some(Value::Object(inner)) = map.get_mut(key) {
            drop_nulls(inner);
        }
    }
    check_version(map.get("cniVersion"))?;
    check_objects(&map)?;
    let value = Value::Object(map);
    let mut conf: NetConf = match typed(&value) {
        Ok(conf) => conf,
        Err(e) => return Err(first_refused(&value).unwrap_or(e)),
    };
    conf.derive_fields()?;
    Ok(conf)
}

/// The fields in the order they have always been checked, so that of two bad fields the same
/// one is named (serde goes in the document's order, and the flattened mesh defaults last).
const CHECK_ORDER: &[&str] = &[
    "/runtimeConfig",
    "/cni_agent_run_dir",
    "/kubeconfig",
    "/kubernetes/kubeconfig",
    "/exclude_namespaces",
    "/kubernetes/exclude_namespaces",
    "/name",
    "/type",
    "/plugin_log_level",
    "/log_level",
    "/log_file",
    "/log_as_json",
    "/pod_namespace",
    "/proxy_uid",
    "/proxy_gid",
    "/dns_capture",
    "/dual_stack",
    "/drop_invalid",
    "/bypass_uids",
    "/bypass_gids",
    "/allow_host_netns",
    "/kube_attempts",
    "/kube_interval_ms",
    "/kube_deadline_ms",
    "/ambient_enabled",
    "/enablement_selectors",
    "/native_nftables",
    "/enable_ambient_detection_retry",
];

/// The first field of [`CHECK_ORDER`] that serde refuses on its own.
fn first_refused(value: &Value) -> Option<CniError> {
    CHECK_ORDER.iter().find_map(|pointer| {
        let v = value.pointer(pointer)?;
        let mut alone = v.clone();
        for key in pointer.rsplit('/').filter(|k| !k.is_empty()) {
            alone = Value::Object(Map::from_iter([(key.to_string(), alone)]));
        }
        match typed::<NetConf>(&alone) {
            Ok(_) => None,
            // A field of the flattened mesh defaults: serde names no path for it there.
            Err(e) => Some(typed::<MeshDefaults>(&alone).err().unwrap_or(e)),
        }
    })
}

/// The fields that hold an object hold one (serde would also take a list for a struct).
fn check_objects(map: &Map<String, Value>) -> Result<(), CniError> {
    if let Some(v) = map.get("prevResult").filter(|v| !v.is_object()) {
        return Err(invalid("prevResult", v, "a result object"));
    }
    if let Some(v) = map.get("runtimeConfig") {
        let Value::Object(rc) = v else {
            return Err(invalid("runtimeConfig", v, "an object"));
        };
        if let Some(a) = rc
            .get(POD_ANNOTATIONS_CAPABILITY)
            .filter(|a| !a.is_object())
        {
            return Err(invalid(RUNTIME_ANNOTATIONS, a, "an object of annotations"));
        }
    }
    match map.get("kubernetes") {
        Some(v) if !v.is_object() => Err(invalid("kubernetes", v, "an object")),
        _ => Ok(()),
    }
}

fn drop_nulls(map: &mut Map<String, Value>) {
    map.retain(|_, v| !v.is_null());
}

fn check_version(v: Option<&Value>) -> Result<(), CniError> {
    let supported = || format!("supported: {}", SUPPORTED_VERSIONS.join(", "));
    match v {
        None => Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "the network config has no cniVersion",
            supported(),
        )),
        Some(Value::String(version)) if SUPPORTED_VERSIONS.contains(&version.as_str()) => Ok(()),
        Some(Value::String(version)) => Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("cniVersion {version:?} is not supported"),
            supported(),
        )),
        Some(other) => Err(invalid("cniVersion", other, "a string")),
    }
}

/// Prefixes of the node DaemonSet's pods (ours, and Istio's for a drop-in), skipped in the
/// DaemonSet's namespace: fetching them would wait for the plugin's own kubeconfig.
const OWN_POD_PREFIXES: &[&str] = &["redirect-cni-node-", "istio-cni-node-"];

impl NetConf {
    /// The fields that depend on others, and the checks serde cannot make.
    fn derive_fields(&mut self) -> Result<(), CniError> {
        let legacy = self.kubernetes.take().unwrap_or_default();
        self.run_dir = self
            .cni_agent_run_dir
            .clone()
            .unwrap_or_else(|| DEFAULT_RUN_DIR.into());
        self.kubeconfig = self
            .kubeconfig_field
            .clone()
            .or(legacy.kubeconfig)
            .unwrap_or_else(|| self.run_dir.join(KUBECONFIG_NAME));
        self.exclude_namespaces.extend(legacy.exclude_namespaces);
        self.log_level = self
            .plugin_log_level
            .clone()
            .or(self.log_level_field.clone())
            .unwrap_or_else(|| "info".into());
        self.kube_attempts = self.kube_attempts.max(1);
        if redirect_program::logging::level(&self.log_level).is_none() {
            return Err(invalid(
                "plugin_log_level",
                &Value::String(self.log_level.clone()),
                &redirect_program::logging::level_names(" or "),
            ));
        }
        Ok(())
    }

    /// Why pod `ns`/`name` is left alone before looking at it (its own DaemonSet's pods,
    /// excluded namespaces), or `None`. The plugin and the repair controller ask alike.
    pub fn excluded(&self, ns: &str, name: &str) -> Option<String> {
        if self.pod_namespace.as_deref() == Some(ns)
            && OWN_POD_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            return Some("the plugin's own DaemonSet pod: skipped".into());
        }
        if self.exclude_namespaces.iter().any(|n| n == ns) {
            return Some(format!("namespace {ns} is excluded"));
        }
        None
    }
}

/// The version a VERSION call answers for: whatever stdin says, else the newest.
pub fn requested_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(|c| c.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "1.1.0".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_cni_entry_parses_and_unknown_fields_are_ignored() {
        let c = parse(br#"{"cniVersion":"0.3.1","name":"istio-cni","type":"istio-cni","ipam":{},"dns":{},
            "plugin_log_level":"debug","cni_agent_run_dir":"/var/run/istio-cni","ambient_enabled":false,
            "enablement_selectors":[],"exclude_namespaces":["kube-system"],"pod_namespace":"istio-system",
            "native_nftables":false,"something_new":{"x":1}}"#).unwrap();
        assert_eq!(c.cni_version, "0.3.1");
        assert_eq!(c.exclude_namespaces, ["kube-system"]);
        assert_eq!(
            c.kubeconfig,
            PathBuf::from("/var/run/istio-cni/redirect-cni-kubeconfig")
        );
        assert_eq!(c.pod_namespace.as_deref(), Some("istio-system"));
        assert_eq!((c.kube_attempts, c.kube_interval_ms), (30, 1000));
        assert_eq!(c.kube_deadline_ms, 60_000);
    }

    #[test]
    fn kube_deadline_is_bounded_by_kubelets_timeout() {
        let conf = |v: &str| {
            parse(format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"redirect-cni","kube_deadline_ms":{v}}}"#).as_bytes())
        };
        assert_eq!(conf("5000").unwrap().kube_deadline_ms, 5000);
        for bad in ["0", "110001", "-1", "\"60s\""] {
            let e = conf(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
            assert!(
                e.msg.contains("kube_deadline_ms") && e.msg.contains(bad.trim_matches('"')),
                "{bad}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn enablement_selectors_are_istios_and_a_bad_one_is_named() {
        let conf = |v: &str| {
            parse(format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"redirect-cni","enablement_selectors":{v}}}"#).as_bytes())
        };
        assert!(conf("null")
            .unwrap()
            .enablement_selectors
            .is_istio_default());
        let mine = conf(r#"[{"podSelector":{"matchLabels":{"mesh":"on"}}}]"#).unwrap();
        let on = BTreeMap::from([("mesh".to_string(), "on".to_string())]);
        assert!(mine.enablement_selectors.matches(&on, &BTreeMap::new()));
        for (bad, says) in [
            (
                r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}]"#,
                "takes no values",
            ),
            (
                r#"[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Equal"}]}}]"#,
                "Equal",
            ),
            (r#"{"podSelector":{}}"#, "enablement_selectors"),
        ] {
            let e = conf(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
            assert!(
                e.msg.contains("enablement_selectors") && e.msg.contains(says),
                "{bad}: {}",
                e.msg
            );
        }
    }

    #[test]
    fn annotations_capability_and_ours() {
        let c = parse(br#"{"cniVersion":"1.0.0","name":"n","type":"redirect-cni",
            "runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{}"}},
            "proxy_uid":1337,"bypass_uids":[1000,1001],"kubernetes":{"kubeconfig":"/k","exclude_namespaces":["a"]}}"#).unwrap();
        assert_eq!(c.pod_annotations.unwrap()["sidecar.istio.io/status"], "{}");
        assert_eq!(
            (c.mesh.proxy_uid, c.mesh.bypass_uids.clone()),
            (Some(1337), vec![1000, 1001])
        );
        assert_eq!(
            (c.kubeconfig, c.exclude_namespaces),
            (PathBuf::from("/k"), vec!["a".to_string()])
        );
    }

    #[test]
    fn bad_configs_name_the_field_and_value() {
        let cases: &[(&[u8], u32, &str)] = &[
            (b"not json", code::DECODE, "not JSON"),
            (b"[1]", code::INVALID_CONFIG, "JSON object"),
            (br#"{"name":"x"}"#, code::INCOMPATIBLE_VERSION, "no cniVersion"),
            (br#"{"cniVersion":"9.9.9"}"#, code::INCOMPATIBLE_VERSION, "9.9.9"),
            (br#"{"cniVersion":"0.2.0"}"#, code::INCOMPATIBLE_VERSION, "0.2.0"),
            (br#"{"cniVersion":1}"#, code::INVALID_CONFIG, "cniVersion"),
            (br#"{"cniVersion":"1.0.0","exclude_namespaces":"kube-system"}"#, code::INVALID_CONFIG, "exclude_namespaces"),
            (br#"{"cniVersion":"1.0.0","proxy_uid":"1337"}"#, code::INVALID_CONFIG, "proxy_uid"),
            (br#"{"cniVersion":"1.0.0","proxy_uid":-1}"#, code::INVALID_CONFIG, "-1"),
            (br#"{"cniVersion":"1.0.0","bypass_uids":[1,"x"]}"#, code::INVALID_CONFIG, "bypass_uids"),
            (br#"{"cniVersion":"1.0.0","dns_capture":"yes"}"#, code::INVALID_CONFIG, "dns_capture"),
            (br#"{"cniVersion":"1.0.0","prevResult":[]}"#, code::INVALID_CONFIG, "prevResult"),
            (br#"{"cniVersion":"1.0.0","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"a":1}}}"#, code::INVALID_CONFIG, "pod-annotations.a"),
            (br#"{"cniVersion":"1.0.0","plugin_log_level":"loud"}"#, code::INVALID_CONFIG, "loud"),
        ];
        for (input, want, text) in cases {
            let e = parse(input).expect_err(&String::from_utf8_lossy(input));
            assert_eq!(e.code, *want, "{}: {e}", String::from_utf8_lossy(input));
            assert!(
                format!("{} {}", e.msg, e.details).contains(text),
                "{}: {e}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
