//! The CNI config in the net dir: chained into the file the runtime uses, or our own standalone
//! file; checked and rewritten only when wrong; undone exactly on uninstall (see `undo`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chain;
use super::conf_select::{self, ConfKind};
use super::owned_file;
use super::undo::{Before, UndoRecord};
use crate::atomic_file::{self, FileAttrs};
use crate::error::{Error, Result};
use crate::plugin_entry::{self, is_ours};
use crate::settings::Settings;

/// What `reconcile` found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigStatus {
    /// The config in this file was already right; nothing was written.
    Unchanged(PathBuf),
    /// This file was (re)written and is now right.
    Written(PathBuf),
    /// Chained mode: the net dir has no CNI config to chain into yet.
    Waiting,
}

/// Our CNI config and what we changed to put it in place.
#[derive(Debug)]
pub struct CniConfig {
    net_dir: PathBuf,
    conf_name: Option<String>,
    chained: bool,
    /// Chained with `ISTIO_OWNED_CNI_CONFIG`: our own list, the primary's file left alone.
    owned: Option<PathBuf>,
    entry: Value,
    standalone: Value,
    standalone_path: PathBuf,
    standalone_mode: u32,
    state_path: PathBuf,
    record: UndoRecord,
    /// The files a runtime skips that were reported, by the digest of the version reported:
    /// each version is reported once, not at every pass.
    reported_skips: BTreeMap<PathBuf, u64>,
}

impl CniConfig {
    /// From the settings, with the record a previous run left in the run dir.
    pub fn new(s: &Settings) -> Self {
        let state_path = s.state_path();
        CniConfig {
            net_dir: s.mounted_cni_net_dir.clone(),
            conf_name: s.cni_conf_name.clone(),
            chained: s.chained,
            owned: s
                .owned_conf_name
                .as_ref()
                .map(|n| s.mounted_cni_net_dir.join(n)),
            entry: plugin_entry::plugin_entry(s),
            standalone: plugin_entry::standalone_conf(s),
            standalone_path: s.mounted_cni_net_dir.join(s.standalone_conf_name()),
            standalone_mode: s.standalone_conf_mode(),
            record: UndoRecord::load(&state_path),
            state_path,
            reported_skips: BTreeMap::new(),
        }
    }

    pub fn net_dir(&self) -> &Path {
        &self.net_dir
    }

    /// Make the config right, writing only what is wrong.
    pub fn reconcile(&mut self) -> Result<ConfigStatus> {
        // A second pass covers the case where undoing the previous target changed the choice.
        for _ in 0..2 {
            let (wanted, primary) = if self.chained {
                let (target, skipped) = conf_select::select_target_noting(
                    &self.net_dir,
                    self.conf_name.as_deref(),
                    self.owned.as_deref(),
                )?;
                self.report_skips(&skipped);
                match target {
                    Some(t) => (self.owned.clone().unwrap_or_else(|| t.clone()), t),
                    None => return Ok(ConfigStatus::Waiting),
                }
            } else {
                (self.standalone_path.clone(), self.standalone_path.clone())
            };
            match self.record.target() {
                Some(prev) if prev != wanted => {
                    tracing::info!(
                        "the CNI config in use is now {}; removing our entry from {}",
                        wanted.display(),
                        prev.display()
                    );
                    self.undo()?;
                    continue;
                }
                _ => {}
            }
            return match (self.chained, self.owned.is_some()) {
                (true, true) => self.write_owned(&wanted, &primary),
                (true, false) => self.chain_into(&wanted),
                (false, _) => self.write_standalone(),
            };
        }
        Ok(ConfigStatus::Waiting)
    }

