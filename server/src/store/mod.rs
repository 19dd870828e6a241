//! Persistence, split by job: [`EventSink`] (the write path), [`StatsReader`] (what the
//! dashboard and the APIs read), [`SiteStore`] (site configuration), [`SaltStore`] (the daily
//! salts), [`ShareStore`] (shared read-only links) and [`Maintenance`] (verify, prune, health).
//! [`Store`] is all six; code takes the
//! job it does. Nothing here is shaped by one backend: a PostgreSQL store implements the same
//! traits (async, `Send + Sync`, typed errors). The core (`crate::core`) imports none of it.
//!
//! Contract (every backend; proven by the conformance suite in `tests/it/store_conformance.rs`,
//! which runs every check against every backend):
//! - [`EventSink::commit`] stores a batch of records and their derived counters in ONE
//!   transaction and returns one [`Outcome`] per record, in order. Dedupe is atomic inside the
//!   store (a unique key on the event id, and on (site, name, dedupe) for keyed custom
//!   events), never a read-then-write, so handles (collectors) committing the same ids at once
//!   count each once. Counter rows are upserted in ascending key order, never in hash-map
//!   order, so concurrent writers take row locks in one order and cannot deadlock. When
//!   `commit` returns `Ok`, the batch is durable; when it returns `Err`, nothing of the batch
//!   is counted: not when the disk is below its floor ([`StoreError::DiskFull`]), not when the
//!   database file was deleted or replaced under the running store ([`StoreError::FileLost`]),
//!   not after a lost race ([`StoreError::Conflict`], safe to retry).
//! - Counters are derived data: [`Maintenance::verify`] recounts them from the raw events and
//!   reports (and with `repair`, fixes) every difference, over what can still be recounted:
//!   rows whose raw events or per-day rows were pruned by [`Maintenance::prune`] are neither
//!   compared nor rewritten, so a repair never brings pruned rows back.
//! - Everything that grows with traffic can be pruned ([`Retention`]): raw events, per-day
//!   visitor sets, per-page per-day counters, old salts. Whole-site daily numbers and all-time
//!   numbers are kept, and so are the tallies of views not counted (at most four
//!   rows per site and day, like the whole-site day rows).
//! - New distinct pages per site and local day are bounded by the backend's page cap; pages
//!   beyond it are counted under the site's one page [`OTHER_PAGE`].
//! - Reads take local days only: how a backend finds a day's raw events (SQLite: a UUIDv7 key
//!   range) is its own business.
//! - A backend's errors become a typed [`StoreError`]; its text is logged, never sent to
//!   clients.
//!
//! Backends: [`sqlite`] (the default, one file) and [`postgres`] (several collectors on one
//! database; `--db postgres://…`).
pub mod copy;
pub mod postgres;
pub mod sqlite;

use async_trait::async_trait;
use jiff::civil::Date;
use tally_wire::Numbers;

pub use crate::core::counts::{BySource, CountsRaw};
use crate::core::filtered::{FilteredCounts, FilteredRow};
use crate::core::ids::{PagePath, SiteId};
use crate::core::record::{Outcome, Record};

/// Largest count an imported aggregate row holds (`tally import` refuses rows above it, and
/// `verify` checks it): sums of every row a read can cover stay far inside `i64`.
pub const MAX_IMPORTED_COUNT: i64 = 1_000_000_000_000;

/// `source` of imported daily aggregates in `counters` (Plausible, `tally-csv`; written by
/// SQLite's import, brought to PostgreSQL by `tally copy-to`): added to the web numbers when
/// read, their daily visitors summed (they have no visitor sets), never recounted by `verify`
/// (they have no raw events), like bases.
pub(crate) const IMPORTED_SOURCE: i64 = 2;

/// The stored path of the one page per site that counts views of pages beyond the page cap.
/// It cannot collide with a real page: page keys start with `/`.
pub const OTHER_PAGE: &str = "(other)";

