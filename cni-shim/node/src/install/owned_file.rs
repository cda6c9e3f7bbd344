//! Istio's owned config file (`ISTIO_OWNED_CNI_CONFIG`): in chained mode the installer leaves
//! the primary CNI's file alone and writes its own list, named to sort first
//! (`02-istio-cni.conflist`), holding the primary's plugins and our entry. When the primary
//! CNI rewrites its file (Cilium's `cni.exclusive`, AKS), only our copy follows it; nothing of
//! ours is in a file another installer owns.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chain;
use super::conf_select::{self, ConfKind};

/// The owned file's content: the primary's list (a `.conf` made a list) without any capture
/// entry (ours or Istio's, should the primary hold one from an earlier install), with ours
/// chained in.
pub fn content(primary: &Path, primary_bytes: &[u8], entry: &Value) -> Result<Vec<u8>, String> {
    let kind = conf_select::conf_kind(primary)
        .ok_or("runtimes read only .conf, .conflist and .json files")?;
    let value = conf_select::parse_conf(kind, primary_bytes)?;
    let list = match kind {
        ConfKind::List => {
            let bare = chain::without_istio(&chain::remove_entries(&value));
            chain::chain_into_list(&bare, entry)?
        }
        ConfKind::Single => chain::conf_to_list(&value, entry)?,
    };
    Ok(chain::render(&list))
}

/// The valid config file of another owner that sorts before `owned`, if any: the runtime
/// takes the first file that parses, so it would read that one and never ours.
pub fn shadowed_by(net_dir: &Path, owned: &Path) -> crate::error::Result<Option<PathBuf>> {
    let name = |p: &Path| p.file_name().map(|n| n.as_encoded_bytes().to_vec());
    for path in conf_select::candidates(net_dir)? {
        if path == owned || name(&path) >= name(owned) {
            return Ok(None);
        }
        let valid = conf_select::conf_kind(&path).is_some_and(|kind| {
            std::fs::read(&path).is_ok_and(|b| conf_select::parse_conf(kind, &b).is_ok())
        });
        if valid {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_primarys_plugins_then_ours_without_other_capture_entries() {
        let entry = json!({"type": "redirect-cni", "name": "istio-cni"});
        let list = json!({"cniVersion": "1.0.0", "name": "cilium", "plugins": [
            {"type": "cilium-cni"}, {"type": "istio-cni"}, {"type": "portmap"}]});
        let got: Value = serde_json::from_slice(
            &content(
                Path::new("05-cilium.conflist"),
                &chain::render(&list),
                &entry,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"cniVersion": "1.0.0", "name": "cilium", "plugins": [
                {"type": "cilium-cni"}, {"type": "portmap"}, entry]})
        );
        let conf = json!({"cniVersion": "0.3.1", "name": "flannel", "type": "flannel"});
        let got: Value = serde_json::from_slice(
            &content(Path::new("10-flannel.conf"), &chain::render(&conf), &entry).unwrap(),
        )
        .unwrap();
        assert_eq!(got["plugins"][0]["type"], "flannel");
        assert_eq!(got["plugins"][1], entry);
        assert!(content(Path::new("10-x.conflist"), b"{}", &entry).is_err());
    }
}
