//! `tally-loadgen seed` and `tally-loadgen read`: the read benchmark.
//!
//! - `seed` writes a site's history straight into a database through the store (the
//!   collector's own `EventSink::commit`, so rows are exactly what live traffic leaves, without
//!   HTTP in between): by default one year of a site with 10 M page views from 1 M visitors on
//!   3,000 pages. The [`History`] generator is seeded and reproducible: visits of one to
//!   eight views (55 % single-view), pages by popularity ~ 1/rank, visitors half uniform (so
//!   nearly all appear) and half 1/rank (regulars), 70 % with a stored id and 30 % with only a
//!   per-day key, weekends at 70 % of a weekday, an external referrer on 45 % of visit entries
//!   (search engines, social sites, aggregators and 60 small sites: 71 hosts), campaign tags
//!   on 8 % of visit entries, custom events on 6 % of views, an engagement report on 60 % of
//!   views; each visitor keeps one browser (with a major version), system, device class and
//!   country (30 countries, skewed), and the source tuple is classified by the collector's
//!   own classifier (`core::dims::classify_source` over the bundled source list).
//! - `read` starts `tally serve` on that database and times every dashboard panel and API
//!   read for each range: cold (each sample the first request of a fresh process; the
//!   operating system's file cache stays warm, as it does after a restart) and warm (the same
//!   request repeated in one process), then warm again while the realistic live mix drives the
//!   same server (`--readers` concurrent readers, each from its own loopback address, against
//!   the server's default `--stats-concurrency` unless one is given; a `503 busy` answer is
//!   counted, and its reader waits the second its Retry-After asks). It prints p50 / p95 per
//!   query and its busy answers, the live load's rate and p99 alone and beside the reads, the
//!   server's peak RSS and the database's size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use jiff::civil::Date;
use jiff::{Timestamp, ToSpan};
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Record, Source};
use tally::ops::config::ServeConfig;
use tally::store::Site;
use tally::store::Store;
use tally::store::postgres::{PgOptions, PgStore};

use crate::client;
use crate::drive::{Drive, LegitSource, Stats};
use crate::mix::{MixArgs, Plan, SITE};
use crate::rng::Rng;
use crate::run::print_row;
use crate::server::{self, Server};

/// The database and site both commands work on.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// A SQLite file (created by `seed`) or a `postgres://` URL.
    #[arg(long)]
    pub db: String,
    /// On PostgreSQL, the schema (`seed` creates it; letters, digits, `_`).
    #[arg(long)]
    pub schema: Option<String>,
    /// The site.
    #[arg(long, default_value = "big")]
    pub site: String,
}

/// Options of `seed`.
#[derive(Debug, Clone, clap::Args)]
pub struct SeedArgs {
    #[command(flatten)]
    pub target: Target,
    /// Page views in all.
    #[arg(long, default_value_t = 10_000_000)]
    pub views: u64,
    /// Distinct visitors drawn from.
    #[arg(long, default_value_t = 1_000_000)]
    pub visitors: u64,
    /// Distinct pages.
    #[arg(long, default_value_t = 3_000)]
    pub pages: u64,
    /// Days of history, ending today (UTC; today's views stop at the current time).
    #[arg(long, default_value_t = 365)]
    pub days: u64,
    /// Records per store commit.
    #[arg(long, default_value_t = 5_000)]
    pub batch: usize,
    /// Seed of the generator: the same seed writes the same history.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Referring hosts: (URL prefix, weight). 11 well-known hosts, then 60 small sites.
const REFERRERS: &[(&str, u32)] = &[
    ("https://www.google.com/", 400),
    ("https://www.bing.com/", 60),
    ("https://duckduckgo.com/", 50),
    ("https://www.ecosia.org/", 10),
    ("https://news.ycombinator.com/item", 80),
    ("https://www.reddit.com/r/programming/comments/", 60),
    ("https://t.co/", 40),
    ("https://www.linkedin.com/feed/", 20),
    ("https://lobste.rs/s/", 20),
    ("https://mastodon.social/@", 15),
    ("https://github.com/", 25),
];
const SMALL_SITES: u32 = 60;

/// A browser, its majors, its system and system major, its device class, and its weight.
type Agent = (
    &'static str,
    &'static [&'static str],
    &'static str,
    &'static str,
    &'static str,
    u32,
);

/// Browsers, their systems and device classes.
const AGENTS: &[Agent] = &[
    (
        "Chrome",
        &["131", "130", "129"],
        "Windows",
        "10",
        "Desktop",
        300,
    ),
    ("Chrome", &["131", "130"], "Android", "14", "Mobile", 200),
    ("Safari", &["18", "17"], "iOS", "18", "Mobile", 170),
    ("Chrome", &["131"], "macOS", "10", "Laptop", 80),
    ("Safari", &["18"], "macOS", "10", "Laptop", 60),
    ("Firefox", &["133", "132"], "Windows", "10", "Desktop", 50),
    ("Firefox", &["133"], "Linux", "", "Desktop", 20),
    ("Microsoft Edge", &["131"], "Windows", "10", "Desktop", 50),
    ("Samsung Internet", &["27"], "Android", "14", "Mobile", 30),
    ("Safari", &["18"], "iOS", "18", "Tablet", 25),
    ("Opera", &["114"], "Windows", "10", "Desktop", 15),
];

