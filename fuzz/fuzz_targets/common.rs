//! Shared by the targets: a config → plan → netlink encoding → renderers, none of which may
//! panic. Group names resolve through a deterministic fake (no NSS look-ups while fuzzing).

#![allow(dead_code)]

use redirect_core::{render, CaptureConfig};
use redirect_kernel::nft;

/// A group database where short names exist (so planning gets past name resolution).
pub fn fake_gid(name: &str) -> Option<u32> {
    if name.is_empty() || name.len() > 16 {
        return None;
    }
    Some(
        name.bytes()
            .fold(1000u32, |a, b| a.wrapping_mul(31).wrapping_add(b as u32)),
    )
}

/// Plan a config and, if it is accepted, encode and render the ruleset.
pub fn exercise(cfg: &CaptureConfig) {
    let Ok(rs) = cfg.clone().validated().and_then(|v| v.plan(&fake_gid)) else {
        return;
    };
    let enc = nft::testing::encode_running(&rs);
    let _ = enc.bytes();
    let _ = enc.messages();
    let _ = render::nft_script(&rs);
    let _ = render::iptables_restore_all(&rs);
    let _ = nft::compare(&rs, Some(&nft::expected(&rs)));
}
