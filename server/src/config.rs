//! Configuration: one struct, from flags, `TALLY_*` environment variables and an optional TOML
//! file, in that order of precedence, over defaults that make `tally serve` alone work.
//! Secrets (the admin token) are never printed: `Debug` redacts them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use crate::core::hit::TimeWindow;
use crate::ingest::IngestConfig;
use crate::store::sqlite::SyncMode;

/// Options of `tally serve` as given on the command line or in the environment. Every field is
/// optional so that the file and the defaults can fill what is not given.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TALLY_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Accept any site id and origin (a public counter); such sites are public.
    #[arg(long, env = "TALLY_AUTO_SITES", num_args = 0..=1, default_missing_value = "true")]
    pub auto_sites: Option<bool>,
    /// SQLite durability: full (fsync every commit) or normal (survives crashes, not power loss).
    #[arg(long, env = "TALLY_SYNC", value_enum)]
    pub sync: Option<SyncMode>,
    /// Jobs the ingest queue holds before answering 503.
    #[arg(long, env = "TALLY_QUEUE_CAPACITY")]
    pub queue_capacity: Option<usize>,
    /// Records per commit at most.
    #[arg(long, env = "TALLY_BATCH_MAX")]
    pub batch_max: Option<usize>,
    /// Milliseconds a batch waits for more hits after its first.
    #[arg(long, env = "TALLY_BATCH_DELAY_MS")]
    pub batch_delay_ms: Option<u64>,
    /// Hours an event id's time may lie in the past.
    #[arg(long, env = "TALLY_WINDOW_BACK_HOURS")]
    pub window_back_hours: Option<u32>,
    /// Minutes an event id's time may lie in the future.
    #[arg(long, env = "TALLY_WINDOW_AHEAD_MINUTES")]
    pub window_ahead_minutes: Option<u32>,
    /// Days raw events are kept (default 400; 0 = forever); must exceed the accepted window.
    #[arg(long, env = "TALLY_RETENTION_DAYS")]
    pub retention_days: Option<u32>,
    /// Token for private stats and admin endpoints.
    #[arg(long, env = "TALLY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Take the client address from X-Forwarded-For (only behind a trusted proxy).
    #[arg(long, env = "TALLY_TRUST_PROXY", num_args = 0..=1, default_missing_value = "true")]
    pub trust_proxy: Option<bool>,
    /// Length of the live window in seconds.
    #[arg(long, env = "TALLY_LIVE_WINDOW_SECS")]
    pub live_window_secs: Option<u32>,
    /// Records one client address may send to one site per minute before 429 (0 = no limit).
    #[arg(long, env = "TALLY_RATE_LIMIT_PER_MINUTE")]
    pub rate_limit_per_minute: Option<u32>,
    /// Seconds within which repeated badge/pixel fetches from one source count once (0 = off).
    #[arg(long, env = "TALLY_REPEAT_INTERVAL_SECS")]
    pub repeat_interval_secs: Option<u32>,
    /// Records one client address may send to all sites together per minute (0 = no limit).
    #[arg(long, env = "TALLY_ADDRESS_LIMIT_PER_MINUTE")]
    pub address_limit_per_minute: Option<u32>,
    /// Sites one client address may create per hour with --auto-sites (0 = no limit).
    #[arg(long, env = "TALLY_NEW_SITES_PER_HOUR")]
    pub new_sites_per_hour: Option<u32>,
    /// Most sites --auto-sites may create in total (0 = no limit).
    #[arg(long, env = "TALLY_MAX_SITES")]
    pub max_sites: Option<u64>,
    /// How many times larger the allowance of known image proxies (GitHub camo) is.
    #[arg(long, env = "TALLY_PROXY_FACTOR")]
    pub proxy_factor: Option<u32>,
    /// Free disk space (MiB) below which writes are refused with 503.
    #[arg(long, env = "TALLY_MIN_FREE_MB")]
    pub min_free_mb: Option<u64>,
    /// New distinct pages a site may gain per day; the rest count as `(other)` (0 = no limit).
    #[arg(long, env = "TALLY_MAX_NEW_PAGES_PER_DAY")]
    pub max_new_pages_per_day: Option<u32>,
    /// Days per-day visitor sets are kept (0 = forever).
    #[arg(long, env = "TALLY_VISITOR_DAYS")]
    pub visitor_days: Option<u32>,
    /// Days per-page daily counters are kept (0 = forever); site totals are always kept.
    #[arg(long, env = "TALLY_PAGE_DAYS")]
    pub page_days: Option<u32>,
    /// Stats requests (dashboard, series, top) served at once; more wait briefly, then get 503.
    #[arg(long, env = "TALLY_STATS_CONCURRENCY")]
    pub stats_concurrency: Option<usize>,
    /// Batch requests (`/api/v1/events`) read and parsed at once; more get 503.
    #[arg(long, env = "TALLY_BATCH_CONCURRENCY")]
    pub batch_concurrency: Option<usize>,
}

