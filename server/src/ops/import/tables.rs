//! CSV inputs: GoatCounter's export (one row per page view), bases, Tally's daily export, and
//! Plausible's zip of daily aggregates.
//!
//! Contract: columns are found by their header names, so extra or reordered columns are fine;
//! a row that cannot be read is rejected with its reason. Aggregates are written in batches
//! through the same paced lane as events. Every input is read as a stream of lines of at most
//! [`super::MAX_LINE_BYTES`]; zip entries are streamed too, and an entry is refused (one line
//! in the reject file naming it) when it declares more than [`MAX_ENTRY_BYTES`] or a
//! compression ratio above [`MAX_RATIO`], and read no further than its declared size. A number
//! above [`MAX_COUNT`] rejects its row, and sums of rows saturate at it, so no sum the store
//! reads can overflow (2^63 is 9.2 million times the ceiling). Days before 1970 or after
//! tomorrow reject their row.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Instant;

use anyhow::Context;
use jiff::Timestamp;
use jiff::civil::Date;
use tally_wire::Numbers;

use super::{ImportJob, ImportReport, LineCapped, Parsed, Rejects, TOO_LONG, pace};
use crate::core::ids::PagePath;
use crate::store::{DailyImport, Store};

/// Largest count one imported row may carry (a trillion views of one page on one day).
pub const MAX_COUNT: u64 = crate::store::MAX_IMPORTED_COUNT.unsigned_abs();
/// Largest zip entry read, as declared by the zip.
pub const MAX_ENTRY_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// Largest ratio of an entry's declared size to its compressed size (CSV compresses 5-20x).
pub const MAX_RATIO: u64 = 200;

/// A CSV reader (rows of any length, with a header row or not) over `file`, line by line
/// within the line cap.
fn csv_reader<R: Read>(headers: bool, file: R) -> csv::Reader<LineCapped<std::io::BufReader<R>>> {
    csv::ReaderBuilder::new()
        .has_headers(headers)
        .flexible(true)
        .from_reader(LineCapped::new(std::io::BufReader::new(file)))
}

fn open(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))
}

/// The days an import may write: from 1970 to tomorrow (read once per run).
struct Days {
    last: Date,
}

impl Days {
    fn new() -> Self {
        let today = Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
        Self {
            last: today.tomorrow().unwrap_or(Date::MAX),
        }
    }

