//! The PostgreSQL backend: many collectors on one database.
//!
//! Contract, beyond [`Store`]'s:
//! - A pool of `tokio-postgres` connections (deadpool), of [`PgOptions::pool_size`].
//! - The schema is embedded and versioned (`schema`): migrations run at open, once, under an
//!   advisory lock.
//! - [`Store::commit`] is one transaction per batch. Dedupe is the unique keys: events by
//!   `(site, event_id)`, keyed custom events by `(site, name, dedupe)` in `event_keys`;
//!   `INSERT … ON CONFLICT DO NOTHING RETURNING` decides accepted or duplicate. Every
//!   statement of a batch writes its rows sorted by key (events, visitor sets, counters), so
//!   two writers take row locks in the same order; a deadlock (40P01) or serialization
//!   failure (40001) that still happens rolls the whole transaction back and it is retried,
//!   at most [`ATTEMPTS`] times, so nothing is counted twice.
//! - `verify --repair` takes an exclusive advisory lock per schema; every commit takes the
//!   shared one, so a repair waits for the batches in flight and batches wait for the repair:
//!   safe while collectors run. A plain `verify` reads one REPEATABLE READ snapshot.
//! - Interned ids (sites, pages) are cached per store only after their transaction commits.
//! - No disk floor (`free_bytes` is `None`): the database server owns its disk.
//!
//! Files: this one opens the pool and implements [`Store`]; `schema` holds the migrations,
//! `intern` maps names to ids, `write` commits batches, `read` answers queries, `verify`
//! recounts and repairs, `prune` applies retention, `report` the email report schedules,
//! their send leases and the visits read.

mod export;
mod imported;
mod intern;
mod load;
mod prune;
mod read;
mod report;
mod rollups;
mod schema;
mod segments;
mod shares;
mod verify;
mod write;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use jiff::civil::Date;
use tally_wire::Numbers;
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::{
    BySource, CountsRaw, DailyImport, DayRow, EventRow, EventSink, ImportOptions, ImportSink,
    Maintenance, PageRow, PruneReport, ReferrerRow, Retention, SaltStore, Site, SiteStore,
    StatsReader, StoreError, VerifyReport,
};
use crate::core::filtered::{FilteredCounts, FilteredRow};
use crate::core::ids::{PagePath, SiteId};
use crate::core::record::{Outcome, Record};
use intern::Interned;

/// Attempts of one transaction that fails with a deadlock or a serialization failure.
pub(super) const ATTEMPTS: u32 = 8;

/// `day` of all-time rows.
pub(super) const ALL_TIME: i32 = -1;

/// The first day of day numbers.
const EPOCH: Date = jiff::civil::date(1970, 1, 1);

/// A local day as stored: days since 1970-01-01.
/// The counters' and the segments' verify reports as one.
fn merged(counters: VerifyReport, segments: VerifyReport) -> VerifyReport {
    VerifyReport {
        checked: counters.checked + segments.checked,
        drift: [counters.drift, segments.drift].concat(),
        repaired: counters.repaired || segments.repaired,
    }
}

/// `kind` codes in `events`.
pub(super) const KIND_PAGEVIEW: i16 = 0;
pub(super) const KIND_EVENT: i16 = 1;

pub(super) fn day_num(day: Date) -> i32 {
    let days = day.duration_since(EPOCH).as_secs().div_euclid(86_400);
    i32::try_from(days).unwrap_or(i32::MIN)
}

/// A stored day number as a date.
pub(super) fn num_day(n: i32) -> Result<Date, StoreError> {
    EPOCH
        .checked_add(jiff::SignedDuration::from_hours(i64::from(n) * 24))
        .map_err(|_| StoreError::Invalid(format!("day number {n} is out of range")))
}

/// How the PostgreSQL store is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// Connections in the pool (`--db-pool`).
    pub pool_size: usize,
    /// New distinct pages per site per local day (0 = unlimited), as in SQLite.
    pub max_new_pages_per_day: u32,
    /// The schema to use (created if missing); `None`: the connection's default
    /// (`search_path`, normally `public`). Letters, digits and `_` only.
    pub schema: Option<String>,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            pool_size: 16,
            max_new_pages_per_day: 1000,
            schema: None,
        }
    }
}

