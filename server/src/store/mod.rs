//! Persistence, split by job: [`EventSink`] (the write path), [`StatsReader`] (what the
//! dashboard and the APIs read), [`SiteStore`] (site configuration), [`SaltStore`] (the daily
//! salts), [`ShareStore`] (shared read-only links), [`Maintenance`] (verify, prune, health)
//! and [`ReportStore`] (email report schedules and the lease of each send). [`Store`] is
//! every job trait; code takes the
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
pub mod analytics;
pub mod copy;
pub(crate) mod daypages;
pub(crate) mod daysets;
pub mod imported;
pub mod merge;
pub(crate) mod numbers;
pub mod postgres;
pub mod rollups;
pub mod sqlite;

use async_trait::async_trait;
use jiff::civil::Date;
use tally_wire::Numbers;

pub use crate::core::counts::{BySource, CountsRaw};
use crate::core::filtered::{FilteredCounts, FilteredRow};
use crate::core::ids::{PagePath, SiteId};
use crate::core::period::Every;
use crate::core::record::{Outcome, Record};

/// Largest count an imported aggregate row holds (`tally import` refuses rows above it, and
/// `verify` checks it): sums of every row a read can cover stay far inside `i64`.
pub const MAX_IMPORTED_COUNT: i64 = 1_000_000_000_000;

/// `source` of imported daily aggregates in `counters` (Plausible, `tally-csv`; written by
/// SQLite's import, brought to PostgreSQL by `tally copy-to`): added to the web numbers when
/// read, their daily visitors summed (they have no visitor sets), never recounted by `verify`
/// (they have no raw events), like bases.
pub(crate) const IMPORTED_SOURCE: i64 = 2;

/// New dimension tuples (`dims`) per site, local day and kind; beyond it, an event's tuple of
/// that kind is the site's [`OTHER_DIM`] (its dimensions read "(other)"), so no client can grow
/// the table faster than this.
pub const DIM_CAP: i64 = 10_000;

/// The stored form of the tuple that stands for every tuple beyond [`DIM_CAP`].
pub const OTHER_DIM: &str = "(other)";

/// `kind` of source tuples in `dims`.
pub(crate) const DIM_SOURCE: i64 = 1;
/// `kind` of agent tuples in `dims`.
pub(crate) const DIM_AGENT: i64 = 2;

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

    /// Visits of a site over the local days `from..=to`, by source: a visit is one visitor's
    /// page views with no gap longer than [`VISIT_GAP_MS`], counted from raw events (window
    /// functions in the database), so days whose raw events were pruned count none.
    async fn visits(&self, site: &SiteId, from: Date, to: Date) -> Result<Visits, StoreError>;
}

/// The longest gap between two page views of one visit: 30 minutes.
pub const VISIT_GAP_MS: i64 = 30 * 60 * 1000;

/// Visits over a range ([`StatsReader::visits`]), by source like [`BySource`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Visits {
    pub web: u64,
    pub badge: u64,
}

/// The days of one site over a range, as the analytics read them, from ONE snapshot
/// ([`SegmentSource::segment_index`]).
#[derive(Debug, Clone, Default)]
pub struct SegmentIndex {
    /// The sealed days of the range, each with the version of its segment (new at every
    /// seal, so a kept copy of the same version is the stored one).
    pub sealed: Vec<(Date, i64)>,
    /// The other days of the range with web events: their events, visitor numbers resolved
    /// (a key without a stored number gets one of this answer only, at or above
    /// [`TEMP_NUMBERS`]).
    pub open: Vec<(Date, Vec<crate::core::segment::DayEvent>)>,
}

/// The stored parts of one sealed day ([`SegmentSource::segment_parts`]).
#[derive(Debug, Clone)]
pub struct SegmentParts {
    pub day: Date,
    pub version: i64,
    /// The visits part, when asked for.
    pub visits: Option<Vec<u8>>,
    /// The events part, when asked for.
    pub events: Option<Vec<u8>>,
}

/// One sealed day wanted from [`SegmentSource::segment_parts`]: its version, and which parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartsWanted {
    pub day: Date,
    pub version: i64,
    pub visits: bool,
    pub events: bool,
}

/// Visitor numbers at or above this are given for one read only (keys not sealed yet); stored
/// numbers stay below it.
pub const TEMP_NUMBERS: u32 = 1 << 31;

/// Dictionary rows: page paths and dimension tuples by id.
#[derive(Debug, Clone, Default)]
pub struct DictionaryRows {
    pub pages: Vec<(u32, String)>,
    /// (id, kind, stored form).
    pub dims: Vec<(u32, i64, String)>,
}

