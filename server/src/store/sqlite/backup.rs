//! Consistent copies of the live database: `VACUUM INTO` a new file.
//!
//! Contract: [`SqliteStore::backup_to`] writes a complete, compacted, self-contained SQLite
//! file (no WAL beside it) holding every transaction committed before it started, while the
//! store keeps serving: it runs on a read-only connection inside one read transaction, so
//! writers are never blocked (WAL) and nothing committed after its start is in the copy.
//! It refuses to overwrite an existing file. [`backup_before_migration`] copies a file about
//! to be migrated to `<file>.v<version>.bak` beside it, before anything is changed.

use super::*;

impl SqliteStore {
    /// Copy the database to `target` (a new file), consistently, while serving.
    pub async fn backup_to(&self, target: &Path) -> Result<(), StoreError> {
        if target.exists() {
            return Err(StoreError::Invalid(format!(
                "{} exists: a backup never overwrites a file",
                target.display()
            )));
        }
        let target = target
            .to_str()
            .ok_or_else(|| StoreError::Invalid("backup path is not UTF-8".into()))?
            .to_owned();
        self.read(move |conn| {
            conn.execute("VACUUM INTO ?1", [target])?;
            Ok(())
        })
        .await
    }
}

/// The path of the copy made before migrating `path` from `version`.
pub fn migration_backup_path(path: &Path, version: i64) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".v{version}.bak"));
    path.with_file_name(name)
}

/// Copy `conn`'s file (at schema `version`) beside itself before a migration; an existing
/// copy of that version is kept (the first one is the untouched original).
pub(super) fn backup_before_migration(
    conn: &Connection,
    path: &Path,
    version: i64,
) -> Result<(), StoreError> {
    let target = migration_backup_path(path, version);
    if target.exists() {
        return Ok(());
    }
    let target = target
        .to_str()
        .ok_or_else(|| StoreError::Invalid("backup path is not UTF-8".into()))?
        .to_owned();
    conn.execute("VACUUM INTO ?1", [&target]).map_err(|e| {
        StoreError::Unavailable(format!("backup before migration to {target}: {e}"))
    })?;
    tracing::info!(backup = %target, from = version, "copied the database before migrating");
    Ok(())
}
