//! The embedded backend: one SQLite file, no other process.
//!
//! Contract, beyond [`super::Store`]'s:
//! - WAL journal. `SyncMode::Full` (the default): an acknowledged write survives `kill -9` and
//!   power loss — the WAL is fsynced after every commit and before its answer, by this store
//!   beside its writer rather than by SQLite inside `COMMIT` (`durable`; the connection runs
//!   `synchronous=NORMAL`). `SyncMode::Normal` survives `kill -9` only (no fsync per commit).
//! - One writer connection per store (SQLite has one writer anyway; two stores on one file
//!   take turns through `BEGIN IMMEDIATE`); several read-only connections so counts and
//!   dashboards never wait for a commit. Every async call runs on the blocking pool; the
//!   ingest queue's batches run on its writer thread ([`super::BatchWriter`]). Readers have a
//!   bounded page cache and spill temporary b-trees to files, so no query takes unbounded RAM.
//! - Visitor sets are `visits` and `reach` plus the rows still in the visitor-set journal
//!   (`journal`): new rows are appended there and moved in bulk; readers read both.
//! - Schema v6 (see `schema`): sites and pages interned as integers, days as integers. Dedupe
//!   is the primary key of `events` (the UUIDv7 event id) and a partial unique index on
//!   (site, name, dedupe); `INSERT OR IGNORE` plus the changed-row count decides the outcome.
//! - A batch is refused whole, before anything is written, when the filesystem's free space
//!   is below [`StoreOptions::min_free_bytes`] (`DiskFull`), and rolled back just before its
//!   `COMMIT` when the path no longer names the file opened (`FileLost`): see `guard`.
//! - At most [`StoreOptions::max_new_pages_per_day`] new pages per site and local day; views
//!   of further new pages count under the site's `(other)` page, and the raw event records the
//!   page id it was counted under, so `verify` stays exact.
//! - Verify compares only what can still be recounted: not all-time rows nor days up to the
//!   raw-event prune marker (`meta.pruned_before_ms`, plus one day for time zones), not
//!   per-page day rows before the page prune marker (`meta.page_rows_before_day`); repair
//!   rewrites exactly the compared rows, and rebuilds per-day visitor sets only after both the
//!   raw-event and the visitor-set markers (`meta.visitor_rows_before_day`), so it never
//!   resurrects pruned rows.
//!
//! - SQLite's busy/locked answers become [`StoreError::Conflict`] (retryable); other errors
//!   [`StoreError::Unavailable`].
//! - `top_referrers` sums the referrer counters (one row per site, local day and referring
//!   host, written with the views); `visits` walks the events' primary key over the UUIDv7
//!   range of its local days widened by 26 h each side (any zone), then filters by the exact
//!   stored day.
//!
//! Files: this one opens the database and implements the job traits ([`EventSink`],
//! [`StatsReader`], [`SiteStore`], [`SaltStore`], [`Maintenance`]); `schema` creates and migrates
//! the tables, `intern` maps names to ids, `guard` checks disk and file, `write` commits
//! batches, `durable` syncs the WAL beside the writer, `journal` keeps new visitor-set rows until they move in bulk, `read` answers queries, `verify` recounts and repairs, `prune` applies retention, `report` holds the email report schedules, their send leases and the visits read.

mod backup;
mod dump;
mod durable;
mod export;
mod guard;
mod import;
mod imported;
mod intern;
mod journal;
mod lane;
mod prune;
mod read;
mod report;
mod rollups;
mod schema;
mod segments;
mod shares;
mod verify;
mod write;

pub use crate::store::{DailyExportRow, EventExportRow};
pub use crate::store::{DailyImport, ImportOptions};
pub use backup::migration_backup_path;
pub use dump::Dump;
use guard::FileGuard;
use intern::{Interned, Resolver};
use read::{
    id_bound, insert_site, query_sites, read_counts, read_filtered, read_range_totals, read_series,
    read_top_events, read_top_pages, read_top_referrers, snapshot,
};
use schema::ALL_TIME;
use verify::verify_counters;
use write::commit_batch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use jiff::civil::Date;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tally_wire::Numbers;

use super::{
    BySource, CountsRaw, DayRow, Drift, EventRow, EventSink, Maintenance, PageRow, PruneReport,
    ReferrerRow, Retention, SaltStore, Site, SiteStore, StatsReader, StoreError, VerifyReport,
};
use crate::core::day::SiteZone;
use crate::core::filtered::{FilteredCounts, FilteredRow};
use crate::core::hit::HitKind;
use crate::core::ids::{PagePath, SiteId};
use crate::core::record::{Outcome, Record, Source};

