//! The PostgreSQL schema as embedded, versioned migrations.
//!
//! Contract: [`migrate`] brings the database (the connection's `search_path` schema) to the
//! last version in [`MIGRATIONS`] or changes nothing: every missing migration runs in ONE
//! transaction under `pg_advisory_xact_lock`, so N collectors starting at once apply each
//! migration exactly once; `schema_version` records what ran. A newer database is refused.
//!
//! Shape (ready for time partitioning and for distribution by site):
//! - every unique key of a table that grows with traffic starts with the site id, so Citus can
//!   distribute by `site` with every conflict check on one node;
//! - `events` is keyed by `(site, event_id)`: the UUIDv7 event id sorts by time, so the table
//!   can be range-partitioned by month on `event_id` with the primary key intact; the keyed
//!   custom-event dedupe lives in its own table (`event_keys`) because a unique key on a
//!   partitioned table must contain the partition key;
//! - days are integers (days since 1970-01-01, -1 for all-time rows), as in the SQLite schema;
//! - `sites`, `site_keys` and `salts` are small (reference tables under Citus).

use tokio_postgres::Client;

use super::{Fail, StoreError};

/// Advisory lock key of migrations (any constant; `tally` in ASCII).
const MIGRATION_LOCK: i64 = 0x0074_616c_6c79;

