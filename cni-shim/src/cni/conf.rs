//! The network config on stdin: the spec's fields, istio-cni's fields (same names, so an
//! istio-cni entry works as ours), and our own. Unknown fields are ignored; a known field of
//! the wrong type is an error naming the field, the value and the expected type.

use std::collections::BTreeMap;
use std::path::PathBuf;

use redirect_istio::mesh::MeshDefaults;
use serde_json::{Map, Value};

use super::{code, CniError, SUPPORTED_VERSIONS};

/// The runtime capability that carries every pod annotation (containerd ≥ 1.5, CRI-O).
pub const POD_ANNOTATIONS_CAPABILITY: &str = "io.kubernetes.cri.pod-annotations";
/// Where the installer keeps its files (kubeconfig) unless the config says otherwise.
pub const DEFAULT_RUN_DIR: &str = "/var/run/redirect-cni";
pub const KUBECONFIG_NAME: &str = "redirect-cni-kubeconfig";

/// The parsed config.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    /// The previous plugin's result, passed back unchanged.
    pub prev_result: Option<Value>,
    /// Annotations from the runtime, when it sends the capability.
    pub pod_annotations: Option<BTreeMap<String, String>>,
    pub log_level: String,
    pub log_file: Option<PathBuf>,
    pub run_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub exclude_namespaces: Vec<String>,
    /// The namespace of our DaemonSet (its own pods are skipped).
    pub pod_namespace: Option<String>,
    /// What a pod gets when its spec does not say (`proxy_uid`, `proxy_gid`, `dns_capture`,
    /// `dual_stack`, `drop_invalid`), and the bypass IDs of every pod (`bypass_uids`,
    /// `bypass_gids`).
    pub mesh: MeshDefaults,
    /// Allow programming the namespace the plugin itself runs in (never in a real cluster).
    pub allow_host_netns: bool,
    pub kube_attempts: u32,
    pub kube_interval_ms: u64,
    pub kube_deadline_ms: u64,
    /// istio-cni's ambient mode: not supported, warned about.
    pub ambient_enabled: bool,
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
    "native_nftables",
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

/// `kube_deadline_ms`: the bound on the whole pod read, 1 ms to 110 s (kubelet gives the
/// runtime 2 minutes for a sandbox; a budget past that would be cut off unnamed).
fn kube_deadline_ms(f: &Fields) -> Result<u64, CniError> {
    const MAX: u64 = 110_000;
    match f.get("kube_deadline_ms") {
        None => Ok(crate::kube::DEFAULT_DEADLINE.as_millis() as u64),
        Some(v) => v.as_u64().filter(|n| (1..=MAX).contains(n)).ok_or_else(|| {
            invalid(
                "kube_deadline_ms",
                v,
                "milliseconds from 1 to 110000 (110 s, under kubelet's 2-minute runtime timeout)",
            )
        }),
    }
}

/// The fields of the config (`parent: None`) or of one of its objects. Every read goes
/// through [`Fields::get`], which insists (in debug builds, so in tests) that the key is listed
/// in [`FIELDS`] or [`NESTED_FIELDS`]: a field read but not listed would go undocumented.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    parent: Option<&'static str>,
}

impl<'a> Fields<'a> {
    fn top(map: &'a Map<String, Value>) -> Self {
        Fields { map, parent: None }
    }

    fn nested(parent: &'static str, map: &'a Map<String, Value>) -> Self {
        Fields {
            map,
            parent: Some(parent),
        }
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        debug_assert!(
            match self.parent {
                None => FIELDS.contains(&k),
                Some(p) => NESTED_FIELDS.contains(&(p, k)),
            },
            "config field {}{k:?} is read but not listed in FIELDS/NESTED_FIELDS (and so not checked against docs/redirect-cni.md)",
            self.parent.map(|p| format!("{p}.")).unwrap_or_default()
        );
        self.map.get(k).filter(|v| !v.is_null())
    }

    fn string(&self, k: &str) -> Result<Option<String>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(invalid(k, v, "a string")),
        }
    }

    fn boolean(&self, k: &str) -> Result<bool, CniError> {
        match self.get(k) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(invalid(k, v, "true or false")),
        }
    }

    fn id(&self, k: &str) -> Result<Option<u32>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| invalid(k, v, "a number from 0 to 4294967295")),
        }
    }

    fn strings(&self, k: &str) -> Result<Vec<String>, CniError> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|i| {
                    i.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| invalid(k, i, "a list of strings"))
                })
                .collect(),
            Some(v) => Err(invalid(k, v, "a list of strings")),
        }
    }

    fn ids(&self, k: &str) -> Result<Vec<u32>, CniError> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|i| {
                    i.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| invalid(k, i, "a list of numeric IDs"))
                })
                .collect(),
            Some(v) => Err(invalid(k, v, "a list of numeric IDs")),
        }
    }
}