/// `kind` codes in `events`.
const KIND_PAGEVIEW: i64 = 0;
const KIND_EVENT: i64 = 1;

use crate::store::{DIM_AGENT, DIM_SOURCE, IMPORTED_SOURCE};

/// The first day of day numbers.
const EPOCH: Date = jiff::civil::date(1970, 1, 1);

/// A local day as stored: days since 1970-01-01.
pub(super) fn day_num(day: Date) -> i64 {
    day.duration_since(EPOCH).as_secs().div_euclid(86_400)
}

/// A stored day number as a date.
pub(super) fn num_day(n: i64) -> Result<Date, StoreError> {
    n.checked_mul(24)
        .map(jiff::SignedDuration::from_hours)
        .and_then(|d| EPOCH.checked_add(d).ok())
        .ok_or_else(|| StoreError::Invalid(format!("day number {n} is out of range")))
}

/// The UTC day number of an instant.
pub(super) fn utc_day_num(at: jiff::Timestamp) -> i64 {
    at.as_second().div_euclid(86_400)
}

/// The event-id key range that holds every event of the local days `from..=to` in any time
/// zone: event ids are UUIDv7 (time first), and a local day starts at most 26 h before or
/// after the UTC day of the same date (zone offsets stay within ±26 h). The exact day filter
/// still applies; the range only lets SQLite walk the primary key instead of every event.
fn event_id_range(from: i64, to: i64) -> ([u8; 16], [u8; 16]) {
    const DAY_MS: i64 = 86_400_000;
    const SLACK_MS: i64 = 26 * 3_600_000;
    let start = from.saturating_mul(DAY_MS).saturating_sub(SLACK_MS);
    let end = to
        .saturating_add(1)
        .saturating_mul(DAY_MS)
        .saturating_add(SLACK_MS);
    (id_bound(start.max(0)), id_bound(end.max(0)))
}

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

/// The size the WAL is cut back to when a checkpoint resets it (`journal_size_limit`): far
/// above what steady traffic fills between checkpoints (a few MiB), so ingest keeps reusing
/// the file in place, and well below the free-space floor.
const WAL_LIMIT_BYTES: i64 = 64 << 20;

/// How the SQLite store is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    pub sync: SyncMode,
    /// Commits are refused (`DiskFull`) while the filesystem has less free space than this.
    /// Default 256 MiB: room for SQLite's WAL to checkpoint, for a `VACUUM`, and for the
    /// operator to react, while a full disk would corrupt nothing but refuse every hit
    /// without a clear signal. 0 = no floor.
    pub min_free_bytes: u64,
    /// New distinct pages per site per local day (default 1000; 0 = unlimited). Beyond it,
    /// views of new pages count under the site's `(other)` page.
    pub max_new_pages_per_day: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            sync: SyncMode::Full,
            min_free_bytes: 256 << 20,
            max_new_pages_per_day: 1000,
        }
    }
}

/// The writer connection and what it knows about rows it has written.
struct Writer {
    conn: Connection,
    /// Visitor rows known to exist, so repeat visitors skip the visitor-set lookups.
    seen: SeenVisitors,
    /// Site and page ids known to exist.
    ids: Interned,
    /// The visitor-set journal's rows (see `journal`).
    pending: journal::Pending,
}

/// A bounded set of per-day visitor rows (hashed) known to be in `visits`, in two
/// generations: when the young one fills, it becomes the old one and the old one is dropped,
/// so the most recently seen rows stay. A page's row for a day implies every other row of
/// that view (the site's row of the day and both all-time rows), so a known page row skips
/// all visitor-set work. Safe because a row is never deleted while its day can still be hit:
/// prune only removes days older than the accepted event window (and clears this set), and
/// `verify --repair` rebuilds every row that has an event. A key is added only after its
/// transaction commits.
#[derive(Default)]
struct SeenVisitors {
    hasher: std::collections::hash_map::RandomState,
    young: std::collections::HashSet<u64>,
    old: std::collections::HashSet<u64>,
}

/// Rows per generation of [`SeenVisitors`] (two generations: at most twice this many).
const SEEN_PER_GENERATION: usize = 250_000;