/// Whether a `--db` value names a PostgreSQL database (else it is a SQLite file path).
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// A failure inside one attempt: retried when PostgreSQL says the transaction lost a race.
#[derive(Debug)]
pub(super) enum Fail {
    Conflict(String),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED => Fail::Conflict(e.to_string()),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE => Fail::Conflict(e.to_string()),
            _ => Fail::Store(pg_error(&e)),
        }
    }
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::PoolError;
        Fail::Store(match e {
            // The server's own words (a wrong user, password or database), not "db error".
            PoolError::Backend(e) => pg_error(&e),
            PoolError::Timeout(_) => no_answer(),
            e => StoreError::Unavailable(format!("postgres pool: {e}")),
        })
    }
}

/// How long connecting (TCP, startup and authentication) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A server that accepted the connection but did not finish the startup within
/// [`CONNECT_TIMEOUT`] (or was not reached at all).
fn no_answer() -> StoreError {
    StoreError::Unavailable(format!(
        "postgres: no connection within {} s (is PostgreSQL listening and answering at that host and port?)",
        CONNECT_TIMEOUT.as_secs()
    ))
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

impl From<Fail> for StoreError {
    fn from(f: Fail) -> Self {
        match f {
            Fail::Conflict(why) => {
                StoreError::Conflict(format!("postgres: gave up after retries: {why}"))
            }
            Fail::Store(e) => e,
        }
    }
}

/// A PostgreSQL error as a store error, with the server's message and code (for the log).
fn pg_error(e: &tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(db) => {
            StoreError::Unavailable(format!("postgres {}: {}", db.code().code(), db.message()))
        }
        None => StoreError::Unavailable(format!("postgres: {e}")),
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        pg_error(&e)
    }
}

/// Run `attempt` until it succeeds, fails for another reason than a lost race, or
/// [`ATTEMPTS`] attempts lost races. Each attempt is a whole transaction.
pub(super) async fn retry<T, F, Fut>(what: &str, mut attempt: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Fail>>,
{
    let mut n = 1;
    loop {
        match attempt().await {
            Err(Fail::Conflict(why)) if n < ATTEMPTS => {
                tracing::debug!(what, attempt = n, error = %why, "postgres transaction retried");
                n += 1;
                // A short, growing pause lets the winner of the race commit first.
                tokio::time::sleep(Duration::from_millis(u64::from(n) * 5)).await;
            }
            other => return other.map_err(StoreError::from),
        }
    }
}

/// The PostgreSQL store.
#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// Committed site and page ids.
    ids: Arc<Mutex<Interned>>,
    max_new_pages_per_day: u32,
    /// Per-day visitor sets kept for range visitors (`store::daysets`).
    sets: Arc<crate::store::daysets::DaySets>,
    /// Per-day page rows kept for top pages (`store::daypages`).
    pages: Arc<crate::store::daypages::DayPages>,
    /// Stored visitor numbers looked up (`store::numbers`).
    numbers: Arc<Mutex<crate::store::numbers::Numbers>>,
}

