//! Recounting every counter from raw events, and repairing drift.
//!
//! Counters are the per-scope view and visitor counters, the custom-event counters and the
//! referrer counters (views with a referrer per site, day and host).
//!
//! The rule of what is compared (and, with repair, rewritten): a counter row is comparable
//! when its raw events are all still stored and the row itself was not pruned, that is
//! - no raw event was ever pruned, or the row is a day row after the raw prune marker's day
//!   (`meta.pruned_before_ms`, plus one day so every time zone's local day is complete;
//!   all-time rows are then never comparable), and
//! - it is not a per-page day row before the page prune marker (`meta.page_rows_before_day`).
//!
//! Imported daily aggregates (`source` = [`IMPORTED_SOURCE`]) have no raw events: they are
//! never compared with a recount. Instead each imported day row must lie within 0 and
//! [`MAX_IMPORTED_COUNT`], and each imported all-time row must be the sum of its day rows;
//! repair clamps the day rows and recomputes the sums.
//!
//! Repair deletes and re-inserts exactly the comparable rows, rebuilds the per-day visitor
//! sets of days after both the raw prune marker and the visitor prune marker
//! (`meta.visitor_rows_before_day`), and refills the all-time sets from the stored events
//! (rebuilding them only when no raw event was ever pruned). Pruned rows never come back.
//!
//! A verify of one site ([`Only::site`]) reads and rewrites that site's rows only: every query
//! is narrowed at its source, so a repair holds the writer for one site's recount.

use super::*;
use crate::store::MAX_IMPORTED_COUNT;

/// The recount of every counter from raw events: (scope, source, name, day, views, visitors).
const RECOUNT: &str = "
    SELECT page AS scope, source, '' AS name, day, COUNT(*) AS views,
        COUNT(DISTINCT visitor) AS visitors FROM events WHERE kind = 0 GROUP BY page, source, day
    UNION ALL SELECT (SELECT id FROM pages WHERE site = e.site AND path = ''), source, '', day,
        COUNT(*), COUNT(DISTINCT visitor) FROM events e WHERE kind = 0 GROUP BY site, source, day
    UNION ALL SELECT page, source, '', -1, COUNT(*), COUNT(DISTINCT visitor)
        FROM events WHERE kind = 0 GROUP BY page, source
    UNION ALL SELECT (SELECT id FROM pages WHERE site = e.site AND path = ''), source, '', -1,
        COUNT(*), COUNT(DISTINCT visitor) FROM events e WHERE kind = 0 GROUP BY site, source";

const STORED: &str = "SELECT scope, source, '', day, views, visitors FROM counters";

/// Custom-event counters, shaped like [`RECOUNT`] (site in `scope`, source -1, the name).
const RECOUNT_EVENTS: &str = "
    SELECT site AS scope, -1 AS source, name, day, COUNT(*) AS views, 0 AS visitors
        FROM events WHERE kind = 1 GROUP BY site, name, day
    UNION ALL SELECT site, -1, name, -1, COUNT(*), 0 FROM events WHERE kind = 1 GROUP BY site, name";

const STORED_EVENTS: &str = "SELECT site, -1, name, day, count, 0 FROM event_counters";

/// Referrer counters, shaped like [`RECOUNT`] (site in `scope`, source -2, the host in
/// `name`).
fn recount_referrers() -> String {
    format!(
        "SELECT site AS scope, -2 AS source, host AS name, day, COUNT(*) AS views, 0 AS visitors
             FROM (SELECT site, day, {} AS host FROM events
                   WHERE kind = 0 AND referrer IS NOT NULL) GROUP BY site, host, day",
        super::schema::REFERRER_HOST
    )
}

const STORED_REFERRERS: &str = "SELECT site, -2, host, day, views, 0 FROM referrer_counters";

/// Which rows a verify covers: SQL conditions appended to the queries (empty for all sites).
#[derive(Debug, Clone, Default)]
pub(super) struct Only {
    /// On a table with a `site` column.
    events: String,
    /// On a table keyed by `scope`.
    scopes: String,
}

impl Only {
    /// Every site.
    pub(super) fn all() -> Self {
        Self::default()
    }

    /// The site of id `site` only.
    pub(super) fn site(site: i64) -> Self {
        Self {
            events: format!(" AND site = {site}"),
            scopes: format!(" AND scope IN (SELECT id FROM pages WHERE site = {site})"),
        }
    }

    fn recount(&self) -> String {
        RECOUNT.replace("WHERE kind = 0", &format!("WHERE kind = 0{}", self.events))
    }

    fn recount_events(&self) -> String {
        RECOUNT_EVENTS.replace("WHERE kind = 1", &format!("WHERE kind = 1{}", self.events))
    }

    fn recount_referrers(&self) -> String {
        recount_referrers().replace("WHERE kind = 0", &format!("WHERE kind = 0{}", self.events))
    }

    fn stored_referrers(&self) -> String {
        format!("{STORED_REFERRERS} WHERE 1{}", self.events)
    }

