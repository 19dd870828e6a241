//! Queries: counts, sites, daily series, range totals, top pages, referrers (from their
//! counters), events and the views not counted.
//!
//! Range reads sum what is kept in memory, each day read from the database only when it is
//! not kept or has changed: top pages from the per-day page rows (`store::daypages`), exact
//! distinct visitors, counted only for the rows returned, as the union of the per-day sets
//! (`store::daysets`).

use std::collections::HashMap;

use super::*;
use crate::core::filtered::Reason;
use crate::store::daypages::{self, DayPages, Stamp};
use crate::store::daysets::{self, DayKeys, DaySets};

/// The site's id and whole-site scope, if the site was ever counted.
fn site_scope(conn: &Connection, site: &str) -> Result<Option<(i64, i64)>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT k.id, p.id FROM site_keys k JOIN pages p ON p.site = k.id AND p.path = '' \
             WHERE k.name = ?1",
        )?
        .query_row([site], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

pub(super) fn read_counts(
    conn: &Connection,
    site: &str,
    page: &str,
    today: i64,
) -> Result<CountsRaw, StoreError> {
    let mut raw = CountsRaw::default();
    let mut stmt = conn.prepare_cached(
        "SELECT p.path, c.source, c.day, c.views, c.visitors \
         FROM site_keys k JOIN pages p ON p.site = k.id AND p.path IN ('', ?2) \
         JOIN counters c ON c.scope = p.id AND c.source IN (0, 1, 2) AND c.day IN (-1, ?3) \
         WHERE k.name = ?1",
    )?;
    let mut rows = stmt.query(params![site, page, today])?;
    while let Some(row) = rows.next()? {
        let row_page: String = row.get(0)?;
        let source: i64 = row.get(1)?;
        let row_day: i64 = row.get(2)?;
        let n = numbers(row.get(3)?, row.get(4)?);
        // A page key is never empty, so `row_page == ""` means the whole site.
        let scope = match (row_page.is_empty(), row_day == ALL_TIME) {
            (true, true) => &mut raw.site_all,
            (true, false) => &mut raw.site_today,
            (false, true) => &mut raw.page_all,
            (false, false) => &mut raw.page_today,
        };
        set_source(scope, source, n);
    }
    let mut stmt = conn.prepare_cached(
        "SELECT p.path, b.views, b.visitors \
         FROM site_keys k JOIN pages p ON p.site = k.id AND p.path IN ('', ?2) \
         JOIN bases b ON b.scope = p.id WHERE k.name = ?1",
    )?;
    let mut rows = stmt.query(params![site, page])?;
    while let Some(row) = rows.next()? {
        let row_page: String = row.get(0)?;
        let n = numbers(row.get(1)?, row.get(2)?);
        if row_page.is_empty() {
            raw.site_base = n;
        } else {
            raw.page_base = n;
        }
    }
    Ok(raw)
}

pub(super) fn site_from_row(row: &rusqlite::Row<'_>) -> Result<Site, StoreError> {
    let id: String = row.get(0)?;
    let origins: String = row.get(1)?;
    let tz: String = row.get(2)?;
    let public: bool = row.get(3)?;
    Ok(Site {
        id: SiteId::parse(&id).map_err(|e| StoreError::Invalid(format!("site {id:?}: {e}")))?,
        origins: serde_json::from_str(&origins)
            .map_err(|e| StoreError::Invalid(format!("origins of {id:?}: {e}")))?,
        zone: SiteZone::parse(&tz).map_err(|e| StoreError::Invalid(e.to_string()))?,
        public,
        ingest_key: row.get(4)?,
    })
}

pub(super) fn query_sites(conn: &Connection, id: Option<&str>) -> Result<Vec<Site>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, origins, timezone, public, ingest_key FROM sites \
         WHERE ?1 IS NULL OR id = ?1 ORDER BY id",
    )?;
    let mut rows = stmt.query(params![id])?;
    let mut sites = Vec::new();
    while let Some(row) = rows.next()? {
        sites.push(site_from_row(row)?);
    }
    Ok(sites)
}

