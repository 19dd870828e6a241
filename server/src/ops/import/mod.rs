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
//!   daily rows) replace the row they address, so a re-run sets the same numbers.
//! - Old events are allowed (the 72 h window guards the live API only); events older than the
//!   raw-event retention are counted into daily counters and visitor sets without being kept
//!   raw (see `store::ImportSink`).
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
//!   [`MAX_LINE_BYTES`] (a longer line is rejected as `line longer than …` and skipped as it is
//!   read); the reject file holds at most [`MAX_REJECT_BYTES`], each line cut to
//!   [`REJECT_LINE_BYTES`], and its last line counts what was not written; a time before 1970
//!   or more than a day ahead rejects its line; counts are capped per row (see [`tables`]).
//!   Memory stays in the tens of megabytes for any file (a 256 MB line: 31 MiB peak).

mod logs;
mod tables;

use std::collections::HashMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use jiff::Timestamp;

use crate::collect::bots::BotFilter;
use crate::core::classify::View;
use crate::core::filtered::Reason;
use crate::core::hit::HitKind;
use crate::core::ids::{EventId, EventName, PagePath, VisitorKey};
use crate::core::record::{Outcome, Record};
use crate::core::site::Site;
use crate::store::{ImportOptions, Store};

/// Input formats of `tally import`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// nginx/Apache "combined" access log (optionally with a leading `vhost:port`).
    Combined,
    /// Caddy's JSON access log.
    Caddy,
    /// GoatCounter's CSV export (version 2).
    Goatcounter,
    /// Plausible's CSV export (the zip of `imported_*.csv`), as daily numbers per page.
    Plausible,
    /// `page,views[,visitors]` rows (`*` or empty page = the whole site) into the bases.
    Bases,
    /// Tally's own daily export (`tally export --format csv --what daily`).
    TallyCsv,
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
    /// Events before this instant are counted without keeping them raw.
    pub raw_before_ms: Option<i64>,
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportReport {
    /// Lines or rows read (headers excluded).
    pub lines: u64,
    /// Counted (events) or written (aggregate rows).
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

/// Longest input line read; a longer one is rejected with its line number (`line too long`)
/// and its bytes are skipped as they are read, never kept.
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;
/// The line a [`LineCapped`] reader gives in place of a longer one (a NUL starts no real row).
pub(crate) const TOO_LONG: &str = "\0tally: line too long";
/// Most bytes written to the reject file; rejects beyond are counted, and the file's last line
/// says how many were not written.
pub const MAX_REJECT_BYTES: u64 = 16 * 1024 * 1024;
/// Most bytes of one rejected line copied into the reject file.
pub const REJECT_LINE_BYTES: usize = 512;

/// A reader that passes lines of at most [`MAX_LINE_BYTES`] through and gives [`TOO_LONG`]
/// (one line, so line numbers stay right) for a longer one, whose bytes it reads and drops:
/// whatever the input, no line costs more memory than the cap.
pub(crate) struct LineCapped<R> {
    inner: R,
    line: Vec<u8>,
    at: usize,
}

impl<R: BufRead> LineCapped<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            line: Vec::new(),
            at: 0,
        }
    }

    /// Read the next line into `self.line` (empty at the end of the input).
    fn next_line(&mut self) -> std::io::Result<()> {
        self.line.clear();
        self.at = 0;
        let mut too_long = false;
        loop {
            let chunk = self.inner.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !too_long {
                if self.line.len() + take > MAX_LINE_BYTES + 1 {
                    too_long = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&chunk[..take]);
                }
            }
            self.inner.consume(take);
            if done {
                break;
            }
        }
        if too_long {
            self.line.clear();
            self.line.extend_from_slice(TOO_LONG.as_bytes());
            self.line.push(b'\n');
        }
        Ok(())
    }
}

impl<R: BufRead> std::io::Read for LineCapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.line.len() {
            self.next_line()?;
        }
        let n = buf.len().min(self.line.len() - self.at);
        buf[..n].copy_from_slice(&self.line[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for LineCapped<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.at >= self.line.len() {
            self.next_line()?;
        }
        Ok(&self.line[self.at..])
    }

    fn consume(&mut self, amount: usize) {
        self.at = (self.at + amount).min(self.line.len());
    }
}

/// The reject file, opened on the first rejected line; at most [`MAX_REJECT_BYTES`].
pub(crate) struct Rejects {
    path: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
    /// Bytes written so far.
    written: u64,
    /// Rejected lines not written (the file was full).
    unwritten: u64,
    pub count: u64,
}