/// The migrations, in order; version N is `MIGRATIONS[N - 1]`. Never edit one that shipped.
pub(super) const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE sites (
    id TEXT PRIMARY KEY, origins TEXT NOT NULL, timezone TEXT NOT NULL,
    public BOOLEAN NOT NULL, ingest_key TEXT
);
-- Every site name ever counted, configured or not, as a small integer; never deleted.
CREATE TABLE site_keys (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name TEXT NOT NULL UNIQUE);
-- Scopes of counters and visitor sets: path '' = the whole site, '(other)' = the pages beyond
-- the daily page cap, else a page path. Never deleted, so ids are never reused.
CREATE TABLE pages (
    site BIGINT NOT NULL, id BIGINT GENERATED ALWAYS AS IDENTITY, path TEXT NOT NULL,
    PRIMARY KEY (site, id), UNIQUE (site, path)
);
CREATE TABLE page_quota (
    site BIGINT NOT NULL, day INTEGER NOT NULL, created INTEGER NOT NULL, PRIMARY KEY (site, day)
);
-- Raw events; `page` is the scope the view was counted under (the page, or '(other)').
CREATE TABLE events (
    site BIGINT NOT NULL, event_id UUID NOT NULL, source SMALLINT NOT NULL, kind SMALLINT NOT NULL,
    page BIGINT NOT NULL, name TEXT, dedupe TEXT, visitor BYTEA NOT NULL, at_ms BIGINT NOT NULL,
    day INTEGER NOT NULL, referrer TEXT,
    PRIMARY KEY (site, event_id)
);
CREATE INDEX events_time ON events (event_id);
CREATE INDEX events_site_day ON events (site, day);
-- The dedupe of custom events with a key.
CREATE TABLE event_keys (
    site BIGINT NOT NULL, name TEXT NOT NULL, dedupe TEXT NOT NULL, event_id UUID NOT NULL,
    PRIMARY KEY (site, name, dedupe)
);
-- Per-day visitor sets of every scope; keyed scope first, so the distinct visitors of one
-- page over a range are one index range (pruning by day uses `visits_day`).
CREATE TABLE visits (
    site BIGINT NOT NULL, day INTEGER NOT NULL, scope BIGINT NOT NULL, source SMALLINT NOT NULL,
    visitor BYTEA NOT NULL, PRIMARY KEY (site, scope, source, day, visitor)
);
CREATE INDEX visits_day ON visits (day);
-- All-time visitor sets: page = a page scope for the page's set, = the whole-site scope for
-- the site's (an explicit row, so two writers cannot both count a visitor new to the site).
CREATE TABLE reach (
    site BIGINT NOT NULL, source SMALLINT NOT NULL, visitor BYTEA NOT NULL, page BIGINT NOT NULL,
    PRIMARY KEY (site, source, visitor, page)
);
CREATE TABLE counters (
    site BIGINT NOT NULL, scope BIGINT NOT NULL, source SMALLINT NOT NULL, day INTEGER NOT NULL,
    views BIGINT NOT NULL, visitors BIGINT NOT NULL, PRIMARY KEY (site, scope, source, day)
);
CREATE TABLE event_counters (
    site BIGINT NOT NULL, name TEXT NOT NULL, day INTEGER NOT NULL, count BIGINT NOT NULL,
    PRIMARY KEY (site, name, day)
);
CREATE TABLE bases (
    site BIGINT NOT NULL, scope BIGINT NOT NULL, views BIGINT NOT NULL, visitors BIGINT NOT NULL,
    PRIMARY KEY (site, scope)
);
CREATE TABLE filtered (
    site BIGINT NOT NULL, day INTEGER NOT NULL, reason SMALLINT NOT NULL, count BIGINT NOT NULL,
    PRIMARY KEY (site, day, reason)
);
CREATE TABLE salts (day INTEGER PRIMARY KEY, salt BYTEA NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
",
    r"
-- The event id of every line or row `tally import` counted (raw event kept or not), the
-- dedupe of imports.
CREATE TABLE import_ledger (event_id UUID PRIMARY KEY);
-- A shared link: `id` is the public name (`tally site unshare`), the URL carries a secret
-- token of which only the SHA-256 is kept; `password_hash` is a PHC string or NULL.
CREATE TABLE shares (
    id TEXT PRIMARY KEY, site TEXT NOT NULL, token_hash BYTEA NOT NULL UNIQUE,
    password_hash TEXT, created_ms BIGINT NOT NULL, expires_ms BIGINT
);
CREATE INDEX shares_site ON shares (site);
-- A scheduled report: `every` is 'week' or 'month'.
CREATE TABLE reports (
    site TEXT NOT NULL, recipient TEXT NOT NULL, every TEXT NOT NULL, created_ms BIGINT NOT NULL,
    PRIMARY KEY (site, recipient, every)
);
-- One report's send for one period (`period` = its first day, YYYY-MM-DD): the collector
-- `holder` owns it until `lease_until_ms`; `sent_ms` is set once it went out.
CREATE TABLE report_sends (
    site TEXT NOT NULL, recipient TEXT NOT NULL, every TEXT NOT NULL, period TEXT NOT NULL,
    holder TEXT NOT NULL, lease_until_ms BIGINT NOT NULL,
    attempts INTEGER NOT NULL, next_try_ms BIGINT NOT NULL,
    sent_ms BIGINT, last_error TEXT,
    PRIMARY KEY (site, recipient, every, period)
);
",
    r"
-- Page views with a referrer per site, local day and referring host (`core::hit::referrer_host`),
-- written in the transaction that stores the views; filled here from the raw events kept.
CREATE TABLE referrer_counters (
    site BIGINT NOT NULL, day INTEGER NOT NULL, host TEXT NOT NULL, views BIGINT NOT NULL,
    PRIMARY KEY (site, day, host)
);
INSERT INTO referrer_counters (site, day, host, views)
    SELECT site, day, split_part(substr(referrer, strpos(referrer, '://') + 3), '/', 1) AS host,
           COUNT(*) FROM events WHERE kind = 0 AND referrer IS NOT NULL GROUP BY site, day, 3;
",
    r"
-- Per event: its source and agent tuple (ids of `dims`; NULL before this migration or none
-- recorded), and for page views the largest engaged time (ms) and scroll depth reported.
ALTER TABLE events ADD COLUMN src BIGINT, ADD COLUMN agent BIGINT,
    ADD COLUMN engaged_ms BIGINT, ADD COLUMN scroll SMALLINT;
-- Interned dimension tuples of a site: kind 1 = where a visit came from, 2 = what it was made
-- with (`core::dims`); never deleted, so ids are never reused.
CREATE TABLE dims (
    site BIGINT NOT NULL, id BIGINT GENERATED ALWAYS AS IDENTITY, kind SMALLINT NOT NULL,
    value TEXT NOT NULL, PRIMARY KEY (site, id), UNIQUE (site, kind, value)
);
CREATE TABLE dim_quota (
    site BIGINT NOT NULL, day INTEGER NOT NULL, kind SMALLINT NOT NULL, created INTEGER NOT NULL,
    PRIMARY KEY (site, day, kind)
);
-- Each visitor key of a site as a number below 2^31 (assigned when a day is sealed).
CREATE TABLE visitor_numbers (
    site BIGINT NOT NULL, num BIGINT GENERATED ALWAYS AS IDENTITY (MAXVALUE 2147483647),
    visitor BYTEA NOT NULL, PRIMARY KEY (site, visitor), UNIQUE (num)
);
-- A sealed day of a site (`core::segment`): its visits part and its events part; a write to
-- the day deletes the row (sealed again later); `version` is new at every seal.
CREATE TABLE segments (
    site BIGINT NOT NULL, day INTEGER NOT NULL, version BIGINT NOT NULL,
    visits BYTEA NOT NULL, events BYTEA NOT NULL, PRIMARY KEY (site, day)
);
CREATE SEQUENCE segment_versions;
-- Imported breakdowns (`store::imported`): another tool's daily numbers per site, table
-- (`dim`), local day and value tuple; set by `tally import`, never recounted nor pruned.
CREATE TABLE imported_dims (
    site BIGINT NOT NULL, dim TEXT NOT NULL, day INTEGER NOT NULL, value TEXT NOT NULL,
    visitors BIGINT NOT NULL, visits BIGINT NOT NULL, pageviews BIGINT NOT NULL,
    events BIGINT NOT NULL, bounces BIGINT NOT NULL, visit_duration BIGINT NOT NULL,
    PRIMARY KEY (site, dim, day, value)
);
",
    // 5: month rollups (`store::rollups`): one question's state over the sealed days of one
    // local month (`month`: the day number of its first day; `key`: its zone and counting
    // key; `days`: the sealed days it counted with their versions). Filled by the seal pass.
    r"
CREATE TABLE rollups (
    site BIGINT NOT NULL, month INTEGER NOT NULL, key TEXT NOT NULL, days BYTEA NOT NULL,
    state BYTEA NOT NULL, PRIMARY KEY (site, month, key)
);
",
];

/// Create schema `name` unless it exists, under the migration lock (two `CREATE SCHEMA IF NOT
/// EXISTS` at once can both find it missing, and one then fails). `name` is checked by the
/// caller (lower-case letters, digits, `_`).
pub(super) async fn create_schema(client: &mut Client, name: &str) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {name}"))
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Apply the missing migrations (see the module doc).
pub(super) async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let run = async {
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                 version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
        let current: i32 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
            .await?
            .get(0);
        let last = MIGRATIONS.len() as i32;
        if current > last {
            return Err(Fail::Store(StoreError::Invalid(format!(
                "database schema version {current} is newer than this tally ({last})"
            ))));
        }
        for (version, sql) in (1..).zip(MIGRATIONS).skip(current as usize) {
            tx.batch_execute(sql).await?;
            tx.execute(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[&version],
            )
            .await?;
        }
        tx.commit().await?;
        Ok::<(), Fail>(())
    };
    run.await.map_err(StoreError::from)
}
