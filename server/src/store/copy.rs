//! `tally copy-to`: every table of a SQLite database into an empty PostgreSQL database, so an
//! operator who outgrows one machine keeps the history, the visitor sets and the salts.
//!
//! Contract:
//! - The SQLite side is read under its write lock (`BEGIN IMMEDIATE` on a connection of its
//!   own, see `sqlite::dump`), taken only once PostgreSQL's tables are locked and found empty
//!   (a busy or non-empty target never holds the file), and held until PostgreSQL has
//!   committed or rolled back: nothing can be acknowledged by a collector on the SQLite file while the copy runs
//!   (its batches wait, then fail with 503 and are retried by the snippet), so every hit
//!   acknowledged before the copy began is in the copy.
//! - The PostgreSQL side is ONE transaction (`postgres::load`): its tables are locked (a
//!   wait of at most 10 s, then a clear refusal), must be empty (the copy never merges into live data), are filled by binary `COPY`, and the
//!   identity sequences are moved past the copied ids. Any error rolls everything back.
//! - Ids are kept (sites, pages), so every counter, visitor set and raw event keeps its keys.
//!   The two schemas differ in three ways, bridged here: PostgreSQL keys counters, bases and
//!   visitor sets by site as well (taken from the page); it keeps a site's all-time visitor set
//!   as explicit rows with the whole-site scope (SQLite reads it as the prefix of the page
//!   rows); and it keeps the dedupe keys of custom events in `event_keys` (SQLite in an index
//!   of `events`). Visitor-set rows still in SQLite's journal are copied with their tables.
//! - Every copied table's row count is checked against the count SQLite expects (a row whose
//!   page is missing would otherwise vanish in a join): a difference rolls the copy back.
//! - Imported daily aggregates (`source` 2, from SQLite's import) and imported breakdowns
//!   (`imported_dims`) are copied as they are; both backends read them with summed visitors
//!   and never recount them.
//! - The import ledger is copied too, so an import re-run against PostgreSQL after the copy
//!   counts nothing twice.
//! - The analytics tables are copied with their ids: dimension tuples (`dims`) and each
//!   event's tuples and engagement, visitor numbers and sealed day segments (their
//!   dictionary ids and visitor numbers stay valid, so a day whose raw events were pruned
//!   keeps its visits); the tuple and visitor-number identities and the segment versions are
//!   moved past the copied ones. SQLite's `day_revs` is not needed by PostgreSQL (it orders
//!   seals and writes with advisory locks).

use crate::store::StoreError;

/// The PostgreSQL type of a copied column (SQLite stores every one of them as an integer,
/// text or blob).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    I64,
    I32,
    I16,
    Bool,
    /// Text, possibly NULL.
    Text,
    Bytes,
    /// A 16-byte blob as a UUID.
    Uuid,
}

/// One SQLite value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    Null,
}

/// One table of the copy: what SQLite is asked, what PostgreSQL receives.
#[derive(Debug)]
pub struct Table {
    /// The PostgreSQL table and its column list, as `COPY` takes it.
    pub pg: &'static str,
    pub cols: &'static [Col],
    /// The rows, in the column order of `pg`.
    pub select: &'static str,
    /// How many rows the copy must hold (SQLite counts them without the joins of `select`).
    pub expect: &'static str,
}

use Col::{Bool, Bytes, I16, I32, I64, Text, Uuid};

/// `v`: the per-day visitor-set rows, those still in the journal included (one text for the
/// rows and their count, so the two cannot drift apart).
macro_rules! day_rows {
    () => {
        "WITH v AS (SELECT day, scope, source, visitor FROM visits \
           UNION SELECT day, scope, source, visitor FROM set_journal WHERE day >= 0) "
    };
}

/// `r`: the all-time visitor-set rows of pages (journal included); `whole`: each site's
/// whole-site scope.
macro_rules! all_time_rows {
    () => {
        "WITH r AS (SELECT site, source, visitor, page FROM reach \
           UNION SELECT site, source, visitor, scope FROM set_journal WHERE day = -1), \
         whole AS (SELECT site, id FROM pages WHERE path = '') "
    };
}

