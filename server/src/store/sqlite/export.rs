//! Streaming reads for `tally export`: rows go from SQLite to a callback one at a time, so an
//! export takes constant memory at any size.
//!
//! Contract: each method opens its own read-only connection and reads inside one read
//! transaction (a consistent snapshot while the server keeps writing), in a stable order
//! (day, then page or event id). They are synchronous: call them from a blocking context.
//! Daily rows carry what a web counter shows: counted web numbers plus imported aggregates
//! (badge views are a separate source and not exported); page `None` is the whole site.

use super::*;

/// One day of one page (or the whole site) of a site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyExportRow {
    pub day: Date,
    /// `None` = the whole site.
    pub page: Option<String>,
    pub views: u64,
    pub visitors: u64,
}

/// One raw event, or one day of a custom event's counter (`event_id` and `at_ms` absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventExportRow {
    pub event_id: Option<String>,
    pub at_ms: Option<i64>,
    pub day: Date,
    /// `pageview` or `event`.
    pub kind: &'static str,
    pub page: Option<String>,
    pub name: Option<String>,
    pub source: &'static str,
    pub referrer: Option<String>,
    pub count: u64,
}

/// Errors of the row callback pass through as `Backend` with their text.
fn sink_error(e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("writing the export: {e}"))
}

impl SqliteStore {
    /// Daily numbers per page and for the whole site over `from..=to`, in (day, page) order.
    pub fn export_daily(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        out: &mut dyn FnMut(DailyExportRow) -> std::io::Result<()>,
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
            .map_err(sink_error)?;
            n += 1;
        }
        Ok(n)
    }

    /// Raw events (`raw` = true: every stored event, page views and custom events) or the
    /// daily counters of custom events (`raw` = false) over `from..=to`.
    pub fn export_events(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
        raw: bool,
        out: &mut dyn FnMut(EventExportRow) -> std::io::Result<()>,
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
            .map_err(sink_error)?;
            n += 1;
        }
        Ok(n)
    }
}