/// Countries by weight.
const COUNTRIES: &[(&str, u32)] = &[
    ("US", 300),
    ("DE", 90),
    ("GB", 80),
    ("IN", 70),
    ("FR", 50),
    ("CA", 45),
    ("BR", 40),
    ("NL", 30),
    ("JP", 30),
    ("ES", 25),
    ("IT", 25),
    ("PL", 20),
    ("SE", 18),
    ("AU", 18),
    ("CH", 12),
    ("AT", 10),
    ("BE", 10),
    ("RU", 10),
    ("CN", 8),
    ("KR", 8),
    ("MX", 8),
    ("TR", 6),
    ("UA", 6),
    ("CZ", 6),
    ("DK", 5),
    ("FI", 5),
    ("NO", 5),
    ("PT", 5),
    ("ID", 4),
    ("ZA", 4),
];

/// Campaign tags: (utm_source, utm_medium, utm_campaign), by weight.
const CAMPAIGNS: &[(&str, &str, &str, u32)] = &[
    ("newsletter", "email", "weekly", 40),
    ("twitter", "social", "launch", 20),
    ("google", "cpc", "brand", 20),
    ("partner", "referral", "spring-sale", 10),
    ("facebook", "paid-social", "retargeting", 10),
];

/// Custom event names and weights.
const EVENTS: &[(&str, u32)] = &[
    ("signup", 10),
    ("download", 30),
    ("outbound-link", 40),
    ("newsletter", 10),
    ("play-video", 10),
];

/// Index by weight.
fn weighted(rng: &mut Rng, weights: impl Iterator<Item = u32> + Clone) -> usize {
    let total: u32 = weights.clone().sum();
    let mut pick = rng.below(u64::from(total)) as u32;
    for (i, w) in weights.enumerate() {
        if pick < w {
            return i;
        }
        pick -= w;
    }
    0
}

/// A rank in `1..=n` with popularity ~ 1/rank: n^u for a uniform u.
fn rank(rng: &mut Rng, n: u64) -> u64 {
    ((n as f64).powf(rng.unit()) as u64).clamp(1, n)
}

/// The history generator: one day's records at a time, oldest day first.
pub struct History {
    site: SiteId,
    rng: Rng,
    visitors: u64,
    pages: Vec<PagePath>,
    /// Page views still to write per day, oldest first.
    quotas: Vec<u64>,
    first: Date,
    next: usize,
    now: Timestamp,
    /// The collector's source list, to classify referrers and campaign tags as it does.
    sources: tally::collect::sources::SourceList,
}

impl History {
    pub fn new(args: &SeedArgs, now: Timestamp) -> anyhow::Result<Self> {
        anyhow::ensure!(args.days >= 1, "--days must be at least 1");
        anyhow::ensure!(
            args.visitors >= 1 && args.pages >= 1,
            "need visitors and pages"
        );
        let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
        let first = today.checked_sub((args.days as i64 - 1).days())?;
        // Weekdays weigh 10, weekends 7; today only for the part of it that has passed.
        let mut weights = Vec::new();
        for i in 0..args.days {
            let day = first.checked_add((i as i64).days())?;
            let mut w = match day.weekday() {
                jiff::civil::Weekday::Saturday | jiff::civil::Weekday::Sunday => 7.0,
                _ => 10.0,
            };
            if day == today {
                w *= (day_start(day)?.duration_until(now).as_secs_f64() / 86_400.0).max(0.01);
            }
            weights.push(w);
        }
        let sum: f64 = weights.iter().sum();
        // Cumulative rounding: the quotas add up to exactly `views`.
        let (mut quotas, mut acc, mut given) = (Vec::new(), 0.0, 0u64);
        for w in &weights {
            acc += w;
            let upto = (acc / sum * args.views as f64).round() as u64;
            quotas.push(upto.saturating_sub(given));
            given = upto;
        }
        let mut pages = Vec::new();
        for r in 1..=args.pages {
            let path = match r {
                1 => "/".to_owned(),
                2 => "/about/".to_owned(),
                _ => format!("/posts/{}/post-{r}/", 2000 + r % 26),
            };
            pages.push(PagePath::parse(&path).map_err(|e| anyhow::anyhow!("{path}: {e}"))?);
        }
        Ok(Self {
            site: SiteId::parse(&args.target.site).map_err(|e| anyhow::anyhow!("--site: {e}"))?,
            rng: Rng::new(args.seed),
            visitors: args.visitors,
            pages,
            quotas,
            first,
            next: 0,
            now,
            sources: tally::collect::sources::SourceList::bundled(),
        })
    }

    /// Page views in all (the sum of the daily quotas).
    pub fn total_views(&self) -> u64 {
        self.quotas.iter().sum()
    }

