//! Retention, as in SQLite (see `store::sqlite::prune`): every kind deleted in chunks of at
//! most [`CHUNK`] rows per transaction, each kind's marker in `meta` raised in the same
//! transaction as its deletions, so `verify` always knows what is gone. Every chunk holds the
//! prune lock exclusively (repairs share it), so a repair never sees half a chunk; commits
//! never take it.

use super::{Fail, PgStore, id_bound, retry};
use crate::store::{PruneReport, Retention, StoreError};

/// First key of the advisory lock of pruning (the second key is the schema's hash): each
/// prune chunk holds it exclusively, each site's repair shares it, so a repair never sees half
/// a chunk.
pub(super) const PRUNE_LOCK: i32 = 0x7461_6c79;

/// Rows deleted per transaction.
const CHUNK: i64 = 5000;
/// Page scopes visited per transaction when pruning per-page counters.
const SCOPES_PER_CHUNK: i64 = 500;

/// Raise marker `key` in `meta` to `value` (it never moves back).
/// Hold the prune lock for this transaction (see the module doc).
async fn lock_out_repairs(tx: &deadpool_postgres::Transaction<'_>) -> Result<(), Fail> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&PRUNE_LOCK],
    )
    .await?;
    Ok(())
}

pub(super) async fn raise_marker(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &str,
    value: i64,
) -> Result<(), Fail> {
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = GREATEST(meta.value, excluded.value)",
        &[&key, &value],
    )
    .await?;
    Ok(())
}

pub(super) async fn prune(
    store: &PgStore,
    policy: Retention,
    now: jiff::Timestamp,
) -> Result<PruneReport, StoreError> {
    let today = i32::try_from(now.as_second().div_euclid(86_400)).unwrap_or(i32::MAX);
    let mut report = PruneReport::default();
    if policy.raw_days > 0 {
        let before_ms = now
            .as_millisecond()
            .saturating_sub(i64::from(policy.raw_days) * 86_400_000);
        loop {
            let now_ms = now.as_millisecond();
            let n = retry("prune events", || prune_events(store, before_ms, now_ms)).await?;
            report.events += n;
            if n < CHUNK as u64 {
                break;
            }
        }
    }
    if policy.visitor_days > 0 {
        let before = today.saturating_sub(i32::try_from(policy.visitor_days).unwrap_or(i32::MAX));
        loop {
            let n = retry("prune visits", || prune_visits(store, before)).await?;
            report.visitor_rows += n;
            if n < CHUNK as u64 {
                break;
            }
        }
    }
    if policy.page_days > 0 {
        let before = today.saturating_sub(i32::try_from(policy.page_days).unwrap_or(i32::MAX));
        let mut after = 0i64;
        loop {
            let (n, last) = retry("prune pages", || prune_page_rows(store, before, after)).await?;
            report.counter_rows += n;
            match last {
                Some(last) => after = last,
                None => break,
            }
        }
    }
    report.salts = retry("prune salts", || async {
        let client = store.client().await?;
        let salts = client
            .execute("DELETE FROM salts WHERE day < $1", &[&(today - 2)])
            .await?;
        client
            .execute("DELETE FROM page_quota WHERE day < $1", &[&(today - 7)])
            .await?;
        Ok(salts)
    })
    .await?;
    Ok(report)
}

async fn prune_events(store: &PgStore, before_ms: i64, now_ms: i64) -> Result<u64, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    lock_out_repairs(&tx).await?;
    // An import holding its lease (raised by each of its batches) keeps every raw event: a
    // day it is still writing is sealed whole before its raw events go.
    let lease = tx
        .query_opt("SELECT value FROM meta WHERE key = 'import_until_ms'", &[])
        .await?
        .map(|r| r.get::<_, i64>(0));
    if lease.is_some_and(|until| until > now_ms) {
        return Ok(0);
    }
    // Event ids are UUIDv7: "older than" is a key range.
    let n = tx
        .execute(
            "DELETE FROM events WHERE (site, event_id) IN \
             (SELECT site, event_id FROM events WHERE event_id < $1 AND dedupe IS NULL LIMIT $2)",
            &[&id_bound(before_ms), &CHUNK],
        )
        .await?;
    if n > 0 {
        raise_marker(&tx, "pruned_before_ms", before_ms).await?;
    }
    tx.commit().await?;
    Ok(n)
}

async fn prune_visits(store: &PgStore, before_day: i32) -> Result<u64, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    lock_out_repairs(&tx).await?;
    raise_marker(&tx, "visitor_rows_before_day", i64::from(before_day)).await?;
    let n = tx
        .execute(
            "DELETE FROM visits WHERE (site, day, scope, source, visitor) IN \
             (SELECT site, day, scope, source, visitor FROM visits WHERE day < $1 LIMIT $2)",
            &[&before_day, &CHUNK],
        )
        .await?;
    if n > 0 {
        // Sets lost rows: kept sets of every collector are dropped.
        tx.execute(crate::store::daysets::BUMP_GENERATION, &[])
            .await?;
    }
    tx.commit().await?;
    Ok(n)
}

async fn prune_page_rows(
    store: &PgStore,
    before_day: i32,
    after: i64,
) -> Result<(u64, Option<i64>), Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    lock_out_repairs(&tx).await?;
    raise_marker(&tx, "page_rows_before_day", i64::from(before_day)).await?;
    let scopes = tx
        .query(
            "SELECT site, id FROM pages WHERE id > $1 AND path != '' ORDER BY id LIMIT $2",
            &[&after, &SCOPES_PER_CHUNK],
        )
        .await?;
    let sites: Vec<i64> = scopes.iter().map(|r| r.get(0)).collect();
    let ids: Vec<i64> = scopes.iter().map(|r| r.get(1)).collect();
    let n = tx
        .execute(
            "DELETE FROM counters c USING unnest($1::int8[], $2::int8[]) AS u(site, scope) \
             WHERE c.site = u.site AND c.scope = u.scope AND c.source IN (0, 1) \
             AND c.day >= 0 AND c.day < $3",
            &[&sites, &ids, &before_day],
        )
        .await?;
    if n > 0 {
        // Page rows are removed: kept page rows of every store are dropped.
        tx.execute(crate::store::daysets::BUMP_GENERATION, &[])
            .await?;
    }
    tx.commit().await?;
    Ok((n, ids.last().copied()))
}
