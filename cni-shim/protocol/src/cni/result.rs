//! What ADD prints on success: the previous plugin's result unchanged (a chained plugin that
//! touches no interface and no address must not alter it), or an empty result when there is
//! none. Either way in the config's cniVersion, which is also the prevResult's (the runtime
//! converts results to the list's version before handing them on).

use serde_json::{json, Value};

/// The result to print: `prev` with its `cniVersion` set to `cni_version`, or an empty result
/// when there is no previous result object.
pub fn passthrough(cni_version: &str, prev: Option<&Value>) -> String {
    match prev {
        Some(Value::Object(m)) => {
            let mut m = m.clone();
            m.insert("cniVersion".into(), Value::String(cni_version.into()));
            Value::Object(m).to_string()
        }
        _ => json!({"cniVersion": cni_version, "dns": {}}).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_result_is_kept_and_empty_result_is_minimal() {
        let prev = json!({"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],
            "ips":[{"version":"4","address":"10.1.0.5/24","gateway":"10.1.0.1","interface":0}],"dns":{}});
        let out: Value = serde_json::from_str(&passthrough("0.4.0", Some(&prev))).unwrap();
        assert_eq!(out, prev);
        let empty: Value = serde_json::from_str(&passthrough("1.1.0", None)).unwrap();
        assert_eq!(empty, json!({"cniVersion":"1.1.0","dns":{}}));
    }
}