impl Rejects {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            written: 0,
            unwritten: 0,
            count: 0,
        }
    }

    pub(crate) fn write(&mut self, line_no: u64, reason: &str, line: &str) -> anyhow::Result<()> {
        self.count += 1;
        if self.file.is_none() {
            let f = std::fs::File::create(&self.path)
                .with_context(|| format!("cannot create {}", self.path.display()))?;
            self.file = Some(std::io::BufWriter::new(f));
        }
        let (reason, line) = if line.trim_end() == TOO_LONG {
            (format!("line longer than {MAX_LINE_BYTES} bytes"), "")
        } else {
            (reason.to_owned(), line)
        };
        let line = line.trim_end_matches(['\r', '\n']);
        let cut = crate::core::ids::truncate(line, REJECT_LINE_BYTES);
        let more = if cut.len() < line.len() { " …" } else { "" };
        let text = format!(
            "{line_no}\t{reason}\t{}{more}\n",
            cut.replace(['\t', '\0'], " ")
        );
        if self.written + text.len() as u64 > MAX_REJECT_BYTES {
            self.unwritten += 1;
            return Ok(());
        }
        if let Some(f) = &mut self.file {
            f.write_all(text.as_bytes())?;
            self.written += text.len() as u64;
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(f) = &mut self.file {
            if self.unwritten > 0 {
                writeln!(
                    f,
                    "-\tnot written\t{} more rejected lines (the reject file stops at {} MiB)",
                    self.unwritten,
                    MAX_REJECT_BYTES / (1024 * 1024)
                )?;
            }
            f.flush()?;
        }
        Ok(())
    }
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
        Format::Plausible => tables::plausible(store, job, &mut rejects).await?,
    };
    rejects.finish()?;
    Ok(ImportReport {
        rejected: rejects.count,
        ..report
    })
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

/// Makes records of parsed lines: ids, visitor keys, days.
struct RecordMaker {
    site: Site,
    key: [u8; 32],
    /// Identical lines seen in the current second (their hash → how many).
    second: i64,
    /// The latest time a line may have (a day from the start of the run), read once.
    latest: Timestamp,
    seen: HashMap<[u8; 32], u32>,
    /// The collector's bot filter (its verdicts cached: logs repeat few agents).
    bots: BotFilter,
}

impl RecordMaker {
    fn new(site: Site) -> Self {
        Self {
            site,
            key: crate::collect::secrets::random_bytes::<32>(),
            second: i64::MIN,
            latest: Timestamp::now() + jiff::SignedDuration::from_hours(24),
            seen: HashMap::new(),
            bots: BotFilter::bundled(),
        }
    }

    /// Why a line's view is not counted, judged as the collector judges a hit
    /// ([`BotFilter::reason`]: empty agents, and listed bots other than image proxies).
    fn filter_reason(&self, user_agent: &str) -> Option<&'static str> {
        self.bots.reason(user_agent).map(|reason| match reason {
            Reason::EmptyUserAgent => "no user agent",
            _ => "bot",
        })
    }

    fn make(&mut self, p: &Parsed, line: &str) -> Result<Record, String> {
        let kind = if p.event {
            HitKind::Event {
                name: EventName::parse(p.path.trim_start_matches('/'))
                    .map_err(|e| format!("event name: {e}"))?,
                dedupe: None,
            }
        } else {
            HitKind::Pageview
        };
        let page = if p.event {
            PagePath::root()
        } else {
            PagePath::parse(&p.path).map_err(|_| format!("path {:?} is not a page path", p.path))?
        };
        if p.at < Timestamp::UNIX_EPOCH {
            return Err(format!("time {} is before 1970", p.at));
        }
        if p.at > self.latest {
            return Err(format!("time {} is in the future", p.at));
        }
        let sec = p.at.as_second();
        if sec != self.second {
            self.second = sec;
            self.seen.clear();
        }
        let mut h = blake3::Hasher::new();
        h.update(self.site.id.as_str().as_bytes());
        h.update(&[0]);
        h.update(line.trim_end_matches(['\r', '\n']).as_bytes());
        let line_hash = *h.finalize().as_bytes();
        let nth = self.seen.entry(line_hash).or_default();
        *nth += 1;
        let mut h = blake3::Hasher::new();
        h.update(&line_hash);
        h.update(&nth.to_le_bytes());
        let mut random = [0u8; 10];
        random.copy_from_slice(&h.finalize().as_bytes()[..10]);
        let mut v = blake3::Hasher::new_keyed(&self.key);
        for part in [
            self.site.id.as_str(),
            &sec.div_euclid(86_400).to_string(),
            &p.client,
            &p.user_agent,
        ] {
            v.update(part.as_bytes());
            v.update(&[0]);
        }
        let mut visitor = [0u8; 16];
        visitor.copy_from_slice(&v.finalize().as_bytes()[..16]);
        let referrer = p
            .referrer
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "-")
            .and_then(|r| url::Url::parse(r).ok())
            .map(|u| crate::core::ids::cap_path(u.as_str(), 1024).to_owned());
        let view = View::imported(
            &self.site.id,
            &self.site.zone,
            kind,
            page,
            EventId::new_at(p.at, random),
            referrer,
        );
        Ok(view.into_record(VisitorKey(visitor), Default::default()))
    }
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
    let mut maker = RecordMaker::new(job.site.clone());
    let mut lines = 0u64;
    let started = Instant::now();
    if job.format == Format::Goatcounter {
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(LineCapped::new(std::io::BufReader::new(file)));
        let columns = tables::goatcounter_columns(reader.headers()?)?;
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
