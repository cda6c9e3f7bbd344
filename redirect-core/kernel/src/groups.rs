//! The host's group database, for the plan's owner groups given by name.

use redirect_model::GroupResolver;

/// Resolves names with the system's group database (`getgrnam`).
pub struct SystemGroups;

impl GroupResolver for SystemGroups {
    fn gid_of(&self, name: &str) -> Option<u32> {
        nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw())
    }
}
