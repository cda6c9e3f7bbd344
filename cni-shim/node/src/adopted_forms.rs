//! The form of Istio's rules each pod (sidecar or ambient) held when the agent adopted it, kept on the node
//! (`<CNI_AGENT_RUN_DIR>/adopted/<pod UID>`, holding `iptables-nft` or `nftables`), so that a
//! hand-back writes each pod back in the form the node used before (`HAND_BACK_FORM=as-adopted`,
//! the default). Written once ours hold, read at the hand-back, removed once the pod is handed
//! back or gone. The run directory is one only root may write (`run_dir::ensure`), and a name
//! that is not a pod UID is never made into a path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redirect_core::foreign::{ForeignRules, Variant};
use redirect_core::IstioForm;

use crate::atomic_file::{self, FileAttrs};
use crate::error::Result;

/// The folder under the run directory.
const DIR: &str = "adopted";

/// Which form a hand-back writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandBackForm {
    /// Each pod in the form it held before it was adopted; a pod never adopted in the form
    /// most adopted pods of the node held, else Istio's default (iptables-nft).
    AsAdopted,
    /// Every pod in this form.
    Fixed(IstioForm),
}

impl HandBackForm {
    /// `as-adopted`, or the form's word.
    pub fn word(self) -> &'static str {
        match self {
            HandBackForm::AsAdopted => "as-adopted",
            HandBackForm::Fixed(f) => f.word(),
        }
    }
}

/// A pod UID as the API gives it (a UUID): nothing else becomes a file name.
fn file_of(run_dir: &Path, uid: &str) -> Option<PathBuf> {
    let uid_like = !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    uid_like.then(|| run_dir.join(DIR).join(uid))
}

fn form_of(word: &str) -> Option<IstioForm> {
    match word.trim() {
        "iptables-nft" => Some(IstioForm::IptablesNft),
        "nftables" => Some(IstioForm::Nftables),
        _ => None,
    }
}

/// Istio's form of what a namespace held (`nftables`, `iptables-nft`, `iptables-legacy`): the
/// word recorded, and the adoption metric's `form` label.
pub fn form(held: &ForeignRules) -> &'static str {
    if !held.nft_tables.is_empty() {
        "nftables"
    } else if held.chains.iter().any(|c| c.variant == Variant::Nft) {
        "iptables-nft"
    } else {
        "iptables-legacy"
    }
}

/// Records that pod `uid` held Istio's rules in `form` (`iptables-nft`, `nftables`; another
/// form, which cannot be handed back to, is not recorded).
pub fn record(run_dir: &Path, uid: &str, form: &str) -> Result<()> {
    let (Some(path), Some(_)) = (file_of(run_dir, uid), form_of(form)) else {
        return Ok(());
    };
    crate::run_dir::ensure(&run_dir.join(DIR))?;
    atomic_file::write_atomic(&path, form.as_bytes(), FileAttrs::mode(0o644))
}

/// Forgets pod `uid` (handed back, or gone). Best effort, a failure logged: a record left
/// behind only names a form for a UID no pod has.
pub fn forget(run_dir: &Path, uid: &str) {
    let Some(path) = file_of(run_dir, uid) else {
        return;
    };
    if let Err(e) = atomic_file::remove(&path) {
        tracing::warn!("{}", redirect_program::errors::chain(&e));
    }
}

/// Keeps the records of the pods `keep` says yes to, and forgets the others.
pub fn retain(run_dir: &Path, keep: impl Fn(&str) -> bool) {
    for uid in all(run_dir).keys().filter(|u| !keep(u)) {
        forget(run_dir, uid);
    }
}

/// Every recorded pod's form, by UID (none when nothing was recorded).
pub fn all(run_dir: &Path) -> BTreeMap<String, IstioForm> {
    let Ok(entries) = std::fs::read_dir(run_dir.join(DIR)) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    for e in entries.flatten() {
        let uid = e.file_name().to_string_lossy().into_owned();
        let Some(path) = file_of(run_dir, &uid) else {
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(form) = form_of(&text) {
            out.insert(uid, form);
        }
    }
    out
}

/// The form pod `uid` is handed back in under `wanted`, with `records` ([`all`]).
pub fn form_for(
    wanted: HandBackForm,
    records: &BTreeMap<String, IstioForm>,
    uid: &str,
) -> IstioForm {
    match wanted {
        HandBackForm::Fixed(f) => f,
        HandBackForm::AsAdopted => records
            .get(uid)
            .copied()
            .unwrap_or_else(|| node_form(records)),
    }
}

/// The form most recorded pods held; Istio's default when none was recorded (ties too).
fn node_form(records: &BTreeMap<String, IstioForm>) -> IstioForm {
    let nft = records
        .values()
        .filter(|f| **f == IstioForm::Nftables)
        .count();
    match nft * 2 > records.len() {
        true => IstioForm::Nftables,
        false => IstioForm::IptablesNft,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "6f1c2d3e-0000-4a5b-8c9d-000000000001";
    const B: &str = "6f1c2d3e-0000-4a5b-8c9d-000000000002";
    const C: &str = "6f1c2d3e-0000-4a5b-8c9d-000000000003";

    #[test]
    fn each_pod_goes_back_as_it_was_and_a_new_one_as_most_were() {
        let run = tempfile::tempdir().unwrap();
        record(run.path(), A, "nftables").unwrap();
        record(run.path(), B, "nftables").unwrap();
        record(run.path(), C, "iptables-nft").unwrap();
        // A form that cannot be handed back to, and a name that is not a UID: not recorded.
        record(
            run.path(),
            "6f1c2d3e-0000-4a5b-8c9d-000000000004",
            "iptables-legacy",
        )
        .unwrap();
        record(run.path(), "../../etc/passwd", "nftables").unwrap();
        let records = all(run.path());
        assert_eq!(records.len(), 3, "{records:?}");
        let auto = HandBackForm::AsAdopted;
        assert_eq!(form_for(auto, &records, A), IstioForm::Nftables);
        assert_eq!(form_for(auto, &records, C), IstioForm::IptablesNft);
        assert_eq!(form_for(auto, &records, "new"), IstioForm::Nftables);
        let fixed = HandBackForm::Fixed(IstioForm::IptablesNft);
        assert_eq!(form_for(fixed, &records, A), IstioForm::IptablesNft);

        // The pods the watch no longer lists are forgotten.
        retain(run.path(), |uid| uid != A && uid != B);
        let records = all(run.path());
        assert_eq!(records.keys().collect::<Vec<_>>(), [C]);
        assert_eq!(form_for(auto, &records, "new"), IstioForm::IptablesNft);
        assert_eq!(form_for(auto, &BTreeMap::new(), A), IstioForm::IptablesNft);
        assert!(!run.path().join("etc").exists());
    }
}
