//! Retention: deleting what a [`Retention`] policy no longer keeps.
//!
//! Contract: every kind is deleted in chunks (at most [`CHUNK`] rows or [`SCOPES_PER_CHUNK`]
//! page scopes per transaction), so the writer is never held long and live traffic keeps
//! flowing between chunks. Each kind's marker in `meta` is raised in the same transaction as
//! its first deletion, so `verify` always knows what is gone (see `verify`):
//! - raw events older than `raw_days` × 24 h (`pruned_before_ms`); custom events with a
//!   dedupe key are kept, they ARE the dedupe; none while an import holds its lease
//!   (`meta.import_until_ms`), so an imported day is sealed whole before its raw events go;
//! - per-day visitor sets of UTC days before today − `visitor_days`
//!   (`visitor_rows_before_day`); the writer's [`SeenVisitors`] is cleared;
//! - per-page day counters before today − `page_days` (`page_rows_before_day`); whole-site
//!   day rows and all-time rows are kept;
//! - salts of days before today − 2, and page-cap tallies older than a week.

use super::*;

/// Rows deleted per transaction.
const CHUNK: usize = 5000;
/// Page scopes visited per transaction when pruning per-page counters.
const SCOPES_PER_CHUNK: i64 = 500;

/// Raise the marker `key` in `meta` to at least `value`.
fn raise_marker(conn: &Connection, key: &str, value: i64) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO meta (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
    )?
    .execute(params![key, value])?;
    Ok(())
}

/// Whether an import holds its lease at `now_ms` (`meta.import_until_ms`, raised by every
/// import batch): raw events wait, so a day an import is still writing keeps every raw event
/// until it is sealed whole.
fn import_running(conn: &Connection, now_ms: i64) -> Result<bool, StoreError> {
    let until: Option<i64> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'import_until_ms'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(until.is_some_and(|until| until > now_ms))
}

pub(super) async fn prune(
    store: &SqliteStore,
    policy: Retention,
    now: jiff::Timestamp,
) -> Result<PruneReport, StoreError> {
    let today = utc_day_num(now);
    let mut report = PruneReport::default();
    if policy.raw_days > 0 {
        let before_ms = now
            .as_millisecond()
            .saturating_sub(i64::from(policy.raw_days) * 86_400_000);
        report.events = prune_events(store, before_ms, now.as_millisecond()).await?;
    }
    if policy.visitor_days > 0 {
        report.visitor_rows = prune_visits(store, today - i64::from(policy.visitor_days)).await?;
    }
    if policy.page_days > 0 {
        report.counter_rows = prune_page_rows(store, today - i64::from(policy.page_days)).await?;
    }
    report.salts = store
        .write(move |w| {
            let salts = w
                .conn
                .execute("DELETE FROM salts WHERE day < ?1", [today - 2])?;
            w.conn
                .execute("DELETE FROM page_quota WHERE day < ?1", [today - 7])?;
            if salts > 0 {
                super::checkpoint_truncate(&w.conn);
            }
            Ok(salts as u64)
        })
        .await?;
    Ok(report)
}

async fn prune_events(store: &SqliteStore, before_ms: i64, now_ms: i64) -> Result<u64, StoreError> {
    // Event ids are UUIDv7: the first 48 bits are the time, so "older than" is a key range.
    let bound = id_bound(before_ms);
    let mut total = 0u64;
    loop {
        let deleted = store
            .write(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                if import_running(&tx, now_ms)? {
                    return Ok(0);
                }
                let ids: Vec<Vec<u8>> = {
                    let mut stmt = tx.prepare_cached(
                        "SELECT event_id FROM events \
                         WHERE event_id < ?1 AND dedupe IS NULL LIMIT ?2",
                    )?;
                    let rows = stmt.query_map(params![&bound[..], CHUNK as i64], |r| r.get(0))?;
                    rows.collect::<Result<_, _>>()?
                };
                if ids.is_empty() {
                    return Ok(0);
                }
                raise_marker(&tx, "pruned_before_ms", before_ms)?;
                {
                    let mut delete = tx.prepare_cached("DELETE FROM events WHERE event_id = ?1")?;
                    for id in &ids {
                        delete.execute([id])?;
                    }
                }
                tx.commit()?;
                Ok(ids.len())
            })
            .await?;
        total += deleted as u64;
        if deleted < CHUNK {
            return Ok(total);
        }
    }
}

async fn prune_visits(store: &SqliteStore, before_day: i64) -> Result<u64, StoreError> {
    let mut total = 0u64;
    loop {
        // The rows to delete are the start of the table (its key begins with the day).
        let deleted = store
            .write(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                raise_marker(&tx, "visitor_rows_before_day", before_day)?;
                // Journal rows of the pruned days must not come back with a later move.
                w.pending.invalidate();
                super::journal::flush(&tx)?;
                let deleted = tx
                    .prepare_cached(
                        "DELETE FROM visits WHERE (day, scope, source, visitor) IN \
                         (SELECT day, scope, source, visitor FROM visits WHERE day < ?1 LIMIT ?2)",
                    )?
                    .execute(params![before_day, CHUNK as i64])?;
                if deleted > 0 {
                    // Sets lost rows: kept sets of every store are dropped.
                    tx.execute(crate::store::daysets::BUMP_GENERATION, [])?;
                }
                tx.commit()?;
                if deleted > 0 {
                    w.seen.clear();
                }
                Ok(deleted)
            })
            .await?;
        total += deleted as u64;
        if deleted < CHUNK {
            return Ok(total);
        }
    }
}

async fn prune_page_rows(store: &SqliteStore, before_day: i64) -> Result<u64, StoreError> {
    let mut total = 0u64;
    let mut after = 0i64;
    loop {
        let (deleted, last) = store
            .write(move |w| {
                let tx = w
                    .conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)?;
                raise_marker(&tx, "page_rows_before_day", before_day)?;
                let scopes: Vec<i64> = tx
                    .prepare_cached(
                        "SELECT id FROM pages WHERE id > ?1 AND path != '' ORDER BY id LIMIT ?2",
                    )?
                    .query_map(params![after, SCOPES_PER_CHUNK], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                let mut deleted = 0u64;
                {
                    let mut delete = tx.prepare_cached(
                        "DELETE FROM counters WHERE scope = ?1 AND source IN (0, 1) \
                         AND day >= 0 AND day < ?2",
                    )?;
                    for scope in &scopes {
                        deleted += delete.execute(params![scope, before_day])? as u64;
                    }
                }
                if deleted > 0 {
                    // Page rows are removed: kept page rows of every store are dropped.
                    tx.execute(crate::store::daysets::BUMP_GENERATION, [])?;
                }
                tx.commit()?;
                Ok((deleted, scopes.last().copied()))
            })
            .await?;
        total += deleted;
        match last {
            Some(last) => after = last,
            None => return Ok(total),
        }
    }
}
