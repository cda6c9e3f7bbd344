//! CNI stdin (the network config, prevResult included) as the plugin reads it, then what the
//! plugin does with it short of the kernel and the Kubernetes API: the runtime's pod
//! annotations → mesh decision → plan → netlink encoding, and the passthrough result.
#![no_main]

use libfuzzer_sys::fuzz_target;

use cni_plugin::cni::{conf, result};
use redirect_core::mesh::{self, Decision, MeshDefaults};
use redirect_core::mesh::PodInfo;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let version = conf::requested_version(data);
    let Ok(c) = conf::parse(data) else {
        return;
    };
    let _ = result::passthrough(&c.cni_version, c.prev_result.as_ref());
    let _ = cni_plugin::cni::CniError::new(1, "x", "y").to_json(&version);
    let Some(annotations) = &c.pod_annotations else {
        return;
    };
    let defaults: &MeshDefaults = &c.mesh;
    let pod = PodInfo {
        namespace: "ns".into(),
        name: "pod".into(),
        annotations: annotations.clone(),
        ..PodInfo::default()
    };
    if let Ok(Decision::Capture { config, .. }) = mesh::decide(&pod, defaults) {
        common::exercise(&config);
    }
});