impl SeenVisitors {
    fn key(&self, scope: i64, source: i64, day: i64, visitor: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((scope, source, day, visitor))
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

    fn clear(&mut self) {
        self.young.clear();
        self.old.clear();
    }
}

/// Number of read-only connections.
const READERS: usize = 4;
/// Page cache of each reader, KiB (SQLite's negative `cache_size`); also bounds the memory of
/// sorts before they spill to temporary files. Small: the analytics keep what they read
/// (`store::analytics`), and the operating system's page cache holds the file.
const READER_CACHE_KIB: i64 = 2 * 1024;
/// Page cache of the writer, KiB: the visitor sets are written at random places.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    /// The only connection that writes (SQLite allows one writer at a time anyway).
    writer: Arc<Mutex<Writer>>,
    /// Idle read-only connections; a reader is taken for one call and put back.
    readers: Arc<Mutex<Vec<Connection>>>,
    /// The database file, to open more readers when all are busy.
    path: PathBuf,
    /// Disk floor and file identity.
    guard: Arc<FileGuard>,
    max_new_pages_per_day: u32,
    /// With `SyncMode::Full`: the WAL, synced by this store after each commit instead of by
    /// SQLite inside it (see `durable`).
    wal: Option<Arc<durable::Wal>>,
    /// Per-day visitor sets kept for range visitors (`store::daysets`).
    sets: Arc<crate::store::daysets::DaySets>,
    /// Per-day page rows kept for top pages (`store::daypages`).
    pages: Arc<crate::store::daypages::DayPages>,
    /// Stored visitor numbers looked up or assigned (`segments`).
    numbers: Arc<Mutex<crate::store::numbers::Numbers>>,
    /// Dashboard and analytics reads, at a lower CPU priority (`lane`).
    lane: Arc<lane::Lane>,
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// SQLite's busy and locked answers (another connection held the lock past the busy timeout)
/// are retryable conflicts: the statement or transaction did nothing.
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StoreError::Conflict(e.to_string())
            }
            _ => backend(e),
        }
    }
}

fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "cache_size", -READER_CACHE_KIB)?;
    conn.pragma_update(None, "temp_store", "FILE")?;
    Ok(conn)
}

impl SqliteStore {
    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open (creating or migrating if needed) the database file at `path`.
    pub fn open(path: &Path, options: StoreOptions) -> Result<Self, StoreError> {
        guard::check_side_files(path)?;
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // Deleted rows (expired salts above all) are overwritten with zeros, not left in free
        // space; `forget_salts` also checkpoints the WAL so no old page image lingers there.
        conn.pragma_update(None, "secure_delete", "ON")?;
        // Until the WAL is open here, SQLite syncs every commit itself.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        conn.pragma_update(None, "temp_store", "FILE")?;
        // The WAL is reused from its start after each complete checkpoint and never shrinks
        // on its own: after a burst (or a long read holding checkpoints back) it is cut back
        // to this size at the next reset.
        conn.pragma_update(None, "journal_size_limit", WAL_LIMIT_BYTES)?;
        schema::prepare(&mut conn, path)?;
        let wal = match options.sync {
            SyncMode::Full => match durable::Wal::open(path) {
                Ok(wal) => {
                    // From here on this store syncs the WAL after each commit (`durable`).
                    conn.pragma_update(None, "synchronous", "NORMAL")?;
                    Some(Arc::new(wal))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the WAL could not be opened to sync it; SQLite syncs every commit itself");
                    None
                }
            },
            SyncMode::Normal => {
                conn.pragma_update(None, "synchronous", "NORMAL")?;
                None
            }
        };
        conn.set_prepared_statement_cache_capacity(64);
        let guard = Arc::new(FileGuard::new(path, options.min_free_bytes)?);
        let readers = (0..READERS)
            .map(|_| open_reader(path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            writer: Arc::new(Mutex::new(Writer {
                conn,
                seen: SeenVisitors::default(),
                ids: Interned::default(),
                pending: journal::Pending::default(),
            })),
            readers: Arc::new(Mutex::new(readers)),
            path: path.to_owned(),
            lane: Arc::new(lane::Lane::new(path.to_owned(), Arc::clone(&guard))),
            guard,
            max_new_pages_per_day: options.max_new_pages_per_day,
            wal,
            sets: Arc::default(),
            pages: Arc::default(),
            numbers: Arc::default(),
        })
    }

    /// Run `f` with this store on the blocking pool.
    async fn on_blocking_pool<T: Send + 'static>(
        &self,
        f: impl FnOnce(&SqliteStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(backend)?
    }

    /// Sync the WAL when this store syncs it (`SyncMode::Full`): every commit that returned
    /// before is durable after `Ok`.
    fn sync_wal(&self) -> Result<(), StoreError> {
        self.wal.as_ref().map_or(Ok(()), |wal| wal.sync())
    }

