//! [`ExportSource`] on SQLite: each method opens its own read-only connection and reads
//! inside one read transaction (a consistent snapshot while the server keeps writing). The
//! reads are synchronous inside the async methods: they block the calling thread, which only
//! the `tally export` command does.

use super::*;
use crate::store::{DailyExportRow, EventExportRow, ExportSource, RowSink};

#[async_trait(?Send)]
impl ExportSource for SqliteStore {
    async fn export_daily(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        out: RowSink<'_, DailyExportRow>,
    ) -> Result<u64, StoreError> {
        let mut conn = open_reader(&self.path)?;
        let tx = conn.transaction()?;
        let mut stmt = tx.prepare(
            "SELECT c.day, p.path, SUM(c.views), SUM(c.visitors) \
             FROM site_keys k JOIN pages p ON p.site = k.id \
             JOIN counters c ON c.scope = p.id AND c.source IN (0, 2) AND c.day BETWEEN ?2 AND ?3 \
             WHERE k.name = ?1 GROUP BY c.day, p.path ORDER BY c.day, p.path",
        )?;
        let mut rows = stmt.query(params![site.as_str(), day_num(from).max(0), day_num(to)])?;
        let mut n = 0;
        while let Some(row) = rows.next()? {
            let path: String = row.get(1)?;
            let numbers = read::numbers(row.get(2)?, row.get(3)?);
            out(DailyExportRow {
                day: num_day(row.get(0)?)?,
                page: (!path.is_empty()).then_some(path),
                views: numbers.views,
                visitors: numbers.visitors,
            })
            .map_err(crate::store::export_sink_error)?;
            n += 1;
        }
        Ok(n)
    }

    async fn export_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        raw: bool,
        out: RowSink<'_, EventExportRow>,
    ) -> Result<u64, StoreError> {
        let mut conn = open_reader(&self.path)?;
        let tx = conn.transaction()?;
        let sql = if raw {
            "SELECT e.event_id, e.at_ms, e.day, e.kind, p.path, e.name, e.source, e.referrer, 1 \
             FROM site_keys k JOIN events e ON e.site = k.id JOIN pages p ON p.id = e.page \
             WHERE k.name = ?1 AND e.day BETWEEN ?2 AND ?3 ORDER BY e.event_id"
        } else {
            "SELECT NULL, NULL, c.day, 1, NULL, c.name, NULL, NULL, c.count \
             FROM site_keys k JOIN event_counters c ON c.site = k.id \
             WHERE k.name = ?1 AND c.day BETWEEN ?2 AND ?3 ORDER BY c.day, c.name"
        };
        let mut stmt = tx.prepare(sql)?;
        let mut rows = stmt.query(params![site.as_str(), day_num(from).max(0), day_num(to)])?;
        let mut n = 0;
        while let Some(row) = rows.next()? {
            let id: Option<Vec<u8>> = row.get(0)?;
            let event_id = id
                .and_then(|b| uuid::Uuid::from_slice(&b).ok())
                .map(|u| u.to_string());
            let kind: i64 = row.get(3)?;
            let source: Option<i64> = row.get(6)?;
            out(EventExportRow {
                event_id,
                at_ms: row.get(1)?,
                day: num_day(row.get(2)?)?,
                kind: if kind == KIND_EVENT {
                    "event"
                } else {
                    "pageview"
                },
                page: row.get(4)?,
                name: row.get(5)?,
                source: match source {
                    None => "",
                    Some(s) if s == Source::Badge.code() => "badge",
                    Some(_) => "web",
                },
                referrer: row.get(7)?,
                count: row.get::<_, i64>(8)?.max(0) as u64,
            })
            .map_err(crate::store::export_sink_error)?;
            n += 1;
        }
        Ok(n)
    }
}
