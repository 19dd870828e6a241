//! The embedded backend: one SQLite file, no other process.
//!
//! Contract, beyond [`Store`]'s:
//! - WAL journal; `synchronous=FULL` by default, so a committed batch survives `kill -9` and
//!   power loss (`NORMAL` survives `kill -9` only, and is faster).
//! - One writer connection (SQLite has one writer anyway); several read-only connections so
//!   counts and dashboards never wait for a commit. Every call runs on the blocking pool.
//! - Dedupe is the primary key of `events` (the UUIDv7 event id) and a partial unique index on
//!   (site, name, dedupe); `INSERT OR IGNORE` plus the changed-row count decides the outcome.

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

/// Counter increments of one batch: (site, source, page, day) → (views, new visitors).
type Deltas<'a> = HashMap<(&'a str, i64, &'a str, String), (i64, i64)>;

fn commit_batch(
    conn: &mut Connection,
    seen: &mut SeenVisitors,
    records: &[Record],
) -> Result<Vec<Outcome>, StoreError> {
    // Visitor rows this batch writes; remembered in `seen` only once the batch has committed.
    let mut written: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut outcomes = Vec::with_capacity(records.len());
    {
        let mut insert_event = tx.prepare_cached(
            "INSERT OR IGNORE INTO events (event_id, site, source, kind, page, name, dedupe, \
             visitor, at_ms, day, referrer) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?;
        let mut insert_visitor = tx.prepare_cached(
            "INSERT OR IGNORE INTO visitors (site, source, page, day, visitor) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut bump_event = tx.prepare_cached(
            "INSERT INTO event_counters (site, name, day, count) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (site, name, day) DO UPDATE SET count = count + 1",
        )?;
        // Counters are summed in memory and written once per key at the end of the batch: a
        // batch of hits on few pages touches few counter rows.
        let mut deltas: Deltas<'_> = HashMap::new();
        for r in records {
            let day = day_key(r.day);
            let (kind, name, dedupe) = match &r.kind {
                HitKind::Pageview => (KIND_PAGEVIEW, None, None),
                HitKind::Event { name, dedupe } => (
                    KIND_EVENT,
                    Some(name.as_str()),
                    dedupe.as_ref().map(|d| d.as_str()),
                ),
            };
            let inserted = insert_event.execute(params![
                &r.event_id.as_bytes()[..],
                r.site.as_str(),
                r.source.code(),
                kind,
                r.page.as_str(),
                name,
                dedupe,
                &r.visitor.0[..],
                r.at_ms,
                day,
                r.referrer,
            ])?;
            if inserted == 0 {
                outcomes.push(Outcome::Duplicate);
                continue;
            }
            outcomes.push(Outcome::Accepted);
            if let Some(name) = name {
                for d in [day.as_str(), ALL_TIME] {
                    bump_event.execute(params![r.site.as_str(), name, d])?;
                }
                continue;
            }
            let (site, source) = (r.site.as_str(), r.source.code());
            for page in [r.page.as_str(), WHOLE_SITE] {
                for d in [day.as_str(), ALL_TIME] {
                    let key = seen.key(site, source, page, d, &r.visitor.0);
                    let new = if seen.contains(key) || !written.insert(key) {
                        0
                    } else {
                        insert_visitor.execute(params![site, source, page, d, &r.visitor.0[..]])?
                    };
                    let delta = deltas
                        .entry((site, source, page, d.to_owned()))
                        .or_default();
                    delta.0 += 1;
                    delta.1 += new as i64;
                }
            }
        }
        let mut bump_counter = tx.prepare_cached(
            "INSERT INTO counters (site, source, page, day, views, visitors) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (site, source, page, day) \
             DO UPDATE SET views = views + excluded.views, visitors = visitors + excluded.visitors",
        )?;
        for ((site, source, page, day), (views, visitors)) in deltas {
            bump_counter.execute(params![site, source, page, day, views, visitors])?;
        }
    }
    tx.commit()?;
    for key in written {
        seen.insert(key);
    }
    Ok(outcomes)
}

fn read_counts(
    conn: &Connection,
    site: &str,
    page: &str,
    today: &str,
) -> Result<CountsRaw, StoreError> {
    let mut raw = CountsRaw::default();
    let mut stmt = conn.prepare_cached(
        "SELECT source, page, day, views, visitors FROM counters \
         WHERE site = ?1 AND page IN ('', ?2) AND day IN ('*', ?3)",
    )?;
    let mut rows = stmt.query(params![site, page, today])?;
    while let Some(row) = rows.next()? {
        let source: i64 = row.get(0)?;
        let row_page: String = row.get(1)?;
        let row_day: String = row.get(2)?;
        let numbers = Numbers {
            views: row.get::<_, i64>(3)? as u64,
            visitors: row.get::<_, i64>(4)? as u64,
        };
        // A page key is never empty, so `row_page == ""` means the whole site.
        let targets: [(bool, &mut BySource); 2] = if row_day == ALL_TIME {
            [
                (row_page.is_empty(), &mut raw.site_all),
                (row_page == page, &mut raw.page_all),
            ]
        } else {
            [
                (row_page.is_empty(), &mut raw.site_today),
                (row_page == page, &mut raw.page_today),
            ]
        };
        for (hit, scope) in targets {
            if hit {
                if source == Source::Badge.code() {
                    scope.badge = numbers;
                } else {
                    scope.web = numbers;
                }
            }
        }
    }
    let mut stmt = conn.prepare_cached(
        "SELECT page, views, visitors FROM bases WHERE site = ?1 AND page IN ('', ?2)",
    )?;
    let mut rows = stmt.query(params![site, page])?;
    while let Some(row) = rows.next()? {
        let row_page: String = row.get(0)?;
        let numbers = Numbers {
            views: row.get::<_, i64>(1)? as u64,
            visitors: row.get::<_, i64>(2)? as u64,
        };
        if row_page.is_empty() {
            raw.site_base = numbers;
        } else {
            raw.page_base = numbers;
        }
    }
    Ok(raw)
}

fn site_from_row(row: &rusqlite::Row<'_>) -> Result<Site, StoreError> {
    let id: String = row.get(0)?;
    let origins: String = row.get(1)?;
    let tz: String = row.get(2)?;
    let public: bool = row.get(3)?;
    Ok(Site {
        id: SiteId::parse(&id).map_err(|e| StoreError::Invalid(format!("site {id:?}: {e}")))?,
        origins: serde_json::from_str(&origins)
            .map_err(|e| StoreError::Invalid(format!("origins of {id:?}: {e}")))?,
        zone: SiteZone::parse(&tz).map_err(|e| StoreError::Invalid(e.to_string()))?,
        public,
    })
}

fn query_sites(conn: &Connection, id: Option<&str>) -> Result<Vec<Site>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, origins, timezone, public FROM sites WHERE ?1 IS NULL OR id = ?1 ORDER BY id",
    )?;
    let mut rows = stmt.query(params![id])?;
    let mut sites = Vec::new();
    while let Some(row) = rows.next()? {
        sites.push(site_from_row(row)?);
    }
    Ok(sites)
}