/// Create or update a site's configuration; an ingest key of `None` keeps the stored one.
pub(super) fn insert_site(conn: &Connection, site: &Site) -> Result<(), StoreError> {
    let origins = serde_json::to_string(&site.origins).map_err(backend)?;
    conn.execute(
        "INSERT INTO sites (id, origins, timezone, public, ingest_key) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (id) DO UPDATE SET origins = excluded.origins, \
         timezone = excluded.timezone, public = excluded.public, \
         ingest_key = COALESCE(excluded.ingest_key, sites.ingest_key)",
        params![
            site.id.as_str(),
            origins,
            site.zone.name(),
            site.public,
            site.ingest_key
        ],
    )?;
    Ok(())
}

pub(super) use crate::store::{numbers, set_source};

/// Day numbers of a query range, never reaching the all-time rows.
fn clamp(from: i64, to: i64) -> (i64, i64) {
    (from.max(0), to)
}

pub(super) fn read_series(
    conn: &Connection,
    site: &str,
    from: i64,
    to: i64,
) -> Result<Vec<DayRow>, StoreError> {
    let Some((_, scope)) = site_scope(conn, site)? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let mut stmt = conn.prepare_cached(
        "SELECT day, source, views, visitors FROM counters \
         WHERE scope = ?1 AND source IN (0, 1, 2) AND day BETWEEN ?2 AND ?3 ORDER BY day, source",
    )?;
    let mut rows = stmt.query(params![scope, from, to])?;
    let mut out: Vec<DayRow> = Vec::new();
    while let Some(row) = rows.next()? {
        let day = num_day(row.get(0)?)?;
        let n = numbers(row.get(2)?, row.get(3)?);
        if out.last().is_none_or(|last| last.day != day) {
            out.push(DayRow {
                day,
                numbers: BySource::default(),
            });
        }
        if let Some(last) = out.last_mut() {
            set_source(&mut last.numbers, row.get(1)?, n);
        }
    }
    Ok(out)
}

/// Exact distinct visitors of one scope and source over the days `from..=to`, in the caller's
/// read transaction: the days' counter rows say which days have visitors and how many, the
/// kept sets of `sets` answer for the days they still match, and the others are read (one
/// seek per day, plus their rows still in the visitor-set journal, one scan of at most
/// `journal::FLUSH_ROWS` and a batch for all of them) and kept.
fn distinct_visitors(
    conn: &Connection,
    sets: &DaySets,
    generation: i64,
    (scope, source): (i64, i64),
    (from, to): (i64, i64),
) -> Result<u64, StoreError> {
    let days: Vec<(i64, u64)> = conn
        .prepare_cached(
            "SELECT day, visitors FROM counters \
             WHERE scope = ?1 AND source = ?2 AND day BETWEEN ?3 AND ?4 AND visitors > 0",
        )?
        .query_map(params![scope, source, from, to], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })?
        .collect::<Result<_, _>>()?;
    let mut union = sets.union(generation, scope, source, &days);
    if union.missing().is_empty() {
        return Ok(union.count());
    }
    let mut journal: HashMap<i64, Vec<Vec<u8>>> = HashMap::new();
    let mut stmt = conn.prepare_cached(
        "SELECT day, visitor FROM set_journal \
         WHERE scope = ?1 AND source = ?2 AND day BETWEEN ?3 AND ?4",
    )?;
    let mut rows = stmt.query(params![scope, source, from, to])?;
    while let Some(row) = rows.next()? {
        journal.entry(row.get(0)?).or_default().push(row.get(1)?);
    }
    let mut stmt = conn.prepare_cached(
        "SELECT visitor FROM visits WHERE day = ?1 AND scope = ?2 AND source = ?3",
    )?;
    let mut keys = DayKeys::default();
    for (day, visitors) in union.missing().to_vec() {
        keys.clear();
        let mut rows = stmt.query(params![day, scope, source])?;
        while let Some(row) = rows.next()? {
            keys.push(row.get_ref(0)?.as_blob().map_err(rusqlite::Error::from)?);
        }
        for key in journal.remove(&day).unwrap_or_default() {
            keys.push(&key);
        }
        union.add_day(day, visitors, keys.iter());
    }
    Ok(union.count())
}

/// Run `f` in one read transaction, so counters and visitor sets are one snapshot.
pub(super) fn snapshot<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