/// The resolved configuration of a running collector.
#[derive(Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub db: PathBuf,
    pub auto_sites: bool,
    pub sync: SyncMode,
    pub ingest: IngestConfig,
    pub window: TimeWindow,
    pub retention_days: u32,
    pub admin_token: Option<String>,
    pub trust_proxy: bool,
    pub live_window_secs: u32,
    pub repeat_interval_secs: u32,
    pub rate_limit_per_minute: u32,
    pub address_limit_per_minute: u32,
    pub new_sites_per_hour: u32,
    pub max_sites: u64,
    pub proxy_factor: u32,
    pub min_free_bytes: u64,
    pub max_new_pages_per_day: u32,
    pub visitor_days: u32,
    pub page_days: u32,
    pub stats_concurrency: usize,
    pub batch_concurrency: usize,
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("db", &self.db)
            .field("auto_sites", &self.auto_sites)
            .field("sync", &self.sync)
            .field("ingest", &self.ingest)
            .field("window", &self.window)
            .field("retention_days", &self.retention_days)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .field("trust_proxy", &self.trust_proxy)
            .field("live_window_secs", &self.live_window_secs)
            .field("repeat_interval_secs", &self.repeat_interval_secs)
            .field("rate_limit_per_minute", &self.rate_limit_per_minute)
            .field("address_limit_per_minute", &self.address_limit_per_minute)
            .field("new_sites_per_hour", &self.new_sites_per_hour)
            .field("max_sites", &self.max_sites)
            .field("proxy_factor", &self.proxy_factor)
            .field("min_free_bytes", &self.min_free_bytes)
            .field("max_new_pages_per_day", &self.max_new_pages_per_day)
            .field("visitor_days", &self.visitor_days)
            .field("page_days", &self.page_days)
            .field("stats_concurrency", &self.stats_concurrency)
            .field("batch_concurrency", &self.batch_concurrency)
            .finish()
    }
}

/// The optional TOML file: the serve options plus the database path.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub db: Option<PathBuf>,
    #[serde(flatten)]
    pub serve: ServeArgs,
}

/// A configuration problem, reported before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("retention-days ({days}) must be 0 or longer than the accepted window ({hours} h)")]
    Retention { days: u32, hours: u32 },
    #[error("visitor-days ({days}) must be 0 or longer than the accepted window ({hours} h)")]
    VisitorDays { days: u32, hours: u32 },
    #[error(
        "page-days ({page_days}) needs raw events pruned no later (retention-days {retention_days}, 0 = never): set retention-days to at most page-days"
    )]
    PageDays { page_days: u32, retention_days: u32 },
}