fn insert_site(conn: &Connection, site: &Site, replace: bool) -> Result<(), StoreError> {
    let origins = serde_json::to_string(&site.origins).map_err(backend)?;
    let verb = if replace {
        "INSERT OR REPLACE"
    } else {
        "INSERT OR IGNORE"
    };
    conn.execute(
        &format!("{verb} INTO sites (id, origins, timezone, public) VALUES (?1, ?2, ?3, ?4)"),
        params![site.id.as_str(), origins, site.zone.name(), site.public],
    )?;
    Ok(())
}

/// The recount of every counter from raw events: (site, source, page, day, views, visitors).
const RECOUNT: &str = "
    SELECT site, source, page, day, COUNT(*) AS views, COUNT(DISTINCT visitor) AS visitors
        FROM events WHERE kind = 0 GROUP BY site, source, page, day
    UNION ALL SELECT site, source, '', day, COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source, day
    UNION ALL SELECT site, source, page, '*', COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source, page
    UNION ALL SELECT site, source, '', '*', COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source";

/// The recount of custom-event counters, shaped like [`RECOUNT`] (name in `page`, source -1).
const RECOUNT_EVENTS: &str = "
    SELECT site, -1 AS source, name AS page, day, COUNT(*) AS views, 0 AS visitors
        FROM events WHERE kind = 1 GROUP BY site, name, day
    UNION ALL SELECT site, -1, name, '*', COUNT(*), 0 FROM events WHERE kind = 1 GROUP BY site, name";

const STORED: &str = "SELECT site, source, page, day, views, visitors FROM counters";
const STORED_EVENTS: &str = "SELECT site, -1, name, day, count, 0 FROM event_counters";

