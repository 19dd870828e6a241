//! The checks before a write is acknowledged: the disk floor and the database file's identity.
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

pub(super) struct FileGuard {
    path: PathBuf,
    /// The directory holding the file (statvfs still works on it when the file is gone).
    dir: PathBuf,
    /// (device, inode) of the file when it was opened.
    identity: (u64, u64),
    /// Minimum free bytes for a commit; 0 = no floor.
    floor: u64,
}

impl FileGuard {
    /// Remember the identity of the (already opened) file at `path`.
    pub(super) fn new(path: &Path, floor: u64) -> Result<Self, StoreError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| StoreError::Backend(format!("cannot stat {}: {e}", path.display())))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        Ok(Self {
            path: path.to_owned(),
            dir,
            identity: (meta.dev(), meta.ino()),
            floor,
        })
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
                "{} was replaced by another file",
                self.path.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StoreError::FileLost(
                format!("{} was deleted or moved", self.path.display()),
            )),
            Err(e) => Err(StoreError::FileLost(format!(
                "cannot stat {}: {e}",
                self.path.display()
            ))),
        }
    }
}
