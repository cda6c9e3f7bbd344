//! Istio's JSON log line (`--log_as_json`, `global.logAsJson`): one object per line with
//! `level`, `time` (RFC 3339, microseconds, UTC), `scope` and `msg`, then the event's fields;
//! a line of another crate names it in `target` (the caller, which knows our crates, says
//! which). serde_json escapes every control character,
//! so no value can break the line.

use std::time::SystemTime;

use serde_json::{Map, Value};

/// The JSON line, newline included; `foreign` is the target of another crate's line.
pub(crate) fn line(
    level: &str,
    scope: &str,
    foreign: Option<&str>,
    msg: &str,
    fields: &[(&'static str, String)],
) -> String {
    let mut m = Map::new();
    m.insert("level".into(), level.into());
    let time = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
    m.insert("time".into(), time.into());
    m.insert("scope".into(), scope.into());
    if let Some(target) = foreign {
        m.insert("target".into(), target.into());
    }
    m.insert("msg".into(), msg.into());
    for (name, value) in fields {
        if !m.contains_key(*name) {
            m.insert((*name).into(), Value::String(value.clone()));
        }
    }
    let mut text = Value::Object(m).to_string();
    text.push('\n');
    text
}
