//! The checks before a write is acknowledged: the disk floor and the database file's identity;
//! and, before the file is opened, that its side files are usable ([`check_side_files`]).
//!
//! Contract: [`FileGuard::check_disk`] refuses (`DiskFull`) when the free space of the
//! database's filesystem (`f_bavail × f_frsize`, what an unprivileged process may use) is below
//! the floor; a filesystem whose free space cannot be read is not refused (and
//! [`FileGuard::free_bytes`] is `None`, visible in metrics). [`FileGuard::check_file`] refuses
//! (`FileLost`) when the path no longer names the file opened (same device and inode): deleted,
//! moved away or replaced. SQLite would keep writing to the unlinked inode, and every
//! acknowledged hit would vanish at the next start.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::StoreError;

/// Before SQLite opens `path`: its directory must take new files (SQLite creates the `-wal`
/// and `-shm` files there) and the file, its `-wal` and its `-shm`, where they exist, must be
/// regular files this process can read and write. SQLite maps the `-shm` file into memory; one it can only read is mapped
/// read-only, and the process then dies of SIGBUS at its first access beyond the file's end,
/// with no log line. This turns each of those into a clear startup error instead.
pub(super) fn check_side_files(path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    let unusable = |what: &Path, why: String| {
        StoreError::Unusable(format!(
            "{} {why}: tally needs read-write access to the database file, its -wal and -shm \
             files and their directory (check ownership, permissions, immutable flags and \
             free space)",
            what.display()
        ))
    };
    // Creating (and removing) a file is the only check that holds for every user, root
    // included, and every kind of read-only mount.
    let probe = dir.join(format!(".tally-write-check-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| unusable(&dir, format!("does not take new files ({e})")))?;
    let _ = std::fs::remove_file(&probe);
    for suffix in ["", "-wal", "-shm"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        let side = PathBuf::from(side);
        let meta = match std::fs::symlink_metadata(&side) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(unusable(&side, format!("cannot be examined ({e})"))),
        };
        if !meta.file_type().is_file() {
            return Err(unusable(&side, "is not a regular file".to_owned()));
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&side)
            .map_err(|e| unusable(&side, format!("cannot be opened for writing ({e})")))?;
    }
    Ok(())
}

pub(super) struct FileGuard {
    path: PathBuf,
    /// The directory holding the file (statvfs still works on it when the file is gone).
    dir: PathBuf,
    /// (device, inode) of the file when it was opened.
    identity: (u64, u64),
    /// Minimum free bytes for a commit; 0 = no floor.
    floor: u64,
    /// The `-shm` file: its path, (device, inode) and size when the store opened it.
    shm: Option<(PathBuf, (u64, u64), u64)>,
}

impl FileGuard {
    /// Remember the identity of the (already opened) file at `path`.
    pub(super) fn new(path: &Path, floor: u64) -> Result<Self, StoreError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| StoreError::Unavailable(format!("cannot stat {}: {e}", path.display())))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut shm = path.as_os_str().to_owned();
        shm.push("-shm");
        let shm = PathBuf::from(shm);
        // In WAL mode the file exists once the store has read (the schema check did).
        let shm = std::fs::metadata(&shm)
            .ok()
            .map(|m| (shm, (m.dev(), m.ino()), m.len()));
        Ok(Self {
            path: path.to_owned(),
            dir,
            identity: (meta.dev(), meta.ino()),
            floor,
            shm,
        })
    }

    /// Whether the `-shm` file SQLite maps into memory is still the one it mapped, at least as
    /// long. SQLite never shrinks it while a connection is open; one truncated under the running
    /// store (by hand, or a tool run as another user) would kill the process with SIGBUS at the
    /// next access beyond its new end, and one deleted or replaced would let another process
    /// build a second, diverging index of the WAL. Checked once at the start of every read and
    /// write (`SqliteStore::read`/`write`; one `stat`, not repeated inside them), so
    /// such damage turns into 503 answers and a log line telling to restart, instead of a
    /// silent crash (a damage landing between this check and SQLite's access still crashes).
    pub(super) fn check_shm(&self) -> Result<(), StoreError> {
        let Some((path, identity, size)) = &self.shm else {
            return Ok(());
        };
        let lost = |why: String| {
            StoreError::FileLost(format!(
                "{} {why}; restart tally (SQLite rebuilds it from the WAL)",
                path.display()
            ))
        };
        match std::fs::metadata(path) {
            Ok(meta) if (meta.dev(), meta.ino()) != *identity => {
                Err(lost("was replaced by another file".to_owned()))
            }
            Ok(meta) if meta.len() < *size => Err(lost(format!(
                "was truncated under the running server ({} < {size} bytes)",
                meta.len()
            ))),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(lost("was deleted under the running server".to_owned()))
            }
            Err(e) => Err(lost(format!("cannot be examined ({e})"))),
        }
    }

    /// Free bytes an unprivileged writer may use on the database's filesystem.
    pub(super) fn free_bytes(&self) -> Option<u64> {
        let stat = rustix::fs::statvfs(&self.dir).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    pub(super) fn check_disk(&self) -> Result<(), StoreError> {
        if self.floor == 0 {
            return Ok(());
        }
        match self.free_bytes() {
            Some(free) if free < self.floor => Err(StoreError::DiskFull {
                free,
                floor: self.floor,
            }),
            _ => Ok(()),
        }
    }

    pub(super) fn check_file(&self) -> Result<(), StoreError> {
        match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => Ok(()),
            Ok(_) => Err(StoreError::FileLost(format!(
                "{} was replaced by another file; restart tally to use it",
                self.path.display()
            ))),
            // The process still holds the file open: moved back, it is the same file again
            // and the next check passes, so counting resumes without a restart.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::FileLost(format!(
                    "{} was deleted or moved; move it back (with its -wal and -shm) and \
                     counting resumes, or restore a backup there and restart tally",
                    self.path.display()
                )))
            }
            Err(e) => Err(StoreError::FileLost(format!(
                "cannot stat {}: {e}",
                self.path.display()
            ))),
        }
    }
}
