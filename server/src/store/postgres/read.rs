//! Queries (counts, sites, series, range totals, top pages, referrers, events, views not
//! counted), each limited inside the database as in SQLite: top pages ranked and cut by SQL,
//! exact distinct visitors counted only for the rows returned.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use futures_util::TryStreamExt;
use tally_wire::Numbers;
use tokio_postgres::types::ToSql;

use super::{ALL_TIME, Fail, PgStore, num_day};
use crate::core::day::SiteZone;
use crate::core::filtered::{FilteredCounts, Reason};
use crate::core::ids::SiteId;
use crate::core::record::Source;
use crate::store::daypages::{self, Stamp};
use crate::store::daysets::{self, DayKeys, DaySets, KEY_BYTES};
use crate::store::{
    BySource, CountsRaw, DayRow, EventRow, IMPORTED_SOURCE, PageRow, ReferrerRow, Site, StoreError,
    numbers,
};

fn set_source(target: &mut BySource, source: i16, n: Numbers) {
    crate::store::set_source(target, i64::from(source), n);
}

/// Day numbers of a query range, never reaching the all-time rows.
fn clamp(from: i32, to: i32) -> (i32, i32) {
    (from.max(0), to)
}

/// The site's id and whole-site scope, if the site was ever counted.
async fn site_scope(client: &impl GenericClient, site: &str) -> Result<Option<(i64, i64)>, Fail> {
    let stmt = client
        .prepare_cached(
            "SELECT k.id, p.id FROM site_keys k JOIN pages p ON p.site = k.id AND p.path = '' \
             WHERE k.name = $1",
        )
        .await?;
    Ok(client
        .query_opt(&stmt, &[&site])
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

pub(super) async fn counts(
    store: &PgStore,
    site: &str,
    page: &str,
    today: i32,
) -> Result<CountsRaw, StoreError> {
    let client = store.client().await?;
    let mut raw = CountsRaw::default();
    let Some((site_id, _)) = site_scope(&client, site).await? else {
        return Ok(raw);
    };
    let stmt = client
        .prepare_cached(
            "SELECT p.path, c.source, c.day, c.views, c.visitors \
             FROM pages p JOIN counters c ON c.site = p.site AND c.scope = p.id \
                  AND c.day IN (-1, $3) \
             WHERE p.site = $1 AND p.path IN ('', $2)",
        )
        .await?;
    for row in client.query(&stmt, &[&site_id, &page, &today]).await? {
        let path: &str = row.get(0);
        let day: i32 = row.get(2);
        let n = numbers(row.get(3), row.get(4));
        let scope = match (path.is_empty(), day == ALL_TIME) {
            (true, true) => &mut raw.site_all,
            (true, false) => &mut raw.site_today,
            (false, true) => &mut raw.page_all,
            (false, false) => &mut raw.page_today,
        };
        set_source(scope, row.get(1), n);
    }
    let stmt = client
        .prepare_cached(
            "SELECT p.path, b.views, b.visitors FROM pages p \
             JOIN bases b ON b.site = p.site AND b.scope = p.id \
             WHERE p.site = $1 AND p.path IN ('', $2)",
        )
        .await?;
    for row in client.query(&stmt, &[&site_id, &page]).await? {
        let path: &str = row.get(0);
        let n = numbers(row.get(1), row.get(2));
        if path.is_empty() {
            raw.site_base = n;
        } else {
            raw.page_base = n;
        }
    }
    Ok(raw)
}

fn site_from_row(row: &tokio_postgres::Row) -> Result<Site, StoreError> {
    let id: String = row.get(0);
    let origins: String = row.get(1);
    let tz: String = row.get(2);
    Ok(Site {
        id: SiteId::parse(&id).map_err(|e| StoreError::Invalid(format!("site {id:?}: {e}")))?,
        origins: serde_json::from_str(&origins)
            .map_err(|e| StoreError::Invalid(format!("origins of {id:?}: {e}")))?,
        zone: SiteZone::parse(&tz).map_err(|e| StoreError::Invalid(e.to_string()))?,
        public: row.get(3),
        ingest_key: row.get(4),
    })
}

const SITE_COLUMNS: &str = "id, origins, timezone, public, ingest_key";

pub(super) async fn sites(store: &PgStore, id: Option<&str>) -> Result<Vec<Site>, StoreError> {
    let client = store.client().await?;
    let rows = client
        .query(
            &format!(
                "SELECT {SITE_COLUMNS} FROM sites WHERE $1::text IS NULL OR id = $1 ORDER BY id"
            ),
            &[&id],
        )
        .await?;
    rows.iter().map(site_from_row).collect()
}

fn origins_json(site: &Site) -> Result<String, StoreError> {
    serde_json::to_string(&site.origins).map_err(|e| StoreError::Invalid(e.to_string()))
}

pub(super) async fn put_site(store: &PgStore, site: &Site) -> Result<(), StoreError> {
    let client = store.client().await?;
    client
        .execute(
            "INSERT INTO sites (id, origins, timezone, public, ingest_key) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET \
             origins = excluded.origins, timezone = excluded.timezone, public = excluded.public, \
             ingest_key = COALESCE(excluded.ingest_key, sites.ingest_key)",
            &[
                &site.id.as_str(),
                &origins_json(site)?,
                &site.zone.name(),
                &site.public,
                &site.ingest_key,
            ],
        )
        .await?;
    Ok(())
}

/// Create a site unless it exists, under `max_sites`: the count and the insert happen under a
/// transaction-scoped advisory lock, so concurrent callers (and collectors) see each other.
pub(super) async fn ensure_site(
    store: &PgStore,
    site: &Site,
    max_sites: u64,
) -> Result<Option<Site>, StoreError> {
    let origins = origins_json(site)?;
    let max = i64::try_from(max_sites).unwrap_or(i64::MAX);
    super::retry("ensure_site", || async {
        let mut client = store.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('tally.sites'), hashtext(current_schema()))",
            &[],
        )
        .await?;
        tx.execute(
            "INSERT INTO sites (id, origins, timezone, public, ingest_key) \
             SELECT $1, $2, $3, $4, $5 \
             WHERE $6::int8 = 0 OR (SELECT COUNT(*) FROM sites) < $6::int8 \
             ON CONFLICT (id) DO NOTHING",
            &[
                &site.id.as_str(),
                &origins,
                &site.zone.name(),
                &site.public,
                &site.ingest_key,
                &max,
            ],
        )
        .await?;
        let stored = tx
            .query_opt(
                &format!("SELECT {SITE_COLUMNS} FROM sites WHERE id = $1"),
                &[&site.id.as_str()],
            )
            .await?;
        tx.commit().await?;
        Ok(stored.as_ref().map(site_from_row).transpose()?)
    })
    .await
}