    /// Run a write on the blocking pool; durable when it returns `Ok`. A write that changed
    /// no row (the storage probe's `BEGIN IMMEDIATE; ROLLBACK`, a site already in place)
    /// costs no fsync.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.on_blocking_pool(move |store| {
            let (out, changed) = store.write_here(|writer| {
                let before = writer.conn.total_changes();
                let out = f(writer)?;
                Ok((out, writer.conn.total_changes() != before))
            })?;
            if changed {
                store.sync_wal()?;
            }
            Ok(out)
        })
        .await
    }

    /// Run a write on this thread; committed, not yet synced when the store syncs the WAL.
    fn write_here<T>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(wal) = &self.wal {
            wal.check()?;
        }
        self.guard.check_shm()?;
        // A panic under the lock rolled its transaction back; the connection is still usable.
        let mut writer = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut writer)
    }

    /// Commit a batch of the ingest queue on this thread.
    fn commit_here(&self, records: &[Record]) -> Result<Vec<Outcome>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        self.write_here(|writer| {
            self.guard.check_disk()?;
            commit_batch(
                writer,
                &self.guard,
                self.max_new_pages_per_day,
                records,
                None,
            )
        })
    }

    /// A dashboard or analytics read: on the stats lane, yielding to live hits (`lane`).
    async fn read_stats<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.lane.read(f).await
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = Arc::clone(&self.readers);
        let path = self.path.clone();
        let guard = Arc::clone(&self.guard);
        tokio::task::spawn_blocking(move || {
            guard.check_shm()?;
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

/// The ingest queue's writer: commits on the queue's thread; with a synced WAL, answers
/// after the syncer's next sync (`durable`), otherwise at once.
struct BatchWriter {
    store: SqliteStore,
    syncer: Option<durable::Syncer>,
}

impl super::BatchWriter for BatchWriter {
    fn commit(&mut self, records: Vec<Record>, done: super::Durable) {
        // A panic fails this batch only (its transaction rolled back, the connection stays
        // usable), as it did when each batch ran as a task of its own: the writer thread and
        // the queue live on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.store.commit_here(&records)
        }))
        .unwrap_or_else(|_| Err(backend("the commit of this batch panicked")));
        match &self.syncer {
            Some(syncer) => syncer.after_commit(result, done),
            None => done(result),
        }
    }

    fn finish(self: Box<Self>) {
        if let Some(syncer) = self.syncer {
            syncer.finish();
        }
    }
}

