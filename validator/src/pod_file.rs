//! `--annotations FILE` (inspect, explain): the pod decided as redirect-cni decides it (the same
//! redirect-istio code), Istio's flags standing in for the plugin's config defaults.

use std::path::Path;

use redirect_core::cli::flags::Resolved;
use redirect_core::cli::settings::Settings;
use redirect_core::mesh::{self, Decision, MeshDefaults};

use crate::{args, Error};

/// The decision for the pod of `--annotations FILE`, when given.
pub fn from_args(r: &Resolved, settings: &Settings) -> Result<Option<Decision>, Error> {
    args::get(&r.matches, "annotations")
        .map(|file| decision(Path::new(file), settings))
        .transpose()
}

/// Whether IPv6 follows the pod's IPv6 address: the pod's annotation, else Istio's flag.
pub fn dual_stack(decision: Option<&Decision>, settings: &Settings) -> bool {
    match decision {
        Some(Decision::Capture { dual_stack, .. }) => *dual_stack,
        _ => settings.dual_stack,
    }
}

/// The file's pod (`kubectl get pod -o json`, a JSON object of annotations, or a Downward API
/// annotations file), decided. An error names the file or the annotation.
pub fn decision(file: &Path, settings: &Settings) -> Result<Decision, Error> {
    let bad = |reason: String| Error::AnnotationsFile {
        file: file.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let pod = mesh::pod_from_text(&text).map_err(bad)?;
    let defaults = MeshDefaults {
        proxy_uid: settings.config.proxy_uids.first().copied(),
        proxy_gid: settings.config.proxy_gids.first().copied(),
        dns_capture: settings.redirect_dns,
        dual_stack: settings.dual_stack,
        drop_invalid: settings.config.drop_invalid,
        ..MeshDefaults::default()
    };
    let decision = mesh::decide(&pod, &defaults).map_err(Error::Annotation)?;
    if let Decision::NeedSpec(why) = decision {
        return Err(Error::AnnotationsNeedPod(why));
    }
    Ok(decision)
}
