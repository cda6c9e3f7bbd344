//! The run directory the agent shares with the plugin (`CNI_AGENT_RUN_DIR`, the same path on
//! the host): the plugin's kubeconfig, the agent's status file, the events socket and the
//! install record live there, so whoever may write into it can point the plugin's pod reads at
//! a server of their choosing, make STATUS lie, or make an uninstall remove other files. The
//! agent starts only on a directory that root owns and that only its owner may write
//! (`cni_protocol::folder`); it creates it so when missing.

use std::path::Path;

pub use cni_protocol::folder::{own_dir, parents_safe, NotOwn};

use crate::error::{Error, Result};

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
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_directory_its_owner_alone_may_write_is_taken() {
        let base = tempfile_dir("owner");
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
        let base = tempfile_dir("parents");
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

    /// A folder of the test's own: the tests run in parallel and each removes its folder.
    fn tempfile_dir(test: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rdc-run-dir-{}-{test}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
