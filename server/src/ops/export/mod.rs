//! `tally export`: a site's data out, streamed row by row from the store (SQLite or
//! PostgreSQL, see `store::ExportSource`) to a writer.
//!
//! Contract: constant memory at any size (each row is written as it is read, or one day's
//! answers at a time; JSON is an array written element by element). `--what daily` writes
//! `day,page,views,visitors` per page and for the whole site (page `*`): what a web counter
//! shows (counted plus imported), and it is exactly the input of `tally import --format
//! tally-csv`, so the daily CSV round-trips. `--what custom` writes custom-event counts per
//! day (`day,name,count`), `--what events` the raw events still within retention (no visitor
//! keys: they are pseudonymous hashes that mean nothing outside the database). `--what
//! breakdowns` and `--what visits` are the analytics per local day, computed by the
//! dashboard's engine (`analytics`), one day at a time. CSV cells that a spreadsheet would
//! run as a formula are written as text (see [`csv_field`]); JSON is written as it is.

mod analytics;

use std::io::Write;
use std::sync::Arc;

use jiff::civil::Date;

use crate::core::ids::SiteId;
use crate::store::Store;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    Csv,
    Json,
}

/// What to export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportWhat {
    /// Daily views and visitors per page and for the whole site.
    Daily,
    /// Daily counts of custom events.
    Custom,
    /// Raw events within the raw-event retention.
    Events,
    /// Per local day and dimension value (sources, campaigns, browsers, systems, devices,
    /// places, entry, exit and viewed pages, event names): visitors, visits, page views,
    /// events, bounce rate and visit duration, as the dashboard and `/api/v2/query` answer
    /// them (imported breakdowns included where they apply).
    Breakdowns,
    /// Per local day: visitors, visits, page views, views per visit, bounce rate and visit
    /// duration, as the dashboard answers them.
    Visits,
}

/// A CSV cell. A text that a spreadsheet would run as a formula (it begins with `=`, `+`,
/// `-`, `@`, a tab or a carriage return: event names and referrers come from visitors) gets a
/// leading `'`, which spreadsheets show as text; no number, day or page path of an export
/// begins with one of those, so the daily CSV still round-trips.
fn csv_field(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// Streams rows as CSV lines or JSON array elements.
struct Rows<'a> {
    out: &'a mut dyn Write,
    format: ExportFormat,
    first: bool,
}

impl Rows<'_> {
    fn start(&mut self, header: &[&str]) -> std::io::Result<()> {
        match self.format {
            ExportFormat::Csv => writeln!(self.out, "{}", header.join(",")),
            ExportFormat::Json => write!(self.out, "["),
        }
    }

    fn row(&mut self, csv: &[String], json: serde_json::Value) -> std::io::Result<()> {
        match self.format {
            ExportFormat::Csv => {
                let cells: Vec<String> = csv.iter().map(|c| csv_field(c)).collect();
                writeln!(self.out, "{}", cells.join(","))
            }
            ExportFormat::Json => {
                let sep = if self.first { "\n" } else { ",\n" };
                self.first = false;
                write!(self.out, "{sep}{json}")
            }
        }
    }

    fn end(&mut self) -> std::io::Result<()> {
        if self.format == ExportFormat::Json {
            writeln!(self.out, "\n]")?;
        }
        self.out.flush()
    }
}

/// Write `what` of `site` over `from..=to` to `out`; returns the rows written.
pub async fn export(
    store: Arc<dyn Store>,
    site: &SiteId,
    (from, to): (Date, Date),
    format: ExportFormat,
    what: ExportWhat,
    out: &mut dyn Write,
) -> anyhow::Result<u64> {
    let mut rows = Rows {
        out,
        format,
        first: true,
    };
    let n = match what {
        ExportWhat::Breakdowns | ExportWhat::Visits => {
            analytics::export(store, site, (from, to), what, &mut rows).await?
        }
        ExportWhat::Daily => {
            rows.start(&["day", "page", "views", "visitors"])?;
            store
                .export_daily(site, from, to, &mut |r| {
                    let page = r.page.unwrap_or_else(|| "*".to_owned());
                    rows.row(
                        &[
                            r.day.to_string(),
                            page.clone(),
                            r.views.to_string(),
                            r.visitors.to_string(),
                        ],
                        serde_json::json!({"day": r.day.to_string(), "page": page,
                        "views": r.views, "visitors": r.visitors}),
                    )
                })
                .await?
        }
        ExportWhat::Custom => {
            rows.start(&["day", "name", "count"])?;
            store
                .export_events(site, from, to, false, &mut |r| {
                    let name = r.name.unwrap_or_default();
                    rows.row(
                    &[r.day.to_string(), name.clone(), r.count.to_string()],
                    serde_json::json!({"day": r.day.to_string(), "name": name, "count": r.count}),
                )
                })
                .await?
        }
        ExportWhat::Events => {
            rows.start(&[
                "event_id", "time", "day", "kind", "page", "name", "source", "referrer",
            ])?;
            store
                .export_events(site, from, to, true, &mut |r| {
                    let time = r
                        .at_ms
                        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
                        .map(|t| t.to_string())
                        .unwrap_or_default();
                    let id = r.event_id.unwrap_or_default();
                    let page = r.page.unwrap_or_default();
                    let name = r.name.unwrap_or_default();
                    let referrer = r.referrer.unwrap_or_default();
                    rows.row(
                        &[
                            id.clone(),
                            time.clone(),
                            r.day.to_string(),
                            r.kind.to_owned(),
                            page.clone(),
                            name.clone(),
                            r.source.to_owned(),
                            referrer.clone(),
                        ],
                        serde_json::json!({"event_id": id, "time": time, "day": r.day.to_string(),
                        "kind": r.kind, "page": page, "name": name, "source": r.source,
                        "referrer": referrer}),
                    )
                })
                .await?
        }
    };
    rows.end()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn formulas_are_written_as_text_and_the_rest_as_it_is() {
        assert_eq!(
            csv_field("=HYPERLINK(\"http://x\")"),
            "\"'=HYPERLINK(\"\"http://x\"\")\""
        );
        assert_eq!(csv_field("+1+1"), "'+1+1");
        assert_eq!(csv_field("@SUM(1)"), "'@SUM(1)");
        assert_eq!(csv_field("-2"), "'-2");
        assert_eq!(csv_field("\tx"), "'\tx");
        assert_eq!(csv_field("signup"), "signup");
        assert_eq!(csv_field("/posts/a"), "/posts/a");
        assert_eq!(csv_field("*"), "*");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
    }
}