    /// The owned file, from the primary's (which is only read): written when it differs, and
    /// refused while another valid file sorts before it (the runtime would read that one).
    fn write_owned(&mut self, owned: &Path, primary: &Path) -> Result<ConfigStatus> {
        let Some(bytes) = atomic_file::read_if_exists(primary)? else {
            return Ok(ConfigStatus::Waiting);
        };
        let attrs = atomic_file::attrs_of(primary)?.unwrap_or(FileAttrs::mode(0o644));
        let desired = owned_file::content(primary, &bytes, &self.entry).map_err(|reason| {
            Error::BadCniConfig {
                path: primary.to_path_buf(),
                reason,
            }
        })?;
        if let Some(first) = owned_file::shadowed_by(&self.net_dir, owned)? {
            let first = first.file_name().unwrap_or_default().to_string_lossy();
            return Err(Error::BadCniConfig {
                path: owned.to_path_buf(),
                reason: format!(
                    "{first} sorts before it, and the runtime reads the first valid file, so \
                     pods would start without the plugin: set ISTIO_OWNED_CNI_CONFIG_FILENAME \
                     to a name that sorts before {first} (such as 00-istio-cni.conflist)"
                ),
            });
        }
        let current = atomic_file::read_if_exists(owned)?;
        let current_attrs = atomic_file::attrs_of(owned)?;
        if current.as_deref() == Some(&desired[..]) && current_attrs == Some(attrs) {
            return Ok(ConfigStatus::Unchanged(owned.to_path_buf()));
        }
        self.record.note(
            owned,
            current.as_deref().zip(current_attrs),
            Some(desired.clone()),
        );
        self.record.save(&self.state_path)?;
        atomic_file::write_atomic(owned, &desired, attrs)?;
        tracing::info!(
            "wrote our own config {} from {} (which is left as it is)",
            owned.display(),
            primary.display()
        );
        Ok(ConfigStatus::Written(owned.to_path_buf()))
    }

    /// Says which config files a runtime skips and why, once per version of each file.
    fn report_skips(&mut self, skipped: &[conf_select::Skipped]) {
        for s in skipped {
            if self.reported_skips.get(&s.path) != Some(&s.digest) {
                tracing::warn!(
                    "{} is skipped, as a runtime skips it: {}",
                    s.path.display(),
                    s.reason
                );
                self.reported_skips.insert(s.path.clone(), s.digest);
            }
        }
        self.reported_skips
            .retain(|p, _| skipped.iter().any(|s| &s.path == p));
    }

    fn chain_into(&mut self, target: &Path) -> Result<ConfigStatus> {
        let Some(bytes) = atomic_file::read_if_exists(target)? else {
            // Removed since it was chosen; the next event brings the new state.
            return Ok(ConfigStatus::Waiting);
        };
        let attrs = atomic_file::attrs_of(target)?.unwrap_or(FileAttrs::mode(0o644));
        let bad = |reason: String| Error::BadCniConfig {
            path: target.to_path_buf(),
            reason,
        };
        let kind = conf_select::conf_kind(target).ok_or_else(|| {
            bad(
                "runtimes read only .conf, .conflist and .json files; set CNI_CONF_NAME to one"
                    .into(),
            )
        })?;
        let value = conf_select::parse_conf(kind, &bytes).map_err(bad)?;
        match kind {
            ConfKind::List => {
                if chain::list_has_entry(&value, &self.entry) {
                    return Ok(ConfigStatus::Unchanged(target.to_path_buf()));
                }
                let new = chain::render(&chain::chain_into_list(&value, &self.entry).map_err(bad)?);
                let istio = chain::list_has_istio(&value);
                // Taking over Istio's entry, the file to put back is the list without it: its
                // binary may be gone, and Istio's installer writes its entry itself.
                let before = match istio {
                    true => chain::render(&chain::without_istio(&value)),
                    false => bytes.clone(),
                };
                self.record
                    .note(target, Some((&before, attrs)), Some(new.clone()));
                self.record.save(&self.state_path)?;
                atomic_file::write_atomic(target, &new, attrs)?;
                if istio {
                    tracing::info!(
                        "took over Istio's entry (type {}) in {}: ours is in its place, in one \
                         write; Istio's uninstall leaves it",
                        chain::ISTIO_TYPE,
                        target.display()
                    );
                }
                Ok(ConfigStatus::Written(target.to_path_buf()))
            }
            ConfKind::Single => {
                // A runtime picks the .conf before the .conflist of the same name, so the list
                // is written first and the .conf removed after: there is always a config.
                let list_path = chain::list_path_for(target);
                let new = chain::render(&chain::conf_to_list(&value, &self.entry).map_err(bad)?);
                let old_list = atomic_file::read_if_exists(&list_path)?;
                let old_list_attrs = atomic_file::attrs_of(&list_path)?;
                self.record.note(
                    &list_path,
                    old_list.as_deref().zip(old_list_attrs),
                    Some(new.clone()),
                );
                self.record.note(target, Some((&bytes, attrs)), None);
                self.record.save(&self.state_path)?;
                atomic_file::write_atomic(&list_path, &new, attrs)?;
                atomic_file::remove(target)?;
                tracing::info!(
                    "converted {} into {} (the original is kept in {} to restore on uninstall)",
                    target.display(),
                    list_path.display(),
                    self.state_path.display()
                );
                Ok(ConfigStatus::Written(list_path))
            }
        }
    }

