//! The visitor-set journal: visitor rows decided but not yet moved into `visits` / `reach`.
//!
//! Why: the visitor sets are keyed by random visitor ids, so writing each new row where it
//! belongs dirties one b-tree page per row, and every dirty page is written to the WAL at every
//! commit. A batch instead appends its new rows to `set_journal` (an `AUTOINCREMENT` rowid
//! table: appends touch its last page), and once the journal holds [`FLUSH_ROWS`] rows they
//! move into `visits` and `reach` in one sorted pass, so a page takes many rows per write.
//!
//! Contract (what keeps visitors exact):
//! - A row is in the visitor sets when it is in `visits`/`reach` **or** in the journal; every
//!   reader of the sets reads both (`read::distinct_visitors` adds the journal's rows).
//! - The writer keeps the journal's rows in memory ([`Pending`]) and decides "new" against
//!   that copy plus the tables. The copy is trusted only while the journal's highest `seq` is
//!   the one this writer left (checked under the write lock at the start of each batch):
//!   another store on the file (it appends or flushes), an error or a panic before a batch's
//!   commit, or a flush elsewhere (verify, prune) makes it stale, and a stale copy is never
//!   used — the batch first moves the whole journal into the tables (in the batch's own
//!   transaction) and starts from empty.
//!   `seq` values are never reused (`AUTOINCREMENT`), so "same highest seq" means "nobody else
//!   wrote".
//! - A flush and the journal's deletion are in one transaction with whatever else that
//!   transaction commits; a crash leaves the journal as the last commit left it, and the first
//!   batch after a restart (whose copy starts stale) moves it.
//! - Memory: at most [`FLUSH_ROWS`] rows plus one batch (~60 bytes each).

use std::collections::{BTreeSet, HashSet};

use rusqlite::{Connection, params};

use super::StoreError;
use super::schema::ALL_TIME;

/// Journal rows that trigger a move into `visits` and `reach` (at the start of the next batch).
pub(super) const FLUSH_ROWS: usize = 16_384;

/// A per-day visitor row: (day, scope, source, visitor).
type VisitRow = (i64, i64, i64, [u8; 16]);
/// An all-time visitor row: (site, source, visitor, page).
type ReachRow = (i64, i64, [u8; 16], i64);

/// This writer's copy of the journal.
#[derive(Default)]
pub(super) struct Pending {
    visits: HashSet<VisitRow>,
    reach: BTreeSet<ReachRow>,
    /// The journal's highest `seq` as this writer left it (`None`: empty).
    last_seq: Option<i64>,
    /// Whether the copy may be trusted: set by [`Pending::committed`] only, cleared by
    /// [`Pending::begin`] for the batch in flight (a batch that fails or panics before its
    /// commit leaves it cleared) and by [`Pending::invalidate`].
    valid: bool,
}

impl Pending {
    /// At the start of a batch's transaction: make the copy trustworthy, moving the journal
    /// into the tables when it is stale or full. Returns whether it moved the journal.
    pub(super) fn begin(&mut self, tx: &Connection) -> Result<bool, StoreError> {
        let last: Option<i64> = tx
            .prepare_cached("SELECT max(seq) FROM set_journal")?
            .query_row([], |r| r.get(0))?;
        let trusted = self.valid
            && last == self.last_seq
            && self.visits.len() + self.reach.len() < FLUSH_ROWS;
        // Untrusted until this batch commits.
        self.valid = false;
        if trusted {
            return Ok(false);
        }
        flush(tx)?;
        self.visits.clear();
        self.reach.clear();
        self.last_seq = None;
        Ok(true)
    }

    /// The copy is stale (an error, or the journal was moved by someone else).
    pub(super) fn invalidate(&mut self) {
        self.valid = false;
    }

    /// After the batch's transaction committed: the journal's highest `seq` is now `last`
    /// (the last row this batch appended), or unchanged when it appended none.
    pub(super) fn committed(&mut self, last: Option<i64>) {
        if last.is_some() {
            self.last_seq = last;
        }
        self.valid = true;
    }

    pub(super) fn has_visit(&self, day: i64, scope: i64, source: i64, visitor: &[u8; 16]) -> bool {
        self.visits.contains(&(day, scope, source, *visitor))
    }

    pub(super) fn has_reach(&self, site: i64, source: i64, visitor: &[u8; 16], page: i64) -> bool {
        self.reach.contains(&(site, source, *visitor, page))
    }

    /// Whether the journal holds an all-time row of the visitor on another page of the site.
    pub(super) fn reached_elsewhere(
        &self,
        site: i64,
        source: i64,
        visitor: &[u8; 16],
        page: i64,
    ) -> bool {
        self.reach
            .range((site, source, *visitor, i64::MIN)..=(site, source, *visitor, i64::MAX))
            .any(|row| row.3 != page)
    }

    /// Append a per-day row to the journal (and the copy); returns its `seq`.
    pub(super) fn add_visit(
        &mut self,
        append: &mut Appender<'_>,
        site: i64,
        row: VisitRow,
    ) -> Result<i64, StoreError> {
        let (day, scope, source, visitor) = row;
        let seq = append.row(day, scope, source, &visitor, site)?;
        self.visits.insert(row);
        Ok(seq)
    }

    /// Append an all-time row to the journal (and the copy); returns its `seq`.
    pub(super) fn add_reach(
        &mut self,
        append: &mut Appender<'_>,
        row: ReachRow,
    ) -> Result<i64, StoreError> {
        let (site, source, visitor, page) = row;
        let seq = append.row(ALL_TIME, page, source, &visitor, site)?;
        self.reach.insert(row);
        Ok(seq)
    }
}

/// The journal's append statement, prepared once per batch.
pub(super) struct Appender<'t>(rusqlite::CachedStatement<'t>);

impl<'t> Appender<'t> {
    pub(super) fn new(tx: &'t Connection) -> Result<Self, StoreError> {
        Ok(Self(tx.prepare_cached(
            "INSERT INTO set_journal (day, scope, source, visitor, site) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?))
    }

    /// Append one row; returns its `seq`.
    fn row(
        &mut self,
        day: i64,
        scope: i64,
        source: i64,
        visitor: &[u8; 16],
        site: i64,
    ) -> Result<i64, StoreError> {
        Ok(self
            .0
            .insert(params![day, scope, source, &visitor[..], site])?)
    }
}

/// Move every journal row into `visits` and `reach`, in key order, and empty the journal.
/// Returns the rows moved.
pub(super) fn flush(tx: &Connection) -> Result<usize, StoreError> {
    let rows: i64 = tx.query_row("SELECT COUNT(*) FROM set_journal", [], |r| r.get(0))?;
    if rows == 0 {
        return Ok(0);
    }
    tx.execute_batch(
        "INSERT OR IGNORE INTO visits (day, scope, source, visitor) \
         SELECT day, scope, source, visitor FROM set_journal WHERE day >= 0 \
         ORDER BY day, scope, source, visitor; \
         INSERT OR IGNORE INTO reach (site, source, visitor, page) \
         SELECT site, source, visitor, scope FROM set_journal WHERE day < 0 \
         ORDER BY site, source, visitor, scope; \
         DELETE FROM set_journal;",
    )?;
    Ok(usize::try_from(rows).unwrap_or(0))
}