    fn stored(&self) -> String {
        format!("{STORED} WHERE 1{}", self.scopes)
    }

    fn stored_events(&self) -> String {
        format!("{STORED_EVENTS} WHERE 1{}", self.events)
    }
}

/// `column` within 0 and [`MAX_IMPORTED_COUNT`].
fn clamp(column: &str) -> String {
    format!("MIN(MAX({column}, 0), {MAX_IMPORTED_COUNT})")
}

/// Imported day rows, and the same clamped to their bounds (shaped like [`RECOUNT`]).
fn imported_days(only: &Only) -> (String, String) {
    let rows = format!(
        "FROM counters WHERE source = {IMPORTED_SOURCE} AND day >= 0{}",
        only.scopes
    );
    (
        format!("SELECT scope, source, '', day, views, visitors {rows}"),
        format!(
            "SELECT scope, source, '', day, {}, {} {rows}",
            clamp("views"),
            clamp("visitors")
        ),
    )
}

/// Imported all-time rows, and the sums of their (clamped) day rows.
fn imported_all_time(only: &Only) -> (String, String) {
    (
        format!(
            "SELECT scope, source, '', day, views, visitors FROM counters \
             WHERE source = {IMPORTED_SOURCE} AND day = -1{}",
            only.scopes
        ),
        format!(
            "SELECT scope, source, '', -1, SUM({}), SUM({}) FROM counters \
             WHERE source = {IMPORTED_SOURCE} AND day >= 0{} GROUP BY scope, source",
            clamp("views"),
            clamp("visitors"),
            only.scopes
        ),
    )
}

/// Which rows can be recounted (see the module doc).
struct Cuts {
    /// Day rows up to this day (inclusive) lost raw events; `None`: nothing was pruned.
    raw: Option<i64>,
    /// Per-page day rows before this day were pruned.
    pages: i64,
    /// Per-day visitor sets before this day were pruned.
    visitors: i64,
}

impl Cuts {
    fn read(conn: &Connection) -> Result<Self, StoreError> {
        let meta = |key: &str| -> Result<Option<i64>, StoreError> {
            Ok(conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
                .optional()?)
        };
        let raw = meta("pruned_before_ms")?.map(|ms| {
            let ms = ms.saturating_add(86_400_000);
            ms.div_euclid(86_400_000)
        });
        Ok(Self {
            raw,
            pages: meta("page_rows_before_day")?.unwrap_or(i64::MIN),
            visitors: meta("visitor_rows_before_day")?.unwrap_or(i64::MIN),
        })
    }

    /// SQL condition on a counter row (`day`, and `page_row` telling a per-page row).
    fn comparable_sql(&self, page_row: &str) -> String {
        let raw = match self.raw {
            None => "1".to_owned(),
            Some(cut) => format!("(day != -1 AND day > {cut})"),
        };
        format!(
            "{raw} AND (day = -1 OR day >= {} OR NOT ({page_row}))",
            self.pages
        )
    }
}

/// `scope` is a per-page scope (not a whole site's).
const PAGE_ROW: &str = "scope NOT IN (SELECT id FROM pages WHERE path = '')";

fn compare(
    conn: &Connection,
    stored: &str,
    recount: &str,
    condition: &str,
    events: bool,
    report: &mut VerifyReport,
) -> Result<(), StoreError> {
    let sql = format!(
        "WITH s(scope, source, name, day, views, visitors) AS ({stored}),
              r(scope, source, name, day, views, visitors) AS ({recount}),
              j AS (SELECT COALESCE(s.scope, r.scope) AS scope, COALESCE(s.source, r.source) AS source,
                           COALESCE(s.name, r.name) AS name, COALESCE(s.day, r.day) AS day,
                           s.views AS sv, s.visitors AS sw, r.views AS rv, r.visitors AS rw
                    FROM s FULL OUTER JOIN r ON s.scope = r.scope AND s.source = r.source
                         AND s.name = r.name AND s.day = r.day)
         SELECT scope, source, name, day, sv, sw, rv, rw FROM j WHERE {condition}"
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        report.checked += 1;
        let stored = (
            row.get::<_, Option<i64>>(4)?.unwrap_or(0),
            row.get::<_, Option<i64>>(5)?.unwrap_or(0),
        );
        let recounted = (
            row.get::<_, Option<i64>>(6)?.unwrap_or(0),
            row.get::<_, Option<i64>>(7)?.unwrap_or(0),
        );
        if stored != recounted {
            let scope: i64 = row.get(0)?;
            let source: i64 = row.get(1)?;
            let name: String = row.get(2)?;
            let day: i64 = row.get(3)?;
            report.drift.push(Drift {
                key: label(conn, events, scope, source, &name, day)?,
                stored,
                recounted,
            });
        }
    }
    Ok(())
}

