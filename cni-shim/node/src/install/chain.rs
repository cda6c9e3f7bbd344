//! Pure transformations of CNI configs for chained mode. Key order and every other field are
//! kept as they were.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::plugin_entry::is_ours;

/// The name a converted `.conf` gets when it had none (Istio's).
pub const DEFAULT_LIST_NAME: &str = "k8s-pod-network";

/// The `type` of Istio's plugin, whose entry ours takes over.
pub const ISTIO_TYPE: &str = "istio-cni";

/// Whether a plugin entry is Istio's (by `type`).
pub fn is_istio(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(ISTIO_TYPE)
}

/// Whether `list` holds exactly one entry of ours and it equals `entry` (wherever it is, so
/// that two installers that each want to be last do not fight), and no entry of Istio's (two
/// capture plugins would both program each pod).
pub fn list_has_entry(list: &Value, entry: &Value) -> bool {
    let Some(plugins) = list.get("plugins").and_then(Value::as_array) else {
        return false;
    };
    let ours: Vec<&Value> = plugins.iter().filter(|p| is_ours(p)).collect();
    ours.len() == 1 && ours[0] == entry && !plugins.iter().any(is_istio)
}

/// Whether `list` holds an entry of Istio's.
pub fn list_has_istio(list: &Value) -> bool {
    has_plugin(list, is_istio)
}

/// `list` without Istio's entries: what the file would be with no capture plugin, which an
/// uninstall puts back (Istio's entry is for Istio's installer to write again, with its binary).
pub fn without_istio(list: &Value) -> Value {
    without(list, is_istio)
}

/// Whether `list` holds any entry of ours.
pub fn list_has_any_entry(list: &Value) -> bool {
    has_plugin(list, is_ours)
}

/// `list` without any entry of ours.
pub fn remove_entries(list: &Value) -> Value {
    without(list, is_ours)
}

/// Whether `list` has a plugin entry `pick` picks.
fn has_plugin(list: &Value, pick: fn(&Value) -> bool) -> bool {
    list.get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|p| p.iter().any(pick))
}

/// `list` without the plugin entries `pick` picks; everything else kept.
fn without(list: &Value, pick: fn(&Value) -> bool) -> Value {
    let mut out = list.clone();
    if let Some(plugins) = out.get_mut("plugins").and_then(Value::as_array_mut) {
        plugins.retain(|p| !pick(p));
    }
    out
}

/// `list` with any old entry of ours removed and `entry` in: in place of Istio's entry when
/// there is one (the takeover of a node switched from istio-cni: one write, so a pod is never
/// set up without a capture plugin, and Istio's uninstall, which removes entries of its type,
/// leaves ours), else appended; everything else (the list's `cniVersion` included) kept.
pub fn chain_into_list(list: &Value, entry: &Value) -> Result<Value, String> {
    let mut out = remove_entries(list);
    let plugins = out
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or("no \"plugins\" array")?;
    match plugins.iter().position(is_istio) {
        Some(at) => {
            plugins[at] = entry.clone();
            plugins.retain(|p| !is_istio(p));
        }
        None => plugins.push(entry.clone()),
    }
    Ok(out)
}

/// A single-plugin `.conf` turned into a list:
/// `{"cniVersion": <the conf's>, "name": <the conf's>, "plugins": [<conf minus cniVersion>, entry]}`.
pub fn conf_to_list(conf: &Value, entry: &Value) -> Result<Value, String> {
    let obj = conf.as_object().ok_or("not a JSON object")?;
    let mut plugin = obj.clone();
    let version = plugin.shift_remove("cniVersion");
    let mut list = Map::new();
    if let Some(v) = version {
        list.insert("cniVersion".into(), v);
    }
    let name = obj
        .get("name")
        .filter(|n| n.as_str().is_some_and(|s| !s.is_empty()))
        .cloned()
        .unwrap_or_else(|| DEFAULT_LIST_NAME.into());
    list.insert("name".into(), name);
    // A leftover standalone config of ours is replaced by the entry, not chained to it.
    let plugins = if is_ours(conf) {
        vec![entry.clone()]
    } else {
        vec![Value::Object(plugin), entry.clone()]
    };
    list.insert("plugins".into(), Value::Array(plugins));
    Ok(Value::Object(list))
}

/// Where a converted `.conf` (or `.json`) goes: the same name with `.conflist`.
pub fn list_path_for(conf: &Path) -> PathBuf {
    conf.with_extension("conflist")
}

/// How we write JSON: two-space indent and a final newline.
pub fn render(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}
