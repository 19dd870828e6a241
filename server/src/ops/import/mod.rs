//! `tally import`: history from server logs, GoatCounter, Plausible, dead counters and Tally's
//! own daily export, into a store that may be serving at the same time.
//!
//! Contract:
//! - Every input line or row ends up in exactly one place: counted (`imported`), already
//!   counted by an earlier run (`duplicates`), or the reject file with its line number and
//!   reason (malformed, not a page view, an asset, another host, a bot). Nothing is dropped
//!   silently.
//! - Idempotent: an event's id is a UUIDv7 whose time is the line's time and whose 80 random
//!   bits are a hash of the site, the line's bytes and how many identical lines came before
//!   it in the same second; the store's import ledger refuses an id twice. Aggregates (bases,
//!   daily rows, breakdown days) replace what they address, so a re-run sets the same numbers.
//! - Old events are allowed (the 72 h window guards the live API only). They are stored raw
//!   like live ones, with the dimensions a live hit gets (`records`); [`settle`] then seals
//!   their finished days into segments, as a serving collector does, whose retention removes
//!   the raw events later (never while an import holds its lease, [`LEASE`] after its last
//!   batch). A day whose raw events were pruned already keeps its segment: lines added to
//!   it are counted, not broken down. (`raw_before_ms` still lets a caller count old events
//!   without keeping them raw, see `store::ImportSink`; such events are in no segment.)
//! - Aggregates (Plausible's zip) are daily numbers, never events: kept as imported daily
//!   counters and breakdowns (`plausible`, `store::imported`).
//! - The low-priority lane: records are committed in small batches (`batch`, default 50)
//!   through the store's one writer connection, and after each batch the import pauses for
//!   `pause` (default 2) × the time the batch held the writer, so a `tally serve` on the same
//!   file gets the writer at least two thirds of the time and waits for at most one short
//!   batch.
//! - Visitors: a keyed hash (a key made for this run, never stored) of site, UTC day, client
//!   address (or GoatCounter session) and user agent — like live hits, no address is stored.
//!   A day split across two runs may count its visitors twice; its views never.
//! - Progress: a bar on stderr with rate and ETA when stderr is a terminal, nothing otherwise.
//! - Bounded whatever the input: files and zip entries are read as streams of lines of at most
//!   [`lines::MAX_LINE_BYTES`] (a longer line is rejected as `line longer than …` and skipped
//!   as it is read); the reject file holds at most [`MAX_REJECT_BYTES`], each line cut to
//!   [`REJECT_LINE_BYTES`], and its last line counts what was not written; a time before 1970
//!   or more than a day ahead rejects its line; counts are capped per row (see [`tables`]).
//!   Memory stays in the tens of megabytes for any file (a 256 MB line: 31 MiB peak).

mod goat;
mod lines;
mod logs;
mod plausible;
mod records;
mod tables;

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use jiff::Timestamp;

pub(crate) use lines::{LineCapped, Rejects, TOO_LONG};
pub use lines::{MAX_REJECT_BYTES, REJECT_LINE_BYTES};

use crate::core::dims::Campaign;
use crate::core::record::{Outcome, Record};
use crate::core::site::Site;
use crate::store::{ImportOptions, Store};
use records::RecordMaker;

/// Input formats of `tally import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// nginx/Apache "combined" access log (optionally with a leading `vhost:port`).
    Combined,
    /// Caddy's JSON access log.
    Caddy,
    /// GoatCounter's CSV export (version 2).
    Goatcounter,
    /// Plausible's CSV export (the zip of `imported_*.csv`): daily numbers per page, and the
    /// daily breakdowns (sources, pages, entry and exit pages, locations, devices, browsers,
    /// operating systems, custom events).
    Plausible,
    /// `page,views[,visitors]` rows (`*` or empty page = the whole site) into the bases.
    Bases,
    /// Tally's own daily export (`tally export --format csv --what daily`).
    TallyCsv,
}

impl Format {
    /// Whether the input's lines become events (raw rows, visits), not aggregates.
    pub fn has_events(self) -> bool {
        matches!(self, Format::Combined | Format::Caddy | Format::Goatcounter)
    }
}

/// One import.
#[derive(Debug, Clone)]
pub struct ImportJob {
    pub format: Format,
    pub site: Site,
    pub input: PathBuf,
    /// Only lines for this host (Caddy's `request.host`, a combined line's leading vhost,
    /// Plausible's `hostname`); others go to the reject file.
    pub host: Option<String>,
    /// Where rejected lines go (`<line>\t<reason>\t<the line>`).
    pub reject: PathBuf,
    /// Records per commit.
    pub batch: usize,
    /// Pause after each batch, as a multiple of the time the batch took (the lane's share).
    pub pause: f64,
    /// Events before this instant are counted without keeping them raw (`None`: every
    /// event is kept raw, and `settle` seals its days before retention prunes it).
    pub raw_before_ms: Option<i64>,
    /// The location database (`--geoip`): the country of each log line's client address.
    pub geoip: Option<PathBuf>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Lines or rows read (headers excluded).
    pub lines: u64,
    /// Counted (events, aggregate rows).
    pub imported: u64,
    /// Counted by an earlier run already.
    pub duplicates: u64,
    /// Written to the reject file.
    pub rejected: u64,
}