    fn write_standalone(&mut self) -> Result<ConfigStatus> {
        let path = self.standalone_path.clone();
        let desired = chain::render(&self.standalone);
        let current = atomic_file::read_if_exists(&path)?;
        let attrs = atomic_file::attrs_of(&path)?;
        if current.as_deref() == Some(&desired[..])
            && attrs.map(|a| a.mode) == Some(self.standalone_mode)
        {
            return Ok(ConfigStatus::Unchanged(path));
        }
        self.record
            .note(&path, current.as_deref().zip(attrs), Some(desired.clone()));
        self.record.save(&self.state_path)?;
        atomic_file::write_atomic(&path, &desired, FileAttrs::mode(self.standalone_mode))?;
        self.remove_istios_standalone(&path)?;
        Ok(ConfigStatus::Written(path))
    }

    /// After ours is written: Istio's standalone config of the same network name in another
    /// file goes (Multus finds a network by name, so one of the two was there at every moment;
    /// Istio's uninstall, which deletes its own file, then finds nothing to delete). Not
    /// recorded: an uninstall does not bring back a config whose binary may be gone.
    fn remove_istios_standalone(&self, ours: &Path) -> Result<()> {
        let name = self.standalone.get("name").and_then(Value::as_str);
        let Ok(entries) = std::fs::read_dir(&self.net_dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let path = e.path();
            if path == ours || conf_select::conf_kind(&path) != Some(ConfKind::Single) {
                continue;
            }
            let Some(bytes) = atomic_file::read_if_exists(&path)? else {
                continue;
            };
            let Ok(conf) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if chain::is_istio(&conf) && conf.get("name").and_then(Value::as_str) == name {
                atomic_file::remove(&path)?;
                tracing::info!(
                    "took over Istio's standalone config {} (network {}): ours is {}",
                    path.display(),
                    name.unwrap_or(""),
                    ours.display()
                );
            }
        }
        Ok(())
    }

    /// Undo what was changed: the exact bytes when nothing touched our files since, else our
    /// entry removed from what is there now. Then forget the record.
    pub fn undo(&mut self) -> Result<()> {
        if self.record.files.is_empty() {
            // No record (e.g. the run dir was emptied by a reboot): remove what is ours.
            return self.remove_ours_without_record();
        }
        if self.record.all_known() && self.record.untouched()? {
            self.record.restore_exact()?;
            for f in &self.record.files {
                match f.before {
                    Before::Absent => tracing::info!("removed {}", f.path.display()),
                    _ => tracing::info!("restored {}", f.path.display()),
                }
            }
        } else {
            self.undo_by_content()?;
        }
        self.record = UndoRecord::default();
        self.record.save(&self.state_path)
    }