/// The day segments of sites (`core::segment`): sealed days as stored, the rest read from raw
/// events. Contract (both backends, `tests/it/segment_store.rs`):
/// - A day is sealed only once it is over (the caller decides which days: `collect::seal`),
///   and its segment is exactly [`crate::core::segment::build`] of its raw web events with
///   their stored visitor numbers.
/// - Whatever writes an event of a sealed day (a late hit, an engagement report, an import)
///   deletes its segment in the same transaction; the day is sealed again later. A seal that
///   raced such a write is not stored (SQLite: the day's write count changed; PostgreSQL:
///   writers and seals of a day take its advisory lock).
/// - Reads never write: a key of an open day without a stored number gets a number of that
///   read only.
#[async_trait]
pub trait SegmentSource: Send + Sync {
    /// The sealed days of `site` in `from..=to` with their versions, and the raw events of the
    /// other days, in one snapshot.
    async fn segment_index(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<SegmentIndex, StoreError>;

    /// The asked parts of sealed days of `site`, for the days still sealed at the asked
    /// version (a day unsealed or sealed again since is left out).
    async fn segment_parts(
        &self,
        site: &SiteId,
        wanted: Vec<PartsWanted>,
    ) -> Result<Vec<SegmentParts>, StoreError>;

    /// The paths and tuples of the given ids of `site` (unknown ids are left out).
    async fn dictionary(
        &self,
        site: &SiteId,
        pages: Vec<u32>,
        dims: Vec<u32>,
    ) -> Result<DictionaryRows, StoreError>;

    /// Days of `site` up to `through` that have web events and no segment, oldest first, at
    /// most `limit`.
    async fn unsealed_days(
        &self,
        site: &SiteId,
        through: Date,
        limit: u32,
    ) -> Result<Vec<Date>, StoreError>;

    /// Seal `day` of `site` (whose local day starts at `day_start_ms`): number its visitors,
    /// build its segment from its raw events and store it, unless it is sealed already or a
    /// write to the day raced the seal. Whether a segment was stored.
    async fn seal_day(
        &self,
        site: &SiteId,
        day: Date,
        day_start_ms: i64,
    ) -> Result<bool, StoreError>;

    /// The sealed days of `site` up to `through`, with their versions, oldest first.
    async fn sealed_through(
        &self,
        site: &SiteId,
        through: Date,
    ) -> Result<Vec<(Date, i64)>, StoreError>;

    /// Every stored month state of `site` ([`rollups`]), without its bytes, by month and key.
    async fn rollup_index(&self, site: &SiteId) -> Result<Vec<rollups::RollupInfo>, StoreError>;

    /// The stored states of `site`'s month `month` (its first day) named `keys` (those
    /// stored).
    async fn rollup_states(
        &self,
        site: &SiteId,
        month: Date,
        keys: Vec<String>,
    ) -> Result<Vec<rollups::RollupState>, StoreError>;

    /// Replace every stored state of `site`'s month `month` by `states` (each over the same
    /// sealed days), in one transaction, only if the month's sealed days and versions are
    /// still those days: a state counted before a newer seal never replaces one rolled
    /// after it. Whether they were stored.
    async fn put_rollups(
        &self,
        site: &SiteId,
        month: Date,
        states: Vec<rollups::RollupState>,
    ) -> Result<bool, StoreError>;

    /// The imported rows of `table` of `site` over the local days `from..=to`
    /// ([`imported`]): one per day and value in (day, value) order, or with `by_day` false
    /// one per value, summed over the range (its `day` is `from`), in value order.
    async fn imported(
        &self,
        site: &SiteId,
        table: imported::Table,
        from: Date,
        to: Date,
        by_day: bool,
    ) -> Result<Vec<imported::ImportedRow>, StoreError>;
}

/// A scheduled email report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportSchedule {
    pub site: SiteId,
    /// The address, checked by the caller (`ops::report`).
    pub recipient: String,
    pub every: Every,
    pub created_ms: i64,
}

/// One report's send for one period: the key of its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendKey {
    pub site: SiteId,
    pub recipient: String,
    pub every: Every,
    /// The period's first local day.
    pub period: Date,
}