    fn visitor_key(&mut self, visitor: u64, day: Date) -> VisitorKey {
        // 70 % keep a stored id (one key for all days), 30 % only a per-day key.
        let mut h = blake3::Hasher::new();
        h.update(&visitor.to_le_bytes());
        if visitor % 10 >= 7 {
            h.update(day.to_string().as_bytes());
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&h.finalize().as_bytes()[..16]);
        VisitorKey(key)
    }

    /// The agent tuple of a visitor (one browser, system, device and country each).
    fn agent(&self, visitor: u64) -> std::sync::Arc<str> {
        let mut rng = Rng::new(visitor.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa5a5);
        let a = AGENTS[weighted(&mut rng, AGENTS.iter().map(|a| a.5))];
        let major = a.1[rng.below(a.1.len() as u64) as usize];
        let country = COUNTRIES[weighted(&mut rng, COUNTRIES.iter().map(|c| c.1))].0;
        tally::core::dims::AgentDims {
            browser: a.0.to_owned(),
            browser_version: major.to_owned(),
            os: a.2.to_owned(),
            os_version: a.3.to_owned(),
            device: a.4.to_owned(),
            country: country.to_owned(),
            region: String::new(),
        }
        .encode()
        .into()
    }

    /// The source tuple of a visit entering from `referrer` (or none), maybe with campaign tags.
    fn source(&mut self, referrer: Option<&str>) -> String {
        let mut campaign = tally::core::dims::Campaign::default();
        if self.rng.chance(0.08) {
            let c = CAMPAIGNS[weighted(&mut self.rng, CAMPAIGNS.iter().map(|c| c.3))];
            campaign.utm_source = c.0.to_owned();
            campaign.utm_medium = c.1.to_owned();
            campaign.utm_campaign = c.2.to_owned();
        }
        tally::core::dims::classify_source(referrer, &campaign, &self.sources).encode()
    }

    fn referrer(&mut self) -> String {
        let big: u32 = REFERRERS.iter().map(|r| r.1).sum();
        // The small sites share a fifth of the external referrals.
        if self.rng.below(u64::from(big) * 5 / 4) >= u64::from(big) {
            let site = self.rng.below(u64::from(SMALL_SITES));
            return format!("https://blog{site}.example/links/");
        }
        let i = weighted(&mut self.rng, REFERRERS.iter().map(|r| r.1));
        REFERRERS[i].0.to_owned()
    }

    fn event_id(&mut self, at: Timestamp) -> EventId {
        let mut random = [0u8; 10];
        random[..8].copy_from_slice(&self.rng.next_u64().to_le_bytes());
        random[8..].copy_from_slice(&self.rng.next_u64().to_le_bytes()[..2]);
        EventId::new_at(at, random)
    }

    /// The next day's records in time order, or `None` after the last day.
    pub fn next_day(&mut self) -> anyhow::Result<Option<Vec<Record>>> {
        let Some(&quota) = self.quotas.get(self.next) else {
            return Ok(None);
        };
        let day = self.first.checked_add((self.next as i64).days())?;
        self.next += 1;
        let start = day_start(day)?;
        let end = (start + jiff::SignedDuration::from_hours(24)).min(self.now);
        let span_ms = (end.as_millisecond() - start.as_millisecond()).max(1);
        let mut out = Vec::with_capacity(quota as usize * 11 / 10);
        let mut left = quota;
        while left > 0 {
            let visitor = if self.rng.chance(0.5) {
                self.rng.below(self.visitors)
            } else {
                rank(&mut self.rng, self.visitors) - 1
            };
            let key = self.visitor_key(visitor, day);
            let views = if self.rng.chance(0.55) {
                1
            } else {
                2 + self.rng.below(7)
            }
            .min(left);
            let mut at_ms = start.as_millisecond() + self.rng.below(span_ms as u64) as i64;
            let mut referrer = self.rng.chance(0.45).then(|| self.referrer());
            let agent = self.agent(visitor);
            // The visit's entry carries its source; the views after it come from the site.
            let mut src = self.source(referrer.as_deref());
            let internal = tally::core::dims::classify_source(
                None,
                &tally::core::dims::Campaign::default(),
                &self.sources,
            )
            .encode();
            for _ in 0..views {
                if at_ms >= end.as_millisecond() {
                    at_ms = end.as_millisecond() - 1;
                }
                let at = Timestamp::from_millisecond(at_ms)?;
                let page =
                    self.pages[rank(&mut self.rng, self.pages.len() as u64) as usize - 1].clone();
                let view = Record {
                    event_id: self.event_id(at),
                    site: self.site.clone(),
                    source: Source::Web,
                    kind: HitKind::Pageview,
                    page,
                    visitor: key,
                    at_ms,
                    day,
                    referrer: referrer.take(),
                    dims: tally::core::record::Dims {
                        src: std::mem::replace(&mut src, internal.clone()),
                        agent: agent.clone(),
                    },
                };
                if self.rng.chance(0.6) {
                    let engaged_ms = (self.rng.below(120_000) + self.rng.below(60_000)) as u32;
                    let scroll = Some((20 + self.rng.below(81)) as u8);
                    let report = Record {
                        kind: HitKind::Engagement { engaged_ms, scroll },
                        dims: Default::default(),
                        ..view.clone()
                    };
                    out.push(view);
                    out.push(report);
                } else {
                    out.push(view);
                }
                if self.rng.chance(0.06) {
                    let i = weighted(&mut self.rng, EVENTS.iter().map(|e| e.1));
                    let name = EventName::parse(EVENTS[i].0)
                        .map_err(|e| anyhow::anyhow!("event name: {e}"))?;
                    let at_ms = at_ms + 1_000;
                    let at = Timestamp::from_millisecond(at_ms.min(end.as_millisecond() - 1))?;
                    out.push(Record {
                        event_id: self.event_id(at),
                        site: self.site.clone(),
                        source: Source::Web,
                        kind: HitKind::Event { name, dedupe: None },
                        page: PagePath::root(),
                        visitor: key,
                        at_ms: at.as_millisecond(),
                        day,
                        referrer: None,
                        dims: tally::core::record::Dims {
                            src: internal.clone(),
                            agent: agent.clone(),
                        },
                    });
                }
                at_ms += 20_000 + self.rng.below(280_000) as i64;
            }
            left -= views;
        }
        // Time order; an engagement report stays after its page view (a stable sort).
        out.sort_by_key(|r| r.at_ms);
        Ok(Some(out))
    }
}

