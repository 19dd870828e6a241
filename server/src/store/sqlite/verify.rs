//! Recounting every counter from raw events, and repairing drift.

use super::*;

/// The recount of every counter from raw events: (site, source, page, day, views, visitors).
pub(super) const RECOUNT: &str = "
    SELECT site, source, page, day, COUNT(*) AS views, COUNT(DISTINCT visitor) AS visitors
        FROM events WHERE kind = 0 GROUP BY site, source, page, day
    UNION ALL SELECT site, source, '', day, COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source, day
    UNION ALL SELECT site, source, page, '*', COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source, page
    UNION ALL SELECT site, source, '', '*', COUNT(*), COUNT(DISTINCT visitor) FROM events
        WHERE kind = 0 GROUP BY site, source";

/// The recount of custom-event counters, shaped like [`RECOUNT`] (name in `page`, source -1).
pub(super) const RECOUNT_EVENTS: &str = "
    SELECT site, -1 AS source, name AS page, day, COUNT(*) AS views, 0 AS visitors
        FROM events WHERE kind = 1 GROUP BY site, name, day
    UNION ALL SELECT site, -1, name, '*', COUNT(*), 0 FROM events WHERE kind = 1 GROUP BY site, name";

pub(super) const STORED: &str = "SELECT site, source, page, day, views, visitors FROM counters";
pub(super) const STORED_EVENTS: &str = "SELECT site, -1, name, day, count, 0 FROM event_counters";

pub(super) fn compare(
    conn: &Connection,
    stored: &str,
    recount: &str,
    keep: &dyn Fn(&str) -> bool,
    report: &mut VerifyReport,
) -> Result<(), StoreError> {
    let sql = format!(
        "WITH s(site, source, page, day, views, visitors) AS ({stored}),
              r(site, source, page, day, views, visitors) AS ({recount})
         SELECT COALESCE(s.site, r.site), COALESCE(s.source, r.source), COALESCE(s.page, r.page),
                COALESCE(s.day, r.day), s.views, s.visitors, r.views, r.visitors
         FROM s FULL OUTER JOIN r ON s.site = r.site AND s.source = r.source
              AND s.page = r.page AND s.day = r.day"
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let day: String = row.get(3)?;
        if !keep(&day) {
            continue;
        }
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
            let site: String = row.get(0)?;
            let source: i64 = row.get(1)?;
            let page: String = row.get(2)?;
            report.drift.push(Drift {
                key: format!("{site}/{source}/{page}/{day}"),
                stored,
                recounted,
            });
        }
    }
    Ok(())
}

pub(super) fn verify_counters(
    conn: &mut Connection,
    repair: bool,
) -> Result<VerifyReport, StoreError> {
    let tx = conn.transaction_with_behavior(if repair {
        TransactionBehavior::Immediate
    } else {
        TransactionBehavior::Deferred
    })?;
    // After pruning, all-time rows and days up to the pruned one can no longer be recounted.
    let pruned_day: Option<String> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'pruned_before_ms'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms + 86_400_000).ok())
        .map(|ts| day_key(SiteZone::utc().day_of(ts)));
    let keep = |day: &str| match &pruned_day {
        None => true,
        Some(cut) => day != ALL_TIME && day > cut.as_str(),
    };
    let mut report = VerifyReport::default();
    compare(&tx, STORED, RECOUNT, &keep, &mut report)?;
    compare(&tx, STORED_EVENTS, RECOUNT_EVENTS, &keep, &mut report)?;
    if repair && !report.drift.is_empty() {
        let (day_filter, visitor_filter) = match &pruned_day {
            None => (String::new(), String::new()),
            Some(cut) => (
                format!(" WHERE day > '{cut}' AND day != '*'"),
                format!(" AND day > '{cut}'"),
            ),
        };
        tx.execute_batch(&format!(
            "DELETE FROM counters{day_filter};
             DELETE FROM event_counters{day_filter};
             DELETE FROM visitors{day_filter};
             INSERT INTO counters SELECT * FROM ({RECOUNT}){day_filter};
             INSERT INTO event_counters SELECT site, page, day, views FROM ({RECOUNT_EVENTS}){day_filter};
             INSERT OR IGNORE INTO visitors
                 SELECT site, source, page, day, visitor FROM events WHERE kind = 0{visitor_filter}
                 UNION SELECT site, source, '', day, visitor FROM events WHERE kind = 0{visitor_filter};"
        ))?;
        if pruned_day.is_none() {
            tx.execute_batch(
                "INSERT OR IGNORE INTO visitors
                     SELECT site, source, page, '*', visitor FROM events WHERE kind = 0
                     UNION SELECT site, source, '', '*', visitor FROM events WHERE kind = 0;",
            )?;
        }
        report.repaired = true;
    }
    tx.commit()?;
    Ok(report)
}