/// Default database file.
pub const DEFAULT_DB: &str = "tally.sqlite";
/// Script hits one source may send per minute by default: far above what a reader makes
/// (a page view per click), far below a flood.
pub const DEFAULT_RATE_LIMIT_PER_MINUTE: u32 = 120;
/// Records one address may send to all sites together per minute by default.
pub const DEFAULT_ADDRESS_LIMIT_PER_MINUTE: u32 = 600;
/// Sites one address may create per hour by default (`--auto-sites`).
pub const DEFAULT_NEW_SITES_PER_HOUR: u32 = 10;
/// Known image proxies get this many times the allowance by default.
pub const DEFAULT_PROXY_FACTOR: u32 = 10;
/// Free disk space below which writes stop, by default (MiB).
pub const DEFAULT_MIN_FREE_MB: u64 = 256;
/// New distinct pages per site and day by default.
pub const DEFAULT_MAX_NEW_PAGES_PER_DAY: u32 = 1000;
/// Days raw events and per-day visitor sets are kept by default: a 365-day dashboard range
/// stays exact (visitors) and complete (referrers).
pub const DEFAULT_RETENTION_DAYS: u32 = 400;
/// Stats requests served at once by default.
pub const DEFAULT_STATS_CONCURRENCY: usize = 4;
/// Batch requests read and parsed at once by default (each holds up to 4 MiB).
pub const DEFAULT_BATCH_CONCURRENCY: usize = 8;
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