/// `site/source/page/day` (page empty for the whole site, day `*` for all time); custom
/// events as `site/-1/name/day`, referrer counters as `site/-2/host/day`.
fn label(
    conn: &Connection,
    events: bool,
    scope: i64,
    source: i64,
    name: &str,
    day: i64,
) -> Result<String, StoreError> {
    let (site, page): (String, String) = if events {
        let site = conn
            .query_row("SELECT name FROM site_keys WHERE id = ?1", [scope], |r| {
                r.get(0)
            })
            .optional()?;
        (site.unwrap_or_else(|| format!("#{scope}")), name.to_owned())
    } else {
        conn.query_row(
            "SELECT k.name, p.path FROM pages p JOIN site_keys k ON k.id = p.site WHERE p.id = ?1",
            [scope],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .unwrap_or_else(|| (format!("#{scope}"), String::new()))
    };
    let day = if day == ALL_TIME {
        "*".to_owned()
    } else {
        num_day(day).map_or_else(|_| day.to_string(), |d| d.to_string())
    };
    Ok(format!("{site}/{source}/{page}/{day}"))
}

pub(super) fn verify_counters(
    conn: &mut Connection,
    only: &Only,
    repair: bool,
) -> Result<VerifyReport, StoreError> {
    let tx = conn.transaction_with_behavior(if repair {
        TransactionBehavior::Immediate
    } else {
        TransactionBehavior::Deferred
    })?;
    let cuts = Cuts::read(&tx)?;
    // Imported daily aggregates have no raw events: never compared nor rewritten.
    let counters = format!(
        "source != {IMPORTED_SOURCE} AND {}{}",
        cuts.comparable_sql(PAGE_ROW),
        only.scopes
    );
    let event_counters = cuts.comparable_sql("0");
    let (recount, recount_events) = (only.recount(), only.recount_events());
    let recount_referrers = only.recount_referrers();
    let mut report = VerifyReport::default();
    compare(&tx, &only.stored(), &recount, &counters, false, &mut report)?;
    compare(
        &tx,
        &only.stored_events(),
        &recount_events,
        &event_counters,
        true,
        &mut report,
    )?;
    compare(
        &tx,
        &only.stored_referrers(),
        &recount_referrers,
        &event_counters,
        true,
        &mut report,
    )?;
    let (stored, bounded) = imported_days(only);
    compare(&tx, &stored, &bounded, "1", false, &mut report)?;
    let (stored, sums) = imported_all_time(only);
    compare(&tx, &stored, &sums, "1", false, &mut report)?;
    let scopes = &only.scopes;
    if repair && !report.drift.is_empty() {
        tx.execute_batch(&format!(
            "UPDATE counters SET views = {}, visitors = {}
                 WHERE source = {IMPORTED_SOURCE} AND day >= 0{scopes};
             DELETE FROM counters WHERE source = {IMPORTED_SOURCE} AND day = -1{scopes};
             INSERT INTO counters (scope, source, day, views, visitors)
                 SELECT scope, source, -1, SUM(views), SUM(visitors) FROM counters
                 WHERE source = {IMPORTED_SOURCE} AND day >= 0{scopes} GROUP BY scope, source;",
            clamp("views"),
            clamp("visitors")
        ))?;
    }
    if repair && !report.drift.is_empty() {
        let visit_days = format!(
            "day >= {}{}",
            cuts.visitors,
            cuts.raw
                .map_or(String::new(), |cut| format!(" AND day > {cut}"))
        );
        let site = &only.events;
        // The visitor sets are rewritten: kept sets of every store are dropped.
        let bump = crate::store::daysets::BUMP_GENERATION;
        tx.execute_batch(&format!(
            "DELETE FROM counters WHERE {counters};
             INSERT INTO counters (scope, source, day, views, visitors)
                 SELECT scope, source, day, views, visitors FROM ({recount}) WHERE {counters};
             DELETE FROM event_counters WHERE {event_counters}{site};
             INSERT INTO event_counters (site, name, day, count)
                 SELECT scope, name, day, views FROM ({recount_events}) WHERE {event_counters};
             DELETE FROM referrer_counters WHERE {event_counters}{site};
             INSERT INTO referrer_counters (site, day, host, views)
                 SELECT scope, day, name, views FROM ({recount_referrers})
                 WHERE {event_counters};
             DELETE FROM visits WHERE {visit_days}{scopes};
             {bump};
             INSERT OR IGNORE INTO visits (day, scope, source, visitor)
                 SELECT day, page, source, visitor FROM events
                     WHERE kind = 0 AND {visit_days}{site}
                 UNION SELECT day, (SELECT id FROM pages WHERE site = e.site AND path = ''),
                     source, visitor FROM events e WHERE kind = 0 AND {visit_days}{site};"
        ))?;
        if cuts.raw.is_none() {
            tx.execute(&format!("DELETE FROM reach WHERE 1{site}"), [])?;
        }
        tx.execute(
            &format!(
                "INSERT OR IGNORE INTO reach (site, source, visitor, page)
                     SELECT site, source, visitor, page FROM events WHERE kind = 0{site}"
            ),
            [],
        )?;
        report.repaired = true;
    }
    tx.commit()?;
    Ok(report)
}
