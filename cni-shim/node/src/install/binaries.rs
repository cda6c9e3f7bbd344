//! The plugin binary in the host's CNI bin directories: copied atomically (so a runtime never
//! executes half a file, and a running copy is never overwritten in place), mode 0755, skipped
//! when already identical; removed on uninstall only while it is still our copy.

use std::fs::{self, File, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::atomic_file::{self, FileAttrs};
use crate::error::{Error, Result};
use crate::PLUGIN_TYPE;

pub(crate) const BINARY_MODE: u32 = 0o755;

/// What `install_binary` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryInstall {
    /// Copied: it was missing or differed.
    Copied,
    /// Already identical (its mode fixed if needed).
    AlreadyPresent,
}

/// `<dir>/redirect-cni`.
pub fn binary_path(dir: &Path) -> PathBuf {
    dir.join(PLUGIN_TYPE)
}

/// Copy `src` to `<dir>/redirect-cni` unless an identical file is there.
pub fn install_binary(src: &Path, dir: &Path) -> Result<BinaryInstall> {
    let dst = binary_path(dir);
    if atomic_file::same_contents(src, &dst)? {
        if atomic_file::attrs_of(&dst)?.map(|a| a.mode) != Some(BINARY_MODE) {
            fs::set_permissions(&dst, Permissions::from_mode(BINARY_MODE))
                .map_err(|e| Error::io("chmod", &dst, e))?;
        }
        return Ok(BinaryInstall::AlreadyPresent);
    }
    if !dir.is_dir() {
        return Err(Error::io(
            "copy the plugin into",
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such directory; mount the host's CNI bin directory there (--cni-bin-dir)",
            ),
        ));
    }
    let mut f = File::open(src).map_err(|e| Error::io("open", src, e))?;
    atomic_file::write_atomic_from(&dst, &mut f, FileAttrs::mode(BINARY_MODE))?;
    Ok(BinaryInstall::Copied)
}

/// Remove `<dir>/redirect-cni` if it is still identical to `src`; `Ok(false)` if it was not
/// there or is another build (e.g. a newer installer's), which is left alone.
pub fn remove_binary(src: &Path, dir: &Path) -> Result<bool> {
    let dst = binary_path(dir);
    if !atomic_file::same_contents(src, &dst)? {
        return Ok(false);
    }
    atomic_file::remove(&dst)
}
