//! Plausible's CSV export: a zip of `imported_*.csv` files of DAILY AGGREGATES (no events,
//! no visitor ids), found by their names (`imported_browsers_20240101_20241231.csv`).
//!
//! Contract:
//! - `imported_visitors` and `imported_pages` are the daily numbers of the whole site and of
//!   each page (the imported counter source: counts, series, top pages), summed over
//!   hostnames, as before breakdowns were kept.
//! - Every table (visitors, sources, pages, entry and exit pages, locations, devices,
//!   browsers, operating systems, custom events) is also kept as imported breakdown rows
//!   (`store::imported`): per day and value tuple, its visitors, visits (entrances, exits),
//!   page views, custom events, bounces and summed visit duration, as the CSV gives them.
//!   Rows of one (table, day, value) add up (several hostnames, cities of one region, link
//!   URLs of one event name).
//! - Idempotent: the first time a run writes a (table, day) it replaces what an earlier run
//!   stored for it (`ImportSink::import_breakdowns`), so a re-run sets the same numbers.
//! - Values: browser and OS versions are reduced to their major version (`131.0` → `131`);
//!   Plausible's `Mac` and `GNU/Linux` are Tally's `macOS` and `Linux`; a referrer is shown
//!   like a live one (no scheme, no `www.`, no trailing `/`); a sources file without a
//!   `channel` column gets each row's channel by the live channel rules
//!   (`core::dims::channel`) from its source and tags. Empty values stay empty ("(not set)").
//! - `imported` counts the rows counted; a row that cannot be read goes to the reject file.
//!   Zip entries are bounded as `tables` says.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::time::Instant;

use anyhow::Context;
use jiff::civil::Date;

use super::tables::{
    DailyLane, Days, MAX_COUNT, MAX_ENTRY_BYTES, MAX_RATIO, col, csv_reader, next_record, number,
    page_of, too_long,
};
use super::{ImportJob, ImportReport, Rejects, pace};
use crate::collect::agents::major;
use crate::collect::dims::Dimensions;
use crate::core::dims::{Channel, SourceNames, channel, clean, referrer_label};
use crate::core::ids::PagePath;
use crate::store::imported::{ImportedRow, ImportedSums, Table, encode};
use crate::store::{DailyImport, Store};

/// A day of a page (`None` = the whole site).
type DayPage = (Date, Option<PagePath>);

/// The table a zip entry holds, by its file name.
fn table_of(base: &str) -> Option<Table> {
    let stem = base.strip_suffix(".csv")?;
    let name = stem.strip_prefix("imported_")?;
    // `pages` is a prefix of nothing else; longest names first all the same.
    let mut tables = Table::ALL;
    tables.sort_by_key(|t| std::cmp::Reverse(t.name().len()));
    tables
        .into_iter()
        .find(|t| name == t.name() || name.starts_with(&format!("{}_", t.name())))
}

/// Writes breakdown rows in paced batches, clearing each (table, day) once per run.
struct BreakdownLane<'a> {
    store: &'a dyn Store,
    job: &'a ImportJob,
    rows: Vec<ImportedRow>,
    clear: Vec<(Table, Date)>,
    seen: HashSet<(Table, Date)>,
}

impl BreakdownLane<'_> {
    async fn push(&mut self, row: ImportedRow) -> anyhow::Result<()> {
        if self.seen.insert((row.table, row.day)) {
            self.clear.push((row.table, row.day));
        }
        self.rows.push(row);
        if self.rows.len() >= self.job.batch.max(1) {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() && self.clear.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let (rows, clear) = (
            std::mem::take(&mut self.rows),
            std::mem::take(&mut self.clear),
        );
        self.store
            .import_breakdowns(&self.job.site.id, rows, clear)
            .await?;
        pace(started, self.job.pause).await;
        Ok(())
    }
}

/// Column indexes of one entry.
struct Cols {
    date: usize,
    host: Option<usize>,
    /// The value columns, in the table's field order (`None`: absent, read as empty).
    values: Vec<Option<usize>>,
    visitors: Option<usize>,
    visits: Option<usize>,
    pageviews: Option<usize>,
    events: Option<usize>,
    bounces: Option<usize>,
    duration: Option<usize>,
}