fn compare(
    conn: &Connection,
    stored: &str,
    recount: &str,
    keep: &dyn Fn(&str) -> bool,
    report: &mut VerifyReport,
) -> Result<(), StoreError> {
    let sql = format!(
        "WITH s(site, source, page, day, views, visitors) AS ({stored}),
              r(site, source, page, day, views, visitors) AS ({recount})
         SELECT COALESCE(s.site, r.site), COALESCE(s.source, r.source), COALESCE(s.page, r.page),
                COALESCE(s.day, r.day), s.views, s.visitors, r.views, r.visitors
         FROM s FULL OUTER JOIN r ON s.site = r.site AND s.source = r.source
              AND s.page = r.page AND s.day = r.day"
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let day: String = row.get(3)?;
        if !keep(&day) {
            continue;
        }
        report.checked += 1;
        let stored = (
            row.get::<_, Option<i64>>(4)?.unwrap_or(0),
            row.get::<_, Option<i64>>(5)?.unwrap_or(0),
        );
        let recounted = (
            row.get::<_, Option<i64>>(6)?.unwrap_or(0),
            row.get::<_, Option<i64>>(7)?.unwrap_or(0),
        );
        if stored != recounted {
            let site: String = row.get(0)?;
            let source: i64 = row.get(1)?;
            let page: String = row.get(2)?;
            report.drift.push(Drift {
                key: format!("{site}/{source}/{page}/{day}"),
                stored,
                recounted,
            });
        }
    }
    Ok(())
}

fn verify(conn: &mut Connection, repair: bool) -> Result<VerifyReport, StoreError> {
    let tx = conn.transaction_with_behavior(if repair {
        TransactionBehavior::Immediate
    } else {
        TransactionBehavior::Deferred
    })?;
    // After pruning, all-time rows and days up to the pruned one can no longer be recounted.
    let pruned_day: Option<String> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'pruned_before_ms'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms + 86_400_000).ok())
        .map(|ts| day_key(SiteZone::utc().day_of(ts)));
    let keep = |day: &str| match &pruned_day {
        None => true,
        Some(cut) => day != ALL_TIME && day > cut.as_str(),
    };
    let mut report = VerifyReport::default();
    compare(&tx, STORED, RECOUNT, &keep, &mut report)?;
    compare(&tx, STORED_EVENTS, RECOUNT_EVENTS, &keep, &mut report)?;
    if repair && !report.drift.is_empty() {
        let (day_filter, visitor_filter) = match &pruned_day {
            None => (String::new(), String::new()),
            Some(cut) => (
                format!(" WHERE day > '{cut}' AND day != '*'"),
                format!(" AND day > '{cut}'"),
            ),
        };
        tx.execute_batch(&format!(
            "DELETE FROM counters{day_filter};
             DELETE FROM event_counters{day_filter};
             DELETE FROM visitors{day_filter};
             INSERT INTO counters SELECT * FROM ({RECOUNT}){day_filter};
             INSERT INTO event_counters SELECT site, page, day, views FROM ({RECOUNT_EVENTS}){day_filter};
             INSERT OR IGNORE INTO visitors
                 SELECT site, source, page, day, visitor FROM events WHERE kind = 0{visitor_filter}
                 UNION SELECT site, source, '', day, visitor FROM events WHERE kind = 0{visitor_filter};"
        ))?;
        if pruned_day.is_none() {
            tx.execute_batch(
                "INSERT OR IGNORE INTO visitors
                     SELECT site, source, page, '*', visitor FROM events WHERE kind = 0
                     UNION SELECT site, source, '', '*', visitor FROM events WHERE kind = 0;",
            )?;
        }
        report.repaired = true;
    }
    tx.commit()?;
    Ok(report)
}

fn numbers(views: i64, visitors: i64) -> Numbers {
    Numbers {
        views: views.max(0) as u64,
        visitors: visitors.max(0) as u64,
    }
}

fn set_source(target: &mut BySource, source: i64, n: Numbers) {
    if source == Source::Badge.code() {
        target.badge = n;
    } else {
        target.web = n;
    }
}

fn read_series(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
) -> Result<Vec<DayRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT day, source, views, visitors FROM counters \
         WHERE site = ?1 AND page = '' AND day != '*' AND day BETWEEN ?2 AND ?3 ORDER BY day",
    )?;
    let mut rows = stmt.query(params![site, from, to])?;
    let mut out: Vec<DayRow> = Vec::new();
    while let Some(row) = rows.next()? {
        let day: String = row.get(0)?;
        let day: Date = day
            .parse()
            .map_err(|e| StoreError::Invalid(format!("day {day:?}: {e}")))?;
        let n = numbers(row.get(2)?, row.get(3)?);
        if out.last().is_none_or(|last| last.day != day) {
            out.push(DayRow {
                day,
                numbers: BySource::default(),
            });
        }
        if let Some(last) = out.last_mut() {
            set_source(&mut last.numbers, row.get(1)?, n);
        }
    }
    Ok(out)
}

