//! Which CNI config file the runtime uses, chosen as kubelet's CRI runtimes do (libcni): files
//! named `*.conf`, `*.conflist` or `*.json` in the net dir, sorted by name; the first one that
//! parses wins. A `.conflist` needs a `name` and a non-empty `plugins` array whose entries have
//! a `type`; a `.conf`/`.json` is a single plugin and needs a `type`.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// How a runtime reads a config file, by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfKind {
    /// `.conf` or `.json`: one plugin.
    Single,
    /// `.conflist`: a list of plugins.
    List,
}

/// The kind of a file by name, or `None` if runtimes ignore it.
pub fn conf_kind(path: &Path) -> Option<ConfKind> {
    match path.extension()?.to_str()? {
        "conflist" => Some(ConfKind::List),
        "conf" | "json" => Some(ConfKind::Single),
        _ => None,
    }
}

/// Parse a config file's bytes as a runtime would; `Err` says why it would be skipped.
pub fn parse_conf(kind: ConfKind, bytes: &[u8]) -> std::result::Result<Value, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    match kind {
        ConfKind::Single => {
            if !has_type(&v) {
                return Err("no \"type\"".into());
            }
        }
        ConfKind::List => {
            if !obj.get("name").is_some_and(Value::is_string) {
                return Err("no \"name\"".into());
            }
            let plugins = obj
                .get("plugins")
                .and_then(Value::as_array)
                .ok_or("no \"plugins\" array")?;
            if plugins.is_empty() {
                return Err("no plugins in \"plugins\"".into());
            }
            if let Some(i) = plugins.iter().position(|p| !has_type(p)) {
                return Err(format!("plugin {i} has no \"type\""));
            }
        }
    }
    Ok(v)
}

fn has_type(v: &Value) -> bool {
    v.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
}

/// The CNI config files of `dir` in the order a runtime tries them.
pub fn candidates(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| conf_kind(p).is_some() && p.is_file())
        .collect();
    // Go's sort.Strings: byte order.
    files.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });
    Ok(files)
}

/// A config file the runtime skips (it does not parse as one), before the one it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skipped {
    pub path: PathBuf,
    pub reason: String,
    /// A hash of the bytes read: a new one is a new version of the file.
    pub digest: u64,
}

/// The file to chain into: `conf_name` if given (or its `.conf`/`.conflist` twin when only
/// that exists), else the file the runtime uses. `Ok(None)`: none yet.
pub fn select_target(dir: &Path, conf_name: Option<&str>) -> Result<Option<PathBuf>> {
    select_target_noting(dir, conf_name, None).map(|(target, _)| target)
}

/// [`select_target`] passing over `owned` (our own file, never the primary), and the files a
/// runtime would skip on the way to it, with why.
pub(crate) fn select_target_noting(
    dir: &Path,
    conf_name: Option<&str>,
    owned: Option<&Path>,
) -> Result<(Option<PathBuf>, Vec<Skipped>)> {
    if let Some(name) = conf_name {
        let path = dir.join(name);
        if path.is_file() {
            return Ok((Some(path), Vec::new()));
        }
        let twin = match conf_kind(&path) {
            Some(ConfKind::List) => Some(path.with_extension("conf")),
            Some(ConfKind::Single) => Some(path.with_extension("conflist")),
            None => None,
        };
        return Ok((twin.filter(|t| t.is_file()), Vec::new()));
    }
    let mut skipped = Vec::new();
    for path in candidates(dir)? {
        let Some(kind) = conf_kind(&path).filter(|_| Some(path.as_path()) != owned) else {
            continue;
        };
        // A file that vanished or cannot be read is skipped, as the runtime would.
        let Ok(bytes) = fs::read(&path) else {
            continue;
        };
        match parse_conf(kind, &bytes) {
            Ok(_) => return Ok((Some(path), skipped)),
            Err(reason) => skipped.push(Skipped {
                digest: digest(&bytes),
                path,
                reason,
            }),
        }
    }
    Ok((None, skipped))
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}
