//! Queries: counts, sites, daily series, range totals, top pages and referrers.

use super::*;

pub(super) fn read_counts(
    conn: &Connection,
    site: &str,
    page: &str,
    today: &str,
) -> Result<CountsRaw, StoreError> {
    let mut raw = CountsRaw::default();
    let mut stmt = conn.prepare_cached(
        "SELECT source, page, day, views, visitors FROM counters \
         WHERE site = ?1 AND page IN ('', ?2) AND day IN ('*', ?3)",
    )?;
    let mut rows = stmt.query(params![site, page, today])?;
    while let Some(row) = rows.next()? {
        let source: i64 = row.get(0)?;
        let row_page: String = row.get(1)?;
        let row_day: String = row.get(2)?;
        let numbers = Numbers {
            views: row.get::<_, i64>(3)? as u64,
            visitors: row.get::<_, i64>(4)? as u64,
        };
        // A page key is never empty, so `row_page == ""` means the whole site.
        let targets: [(bool, &mut BySource); 2] = if row_day == ALL_TIME {
            [
                (row_page.is_empty(), &mut raw.site_all),
                (row_page == page, &mut raw.page_all),
            ]
        } else {
            [
                (row_page.is_empty(), &mut raw.site_today),
                (row_page == page, &mut raw.page_today),
            ]
        };
        for (hit, scope) in targets {
            if hit {
                if source == Source::Badge.code() {
                    scope.badge = numbers;
                } else {
                    scope.web = numbers;
                }
            }
        }
    }
    let mut stmt = conn.prepare_cached(
        "SELECT page, views, visitors FROM bases WHERE site = ?1 AND page IN ('', ?2)",
    )?;
    let mut rows = stmt.query(params![site, page])?;
    while let Some(row) = rows.next()? {
        let row_page: String = row.get(0)?;
        let numbers = Numbers {
            views: row.get::<_, i64>(1)? as u64,
            visitors: row.get::<_, i64>(2)? as u64,
        };
        if row_page.is_empty() {
            raw.site_base = numbers;
        } else {
            raw.page_base = numbers;
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
        ingest_key: None,
    })
}

pub(super) fn query_sites(conn: &Connection, id: Option<&str>) -> Result<Vec<Site>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, origins, timezone, public FROM sites WHERE ?1 IS NULL OR id = ?1 ORDER BY id",
    )?;
    let mut rows = stmt.query(params![id])?;
    let mut sites = Vec::new();
    while let Some(row) = rows.next()? {
        sites.push(site_from_row(row)?);
    }
    Ok(sites)
}

pub(super) fn insert_site(conn: &Connection, site: &Site, replace: bool) -> Result<(), StoreError> {
    let origins = serde_json::to_string(&site.origins).map_err(backend)?;
    let verb = if replace {
        "INSERT OR REPLACE"
    } else {
        "INSERT OR IGNORE"
    };
    conn.execute(
        &format!("{verb} INTO sites (id, origins, timezone, public) VALUES (?1, ?2, ?3, ?4)"),
        params![site.id.as_str(), origins, site.zone.name(), site.public],
    )?;
    Ok(())
}

pub(super) fn numbers(views: i64, visitors: i64) -> Numbers {
    Numbers {
        views: views.max(0) as u64,
        visitors: visitors.max(0) as u64,
    }
}

pub(super) fn set_source(target: &mut BySource, source: i64, n: Numbers) {
    if source == Source::Badge.code() {
        target.badge = n;
    } else {
        target.web = n;
    }
}