fn read_range_totals(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
) -> Result<BySource, StoreError> {
    let mut out = BySource::default();
    let mut stmt = conn.prepare_cached(
        "SELECT source, SUM(views) FROM counters \
         WHERE site = ?1 AND page = '' AND day != '*' AND day BETWEEN ?2 AND ?3 GROUP BY source",
    )?;
    let mut views = HashMap::new();
    let mut rows = stmt.query(params![site, from, to])?;
    while let Some(row) = rows.next()? {
        views.insert(row.get::<_, i64>(0)?, row.get::<_, i64>(1)?);
    }
    // Distinct visitors over several days: exact, from the per-day visitor sets.
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(DISTINCT visitor) FROM visitors \
         WHERE site = ?1 AND source = ?2 AND page = '' AND day != '*' AND day BETWEEN ?3 AND ?4",
    )?;
    for (source, views) in views {
        let visitors: i64 = stmt.query_row(params![site, source, from, to], |r| r.get(0))?;
        set_source(&mut out, source, numbers(views, visitors));
    }
    Ok(out)
}

fn read_top_pages(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
    limit: u32,
) -> Result<Vec<PageRow>, StoreError> {
    // Rank by the shown number (the larger source), then fill exact visitors per page.
    let mut stmt = conn.prepare_cached(
        "SELECT page, source, SUM(views) FROM counters \
         WHERE site = ?1 AND page != '' AND day != '*' AND day BETWEEN ?2 AND ?3 \
         GROUP BY page, source",
    )?;
    let mut by_page: HashMap<String, BySource> = HashMap::new();
    let mut rows = stmt.query(params![site, from, to])?;
    while let Some(row) = rows.next()? {
        let entry = by_page.entry(row.get(0)?).or_default();
        set_source(entry, row.get(1)?, numbers(row.get(2)?, 0));
    }
    let mut pages: Vec<PageRow> = by_page
        .into_iter()
        .map(|(page, numbers)| PageRow { page, numbers })
        .collect();
    pages.sort_by(|a, b| {
        let key = |p: &PageRow| p.numbers.web.views.max(p.numbers.badge.views);
        key(b).cmp(&key(a)).then_with(|| a.page.cmp(&b.page))
    });
    pages.truncate(limit as usize);
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(DISTINCT visitor) FROM visitors \
         WHERE site = ?1 AND source = ?2 AND page = ?3 AND day != '*' AND day BETWEEN ?4 AND ?5",
    )?;
    for p in &mut pages {
        for (source, n) in [
            (Source::Web, &mut p.numbers.web),
            (Source::Badge, &mut p.numbers.badge),
        ] {
            if n.views > 0 {
                let v: i64 =
                    stmt.query_row(params![site, source.code(), p.page, from, to], |r| r.get(0))?;
                n.visitors = v.max(0) as u64;
            }
        }
    }
    Ok(pages)
}

/// The smallest UUIDv7 key of an instant: ids at or after `ms` sort at or after it.
fn id_bound(ms: i64) -> [u8; 16] {
    let mut bound = [0u8; 16];
    bound[..6].copy_from_slice(&u64::try_from(ms).unwrap_or(0).to_be_bytes()[2..]);
    bound
}

fn read_top_referrers(
    conn: &Connection,
    site: &str,
    (from, to): (&str, &str),
    (lo, hi): ([u8; 16], [u8; 16]),
    limit: u32,
) -> Result<Vec<ReferrerRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "WITH r AS (SELECT substr(referrer, instr(referrer, '://') + 3) AS rest FROM events \
                    WHERE event_id >= ?5 AND event_id < ?6 AND site = ?1 AND kind = 0 \
                      AND referrer IS NOT NULL AND day BETWEEN ?2 AND ?3) \
         SELECT CASE WHEN instr(rest, '/') > 0 THEN substr(rest, 1, instr(rest, '/') - 1) ELSE rest END \
                AS host, COUNT(*) AS n FROM r GROUP BY host ORDER BY n DESC, host LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![site, from, to, limit, &lo[..], &hi[..]], |r| {
        Ok(ReferrerRow {
            host: r.get(0)?,
            views: r.get::<_, i64>(1)?.max(0) as u64,
        })
    })?;
    rows.collect::<Result<_, _>>().map_err(Into::into)
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

    async fn ensure_site(&self, site: &Site) -> Result<Site, StoreError> {
        let site = site.clone();
        self.write(move |conn| {
            insert_site(conn, &site, false)?;
            query_sites(conn, Some(site.id.as_str()))?
                .pop()
                .ok_or_else(|| backend("site vanished after insert"))
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
        self.write(move |conn| verify(conn, repair)).await
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