/// Every table, parents first.
pub const TABLES: &[Table] = &[
    Table {
        pg: "sites (id, origins, timezone, public, ingest_key)",
        cols: &[Text, Text, Text, Bool, Text],
        select: "SELECT id, origins, timezone, public, ingest_key FROM sites",
        expect: "SELECT count(*) FROM sites",
    },
    Table {
        pg: "site_keys (id, name)",
        cols: &[I64, Text],
        select: "SELECT id, name FROM site_keys",
        expect: "SELECT count(*) FROM site_keys",
    },
    Table {
        pg: "pages (site, id, path)",
        cols: &[I64, I64, Text],
        select: "SELECT site, id, path FROM pages",
        expect: "SELECT count(*) FROM pages",
    },
    Table {
        pg: "page_quota (site, day, created)",
        cols: &[I64, I32, I32],
        select: "SELECT site, day, created FROM page_quota",
        expect: "SELECT count(*) FROM page_quota",
    },
    Table {
        pg: "dims (site, id, kind, value)",
        cols: &[I64, I64, I16, Text],
        select: "SELECT site, id, kind, value FROM dims",
        expect: "SELECT count(*) FROM dims",
    },
    Table {
        pg: "dim_quota (site, day, kind, created)",
        cols: &[I64, I32, I16, I32],
        select: "SELECT site, day, kind, created FROM dim_quota",
        expect: "SELECT count(*) FROM dim_quota",
    },
    Table {
        pg: "events (site, event_id, source, kind, page, name, dedupe, visitor, at_ms, day, \
             referrer, src, agent, engaged_ms, scroll)",
        cols: &[
            I64, Uuid, I16, I16, I64, Text, Text, Bytes, I64, I32, Text, I64, I64, I64, I16,
        ],
        select: "SELECT site, event_id, source, kind, page, name, dedupe, visitor, at_ms, day, \
                 referrer, src, agent, engaged_ms, scroll FROM events",
        expect: "SELECT count(*) FROM events",
    },
    Table {
        pg: "visitor_numbers (site, num, visitor)",
        cols: &[I64, I64, Bytes],
        select: "SELECT site, num, visitor FROM visitor_numbers",
        expect: "SELECT count(*) FROM visitor_numbers",
    },
    Table {
        pg: "segments (site, day, version, visits, events)",
        cols: &[I64, I32, I64, Bytes, Bytes],
        select: "SELECT site, day, version, visits, events FROM segments",
        expect: "SELECT count(*) FROM segments",
    },
    Table {
        pg: "event_keys (site, name, dedupe, event_id)",
        cols: &[I64, Text, Text, Uuid],
        select: "SELECT site, name, dedupe, event_id FROM events WHERE dedupe IS NOT NULL",
        expect: "SELECT count(*) FROM events WHERE dedupe IS NOT NULL",
    },
    Table {
        pg: "visits (site, day, scope, source, visitor)",
        cols: &[I64, I32, I64, I16, Bytes],
        select: concat!(
            day_rows!(),
            "SELECT p.site, v.day, v.scope, v.source, v.visitor FROM v \
             JOIN pages p ON p.id = v.scope"
        ),
        expect: concat!(day_rows!(), "SELECT count(*) FROM v"),
    },
    Table {
        // The pages' all-time sets, then each site's own (its whole-site scope, page ''). A
        // whole-site row SQLite already holds (left by the v1 migration) is in the second part.
        pg: "reach (site, source, visitor, page)",
        cols: &[I64, I16, Bytes, I64],
        select: concat!(
            all_time_rows!(),
            "SELECT site, source, visitor, page FROM r WHERE page NOT IN (SELECT id FROM whole) \
             UNION ALL \
             SELECT s.site, s.source, s.visitor, w.id FROM \
               (SELECT DISTINCT site, source, visitor FROM r) s JOIN whole w ON w.site = s.site"
        ),
        expect: concat!(
            all_time_rows!(),
            "SELECT (SELECT count(*) FROM r WHERE page NOT IN (SELECT id FROM whole)) \
               + (SELECT count(*) FROM (SELECT DISTINCT site, source, visitor FROM r))"
        ),
    },
    Table {
        pg: "counters (site, scope, source, day, views, visitors)",
        cols: &[I64, I64, I16, I32, I64, I64],
        select: "SELECT p.site, c.scope, c.source, c.day, c.views, c.visitors FROM counters c \
                 JOIN pages p ON p.id = c.scope",
        expect: "SELECT count(*) FROM counters",
    },
    Table {
        pg: "event_counters (site, name, day, count)",
        cols: &[I64, Text, I32, I64],
        select: "SELECT site, name, day, count FROM event_counters",
        expect: "SELECT count(*) FROM event_counters",
    },
    Table {
        pg: "referrer_counters (site, day, host, views)",
        cols: &[I64, I32, Text, I64],
        select: "SELECT site, day, host, views FROM referrer_counters",
        expect: "SELECT count(*) FROM referrer_counters",
    },
    Table {
        pg: "imported_dims (site, dim, day, value, visitors, visits, pageviews, events, bounces, \
             visit_duration)",
        cols: &[I64, Text, I32, Text, I64, I64, I64, I64, I64, I64],
        select: "SELECT site, dim, day, value, visitors, visits, pageviews, events, bounces, \
                 visit_duration FROM imported_dims",
        expect: "SELECT count(*) FROM imported_dims",
    },
    Table {
        pg: "bases (site, scope, views, visitors)",
        cols: &[I64, I64, I64, I64],
        select: "SELECT p.site, b.scope, b.views, b.visitors FROM bases b \
                 JOIN pages p ON p.id = b.scope",
        expect: "SELECT count(*) FROM bases",
    },
    Table {
        pg: "filtered (site, day, reason, count)",
        cols: &[I64, I32, I16, I64],
        select: "SELECT site, day, reason, count FROM filtered",
        expect: "SELECT count(*) FROM filtered",
    },
    Table {
        pg: "salts (day, salt)",
        cols: &[I32, Bytes],
        select: "SELECT day, salt FROM salts",
        expect: "SELECT count(*) FROM salts",
    },
    Table {
        pg: "import_ledger (event_id)",
        cols: &[Uuid],
        select: "SELECT event_id FROM import_ledger",
        expect: "SELECT count(*) FROM import_ledger",
    },
    Table {
        pg: "shares (id, site, token_hash, password_hash, created_ms, expires_ms)",
        cols: &[Text, Text, Bytes, Text, I64, I64],
        select: "SELECT id, site, token_hash, password_hash, created_ms, expires_ms FROM shares",
        expect: "SELECT count(*) FROM shares",
    },
    Table {
        pg: "reports (site, recipient, every, created_ms)",
        cols: &[Text, Text, Text, I64],
        select: "SELECT site, recipient, every, created_ms FROM reports",
        expect: "SELECT count(*) FROM reports",
    },
    Table {
        pg: "report_sends (site, recipient, every, period, holder, lease_until_ms, attempts, \
             next_try_ms, sent_ms, last_error)",
        cols: &[Text, Text, Text, Text, Text, I64, I32, I64, I64, Text],
        select: "SELECT site, recipient, every, period, holder, lease_until_ms, attempts, \
                 next_try_ms, sent_ms, last_error FROM report_sends",
        expect: "SELECT count(*) FROM report_sends",
    },
    Table {
        pg: "meta (key, value)",
        cols: &[Text, I64],
        select: "SELECT key, value FROM meta",
        expect: "SELECT count(*) FROM meta",
    },
];

