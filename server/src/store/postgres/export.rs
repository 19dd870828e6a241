//! [`ExportSource`] on PostgreSQL: each method reads inside one REPEATABLE READ, read-only
//! transaction (one snapshot while collectors keep writing) and streams its rows from the
//! server (`query_raw`), so memory stays constant at any size. Same rows, order and meaning
//! as SQLite's (`store::sqlite::export`).

use async_trait::async_trait;
use futures_util::{StreamExt, pin_mut};
use jiff::civil::Date;

use super::KIND_EVENT;
use super::{Fail, PgStore, day_num, num_day};
use crate::core::ids::SiteId;
use crate::core::record::Source;
use crate::store::{
    DailyExportRow, EventExportRow, ExportSource, RowSink, StoreError, export_sink_error, numbers,
};

const DAILY: &str = "SELECT c.day, p.path, SUM(c.views)::int8, SUM(c.visitors)::int8 \
    FROM site_keys k JOIN pages p ON p.site = k.id \
    JOIN counters c ON c.site = p.site AND c.scope = p.id AND c.source IN (0, 2) \
        AND c.day BETWEEN $2 AND $3 \
    WHERE k.name = $1 GROUP BY c.day, p.path ORDER BY c.day, p.path COLLATE \"C\"";

const RAW: &str = "SELECT e.event_id, e.at_ms, e.day, e.kind, p.path, e.name, e.source, \
        e.referrer, 1::int8 \
    FROM site_keys k JOIN events e ON e.site = k.id \
    JOIN pages p ON p.site = e.site AND p.id = e.page \
    WHERE k.name = $1 AND e.day BETWEEN $2 AND $3 ORDER BY e.event_id";

const CUSTOM: &str = "SELECT NULL::uuid, NULL::int8, c.day, 1::int2, NULL::text, c.name, \
        NULL::int2, NULL::text, c.count \
    FROM site_keys k JOIN event_counters c ON c.site = k.id \
    WHERE k.name = $1 AND c.day BETWEEN $2 AND $3 ORDER BY c.day, c.name COLLATE \"C\"";

/// Stream the rows of `sql` (parameters: site name, first and last day) to `each`.
async fn stream(
    store: &PgStore,
    sql: &str,
    (site, from, to): (&SiteId, Date, Date),
    mut each: impl FnMut(&tokio_postgres::Row) -> Result<(), StoreError>,
) -> Result<u64, StoreError> {
    let run = async {
        let mut client = store.client().await?;
        let tx = super::read::snapshot(&mut client).await?;
        let (from, to) = (day_num(from).max(0), day_num(to));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&site.as_str(), &from, &to];
        let rows = tx.query_raw(sql, params).await?;
        pin_mut!(rows);
        let mut n = 0;
        while let Some(row) = rows.next().await {
            each(&row?)?;
            n += 1;
        }
        tx.commit().await?;
        Ok::<u64, Fail>(n)
    };
    run.await.map_err(StoreError::from)
}

#[async_trait(?Send)]
impl ExportSource for PgStore {
    async fn export_daily(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        out: RowSink<'_, DailyExportRow>,
    ) -> Result<u64, StoreError> {
        stream(self, DAILY, (site, from, to), |row| {
            let path: String = row.get(1);
            let n = numbers(row.get(2), row.get(3));
            out(DailyExportRow {
                day: num_day(row.get(0))?,
                page: (!path.is_empty()).then_some(path),
                views: n.views,
                visitors: n.visitors,
            })
            .map_err(export_sink_error)
        })
        .await
    }

    async fn export_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        raw: bool,
        out: RowSink<'_, EventExportRow>,
    ) -> Result<u64, StoreError> {
        let sql = if raw { RAW } else { CUSTOM };
        stream(self, sql, (site, from, to), |row| {
            let id: Option<uuid::Uuid> = row.get(0);
            let source: Option<i16> = row.get(6);
            out(EventExportRow {
                event_id: id.map(|u| u.to_string()),
                at_ms: row.get(1),
                day: num_day(row.get(2))?,
                kind: if row.get::<_, i16>(3) == KIND_EVENT {
                    "event"
                } else {
                    "pageview"
                },
                page: row.get(4),
                name: row.get(5),
                source: match source {
                    None => "",
                    Some(s) if i64::from(s) == Source::Badge.code() => "badge",
                    Some(_) => "web",
                },
                referrer: row.get(7),
                count: row.get::<_, i64>(8).max(0) as u64,
            })
            .map_err(export_sink_error)
        })
        .await
    }
}