/// Email report schedules and the lease of each send, shared by every collector on the
/// database.
///
/// Contract: a send is claimed by ONE atomic statement ([`ReportStore::claim_send`]): it
/// creates the period's row, or takes it over only when it is not sent, its lease has expired
/// and its next try is due; of collectors claiming at once exactly one wins. Only the holder
/// marks it sent or failed. A holder that dies between sending and marking leaves a lease
/// that expires: the send can then happen once more, never more often.
#[async_trait]
pub trait ReportStore: Send + Sync {
    /// Add a schedule; `false` when the same (site, recipient, every) exists already.
    async fn add_report(&self, report: &ReportSchedule) -> Result<bool, StoreError>;
    /// Remove a schedule (and its sends); `false` when there was none.
    async fn remove_report(
        &self,
        site: &SiteId,
        recipient: &str,
        every: Every,
    ) -> Result<bool, StoreError>;
    /// The schedules of one site, or of every site (`None`), by site, recipient, every.
    async fn list_reports(&self, site: Option<&SiteId>) -> Result<Vec<ReportSchedule>, StoreError>;
    /// Claim `key` for `holder` until `lease_until_ms` when it is not sent and neither leased
    /// nor waiting for a retry at `now_ms`: the attempts made so far, or `None` when another
    /// holder has it, it went out, or its next try is later.
    async fn claim_send(
        &self,
        key: &SendKey,
        holder: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<Option<u32>, StoreError>;
    /// Mark `key` sent at `now_ms`, if `holder` still holds it (`false` otherwise).
    async fn mark_sent(&self, key: &SendKey, holder: &str, now_ms: i64)
    -> Result<bool, StoreError>;
    /// Record a failed attempt of `holder`: attempts + 1, the error, and the next try at
    /// `next_try_ms` (`i64::MAX`: given up); the lease is released.
    async fn mark_failed(
        &self,
        key: &SendKey,
        holder: &str,
        error: &str,
        next_try_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Sends that failed, are not given up and wait for their next try.
    async fn retries_waiting(&self) -> Result<u64, StoreError>;
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

/// How an import batch is committed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Events before this instant (ms since the epoch) are counted without being kept raw
    /// (older than the raw-event retention); `None` keeps every raw event.
    pub raw_before_ms: Option<i64>,
    /// The import's lease (ms since the epoch): raised in `meta.import_until_ms` by the
    /// batch; until then [`Maintenance::prune`] removes no raw event, so a day the import
    /// is still writing keeps every raw event until it is sealed whole.
    pub lease_until_ms: Option<i64>,
}

/// One imported daily aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyImport {
    /// The page, or `None` for the whole site.
    pub page: Option<PagePath>,
    pub day: Date,
    pub views: u64,
    pub visitors: u64,
}

/// The import lane of `tally import`, the same on every backend.
#[async_trait]
pub trait ImportSink: Send + Sync {
    /// Commit imported records like [`EventSink::commit`] (same counters, visitor sets and
    /// page cap) with two differences: every event id is first entered in the import ledger
    /// (an id already there is a `Duplicate`, so re-running an import counts nothing twice,
    /// even after retention pruned its raw events), and events older than
    /// [`ImportOptions::raw_before_ms`] are counted without being kept raw, the raw prune
    /// marker raised past them in the same transaction (so `verify` treats their rows like
    /// rows whose raw events were pruned). A sealed day whose raw events were pruned keeps
    /// its segment: records added to it are counted but are not in its breakdowns (its
    /// segment could not be rebuilt whole). One transaction; one outcome per record, in
    /// order.
    async fn import_events(
        &self,
        records: Vec<Record>,
        options: ImportOptions,
    ) -> Result<Vec<Outcome>, StoreError>;

    /// Store daily aggregates of `site` as counter rows of the imported source (2),
    /// replacing the row of the same (scope, day), so a re-run sets the same numbers, and
    /// recompute each scope's all-time imported row. They add to the shown web numbers and
    /// are never recounted, like bases. One transaction; returns the rows written.
    async fn import_daily(&self, site: &SiteId, rows: Vec<DailyImport>) -> Result<u64, StoreError>;

    /// Store imported breakdown rows of `site` ([`imported`]) in ONE transaction: first
    /// every row of each (table, day) in `clear` is deleted, then each row is added to the
    /// row of its (table, day, value), summed (so rows of one value from several lines add
    /// up, and a re-run that clears each (table, day) it writes once sets the same numbers).
    /// Returns the rows given. They are never recounted nor pruned, like bases.
    async fn import_breakdowns(
        &self,
        site: &SiteId,
        rows: Vec<imported::ImportedRow>,
        clear: Vec<(imported::Table, Date)>,
    ) -> Result<u64, StoreError>;
}

/// One day of one page (or the whole site) of a site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyExportRow {
    pub day: Date,
    /// `None` = the whole site.
    pub page: Option<String>,
    pub views: u64,
    pub visitors: u64,
}

/// One raw event, or one day of a custom event's counter (`event_id` and `at_ms` absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventExportRow {
    pub event_id: Option<String>,
    pub at_ms: Option<i64>,
    pub day: Date,
    /// `pageview` or `event`.
    pub kind: &'static str,
    pub page: Option<String>,
    pub name: Option<String>,
    pub source: &'static str,
    pub referrer: Option<String>,
    pub count: u64,
}