pub(super) async fn series(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
) -> Result<Vec<DayRow>, StoreError> {
    let client = store.client().await?;
    let Some((site_id, scope)) = site_scope(&client, site).await? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let stmt = client
        .prepare_cached(
            "SELECT day, source, views, visitors FROM counters \
             WHERE site = $1 AND scope = $2 AND day BETWEEN $3 AND $4 ORDER BY day, source",
        )
        .await?;
    let mut out: Vec<DayRow> = Vec::new();
    for row in client.query(&stmt, &[&site_id, &scope, &from, &to]).await? {
        let day = num_day(row.get(0))?;
        if out.last().is_none_or(|last| last.day != day) {
            out.push(DayRow {
                day,
                numbers: BySource::default(),
            });
        }
        if let Some(last) = out.last_mut() {
            set_source(
                &mut last.numbers,
                row.get(1),
                numbers(row.get(2), row.get(3)),
            );
        }
    }
    Ok(out)
}

/// Exact distinct visitors of one scope and source over the days `from..=to`, in the caller's
/// snapshot: the days' counter rows say which days have visitors and how many, the kept sets
/// of the store (`store::daysets`) answer for the days they still match, and the others are
/// read in one index range, streamed, and kept.
async fn distinct_visitors(
    client: &impl GenericClient,
    sets: &DaySets,
    generation: i64,
    (site, scope, source): (i64, i64, i16),
    (from, to): (i32, i32),
) -> Result<u64, Fail> {
    let stmt = client
        .prepare_cached(
            "SELECT day, visitors FROM counters \
             WHERE site = $1 AND scope = $2 AND source = $3 AND day BETWEEN $4 AND $5 \
             AND visitors > 0",
        )
        .await?;
    let days: Vec<(i64, u64)> = client
        .query(&stmt, &[&site, &scope, &source, &from, &to])
        .await?
        .iter()
        .map(|r| {
            (
                i64::from(r.get::<_, i32>(0)),
                r.get::<_, i64>(1).max(0) as u64,
            )
        })
        .collect();
    let mut union = sets.union(generation, scope, i64::from(source), &days);
    if union.missing().is_empty() {
        return Ok(union.count());
    }
    let wanted: HashMap<i32, u64> = union
        .missing()
        .iter()
        .filter_map(|&(day, n)| Some((i32::try_from(day).ok()?, n)))
        .collect();
    let mut missing: Vec<i64> = wanted.keys().map(|&d| i64::from(d)).collect();
    missing.sort_unstable();
    // One row per day, its keys joined into one value: a year of a busy page is millions of
    // 16-byte keys, and a row each costs more to send and decode than to scan. Read by runs
    // of days (`BETWEEN`), so PostgreSQL groups the rows in index order as it streams them;
    // every run its own range, so days kept between them are not sent again.
    let stmt = client
        .prepare_cached(&format!(
            "SELECT day, bool_and(octet_length(visitor) = {KEY_BYTES}), \
             string_agg(visitor, ''::bytea) FROM visits \
             WHERE site = $1 AND scope = $2 AND source = $3 AND day BETWEEN $4 AND $5 \
             GROUP BY day ORDER BY day"
        ))
        .await?;
    // Days holding a key of another length than 16 bytes cannot be cut apart: read by row.
    let mut uneven = Vec::new();
    for (lo, hi) in runs(&missing) {
        let params: [&(dyn ToSql + Sync); 5] = [&site, &scope, &source, &lo, &hi];
        let rows = client.query_raw(&stmt, params).await?;
        futures_util::pin_mut!(rows);
        while let Some(row) = rows.try_next().await? {
            let day: i32 = row.get(0);
            let Some(&n) = wanted.get(&day) else {
                continue;
            };
            let joined: &[u8] = row.get(2);
            if row.get::<_, bool>(1) {
                union.add_day(i64::from(day), n, joined.chunks_exact(KEY_BYTES));
            } else {
                uneven.push(day);
            }
        }
    }
    if !uneven.is_empty() {
        let stmt = client
            .prepare_cached(
                "SELECT day, visitor FROM visits \
                 WHERE site = $1 AND scope = $2 AND source = $3 AND day = ANY($4) ORDER BY day",
            )
            .await?;
        let params: [&(dyn ToSql + Sync); 4] = [&site, &scope, &source, &uneven];
        let rows = client.query_raw(&stmt, params).await?;
        futures_util::pin_mut!(rows);
        let mut day: Option<i32> = None;
        let mut keys = DayKeys::default();
        while let Some(row) = rows.try_next().await? {
            let row_day: i32 = row.get(0);
            if day != Some(row_day) {
                if let Some(done) = day {
                    let n = wanted.get(&done).copied().unwrap_or(0);
                    union.add_day(i64::from(done), n, keys.iter());
                    keys.clear();
                }
                day = Some(row_day);
            }
            keys.push(row.get::<_, &[u8]>(1));
        }
        if let Some(done) = day {
            let n = wanted.get(&done).copied().unwrap_or(0);
            union.add_day(i64::from(done), n, keys.iter());
        }
    }
    Ok(union.count())
}

