//! The embedded backend: one SQLite file, no other process.
//!
//! Contract, beyond [`Store`]'s:
//! - WAL journal; `synchronous=FULL` by default, so a committed batch survives `kill -9` and
//!   power loss (`NORMAL` survives `kill -9` only, and is faster).
//! - One writer connection (SQLite has one writer anyway); several read-only connections so
//!   counts and dashboards never wait for a commit. Every call runs on the blocking pool.
//! - Dedupe is the primary key of `events` (the UUIDv7 event id) and a partial unique index on
//!   (site, name, dedupe); `INSERT OR IGNORE` plus the changed-row count decides the outcome.
//!
//! Files: this one opens the database and implements [`Store`]; `write` commits batches,
//! `read` answers queries, `verify` recounts and repairs.

mod read;
mod verify;
mod write;

use read::{
    id_bound, insert_site, query_sites, read_counts, read_range_totals, read_series,
    read_top_pages, read_top_referrers,
};
use verify::verify_counters;
use write::commit_batch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use jiff::civil::Date;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tally_wire::Numbers;

use super::{
    BySource, CountsRaw, DayRow, Drift, PageRow, ReferrerRow, Site, Store, StoreError, VerifyReport,
};
use crate::core::day::{SiteZone, day_key};
use crate::core::hit::HitKind;
use crate::core::ids::{PagePath, SiteId};
use crate::core::record::{Outcome, Record, Source};

/// `day` value of all-time counter rows.
const ALL_TIME: &str = "*";
/// `page` value of whole-site counter rows.
const WHOLE_SITE: &str = "";
/// `kind` codes in `events`.
const KIND_PAGEVIEW: i64 = 0;
const KIND_EVENT: i64 = 1;