/// Parse stdin. `strict_version`: VERSION accepts any version string, the others need one we
/// speak.
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
    let Value::Object(map) = &value else {
        return Err(invalid("(config)", &value, "a JSON object"));
    };
    let f = Fields::top(map);
    let cni_version = f.string("cniVersion")?.ok_or_else(|| {
        CniError::new(
            code::INCOMPATIBLE_VERSION,
            "the network config has no cniVersion",
            format!("supported: {}", SUPPORTED_VERSIONS.join(", ")),
        )
    })?;
    if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("cniVersion {cni_version:?} is not supported"),
            format!("supported: {}", SUPPORTED_VERSIONS.join(", ")),
        ));
    }
    let prev_result = match f.get("prevResult") {
        None => None,
        Some(v @ Value::Object(_)) => Some(v.clone()),
        Some(v) => return Err(invalid("prevResult", v, "a result object")),
    };
    let pod_annotations = match f.get("runtimeConfig") {
        None => None,
        Some(Value::Object(rc)) => {
            match Fields::nested("runtimeConfig", rc).get(POD_ANNOTATIONS_CAPABILITY) {
                None => None,
                Some(Value::Object(a)) => Some(
                    a.iter()
                        .map(|(k, v)| match v {
                            Value::String(s) => Ok((k.clone(), s.clone())),
                            other => Err(invalid(
                                &format!("runtimeConfig.{POD_ANNOTATIONS_CAPABILITY}.{k}"),
                                other,
                                "a string (annotation values are strings)",
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Some(v) => {
                    return Err(invalid(
                        &format!("runtimeConfig.{POD_ANNOTATIONS_CAPABILITY}"),
                        v,
                        "an object of annotations",
                    ))
                }
            }
        }
        Some(v) => return Err(invalid("runtimeConfig", v, "an object")),
    };
    // istio-cni ≤ 1.23 kept these under "kubernetes".
    let legacy = match f.get("kubernetes") {
        Some(Value::Object(k)) => Some(k),
        Some(v) => return Err(invalid("kubernetes", v, "an object")),
        None => None,
    };
    let legacy = legacy.map(|k| Fields::nested("kubernetes", k));
    let run_dir = PathBuf::from(
        f.string("cni_agent_run_dir")?
            .unwrap_or_else(|| DEFAULT_RUN_DIR.into()),
    );
    let kubeconfig = match (f.string("kubeconfig")?, legacy.as_ref()) {
        (Some(p), _) => PathBuf::from(p),
        (None, Some(l)) => l
            .string("kubeconfig")?
            .map(PathBuf::from)
            .unwrap_or_else(|| run_dir.join(KUBECONFIG_NAME)),
        (None, None) => run_dir.join(KUBECONFIG_NAME),
    };
    let mut exclude_namespaces = f.strings("exclude_namespaces")?;
    if let Some(l) = &legacy {
        exclude_namespaces.extend(l.strings("exclude_namespaces")?);
    }
    let conf = NetConf {
        cni_version,
        name: f.string("name")?.unwrap_or_default(),
        plugin_type: f.string("type")?.unwrap_or_default(),
        prev_result,
        pod_annotations,
        log_level: f
            .string("plugin_log_level")?
            .or(f.string("log_level")?)
            .unwrap_or_else(|| "info".into()),
        log_file: f.string("log_file")?.map(PathBuf::from),
        run_dir,
        kubeconfig,
        exclude_namespaces,
        pod_namespace: f.string("pod_namespace")?,
        mesh: MeshDefaults {
            proxy_uid: f.id("proxy_uid")?,
            proxy_gid: f.id("proxy_gid")?,
            dns_capture: f.boolean("dns_capture")?,
            dual_stack: f.boolean("dual_stack")?,
            drop_invalid: f.boolean("drop_invalid")?,
            bypass_uids: f.ids("bypass_uids")?,
            bypass_gids: f.ids("bypass_gids")?,
        },
        allow_host_netns: f.boolean("allow_host_netns")?,
        kube_attempts: f.id("kube_attempts")?.unwrap_or(30).max(1),
        kube_interval_ms: u64::from(f.id("kube_interval_ms")?.unwrap_or(1000)),
        kube_deadline_ms: kube_deadline_ms(&f)?,
        ambient_enabled: f.boolean("ambient_enabled")?,
    };
    f.boolean("native_nftables")?;
    if !matches!(
        conf.log_level.as_str(),
        "debug" | "info" | "warn" | "error" | "none"
    ) {
        return Err(invalid(
            "plugin_log_level",
            &Value::String(conf.log_level.clone()),
            "debug, info, warn, error or none",
        ));
    }
    Ok(conf)
}

/// Prefixes of the node DaemonSet's pods (ours, and Istio's for a drop-in), skipped in the
/// DaemonSet's namespace: fetching them would wait for the plugin's own kubeconfig.
const OWN_POD_PREFIXES: &[&str] = &["redirect-cni-node-", "istio-cni-node-"];

impl NetConf {
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