fn day_start(day: Date) -> anyhow::Result<Timestamp> {
    Ok(day.to_zoned(jiff::tz::TimeZone::UTC)?.timestamp())
}

/// `url` with its `search_path` set to `schema` (what `tally serve --db` is given).
pub fn url_with_schema(url: &str, schema: Option<&str>) -> String {
    match schema {
        None => url.to_owned(),
        Some(s) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}options=-csearch_path%3D{s}")
        }
    }
}

fn is_postgres(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// Open the store `seed` writes through, with no page cap (a year's pages are all real).
pub async fn open(db: &str, schema: Option<&str>) -> anyhow::Result<Arc<dyn Store>> {
    if is_postgres(db) {
        let options = PgOptions {
            pool_size: 4,
            max_new_pages_per_day: 0,
            schema: schema.map(str::to_owned),
        };
        Ok(Arc::new(PgStore::open(db, options).await?))
    } else {
        if schema.is_some() {
            bail!("--schema is for PostgreSQL");
        }
        let mut config = ServeConfig::for_db(PathBuf::from(db));
        config.max_new_pages_per_day = 0;
        Ok(Arc::new(tally::open_sqlite(&config)?))
    }
}

/// Write `history` into `store`; returns (records committed, of them accepted).
pub async fn write(
    store: &dyn Store,
    history: &mut History,
    batch: usize,
    mut progress: impl FnMut(u64, u64),
) -> anyhow::Result<(u64, u64)> {
    let (mut written, mut accepted) = (0u64, 0u64);
    let mut views = 0u64;
    while let Some(day) = history.next_day()? {
        views += day
            .iter()
            .filter(|r| matches!(r.kind, HitKind::Pageview))
            .count() as u64;
        for chunk in day.chunks(batch.max(1)) {
            let outcomes = store.commit(chunk.to_vec()).await?;
            written += chunk.len() as u64;
            accepted += outcomes
                .iter()
                .filter(|o| matches!(o, tally::core::record::Outcome::Accepted))
                .count() as u64;
        }
        progress(views, written);
    }
    Ok((written, accepted))
}

pub async fn seed(args: SeedArgs) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let mut history = History::new(&args, now)?;
    let store = open(&args.target.db, args.target.schema.as_deref()).await?;
    store
        .put_site(&Site {
            id: history.site.clone(),
            origins: vec!["*".to_owned()],
            zone: tally::core::day::SiteZone::utc(),
            public: false,
            ingest_key: None,
        })
        .await?;
    let total = history.total_views();
    eprintln!(
        "seeding {}: {total} page views, {} visitors, {} pages, {} days (seed {})",
        args.target.site, args.visitors, args.pages, args.days, args.seed
    );
    let started = Instant::now();
    let mut last = Instant::now();
    let (written, accepted) = write(
        store.as_ref(),
        &mut history,
        args.batch,
        |views, written| {
            if last.elapsed() >= Duration::from_secs(10) {
                last = Instant::now();
                eprintln!(
                    "  {views}/{total} views, {:.0} records/s",
                    written as f64 / started.elapsed().as_secs_f64()
                );
            }
        },
    )
    .await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "seeded {}: {total} page views, {written} records ({accepted} accepted) in {secs:.0} s, \
         {:.0} records/s",
        args.target.site,
        written as f64 / secs
    );
    // Seal the finished days as `tally serve` would (every day over for an hour).
    let sealing = Instant::now();
    let sealer = tally::collect::seal::Sealer {
        sites: store.clone(),
        segments: store.clone(),
    };
    let report = sealer.pass(now, u64::MAX).await?;
    println!(
        "sealed {} days in {:.1} s",
        report.sealed,
        sealing.elapsed().as_secs_f64()
    );
    let rolling = Instant::now();
    let months = sealer.roll_up(now).await?;
    println!(
        "rolled {months} months up in {:.1} s",
        rolling.elapsed().as_secs_f64()
    );
    println!(
        "read it: tally-loadgen read --db {}{}",
        args.target.db,
        args.target
            .schema
            .as_deref()
            .map(|s| format!(" --schema {s}"))
            .unwrap_or_default()
    );
    Ok(())
}