    /// Our files were changed by someone else since we wrote them: remove our entries from what
    /// is there, and put back a `.conf` we converted when its list is still only our conversion.
    fn undo_by_content(&self) -> Result<()> {
        for f in self.record.files.iter().filter(|f| f.after.is_some()) {
            let Some(bytes) = atomic_file::read_if_exists(&f.path)? else {
                continue;
            };
            if self.owned.as_deref() == Some(f.path.as_path()) {
                // Our own file, changed since: a copy of the primary without our entry would
                // only shadow the primary's next change. It goes.
                self.remove_owned()?;
                continue;
            }
            let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
                tracing::warn!("left {} alone: it is not JSON any more", f.path.display());
                continue;
            };
            let attrs = atomic_file::attrs_of(&f.path)?.unwrap_or(FileAttrs::mode(0o644));
            if value.get("plugins").is_none() {
                // Our standalone file.
                if is_ours(&value) {
                    match &f.before {
                        Before::Saved { .. } => {
                            UndoRecord {
                                files: vec![f.clone()],
                            }
                            .restore_exact()?;
                        }
                        _ => {
                            atomic_file::remove(&f.path)?;
                        }
                    }
                    tracing::info!("removed our config {}", f.path.display());
                }
                continue;
            }
            let remainder = chain::remove_entries(&value);
            if let Before::Saved {
                link: Some(link), ..
            } = &f.before
            {
                if restore_link(&f.path, link, &remainder)? {
                    continue;
                }
            }
            if let Some(conf) = self.converted_from(&remainder) {
                // The list is our conversion of that .conf: bring the .conf back (unless it has
                // been put back meanwhile) and drop the list (or restore what it replaced).
                let mut restore = Vec::new();
                if !conf.path.exists() {
                    restore.push(conf.clone());
                }
                if f.before == Before::Unknown {
                    atomic_file::write_atomic(&f.path, &chain::render(&remainder), attrs)?;
                } else {
                    restore.push(f.clone());
                }
                UndoRecord { files: restore }.restore_exact()?;
                tracing::info!(
                    "restored {} and removed our conversion {}",
                    conf.path.display(),
                    f.path.display()
                );
                continue;
            }
            if remainder != value {
                atomic_file::write_atomic(&f.path, &chain::render(&remainder), attrs)?;
                tracing::info!("removed our entry from {}", f.path.display());
            }
        }
        Ok(())
    }

    /// The owned file removed when it holds an entry of ours (what else is there is a copy).
    fn remove_owned(&self) -> Result<()> {
        let Some(owned) = &self.owned else {
            return Ok(());
        };
        let Some(bytes) = atomic_file::read_if_exists(owned)? else {
            return Ok(());
        };
        if serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| chain::list_has_any_entry(&v)) {
            atomic_file::remove(owned)?;
            tracing::info!("removed our own config {}", owned.display());
        } else {
            tracing::warn!(
                "left {} alone: it holds no entry of ours any more",
                owned.display()
            );
        }
        Ok(())
    }

    fn remove_ours_without_record(&self) -> Result<()> {
        self.remove_owned()?;
        if !self.chained {
            if let Some(bytes) = atomic_file::read_if_exists(&self.standalone_path)? {
                if serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| is_ours(&v)) {
                    atomic_file::remove(&self.standalone_path)?;
                    tracing::info!("removed our config {}", self.standalone_path.display());
                }
            }
            return Ok(());
        }
        if !self.net_dir.is_dir() {
            return Ok(());
        }
        for path in conf_select::candidates(&self.net_dir)? {
            if conf_select::conf_kind(&path) != Some(ConfKind::List) {
                continue;
            }
            let Ok(bytes) = fs::read(&path) else {
                continue;
            };
            let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            if chain::list_has_any_entry(&value) {
                let attrs = atomic_file::attrs_of(&path)?.unwrap_or(FileAttrs::mode(0o644));
                atomic_file::write_atomic(
                    &path,
                    &chain::render(&chain::remove_entries(&value)),
                    attrs,
                )?;
                tracing::info!("removed our entry from {}", path.display());
            }
        }
        Ok(())
    }

    /// The converted `.conf` whose conversion, without our entry, is `remainder`.
    fn converted_from(&self, remainder: &Value) -> Option<&super::undo::FileChange> {
        self.record.files.iter().find(|g| {
            let (None, Before::Saved { contents, .. }) = (&g.after, &g.before) else {
                return false;
            };
            let Ok(conf) = serde_json::from_str::<Value>(contents) else {
                return false;
            };
            chain::conf_to_list(&conf, &self.entry)
                .map(|l| chain::remove_entries(&l) == *remainder)
                .unwrap_or(false)
        })
    }

    /// Every file of the net dir a runtime would read, for messages.
    pub fn describe_dir(&self) -> String {
        let names: Vec<String> = fs::read_dir(&self.net_dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| conf_select::conf_kind(Path::new(n)).is_some())
                    .collect()
            })
            .unwrap_or_default();
        if names.is_empty() {
            "no CNI config files".into()
        } else {
            names.join(", ")
        }
    }

    /// The first plugin type of the list we are chained into (the likely owner), for messages.
    pub fn owner_hint(&self) -> Option<String> {
        let target = self.record.target()?;
        let bytes = fs::read(target).ok()?;
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        v.get("plugins")?
            .as_array()?
            .iter()
            .find(|p| !is_ours(p))?
            .get("type")?
            .as_str()
            .map(String::from)
    }
}

/// `path` was a symbolic link to `link` before we chained into it: when what is there now,
/// without our entry, is what `link` holds, put the link back (so the node's config follows
/// the primary CNI's file again) and say so; otherwise leave the file, with a warning.
fn restore_link(path: &Path, link: &Path, remainder: &Value) -> Result<bool> {
    let resolved = path.parent().unwrap_or(Path::new("/")).join(link);
    let linked = atomic_file::read_if_exists(&resolved)?
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    if linked.as_ref() == Some(remainder) {
        atomic_file::symlink_atomic(path, link)?;
        tracing::info!(
            "restored {} as the link to {}",
            path.display(),
            link.display()
        );
        return Ok(true);
    }
    tracing::warn!(
        "{} was a link to {}, but besides our entry it now differs from that file: left as a \
         file, our entry removed",
        path.display(),
        link.display()
    );
    Ok(false)
}