fn valid_schema(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

impl PgStore {
    /// Connect to `url` (`postgres://user@host:port/db?…`), create the schema if asked, and
    /// apply the migrations.
    pub async fn open(url: &str, options: PgOptions) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Unavailable(format!("invalid postgres URL: {e}")))?;
        // The TCP connect only; the startup and authentication are bounded below.
        config.connect_timeout(CONNECT_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("tally");
        }
        if let Some(schema) = &options.schema {
            if !valid_schema(schema) {
                return Err(StoreError::Invalid(format!(
                    "schema name {schema:?}: use lower-case letters, digits and _"
                )));
            }
            let (mut client, connection) =
                tokio::time::timeout(CONNECT_TIMEOUT, config.connect(NoTls))
                    .await
                    .map_err(|_| no_answer())??;
            let task = tokio::spawn(connection);
            schema::create_schema(&mut client, schema).await?;
            drop(client);
            let _ = task.await;
            config.options(format!("-c search_path={schema}"));
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Unavailable(format!("postgres pool: {e}")))?;
        {
            let mut client = pool.get().await.map_err(Fail::from)?;
            schema::migrate(&mut client).await?;
        }
        Ok(Self {
            pool,
            ids: Arc::new(Mutex::new(Interned::default())),
            max_new_pages_per_day: options.max_new_pages_per_day,
            sets: Arc::default(),
            pages: Arc::default(),
            numbers: Arc::default(),
        })
    }

    /// A pooled connection.
    /// The schema this store reads and writes (the connection's `current_schema()`).
    pub async fn current_schema(&self) -> Result<String, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT current_schema()::text", &[])
            .await
            .map_err(Fail::from)?;
        Ok(row.get(0))
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, Fail> {
        Ok(self.pool.get().await?)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Interned> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl EventSink for PgStore {
    async fn commit(&self, records: Vec<Record>) -> Result<Vec<Outcome>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        retry("commit", || write::commit_batch(self, &records, None)).await
    }

    async fn add_filtered(&self, rows: &[FilteredRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        retry("add_filtered", || write::add_filtered(self, rows)).await
    }
}

#[async_trait]
impl super::SegmentSource for PgStore {
    async fn segment_index(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<super::SegmentIndex, StoreError> {
        let (from, to) = segments::days(from, to);
        retry("segment_index", || {
            segments::read_index(self, site.as_str(), from, to)
        })
        .await
    }

    async fn segment_parts(
        &self,
        site: &SiteId,
        wanted: Vec<super::PartsWanted>,
    ) -> Result<Vec<super::SegmentParts>, StoreError> {
        retry("segment_parts", || {
            segments::read_parts(self, site.as_str(), &wanted)
        })
        .await
    }

    async fn dictionary(
        &self,
        site: &SiteId,
        pages: Vec<u32>,
        dims: Vec<u32>,
    ) -> Result<super::DictionaryRows, StoreError> {
        retry("dictionary", || {
            segments::read_dictionary(self, site.as_str(), pages.clone(), dims.clone())
        })
        .await
    }

    async fn unsealed_days(
        &self,
        site: &SiteId,
        through: Date,
        limit: u32,
    ) -> Result<Vec<Date>, StoreError> {
        let days = retry("unsealed_days", || {
            segments::read_unsealed(self, site.as_str(), day_num(through), limit)
        })
        .await?;
        days.into_iter().map(num_day).collect()
    }

    async fn imported(
        &self,
        site: &SiteId,
        table: super::imported::Table,
        from: Date,
        to: Date,
        by_day: bool,
    ) -> Result<Vec<super::imported::ImportedRow>, StoreError> {
        let days = (day_num(from), day_num(to));
        retry("imported", || {
            imported::read(self, site.as_str(), table, days, by_day)
        })
        .await
    }

    async fn sealed_through(
        &self,
        site: &SiteId,
        through: Date,
    ) -> Result<Vec<(Date, i64)>, StoreError> {
        retry("sealed_through", || {
            rollups::sealed_through(self, site.as_str(), through)
        })
        .await
    }

    async fn rollup_index(
        &self,
        site: &SiteId,
    ) -> Result<Vec<super::rollups::RollupInfo>, StoreError> {
        retry("rollup_index", || rollups::index(self, site.as_str())).await
    }

    async fn rollup_states(
        &self,
        site: &SiteId,
        month: Date,
        keys: Vec<String>,
    ) -> Result<Vec<super::rollups::RollupState>, StoreError> {
        retry("rollup_states", || {
            rollups::states(self, site.as_str(), month, &keys)
        })
        .await
    }

    async fn put_rollups(
        &self,
        site: &SiteId,
        month: Date,
        states: Vec<super::rollups::RollupState>,
    ) -> Result<bool, StoreError> {
        retry("put_rollups", || {
            rollups::put(self, site.as_str(), month, &states)
        })
        .await
    }

    async fn seal_day(
        &self,
        site: &SiteId,
        day: Date,
        day_start_ms: i64,
    ) -> Result<bool, StoreError> {
        retry("seal_day", || {
            segments::seal_day(self, site, day_num(day), day_start_ms)
        })
        .await
    }
}

#[async_trait]
impl ImportSink for PgStore {
    async fn import_events(
        &self,
        records: Vec<Record>,
        options: ImportOptions,
    ) -> Result<Vec<Outcome>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        retry("import", || {
            write::commit_batch(self, &records, Some(options))
        })
        .await
    }

    async fn import_daily(&self, site: &SiteId, rows: Vec<DailyImport>) -> Result<u64, StoreError> {
        retry("import_daily", || {
            write::import_daily(self, site.as_str(), &rows)
        })
        .await
    }

    async fn import_breakdowns(
        &self,
        site: &SiteId,
        rows: Vec<super::imported::ImportedRow>,
        clear: Vec<(super::imported::Table, Date)>,
    ) -> Result<u64, StoreError> {
        retry("import_breakdowns", || {
            imported::write(self, site.as_str(), &rows, &clear)
        })
        .await
    }
}

#[async_trait]
impl StatsReader for PgStore {
    async fn counts(
        &self,
        site: &SiteId,
        page: &PagePath,
        today: Date,
    ) -> Result<CountsRaw, StoreError> {
        read::counts(self, site.as_str(), page.as_str(), day_num(today)).await
    }

    async fn series(&self, site: &SiteId, from: Date, to: Date) -> Result<Vec<DayRow>, StoreError> {
        read::series(self, site.as_str(), day_num(from), day_num(to)).await
    }

    async fn range_totals(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<BySource, StoreError> {
        read::range_totals(self, site.as_str(), day_num(from), day_num(to)).await
    }

    async fn top_pages(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError> {
        read::top_pages(self, site.as_str(), day_num(from), day_num(to), limit).await
    }

    async fn top_referrers(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<ReferrerRow>, StoreError> {
        read::top_referrers(self, site.as_str(), day_num(from), day_num(to), limit).await
    }

    async fn top_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        read::top_events(self, site.as_str(), day_num(from), day_num(to), limit).await
    }

    async fn visits(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<crate::store::Visits, StoreError> {
        let days = (day_num(from), day_num(to));
        report::visits(self, site.as_str(), days, event_id_range(from, to)).await
    }

    async fn filtered(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<FilteredCounts, StoreError> {
        read::filtered(self, site.as_str(), day_num(from), day_num(to)).await
    }
}

#[async_trait]
impl SiteStore for PgStore {
    async fn list_sites(&self) -> Result<Vec<Site>, StoreError> {
        read::sites(self, None).await
    }

    async fn get_site(&self, id: &SiteId) -> Result<Option<Site>, StoreError> {
        Ok(read::sites(self, Some(id.as_str())).await?.pop())
    }

    async fn put_site(&self, site: &Site) -> Result<(), StoreError> {
        read::put_site(self, site).await
    }

    async fn ensure_site(&self, site: &Site, max_sites: u64) -> Result<Option<Site>, StoreError> {
        read::ensure_site(self, site, max_sites).await
    }

    async fn set_ingest_key(&self, id: &SiteId, key: Option<&str>) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE sites SET ingest_key = $2 WHERE id = $1",
                &[&id.as_str(), &key],
            )
            .await?;
        Ok(n > 0)
    }

    async fn site_count(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let n: i64 = client
            .query_one("SELECT COUNT(*) FROM sites", &[])
            .await?
            .get(0);
        Ok(n.max(0) as u64)
    }

    async fn remove_site(&self, id: &SiteId) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute("DELETE FROM sites WHERE id = $1", &[&id.as_str()])
            .await?
            > 0)
    }

    async fn set_base(
        &self,
        site: &SiteId,
        page: Option<&PagePath>,
        base: Numbers,
    ) -> Result<(), StoreError> {
        let page = page.map_or("", |p| p.as_str());
        retry("set_base", || {
            write::set_base(self, site.as_str(), page, base)
        })
        .await
    }
}

#[async_trait]
impl SaltStore for PgStore {
    async fn salt_for(&self, day: Date, fresh: [u8; 32]) -> Result<[u8; 32], StoreError> {
        let key = day_num(day);
        let salt: Vec<u8> = retry("salt", || async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            tx.execute(
                "INSERT INTO salts (day, salt) VALUES ($1, $2) ON CONFLICT (day) DO NOTHING",
                &[&key, &&fresh[..]],
            )
            .await?;
            tx.execute("DELETE FROM salts WHERE day < $1", &[&(key - 2)])
                .await?;
            let salt: Vec<u8> = tx
                .query_one("SELECT salt FROM salts WHERE day = $1", &[&key])
                .await?
                .get(0);
            tx.commit().await?;
            Ok(salt)
        })
        .await?;
        salt.try_into()
            .map_err(|_| StoreError::Invalid("salt is not 32 bytes".into()))
    }

    async fn end_sessions(&self, at_ms: i64) -> Result<i64, StoreError> {
        retry("end sessions", || async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) \
                     DO UPDATE SET value = GREATEST(meta.value, excluded.value) RETURNING value",
                    &[&SESSIONS_NOT_BEFORE, &at_ms],
                )
                .await?;
            Ok(row.get::<_, i64>(0))
        })
        .await
    }

    async fn sessions_not_before(&self) -> Result<i64, StoreError> {
        retry("read the last logout", || async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT value FROM meta WHERE key = $1",
                    &[&SESSIONS_NOT_BEFORE],
                )
                .await?;
            Ok(row.map_or(i64::MIN, |r| r.get::<_, i64>(0)))
        })
        .await
    }
}