/// The set generation, in the caller's snapshot.
async fn generation(client: &impl GenericClient) -> Result<i64, Fail> {
    let stmt = client.prepare_cached(daysets::READ_GENERATION).await?;
    Ok(client.query_one(&stmt, &[]).await?.get(0))
}

/// A read-only REPEATABLE READ transaction: counters and visitor sets are one snapshot.
pub(super) async fn snapshot(
    client: &mut deadpool_postgres::Client,
) -> Result<deadpool_postgres::Transaction<'_>, Fail> {
    Ok(client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

pub(super) async fn range_totals(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
) -> Result<BySource, StoreError> {
    let mut client = store.client().await?;
    let client = snapshot(&mut client).await?;
    let mut out = BySource::default();
    let Some((site_id, scope)) = site_scope(&client, site).await? else {
        return Ok(out);
    };
    let (from, to) = clamp(from, to);
    let stmt = client
        .prepare_cached(
            "SELECT source, SUM(views)::int8, SUM(visitors)::int8 FROM counters \
             WHERE site = $1 AND scope = $2 AND day BETWEEN $3 AND $4 GROUP BY source",
        )
        .await?;
    let generation = generation(&client).await?;
    for row in client.query(&stmt, &[&site_id, &scope, &from, &to]).await? {
        let source: i16 = row.get(0);
        // Imported aggregates have no visitor sets: their daily visitors are summed.
        let visitors = if i64::from(source) == IMPORTED_SOURCE {
            row.get::<_, i64>(2).max(0) as u64
        } else {
            let key = (site_id, scope, source);
            distinct_visitors(&client, &store.sets, generation, key, (from, to)).await?
        };
        set_source(
            &mut out,
            source,
            Numbers {
                views: row.get::<_, i64>(1).max(0) as u64,
                visitors,
            },
        );
    }
    client.commit().await?;
    Ok(out)
}

/// The stamps ([`daypages::Stamp`]) of every day `from..=to` of the whole-site scope.
async fn day_stamps(
    client: &impl GenericClient,
    (site, scope): (i64, i64),
    (from, to): (i32, i32),
) -> Result<Vec<(i64, Stamp)>, Fail> {
    let stmt = client
        .prepare_cached(
            "SELECT day, source, views FROM counters \
             WHERE site = $1 AND scope = $2 AND source IN (0, 1, 2) AND day BETWEEN $3 AND $4",
        )
        .await?;
    let rows = client.query(&stmt, &[&site, &scope, &from, &to]).await?;
    let rows = rows.iter().map(|row| {
        (
            i64::from(row.get::<_, i32>(0)),
            i64::from(row.get::<_, i16>(1)),
            row.get(2),
        )
    });
    Ok(daypages::stamps(rows, (i64::from(from), i64::from(to))))
}

/// Runs of consecutive days (`days` sorted, distinct).
fn runs(days: &[i64]) -> Vec<(i32, i32)> {
    let mut runs: Vec<(i32, i32)> = Vec::new();
    for day in days.iter().filter_map(|&d| i32::try_from(d).ok()) {
        match runs.last_mut() {
            Some(run) if run.1.checked_add(1) == Some(day) => run.1 = day,
            _ => runs.push((day, day)),
        }
    }
    runs
}

/// Runs of consecutive days: a warm read misses today and perhaps a day a late hit changed,
/// each read as one range; past `MAX_RUNS` runs, one range spans them all.
fn day_runs(days: &[i64]) -> Vec<(i32, i32)> {
    const MAX_RUNS: usize = 8;
    let runs = runs(days);
    if runs.len() > MAX_RUNS {
        let span = (runs[0].0, runs[runs.len() - 1].1);
        return vec![span];
    }
    runs
}

/// Top pages, in one snapshot: the days' page views come from the rows kept in the store's
/// `pages` (`store::daypages`), the days missing read in one index range per run of days,
/// and exact distinct visitors are counted only for the pages returned.
pub(super) async fn top_pages(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
    limit: u32,
) -> Result<Vec<PageRow>, StoreError> {
    let mut client = store.client().await?;
    let client = snapshot(&mut client).await?;
    let Some((site_id, site_scope)) = site_scope(&client, site).await? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let generation = generation(&client).await?;
    let stamps = day_stamps(&client, (site_id, site_scope), (from, to)).await?;
    let mut sum = store.pages.sum(generation, site_scope, &stamps);
    if !sum.missing().is_empty() {
        let wanted: HashMap<i64, Stamp> = sum.missing().iter().copied().collect();
        let mut days: Vec<i64> = wanted.keys().copied().collect();
        days.sort_unstable();
        let stmt = client
            .prepare_cached(
                "SELECT c.day, c.scope, c.source, c.views \
                 FROM pages p JOIN counters c ON c.site = p.site AND c.scope = p.id \
                      AND c.source = ANY('{0,1,2}'::int2[]) AND c.day BETWEEN $2 AND $3 \
                 WHERE p.site = $1 AND p.path != ''",
            )
            .await?;
        let mut by_day: HashMap<i64, Vec<daypages::DayRow>> = HashMap::new();
        for (lo, hi) in day_runs(&days) {
            let params: [&(dyn ToSql + Sync); 3] = [&site_id, &lo, &hi];
            let rows = client.query_raw(&stmt, params).await?;
            futures_util::pin_mut!(rows);
            while let Some(row) = rows.try_next().await? {
                let day = i64::from(row.get::<_, i32>(0));
                if wanted.contains_key(&day) {
                    let source = i64::from(row.get::<_, i16>(2));
                    by_day
                        .entry(day)
                        .or_default()
                        .push((row.get(1), source, row.get(3)));
                }
            }
        }
        for day in days {
            let mut rows = by_day.remove(&day).unwrap_or_default();
            rows.sort_unstable();
            sum.add_day(day, wanted[&day], &rows);
        }
    }
    let candidates = daypages::candidates(sum.totals(), limit as usize);
    let ids: Vec<i64> = candidates.iter().map(|(scope, _)| *scope).collect();
    let stmt = client
        .prepare_cached("SELECT id, path FROM pages WHERE id = ANY($1)")
        .await?;
    let views: HashMap<i64, daypages::PageViews> = candidates.into_iter().collect();
    // Streamed: with every page tied for the last place, all of them are candidates.
    let mut ranked = daypages::Ranked::new(limit as usize);
    let params: [&(dyn ToSql + Sync); 1] = [&ids];
    let rows = client.query_raw(&stmt, params).await?;
    futures_util::pin_mut!(rows);
    while let Some(row) = rows.try_next().await? {
        let scope: i64 = row.get(0);
        if let Some(v) = views.get(&scope) {
            ranked.offer(scope, row.get(1), *v);
        }
    }
    let best = ranked.best();
    // The exact visitors of each page and source with views. A busy page's year is ~600,000
    // set rows for PostgreSQL to scan: with a connection free in the pool, every other one is
    // counted there, in this read's snapshot, while this connection counts the rest.
    let jobs: Vec<(usize, i64, Source)> = best
        .iter()
        .enumerate()
        .flat_map(|(i, (scope, _, views))| {
            [(Source::Web, views.web), (Source::Badge, views.badge)]
                .into_iter()
                .filter(|&(_, views)| views > 0)
                .map(move |(source, _)| (i, *scope, source))
        })
        .collect();
    let scope = (site_id, generation, (from, to));
    let mut spare = if jobs.len() > 1 {
        spare_client(store).await
    } else {
        None
    };
    let other = match spare.as_mut() {
        Some(spare) => in_snapshot_of(&client, spare).await.ok(),
        None => None,
    };
    let counted = match other {
        Some(other) => {
            let mine: Vec<_> = jobs.iter().copied().step_by(2).collect();
            let theirs: Vec<_> = jobs.iter().copied().skip(1).step_by(2).collect();
            let (a, b) = futures_util::future::join(
                page_visitors(&client, &store.sets, scope, &mine),
                page_visitors(&other, &store.sets, scope, &theirs),
            )
            .await;
            // The spare only read: a failure there (a dropped connection) costs this read
            // the time of counting its pages here, not the answer.
            let b = match b {
                Ok(b) => {
                    let _ = other.commit().await;
                    b
                }
                Err(_) => page_visitors(&client, &store.sets, scope, &theirs).await?,
            };
            let mut all = a?;
            all.extend(b);
            all
        }
        None => page_visitors(&client, &store.sets, scope, &jobs).await?,
    };
    let mut pages: Vec<PageRow> = best
        .into_iter()
        .map(|(_, page, views)| {
            let mut numbers = BySource::default();
            numbers.web.views = views.web;
            numbers.badge.views = views.badge;
            PageRow { page, numbers }
        })
        .collect();
    for (i, source, visitors) in counted {
        if let Some(row) = pages.get_mut(i) {
            match source {
                Source::Badge => row.numbers.badge.visitors = visitors,
                Source::Web => row.numbers.web.visitors = visitors,
            }
        }
    }
    client.commit().await?;
    Ok(pages)
}

/// Exact distinct visitors of each (index, page scope, source) of `jobs` over the days of
/// `scope` (site, set generation, days).
async fn page_visitors(
    client: &impl GenericClient,
    sets: &DaySets,
    (site, generation, days): (i64, i64, (i32, i32)),
    jobs: &[(usize, i64, Source)],
) -> Result<Vec<(usize, Source, u64)>, Fail> {
    let mut out = Vec::with_capacity(jobs.len());
    for &(i, page, source) in jobs {
        let key = (site, page, source.code() as i16);
        out.push((
            i,
            source,
            distinct_visitors(client, sets, generation, key, days).await?,
        ));
    }
    Ok(out)
}

/// A second connection for one read, only if the pool gives one at once (a free one, or room
/// for a new one): it never waits behind other work for one.
async fn spare_client(store: &PgStore) -> Option<deadpool_postgres::Object> {
    let timeouts = deadpool_postgres::Timeouts {
        wait: Some(std::time::Duration::ZERO),
        ..store.pool.timeouts()
    };
    store.pool.timeout_get(&timeouts).await.ok()
}

/// A read-only transaction on `spare` that sees exactly the snapshot of `first`'s open
/// transaction (exported, so both read the same rows).
async fn in_snapshot_of<'a>(
    first: &impl GenericClient,
    spare: &'a mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'a>, Fail> {
    let id: String = first
        .query_one("SELECT pg_export_snapshot()", &[])
        .await?
        .get(0);
    // PostgreSQL's ids are hexadecimal groups and dashes; never pass anything else on.
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(Fail::Store(StoreError::Unavailable(format!(
            "unexpected snapshot id {id:?}"
        ))));
    }
    let tx = snapshot(spare).await?;
    tx.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
        .await?;
    Ok(tx)
}