impl FileConfig {
    /// Read a TOML config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

impl ServeConfig {
    /// Merge flags/env (`args`, `db`) over the file over the defaults.
    pub fn resolve(
        args: ServeArgs,
        db: Option<PathBuf>,
        file: FileConfig,
    ) -> Result<Self, ConfigError> {
        let f = file.serve;
        let defaults = IngestConfig::default();
        let window_back_hours = args.window_back_hours.or(f.window_back_hours).unwrap_or(72);
        let window = TimeWindow {
            back: jiff::SignedDuration::from_hours(i64::from(window_back_hours)),
            ahead: jiff::SignedDuration::from_mins(i64::from(
                args.window_ahead_minutes
                    .or(f.window_ahead_minutes)
                    .unwrap_or(5),
            )),
        };
        let outlives_window =
            |days: u32| days == 0 || u64::from(days) * 24 > u64::from(window_back_hours);
        let retention_days = args
            .retention_days
            .or(f.retention_days)
            .unwrap_or(DEFAULT_RETENTION_DAYS);
        if !outlives_window(retention_days) {
            return Err(ConfigError::Retention {
                days: retention_days,
                hours: window_back_hours,
            });
        }
        let visitor_days = args
            .visitor_days
            .or(f.visitor_days)
            .unwrap_or(DEFAULT_RETENTION_DAYS);
        if !outlives_window(visitor_days) {
            return Err(ConfigError::VisitorDays {
                days: visitor_days,
                hours: window_back_hours,
            });
        }
        let page_days = args.page_days.or(f.page_days).unwrap_or(0);
        // Raw events of a pruned page day would recount to a counter that no longer exists.
        if page_days != 0 && (retention_days == 0 || retention_days > page_days) {
            return Err(ConfigError::PageDays {
                page_days,
                retention_days,
            });
        }
        let default_listen: SocketAddr = DEFAULT_LISTEN
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8080)));
        Ok(Self {
            listen: args.listen.or(f.listen).unwrap_or(default_listen),
            db: db.or(file.db).unwrap_or_else(|| PathBuf::from(DEFAULT_DB)),
            auto_sites: args.auto_sites.or(f.auto_sites).unwrap_or(false),
            sync: args.sync.or(f.sync).unwrap_or_default(),
            ingest: IngestConfig {
                capacity: args
                    .queue_capacity
                    .or(f.queue_capacity)
                    .unwrap_or(defaults.capacity),
                max_batch: args.batch_max.or(f.batch_max).unwrap_or(defaults.max_batch),
                max_delay: args
                    .batch_delay_ms
                    .or(f.batch_delay_ms)
                    .map(Duration::from_millis)
                    .unwrap_or(defaults.max_delay),
            },
            window,
            retention_days,
            admin_token: args.admin_token.or(f.admin_token).filter(|t| !t.is_empty()),
            trust_proxy: args.trust_proxy.or(f.trust_proxy).unwrap_or(false),
            live_window_secs: args.live_window_secs.or(f.live_window_secs).unwrap_or(60),
            repeat_interval_secs: args
                .repeat_interval_secs
                .or(f.repeat_interval_secs)
                .unwrap_or(10),
            rate_limit_per_minute: args
                .rate_limit_per_minute
                .or(f.rate_limit_per_minute)
                .unwrap_or(DEFAULT_RATE_LIMIT_PER_MINUTE),
            address_limit_per_minute: args
                .address_limit_per_minute
                .or(f.address_limit_per_minute)
                .unwrap_or(DEFAULT_ADDRESS_LIMIT_PER_MINUTE),
            new_sites_per_hour: args
                .new_sites_per_hour
                .or(f.new_sites_per_hour)
                .unwrap_or(DEFAULT_NEW_SITES_PER_HOUR),
            max_sites: args.max_sites.or(f.max_sites).unwrap_or(0),
            proxy_factor: args
                .proxy_factor
                .or(f.proxy_factor)
                .unwrap_or(DEFAULT_PROXY_FACTOR),
            min_free_bytes: args
                .min_free_mb
                .or(f.min_free_mb)
                .unwrap_or(DEFAULT_MIN_FREE_MB)
                .saturating_mul(1024 * 1024),
            max_new_pages_per_day: args
                .max_new_pages_per_day
                .or(f.max_new_pages_per_day)
                .unwrap_or(DEFAULT_MAX_NEW_PAGES_PER_DAY),
            visitor_days,
            page_days,
            stats_concurrency: args
                .stats_concurrency
                .or(f.stats_concurrency)
                .unwrap_or(DEFAULT_STATS_CONCURRENCY)
                .max(1),
            batch_concurrency: args
                .batch_concurrency
                .or(f.batch_concurrency)
                .unwrap_or(DEFAULT_BATCH_CONCURRENCY)
                .max(1),
        })
    }

    /// The limits of the counting routes.
    pub fn limits(&self) -> crate::limits::LimitConfig {
        crate::limits::LimitConfig {
            per_site_per_minute: self.rate_limit_per_minute,
            per_address_per_minute: self.address_limit_per_minute,
            new_sites_per_hour: self.new_sites_per_hour,
            proxy_factor: self.proxy_factor,
        }
    }

    /// Defaults for a database file (tests and embedding).
    pub fn for_db(db: impl Into<PathBuf>) -> Self {
        let mut config =
            Self::resolve(ServeArgs::default(), Some(db.into()), FileConfig::default())
                .unwrap_or_else(|_| unreachable!("defaults are valid"));
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_file_beats_defaults() {
        let file: FileConfig = toml::from_str(
            "db = \"/data/t.sqlite\"\nauto-sites = true\nbatch-max = 64\nadmin-token = \"s3cret\"",
        )
        .expect("toml");
        let args = ServeArgs {
            batch_max: Some(128),
            ..ServeArgs::default()
        };
        let c = ServeConfig::resolve(args, None, file).expect("valid");
        assert_eq!(c.db, PathBuf::from("/data/t.sqlite"));
        assert!(c.auto_sites);
        assert_eq!(c.ingest.max_batch, 128);
        assert_eq!(c.ingest.capacity, IngestConfig::default().capacity);
        assert!(!format!("{c:?}").contains("s3cret"), "secrets are redacted");
    }

    #[test]
    fn unknown_file_keys_are_errors() {
        assert!(toml::from_str::<FileConfig>("listne = \"1.2.3.4:1\"").is_err());
    }

    #[test]
    fn retention_must_outlive_the_window() {
        let args = ServeArgs {
            retention_days: Some(2),
            ..ServeArgs::default()
        };
        assert!(ServeConfig::resolve(args, None, FileConfig::default()).is_err());
    }
}