/// One page view or custom event read from an input.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub at: Timestamp,
    /// The request path (query allowed: it is dropped), or a custom event's name.
    pub path: String,
    pub referrer: Option<String>,
    pub user_agent: String,
    /// Client address or session: only hashed.
    pub client: String,
    pub host: Option<String>,
    pub event: bool,
    /// The campaign tags the input states (GoatCounter); `None`: read from the path's query.
    pub campaign: Option<Campaign>,
    /// What the input states of browser, system, screen and location (GoatCounter's
    /// columns); `None`: read from the user agent and the client address (logs).
    pub stated: Option<goat::Stated>,
}

/// Files served that are not pages.
const ASSETS: &[&str] = &[
    "css",
    "js",
    "mjs",
    "map",
    "png",
    "jpg",
    "jpeg",
    "gif",
    "svg",
    "ico",
    "webp",
    "avif",
    "woff",
    "woff2",
    "ttf",
    "otf",
    "eot",
    "xml",
    "txt",
    "json",
    "webmanifest",
    "wasm",
    "mp4",
    "webm",
    "mp3",
    "pdf",
    "zip",
    "gz",
];

fn is_asset(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let last = path.rsplit('/').next().unwrap_or("");
    last.rsplit_once('.')
        .is_some_and(|(_, ext)| ASSETS.contains(&ext.to_ascii_lowercase().as_str()))
}

fn progress(total: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:30} {percent:>3}% {binary_bytes}/{binary_total_bytes} {msg} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Run an import into `store`.
pub async fn run(store: &dyn Store, job: &ImportJob) -> anyhow::Result<ImportReport> {
    let mut rejects = Rejects::new(job.reject.clone());
    let report = match job.format {
        Format::Combined | Format::Caddy | Format::Goatcounter => {
            events(store, job, &mut rejects).await?
        }
        Format::Bases => tables::bases(store, job, &mut rejects).await?,
        Format::TallyCsv => tables::tally_csv(store, job, &mut rejects).await?,
        Format::Plausible => plausible::run(store, job, &mut rejects).await?,
    };
    rejects.finish()?;
    Ok(ImportReport {
        rejected: rejects.count,
        ..report
    })
}

/// How long retention waits after an import's last batch ([`ImportOptions::lease_until_ms`]).
pub const LEASE: Duration = Duration::from_secs(600);

/// After an import of events: seal the finished days of every site as `tally serve` does
/// (`collect::seal`: a day over for an hour at `now`), so the imported days are answered
/// from their segments (and month rollups) at once. Raw events stay: a serving
/// collector removes those past the retention once its own pass has sealed every day (and
/// [`LEASE`] after the import's last batch). Returns the days sealed.
pub async fn settle(store: std::sync::Arc<dyn Store>, now: Timestamp) -> anyhow::Result<u64> {
    let sealer = crate::collect::seal::Sealer {
        sites: store.clone(),
        segments: store,
    };
    let sealed = sealer.pass(now, u64::MAX).await?.sealed;
    // The events are in: rollups a serving collector's next pass also makes.
    if let Err(e) = sealer.roll_up(now).await {
        tracing::warn!(error = %e, "rolling up the imported months failed; `tally serve` will");
    }
    Ok(sealed)
}

/// Batches records into the store through the low-priority lane.
pub(crate) struct Lane<'a> {
    store: &'a dyn Store,
    options: ImportOptions,
    batch: usize,
    pause: f64,
    pending: Vec<Record>,
    pub report: ImportReport,
}

impl<'a> Lane<'a> {
    fn new(store: &'a dyn Store, job: &ImportJob) -> Self {
        Self {
            store,
            options: ImportOptions {
                raw_before_ms: job.raw_before_ms,
                lease_until_ms: None,
            },
            batch: job.batch.max(1),
            pause: job.pause.max(0.0),
            pending: Vec::new(),
            report: ImportReport::default(),
        }
    }

