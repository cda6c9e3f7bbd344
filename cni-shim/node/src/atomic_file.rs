//! Files replaced atomically: a temporary file in the same directory (a name no CNI runtime
//! reads: hidden, no `.conf`/`.conflist`/`.json` suffix), written, given its mode (and owner),
//! fsynced, renamed over the target, then the directory fsynced. Readers see the old or the new
//! file, never a part.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// What a temporary file's name contains; events about such files are our own.
pub const TEMP_MARKER: &str = ".redirect-cni-tmp";

/// How a file is written: its mode and, when known, its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileAttrs {
    /// The permission bits, set whatever the umask.
    pub mode: u32,
    /// `(uid, gid)`; `None`: the writer's. Set on a best-effort basis.
    pub owner: Option<(u32, u32)>,
}

impl FileAttrs {
    /// `mode`, with the writer as the owner.
    pub fn mode(mode: u32) -> Self {
        FileAttrs { mode, owner: None }
    }
}

/// Write `contents` to `path` atomically with `attrs`.
pub fn write_atomic(path: &Path, contents: &[u8], attrs: FileAttrs) -> Result<()> {
    write_atomic_from(path, &mut &contents[..], attrs)
}

/// Write what `reader` yields to `path` atomically with `attrs`.
pub fn write_atomic_from(path: &Path, reader: &mut dyn Read, attrs: FileAttrs) -> Result<()> {
    let dir = parent(path);
    let tmp = temp_path(path);
    let result = (|| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(attrs.mode)
            .open(&tmp)?;
        // The umask may have narrowed the mode given to open.
        f.set_permissions(Permissions::from_mode(attrs.mode))?;
        if let Some((uid, gid)) = attrs.owner {
            // Best effort: keeping the owner matters less than writing the file.
            let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
        }
        io::copy(reader, &mut f)?;
        f.flush()?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        sync_dir(&dir);
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("write", path, e));
    }
    Ok(())
}

/// Make `path` a symbolic link to `target`, atomically (a new link renamed over it): a
/// runtime sees the old file or the link, never no config.
pub fn symlink_atomic(path: &Path, target: &Path) -> Result<()> {
    let tmp = temp_path(path);
    let result = std::os::unix::fs::symlink(target, &tmp).and_then(|()| fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(Error::io("link", path, e));
    }
    sync_dir(&parent(path));
    Ok(())
}

/// Where `path` points when it is a symbolic link (as written, relative or not); `None` for a
/// file, or when it does not exist.
pub fn link_of(path: &Path) -> Option<PathBuf> {
    fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink())
        .and_then(|_| fs::read_link(path).ok())
}

/// Remove `path` (and fsync its directory); `Ok(false)` if it did not exist.
pub fn remove(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(&parent(path));
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", path, e)),
    }
}

/// The file's bytes, or `None` if it does not exist.
pub fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

/// The file's mode bits and owner, or `None` if it does not exist.
pub fn attrs_of(path: &Path) -> Result<Option<FileAttrs>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(FileAttrs {
            mode: m.mode() & 0o7777,
            owner: Some((m.uid(), m.gid())),
        })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("stat", path, e)),
    }
}

/// Whether two files hold the same bytes (`Ok(false)` if either is missing).
pub fn same_contents(a: &Path, b: &Path) -> Result<bool> {
    let open = |p: &Path| match File::open(p) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("open", p, e)),
    };
    let (Some(mut fa), Some(mut fb)) = (open(a)?, open(b)?) else {
        return Ok(false);
    };
    let len = |f: &File, p: &Path| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io("stat", p, e))
    };
    if len(&fa, a)? != len(&fb, b)? {
        return Ok(false);
    }
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(|e| Error::io("read", a, e))?;
        let nb = read_full(&mut fb, &mut bb).map_err(|e| Error::io("read", b, e))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    parent(path).join(format!(".{name}{TEMP_MARKER}.{}.{n}", std::process::id()))
}

fn sync_dir(dir: &Path) {
    // Makes the rename durable; a failure here leaves a correct file, so it is not an error.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}
