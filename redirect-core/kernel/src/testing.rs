//! Handles on a test's namespace, opened by its path (`/run/netns/NAME`): our table's, the
//! kernel backend's and the routes'. Each panics when it cannot be opened, as a test wants.

use std::path::Path;

use crate::backend::Live;
use crate::netns::Netns;
use crate::nft::Nft;
use crate::routes::Routes;

/// Our table's handle in the namespace at `path`.
pub fn nft_in(path: &Path) -> Nft {
    Nft::open_in(&open(path))
        .unwrap_or_else(|e| panic!("an nf_tables handle in {}: {e}", path.display()))
}

/// The kernel backend (our table, the routes, the addresses) of the namespace at `path`.
pub fn live_in(path: &Path) -> Live {
    Live::open_in(&open(path))
        .unwrap_or_else(|e| panic!("a kernel backend in {}: {e}", path.display()))
}

/// The routes handle of the namespace at `path`.
pub fn routes_in(path: &Path) -> Routes {
    Routes::open_in(&open(path))
        .unwrap_or_else(|e| panic!("a routing handle in {}: {e}", path.display()))
}

fn open(path: &Path) -> Netns {
    Netns::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}