/// Where exported rows go, one at a time (an error stops the export).
pub type RowSink<'a, T> = &'a mut dyn FnMut(T) -> std::io::Result<()>;

/// A row sink's error, as the store reports it.
pub(crate) fn export_sink_error(e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("writing the export: {e}"))
}

/// Streaming reads for `tally export`: rows go to a callback one at a time, so an export
/// takes constant memory at any size. Each call reads one consistent snapshot while
/// collectors keep writing, in a stable order (day, then page; raw events by event id).
/// Daily rows carry what a web counter shows: counted web numbers plus imported aggregates
/// (badge views are a separate source and not exported); page `None` is the whole site. Not
/// `Send`: the callback writes to the caller's output, and only the export command calls it.
#[async_trait(?Send)]
pub trait ExportSource: Send + Sync {
    /// Daily numbers per page and for the whole site over `from..=to`, in (day, page) order.
    async fn export_daily(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        out: RowSink<'_, DailyExportRow>,
    ) -> Result<u64, StoreError>;

    /// Raw events (`raw` = true: every stored event, page views and custom events, in event
    /// id order) or the daily counters of custom events (`raw` = false, in (day, name)
    /// order) over `from..=to`.
    async fn export_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        raw: bool,
        out: RowSink<'_, EventExportRow>,
    ) -> Result<u64, StoreError>;
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
    /// Recount counters from raw events; with `repair`, replace drifted counters. A repair
    /// goes site by site where the backend has many writers (PostgreSQL), so each site's
    /// commits wait for at most that site's recount.
    async fn verify(&self, repair: bool) -> Result<VerifyReport, StoreError>;

    /// [`Maintenance::verify`] of one site only: the recount reads that site's rows, and a
    /// repair rewrites them while other sites' commits go on (PostgreSQL) or wait for this
    /// one site's recount only (SQLite's one writer). A site never counted checks nothing.
    async fn verify_site(&self, site: &SiteId, repair: bool) -> Result<VerifyReport, StoreError>;

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

    /// Estimated bytes the store keeps in memory for reads (cheap; for metrics).
    fn kept_bytes(&self) -> KeptBytes {
        KeptBytes::default()
    }

    /// At a clean stop, once every write is committed: fold what the backend keeps beside
    /// its data into it, so a stopped collector leaves only its database on disk (SQLite:
    /// checkpoint the WAL into the main file and truncate it). Best effort and a no-op where
    /// the backend manages its own log (PostgreSQL).
    async fn close_log(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Estimated bytes a store keeps in memory for reads ([`Maintenance::kept_bytes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptBytes {
    /// The v1 reads' per-day visitor sets with their numbering (`store::daysets`).
    pub day_sets: usize,
    /// The v1 reads' per-day page rows (`store::daypages`).
    pub day_pages: usize,
    /// The visitor numbers looked up for the analytics' open days (`store::numbers`).
    pub visitor_numbers: usize,
}

impl KeptBytes {
    /// What a store's three read caches hold now.
    pub(crate) fn of(
        sets: &daysets::DaySets,
        pages: &daypages::DayPages,
        numbers: &std::sync::Mutex<numbers::Numbers>,
    ) -> Self {
        Self {
            day_sets: sets.kept_bytes(),
            day_pages: pages.kept_bytes(),
            visitor_numbers: numbers::Numbers::estimated_bytes(numbers),
        }
    }
}

/// A whole backend: every job. Implemented for any type that implements the nine job traits;
/// code that needs one job takes that trait (`Arc<dyn SiteStore>` coerces from
/// `Arc<dyn Store>`).
pub trait Store:
    EventSink
    + StatsReader
    + SiteStore
    + SaltStore
    + Maintenance
    + ImportSink
    + ExportSource
    + ReportStore
    + ShareStore
    + SegmentSource
    + 'static
{
}

impl<
    T: EventSink
        + StatsReader
        + SiteStore
        + SaltStore
        + Maintenance
        + ImportSink
        + ExportSource
        + ReportStore
        + ShareStore
        + SegmentSource
        + 'static,
> Store for T
{
}

/// The job traits, for code that calls store methods on a concrete backend (`SqliteStore`):
/// `use tally::store::prelude::*;`. Calls through `dyn Store` need no import.
pub mod prelude {
    pub use super::{
        EventSink, ExportSource, ImportSink, Maintenance, ReportStore, SaltStore, SegmentSource,
        ShareStore, SiteStore, StatsReader, Store,
    };
}
