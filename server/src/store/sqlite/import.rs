//! The import lane of the store: events from old logs and exports, and daily aggregates.
//!
//! Contract:
//! [`ImportSink`] on SQLite:
//! - `import_events` commits records like [`Store::commit`] (same counters,
//!   visitor sets and page cap) with two differences: every event id is first entered in the
//!   `import_ledger` (an id already there is a `Duplicate`, so re-running an import counts
//!   nothing twice, even after retention pruned its raw events), and events older than
//!   [`ImportOptions::raw_before_ms`] are counted without being kept raw; the raw prune marker
//!   (`meta.pruned_before_ms`) is raised past them in the same transaction, so `verify` treats
//!   their rows exactly like rows whose raw events were pruned and never reports drift.
//! - `import_daily` stores daily aggregates (views, visitors of a page or the
//!   whole site on a day) as counter rows of source [`IMPORTED_SOURCE`], replacing the row of
//!   the same (scope, day) — so it is idempotent — and recomputes the scope's all-time
//!   imported row. They add to the shown web numbers and are never recounted, like bases.
//! - `import_breakdowns` clears the (table, day)s it is told to, then adds each row to the
//!   `imported_dims` row of its (table, day, value) (`imported`).
//! - Each is one transaction per call: callers keep batches small so a running server's
//!   writer waits for at most one short batch.

use super::*;
use crate::store::imported::{ImportedRow, Table};
use crate::store::{DailyImport, ImportOptions, ImportSink};

#[async_trait]
impl ImportSink for SqliteStore {
    async fn import_events(
        &self,
        records: Vec<Record>,
        options: ImportOptions,
    ) -> Result<Vec<Outcome>, StoreError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let guard = Arc::clone(&self.guard);
        let cap = self.max_new_pages_per_day;
        self.write(move |writer| {
            guard.check_disk()?;
            commit_batch(writer, &guard, cap, &records, Some(options))
        })
        .await
    }

    async fn import_daily(&self, site: &SiteId, rows: Vec<DailyImport>) -> Result<u64, StoreError> {
        let site = site.as_str().to_owned();
        let guard = Arc::clone(&self.guard);
        self.write(move |w| {
            guard.check_disk()?;
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Resolver::new(&tx, &w.ids, 0);
            let site = ids.site(&site)?;
            let mut scopes = std::collections::BTreeSet::new();
            {
                let mut upsert = tx.prepare_cached(
                    "INSERT INTO counters (scope, source, day, views, visitors) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (scope, source, day) \
                     DO UPDATE SET views = excluded.views, visitors = excluded.visitors",
                )?;
                for row in &rows {
                    let day = day_num(row.day);
                    if day < 0 {
                        return Err(StoreError::Invalid(format!(
                            "day {} is before 1970-01-01",
                            row.day
                        )));
                    }
                    let path = row.page.as_ref().map_or("", |p| p.as_str());
                    let scope = ids.page_uncapped(site, path)?;
                    upsert.execute(params![
                        scope,
                        IMPORTED_SOURCE,
                        day,
                        i64::try_from(row.views).unwrap_or(i64::MAX),
                        i64::try_from(row.visitors).unwrap_or(i64::MAX)
                    ])?;
                    scopes.insert(scope);
                }
                let mut all_time = tx.prepare_cached(
                    "INSERT INTO counters (scope, source, day, views, visitors) \
                     SELECT ?1, ?2, -1, SUM(views), SUM(visitors) FROM counters \
                     WHERE scope = ?1 AND source = ?2 AND day >= 0 \
                     ON CONFLICT (scope, source, day) \
                     DO UPDATE SET views = excluded.views, visitors = excluded.visitors",
                )?;
                for scope in scopes {
                    all_time.execute(params![scope, IMPORTED_SOURCE])?;
                }
            }
            // Rows are set, not added to: kept page rows of every store are dropped.
            tx.execute(crate::store::daysets::BUMP_GENERATION, [])?;
            let pending = ids.into_pending();
            guard.check_file()?;
            tx.commit()?;
            w.ids.absorb(pending);
            Ok(rows.len() as u64)
        })
        .await
    }

    async fn import_breakdowns(
        &self,
        site: &SiteId,
        rows: Vec<ImportedRow>,
        clear: Vec<(Table, Date)>,
    ) -> Result<u64, StoreError> {
        let site = site.as_str().to_owned();
        let guard = Arc::clone(&self.guard);
        self.write(move |w| {
            guard.check_disk()?;
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut ids = Resolver::new(&tx, &w.ids, 0);
            let site = ids.site(&site)?;
            let pending = ids.into_pending();
            super::imported::write(&tx, site, &rows, &clear)?;
            guard.check_file()?;
            tx.commit()?;
            w.ids.absorb(pending);
            Ok(rows.len() as u64)
        })
        .await
    }
}