/// Options of `read`.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// The tally binary (build it with --profile dist).
    #[arg(long, default_value = "target/dist/tally")]
    pub tally: PathBuf,
    #[command(flatten)]
    pub target: Target,
    /// Ranges to read, comma-separated (`today`, `7d`, `30d`, `90d`, `365d`; `12mo` and `all`
    /// for the analytics API only).
    #[arg(long, default_value = "today,7d,30d,365d,12mo,all")]
    pub ranges: String,
    /// Cold samples per query (each in a fresh server process).
    #[arg(long, default_value_t = 3)]
    pub cold: usize,
    /// Warm samples per query.
    #[arg(long, default_value_t = 10)]
    pub warm: usize,
    /// Live connections beside the reads in the loaded phase (0: no loaded phase).
    #[arg(long, default_value_t = 8)]
    pub live: usize,
    /// Concurrent readers beside the live load, each on its own connection from its own
    /// loopback address (127.1.0.1, 127.1.0.2, …: one client network each, as people are).
    #[arg(long, default_value_t = 1)]
    pub readers: usize,
    /// The server's `--stats-concurrency` (default: the server's own default, as deployed).
    #[arg(long)]
    pub stats_concurrency: Option<usize>,
    /// Seconds of live load, alone and again beside the reads.
    #[arg(long, default_value_t = 10)]
    pub live_secs: u64,
    /// Longest wait for one answer, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    #[command(flatten)]
    pub mix: MixArgs,
}

/// One timed read: a GET of `path`, or a POST of `body` (the analytics API).
#[derive(Debug, Clone)]
pub struct Query {
    pub name: &'static str,
    pub range: String,
    pub path: String,
    pub body: Option<String>,
}

/// The local days (UTC) of a dashboard range ending today, as `[from, to]`.
fn range_days(range: &str, now: Timestamp) -> [String; 2] {
    let days: i64 = match range {
        "today" => 1,
        "7d" => 7,
        "30d" => 30,
        "90d" => 90,
        _ => 365,
    };
    let to = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    let from = to.checked_sub((days - 1).days()).unwrap_or(to);
    [from.to_string(), to.to_string()]
}

/// Ranges only the analytics API names (`12mo`: the 12 whole months before this one; `all`:
/// from the site's first day): the v1 reads and the dashboard take `today`..`365d`.
fn api_only(range: &str) -> bool {
    matches!(range, "12mo" | "all")
}

/// The analytics questions timed per range: totals, breakdowns, filters on visit and event
/// dimensions, a page breakdown with engagement.
fn v2_queries(site: &str, range: &str, now: Timestamp) -> Vec<(&'static str, serde_json::Value)> {
    let dates = if api_only(range) {
        serde_json::json!(range)
    } else {
        serde_json::json!(range_days(range, now))
    };
    let q = |metrics: serde_json::Value, dims: serde_json::Value, filters: serde_json::Value| {
        serde_json::json!({"site_id": site, "date_range": dates, "metrics": metrics,
            "dimensions": dims, "filters": filters, "pagination": {"limit": 10}})
    };
    use serde_json::json;
    vec![
        (
            "v2 totals",
            q(
                json!([
                    "visitors",
                    "visits",
                    "pageviews",
                    "views_per_visit",
                    "bounce_rate",
                    "visit_duration"
                ]),
                json!([]),
                json!([]),
            ),
        ),
        (
            "v2 sources",
            q(
                json!(["visitors", "visits"]),
                json!(["visit:source"]),
                json!([]),
            ),
        ),
        (
            "v2 pages",
            q(
                json!(["visitors", "pageviews", "time_on_page", "scroll_depth"]),
                json!(["event:page"]),
                json!([]),
            ),
        ),
        (
            "v2 by day",
            q(
                json!(["visitors", "pageviews"]),
                json!(["time:day"]),
                json!([]),
            ),
        ),
        (
            "v2 filtered",
            q(
                json!(["visitors", "visits", "bounce_rate"]),
                json!(["visit:source"]),
                json!([
                    ["is", "visit:country", ["DE"]],
                    ["is", "visit:browser", ["Firefox"]]
                ]),
            ),
        ),
        (
            "v2 page filter",
            q(
                json!(["visitors", "time_on_page"]),
                json!(["visit:channel"]),
                json!([["contains", "event:page", ["/docs"]]]),
            ),
        ),
    ]
}

