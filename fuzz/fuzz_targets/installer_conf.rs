//! CNI config files as `redirect-cni install` reads them (`.conf`/`.json` and `.conflist`),
//! then the chained-mode transformations with our plugin entry and the rendering.
#![no_main]

use libfuzzer_sys::fuzz_target;

use cni_node::install::chain;
use cni_node::install::conf_select::{parse_conf, ConfKind};
use cni_node::plugin_entry::plugin_entry;
use cni_node::Settings;

fuzz_target!(|data: &[u8]| {
    let entry = plugin_entry(&Settings::default());
    for kind in [ConfKind::Single, ConfKind::List] {
        let Ok(v) = parse_conf(kind, data) else {
            continue;
        };
        let out = match kind {
            ConfKind::Single => chain::conf_to_list(&v, &entry),
            ConfKind::List => chain::chain_into_list(&v, &entry),
        };
        if let Ok(list) = out {
            let _ = chain::list_has_entry(&list, &entry);
            let removed = chain::remove_entries(&list);
            let _ = chain::list_has_any_entry(&removed);
            let _ = chain::render(&list);
            let _ = chain::render(&removed);
        }
        let _ = chain::remove_entries(&v);
        let _ = chain::render(&v);
    }
});