/// A store failure, typed by what the caller can do about it. Clients see 503
/// `storage_unavailable` (or `disk_full`); the detail goes to the log, never to clients.
///
/// - [`StoreError::Unavailable`] and its specific cases ([`StoreError::DiskFull`],
///   [`StoreError::FileLost`], [`StoreError::Unusable`]): the store cannot take the call now;
///   nothing of a failed write was counted.
/// - [`StoreError::Conflict`]: the transaction lost a race with another writer (SQLite busy,
///   a PostgreSQL deadlock or serialization failure) and was rolled back whole. Retrying the
///   same call is safe (dedupe makes a retried batch count once); backends retry a bounded
///   number of times themselves before returning it ([`StoreError::is_retryable`]).
/// - [`StoreError::Invalid`]: data given or stored is invalid; retrying cannot help.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend failed or could not be reached.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A retryable conflict with another writer; nothing of the call was applied.
    #[error("storage conflict (retryable): {0}")]
    Conflict(String),
    /// Data could not be stored or read back (e.g. an unknown time zone name).
    #[error("stored data is invalid: {0}")]
    Invalid(String),
    /// Free space on the database's filesystem is below the configured floor: nothing written.
    #[error("free disk space {free} B is below the floor of {floor} B")]
    DiskFull { free: u64, floor: u64 },
    /// The database file was deleted, moved or replaced while the store had it open: writes
    /// would go to a file nobody will open again, so nothing is acknowledged.
    #[error("database file lost: {0}")]
    FileLost(String),
    /// The database's files or directory cannot be written (found when opening).
    #[error("database files unusable: {0}")]
    Unusable(String),
}

impl StoreError {
    /// Whether the same call may succeed if simply retried (a lost race, nothing applied).
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Conflict(_))
    }
}

/// How long what grows with traffic is kept, in days; 0 keeps it forever. Each non-zero value
/// must exceed the accepted event window (the configuration checks it): a day that can still
/// receive hits must keep its rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Raw events (custom events with a dedupe key are kept: they are the dedupe).
    pub raw_days: u32,
    /// Per-day visitor sets (exact distinct visitors over ranges need them; daily and
    /// all-time visitor numbers do not).
    pub visitor_days: u32,
    /// Per-page per-day counters (the top pages of old ranges need them; whole-site daily
    /// rows and all-time rows are always kept).
    pub page_days: u32,
}

/// Rows removed by one [`Maintenance::prune`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub events: u64,
    pub visitor_rows: u64,
    pub counter_rows: u64,
    pub salts: u64,
}

pub use crate::core::site::Site;

/// Stored (signed) views and visitors as [`Numbers`]; negative values (never written) read as 0.
pub(crate) fn numbers(views: i64, visitors: i64) -> Numbers {
    Numbers {
        views: views.max(0) as u64,
        visitors: visitors.max(0) as u64,
    }
}

/// Add a counter row's numbers to its source: badge rows to `badge`, every other source (web,
/// and SQLite's imported daily aggregates, which add like bases) to `web`.
pub(crate) fn set_source(target: &mut BySource, source: i64, n: Numbers) {
    let target = if source == crate::core::record::Source::Badge.code() {
        &mut target.badge
    } else {
        &mut target.web
    };
    target.views += n.views;
    target.visitors += n.visitors;
}

/// One counter that differs from its recount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// Which counter: `site/source/page/day` (page empty for the whole site, day `*` for all time).
    pub key: String,
    pub stored: (i64, i64),
    pub recounted: (i64, i64),
}

/// Result of [`Maintenance::verify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Counters compared.
    pub checked: u64,
    /// Counters that differ from the recount.
    pub drift: Vec<Drift>,
    /// Whether the drift was repaired.
    pub repaired: bool,
}

/// One day of a site's daily series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayRow {
    pub day: Date,
    pub numbers: BySource,
}

/// One row of the top pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRow {
    pub page: String,
    /// Views and distinct visitors over the whole range, by source.
    pub numbers: BySource,
}

/// One row of the top referrers (by referring host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferrerRow {
    pub host: String,
    pub views: u64,
}

/// One custom event name's counts over a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub name: String,
    /// Events of this name over the whole range.
    pub count: u64,
    /// Per local day, in day order; days without events are absent.
    pub days: Vec<(Date, u64)>,
}

/// Where counted events go: the write path of every collector.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Store records and count them, atomically; one outcome per record, in order. Counter
    /// rows are upserted in ascending key order (never in hash-map order), so two writers on
    /// one database lock rows in the same order and cannot deadlock each other.
    async fn commit(&self, records: Vec<Record>) -> Result<Vec<Outcome>, StoreError>;

    /// Add views not counted (per site, local day and reason) to the stored tallies, in ONE
    /// transaction, in the rows' order.
    async fn add_filtered(&self, rows: &[FilteredRow]) -> Result<(), StoreError>;

    /// A writer the ingest queue drives from a thread of its own, for a store whose commits
    /// block a thread anyway (an embedded file): no hand-off per batch, and the store may
    /// acknowledge a batch after it has started on the next ([`BatchWriter`]). `None` (the
    /// default): the ingest queue awaits [`EventSink::commit`].
    fn batch_writer(&self) -> Option<Box<dyn BatchWriter>> {
        None
    }
}

