//! A pod as an operator or the API hands it over (`kubectl get pod -o json`, an annotations
//! object, or the Downward API's `key="value"` lines, through `pod::pod_from_text`; the API's
//! pod JSON through `kube::pod_info_from_json`) → the mesh decision → plan → netlink encoding.
//! The first input byte picks the plugin-level defaults.
#![no_main]

use libfuzzer_sys::fuzz_target;

use redirect_core::mesh::{self, Decision, MeshDefaults};

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    // The same text as the Kubernetes API's pod JSON (what the plugin fetches).
    if let Ok(pod) = cni_plugin::kube::pod_info_from_json(text) {
        decide_and_plan(&pod, flags);
    }
    if let Ok(pod) = redirect_core::mesh::pod_from_text(text) {
        decide_and_plan(&pod, flags);
    }
});

fn decide_and_plan(pod: &redirect_core::mesh::PodInfo, flags: u8) {
    let defaults = MeshDefaults {
        proxy_uid: (flags & 1 != 0).then_some(1337),
        proxy_gid: (flags & 2 != 0).then_some(1337),
        dns_capture: flags & 4 != 0,
        dual_stack: flags & 8 != 0,
        drop_invalid: flags & 16 != 0,
        bypass_uids: if flags & 32 != 0 {
            vec![0, 1000]
        } else {
            vec![]
        },
        bypass_gids: if flags & 64 != 0 { vec![0] } else { vec![] },
    };
    if let Ok(Decision::Capture {
        config, dual_stack, ..
    }) = mesh::decide(pod, &defaults)
    {
        let cfg = *config;
        common::exercise(&cfg);
        // The plugin turns IPv6 on from the pod's addresses when dual-stack says so.
        if dual_stack || flags & 128 != 0 {
            common::exercise(&cfg.with_ipv6(true));
        }
    }
}