/// The `meta` key of the last admin logout (ms since 1970).
const SESSIONS_NOT_BEFORE: &str = "sessions_not_before_ms";

#[async_trait]
impl Maintenance for PgStore {
    async fn verify(&self, repair: bool) -> Result<VerifyReport, StoreError> {
        let report = retry("verify", || verify::verify(self, None, repair)).await?;
        if report.repaired {
            self.known().clear();
        }
        let segments = retry("verify", || segments::verify(self, None, repair)).await?;
        Ok(merged(report, segments))
    }

    async fn verify_site(&self, site: &SiteId, repair: bool) -> Result<VerifyReport, StoreError> {
        let report = retry("verify", || {
            verify::verify(self, Some(site.as_str()), repair)
        })
        .await?;
        if report.repaired {
            self.known().clear();
        }
        let segments = retry("verify", || {
            segments::verify(self, Some(site.as_str()), repair)
        })
        .await?;
        Ok(merged(report, segments))
    }

    async fn prune(
        &self,
        policy: Retention,
        now: jiff::Timestamp,
    ) -> Result<PruneReport, StoreError> {
        prune::prune(self, policy, now).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        let check = async {
            let client = self.client().await?;
            client.query_one("SELECT 1", &[]).await?;
            client
                .query_opt("SELECT 1 FROM site_keys LIMIT 1", &[])
                .await?;
            Ok::<(), Fail>(())
        };
        match tokio::time::timeout(Duration::from_secs(2), check).await {
            Ok(r) => r.map_err(StoreError::from),
            Err(_) => Err(StoreError::Unavailable(
                "postgres did not answer within 2 s".into(),
            )),
        }
    }

