//! CSV inputs of aggregates: bases and Tally's daily export, and what every CSV input shares
//! (the reader within the line cap, the days an import may write, counts within the ceiling,
//! the paced lane of daily rows; GoatCounter's export is `goat`, Plausible's zip
//! `plausible`).
//!
//! Contract: columns are found by their header names, so extra or reordered columns are fine;
//! a row that cannot be read is rejected with its reason. Aggregates are written in batches
//! through the same paced lane as events. Every input is read as a stream of lines of at
//! most [`super::lines::MAX_LINE_BYTES`]; zip entries are streamed too, and an entry is
//! refused (one line in the reject file naming it) when it declares more than
//! [`MAX_ENTRY_BYTES`] or a compression ratio above [`MAX_RATIO`], and read no further than
//! its declared size. A number above [`MAX_COUNT`] rejects its row, and sums of rows saturate
//! at it, so no sum the store reads can overflow (2^63 is 9.2 million times the ceiling).
//! Days before 1970 or after tomorrow reject their row.

use std::io::Read;
use std::time::Instant;

use anyhow::Context;
use jiff::Timestamp;
use jiff::civil::Date;
use tally_wire::Numbers;

use super::{ImportJob, ImportReport, LineCapped, Rejects, TOO_LONG, pace};
use crate::core::ids::PagePath;
use crate::store::{DailyImport, Store};

/// Largest count one imported row may carry (a trillion views of one page on one day).
pub const MAX_COUNT: u64 = crate::store::MAX_IMPORTED_COUNT.unsigned_abs();
/// Largest zip entry read, as declared by the zip.
pub const MAX_ENTRY_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Largest ratio of an entry's declared size to its compressed size (CSV compresses 5-20x).
pub const MAX_RATIO: u64 = 200;

/// Read the next record into `record`: its line number, or `None` at the end. A malformed
/// record counts as a line and goes to the reject file (its reason after `prefix`).
pub(super) fn next_record<R: Read>(
    reader: &mut csv::Reader<R>,
    record: &mut csv::StringRecord,
    lines: &mut u64,
    rejects: &mut Rejects,
    prefix: &str,
) -> anyhow::Result<Option<u64>> {
    loop {
        let line_no = reader.position().line();
        match reader.read_record(record) {
            Ok(false) => return Ok(None),
            Ok(true) => return Ok(Some(line_no)),
            Err(e) => {
                *lines += 1;
                rejects.write(line_no, &format!("{prefix}malformed CSV: {e}"), "")?;
            }
        }
    }
}

/// A CSV reader (rows of any length, with a header row or not) over `file`, line by line
/// within the line cap.
pub(super) fn csv_reader<R: Read>(
    headers: bool,
    file: R,
) -> csv::Reader<LineCapped<std::io::BufReader<R>>> {
    csv::ReaderBuilder::new()
        .has_headers(headers)
        .flexible(true)
        .from_reader(LineCapped::new(std::io::BufReader::new(file)))
}

pub(super) fn open(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))
}

/// The days an import may write: from 1970 to tomorrow (read once per run).
pub(super) struct Days {
    last: Date,
}

impl Days {
    pub(super) fn new() -> Self {
        let today = Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
        Self {
            last: today.tomorrow().unwrap_or(Date::MAX),
        }
    }

    /// The day `raw` names, if an import may write it.
    pub(super) fn parse(&self, raw: &str, name: &str) -> Result<Date, String> {
        let d = raw.trim();
        let day = d
            .parse::<Date>()
            .map_err(|e| format!("{name} {d:?}: {e}"))?;
        if day < jiff::civil::date(1970, 1, 1) {
            return Err(format!("{name} {d:?} is before 1970"));
        }
        if day > self.last {
            return Err(format!("{name} {d:?} is in the future"));
        }
        Ok(day)
    }
}

/// Whether `record` stands for a line longer than the cap.
pub(super) fn too_long(record: &csv::StringRecord) -> bool {
    record.get(0) == Some(TOO_LONG)
}

/// Index of a header column (case-insensitive), if present.
pub(super) fn col(headers: &csv::StringRecord, name: &str) -> Option<usize> {
    headers
        .iter()
        .position(|h| h.trim().eq_ignore_ascii_case(name))
}

