//! The run directory the agent shares with the plugin (`CNI_AGENT_RUN_DIR`, the same path on
//! the host): the plugin's kubeconfig, the agent's status file, the events socket and the
//! install record live there, so whoever may write into it can point the plugin's pod reads at
//! a server of their choosing, make STATUS lie, or make an uninstall remove other files. The
//! agent starts only on a directory that root owns and that only its owner may write
//! (`cni_protocol::folder`); it creates it so when missing. The agent's sockets there
//! ([`bind_socket`]) are root's alone from the instant they exist.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// A socket of the agent's, `run_dir/name`, bound by `bind` and root's alone (mode 0600)
/// before anyone can reach it, whatever the umask: bound in a folder of mode 0700, made 0600
/// there, then renamed into place. The rename replaces what a previous agent left at the path
/// (its socket; or a link, a file, a FIFO someone put there: replaced, never followed, and
/// said); a directory there is refused.
pub fn bind_socket<T>(
    run_dir: &Path,
    name: &str,
    bind: impl FnOnce(&Path) -> std::io::Result<T>,
) -> std::io::Result<(T, PathBuf)> {
    let path = run_dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => {
            return Err(std::io::Error::other(format!(
                "{}: a directory, not the agent's socket: remove it",
                path.display()
            )))
        }
        Ok(m) if !m.file_type().is_socket() => tracing::warn!(
            "{}: not a socket ({:?}); replaced by the agent's, not followed",
            path.display(),
            m.file_type()
        ),
        _ => {}
    }
    let private = run_dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let staged = private.join(name);
    let bound = bind(&staged).and_then(|sock| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, &path)?;
        Ok(sock)
    });
    let _ = std::fs::remove_dir_all(&private);
    Ok((bound?, path))
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

    #[test]
    fn a_socket_takes_the_place_of_what_was_left_there_without_following_it() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let run = tempfile_dir("sockets");
        let victim = run.join("victim");
        fs::write(&victim, "kept").unwrap();
        let path = run.join("x.sock");
        for left in ["link", "file", "socket"] {
            match left {
                "link" => std::os::unix::fs::symlink(&victim, &path).unwrap(),
                "file" => {
                    fs::remove_file(&path).unwrap();
                    fs::write(&path, "old").unwrap();
                }
                // The last one's, as an agent killed before leaves it.
                _ => {}
            }
            let (sock, got) = bind_socket(&run, "x.sock", |p| {
                std::os::unix::net::UnixListener::bind(p)
            })
            .unwrap();
            assert_eq!(got, path);
            let m = fs::symlink_metadata(&path).unwrap();
            assert!(m.file_type().is_socket(), "{left}: {:?}", m.file_type());
            assert_eq!(m.mode() & 0o7777, 0o600, "{left}");
            assert_eq!(fs::read_to_string(&victim).unwrap(), "kept", "{left}");
            drop(sock);
        }
        // Nothing staged is left behind.
        let names: Vec<String> = fs::read_dir(&run)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        let e = bind_socket(&run, "x.sock", |p| {
            std::os::unix::net::UnixListener::bind(p)
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("a directory") && e.contains("remove it"), "{e}");
        fs::remove_dir_all(&run).unwrap();
    }

    /// A folder of the test's own: the tests run in parallel and each removes its folder.
    fn tempfile_dir(test: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rdc-run-dir-{}-{test}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