pub(super) async fn top_referrers(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
    limit: u32,
) -> Result<Vec<ReferrerRow>, StoreError> {
    let client = store.client().await?;
    let Some((site_id, _)) = site_scope(&client, site).await? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let stmt = client
        .prepare_cached(
            "SELECT host, SUM(views)::int8 AS n FROM referrer_counters \
             WHERE site = $1 AND day BETWEEN $2 AND $3 \
             GROUP BY host ORDER BY n DESC, host COLLATE \"C\" LIMIT $4",
        )
        .await?;
    let rows = client
        .query(&stmt, &[&site_id, &from, &to, &i64::from(limit)])
        .await?;
    Ok(rows
        .iter()
        .map(|r| ReferrerRow {
            host: r.get(0),
            views: r.get::<_, i64>(1).max(0) as u64,
        })
        .collect())
}

pub(super) async fn top_events(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
    limit: u32,
) -> Result<Vec<EventRow>, StoreError> {
    let client = store.client().await?;
    let Some((site_id, _)) = site_scope(&client, site).await? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let stmt = client
        .prepare_cached(
            "WITH top AS (SELECT name, SUM(count)::int8 AS n FROM event_counters \
                          WHERE site = $1 AND day BETWEEN $2 AND $3 \
                          GROUP BY name ORDER BY n DESC, name COLLATE \"C\" LIMIT $4) \
             SELECT t.name, t.n, c.day, c.count FROM top t \
             JOIN event_counters c ON c.site = $1 AND c.name = t.name AND c.day BETWEEN $2 AND $3 \
             ORDER BY t.n DESC, t.name COLLATE \"C\", c.day",
        )
        .await?;
    let mut out: Vec<EventRow> = Vec::new();
    for row in client
        .query(&stmt, &[&site_id, &from, &to, &i64::from(limit)])
        .await?
    {
        let name: String = row.get(0);
        let day = num_day(row.get(2))?;
        let count = u64::try_from(row.get::<_, i64>(3)).unwrap_or(0);
        if out.last().is_none_or(|last| last.name != name) {
            out.push(EventRow {
                name,
                count: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
                days: Vec::new(),
            });
        }
        if let Some(last) = out.last_mut() {
            last.days.push((day, count));
        }
    }
    Ok(out)
}

pub(super) async fn filtered(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
) -> Result<FilteredCounts, StoreError> {
    let client = store.client().await?;
    let (from, to) = clamp(from, to);
    let stmt = client
        .prepare_cached(
            "SELECT f.reason, SUM(f.count)::int8 FROM filtered f JOIN site_keys k ON k.id = f.site \
             WHERE k.name = $1 AND f.day BETWEEN $2 AND $3 GROUP BY f.reason",
        )
        .await?;
    let mut out = FilteredCounts::default();
    for row in client.query(&stmt, &[&site, &from, &to]).await? {
        if let Some(reason) = Reason::from_code(i64::from(row.get::<_, i16>(0))) {
            out.add(reason, u64::try_from(row.get::<_, i64>(1)).unwrap_or(0));
        }
    }
    Ok(out)
}