    fn free_bytes(&self) -> Option<u64> {
        None
    }

    fn kept_bytes(&self) -> crate::store::KeptBytes {
        crate::store::KeptBytes::of(&self.sets, &self.pages, &self.numbers)
    }
}

/// The smallest UUIDv7 of an instant: ids at or after `ms` sort at or after it.
/// The UUIDv7 range holding the events of the local days `from..=to`: their instants lie
/// within UTC days from-1 .. to+1 for any time zone (the offsets span UTC-12 to UTC+14), so
/// the range of those with 26 h of slack.
pub(super) fn event_id_range(from: Date, to: Date) -> (uuid::Uuid, uuid::Uuid) {
    const DAY_MS: i64 = 86_400_000;
    const SLACK_MS: i64 = 26 * 3_600_000;
    let (from_n, to_n) = (i64::from(day_num(from)), i64::from(day_num(to)));
    (
        id_bound(from_n.saturating_mul(DAY_MS).saturating_sub(SLACK_MS)),
        id_bound((to_n + 1).saturating_mul(DAY_MS).saturating_add(SLACK_MS)),
    )
}

pub(super) fn id_bound(ms: i64) -> uuid::Uuid {
    let mut bound = [0u8; 16];
    bound[..6].copy_from_slice(&u64::try_from(ms).unwrap_or(0).to_be_bytes()[2..]);
    uuid::Uuid::from_bytes(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lost races are retried (whole attempts), up to [`ATTEMPTS`]; other errors are not.
    #[tokio::test(start_paused = true)]
    async fn retry_repeats_lost_races_only_and_gives_up() {
        let mut calls = 0;
        let out = retry("t", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(Fail::Conflict("40P01".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(out.expect("third attempt wins"), 3);

        let mut calls = 0;
        let out: Result<(), _> = retry("t", || {
            calls += 1;
            async { Err(Fail::Conflict("40001".into())) }
        })
        .await;
        assert_eq!(calls, ATTEMPTS);
        assert!(matches!(out, Err(StoreError::Conflict(why)) if why.contains("40001")));

        let mut calls = 0;
        let out: Result<(), _> = retry("t", || {
            calls += 1;
            async { Err(Fail::Store(StoreError::Invalid("bad".into()))) }
        })
        .await;
        assert_eq!(calls, 1, "not a race: no retry");
        assert!(matches!(out, Err(StoreError::Invalid(_))));
    }

    #[test]
    fn urls_and_schema_names() {
        assert!(is_postgres_url("postgres://u@h/db"));
        assert!(is_postgres_url("postgresql://u@h/db"));
        assert!(!is_postgres_url("/var/lib/tally/tally.sqlite"));
        assert!(!is_postgres_url("tally.sqlite"));
        assert!(valid_schema("tally_test_01"));
        for bad in ["", "1abc", "Tally", "a;drop", "a b", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad:?}");
        }
    }
}