/// Every read of the dashboard, the v1 API and the analytics API, per range (the all-time
/// counters once).
pub fn queries(site: &str, ranges: &[&str]) -> Vec<Query> {
    let now = Timestamp::now();
    let mut out = vec![Query {
        name: "counts",
        range: "all".to_owned(),
        path: format!("/api/v1/counts?site={site}"),
        body: None,
    }];
    for r in ranges {
        let v1 = if api_only(r) {
            Vec::new()
        } else {
            vec![
                ("series", format!("/api/v1/sites/{site}/series?range={r}")),
                ("top", format!("/api/v1/sites/{site}/top?range={r}")),
                ("events", format!("/api/v1/sites/{site}/events?range={r}")),
                (
                    "filtered",
                    format!("/api/v1/sites/{site}/filtered?range={r}"),
                ),
                ("dashboard", format!("/dashboard/{site}?range={r}")),
                // The whole page under a filter (a visitor's browser, as a click on a
                // panel row sets it): none of its questions has a stored month state.
                (
                    "dashboard filtered",
                    format!("/dashboard/{site}?range={r}&f=is,visit:browser,Firefox"),
                ),
            ]
        };
        for (name, path) in v1 {
            out.push(Query {
                name,
                range: (*r).to_owned(),
                path,
                body: None,
            });
        }
        for (name, body) in v2_queries(site, r, now) {
            out.push(Query {
                name,
                range: (*r).to_owned(),
                path: "/api/v2/query".to_owned(),
                body: Some(body.to_string()),
            });
        }
    }
    out
}

/// The `p`-th percentile (nearest rank) of `samples` (sorted here), in ms.
pub fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable();
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1].as_secs_f64() * 1000.0
}

const TOKEN: &str = "loadgen-read-benchmark-token";

/// One read's outcome: answered after a time, or `503 busy` (the server's stats slots full).
enum Outcome {
    Answered(Duration),
    Busy,
}

async fn timed(
    conn: &mut client::Conn,
    host: &str,
    q: &Query,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    match read_once(conn, host, q, timeout).await? {
        Outcome::Answered(took) => Ok(took),
        Outcome::Busy => bail!("{} {}: HTTP 503 busy", q.name, q.range),
    }
}

async fn read_once(
    conn: &mut client::Conn,
    host: &str,
    q: &Query,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let auth = format!("Bearer {TOKEN}");
    let req = match &q.body {
        None => client::get(&q.path, &[("host", host), ("authorization", &auth)]),
        Some(body) => client::post(
            &q.path,
            &[
                ("host", host),
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            bytes::Bytes::from(body.clone()),
        ),
    };
    let started = Instant::now();
    let answer = conn
        .send(req, timeout)
        .await
        .map_err(|f| anyhow::anyhow!("{} {}: {f:?}", q.name, q.range))?;
    let took = started.elapsed();
    if answer.status == 503 {
        return Ok(Outcome::Busy);
    }
    if answer.status != 200 {
        bail!(
            "{} {}: HTTP {} {}",
            q.name,
            q.range,
            answer.status,
            String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
        );
    }
    Ok(Outcome::Answered(took))
}

/// The loopback address of reader `i` (its own /32 client network).
fn reader_address(i: usize) -> std::net::IpAddr {
    let [_, _, hi, lo] = u32::try_from(i + 1).unwrap_or(u32::MAX).to_be_bytes();
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 1, hi, lo))
}

async fn start(args: &ReadArgs, log: &Path) -> anyhow::Result<Server> {
    let db = url_with_schema(&args.target.db, args.target.schema.as_deref());
    // The live connections all come from 127.0.0.1; each reader from its own address. The
    // cold and warm reads (127.0.0.1, one at a time) never wait for a stats slot.
    let conns = (args.live + 16).max(64);
    let mut extra = format!(
        "--admin-token {TOKEN} --rate-limit-per-minute 0 --address-limit-per-minute 0 \
         --max-connections-per-address {conns}"
    );
    if let Some(slots) = args.stats_concurrency {
        extra.push_str(&format!(" --stats-concurrency {slots}"));
    }
    server::spawn_tally(&args.tally, Path::new(&db), &extra, log).await
}

async fn connect(server: &Server) -> anyhow::Result<client::Conn> {
    client::connect(server.addr, None)
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e:?}"))
}

/// Database bytes: the SQLite file and its WAL, or every relation of the schema.
async fn database_bytes(args: &ReadArgs) -> anyhow::Result<u64> {
    if !is_postgres(&args.target.db) {
        let mut total = 0;
        for suffix in ["", "-wal"] {
            if let Ok(m) = std::fs::metadata(format!("{}{suffix}", args.target.db)) {
                total += m.len();
            }
        }
        return Ok(total);
    }
    let url = url_with_schema(&args.target.db, args.target.schema.as_deref());
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::int8 FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'm')",
            &[],
        )
        .await?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

#[derive(Default)]
struct Samples {
    cold: Vec<Duration>,
    warm: Vec<Duration>,
    loaded: Vec<Duration>,
    /// Loaded reads answered `503 busy`.
    busy: usize,
}