/// Rows of `page,views[,visitors]` into the bases (`*` or empty page = the whole site).
pub(super) async fn bases(
    store: &dyn Store,
    job: &ImportJob,
    rejects: &mut Rejects,
) -> anyhow::Result<ImportReport> {
    let mut reader = csv_reader(false, open(&job.input)?);
    let mut report = ImportReport::default();
    let mut record = csv::StringRecord::new();
    while let Some(line_no) = next_record(&mut reader, &mut record, &mut report.lines, rejects, "")?
    {
        let raw = record.iter().collect::<Vec<_>>().join(",");
        if too_long(&record) {
            report.lines += 1;
            rejects.write(line_no, "", &raw)?;
            continue;
        }
        let page = record.get(0).unwrap_or("").trim();
        let views = record.get(1).unwrap_or("").trim();
        if line_no == 1 && views.parse::<u64>().is_err() {
            continue; // a header
        }
        report.lines += 1;
        let parsed = (|| -> Result<(Option<PagePath>, Numbers), String> {
            let views = number(&record, Some(1), "views")?;
            let visitors = number(&record, Some(2), "visitors")?;
            let page = match page {
                "" | "*" => None,
                p => Some(PagePath::parse(p).map_err(|_| format!("page {p:?} must start with /"))?),
            };
            Ok((page, Numbers { views, visitors }))
        })();
        match parsed {
            Ok((page, numbers)) => {
                let started = Instant::now();
                store.set_base(&job.site.id, page.as_ref(), numbers).await?;
                report.imported += 1;
                pace(started, job.pause).await;
            }
            Err(why) => rejects.write(line_no, &why, &raw)?,
        }
    }
    Ok(report)
}

/// Writes daily aggregates in paced batches.
pub(super) struct DailyLane<'a> {
    store: &'a dyn Store,
    job: &'a ImportJob,
    rows: Vec<DailyImport>,
    written: u64,
}

impl<'a> DailyLane<'a> {
    pub(super) fn new(store: &'a dyn Store, job: &'a ImportJob) -> Self {
        Self {
            store,
            job,
            rows: Vec::new(),
            written: 0,
        }
    }

    pub(super) async fn push(&mut self, row: DailyImport) -> anyhow::Result<()> {
        self.rows.push(row);
        if self.rows.len() >= self.job.batch.max(1) {
            self.flush().await?;
        }
        Ok(())
    }

    pub(super) async fn flush(&mut self) -> anyhow::Result<()> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let rows = std::mem::take(&mut self.rows);
        self.written += self.store.import_daily(&self.job.site.id, rows).await?;
        pace(started, self.job.pause).await;
        Ok(())
    }
}

pub(super) fn page_of(raw: &str) -> Result<Option<PagePath>, String> {
    match raw.trim() {
        "" | "*" => Ok(None),
        p => PagePath::parse(p)
            .map(Some)
            .map_err(|_| format!("page {p:?} must start with /")),
    }
}

pub(super) fn number(row: &csv::StringRecord, i: Option<usize>, name: &str) -> Result<u64, String> {
    let raw = i.and_then(|i| row.get(i)).unwrap_or("").trim();
    if raw.is_empty() {
        return Ok(0);
    }
    let n: u64 = raw
        .parse()
        .map_err(|_| format!("{name} {raw:?} is not a number"))?;
    if n > MAX_COUNT {
        return Err(format!("{name} {n} is above the ceiling of {MAX_COUNT}"));
    }
    Ok(n)
}

/// Tally's daily export, `day,page,views,visitors` (`*` = the whole site).
pub(super) async fn tally_csv(
    store: &dyn Store,
    job: &ImportJob,
    rejects: &mut Rejects,
) -> anyhow::Result<ImportReport> {
    let mut reader = csv_reader(true, open(&job.input)?);
    let headers = reader.headers()?.clone();
    let (day, page, views, visitors) = (
        col(&headers, "day").context("no column \"day\"")?,
        col(&headers, "page").context("no column \"page\"")?,
        col(&headers, "views"),
        col(&headers, "visitors"),
    );
    let mut lane = DailyLane::new(store, job);
    let mut report = ImportReport::default();
    let allowed = Days::new();
    let mut record = csv::StringRecord::new();
    while let Some(line_no) = next_record(&mut reader, &mut record, &mut report.lines, rejects, "")?
    {
        report.lines += 1;
        let row = (|| -> Result<DailyImport, String> {
            if too_long(&record) {
                return Err(String::new());
            }
            Ok(DailyImport {
                day: allowed.parse(record.get(day).unwrap_or(""), "day")?,
                page: page_of(record.get(page).unwrap_or(""))?,
                views: number(&record, views, "views")?,
                visitors: number(&record, visitors, "visitors")?,
            })
        })();
        match row {
            Ok(row) => lane.push(row).await?,
            Err(why) => {
                rejects.write(line_no, &why, &record.iter().collect::<Vec<_>>().join(","))?
            }
        }
    }
    lane.flush().await?;
    report.imported = lane.written;
    Ok(report)
}