    /// The day `raw` names, if an import may write it.
    fn parse(&self, raw: &str, name: &str) -> Result<Date, String> {
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
fn too_long(record: &csv::StringRecord) -> bool {
    record.get(0) == Some(TOO_LONG)
}

/// Index of a header column (case-insensitive), if present.
fn col(headers: &csv::StringRecord, name: &str) -> Option<usize> {
    headers
        .iter()
        .position(|h| h.trim().eq_ignore_ascii_case(name))
}

/// GoatCounter export v2 columns: `2Path,Title,Event,UserAgent,Browser,System,Session,Bot,
/// Referrer,Referrer scheme,Screen size,Location,FirstVisit,Date` (the first header cell
/// carries the version, `2`).
pub(super) struct GoatColumns {
    path: usize,
    event: usize,
    user_agent: usize,
    session: usize,
    bot: usize,
    referrer: usize,
    date: usize,
}

pub(super) fn goatcounter_columns(headers: &csv::StringRecord) -> anyhow::Result<GoatColumns> {
    let first = headers.get(0).unwrap_or("");
    anyhow::ensure!(
        first.starts_with('2'),
        "not a GoatCounter export version 2 (first header is {first:?}, expected \"2Path\")"
    );
    let mut fixed = headers.clone();
    let mut cells: Vec<String> = fixed.iter().map(str::to_owned).collect();
    if let Some(c) = cells.first_mut() {
        *c = c.trim_start_matches('2').to_owned();
    }
    fixed = csv::StringRecord::from(cells);
    let need = |name: &str| col(&fixed, name).with_context(|| format!("no column {name:?}"));
    Ok(GoatColumns {
        path: need("Path")?,
        event: need("Event")?,
        user_agent: need("UserAgent")?,
        session: need("Session")?,
        bot: need("Bot")?,
        referrer: need("Referrer")?,
        date: need("Date")?,
    })
}

impl GoatColumns {
    pub(super) fn parse(&self, row: &csv::StringRecord) -> Result<Parsed, String> {
        let get = |i: usize| row.get(i).unwrap_or("").trim();
        let bot = get(self.bot);
        if !bot.is_empty() && bot != "0" {
            return Err(format!("bot (GoatCounter bot flag {bot})"));
        }
        let at = get(self.date)
            .parse::<Timestamp>()
            .map_err(|e| format!("malformed Date: {e}"))?;
        let event = matches!(get(self.event), "true" | "1");
        let referrer = get(self.referrer);
        Ok(Parsed {
            at,
            path: get(self.path).to_owned(),
            // GoatCounter stores the referring host or URL without a scheme.
            referrer: (!referrer.is_empty()).then(|| {
                if referrer.contains("://") {
                    referrer.to_owned()
                } else {
                    format!("https://{referrer}")
                }
            }),
            user_agent: get(self.user_agent).to_owned(),
            client: get(self.session).to_owned(),
            host: None,
            event,
        })
    }
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
    loop {
        let line_no = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                report.lines += 1;
                rejects.write(line_no, &format!("malformed CSV: {e}"), "")?;
                continue;
            }
        }
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
struct DailyLane<'a> {
    store: &'a dyn Store,
    job: &'a ImportJob,
    rows: Vec<DailyImport>,
    written: u64,
}

impl DailyLane<'_> {
    async fn push(&mut self, row: DailyImport) -> anyhow::Result<()> {
        self.rows.push(row);
        if self.rows.len() >= self.job.batch.max(1) {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
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

fn page_of(raw: &str) -> Result<Option<PagePath>, String> {
    match raw.trim() {
        "" | "*" => Ok(None),
        p => PagePath::parse(p)
            .map(Some)
            .map_err(|_| format!("page {p:?} must start with /")),
    }
}

fn number(row: &csv::StringRecord, i: Option<usize>, name: &str) -> Result<u64, String> {
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
    let mut lane = DailyLane {
        store,
        job,
        rows: Vec::new(),
        written: 0,
    };
    let mut report = ImportReport::default();
    let allowed = Days::new();
    let mut record = csv::StringRecord::new();
    loop {
        let line_no = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                report.lines += 1;
                rejects.write(line_no, &format!("malformed CSV: {e}"), "")?;
                continue;
            }
        }
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

/// A day of a page (`None` = the whole site).
type DayPage = (Date, Option<PagePath>);

/// Plausible's export zip: `imported_pages*.csv` (date, hostname, page, visitors, pageviews)
/// as per-page days, `imported_visitors*.csv` (date, visitors, pageviews) as whole-site days.
/// Rows of one (day, page) from several hostnames are summed.
pub(super) async fn plausible(
    store: &dyn Store,
    job: &ImportJob,
    rejects: &mut Rejects,
) -> anyhow::Result<ImportReport> {
    let file = std::fs::File::open(&job.input)
        .with_context(|| format!("cannot open {}", job.input.display()))?;
    let mut zip = zip::ZipArchive::new(file).context("not a zip file")?;
    let mut report = ImportReport::default();
    let allowed = Days::new();
    let mut days: BTreeMap<DayPage, (u64, u64)> = BTreeMap::new();
    let names: Vec<String> = zip
        .file_names()
        .map(|n| n.map(std::borrow::Cow::into_owned))
        .collect::<Result<_, _>>()?;
    for name in names {
        let base = name.rsplit('/').next().unwrap_or(&name).to_owned();
        let pages = base.starts_with("imported_pages");
        if !(pages || base.starts_with("imported_visitors")) || !base.ends_with(".csv") {
            continue;
        }
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
        let date = col(&headers, "date").with_context(|| format!("{name}: no column \"date\""))?;
        let (page, host, visitors, views) = (
            col(&headers, "page"),
            col(&headers, "hostname"),
            col(&headers, "visitors"),
            col(&headers, "pageviews"),
        );
        anyhow::ensure!(!pages || page.is_some(), "{name}: no column \"page\"");
        let mut record = csv::StringRecord::new();
        loop {
            let line_no = reader.position().line();
            match reader.read_record(&mut record) {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => {
                    report.lines += 1;
                    rejects.write(line_no, &format!("{base}: malformed CSV: {e}"), "")?;
                    continue;
                }
            }
            report.lines += 1;
            let raw = || format!("{base}: {}", record.iter().collect::<Vec<_>>().join(","));
            if let (Some(want), Some(h)) = (&job.host, host.and_then(|i| record.get(i)))
                && !want.eq_ignore_ascii_case(h.trim())
            {
                rejects.write(line_no, &format!("other host: {h}"), &raw())?;
                continue;
            }
            let row = (|| -> Result<(DayPage, (u64, u64)), String> {
                if too_long(&record) {
                    return Err(String::new());
                }
                let day = allowed.parse(record.get(date).unwrap_or(""), "date")?;
                let page = match page.filter(|_| pages) {
                    Some(i) => Some(
                        page_of(record.get(i).unwrap_or(""))?
                            .ok_or_else(|| "empty page".to_owned())?,
                    ),
                    None => None,
                };
                Ok((
                    (day, page),
                    (
                        number(&record, views, "pageviews")?,
                        number(&record, visitors, "visitors")?,
                    ),
                ))
            })();
            match row {
                Ok((key, (v, u))) => {
                    let slot = days.entry(key).or_default();
                    slot.0 = slot.0.saturating_add(v).min(MAX_COUNT);
                    slot.1 = slot.1.saturating_add(u).min(MAX_COUNT);
                }
                Err(why) => rejects.write(line_no, &why, &raw())?,
            }
        }
    }
    let mut lane = DailyLane {
        store,
        job,
        rows: Vec::new(),
        written: 0,
    };
    for ((day, page), (views, visitors)) in days {
        lane.push(DailyImport {
            page,
            day,
            views,
            visitors,
        })
        .await?;
    }
    lane.flush().await?;
    report.imported = lane.written;
    Ok(report)
}