pub async fn read(args: ReadArgs) -> anyhow::Result<()> {
    let ranges: Vec<&str> = args.ranges.split(',').map(str::trim).collect();
    let queries = queries(&args.target.site, &ranges);
    let timeout = Duration::from_secs(args.timeout);
    let dir = server::TempDir::new()?;
    let log = dir.join("tally.log");
    let mut samples: BTreeMap<usize, Samples> = BTreeMap::new();

    eprintln!(
        "cold: {} queries x {} fresh processes",
        queries.len(),
        args.cold
    );
    for (i, q) in queries.iter().enumerate() {
        for _ in 0..args.cold {
            let server = start(&args, &log).await?;
            let host = server.addr.to_string();
            let mut conn = connect(&server).await?;
            let took = timed(&mut conn, &host, q, timeout).await?;
            samples.entry(i).or_default().cold.push(took);
            drop(conn);
            server.stop().await?;
        }
    }

    let server = start(&args, &log).await?;
    let host = server.addr.to_string();
    eprintln!("warm: {} queries x {} samples", queries.len(), args.warm);
    let mut conn = connect(&server).await?;
    for (i, q) in queries.iter().enumerate() {
        timed(&mut conn, &host, q, timeout).await?;
        for _ in 0..args.warm {
            let took = timed(&mut conn, &host, q, timeout).await?;
            samples.entry(i).or_default().warm.push(took);
        }
    }
    let peak_alone = server.peak_rss_mb()?;

    let mut live_rows: Vec<(&str, Stats)> = Vec::new();
    if args.live > 0 {
        add_live_site(&args).await?;
        let drive = |salt| Drive {
            addr: server.addr,
            connections: args.live,
            source: LegitSource::Visitor,
            plan: Plan::new(&args.mix, salt),
        };
        let live_for = Duration::from_secs(args.live_secs);
        eprintln!(
            "live load alone: {} connections, {} s",
            args.live, args.live_secs
        );
        live_rows.push(("live alone", drive(1).run(live_for).await?));
        eprintln!(
            "live load beside {} readers: {} s",
            args.readers, args.live_secs
        );
        let beside = tokio::spawn({
            let d = drive(2);
            async move { d.run(live_for).await }
        });
        // Each reader runs every query in turn until the live load ends (at least one
        // round), on its own connection.
        let until = Instant::now() + live_for;
        let queries = Arc::new(queries.clone());
        let mut readers = Vec::new();
        for reader in 0..args.readers.max(1) {
            let queries = Arc::clone(&queries);
            let (addr, host) = (server.addr, host.clone());
            readers.push(tokio::spawn(async move {
                let mut conn = client::connect(addr, Some(reader_address(reader)))
                    .await
                    .map_err(|e| anyhow::anyhow!("connect: {e:?}"))?;
                let mut got: Vec<(usize, Outcome)> = Vec::new();
                let mut round = 0;
                // Each reader starts at its own place in the list (reader k at query k), so
                // the crowd is spread over every query, not marching through them together.
                let n = queries.len();
                while round == 0 || Instant::now() < until {
                    for i in (0..n).map(|j| (j + reader) % n) {
                        let q = &queries[i];
                        let outcome = read_once(&mut conn, &host, q, timeout).await?;
                        if matches!(outcome, Outcome::Busy) {
                            // As the answer's Retry-After asks (a person reloads later).
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        got.push((i, outcome));
                    }
                    round += 1;
                }
                anyhow::Ok(got)
            }));
        }
        for r in readers {
            for (i, outcome) in r.await?? {
                let s = samples.entry(i).or_default();
                match outcome {
                    Outcome::Answered(took) => s.loaded.push(took),
                    Outcome::Busy => s.busy += 1,
                }
            }
        }
        live_rows.push(("beside reads", beside.await??));
    }
    let peak = server.peak_rss_mb()?;
    drop(conn);
    server.stop().await?;
    let bytes = database_bytes(&args).await?;

    println!(
        "{:<15} {:>6} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>6} {:>6}",
        "query",
        "range",
        "cold p50",
        "cold max",
        "warm p50",
        "warm p95",
        "loaded p50",
        "loaded p95",
        "loaded",
        "busy"
    );
    for (i, q) in queries.iter().enumerate() {
        let s = samples.entry(i).or_default();
        println!(
            "{:<15} {:>6} {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>9.1}ms {:>9.1}ms {:>6} {:>6}",
            q.name,
            q.range,
            percentile(&mut s.cold, 50.0),
            percentile(&mut s.cold, 100.0),
            percentile(&mut s.warm, 50.0),
            percentile(&mut s.warm, 95.0),
            percentile(&mut s.loaded, 50.0),
            percentile(&mut s.loaded, 95.0),
            s.loaded.len(),
            s.busy,
        );
    }
    if !live_rows.is_empty() {
        println!(
            "{:<14} {:>12} {:>10} {:>10} {:>8}",
            "live load", "hits/s", "p50 ms", "p99 ms", "errors"
        );
    }
    for (name, stats) in &live_rows {
        print_row(name, stats);
    }
    println!(
        "server peak RSS: {peak_alone:.1} MB after the warm reads, {peak:.1} MB at the end; \
         database: {:.1} MB",
        bytes as f64 / 1e6
    );
    Ok(())
}

/// The live mix's site, created like `tally site add` does (the mix sends to [`SITE`]).
async fn add_live_site(args: &ReadArgs) -> anyhow::Result<()> {
    let db = url_with_schema(&args.target.db, args.target.schema.as_deref());
    let status = tokio::process::Command::new(&args.tally)
        .args(["site", "add", SITE, "--origin", "*", "--db", &db])
        .env("TALLY_LOG", "error")
        .status()
        .await
        .context("tally site add")?;
    anyhow::ensure!(status.success(), "tally site add {SITE} failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn small(db: String, schema: Option<String>) -> SeedArgs {
        SeedArgs {
            target: Target {
                db,
                schema,
                site: "seeded".to_owned(),
            },
            views: 20_000,
            visitors: 3_000,
            pages: 200,
            days: 30,
            batch: 700,
            seed: 9,
        }
    }

    /// What the generator writes: views, distinct visitor keys, custom events, engagement
    /// reports and the days with views.
    fn expected(args: &SeedArgs, now: Timestamp) -> (u64, usize, u64, u64, Vec<Date>) {
        let mut h = History::new(args, now).expect("history");
        let (mut views, mut events, mut engagements) = (0, 0, 0);
        let (mut keys, mut days) = (HashSet::new(), Vec::new());
        while let Some(day) = h.next_day().expect("day") {
            for r in &day {
                match r.kind {
                    HitKind::Pageview => {
                        views += 1;
                        keys.insert(r.visitor.0);
                    }
                    HitKind::Event { .. } => events += 1,
                    HitKind::Engagement { .. } => engagements += 1,
                }
            }
            if day.iter().any(|r| matches!(r.kind, HitKind::Pageview)) {
                days.push(day[0].day);
            }
        }
        (views, keys.len(), events, engagements, days)
    }

    async fn seed_and_check(args: SeedArgs) {
        let now = Timestamp::now();
        let (views, visitors, events, engagements, days) = expected(&args, now);
        assert!(engagements > 0, "the history reports engaged time");
        assert_eq!(views, args.views, "the daily quotas add up to --views");
        assert!(
            days.len() >= 29,
            "views on (nearly) every day: {}",
            days.len()
        );
        let store = open(&args.target.db, args.target.schema.as_deref())
            .await
            .expect("open");
        let mut history = History::new(&args, now).expect("history");
        let (written, accepted) = write(store.as_ref(), &mut history, args.batch, |_, _| {})
            .await
            .expect("write");
        assert_eq!(written, views + events + engagements);
        assert_eq!(accepted, written, "every generated id is new");
        let site = SiteId::parse("seeded").expect("site");
        let (from, to) = (days[0], *days.last().expect("a day"));
        let totals = store.range_totals(&site, from, to).await.expect("totals");
        assert_eq!(totals.web.views, views);
        assert_eq!(totals.web.visitors, visitors as u64);
        let series = store.series(&site, from, to).await.expect("series");
        assert_eq!(series.len(), days.len());
        let top = store.top_events(&site, from, to, 10).await.expect("events");
        assert_eq!(top.iter().map(|e| e.count).sum::<u64>(), events);
        let referrers = store
            .top_referrers(&site, from, to, 100)
            .await
            .expect("refs");
        assert_eq!(referrers.len(), REFERRERS.len() + SMALL_SITES as usize);
    }

    #[tokio::test]
    async fn seed_writes_exactly_what_it_generates_sqlite() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("seed.sqlite").display().to_string();
        seed_and_check(small(db, None)).await;
    }

    #[tokio::test]
    async fn seed_writes_exactly_what_it_generates_postgres() {
        let Ok(url) = std::env::var("TALLY_TEST_POSTGRES") else {
            eprintln!("SKIPPED: TALLY_TEST_POSTGRES is not set (seed on PostgreSQL untested)");
            return;
        };
        let schema = format!("seed_{}", std::process::id());
        seed_and_check(small(url.clone(), Some(schema.clone()))).await;
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .expect("drop schema");
    }

    #[test]
    fn same_seed_same_history() {
        let args = small("x.sqlite".to_owned(), None);
        let now = Timestamp::now();
        let day = |seed| {
            let mut a = args.clone();
            a.seed = seed;
            let mut h = History::new(&a, now).expect("history");
            h.next_day().expect("day").expect("first day")
        };
        assert_eq!(day(9), day(9));
        assert_ne!(day(9), day(10));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let mut s: Vec<Duration> = (1..=20).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&mut s, 50.0), 10.0);
        assert_eq!(percentile(&mut s, 95.0), 19.0);
        assert_eq!(percentile(&mut s, 100.0), 20.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }
}