impl Cols {
    fn of(table: Table, headers: &csv::StringRecord, name: &str) -> anyhow::Result<Self> {
        let names: &[&str] = match table {
            Table::Visitors => &[],
            Table::Sources => &[
                "source",
                "referrer",
                "channel",
                "utm_source",
                "utm_medium",
                "utm_campaign",
                "utm_content",
                "utm_term",
            ],
            Table::Pages => &["page"],
            Table::EntryPages => &["entry_page"],
            Table::ExitPages => &["exit_page"],
            Table::Locations => &["country", "region"],
            Table::Devices => &["device"],
            Table::Browsers => &["browser", "browser_version"],
            Table::OperatingSystems => &["operating_system", "operating_system_version"],
            Table::CustomEvents => &["name"],
        };
        let values: Vec<Option<usize>> = names.iter().map(|n| col(headers, n)).collect();
        // The first value column names the table's rows: without it they mean nothing.
        if let (Some(first), Some(None)) = (names.first(), values.first()) {
            anyhow::bail!("{name}: no column {first:?}");
        }
        Ok(Cols {
            date: col(headers, "date").with_context(|| format!("{name}: no column \"date\""))?,
            host: col(headers, "hostname"),
            values,
            visitors: col(headers, "visitors"),
            visits: match table {
                Table::EntryPages => col(headers, "entrances"),
                Table::ExitPages => col(headers, "exits"),
                _ => col(headers, "visits"),
            },
            pageviews: col(headers, "pageviews"),
            events: col(headers, "events"),
            bounces: col(headers, "bounces"),
            duration: col(headers, "visit_duration"),
        })
    }
}

/// Plausible's OS names that Tally spells otherwise.
fn os_name(name: &str, dims: &Dimensions) -> String {
    match name {
        "Mac" => "macOS".to_owned(),
        "GNU/Linux" => "Linux".to_owned(),
        other => dims.agents().os_name(other),
    }
}

/// A version as its major part (`131.0.1` → `131`).
fn major_of(version: &str) -> String {
    major(version.trim().split('.').next().unwrap_or(""))
}

/// A page column's value: a page path, or the row is refused.
fn page(raw: &str) -> Result<String, String> {
    page_of(raw)?
        .map(|p| p.as_str().to_owned())
        .ok_or_else(|| "empty page".to_owned())
}

/// The stored value tuple of a row of `table` (`raw`: its value columns, in field order).
fn value(table: Table, raw: &[&str], dims: &Dimensions) -> Result<String, String> {
    let get = |i: usize| raw.get(i).copied().unwrap_or("").trim();
    Ok(match table {
        Table::Visitors => String::new(),
        Table::Sources => {
            let (source, medium, tag, campaign) = (clean(get(0)), get(4), get(3), get(5));
            let shown = match clean(get(2)) {
                c if !c.is_empty() => c,
                _ => {
                    let category = dims.sources().by_name(&source).and_then(|(_, c)| c);
                    channel(&Channel {
                        source: &source,
                        category,
                        utm_medium: medium,
                        utm_source: tag,
                        utm_campaign: campaign,
                        click_id: None,
                    })
                    .to_owned()
                }
            };
            let referrer = match get(1) {
                "" => String::new(),
                r => referrer_label(r),
            };
            encode(&[
                &source,
                &referrer,
                &shown,
                &clean(tag),
                &clean(medium),
                &clean(campaign),
                &clean(get(6)),
                &clean(get(7)),
            ])
        }
        Table::Pages => page(get(0))?,
        // A visit without page views (only custom events) has none: "(not set)".
        Table::EntryPages | Table::ExitPages => match get(0) {
            "" => String::new(),
            raw => page(raw)?,
        },
        Table::Locations => {
            let country = get(0).to_ascii_uppercase();
            let country = if country.len() == 2 && country.bytes().all(|b| b.is_ascii_uppercase()) {
                country
            } else {
                String::new()
            };
            encode(&[&country, &clean(get(1))])
        }
        Table::Devices | Table::CustomEvents => clean(get(0)),
        Table::Browsers => encode(&[&clean(get(0)), &major_of(get(1))]),
        Table::OperatingSystems => {
            let os = os_name(&clean(get(0)), dims);
            encode(&[&os, &major_of(get(1))])
        }
    })
}

