//! `CaptureConfig` JSON (`--config`, the validator, the benches) → plan → netlink encoding and
//! the nft / iptables-restore renderers.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = redirect_core::CaptureConfig::from_json(text) else {
        return;
    };
    common::exercise(&cfg);
});