    async fn push(&mut self, record: Record) -> anyhow::Result<()> {
        self.pending.push(record);
        if self.pending.len() >= self.batch {
            self.flush().await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let records = std::mem::take(&mut self.pending);
        let started = Instant::now();
        // Retention waits while this import writes (and a lease's length after).
        self.options.lease_until_ms = Some(
            Timestamp::now()
                .as_millisecond()
                .saturating_add(LEASE.as_millis() as i64),
        );
        let outcomes = self.store.import_events(records, self.options).await?;
        for o in outcomes {
            match o {
                Outcome::Accepted => self.report.imported += 1,
                Outcome::Duplicate => self.report.duplicates += 1,
            }
        }
        pace(started, self.pause).await;
        Ok(())
    }
}

/// The lane's yield: give the writer back for `pause` × the time the batch held it.
pub(crate) async fn pace(started: Instant, pause: f64) {
    let held = started.elapsed();
    let wait = held.mul_f64(pause).min(Duration::from_secs(1));
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    tokio::task::yield_now().await;
}

/// Log lines and GoatCounter rows: one event per line.
async fn events(
    store: &dyn Store,
    job: &ImportJob,
    rejects: &mut Rejects,
) -> anyhow::Result<ImportReport> {
    let file = std::fs::File::open(&job.input)
        .with_context(|| format!("cannot open {}", job.input.display()))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(total);
    let mut lane = Lane::new(store, job);
    let dims = crate::collect::dims::Dimensions::new(job.geoip.as_deref())
        .with_context(|| "cannot read the location database (--geoip)")?;
    let mut maker = RecordMaker::new(job.site.clone(), job.host.as_deref(), dims);
    let mut lines = 0u64;
    let started = Instant::now();
    if job.format == Format::Goatcounter {
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(LineCapped::new(std::io::BufReader::new(file)));
        let columns = goat::columns(reader.headers()?)?;
        let mut record = csv::StringRecord::new();
        loop {
            let line_no = reader.position().line();
            match reader.read_record(&mut record) {
                Ok(false) => break,
                Ok(true) => {
                    lines += 1;
                    let raw = record.iter().collect::<Vec<_>>().join(",");
                    let parsed = if record.get(0) == Some(TOO_LONG) {
                        Err(String::new())
                    } else {
                        columns.parse(&record)
                    };
                    handle(job, &mut maker, &mut lane, rejects, line_no, &raw, parsed).await?;
                }
                Err(e) => {
                    lines += 1;
                    rejects.write(line_no, &format!("malformed CSV: {e}"), "")?;
                }
            }
            if lines.is_multiple_of(1024) {
                bar.set_position(reader.position().byte());
                bar.set_message(rate(lines, started));
            }
        }
    } else {
        let mut reader = LineCapped::new(std::io::BufReader::new(file));
        let mut buf = Vec::new();
        let mut read = 0u64;
        loop {
            buf.clear();
            let n = reader.read_until(b'\n', &mut buf)?;
            if n == 0 {
                break;
            }
            read += n as u64;
            lines += 1;
            let raw = String::from_utf8_lossy(&buf);
            if raw.trim().is_empty() {
                rejects.write(lines, "empty line", &raw)?;
                continue;
            }
            let parsed = match job.format {
                Format::Caddy => logs::caddy(&raw),
                _ => logs::combined(&raw),
            };
            handle(job, &mut maker, &mut lane, rejects, lines, &raw, parsed).await?;
            if lines.is_multiple_of(1024) {
                bar.set_position(read);
                bar.set_message(rate(lines, started));
            }
        }
    }
    lane.flush().await?;
    bar.finish_and_clear();
    Ok(ImportReport {
        lines,
        ..lane.report
    })
}

/// One parsed line: filtered (host, asset, bot) into the reject file, or counted.
async fn handle(
    job: &ImportJob,
    maker: &mut RecordMaker,
    lane: &mut Lane<'_>,
    rejects: &mut Rejects,
    line_no: u64,
    raw: &str,
    parsed: Result<Parsed, String>,
) -> anyhow::Result<()> {
    let p = match parsed {
        Ok(p) => p,
        Err(why) => return rejects.write(line_no, &why, raw),
    };
    if let (Some(want), Some(host)) = (&job.host, &p.host)
        && !want.eq_ignore_ascii_case(host.split(':').next().unwrap_or(host))
    {
        return rejects.write(line_no, &format!("other host: {host}"), raw);
    }
    if !p.event && is_asset(&p.path) {
        return rejects.write(line_no, "not a page: static asset", raw);
    }
    // GoatCounter no longer stores the user agent (its exports leave the column blank) and
    // judges bots itself, in its `Bot` column (read by the row parser): a blank agent there is
    // no sign of a bot.
    let judged = job.format == Format::Goatcounter && p.user_agent.is_empty();
    if !judged && let Some(why) = maker.filter_reason(&p.user_agent) {
        return rejects.write(line_no, why, raw);
    }
    match maker.make(&p, raw) {
        Ok(record) => lane.push(record).await,
        Err(why) => rejects.write(line_no, &why, raw),
    }
}

fn rate(lines: u64, started: Instant) -> String {
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    format!("{lines} lines, {:.0} lines/s", lines as f64 / secs)
}