/// Called once with the outcome of a batch, when it is durable (or has failed).
pub type Durable = Box<dyn FnOnce(Result<Vec<Outcome>, StoreError>) + Send>;

/// The write path of [`EventSink::batch_writer`]: called from one thread, never from a
/// runtime worker.
pub trait BatchWriter: Send {
    /// Commit `records` exactly as [`EventSink::commit`] does and call `done` once they are
    /// durable — at once, or later from another thread while this writer already commits the
    /// next batch. `done` calls keep commit order.
    fn commit(&mut self, records: Vec<Record>, done: Durable);

    /// Wait until every `done` has been called (shutdown).
    fn finish(self: Box<Self>);
}

/// The numbers the dashboard, the counts endpoint and the stats API read.
#[async_trait]
pub trait StatsReader: Send + Sync {
    /// Counters of a site and one of its pages; `today` is the site's current local day.
    async fn counts(
        &self,
        site: &SiteId,
        page: &PagePath,
        today: Date,
    ) -> Result<CountsRaw, StoreError>;

    /// Daily numbers of a site (whole site) for the local days `from..=to`; days without
    /// views are absent.
    async fn series(&self, site: &SiteId, from: Date, to: Date) -> Result<Vec<DayRow>, StoreError>;

    /// Views and EXACT distinct visitors of a whole site over the days `from..=to`.
    async fn range_totals(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<BySource, StoreError>;

    /// The `limit` most viewed pages over `from..=to` (views summed, visitors distinct),
    /// ranked by the larger of web and badge views, ties by path; ranked and limited inside
    /// the database. Pages beyond the page cap appear as one row, [`OTHER_PAGE`].
    async fn top_pages(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<PageRow>, StoreError>;

    /// The `limit` referring hosts with most page views over the local days `from..=to`
    /// (ties by host), from raw events, so only within the raw-event retention.
    async fn top_referrers(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<ReferrerRow>, StoreError>;

    /// The `limit` custom event names with most events over the local days `from..=to`
    /// (ties by name), each with its per-day counts; ranked and limited inside the database,
    /// so no more than `limit` names are ever held in memory.
    async fn top_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError>;

    /// Views of a site not counted over the local days `from..=to`, by reason.
    async fn filtered(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<FilteredCounts, StoreError>;
}

/// Site configuration: what `tally site …`, auto-sites and the site cache use.
#[async_trait]
pub trait SiteStore: Send + Sync {
    /// All configured sites.
    async fn list_sites(&self) -> Result<Vec<Site>, StoreError>;
    /// One site.
    async fn get_site(&self, id: &SiteId) -> Result<Option<Site>, StoreError>;
    /// Create or replace a site. An existing ingest key is kept when `site.ingest_key` is
    /// `None` (so `tally site add` never drops it); `Some` sets it.
    async fn put_site(&self, site: &Site) -> Result<(), StoreError>;
    /// Create a site unless it exists (auto-sites); returns the stored one, or `None` when it
    /// did not exist and `max_sites > 0` sites exist already (decided atomically, in one
    /// statement).
    async fn ensure_site(&self, site: &Site, max_sites: u64) -> Result<Option<Site>, StoreError>;
    /// Set (`Some`) or clear (`None`) a site's ingest key; `false` when there is no such site.
    async fn set_ingest_key(&self, id: &SiteId, key: Option<&str>) -> Result<bool, StoreError>;
    /// How many sites are configured.
    async fn site_count(&self) -> Result<u64, StoreError>;
    /// Remove a site's configuration (its counted data stays). Returns whether it existed.
    async fn remove_site(&self, id: &SiteId) -> Result<bool, StoreError>;
    /// Set the carried-over numbers of a site (`page` = None) or one page.
    async fn set_base(
        &self,
        site: &SiteId,
        page: Option<&PagePath>,
        base: Numbers,
    ) -> Result<(), StoreError>;
}

/// Secret state kept in the database, shared by every collector on it: the daily salts of
/// visitor hashes, and the instant of the last admin logout.
#[async_trait]
pub trait SaltStore: Send + Sync {
    /// The secret salt of `day`: the stored one, or `fresh` stored now (the first writer wins,
    /// so collectors racing on a new day all get the same salt). Salts of days before
    /// `day - 2` are deleted, so older hashes can never be recomputed.
    async fn salt_for(&self, day: Date, fresh: [u8; 32]) -> Result<[u8; 32], StoreError>;

    /// A logout at `at_ms`: every admin session issued at or before it is over. Stores the
    /// later of `at_ms` and the instant already stored (it never moves back) and returns the
    /// stored one. Kept across restarts, seen by every collector on the database.
    async fn end_sessions(&self, at_ms: i64) -> Result<i64, StoreError>;

    /// The instant of the last logout (ms since 1970), `i64::MIN` when there was none.
    async fn sessions_not_before(&self) -> Result<i64, StoreError>;
}

/// A shared read-only link of one site, as stored. The secret token is never stored: only its
/// SHA-256 ([`Share::token_hash`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The public name (`sh_` + 8 hex digits): listed, and used to revoke the link.
    pub id: String,
    pub site: SiteId,
    /// SHA-256 of the link's secret token.
    pub token_hash: [u8; 32],
    /// The argon2 PHC string of the link's password, if it has one.
    pub password_hash: Option<String>,
    pub created_ms: i64,
    /// When the link stops working (ms since 1970); `None`: never.
    pub expires_ms: Option<i64>,
}

impl Share {
    /// Whether the link still works at `now_ms` (it works until, not at, its expiry).
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_ms.is_none_or(|at| now_ms < at)
    }
}

/// A `shares` row as read: id, site, token hash, password hash, created, expires.
pub(crate) type ShareRow = (String, String, Vec<u8>, Option<String>, i64, Option<i64>);

/// A stored row as a [`Share`] (a row no link could have written is [`StoreError::Invalid`]).
pub(crate) fn share_from(row: ShareRow) -> Result<Share, StoreError> {
    let (id, site, hash, password_hash, created_ms, expires_ms) = row;
    Ok(Share {
        site: SiteId::parse(&site)
            .map_err(|e| StoreError::Invalid(format!("share {id:?}: site {site:?}: {e}")))?,
        token_hash: hash.try_into().map_err(|_| {
            StoreError::Invalid(format!("share {id:?}: token hash is not 32 bytes"))
        })?,
        id,
        password_hash,
        created_ms,
        expires_ms,
    })
}

/// Shared read-only links (`tally site share`), seen by every collector on the database: a
/// link is looked up on every request, so a revoked one stops working at once everywhere.
#[async_trait]
pub trait ShareStore: Send + Sync {
    /// Store a new link; [`StoreError::Invalid`] when its id or token hash is taken.
    async fn create_share(&self, share: &Share) -> Result<(), StoreError>;
    /// A site's links, oldest first (ties by id).
    async fn list_shares(&self, site: &SiteId) -> Result<Vec<Share>, StoreError>;
    /// The link whose token hashes to `token_hash`, expired or not.
    async fn share_by_token_hash(&self, token_hash: &[u8; 32])
    -> Result<Option<Share>, StoreError>;
    /// Delete one link; whether it existed.
    async fn revoke_share(&self, id: &str) -> Result<bool, StoreError>;
    /// Delete every link of a site; how many there were.
    async fn revoke_site_shares(&self, site: &SiteId) -> Result<u64, StoreError>;
}

/// Operator jobs: recount, retention, health.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Recount counters from raw events; with `repair`, replace drifted counters.
    async fn verify(&self, repair: bool) -> Result<VerifyReport, StoreError>;

    /// Delete what `policy` no longer keeps, as of `now`, in small chunks (live traffic keeps
    /// flowing), and salts older than two days.
    async fn prune(
        &self,
        policy: Retention,
        now: jiff::Timestamp,
    ) -> Result<PruneReport, StoreError>;

    /// Whether the store can take writes now: the database file is still the one opened, the
    /// disk is above its floor, and a trivial read answers. For readiness checks.
    async fn probe(&self) -> Result<(), StoreError>;

    /// Free bytes on the database's filesystem, if the backend has one (cheap; for metrics).
    fn free_bytes(&self) -> Option<u64>;
}

/// A whole backend: every job. Implemented for any type that implements the six job traits;
/// code that needs one job takes that trait (`Arc<dyn SiteStore>` coerces from
/// `Arc<dyn Store>`).
pub trait Store:
    EventSink + StatsReader + SiteStore + SaltStore + ShareStore + Maintenance + 'static
{
}

impl<T: EventSink + StatsReader + SiteStore + SaltStore + ShareStore + Maintenance + 'static> Store
    for T
{
}

/// The job traits, for code that calls store methods on a concrete backend (`SqliteStore`):
/// `use tally::store::prelude::*;`. Calls through `dyn Store` need no import.
pub mod prelude {
    pub use super::{EventSink, Maintenance, SaltStore, ShareStore, SiteStore, StatsReader, Store};
}