#[async_trait]
impl EventSink for SqliteStore {
    async fn commit(&self, records: Vec<Record>) -> Result<Vec<Outcome>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        // Synced even when every record was a duplicate: `duplicate` promises the first copy
        // is durable, and it may be in a batch whose sync is still running.
        self.on_blocking_pool(move |store| {
            let outcomes = store.commit_here(&records)?;
            store.sync_wal()?;
            Ok(outcomes)
        })
        .await
    }

    fn batch_writer(&self) -> Option<Box<dyn super::BatchWriter>> {
        let syncer = match self
            .wal
            .as_ref()
            .map(|wal| durable::Syncer::start(Arc::clone(wal)))
        {
            Some(Ok(syncer)) => Some(syncer),
            // No thread to sync on: answer through `EventSink::commit`, which syncs inline.
            Some(Err(e)) => {
                tracing::warn!(error = %e, "no WAL sync thread; the writer syncs every batch itself");
                return None;
            }
            None => None,
        };
        Some(Box::new(BatchWriter {
            store: self.clone(),
            syncer,
        }))
    }

    async fn add_filtered(&self, rows: &[FilteredRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, i64, i64, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r.site.as_str().to_owned(),
                    day_num(r.day),
                    i64::from(r.reason.code()),
                    i64::try_from(r.count).unwrap_or(i64::MAX),
                )
            })
            .collect();
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Resolver::new(&tx, &w.ids, 0);
            for (site, day, reason, count) in &rows {
                let site = ids.site(site)?;
                tx.prepare_cached(
                    "INSERT INTO filtered (site, day, reason, count) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (site, day, reason) DO UPDATE SET count = count + excluded.count",
                )?
                .execute(params![site, day, reason, count])?;
            }
            let pending = ids.into_pending();
            tx.commit()?;
            w.ids.absorb(pending);
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl super::SegmentSource for SqliteStore {
    async fn segment_index(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<super::SegmentIndex, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        let numbers = Arc::clone(&self.numbers);
        self.read_stats(move |conn| {
            snapshot(conn, |tx| {
                segments::read_index(tx, &numbers, &site, from, to)
            })
        })
        .await
    }

    async fn segment_parts(
        &self,
        site: &SiteId,
        wanted: Vec<super::PartsWanted>,
    ) -> Result<Vec<super::SegmentParts>, StoreError> {
        let site = site.as_str().to_owned();
        self.read_stats(move |conn| segments::read_parts(conn, &site, &wanted))
            .await
    }

    async fn dictionary(
        &self,
        site: &SiteId,
        pages: Vec<u32>,
        dims: Vec<u32>,
    ) -> Result<super::DictionaryRows, StoreError> {
        let site = site.as_str().to_owned();
        self.read_stats(move |conn| segments::read_dictionary(conn, &site, &pages, &dims))
            .await
    }

    async fn unsealed_days(
        &self,
        site: &SiteId,
        through: Date,
        limit: u32,
    ) -> Result<Vec<Date>, StoreError> {
        let (site, through) = (site.as_str().to_owned(), day_num(through));
        let days = self
            .read(move |conn| segments::read_unsealed(conn, &site, through, limit))
            .await?;
        days.into_iter().map(num_day).collect()
    }

    async fn imported(
        &self,
        site: &SiteId,
        table: crate::store::imported::Table,
        from: Date,
        to: Date,
        by_day: bool,
    ) -> Result<Vec<crate::store::imported::ImportedRow>, StoreError> {
        let (site, days) = (site.as_str().to_owned(), (day_num(from), day_num(to)));
        self.read_stats(move |conn| imported::read(conn, &site, table, days, by_day))
            .await
    }

    async fn sealed_through(
        &self,
        site: &SiteId,
        through: Date,
    ) -> Result<Vec<(Date, i64)>, StoreError> {
        let (site, through) = (site.as_str().to_owned(), day_num(through));
        self.read_stats(move |conn| rollups::sealed_through(conn, &site, through))
            .await
    }

    async fn rollup_index(
        &self,
        site: &SiteId,
    ) -> Result<Vec<super::rollups::RollupInfo>, StoreError> {
        let site = site.as_str().to_owned();
        self.read_stats(move |conn| rollups::index(conn, &site))
            .await
    }

    async fn rollup_states(
        &self,
        site: &SiteId,
        month: Date,
        keys: Vec<String>,
    ) -> Result<Vec<super::rollups::RollupState>, StoreError> {
        let (site, month) = (site.as_str().to_owned(), day_num(month));
        self.read_stats(move |conn| rollups::states(conn, &site, month, &keys))
            .await
    }

    async fn put_rollups(
        &self,
        site: &SiteId,
        month: Date,
        states: Vec<super::rollups::RollupState>,
    ) -> Result<bool, StoreError> {
        let site = site.as_str().to_owned();
        let days = (day_num(month), day_num(super::rollups::month_end(month)));
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let stored = rollups::put(&tx, &site, days, &states)?;
            tx.commit()?;
            Ok(stored)
        })
        .await
    }

    async fn seal_day(
        &self,
        site: &SiteId,
        day: Date,
        day_start_ms: i64,
    ) -> Result<bool, StoreError> {
        let (name, day) = (site.as_str().to_owned(), day_num(day));
        let numbers = Arc::clone(&self.numbers);
        let read = self
            .read(move |conn| snapshot(conn, |tx| segments::seal_read(tx, &numbers, &name, day)))
            .await?;
        let Some(read) = read else {
            return Ok(false);
        };
        let site_id = read.site();
        let assigned = self
            .write(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                let out = segments::seal_write(&tx, read, day_start_ms)?;
                tx.commit()?;
                Ok(out)
            })
            .await?;
        match assigned {
            Some(assigned) => {
                crate::store::numbers::Numbers::remember(&self.numbers, site_id, assigned);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[async_trait]
impl StatsReader for SqliteStore {
    async fn counts(
        &self,
        site: &SiteId,
        page: &PagePath,
        today: Date,
    ) -> Result<CountsRaw, StoreError> {
        let (site, page, today) = (
            site.as_str().to_owned(),
            page.as_str().to_owned(),
            day_num(today),
        );
        self.read(move |conn| read_counts(conn, &site, &page, today))
            .await
    }

    async fn series(&self, site: &SiteId, from: Date, to: Date) -> Result<Vec<DayRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        self.read_stats(move |conn| read_series(conn, &site, from, to))
            .await
    }

    async fn range_totals(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<BySource, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        let sets = Arc::clone(&self.sets);
        self.read_stats(move |conn| {
            snapshot(conn, |c| read_range_totals(c, &sets, &site, from, to))
        })
        .await
    }

    async fn top_pages(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        let (sets, pages) = (Arc::clone(&self.sets), Arc::clone(&self.pages));
        self.read_stats(move |conn| {
            snapshot(conn, |c| {
                read_top_pages(c, (&sets, &pages), &site, from, to, limit)
            })
        })
        .await
    }

    async fn top_referrers(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<ReferrerRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        self.read_stats(move |conn| read_top_referrers(conn, &site, from, to, limit))
            .await
    }

    async fn top_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        self.read_stats(move |conn| read_top_events(conn, &site, from, to, limit))
            .await
    }

    async fn visits(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<crate::store::Visits, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        let ids = event_id_range(from, to);
        self.read_stats(move |conn| report::read_visits(conn, &site, (from, to), ids))
            .await
    }

    async fn filtered(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<FilteredCounts, StoreError> {
        let (site, from, to) = (site.as_str().to_owned(), day_num(from), day_num(to));
        self.read_stats(move |conn| read_filtered(conn, &site, from, to))
            .await
    }
}

#[async_trait]
impl SiteStore for SqliteStore {
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
        self.write(move |w| insert_site(&w.conn, &site)).await
    }

    async fn ensure_site(&self, site: &Site, max_sites: u64) -> Result<Option<Site>, StoreError> {
        let site = site.clone();
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let origins = serde_json::to_string(&site.origins).map_err(backend)?;
            // One statement: exists-or-under-the-limit is decided where the row is written.
            tx.execute(
                "INSERT INTO sites (id, origins, timezone, public, ingest_key) \
                 SELECT ?1, ?2, ?3, ?4, ?5 WHERE NOT EXISTS (SELECT 1 FROM sites WHERE id = ?1) \
                 AND (?6 = 0 OR (SELECT COUNT(*) FROM sites) < ?6)",
                params![
                    site.id.as_str(),
                    origins,
                    site.zone.name(),
                    site.public,
                    site.ingest_key,
                    i64::try_from(max_sites).unwrap_or(i64::MAX),
                ],
            )?;
            let stored = query_sites(&tx, Some(site.id.as_str()))?.pop();
            tx.commit()?;
            Ok(stored)
        })
        .await
    }

    async fn set_ingest_key(&self, id: &SiteId, key: Option<&str>) -> Result<bool, StoreError> {
        let (id, key) = (id.as_str().to_owned(), key.map(str::to_owned));
        self.write(move |w| {
            Ok(w.conn.execute(
                "UPDATE sites SET ingest_key = ?2 WHERE id = ?1",
                params![id, key],
            )? > 0)
        })
        .await
    }

    async fn site_count(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            let n: i64 = conn.query_row("SELECT COUNT(*) FROM sites", [], |r| r.get(0))?;
            Ok(n.max(0) as u64)
        })
        .await
    }

    async fn remove_site(&self, id: &SiteId) -> Result<bool, StoreError> {
        let id = id.as_str().to_owned();
        self.write(move |w| Ok(w.conn.execute("DELETE FROM sites WHERE id = ?1", [id])? > 0))
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
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Resolver::new(&tx, &w.ids, 0);
            let site = ids.site(&site)?;
            let scope = ids.page_uncapped(site, &page)?;
            let pending = ids.into_pending();
            tx.execute(
                "INSERT INTO bases (scope, views, visitors) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (scope) DO UPDATE SET views = excluded.views, visitors = excluded.visitors",
                params![
                    scope,
                    i64::try_from(base.views).unwrap_or(i64::MAX),
                    i64::try_from(base.visitors).unwrap_or(i64::MAX)
                ],
            )?;
            tx.commit()?;
            w.ids.absorb(pending);
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl SaltStore for SqliteStore {
    async fn salt_for(&self, day: Date, fresh: [u8; 32]) -> Result<[u8; 32], StoreError> {
        let key = day_num(day);
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT OR IGNORE INTO salts (day, salt) VALUES (?1, ?2)",
                params![key, &fresh[..]],
            )?;
            let forgotten = tx.execute("DELETE FROM salts WHERE day < ?1", [key - 2])?;
            let salt: Vec<u8> =
                tx.query_row("SELECT salt FROM salts WHERE day = ?1", [key], |r| r.get(0))?;
            tx.commit()?;
            if forgotten > 0 {
                checkpoint_truncate(&w.conn);
            }
            salt.try_into()
                .map_err(|_| StoreError::Invalid("salt is not 32 bytes".into()))
        })
        .await
    }

    async fn end_sessions(&self, at_ms: i64) -> Result<i64, StoreError> {
        self.write(move |w| {
            Ok(w.conn.query_row(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) \
                 ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value) \
                 RETURNING value",
                params![SESSIONS_NOT_BEFORE, at_ms],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn sessions_not_before(&self) -> Result<i64, StoreError> {
        self.read(|conn| {
            Ok(conn
                .query_row(
                    "SELECT value FROM meta WHERE key = ?1",
                    [SESSIONS_NOT_BEFORE],
                    |r| r.get(0),
                )
                .optional()?
                .unwrap_or(i64::MIN))
        })
        .await
    }
}

/// The `meta` key of the last admin logout (ms since 1970).
const SESSIONS_NOT_BEFORE: &str = "sessions_not_before_ms";

#[async_trait]
impl Maintenance for SqliteStore {
    async fn verify(&self, repair: bool) -> Result<VerifyReport, StoreError> {
        self.verify_only(None, repair).await
    }

    async fn verify_site(&self, site: &SiteId, repair: bool) -> Result<VerifyReport, StoreError> {
        self.verify_only(Some(site.as_str().to_owned()), repair)
            .await
    }

    async fn prune(
        &self,
        policy: Retention,
        now: jiff::Timestamp,
    ) -> Result<PruneReport, StoreError> {
        prune::prune(self, policy, now).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.guard.check_file()?;
        self.guard.check_disk()?;
        self.read(|conn| {
            conn.query_row("SELECT COUNT(*) FROM site_keys", [], |r| r.get::<_, i64>(0))?;
            Ok(())
        })
        .await?;
        // The write lock can be had (another process holding it makes commits fail too).
        self.write(|w| {
            w.conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")?;
            Ok(())
        })
        .await
    }

    fn free_bytes(&self) -> Option<u64> {
        self.guard.free_bytes()
    }

    fn kept_bytes(&self) -> crate::store::KeptBytes {
        crate::store::KeptBytes::of(&self.sets, &self.pages, &self.numbers)
    }

    async fn close_log(&self) -> Result<(), StoreError> {
        self.write(|w| match wal_checkpoint_truncate(&w.conn)? {
            true => Ok(()),
            false => Err(StoreError::Conflict(
                "a reader held the WAL: it was not truncated".into(),
            )),
        })
        .await
    }
}

/// Fold the WAL into the main file and truncate it, so pages that held deleted secrets are
/// gone from the WAL too. Best effort: a reader holding an old snapshot makes it partial, and
/// the next prune (hourly) tries again.
pub(super) fn checkpoint_truncate(conn: &Connection) {
    if let Err(e) = wal_checkpoint_truncate(conn) {
        tracing::warn!(error = %e, "WAL checkpoint after deleting salts failed; retried hourly");
    }
}

/// `PRAGMA wal_checkpoint(TRUNCATE)`: whether it completed (false: a reader held back part of
/// the WAL, which then stays).
fn wal_checkpoint_truncate(conn: &Connection) -> Result<bool, StoreError> {
    let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
    Ok(busy == 0)
}

impl SqliteStore {
    /// Verify (and repair) every site, or only `site` (by name).
    async fn verify_only(
        &self,
        site: Option<String>,
        repair: bool,
    ) -> Result<VerifyReport, StoreError> {
        let report = {
            let site = site.clone();
            self.write(move |w| {
                // The visitor sets whole in their tables first (verify reads and rebuilds them).
                w.pending.invalidate();
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                journal::flush(&tx)?;
                tx.commit()?;
                let only = match &site {
                    None => verify::Only::all(),
                    Some(name) => {
                        let id: Option<i64> = w
                            .conn
                            .query_row("SELECT id FROM site_keys WHERE name = ?1", [name], |r| {
                                r.get(0)
                            })
                            .optional()?;
                        match id {
                            Some(id) => verify::Only::site(id),
                            // Never counted: nothing to check.
                            None => return Ok(VerifyReport::default()),
                        }
                    }
                };
                let report = verify_counters(&mut w.conn, &only, repair)?;
                if report.repaired {
                    w.seen.clear();
                    w.ids.clear();
                }
                Ok(report)
            })
            .await?
        };
        // The day segments, recounted from the same raw events.
        let segments = segments::verify(self, site, repair).await?;
        Ok(VerifyReport {
            checked: report.checked + segments.checked,
            drift: [report.drift, segments.drift].concat(),
            repaired: report.repaired || segments.repaired,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::durable::testing::{PATIENCE, answer, stalled_sync};
    use super::*;

    /// A write lock held by another connection is a retryable conflict, not an outage; other
    /// failures are not retryable.
    #[test]
    fn busy_is_a_retryable_conflict() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let mut holder = Connection::open(&path).expect("open");
        holder
            .pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        let tx = holder
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .expect("lock");
        let mut other = Connection::open(&path).expect("open");
        other
            .busy_timeout(std::time::Duration::ZERO)
            .expect("timeout");
        let err = other
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map(|_| ())
            .expect_err("the write lock is held");
        let err = StoreError::from(err);
        assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
        assert!(err.is_retryable());
        drop(tx);
        let err = StoreError::from(
            other
                .execute("INSERT INTO no_such_table VALUES (1)", [])
                .expect_err("no table"),
        );
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(!err.is_retryable());
    }

    fn record(n: u8) -> Record {
        let at: jiff::Timestamp = "2026-04-01T12:00:00Z".parse().expect("ts");
        Record {
            event_id: crate::core::ids::EventId::new_at(at, [n; 10]),
            site: SiteId::parse("s").expect("site"),
            source: Source::Web,
            kind: HitKind::Pageview,
            page: PagePath::parse("/a").expect("page"),
            visitor: crate::core::ids::VisitorKey([n; 16]),
            at_ms: at.as_millisecond(),
            day: jiff::civil::date(2026, 4, 1),
            referrer: None,
            dims: Default::default(),
        }
    }

    /// With `SyncMode::Full` the ingest queue's writer commits with SQLite's own sync off and
    /// answers only after this store's sync of the WAL; while that sync runs, the next batch
    /// commits.
    #[test]
    fn a_batch_is_answered_after_the_wal_sync_and_the_next_one_commits_meanwhile() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let mut store = SqliteStore::open(&path, StoreOptions::default()).expect("open");
        let synchronous: i64 = store
            .writer
            .lock()
            .expect("writer")
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .expect("pragma");
        assert_eq!(
            synchronous, 1,
            "SQLite's own sync is NORMAL; the store syncs"
        );
        // The real WAL file, behind a sync that waits until the test lets it go.
        let (sync, began, release) = stalled_sync();
        let wal = std::fs::File::open(dir.path().join("t.sqlite-wal")).expect("wal");
        store.wal = Some(Arc::new(durable::Wal::with_sync(wal, sync)));
        let events = || -> i64 {
            Connection::open(&path)
                .expect("reader")
                .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                .expect("count")
        };
        let mut writer = store.batch_writer().expect("a batch writer");
        let (done, first) = answer();
        writer.commit(vec![record(1)], done);
        began.recv_timeout(PATIENCE).expect("the WAL sync began");
        assert_eq!(events(), 1, "committed");
        assert!(
            first.try_recv().is_err(),
            "not answered before its sync ended"
        );
        let (done, second) = answer();
        writer.commit(vec![record(2), record(1)], done);
        assert_eq!(events(), 2, "the next batch committed during the sync");
        release.send(()).expect("release");
        assert!(matches!(
            first
                .recv_timeout(PATIENCE)
                .expect("first answer")
                .as_deref(),
            Ok([Outcome::Accepted])
        ));
        began
            .recv_timeout(PATIENCE)
            .expect("a sync for the second batch");
        assert!(second.try_recv().is_err());
        release.send(()).expect("release");
        assert!(matches!(
            second
                .recv_timeout(PATIENCE)
                .expect("second answer")
                .as_deref(),
            Ok([Outcome::Accepted, Outcome::Duplicate])
        ));
        writer.finish();
    }

    /// A write is followed by a sync of the WAL only when it changed a row: the storage probe
    /// (`/readyz`, open to anyone) costs no fsync, a new site one.
    #[tokio::test]
    async fn a_write_that_changes_no_row_costs_no_sync() {
        use super::super::{Maintenance, SiteStore};
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let mut store = SqliteStore::open(
            &path,
            StoreOptions {
                min_free_bytes: 0,
                ..StoreOptions::default()
            },
        )
        .expect("open");
        let syncs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&syncs);
        let wal = std::fs::File::open(dir.path().join("t.sqlite-wal")).expect("wal");
        store.wal = Some(Arc::new(durable::Wal::with_sync(
            wal,
            Box::new(move |file| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                file.sync_data()
            }),
        )));
        let synced = || syncs.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..3 {
            store.probe().await.expect("probe");
        }
        assert_eq!(synced(), 0, "probes write nothing");
        let site = super::super::Site {
            id: SiteId::parse("s").expect("site"),
            origins: vec!["*".into()],
            zone: SiteZone::utc(),
            public: false,
            ingest_key: None,
        };
        store.put_site(&site).await.expect("put");
        assert_eq!(synced(), 1, "a new site is synced before put_site returns");
    }
}
