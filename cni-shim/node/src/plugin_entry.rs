//! Our plugin's entry in the CNI config: the chained entry (no `cniVersion`, the list's applies)
//! and the standalone config (`cniVersion` 1.0.0 plus the entry), and that config as the plugin
//! parses it (`plugin_conf`, what the agent's parts capture a pod with).

use cni_protocol::cni::conf::NetConf;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::PLUGIN_TYPE;

/// The CNI version of the standalone config.
pub const STANDALONE_CNI_VERSION: &str = "1.0.0";

/// The entry appended to a chained `.conflist`: our settings, then `--plugin-config-json`
/// merged in (objects merged key by key, anything else replaced).
pub fn plugin_entry(s: &Settings) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), PLUGIN_TYPE.into());
    m.insert("name".into(), s.cni_network_name.clone().into());
    m.insert("log_level".into(), s.plugin_log_level.clone().into());
    if s.log_as_json {
        m.insert("log_as_json".into(), true.into());
    }
    // Istio's fields, as its installer writes them (read and documented by our plugin).
    for (on, field) in [
        (s.istio_fields.0, "native_nftables"),
        (s.istio_fields.1, "enable_ambient_detection_retry"),
    ] {
        if on {
            m.insert(field.into(), true.into());
        }
    }
    m.insert(
        "cni_agent_run_dir".into(),
        s.cni_agent_run_dir.to_string_lossy().into_owned().into(),
    );
    m.insert(
        "kubeconfig".into(),
        s.kubeconfig_path().to_string_lossy().into_owned().into(),
    );
    m.insert(
        "exclude_namespaces".into(),
        s.exclude_namespaces.clone().into(),
    );
    m.insert("pod_namespace".into(), s.pod_namespace.clone().into());
    if s.capture_counters.on() {
        // The plugin's ADD puts counters on a sidecar pod's rules; the agent reads them.
        m.insert("counters".into(), true.into());
    }
    if s.ambient.enabled {
        // The plugin asks the agent at each ADD (`cni_protocol::ambient`).
        m.insert("ambient_enabled".into(), true.into());
        // Istio's field, for the plugin's own decision while the agent is away; left out at
        // Istio's default, which the plugin takes then.
        if !s.ambient.selectors.is_istio_default() {
            m.insert(
                "enablement_selectors".into(),
                serde_json::to_value(&s.ambient.selectors).unwrap_or_default(),
            );
        }
    }
    let mut caps = Map::new();
    caps.insert("io.kubernetes.cri.pod-annotations".into(), true.into());
    m.insert("capabilities".into(), caps.into());
    merge(&mut m, &s.plugin_config);
    Value::Object(m)
}

/// The standalone config file: `{"cniVersion": "1.0.0", <entry>}`.
pub fn standalone_conf(s: &Settings) -> Value {
    let mut m = Map::new();
    m.insert("cniVersion".into(), STANDALONE_CNI_VERSION.into());
    if let Value::Object(entry) = plugin_entry(s) {
        for (k, v) in entry {
            if k != "cniVersion" {
                m.insert(k, v);
            }
        }
    }
    Value::Object(m)
}

fn merge(into: &mut Map<String, Value>, extra: &Map<String, Value>) {
    for (k, v) in extra {
        match (into.get_mut(k), v) {
            (Some(Value::Object(a)), Value::Object(b)) => merge(a, b),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Whether a plugin entry is ours (by `type`).
pub fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// The plugin's own config entry, parsed as the plugin parses it.
pub(crate) fn plugin_conf(settings: &Settings) -> Result<NetConf> {
    let text = standalone_conf(settings).to_string();
    cni_protocol::cni::conf::parse(text.as_bytes()).map_err(|e| Error::InvalidSetting {
        setting: "PLUGIN_CONFIG_JSON",
        value: settings
            .plugin_config
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(","),
        reason: format!("the plugin would refuse its config entry: {}", e.msg),
    })
}
