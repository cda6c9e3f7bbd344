//! CNI_ARGS (`K=V;K=V`) as the plugin parses it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let _ = cni_plugin::cni::args::parse(&s);
});
