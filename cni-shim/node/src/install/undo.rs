//! The record of what the installer changed in the net dir, kept in the run dir so that
//! uninstall can undo it exactly, also after a restart: for each file, how it was before our
//! latest change (absent, its bytes and mode, or unknown when it already held our entry) and
//! what we left there (bytes, or removed). When every file is still as we left it, uninstall
//! puts back the exact bytes; otherwise it removes our entry from what is there now.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::atomic_file::{self, FileAttrs};
use crate::error::Result;
use crate::plugin_entry::is_ours;

/// A file before our change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Before {
    Absent,
    Saved {
        /// The exact bytes (CNI configs are JSON, hence UTF-8).
        contents: String,
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
        /// It was a symbolic link to this path (the primary CNI's own file, say): put back as
        /// that link, so the node's config follows that file again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        link: Option<PathBuf>,
    },
    /// It already held an entry of ours when we first saw it: no clean original is known.
    Unknown,
}

impl Before {
    pub fn saved(contents: &[u8], attrs: FileAttrs, link: Option<PathBuf>) -> Self {
        match std::str::from_utf8(contents) {
            Ok(text) => Before::Saved {
                contents: text.to_string(),
                mode: attrs.mode,
                uid: attrs.owner.map(|o| o.0),
                gid: attrs.owner.map(|o| o.1),
                link,
            },
            Err(_) => Before::Unknown,
        }
    }

    fn attrs(mode: u32, uid: Option<u32>, gid: Option<u32>) -> FileAttrs {
        FileAttrs {
            mode,
            owner: uid.zip(gid),
        }
    }
}

/// One file we changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: PathBuf,
    pub before: Before,
    /// What we left: `Some(bytes)` written, `None` removed.
    pub after: Option<String>,
}

/// Everything we changed in the net dir.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndoRecord {
    pub files: Vec<FileChange>,
}

/// Whether a config (a list or a single plugin) holds an entry of ours; unparsable: no.
pub fn holds_ours(bytes: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return false;
    };
    match v.get("plugins").and_then(Value::as_array) {
        Some(plugins) => plugins.iter().any(is_ours),
        None => is_ours(&v),
    }
}

impl UndoRecord {
    /// The record saved at `path`; empty if there is none or it cannot be read (with a warning).
    pub fn load(path: &Path) -> Self {
        match atomic_file::read_if_exists(path) {
            Ok(None) => UndoRecord::default(),
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(
                    "ignoring the unreadable install state {}: {e}; uninstall will only remove \
                     our entries",
                    path.display()
                );
                UndoRecord::default()
            }),
            Err(e) => {
                tracing::warn!(
                    "ignoring the install state: {}",
                    redirect_program::errors::chain(&e)
                );
                UndoRecord::default()
            }
        }
    }

    /// Save to `path` (mode 0600), or remove `path` when the record is empty.
    pub fn save(&self, path: &Path) -> Result<()> {
        if self.files.is_empty() {
            atomic_file::remove(path)?;
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        atomic_file::write_atomic(path, &bytes, FileAttrs::mode(0o600))
    }

    pub fn get(&self, path: &Path) -> Option<&FileChange> {
        self.files.iter().find(|f| f.path == path)
    }

    /// The file that holds what we wrote (the config the runtime reads), if any.
    pub fn target(&self) -> Option<&Path> {
        self.files
            .iter()
            .find(|f| f.after.is_some())
            .map(|f| f.path.as_path())
    }

    /// Record that `path`, now `current` (bytes and attributes, or absent), is about to become
    /// `after`. A JSON file that holds no entry of ours becomes the new "before"; one that does,
    /// or that is not JSON, keeps the earlier "before" (or unknown).
    pub fn note(
        &mut self,
        path: &Path,
        current: Option<(&[u8], FileAttrs)>,
        after: Option<Vec<u8>>,
    ) {
        let earlier = self.get(path).map(|f| f.before.clone());
        // Not JSON: most likely caught in the middle of someone's in-place write; not an
        // original worth putting back.
        let clean = |b: &[u8]| serde_json::from_slice::<Value>(b).is_ok() && !holds_ours(b);
        let before = match current {
            None => Before::Absent,
            Some((bytes, attrs)) if clean(bytes) => {
                Before::saved(bytes, attrs, atomic_file::link_of(path))
            }
            Some(_) => earlier.unwrap_or(Before::Unknown),
        };
        let after = after.map(|b| String::from_utf8_lossy(&b).into_owned());
        let change = FileChange {
            path: path.to_path_buf(),
            before,
            after,
        };
        match self.files.iter_mut().find(|f| f.path == path) {
            Some(f) => *f = change,
            None => self.files.push(change),
        }
    }

    /// Whether every file is still exactly as we left it.
    pub fn untouched(&self) -> Result<bool> {
        for f in &self.files {
            let now = atomic_file::read_if_exists(&f.path)?;
            if now.as_deref() != f.after.as_deref().map(str::as_bytes) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the "before" of every file is known.
    pub fn all_known(&self) -> bool {
        self.files.iter().all(|f| f.before != Before::Unknown)
    }

    /// Put every file back as it was: first the files to restore (so a runtime never sees the
    /// directory without a config), then the removals.
    pub fn restore_exact(&self) -> Result<()> {
        for f in &self.files {
            match &f.before {
                Before::Saved {
                    link: Some(target), ..
                } => atomic_file::symlink_atomic(&f.path, target)?,
                Before::Saved {
                    contents,
                    mode,
                    uid,
                    gid,
                    link: None,
                } => atomic_file::write_atomic(
                    &f.path,
                    contents.as_bytes(),
                    Before::attrs(*mode, *uid, *gid),
                )?,
                _ => {}
            }
        }
        for f in &self.files {
            if f.before == Before::Absent {
                atomic_file::remove(&f.path)?;
            }
        }
        Ok(())
    }
}
