//! Imported breakdowns on PostgreSQL (`imported_dims`, see [`crate::store::imported`]), as on
//! SQLite. Rows of one (table, day, value) are summed in memory first (one upsert may not
//! touch a row twice) and written in key order, like every other batch of this backend.

use std::collections::BTreeMap;

use super::intern::Resolver;
use super::{Fail, PgStore, day_num, num_day};
use crate::store::MAX_IMPORTED_COUNT;
use crate::store::StoreError;
use crate::store::imported::{ImportedRow, ImportedSums, Table};

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX).min(MAX_IMPORTED_COUNT)
}

fn number(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// See [`crate::store::ImportSink::import_breakdowns`].
pub(super) async fn write(
    store: &PgStore,
    site: &str,
    rows: &[ImportedRow],
    clear: &[(Table, jiff::civil::Date)],
) -> Result<u64, Fail> {
    let mut keyed: BTreeMap<(&'static str, i32, &str), ImportedSums> = BTreeMap::new();
    for r in rows {
        let day = day_num(r.day);
        if day < 0 {
            return Err(Fail::Store(StoreError::Invalid(format!(
                "day {} is before 1970-01-01",
                r.day
            ))));
        }
        keyed
            .entry((r.table.name(), day, r.value.as_str()))
            .or_default()
            .add(&r.sums);
    }
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let mut resolver = Resolver::new(store, &tx, 0);
    let site = resolver.site(site).await?;
    let (clear_dims, clear_days): (Vec<&str>, Vec<i32>) =
        clear.iter().map(|(t, d)| (t.name(), day_num(*d))).unzip();
    tx.execute(
        "DELETE FROM imported_dims d USING unnest($2::text[], $3::int4[]) AS c(dim, day) \
         WHERE d.site = $1 AND d.dim = c.dim AND d.day = c.day",
        &[&site, &clear_dims, &clear_days],
    )
    .await?;
    let mut cols: (Vec<&str>, Vec<i32>, Vec<&str>) = (vec![], vec![], vec![]);
    let mut nums: [Vec<i64>; 6] = Default::default();
    for ((dim, day, value), s) in &keyed {
        cols.0.push(dim);
        cols.1.push(*day);
        cols.2.push(value);
        for (slot, n) in nums.iter_mut().zip([
            s.visitors,
            s.visits,
            s.pageviews,
            s.events,
            s.bounces,
            s.visit_duration,
        ]) {
            slot.push(count(n));
        }
    }
    let [visitors, visits, pageviews, events, bounces, duration] = &nums;
    tx.execute(
        "INSERT INTO imported_dims AS d (site, dim, day, value, visitors, visits, pageviews, \
         events, bounces, visit_duration) \
         SELECT $1::int8, u.dim, u.day, u.value, u.visitors, u.visits, u.pageviews, u.events, \
         u.bounces, u.duration \
         FROM unnest($2::text[], $3::int4[], $4::text[], $5::int8[], $6::int8[], $7::int8[], \
         $8::int8[], $9::int8[], $10::int8[]) \
         AS u(dim, day, value, visitors, visits, pageviews, events, bounces, duration) \
         ON CONFLICT (site, dim, day, value) DO UPDATE SET \
         visitors = LEAST(d.visitors + excluded.visitors, $11), \
         visits = LEAST(d.visits + excluded.visits, $11), \
         pageviews = LEAST(d.pageviews + excluded.pageviews, $11), \
         events = LEAST(d.events + excluded.events, $11), \
         bounces = LEAST(d.bounces + excluded.bounces, $11), \
         visit_duration = LEAST(d.visit_duration + excluded.visit_duration, $11)",
        &[
            &site,
            &cols.0,
            &cols.1,
            &cols.2,
            visitors,
            visits,
            pageviews,
            events,
            bounces,
            duration,
            &MAX_IMPORTED_COUNT,
        ],
    )
    .await?;
    let pending = resolver.into_pending();
    tx.commit().await?;
    store.known().absorb(pending);
    Ok(rows.len() as u64)
}

/// See [`crate::store::SegmentSource::imported`].
pub(super) async fn read(
    store: &PgStore,
    site: &str,
    table: Table,
    (from, to): (i32, i32),
    by_day: bool,
) -> Result<Vec<ImportedRow>, Fail> {
    let client = store.client().await?;
    let Some(site) = client
        .query_opt("SELECT id FROM site_keys WHERE name = $1", &[&site])
        .await?
        .map(|r| r.get::<_, i64>(0))
    else {
        return Ok(Vec::new());
    };
    let sql = if by_day {
        "SELECT day, value, visitors, visits, pageviews, events, bounces, visit_duration \
         FROM imported_dims WHERE site = $1 AND dim = $2 AND day BETWEEN $3 AND $4 \
         ORDER BY day, value COLLATE \"C\""
    } else {
        "SELECT $3::int4, value, SUM(visitors)::int8, SUM(visits)::int8, SUM(pageviews)::int8, \
         SUM(events)::int8, SUM(bounces)::int8, SUM(visit_duration)::int8 \
         FROM imported_dims WHERE site = $1 AND dim = $2 AND day BETWEEN $3 AND $4 \
         GROUP BY value ORDER BY value COLLATE \"C\""
    };
    let mut out = Vec::new();
    for row in client
        .query(sql, &[&site, &table.name(), &from, &to])
        .await?
    {
        out.push(ImportedRow {
            day: num_day(row.get(0))?,
            table,
            value: row.get(1),
            sums: ImportedSums {
                visitors: number(row.get(2)),
                visits: number(row.get(3)),
                pageviews: number(row.get(4)),
                events: number(row.get(5)),
                bounces: number(row.get(6)),
                visit_duration: number(row.get(7)),
            },
        });
    }
    Ok(out)
}