const SCHEMA: &str = r"
CREATE TABLE IF NOT EXISTS sites (
    id TEXT PRIMARY KEY,
    origins TEXT NOT NULL,
    timezone TEXT NOT NULL,
    public INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    event_id BLOB PRIMARY KEY,
    site TEXT NOT NULL,
    source INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    page TEXT NOT NULL,
    name TEXT,
    dedupe TEXT,
    visitor BLOB NOT NULL,
    at_ms INTEGER NOT NULL,
    day TEXT NOT NULL,
    referrer TEXT
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_dedupe ON events (site, name, dedupe) WHERE dedupe IS NOT NULL;
-- No index on (site, day): range reads use the time-ordered event id (UUIDv7) instead,
-- so every stored hit updates one b-tree less.
DROP INDEX IF EXISTS events_site_day;
CREATE TABLE IF NOT EXISTS visitors (
    site TEXT NOT NULL, source INTEGER NOT NULL, page TEXT NOT NULL, day TEXT NOT NULL,
    visitor BLOB NOT NULL,
    PRIMARY KEY (site, source, page, day, visitor)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    site TEXT NOT NULL, source INTEGER NOT NULL, page TEXT NOT NULL, day TEXT NOT NULL,
    views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (site, source, page, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_counters (
    site TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (site, name, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bases (
    site TEXT NOT NULL, page TEXT NOT NULL, views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (site, page)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS salts (day TEXT PRIMARY KEY, salt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
";

/// How hard SQLite syncs a commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// fsync on every commit: survives power loss.
    #[default]
    Full,
    /// WAL without fsync on commit: survives a process crash, not power loss.
    Normal,
}

/// The writer connection and what it knows about rows it has written.
struct Writer {
    conn: Connection,
    /// Visitor rows known to exist, so repeat visitors skip four index lookups per hit.
    seen: SeenVisitors,
}

/// A bounded set of visitor rows (hashed) known to be in `visitors`, in two generations:
/// when the young one fills, it becomes the old one and the old one is dropped, so the most
/// recently seen rows stay. Safe because a visitor row is never deleted while it can still be
/// hit: `prune` only removes days older than the accepted event window, and `verify --repair`
/// rebuilds every row that has an event. A key is added only after its transaction commits.
#[derive(Default)]
struct SeenVisitors {
    hasher: std::collections::hash_map::RandomState,
    young: std::collections::HashSet<u64>,
    old: std::collections::HashSet<u64>,
}

/// Rows per generation of [`SeenVisitors`] (two generations: at most twice this many).
const SEEN_PER_GENERATION: usize = 250_000;

impl SeenVisitors {
    fn key(&self, site: &str, source: i64, page: &str, day: &str, visitor: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((site, source, page, day, visitor))
    }

    fn contains(&self, key: u64) -> bool {
        self.young.contains(&key) || self.old.contains(&key)
    }

    fn insert(&mut self, key: u64) {
        if self.young.len() >= SEEN_PER_GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key);
    }
}

/// Number of read-only connections.
const READERS: usize = 4;

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    /// The only connection that writes (SQLite allows one writer at a time anyway).
    writer: Arc<Mutex<Writer>>,
    /// Idle read-only connections; a reader is taken for one call and put back.
    readers: Arc<Mutex<Vec<Connection>>>,
    /// The database file, to open more readers when all are busy.
    path: PathBuf,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        backend(e)
    }
}

fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

impl SqliteStore {
    /// Open (creating if needed) the database file at `path`.
    pub fn open(path: &Path, sync: SyncMode) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        let sync = match sync {
            SyncMode::Full => "FULL",
            SyncMode::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.execute_batch(SCHEMA)?;
        conn.set_prepared_statement_cache_capacity(64);
        let readers = (0..READERS)
            .map(|_| open_reader(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            writer: Arc::new(Mutex::new(Writer {
                conn,
                seen: SeenVisitors::default(),
            })),
            readers: Arc::new(Mutex::new(readers)),
            path: path.to_owned(),
        })
    }

    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let writer = Arc::clone(&self.writer);
        tokio::task::spawn_blocking(move || {
            // A panic under the lock rolled its transaction back; the connection is still usable.
            let mut writer = writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&mut writer.conn)
        })
        .await
        .map_err(backend)?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = Arc::clone(&self.readers);
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let taken = readers
                .lock()
                .map_err(|_| backend("reader pool poisoned"))?
                .pop();
            let mut conn = match taken {
                Some(conn) => conn,
                None => open_reader(&path)?,
            };
            let out = f(&mut conn);
            if let Ok(mut pool) = readers.lock()
                && pool.len() < READERS
            {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(backend)?
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn commit(&self, records: Vec<Record>) -> Result<Vec<Outcome>, StoreError> {
        let writer = Arc::clone(&self.writer);
        tokio::task::spawn_blocking(move || {
            // A panic under the lock rolled its transaction back; the connection is still usable.
            let mut writer = writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Writer { conn, seen } = &mut *writer;
            commit_batch(conn, seen, &records)
        })
        .await
        .map_err(backend)?
    }

    async fn counts(
        &self,
        site: &SiteId,
        page: &PagePath,
        today: Date,
    ) -> Result<CountsRaw, StoreError> {
        let (site, page, today) = (
            site.as_str().to_owned(),
            page.as_str().to_owned(),
            day_key(today),
        );
        self.read(move |conn| read_counts(conn, &site, &page, &today))
            .await
    }

    async fn list_sites(&self) -> Result<Vec<Site>, StoreError> {
        self.read(|conn| query_sites(conn, None)).await
    }

    async fn get_site(&self, id: &SiteId) -> Result<Option<Site>, StoreError> {
        let id = id.as_str().to_owned();
        self.read(move |conn| Ok(query_sites(conn, Some(&id))?.pop()))
            .await
    }

    async fn put_site(&self, site: &Site) -> Result<(), StoreError> {
        let site = site.clone();
        self.write(move |conn| insert_site(conn, &site, true)).await
    }

    async fn ensure_site(&self, site: &Site, max_sites: u64) -> Result<Option<Site>, StoreError> {
        // Temporary (replaced by the schema v2 branch): count, then insert, on the one writer.
        let site = site.clone();
        self.write(move |conn| {
            if let Some(existing) = query_sites(conn, Some(site.id.as_str()))?.pop() {
                return Ok(Some(existing));
            }
            let n: i64 = conn.query_row("SELECT COUNT(*) FROM sites", [], |r| r.get(0))?;
            if max_sites > 0 && n as u64 >= max_sites {
                return Ok(None);
            }
            insert_site(conn, &site, false)?;
            Ok(query_sites(conn, Some(site.id.as_str()))?.pop())
        })
        .await
    }

    async fn remove_site(&self, id: &SiteId) -> Result<bool, StoreError> {
        let id = id.as_str().to_owned();
        self.write(move |conn| Ok(conn.execute("DELETE FROM sites WHERE id = ?1", [id])? > 0))
            .await
    }

    async fn salt_for(&self, day: Date, fresh: [u8; 32]) -> Result<[u8; 32], StoreError> {
        let key = day_key(day);
        let oldest = day_key(day.checked_sub(jiff::ToSpan::days(2)).unwrap_or(day));
        self.write(move |conn| {
            conn.execute(
                "INSERT OR IGNORE INTO salts (day, salt) VALUES (?1, ?2)",
                params![key, &fresh[..]],
            )?;
            conn.execute("DELETE FROM salts WHERE day < ?1", [oldest])?;
            let salt: Vec<u8> =
                conn.query_row("SELECT salt FROM salts WHERE day = ?1", [key], |r| r.get(0))?;
            salt.try_into()
                .map_err(|_| StoreError::Invalid("salt is not 32 bytes".into()))
        })
        .await
    }

    async fn verify(&self, repair: bool) -> Result<VerifyReport, StoreError> {
        self.write(move |conn| verify_counters(conn, repair)).await
    }

    async fn series(&self, site: &SiteId, from: Date, to: Date) -> Result<Vec<DayRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_key(from), day_key(to));
        self.read(move |conn| read_series(conn, &site, &from, &to))
            .await
    }

    async fn range_totals(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<BySource, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_key(from), day_key(to));
        self.read(move |conn| read_range_totals(conn, &site, &from, &to))
            .await
    }

    async fn top_pages(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_key(from), day_key(to));
        self.read(move |conn| read_top_pages(conn, &site, &from, &to, limit))
            .await
    }

    async fn top_referrers(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        (start, end): (jiff::Timestamp, jiff::Timestamp),
        limit: u32,
    ) -> Result<Vec<ReferrerRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_key(from), day_key(to));
        let ids = (
            id_bound(start.as_millisecond()),
            id_bound(end.as_millisecond()),
        );
        self.read(move |conn| read_top_referrers(conn, &site, (&from, &to), ids, limit))
            .await
    }

    async fn set_base(
        &self,
        site: &SiteId,
        page: Option<&PagePath>,
        base: Numbers,
    ) -> Result<(), StoreError> {
        let site = site.as_str().to_owned();
        let page = page.map(|p| p.as_str().to_owned()).unwrap_or_default();
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO bases (site, page, views, visitors) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (site, page) DO UPDATE SET views = excluded.views, visitors = excluded.visitors",
                params![site, page, base.views as i64, base.visitors as i64],
            )?;
            Ok(())
        })
        .await
    }

    async fn prune(&self, before_ms: i64) -> Result<u64, StoreError> {
        // Event ids are UUIDv7: the first 48 bits are the time, so "older than" is a key range.
        let bound = id_bound(before_ms);
        let mut total = 0u64;
        loop {
            // Small chunks, so the writer is never held long and live traffic keeps flowing.
            // The marker and the deletion commit together: `verify` never sees events gone
            // without knowing it. Custom events with a dedupe key are kept (they ARE the
            // dedupe), and so are the derived per-day visitor sets (range visitors stay exact).
            let deleted = self
                .write(move |conn| {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let ids: Vec<Vec<u8>> = {
                        let mut stmt = tx.prepare_cached(
                            "SELECT event_id FROM events \
                             WHERE event_id < ?1 AND dedupe IS NULL LIMIT 5000",
                        )?;
                        let rows = stmt.query_map(params![&bound[..]], |r| r.get(0))?;
                        rows.collect::<Result<_, _>>()?
                    };
                    if ids.is_empty() {
                        return Ok(0);
                    }
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES ('pruned_before_ms', ?1) \
                         ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                        [before_ms],
                    )?;
                    {
                        let mut delete =
                            tx.prepare_cached("DELETE FROM events WHERE event_id = ?1")?;
                        for id in &ids {
                            delete.execute([id])?;
                        }
                    }
                    tx.commit()?;
                    Ok(ids.len() as u64)
                })
                .await?;
            total += deleted;
            if deleted == 0 {
                break;
            }
        }
        Ok(total)
    }
}
