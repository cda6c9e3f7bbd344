//! Whether a folder is the agent's alone: the run directory it shares with the plugin, and
//! ztunnel's socket folder. Whoever may write into them could point the plugin's pod reads at a
//! server of their choosing, make STATUS lie, or put a socket in the agent's place and receive
//! every pod's namespace.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Mode bits that let someone other than the owner change what is in the directory.
const WRITABLE_BY_OTHERS: u32 = 0o022;
/// The sticky bit: only an entry's owner may rename or remove it.
const STICKY: u32 = 0o1000;

/// Why a directory is not the agent's alone.
#[derive(Debug)]
pub enum NotOwn {
    /// Creating or inspecting it failed: the step, and the error.
    Io(&'static str, std::io::Error),
    /// It exists, but others could change what is in it: what it is.
    Unsafe(String),
}

/// Creates `dir` (mode 0755) when missing, then refuses it unless it is a directory (not a
/// link to one), owned by root (or the agent's own user), and writable by its owner alone;
/// and its parents likewise (see [`parents_safe`]). Also ztunnel's socket folder: whoever may
/// write there can receive every pod's namespace.
pub fn own_dir(dir: &Path) -> std::result::Result<(), NotOwn> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| NotOwn::Io("create", e))?;
    let meta = fs::symlink_metadata(dir).map_err(|e| NotOwn::Io("inspect", e))?;
    if meta.file_type().is_symlink() {
        return Err(NotOwn::Unsafe("a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(NotOwn::Unsafe("not a directory".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(NotOwn::Unsafe(format!("owned by UID {}", meta.uid())));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & WRITABLE_BY_OTHERS != 0 {
        return Err(NotOwn::Unsafe(format!(
            "writable by its group or others (mode {mode:04o})"
        )));
    }
    parents_safe(dir)
}

/// Whoever may rename an entry of a parent of `dir` may put a folder of their own in its
/// place: every directory above it, on the path as given and on the path its links lead to,
/// must be owned by root (or the agent's user) and not writable by group or others unless
/// sticky (as `/tmp` is: there only an entry's owner may rename it, and the entry below is
/// checked to be root's). A link on the way is followed when root (or the agent) owns it.
pub fn parents_safe(dir: &Path) -> std::result::Result<(), NotOwn> {
    let me = nix::unistd::geteuid().as_raw();
    let given = std::path::absolute(dir).map_err(|e| NotOwn::Io("inspect", e))?;
    let real = fs::canonicalize(dir).map_err(|e| NotOwn::Io("inspect", e))?;
    for path in [&given, &real] {
        for parent in path.ancestors().skip(1) {
            let meta = fs::symlink_metadata(parent).map_err(|e| NotOwn::Io("inspect", e))?;
            let owner = meta.uid();
            if owner != 0 && owner != me {
                return Err(NotOwn::Unsafe(format!(
                    "below {}, which UID {owner} owns",
                    parent.display()
                )));
            }
            if meta.file_type().is_symlink() {
                continue;
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & WRITABLE_BY_OTHERS != 0 && mode & STICKY == 0 {
                return Err(NotOwn::Unsafe(format!(
                    "below {}, which is writable by its group or others and not sticky \
                     (mode {mode:04o})",
                    parent.display()
                )));
            }
        }
    }
    Ok(())
}
