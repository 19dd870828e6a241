//! Imported breakdowns on SQLite (`imported_dims`, see [`crate::store::imported`]): the
//! import's writes and the analytics' reads.

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{StoreError, day_num, num_day};
use crate::store::imported::{ImportedRow, ImportedSums, Table};

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn number(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Delete the rows of each (table, day) in `clear`, then add `rows` to their (table, day,
/// value) rows, inside the caller's transaction.
pub(super) fn write(
    tx: &Transaction<'_>,
    site: i64,
    rows: &[ImportedRow],
    clear: &[(Table, jiff::civil::Date)],
) -> Result<(), StoreError> {
    let mut delete =
        tx.prepare_cached("DELETE FROM imported_dims WHERE site = ?1 AND dim = ?2 AND day = ?3")?;
    for (table, day) in clear {
        delete.execute(params![site, table.name(), day_num(*day)])?;
    }
    let mut add = tx.prepare_cached(
        "INSERT INTO imported_dims (site, dim, day, value, visitors, visits, pageviews, events, \
         bounces, visit_duration) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (site, dim, day, value) DO UPDATE SET \
         visitors = min(visitors + excluded.visitors, ?11), \
         visits = min(visits + excluded.visits, ?11), \
         pageviews = min(pageviews + excluded.pageviews, ?11), \
         events = min(events + excluded.events, ?11), \
         bounces = min(bounces + excluded.bounces, ?11), \
         visit_duration = min(visit_duration + excluded.visit_duration, ?11)",
    )?;
    for r in rows {
        let day = day_num(r.day);
        if day < 0 {
            return Err(StoreError::Invalid(format!(
                "day {} is before 1970-01-01",
                r.day
            )));
        }
        let s = &r.sums;
        add.execute(params![
            site,
            r.table.name(),
            day,
            r.value,
            count(s.visitors),
            count(s.visits),
            count(s.pageviews),
            count(s.events),
            count(s.bounces),
            count(s.visit_duration),
            crate::store::MAX_IMPORTED_COUNT,
        ])?;
    }
    Ok(())
}

/// The rows of `table` of site `site` over the day numbers `from..=to` (see
/// [`crate::store::SegmentSource::imported`]).
pub(super) fn read(
    conn: &Connection,
    site: &str,
    table: Table,
    (from, to): (i64, i64),
    by_day: bool,
) -> Result<Vec<ImportedRow>, StoreError> {
    let Some(site) = conn
        .prepare_cached("SELECT id FROM site_keys WHERE name = ?1")?
        .query_row([site], |r| r.get::<_, i64>(0))
        .optional()?
    else {
        return Ok(Vec::new());
    };
    let sql = if by_day {
        "SELECT day, value, visitors, visits, pageviews, events, bounces, visit_duration \
         FROM imported_dims WHERE site = ?1 AND dim = ?2 AND day BETWEEN ?3 AND ?4 \
         ORDER BY day, value"
    } else {
        "SELECT ?3, value, SUM(visitors), SUM(visits), SUM(pageviews), SUM(events), \
         SUM(bounces), SUM(visit_duration) \
         FROM imported_dims WHERE site = ?1 AND dim = ?2 AND day BETWEEN ?3 AND ?4 \
         GROUP BY value ORDER BY value"
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(params![site, table.name(), from, to])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(ImportedRow {
            day: num_day(row.get(0)?)?,
            table,
            value: row.get(1)?,
            sums: ImportedSums {
                visitors: number(row.get(2)?),
                visits: number(row.get(3)?),
                pageviews: number(row.get(4)?),
                events: number(row.get(5)?),
                bounces: number(row.get(6)?),
                visit_duration: number(row.get(7)?),
            },
        });
    }
    Ok(out)
}
