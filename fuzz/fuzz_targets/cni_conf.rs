//! CNI stdin (the network config, prevResult included) as the plugin reads it, then what the
//! plugin does with it short of the kernel and the Kubernetes API: the runtime's pod
//! annotations → mesh decision → plan → netlink encoding, and the passthrough result.
#![no_main]

use libfuzzer_sys::fuzz_target;

use cni_shim::cni::{conf, result};
use redirect_istio::mesh::{self, Decision, MeshDefaults};
use redirect_istio::pod::PodInfo;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let version = conf::requested_version(data);
    let Ok(c) = conf::parse(data) else {
        return;
    };
    let _ = result::passthrough(&c.cni_version, c.prev_result.as_ref());
    let _ = cni_shim::cni::CniError::new(1, "x", "y").to_json(&version);
    let Some(annotations) = &c.pod_annotations else {
        return;
    };
    let defaults = MeshDefaults {
        proxy_uid: c.proxy_uid,
        proxy_gid: c.proxy_gid,
        dns_capture: c.dns_capture,
        dual_stack: c.dual_stack,
        drop_invalid: c.drop_invalid,
        bypass_uids: c.bypass_uids.clone(),
        bypass_gids: c.bypass_gids.clone(),
    };
    let pod = PodInfo {
        namespace: "ns".into(),
        name: "pod".into(),
        annotations: annotations.clone(),
        ..PodInfo::default()
    };
    if let Ok(Decision::Capture { config, .. }) = mesh::decide(&pod, &defaults) {
        common::exercise(&config);
    }
});
