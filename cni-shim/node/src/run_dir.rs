//! The run directory the agent shares with the plugin (`CNI_AGENT_RUN_DIR`, the same path on
//! the host): the plugin's kubeconfig, the agent's status file, the events socket and the
//! install record live there, so whoever may write into it can point the plugin's pod reads at
//! a server of their choosing, make STATUS lie, or make an uninstall remove other files. The
//! agent starts only on a directory that root owns and that only its owner may write; it
//! creates it so when missing.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result};

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

/// [`own_dir`] for the run directory, its refusal as the agent's error.
pub fn ensure(dir: &Path) -> Result<()> {
    own_dir(dir).map_err(|e| match e {
        NotOwn::Io(what, e) => Error::io(what, dir, e),
        NotOwn::Unsafe(what) => Error::UnsafeRunDir {
            path: dir.to_path_buf(),
            what,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_directory_its_owner_alone_may_write_is_taken() {
        let base = tempfile_dir();
        let run = base.join("run");
        ensure(&run).unwrap();
        assert_eq!(
            fs::metadata(&run).unwrap().permissions().mode() & 0o777,
            0o755
        );
        for mode in [0o777, 0o775, 0o757, 0o1777] {
            fs::set_permissions(&run, fs::Permissions::from_mode(mode)).unwrap();
            let e = ensure(&run).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{mode:04o}")) && e.contains("chmod 0755"),
                "{e}"
            );
        }
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        ensure(&run).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&run, &link).unwrap();
        assert!(ensure(&link)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        let file = base.join("file");
        fs::write(&file, "").unwrap();
        assert!(ensure(&file).is_err());
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_parent_others_may_write_is_refused_unless_sticky() {
        let base = tempfile_dir().join("parents");
        let shared = base.join("shared");
        fs::create_dir_all(&shared).unwrap();
        let run = shared.join("run");
        for (mode, refused) in [
            (0o777, true),
            (0o775, true),
            (0o1777, false),
            (0o755, false),
        ] {
            fs::set_permissions(&shared, fs::Permissions::from_mode(mode)).unwrap();
            let got = ensure(&run);
            assert_eq!(got.is_err(), refused, "mode {mode:o}: {got:?}");
            if let Err(e) = got {
                let e = e.to_string();
                assert!(
                    e.contains(shared.to_str().unwrap()) && e.contains("not sticky"),
                    "{e}"
                );
            }
        }
        // A link to a folder whose parent others may write: refused on the path it leads to.
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let link = base.join("link");
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        let e = ensure(&link.join("run")).unwrap_err().to_string();
        assert!(e.contains(shared.to_str().unwrap()), "{e}");
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_dir_all(&base).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rdc-run-dir-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
