//! The schema (version 10, in `PRAGMA user_version`) and the migrations from versions 1 to 9.
//!
//! Contract: [`prepare`] leaves the file at version 10 or fails having changed nothing. Before
//! it migrates an existing file it copies it beside itself (`<file>.v<N>.bak`, see `backup`).
//! A fresh file gets the v10 tables. An older file runs every step from its version on, in ONE
//! transaction (each step is version N + 1 = version N plus):
//! - v10: the month rollups (`rollups`, see [`SCHEMA_V10`]), filled by the next seal pass;
//! - v9: the analytics tables (see [`SCHEMA_V9`]): each event's source and agent tuple and
//!   engagement, the interned tuples (`dims`), their daily quota, visitor numbers, day
//!   segments and imported breakdowns (`imported_dims`); events stored before it have no
//!   tuple (their dimensions read as unknown);
//! - v8: the referrer counters (`referrer_counters`, see [`schema_v8`]), filled from the raw
//!   events kept;
//! - v7: the shared links and the email reports (`shares`, `reports`, `report_sends`, see
//!   [`SCHEMA_V7`]);
//! - v6: `counters` rebuilt day first, keyed (day, scope, source) and indexed by (scope,
//!   source, day) (see [`SCHEMA_V6`]);
//! - v5: the visitor-set journal (`set_journal`, see `journal`);
//! - v4: the `filtered` table (views not counted per site, day and reason);
//! - v3: the import ledger (`import_ledger`, the ids of imported lines, so a re-run counts
//!   nothing twice even after their raw events were pruned or never kept).
//!
//! A v1 file (the text-keyed schema of the first release, which never set `user_version`) is
//! first rewritten as v2 in the same transaction with every site, salt, base, counter,
//! visitor set, custom-event counter, raw event and prune marker preserved, checked by row
//! counts before the old tables are dropped. A newer version is refused.
//!
//! Version 2 keys every growing table by small integers: sites and pages are interned once
//! (`site_keys`, `pages`; ids are never deleted nor reused), days are days since 1970-01-01
//! ([`ALL_TIME`] = -1 for all-time rows), so no row repeats a site name, page path or date.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::StoreError;

/// The schema version this code reads and writes.
pub(super) const VERSION: i64 = 10;

/// `day` of all-time rows (real days are days since 1970-01-01, never negative).
pub(super) const ALL_TIME: i64 = -1;