fn generation(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn
        .prepare_cached(daysets::READ_GENERATION)?
        .query_row([], |r| r.get(0))?)
}

/// Range totals; run it in a [`snapshot`].
pub(super) fn read_range_totals(
    conn: &Connection,
    sets: &DaySets,
    site: &str,
    from: i64,
    to: i64,
) -> Result<BySource, StoreError> {
    let mut out = BySource::default();
    let Some((_, scope)) = site_scope(conn, site)? else {
        return Ok(out);
    };
    let (from, to) = clamp(from, to);
    let mut stmt = conn.prepare_cached(
        "SELECT source, SUM(views), SUM(visitors) FROM counters \
         WHERE scope = ?1 AND source IN (0, 1, 2) AND day BETWEEN ?2 AND ?3 GROUP BY source",
    )?;
    let views: Vec<(i64, i64, i64)> = stmt
        .query_map(params![scope, from, to], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let generation = generation(conn)?;
    for (source, views, summed) in views {
        // Imported aggregates have no visitor sets: their daily visitors are summed.
        let visitors = if source == IMPORTED_SOURCE {
            summed.max(0) as u64
        } else {
            distinct_visitors(conn, sets, generation, (scope, source), (from, to))?
        };
        set_source(
            &mut out,
            source,
            Numbers {
                views: views.max(0) as u64,
                visitors,
            },
        );
    }
    Ok(out)
}

/// The stamps ([`daypages::Stamp`]) of every day `from..=to` of the whole-site scope.
fn day_stamps(
    conn: &Connection,
    scope: i64,
    (from, to): (i64, i64),
) -> Result<Vec<(i64, Stamp)>, StoreError> {
    let rows: Vec<daypages::DayRow> = conn
        .prepare_cached(
            "SELECT day, source, views FROM counters \
             WHERE scope = ?1 AND source IN (0, 1, 2) AND day BETWEEN ?2 AND ?3",
        )?
        .query_map(params![scope, from, to], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    Ok(daypages::stamps(rows, (from, to)))
}

/// Top pages; run it in a [`snapshot`]. The days' page views come from the rows kept in
/// `pages` (`store::daypages`), each day missing read in one seek of the counters' key (day
/// first), and exact distinct visitors are counted only for the pages returned.
pub(super) fn read_top_pages(
    conn: &Connection,
    (sets, pages): (&DaySets, &DayPages),
    site: &str,
    from: i64,
    to: i64,
    limit: u32,
) -> Result<Vec<PageRow>, StoreError> {
    let Some((site_id, site_scope)) = site_scope(conn, site)? else {
        return Ok(Vec::new());
    };
    let (from, to) = clamp(from, to);
    let generation = generation(conn)?;
    let stamps = day_stamps(conn, site_scope, (from, to))?;
    let mut sum = pages.sum(generation, site_scope, &stamps);
    if !sum.missing().is_empty() {
        let (lo, hi): (Option<i64>, Option<i64>) = conn
            .prepare_cached("SELECT MIN(id), MAX(id) FROM pages WHERE site = ?1")?
            .query_row([site_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let mut stmt = conn.prepare_cached(
            "SELECT c.scope, c.source, c.views FROM counters c CROSS JOIN pages p ON p.id = c.scope \
             WHERE c.day = ?1 AND c.scope BETWEEN ?2 AND ?3 AND c.source IN (0, 1, 2) \
               AND p.site = ?4 AND p.path != '' \
             ORDER BY c.scope",
        )?;
        for (day, stamp) in sum.missing().to_vec() {
            let rows: Vec<daypages::DayRow> = stmt
                .query_map(params![day, lo, hi, site_id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<Result<_, _>>()?;
            sum.add_day(day, stamp, &rows);
        }
    }
    let mut path = conn.prepare_cached("SELECT path FROM pages WHERE id = ?1")?;
    let mut ranked = daypages::Ranked::new(limit as usize);
    for (scope, views) in daypages::candidates(sum.totals(), limit as usize) {
        if let Some(page) = path.query_row([scope], |r| r.get(0)).optional()? {
            ranked.offer(scope, page, views);
        }
    }
    let mut out = Vec::new();
    for (scope, page, views) in ranked.best() {
        let mut numbers = BySource::default();
        for (source, views, target) in [
            (Source::Web, views.web, &mut numbers.web),
            (Source::Badge, views.badge, &mut numbers.badge),
        ] {
            if views > 0 {
                target.views = views;
                target.visitors =
                    distinct_visitors(conn, sets, generation, (scope, source.code()), (from, to))?;
            }
        }
        out.push(PageRow { page, numbers });
    }
    Ok(out)
}

/// The smallest UUIDv7 key of an instant: ids at or after `ms` sort at or after it.
pub(super) fn id_bound(ms: i64) -> [u8; 16] {
    let mut bound = [0u8; 16];
    bound[..6].copy_from_slice(&u64::try_from(ms).unwrap_or(0).to_be_bytes()[2..]);
    bound
}

pub(super) fn read_top_referrers(
    conn: &Connection,
    site: &str,
    from: i64,
    to: i64,
    limit: u32,
) -> Result<Vec<ReferrerRow>, StoreError> {
    let (from, to) = clamp(from, to);
    // The site's rows of the range are one stretch of the (site, day, host) key; the sorter
    // keeps only the `limit` best hosts.
    let mut stmt = conn.prepare_cached(
        "SELECT c.host, SUM(c.views) AS n FROM site_keys k \
         JOIN referrer_counters c ON c.site = k.id AND c.day BETWEEN ?2 AND ?3 \
         WHERE k.name = ?1 GROUP BY c.host ORDER BY n DESC, c.host LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![site, from, to, limit], |r| {
        Ok(ReferrerRow {
            host: r.get(0)?,
            views: r.get::<_, i64>(1)?.max(0) as u64,
        })
    })?;
    rows.collect::<Result<_, _>>().map_err(Into::into)
}

/// The `limit` event names with most events over `from..=to`, with their day rows: the names
/// are summed, ranked and cut in SQL (a GROUP BY over the `(site, name, day)` key), and only
/// the chosen names' day rows are read back.
pub(super) fn read_top_events(
    conn: &Connection,
    site: &str,
    from: i64,
    to: i64,
    limit: u32,
) -> Result<Vec<EventRow>, StoreError> {
    let (from, to) = clamp(from, to);
    let mut stmt = conn.prepare_cached(
        "WITH k AS (SELECT id FROM site_keys WHERE name = ?1), \
         top AS (SELECT c.name, SUM(c.count) AS n FROM event_counters c, k \
                 WHERE c.site = k.id AND c.day BETWEEN ?2 AND ?3 \
                 GROUP BY c.name ORDER BY n DESC, c.name LIMIT ?4) \
         SELECT t.name, t.n, c.day, c.count FROM top t, k \
         JOIN event_counters c ON c.site = k.id AND c.name = t.name AND c.day BETWEEN ?2 AND ?3 \
         ORDER BY t.n DESC, t.name, c.day",
    )?;
    let mut rows = stmt.query(params![site, from, to, limit])?;
    let mut out: Vec<EventRow> = Vec::new();
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let day = num_day(row.get(2)?)?;
        let count = u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0);
        if out.last().is_none_or(|last| last.name != name) {
            out.push(EventRow {
                name,
                count: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                days: Vec::new(),
            });
        }
        if let Some(last) = out.last_mut() {
            last.days.push((day, count));
        }
    }
    Ok(out)
}

/// Views of `site` not counted over the day numbers `from..=to`, by reason.
pub(super) fn read_filtered(
    conn: &Connection,
    site: &str,
    from: i64,
    to: i64,
) -> Result<FilteredCounts, StoreError> {
    let (from, to) = clamp(from, to);
    let mut stmt = conn.prepare_cached(
        "SELECT f.reason, SUM(f.count) FROM filtered f JOIN site_keys k ON k.id = f.site \
         WHERE k.name = ?1 AND f.day BETWEEN ?2 AND ?3 GROUP BY f.reason",
    )?;
    let mut rows = stmt.query(params![site, from, to])?;
    let mut out = FilteredCounts::default();
    while let Some(row) = rows.next()? {
        // A reason this version does not know (written by a newer one) is not shown.
        if let Some(reason) = Reason::from_code(row.get(0)?) {
            out.add(reason, u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0));
        }
    }
    Ok(out)
}