impl Table {
    /// The PostgreSQL table's name.
    pub fn name(&self) -> &'static str {
        self.pg.split_once(' ').map_or(self.pg, |(name, _)| name)
    }
}

/// Rows sent from the SQLite reader to the PostgreSQL loader: a chunk of table `table`'s rows,
/// or (empty `rows`, `end`) the end of that table with the count SQLite expects.
#[derive(Debug)]
pub struct Chunk {
    /// Index into [`TABLES`].
    pub table: usize,
    pub rows: Vec<Vec<Value>>,
    /// Set on the table's last message: the rows it must have.
    pub end: Option<u64>,
}

/// Rows per chunk: bounded memory however large the database.
pub const CHUNK_ROWS: usize = 10_000;

/// Rows copied per table, in [`TABLES`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, u64)>,
}

/// A copy that cannot go on, in words an operator can act on.
pub(crate) fn refused(why: impl Into<String>) -> StoreError {
    StoreError::Invalid(why.into())
}

/// Copy everything from `sqlite` into `pg` (see the module's contract). PostgreSQL's tables
/// are locked and found empty before SQLite's write lock is taken, so a busy or non-empty
/// target never holds the SQLite file.
pub async fn sqlite_to_postgres(
    sqlite: &crate::store::sqlite::SqliteStore,
    pg: &crate::store::postgres::PgStore,
) -> Result<CopyReport, StoreError> {
    let (rows_tx, rows_rx) = tokio::sync::mpsc::channel::<Chunk>(4);
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let path = sqlite.path().to_owned();
    let reader = tokio::task::spawn_blocking(move || -> Result<bool, StoreError> {
        // No go: the loader stopped before it was ready (its error says why).
        if go_rx.recv().is_err() {
            return Ok(false);
        }
        let dump = crate::store::sqlite::Dump::open(&path)?;
        let sent = dump.read_all(&rows_tx)?;
        drop(rows_tx);
        // Hold SQLite's write lock until PostgreSQL committed or gave up.
        let _ = release_rx.recv();
        drop(dump);
        Ok(sent)
    });
    let loaded = pg
        .load(rows_rx, move || {
            let _ = go_tx.send(());
        })
        .await;
    let _ = release_tx.send(());
    let read = reader
        .await
        .map_err(|e| StoreError::Unavailable(format!("the SQLite reader stopped: {e}")))?;
    // A reader that failed explains a load that ended early: its error first. A reader that
    // found its channel closed (`false`) stopped because the loader did: the loader's error.
    read?;
    Ok(CopyReport { tables: loaded? })
}