/// Import the zip at `job.input` (see the module's contract).
pub(super) async fn run(
    store: &dyn Store,
    job: &ImportJob,
    rejects: &mut Rejects,
) -> anyhow::Result<ImportReport> {
    let file = std::fs::File::open(&job.input)
        .with_context(|| format!("cannot open {}", job.input.display()))?;
    let mut zip = zip::ZipArchive::new(file).context("not a zip file")?;
    let mut report = ImportReport::default();
    let allowed = Days::new();
    let dims = Dimensions::bundled();
    let mut days: BTreeMap<DayPage, (u64, u64)> = BTreeMap::new();
    let mut lane = BreakdownLane {
        store,
        job,
        rows: Vec::new(),
        clear: Vec::new(),
        seen: HashSet::new(),
    };
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.map(std::borrow::Cow::into_owned))
        .collect::<Result<_, _>>()?;
    for name in names {
        let base = name.rsplit('/').next().unwrap_or(&name).to_owned();
        let Some(table) = table_of(&base) else {
            continue;
        };
        let entry = zip.by_name(&name)?;
        let (size, packed) = (entry.size(), entry.compressed_size().max(1));
        if size > MAX_ENTRY_BYTES || (size > 1024 * 1024 && size / packed > MAX_RATIO) {
            report.lines += 1;
            rejects.write(
                0,
                &format!(
                    "{base}: entry refused: {size} bytes from {packed} compressed \
                     (at most {MAX_ENTRY_BYTES} bytes and a ratio of {MAX_RATIO} are read)"
                ),
                "",
            )?;
            continue;
        }
        // Never more than the entry says it holds, whatever its bytes decompress to.
        let mut reader = csv_reader(true, entry.take(size));
        let headers = reader.headers()?.clone();
        let cols = Cols::of(table, &headers, &name)?;
        let mut record = csv::StringRecord::new();
        let prefix = format!("{base}: ");
        while let Some(line_no) = next_record(
            &mut reader,
            &mut record,
            &mut report.lines,
            rejects,
            &prefix,
        )? {
            report.lines += 1;
            let raw = || format!("{base}: {}", record.iter().collect::<Vec<_>>().join(","));
            if let (Some(want), Some(h)) = (&job.host, cols.host.and_then(|i| record.get(i)))
                && !want.eq_ignore_ascii_case(h.trim())
            {
                rejects.write(line_no, &format!("other host: {h}"), &raw())?;
                continue;
            }
            let row = (|| -> Result<ImportedRow, String> {
                if too_long(&record) {
                    return Err(String::new());
                }
                let values: Vec<&str> = cols
                    .values
                    .iter()
                    .map(|i| i.and_then(|i| record.get(i)).unwrap_or(""))
                    .collect();
                Ok(ImportedRow {
                    day: allowed.parse(record.get(cols.date).unwrap_or(""), "date")?,
                    table,
                    value: value(table, &values, &dims)?,
                    sums: ImportedSums {
                        visitors: number(&record, cols.visitors, "visitors")?,
                        visits: number(&record, cols.visits, "visits")?,
                        pageviews: number(&record, cols.pageviews, "pageviews")?,
                        events: number(&record, cols.events, "events")?,
                        bounces: number(&record, cols.bounces, "bounces")?,
                        visit_duration: number(&record, cols.duration, "visit_duration")?,
                    },
                })
            })();
            let row = match row {
                Ok(row) => row,
                Err(why) => {
                    rejects.write(line_no, &why, &raw())?;
                    continue;
                }
            };
            report.imported += 1;
            let page = match table {
                Table::Visitors => Some(None),
                Table::Pages => PagePath::parse(&row.value).ok().map(Some),
                _ => None,
            };
            if let Some(page) = page {
                let slot = days.entry((row.day, page)).or_default();
                slot.0 = slot.0.saturating_add(row.sums.pageviews).min(MAX_COUNT);
                slot.1 = slot.1.saturating_add(row.sums.visitors).min(MAX_COUNT);
            }
            lane.push(row).await?;
        }
    }
    lane.flush().await?;
    let mut daily = DailyLane::new(store, job);
    for ((day, page), (views, visitors)) in days {
        daily
            .push(DailyImport {
                page,
                day,
                views,
                visitors,
            })
            .await?;
    }
    daily.flush().await?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::imported::decode;

    #[test]
    fn entries_are_found_by_name() {
        assert_eq!(table_of("imported_pages.csv"), Some(Table::Pages));
        assert_eq!(
            table_of("imported_entry_pages_20240101_20241231.csv"),
            Some(Table::EntryPages)
        );
        assert_eq!(
            table_of("imported_operating_systems_20240101_20241231.csv"),
            Some(Table::OperatingSystems)
        );
        assert_eq!(table_of("imported_pages_x.txt"), None);
        assert_eq!(table_of("pages.csv"), None);
    }

    #[test]
    fn values_are_spelled_as_live_ones() {
        let dims = Dimensions::bundled();
        let v = value(Table::Browsers, &["Chrome", "131.0"], &dims).expect("value");
        assert_eq!(decode(Table::Browsers, &v), ["Chrome", "131"]);
        let v = value(Table::OperatingSystems, &["Mac", "14.2"], &dims).expect("value");
        assert_eq!(decode(Table::OperatingSystems, &v), ["macOS", "14"]);
        let v = value(
            Table::Sources,
            &["Google", "https://www.google.com/", "", "", "", "", "", ""],
            &dims,
        )
        .expect("value");
        let fields = decode(Table::Sources, &v);
        assert_eq!(fields[..3], ["Google", "google.com", "Organic Search"]);
        let v = value(Table::Sources, &[""; 8], &dims).expect("value");
        assert_eq!(decode(Table::Sources, &v)[2], "Direct");
        let v = value(Table::Locations, &["de", "DE-BE"], &dims).expect("value");
        assert_eq!(decode(Table::Locations, &v), ["DE", "DE-BE"]);
        assert!(value(Table::EntryPages, &["no-slash"], &dims).is_err());
        assert_eq!(value(Table::ExitPages, &[""], &dims).as_deref(), Ok(""));
        assert!(value(Table::Pages, &[""], &dims).is_err());
    }
}