/// The v2 tables (the `sites` table is the v1 one plus `ingest_key`).
pub(super) const SCHEMA_V2: &str = r"
CREATE TABLE IF NOT EXISTS sites (
    id TEXT PRIMARY KEY,
    origins TEXT NOT NULL,
    timezone TEXT NOT NULL,
    public INTEGER NOT NULL,
    ingest_key TEXT
);
-- Every site name ever counted, configured or not, as a small integer.
CREATE TABLE IF NOT EXISTS site_keys (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
-- Scopes of counters and visitor sets: path '' = the whole site, '(other)' = the pages beyond
-- the daily page cap, else a page path.
CREATE TABLE IF NOT EXISTS pages (
    id INTEGER PRIMARY KEY, site INTEGER NOT NULL, path TEXT NOT NULL, UNIQUE (site, path)
);
-- Pages created per site and local day, for the page cap.
CREATE TABLE IF NOT EXISTS page_quota (
    site INTEGER NOT NULL, day INTEGER NOT NULL, created INTEGER NOT NULL,
    PRIMARY KEY (site, day)
) WITHOUT ROWID;
-- Raw events; `page` is the scope the view was counted under (the page, or '(other)').
CREATE TABLE IF NOT EXISTS events (
    event_id BLOB PRIMARY KEY,
    site INTEGER NOT NULL,
    source INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    page INTEGER NOT NULL,
    name TEXT,
    dedupe TEXT,
    visitor BLOB NOT NULL,
    at_ms INTEGER NOT NULL,
    day INTEGER NOT NULL,
    referrer TEXT
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_dedupe ON events (site, name, dedupe) WHERE dedupe IS NOT NULL;
-- Per-day visitor sets of every scope; day first, so today's rows are one region of the
-- b-tree and pruning old days is a range at its start.
CREATE TABLE IF NOT EXISTS visits (
    day INTEGER NOT NULL, scope INTEGER NOT NULL, source INTEGER NOT NULL, visitor BLOB NOT NULL,
    PRIMARY KEY (day, scope, source, visitor)
) WITHOUT ROWID;
-- All-time visitor sets: (site, source, visitor, page) is the page's set, and its prefix
-- (site, source, visitor) is the whole site's.
CREATE TABLE IF NOT EXISTS reach (
    site INTEGER NOT NULL, source INTEGER NOT NULL, visitor BLOB NOT NULL, page INTEGER NOT NULL,
    PRIMARY KEY (site, source, visitor, page)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    scope INTEGER NOT NULL, source INTEGER NOT NULL, day INTEGER NOT NULL,
    views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (scope, source, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_counters (
    site INTEGER NOT NULL, name TEXT NOT NULL, day INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (site, name, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bases (
    scope INTEGER PRIMARY KEY, views INTEGER NOT NULL, visitors INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS salts (day INTEGER PRIMARY KEY, salt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
";

/// Added by v3: the event id of every line or row `tally import` counted (raw event kept or
/// not), the dedupe of imports.
pub(super) const SCHEMA_V3: &str = r"
CREATE TABLE IF NOT EXISTS import_ledger (event_id BLOB PRIMARY KEY) WITHOUT ROWID;
";

/// Added by v4: views not counted, per site, local day and reason (`core::filtered`); at most
/// four rows per site and day.
pub(super) const SCHEMA_V4: &str = r"
CREATE TABLE IF NOT EXISTS filtered (
    site INTEGER NOT NULL, day INTEGER NOT NULL, reason INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (site, day, reason)
) WITHOUT ROWID;
";

/// Added by v5: visitor-set rows decided but not yet in `visits` (`day` >= 0) or `reach`
/// (`day` = -1, `scope` = the page), appended in `seq` order and moved in bulk (`journal`).
pub(super) const SCHEMA_V5: &str = r"
CREATE TABLE IF NOT EXISTS set_journal (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    day INTEGER NOT NULL, scope INTEGER NOT NULL, source INTEGER NOT NULL,
    visitor BLOB NOT NULL, site INTEGER NOT NULL
);
";

/// v6: `counters` keyed day first, (day, scope, source), plus an index (scope, source, day)
/// for reads of one scope over a range. Keyed scope first (v2–v5), today's rows of different
/// pages lay a whole history of rows apart, so each batch's upserts dirtied about a leaf page
/// per page viewed (measured: a year of history cost the hot path ~16 %,
/// `scripts/bench-aged.sh`); day first, they are neighbours. The index gets an entry only
/// when a row is created (a scope's first view of a day), never on the upserts that follow.
pub(super) const SCHEMA_V6: &str = r"
CREATE TABLE counters_v6 (
    day INTEGER NOT NULL, scope INTEGER NOT NULL, source INTEGER NOT NULL,
    views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (day, scope, source)
) WITHOUT ROWID;
INSERT INTO counters_v6 (day, scope, source, views, visitors)
    SELECT day, scope, source, views, visitors FROM counters ORDER BY day, scope, source;
DROP TABLE counters;
ALTER TABLE counters_v6 RENAME TO counters;
CREATE INDEX counters_scope ON counters (scope, source, day);
";

/// v7: shared read-only links to a site's dashboard, and email reports with one row per
/// report and period (the lease that makes several collectors send it once, and its outcome).
pub(super) const SCHEMA_V7: &str = r"
-- A shared link: `id` is the public name (`tally site unshare`), the URL carries a secret
-- token of which only the SHA-256 is kept; `password_hash` is a PHC string or NULL.
CREATE TABLE IF NOT EXISTS shares (
    id TEXT PRIMARY KEY,
    site TEXT NOT NULL,
    token_hash BLOB NOT NULL UNIQUE,
    password_hash TEXT,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER
);
CREATE INDEX IF NOT EXISTS shares_site ON shares (site);
-- A scheduled report: `every` is 'week' or 'month'.
CREATE TABLE IF NOT EXISTS reports (
    site TEXT NOT NULL, recipient TEXT NOT NULL, every TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (site, recipient, every)
) WITHOUT ROWID;
-- One report's send for one period (`period` = its first day, YYYY-MM-DD): the collector
-- `holder` owns it until `lease_until_ms`; `sent_ms` is set once it went out.
CREATE TABLE IF NOT EXISTS report_sends (
    site TEXT NOT NULL, recipient TEXT NOT NULL, every TEXT NOT NULL, period TEXT NOT NULL,
    holder TEXT NOT NULL, lease_until_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL, next_try_ms INTEGER NOT NULL,
    sent_ms INTEGER, last_error TEXT,
    PRIMARY KEY (site, recipient, every, period)
) WITHOUT ROWID;
";

/// The host of `events.referrer` in SQL, the rule of `core::hit::referrer_host`.
pub(super) const REFERRER_HOST: &str = "CASE WHEN instr(substr(referrer, instr(referrer, '://') + 3), '/') > 0 \
     THEN substr(substr(referrer, instr(referrer, '://') + 3), 1, \
                 instr(substr(referrer, instr(referrer, '://') + 3), '/') - 1) \
     ELSE substr(referrer, instr(referrer, '://') + 3) END";

/// v8: page views with a referrer per site, local day and referring host, written in the
/// batch that stores the views (so top referrers read a few rows per day instead of every raw
/// event, and outlive the raw events' retention), filled here from the raw events kept.
fn schema_v8() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS referrer_counters (
             site INTEGER NOT NULL, day INTEGER NOT NULL, host TEXT NOT NULL,
             views INTEGER NOT NULL,
             PRIMARY KEY (site, day, host)
         ) WITHOUT ROWID;
         INSERT INTO referrer_counters (site, day, host, views)
             SELECT site, day, {REFERRER_HOST} AS host, COUNT(*) FROM events
             WHERE kind = 0 AND referrer IS NOT NULL GROUP BY site, day, host;"
    )
}

/// v9: what visits are broken down by (`core::dims`, `core::segment`).
pub(super) const SCHEMA_V9: &str = r"
-- Per event: its source and agent tuple (ids of `dims`; NULL before v9 or none recorded), and
-- for page views the largest engaged time (ms) and scroll depth (percent) reported for them.
ALTER TABLE events ADD COLUMN src INTEGER;
ALTER TABLE events ADD COLUMN agent INTEGER;
ALTER TABLE events ADD COLUMN engaged_ms INTEGER;
ALTER TABLE events ADD COLUMN scroll INTEGER;
-- Interned dimension tuples of a site: kind 1 = where a visit came from (referrer, source,
-- channel, campaign tags), 2 = what it was made with (browser, OS, device, country); `value`
-- is the tuple's stored form. Never deleted, so ids are never reused.
CREATE TABLE IF NOT EXISTS dims (
    id INTEGER PRIMARY KEY, site INTEGER NOT NULL, kind INTEGER NOT NULL, value TEXT NOT NULL,
    UNIQUE (site, kind, value)
);
-- Tuples created per site, local day and kind, for the tuple cap.
CREATE TABLE IF NOT EXISTS dim_quota (
    site INTEGER NOT NULL, day INTEGER NOT NULL, kind INTEGER NOT NULL, created INTEGER NOT NULL,
    PRIMARY KEY (site, day, kind)
) WITHOUT ROWID;
-- Each visitor key of a site as a small number (assigned when a day is sealed), so day
-- segments hold 4-byte numbers and range visitors are unions of bitmaps.
CREATE TABLE IF NOT EXISTS visitor_numbers (
    num INTEGER PRIMARY KEY, site INTEGER NOT NULL, visitor BLOB NOT NULL, UNIQUE (site, visitor)
);
-- A sealed day of a site (`core::segment`): its visits part and its events part, stored
-- once the day is over (a later write to the day deletes the row; it is sealed again), rebuilt
-- from the raw events by verify, kept after they are pruned. `version` is new at every seal.
CREATE TABLE IF NOT EXISTS segments (
    site INTEGER NOT NULL, day INTEGER NOT NULL, version INTEGER NOT NULL,
    visits BLOB NOT NULL, events BLOB NOT NULL, PRIMARY KEY (site, day)
);
-- Writes per site and local day (raised by every batch that stores or updates an event of
-- the day), so a seal that raced a write is not stored.
CREATE TABLE IF NOT EXISTS day_revs (
    site INTEGER NOT NULL, day INTEGER NOT NULL, rev INTEGER NOT NULL, PRIMARY KEY (site, day)
) WITHOUT ROWID;
-- Imported breakdowns (`store::imported`): another tool's daily numbers per site, table
-- (`dim`: 'visitors', 'sources', 'browsers', ...), local day and value tuple; set by
-- `tally import`, never recounted nor pruned. Keyed table first, so one table over a range
-- is one range of the b-tree.
CREATE TABLE IF NOT EXISTS imported_dims (
    site INTEGER NOT NULL, dim TEXT NOT NULL, day INTEGER NOT NULL, value TEXT NOT NULL,
    visitors INTEGER NOT NULL, visits INTEGER NOT NULL, pageviews INTEGER NOT NULL,
    events INTEGER NOT NULL, bounces INTEGER NOT NULL, visit_duration INTEGER NOT NULL,
    PRIMARY KEY (site, dim, day, value)
) WITHOUT ROWID;
";

/// v10: month rollups (`store::rollups`).
pub(super) const SCHEMA_V10: &str = r"
-- One question's state over the sealed days of one local month of a site (`store::rollups`):
-- `month` is the day number of its first day, `key` its zone and counting key, `days` the
-- sealed days it counted with their versions. Replaced by the seal pass, recounted by verify.
CREATE TABLE IF NOT EXISTS rollups (
    site INTEGER NOT NULL, month INTEGER NOT NULL, key TEXT NOT NULL, days BLOB NOT NULL,
    state BLOB NOT NULL, PRIMARY KEY (site, month, key)
);
";

/// A v1 day text (`2026-04-01`, or `*` for all time) as a v2 day number.
const DAY: &str = "CASE WHEN {d} = '*' THEN -1 ELSE unixepoch({d}) / 86400 END";

fn day(column: &str) -> String {
    DAY.replace("{d}", column)
}

/// The step from version N to N + 1, for N = 2 up to [`VERSION`] − 1, in order.
fn steps() -> [String; 8] {
    [
        SCHEMA_V3.to_owned(),
        SCHEMA_V4.to_owned(),
        SCHEMA_V5.to_owned(),
        SCHEMA_V6.to_owned(),
        SCHEMA_V7.to_owned(),
        schema_v8(),
        SCHEMA_V9.to_owned(),
        SCHEMA_V10.to_owned(),
    ]
}

/// Bring the file at `conn` (opened from `path`) to [`VERSION`].
pub(super) fn prepare(conn: &mut Connection, path: &std::path::Path) -> Result<(), StoreError> {
    // The copy is made outside the transaction (VACUUM cannot run inside one), before it.
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let has_tables: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table')",
        [],
        |r| r.get(0),
    )?;
    if version < VERSION && has_tables {
        super::backup::backup_before_migration(conn, path, version.max(1))?;
    }
    // Decided inside the write transaction, so two stores opening one file at once agree.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    match version {
        VERSION => return Ok(()),
        2..VERSION => {
            for step in &steps()[(version - 2) as usize..] {
                tx.execute_batch(step)?;
            }
        }
        0 => {
            let v1: Option<String> = tx
                .query_row(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name = 'visitors'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            if v1.is_some() {
                migrate_v1(&tx)?;
            } else {
                tx.execute_batch(SCHEMA_V2)?;
            }
            for step in &steps() {
                tx.execute_batch(step)?;
            }
        }
        newer => {
            return Err(StoreError::Invalid(format!(
                "database schema version {newer} is newer than this tally ({VERSION})"
            )));
        }
    }
    tx.pragma_update(None, "user_version", VERSION)?;
    tx.commit()?;
    Ok(())
}

/// What the migration must carry over, counted in v1 (after the renames) and in v2.
const V1_ROWS: [&str; 8] = [
    "SELECT COUNT(*) FROM v1_events",
    "SELECT COUNT(*) FROM v1_counters",
    "SELECT COUNT(*) FROM v1_event_counters",
    "SELECT COUNT(*) FROM v1_bases",
    "SELECT COUNT(*) FROM v1_salts",
    "SELECT COUNT(*) FROM sites",
    "SELECT COUNT(*) FROM v1_visitors WHERE day != '*'",
    "SELECT COUNT(*) FROM v1_visitors WHERE day = '*' AND page != ''",
];
const V2_ROWS: [&str; 8] = [
    "SELECT COUNT(*) FROM events",
    "SELECT COUNT(*) FROM counters",
    "SELECT COUNT(*) FROM event_counters",
    "SELECT COUNT(*) FROM bases",
    "SELECT COUNT(*) FROM salts",
    "SELECT COUNT(*) FROM sites",
    "SELECT COUNT(*) FROM visits",
    "SELECT COUNT(*) FROM reach r JOIN pages p ON p.id = r.page WHERE p.path != ''",
];

fn count_rows(tx: &Connection, queries: &[&str; 8]) -> Result<[i64; 8], StoreError> {
    let mut out = [0i64; 8];
    for (slot, sql) in out.iter_mut().zip(queries) {
        *slot = tx.query_row(sql, [], |r| r.get(0))?;
    }
    Ok(out)
}

/// v1 → v2, inside the caller's transaction.
fn migrate_v1(tx: &Connection) -> Result<(), StoreError> {
    tx.execute_batch(
        "DROP INDEX IF EXISTS events_dedupe;
         DROP INDEX IF EXISTS events_site_day;
         ALTER TABLE events RENAME TO v1_events;
         ALTER TABLE visitors RENAME TO v1_visitors;
         ALTER TABLE counters RENAME TO v1_counters;
         ALTER TABLE event_counters RENAME TO v1_event_counters;
         ALTER TABLE bases RENAME TO v1_bases;
         ALTER TABLE salts RENAME TO v1_salts;
         ALTER TABLE sites ADD COLUMN ingest_key TEXT;",
    )?;
    let before = count_rows(tx, &V1_ROWS)?;
    tx.execute_batch(SCHEMA_V2)?;
    let (c_day, v_day, e_day, ec_day, s_day) = (
        day("c.day"),
        day("v.day"),
        day("e.day"),
        day("c.day"),
        day("day"),
    );
    tx.execute_batch(&format!(
        "INSERT INTO site_keys (name)
             SELECT id FROM sites UNION SELECT site FROM v1_counters
             UNION SELECT site FROM v1_visitors UNION SELECT site FROM v1_events
             UNION SELECT site FROM v1_bases UNION SELECT site FROM v1_event_counters ORDER BY 1;
         INSERT INTO pages (site, path) SELECT id, '' FROM site_keys ORDER BY id;
         INSERT OR IGNORE INTO pages (site, path)
             SELECT k.id, x.page FROM (
                 SELECT site, page FROM v1_counters UNION SELECT site, page FROM v1_visitors
                 UNION SELECT site, page FROM v1_events UNION SELECT site, page FROM v1_bases
             ) x JOIN site_keys k ON k.name = x.site ORDER BY 1, 2;
         INSERT INTO counters (scope, source, day, views, visitors)
             SELECT p.id, c.source, {c_day}, c.views, c.visitors FROM v1_counters c
             JOIN site_keys k ON k.name = c.site JOIN pages p ON p.site = k.id AND p.path = c.page;
         INSERT INTO visits (day, scope, source, visitor)
             SELECT {v_day}, p.id, v.source, v.visitor FROM v1_visitors v
             JOIN site_keys k ON k.name = v.site JOIN pages p ON p.site = k.id AND p.path = v.page
             WHERE v.day != '*';
         INSERT OR IGNORE INTO reach (site, source, visitor, page)
             SELECT k.id, v.source, v.visitor, p.id FROM v1_visitors v
             JOIN site_keys k ON k.name = v.site JOIN pages p ON p.site = k.id AND p.path = v.page
             WHERE v.day = '*' AND v.page != '';
         -- A site-wide all-time visitor without any page row (v1 always wrote both, but the
         -- count must survive either way) is kept as a row under the whole-site scope.
         INSERT OR IGNORE INTO reach (site, source, visitor, page)
             SELECT k.id, v.source, v.visitor, p.id FROM v1_visitors v
             JOIN site_keys k ON k.name = v.site JOIN pages p ON p.site = k.id AND p.path = ''
             WHERE v.day = '*' AND v.page = '' AND NOT EXISTS (
                 SELECT 1 FROM reach r WHERE r.site = k.id AND r.source = v.source
                     AND r.visitor = v.visitor);
         INSERT INTO events (event_id, site, source, kind, page, name, dedupe, visitor, at_ms,
                             day, referrer)
             SELECT e.event_id, k.id, e.source, e.kind, p.id, e.name, e.dedupe, e.visitor,
                    e.at_ms, {e_day}, e.referrer FROM v1_events e
             JOIN site_keys k ON k.name = e.site JOIN pages p ON p.site = k.id AND p.path = e.page
             ORDER BY e.event_id;
         INSERT INTO event_counters (site, name, day, count)
             SELECT k.id, c.name, {ec_day}, c.count FROM v1_event_counters c
             JOIN site_keys k ON k.name = c.site;
         INSERT INTO bases (scope, views, visitors)
             SELECT p.id, b.views, b.visitors FROM v1_bases b
             JOIN site_keys k ON k.name = b.site JOIN pages p ON p.site = k.id AND p.path = b.page;
         INSERT INTO salts (day, salt) SELECT {s_day}, salt FROM v1_salts;"
    ))?;
    let after = count_rows(tx, &V2_ROWS)?;
    if before != after {
        return Err(StoreError::Invalid(format!(
            "migration to schema v2 would lose rows ({V2_ROWS:?}: {before:?} before, \
             {after:?} after); nothing changed"
        )));
    }
    tx.execute_batch(
        "DROP TABLE v1_events; DROP TABLE v1_visitors; DROP TABLE v1_counters;
         DROP TABLE v1_event_counters; DROP TABLE v1_bases; DROP TABLE v1_salts;",
    )?;
    Ok(())
}