pub(super) fn read_series(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
) -> Result<Vec<DayRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT day, source, views, visitors FROM counters \
         WHERE site = ?1 AND page = '' AND day != '*' AND day BETWEEN ?2 AND ?3 ORDER BY day",
    )?;
    let mut rows = stmt.query(params![site, from, to])?;
    let mut out: Vec<DayRow> = Vec::new();
    while let Some(row) = rows.next()? {
        let day: String = row.get(0)?;
        let day: Date = day
            .parse()
            .map_err(|e| StoreError::Invalid(format!("day {day:?}: {e}")))?;
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

pub(super) fn read_range_totals(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
) -> Result<BySource, StoreError> {
    let mut out = BySource::default();
    let mut stmt = conn.prepare_cached(
        "SELECT source, SUM(views) FROM counters \
         WHERE site = ?1 AND page = '' AND day != '*' AND day BETWEEN ?2 AND ?3 GROUP BY source",
    )?;
    let mut views = HashMap::new();
    let mut rows = stmt.query(params![site, from, to])?;
    while let Some(row) = rows.next()? {
        views.insert(row.get::<_, i64>(0)?, row.get::<_, i64>(1)?);
    }
    // Distinct visitors over several days: exact, from the per-day visitor sets.
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(DISTINCT visitor) FROM visitors \
         WHERE site = ?1 AND source = ?2 AND page = '' AND day != '*' AND day BETWEEN ?3 AND ?4",
    )?;
    for (source, views) in views {
        let visitors: i64 = stmt.query_row(params![site, source, from, to], |r| r.get(0))?;
        set_source(&mut out, source, numbers(views, visitors));
    }
    Ok(out)
}

pub(super) fn read_top_pages(
    conn: &Connection,
    site: &str,
    from: &str,
    to: &str,
    limit: u32,
) -> Result<Vec<PageRow>, StoreError> {
    // Rank by the shown number (the larger source), then fill exact visitors per page.
    let mut stmt = conn.prepare_cached(
        "SELECT page, source, SUM(views) FROM counters \
         WHERE site = ?1 AND page != '' AND day != '*' AND day BETWEEN ?2 AND ?3 \
         GROUP BY page, source",
    )?;
    let mut by_page: HashMap<String, BySource> = HashMap::new();
    let mut rows = stmt.query(params![site, from, to])?;
    while let Some(row) = rows.next()? {
        let entry = by_page.entry(row.get(0)?).or_default();
        set_source(entry, row.get(1)?, numbers(row.get(2)?, 0));
    }
    let mut pages: Vec<PageRow> = by_page
        .into_iter()
        .map(|(page, numbers)| PageRow { page, numbers })
        .collect();
    pages.sort_by(|a, b| {
        let key = |p: &PageRow| p.numbers.web.views.max(p.numbers.badge.views);
        key(b).cmp(&key(a)).then_with(|| a.page.cmp(&b.page))
    });
    pages.truncate(limit as usize);
    let mut stmt = conn.prepare_cached(
        "SELECT COUNT(DISTINCT visitor) FROM visitors \
         WHERE site = ?1 AND source = ?2 AND page = ?3 AND day != '*' AND day BETWEEN ?4 AND ?5",
    )?;
    for p in &mut pages {
        for (source, n) in [
            (Source::Web, &mut p.numbers.web),
            (Source::Badge, &mut p.numbers.badge),
        ] {
            if n.views > 0 {
                let v: i64 =
                    stmt.query_row(params![site, source.code(), p.page, from, to], |r| r.get(0))?;
                n.visitors = v.max(0) as u64;
            }
        }
    }
    Ok(pages)
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
    (from, to): (&str, &str),
    (lo, hi): ([u8; 16], [u8; 16]),
    limit: u32,
) -> Result<Vec<ReferrerRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "WITH r AS (SELECT substr(referrer, instr(referrer, '://') + 3) AS rest FROM events \
                    WHERE event_id >= ?5 AND event_id < ?6 AND site = ?1 AND kind = 0 \
                      AND referrer IS NOT NULL AND day BETWEEN ?2 AND ?3) \
         SELECT CASE WHEN instr(rest, '/') > 0 THEN substr(rest, 1, instr(rest, '/') - 1) ELSE rest END \
                AS host, COUNT(*) AS n FROM r GROUP BY host ORDER BY n DESC, host LIMIT ?4",
    )?;
    let rows = stmt.query_map(params![site, from, to, limit, &lo[..], &hi[..]], |r| {
        Ok(ReferrerRow {
            host: r.get(0)?,
            views: r.get::<_, i64>(1)?.max(0) as u64,
        })
    })?;
    rows.collect::<Result<_, _>>().map_err(Into::into)
}
