//! Configuration: one struct, from flags, `TALLY_*` environment variables and an optional TOML
//! file, in that order of precedence, over defaults that make `tally serve` alone work.
//! Secrets (the admin and metrics tokens, the server secret) are [`Secret`]s: `Debug`, `--help`
//! and every error redact them, and an invalid config file's error names the line and column,
//! never the line's text.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::Deserialize;

use crate::collect::ingest::IngestConfig;
use crate::collect::secrets::{Secret, SecretSource, TokenError, check_token};
use crate::core::forwarded::{ProxyError, ProxyHeader, TrustedProxies};
use crate::core::hit::TimeWindow;
use crate::edge::serve::ServerConfig;
use crate::ops::report::mail::{MailError, MailSettings};
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
    /// Token for private stats and admin endpoints: at least 16 printable ASCII characters.
    #[arg(long, env = "TALLY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,
    /// Hours a dashboard sign-in lasts (default 12).
    #[arg(long, env = "TALLY_SESSION_HOURS")]
    pub session_hours: Option<u32>,
    /// Bearer token /metrics requires (at least 16 printable ASCII characters); unset, it is open.
    #[arg(long, env = "TALLY_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<Secret>,
    /// Redis shared by several collectors (redis://host:6379/0): their live window, limits,
    /// badge/pixel repeat gate and site cache. Unset: all in this process.
    #[arg(long, env = "TALLY_REDIS", hide_env_values = true)]
    pub redis: Option<Secret>,
    /// Prefix of every Redis key (default `tally:`; give each deployment sharing a Redis its own).
    #[arg(long, env = "TALLY_REDIS_PREFIX")]
    pub redis_prefix: Option<String>,
    /// File with the server secret mixed into visitor hashes and sessions; created (mode 0600)
    /// on first start. Default: tally.secret beside the database.
    #[arg(long, env = "TALLY_SECRET_FILE")]
    pub secret_file: Option<PathBuf>,
    /// The server secret itself (at least 32 characters), instead of the file. Prefer the
    /// environment variable: a flag is visible in the process list.
    #[arg(long, env = "TALLY_SECRET", hide_env_values = true)]
    pub secret: Option<Secret>,
    /// Proxies whose forwarding header is believed, comma-separated: CIDRs, addresses, or the
    /// presets loopback, private, link-local. The client is the rightmost untrusted hop.
    #[arg(long, env = "TALLY_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Option<Vec<String>>,
    /// The header the trusted proxies write: x-forwarded-for (default) or forwarded (RFC 7239).
    #[arg(long, env = "TALLY_PROXY_HEADER", value_enum)]
    pub proxy_header: Option<ProxyHeader>,
    /// Deprecated: the same as --trusted-proxies loopback,private.
    #[arg(long, env = "TALLY_TRUST_PROXY", num_args = 0..=1, default_missing_value = "true")]
    pub trust_proxy: Option<bool>,
    /// Length of the live window in seconds.
    #[arg(long, env = "TALLY_LIVE_WINDOW_SECS")]
    pub live_window_secs: Option<u32>,
    /// The public base URL of the server (https://stats.example.com): shared links are printed
    /// and shown under it. Unset: they are shown as a path (`/share/…`).
    #[arg(long, env = "TALLY_PUBLIC_URL")]
    pub public_url: Option<String>,
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
    /// Connections to PostgreSQL per collector (with `--db postgres://…`; default 16).
    #[arg(long, env = "TALLY_DB_POOL")]
    pub db_pool: Option<usize>,
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
    /// MiB the analytics keep in memory: sealed day segments and recent questions' results
    /// over them, together (default 64; results take at most half).
    #[arg(long, env = "TALLY_ANALYTICS_CACHE_MB")]
    pub analytics_cache_mb: Option<usize>,
    /// A location database in MaxMind's format (GeoIP2/GeoLite2 Country or City, or DB-IP's
    /// free "IP to Country Lite"): the country of each visit, looked up at ingest, the address
    /// dropped as ever. A replaced file is picked up without a restart.
    #[arg(long, env = "TALLY_GEOIP")]
    pub geoip: Option<PathBuf>,
    /// Seconds a client has to send a request's headers, from their first byte.
    #[arg(long, env = "TALLY_HEADER_TIMEOUT_SECS")]
    pub header_timeout_secs: Option<u64>,
    /// Seconds a request's body may take to arrive, from the end of its headers (then 408).
    #[arg(long, env = "TALLY_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<u64>,
    /// Seconds a connection may stay idle between requests before it is closed.
    #[arg(long, env = "TALLY_IDLE_TIMEOUT_SECS")]
    pub idle_timeout_secs: Option<u64>,
    /// Seconds an answer may take from its request's headers until it is handed to the
    /// socket, and a write may wait for a client that does not read; then the connection closes.
    #[arg(long, env = "TALLY_ANSWER_TIMEOUT_SECS")]
    pub answer_timeout_secs: Option<u64>,
    /// Connections served at once; past it, new ones are answered 503 and closed.
    #[arg(long, env = "TALLY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections one client address (IPv4, or IPv6 /64) may hold at once; trusted proxies
    /// are exempt. Past it, new ones are answered 503 and closed.
    #[arg(long, env = "TALLY_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,
    /// Requests (HTTP/2 streams included) one client address may have open at once; more are
    /// answered 503. Trusted proxies are exempt.
    #[arg(long, env = "TALLY_MAX_REQUESTS_PER_ADDRESS")]
    pub max_requests_per_address: Option<usize>,
    /// Seconds shutdown waits for requests in flight before closing every connection.
    #[arg(long, env = "TALLY_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
    /// SMTP relay of the email reports: smtps://user:pass@host:465 (implicit TLS),
    /// smtp://user:pass@host:587 (STARTTLS required), or smtp://127.0.0.1:25?tls=none (plain,
    /// loopback only). Unset: no reports are sent.
    #[arg(long, env = "TALLY_SMTP", hide_env_values = true)]
    pub smtp: Option<Secret>,
    /// Sender of the reports (default: the SMTP user if it is an address, else tally@<relay>).
    #[arg(long, env = "TALLY_MAIL_FROM")]
    pub mail_from: Option<String>,
    /// PEM certificate trusted for the SMTP relay besides the public roots (a private CA).
    #[arg(long, env = "TALLY_SMTP_CA")]
    pub smtp_ca: Option<PathBuf>,
}

impl ServeArgs {
    /// Only the mail options of `args` (what `tally site report` takes besides `serve`).
    pub fn mail_only(args: &MailArgs) -> Self {
        Self {
            smtp: args.smtp.clone(),
            mail_from: args.mail_from.clone(),
            smtp_ca: args.smtp_ca.clone(),
            ..Self::default()
        }
    }
}

/// The mail options of `tally site report`, the same flags, variables and file keys as
/// `tally serve`'s.
#[derive(Debug, Clone, Default, Args)]
pub struct MailArgs {
    /// SMTP relay: smtps://user:pass@host:465, smtp://user:pass@host:587 (STARTTLS), or
    /// smtp://127.0.0.1:25?tls=none (loopback only).
    #[arg(long, env = "TALLY_SMTP", hide_env_values = true)]
    pub smtp: Option<Secret>,
    /// Sender of the report.
    #[arg(long, env = "TALLY_MAIL_FROM")]
    pub mail_from: Option<String>,
    /// PEM certificate trusted for the SMTP relay besides the public roots.
    #[arg(long, env = "TALLY_SMTP_CA")]
    pub smtp_ca: Option<PathBuf>,
}

/// The resolved configuration of a running collector.
#[derive(Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub db: Database,
    /// Connections to PostgreSQL (ignored for SQLite).
    pub db_pool: usize,
    pub auto_sites: bool,
    pub sync: SyncMode,
    pub ingest: IngestConfig,
    pub window: TimeWindow,
    pub retention_days: u32,
    /// The admin token (checked: ≥ 16 printable ASCII characters).
    pub admin_token: Option<Secret>,
    /// How long a dashboard sign-in lasts.
    pub session_lifetime: Duration,
    /// The bearer token `/metrics` requires, if any.
    pub metrics_token: Option<Secret>,
    /// The Redis URL of the shared state, if any (it may hold a password: a `Secret`).
    pub redis: Option<Secret>,
    /// Prefix of every Redis key.
    pub redis_prefix: String,
    /// Where the server secret comes from.
    pub secret: SecretSource,
    /// Proxies whose forwarding header is believed (empty: the peer is the client).
    pub trusted_proxies: TrustedProxies,
    /// The header those proxies write.
    pub proxy_header: ProxyHeader,
    pub live_window_secs: u32,
    /// The public base URL shared links are shown under (no trailing `/`), if known.
    pub public_url: Option<String>,
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
    /// Bytes of sealed day segments the analytics keep in memory.
    pub analytics_cache_bytes: usize,
    /// The location database (`--geoip`), if any.
    pub geoip: Option<PathBuf>,
    /// Timeouts, connection cap and shutdown grace of the HTTP server loop.
    pub server: ServerConfig,
    /// The SMTP relay and sender of the email reports (`--smtp`), if any.
    pub mail: Option<MailSettings>,
    /// How often the report task looks for due reports (a minute; tests shorten it).
    pub report_interval: Duration,
}

impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("db", &self.db)
            .field("db_pool", &self.db_pool)
            .field("auto_sites", &self.auto_sites)
            .field("sync", &self.sync)
            .field("ingest", &self.ingest)
            .field("window", &self.window)
            .field("retention_days", &self.retention_days)
            .field("admin_token", &self.admin_token)
            .field("session_lifetime", &self.session_lifetime)
            .field("metrics_token", &self.metrics_token)
            .field("redis", &self.redis)
            .field("redis_prefix", &self.redis_prefix)
            .field("secret", &self.secret)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("proxy_header", &self.proxy_header)
            .field("live_window_secs", &self.live_window_secs)
            .field("public_url", &self.public_url)
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
            .field("analytics_cache_bytes", &self.analytics_cache_bytes)
            .field("geoip", &self.geoip)
            .field("server", &self.server)
            .field("mail", &self.mail)
            .field("report_interval", &self.report_interval)
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
    /// The file's text is never part of the message: a line may hold a secret.
    #[error("invalid config file {path}: {problem}")]
    Parse { path: PathBuf, problem: String },
    #[error("db-pool must be at least 1")]
    DbPool,
    #[error("admin-token {0}")]
    AdminToken(TokenError),
    #[error("metrics-token {0}")]
    MetricsToken(TokenError),
    #[error("session-hours must be 1 to 8760")]
    SessionHours,
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("retention-days ({days}) must be 0 or longer than the accepted window ({hours} h)")]
    Retention { days: u32, hours: u32 },
    #[error("visitor-days ({days}) must be 0 or longer than the accepted window ({hours} h)")]
    VisitorDays { days: u32, hours: u32 },
    #[error(
        "page-days ({page_days}) needs raw events pruned no later (retention-days {retention_days}, 0 = never): set retention-days to at most page-days"
    )]
    PageDays { page_days: u32, retention_days: u32 },
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    /// Never holds the SMTP password.
    #[error(transparent)]
    Mail(#[from] MailError),
}

/// Default database file.
pub const DEFAULT_DB: &str = "tally.sqlite";
/// Default connections per collector to PostgreSQL.
pub const DEFAULT_DB_POOL: usize = 16;

/// Where the counts live: a SQLite file (the default) or a PostgreSQL database. The `--db`
/// value chooses: `postgres://…` or `postgresql://…` is a PostgreSQL URL, anything else a file.
#[derive(Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    /// A libpq-style URL; it may hold a password, so it is never printed whole.
    Postgres(String),
}

impl Database {
    /// Classify a `--db` value by its scheme.
    pub fn from_arg(db: PathBuf) -> Self {
        match db.to_str() {
            Some(url) if crate::store::postgres::is_postgres_url(url) => {
                Database::Postgres(url.to_owned())
            }
            _ => Database::Sqlite(db),
        }
    }

    /// The SQLite file, if this is one.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match self {
            Database::Sqlite(path) => Some(path),
            Database::Postgres(_) => None,
        }
    }
}

/// The file path, or the URL with its password replaced by `***`.
impl std::fmt::Display for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres(url) => match url::Url::parse(url) {
                Ok(mut parsed) => {
                    if parsed.password().is_some() {
                        let _ = parsed.set_password(Some("***"));
                    }
                    write!(f, "{parsed}")
                }
                Err(_) => f.write_str("postgres://(unparsable URL)"),
            },
        }
    }
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}
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
/// Hours a dashboard sign-in lasts by default: a working day, so a cookie that leaks (a shared
/// computer, a copied browser profile) is worthless by the next morning.
pub const DEFAULT_SESSION_HOURS: u32 = 12;
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

impl FileConfig {
    /// Read a TOML config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            problem: describe_toml_error(&text, &e),
        })
    }
}

/// Where a TOML error is and what kind it is, without any text of the file (a value may be a
/// secret): line and column, and the parser's message with every quoted literal removed —
/// except field names in an unknown-field message, which are keys, not values.
pub fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let place = e.span().map(|span| {
        let before = &text.as_bytes()[..span.start.min(text.len())];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
        format!("line {line}, column {column}: ")
    });
    let message = e.message().lines().next().unwrap_or_default();
    let message = if message.starts_with("unknown field `") {
        message.to_owned()
    } else {
        redact_literals(message)
    };
    format!("{}{message}", place.unwrap_or_default())
}

/// `invalid type: string "abc", expected u32` → `invalid type: string …, expected u32`.
fn redact_literals(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '`' | '\'' => {
                // Skip to the closing quote of the same kind (or the end).
                for d in chars.by_ref() {
                    if d == c {
                        break;
                    }
                }
                out.push('…');
            }
            c => out.push(c),
        }
    }
    // Numbers and other bare values after "invalid type:" / "invalid value:".
    for marker in ["invalid type: ", "invalid value: "] {
        if let Some(start) = out.find(marker) {
            let rest = &out[start + marker.len()..];
            let end = rest.find(", expected").unwrap_or(rest.len());
            let kind = rest[..end].split_whitespace().next().unwrap_or("value");
            let kind = if kind.chars().all(|c| c.is_ascii_alphabetic()) {
                kind
            } else {
                "value"
            };
            out = format!("{}{marker}{kind}{}", &out[..start], &rest[end..]);
        }
    }
    out
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
        let admin_token = args.admin_token.or(f.admin_token).filter(|t| !t.is_empty());
        if let Some(t) = &admin_token {
            check_token(t).map_err(ConfigError::AdminToken)?;
        }
        let metrics_token = args
            .metrics_token
            .or(f.metrics_token)
            .filter(|t| !t.is_empty());
        if let Some(t) = &metrics_token {
            check_token(t).map_err(ConfigError::MetricsToken)?;
        }
        let session_hours = args
            .session_hours
            .or(f.session_hours)
            .unwrap_or(DEFAULT_SESSION_HOURS);
        if !(1..=8760).contains(&session_hours) {
            return Err(ConfigError::SessionHours);
        }
        let mut proxies = args
            .trusted_proxies
            .or(f.trusted_proxies)
            .unwrap_or_default();
        if args.trust_proxy.or(f.trust_proxy).unwrap_or(false) {
            tracing::warn!(
                "trust-proxy is deprecated: it now trusts only loopback and private addresses \
                 (--trusted-proxies loopback,private); name your proxies with --trusted-proxies"
            );
            proxies.extend(["loopback".to_owned(), "private".to_owned()]);
        }
        let trusted_proxies = TrustedProxies::parse(proxies.iter().map(String::as_str))?;
        let db = Database::from_arg(db.or(file.db).unwrap_or_else(|| PathBuf::from(DEFAULT_DB)));
        let db_pool = args.db_pool.or(f.db_pool).unwrap_or(DEFAULT_DB_POOL);
        if db_pool == 0 {
            return Err(ConfigError::DbPool);
        }
        let secret = match (args.secret.or(f.secret), args.secret_file.or(f.secret_file)) {
            (Some(value), _) if !value.is_empty() => SecretSource::Value(value),
            (_, Some(path)) => SecretSource::File(path),
            // Collectors sharing a PostgreSQL database must share the secret too: give every
            // one the same `--secret-file` or `TALLY_SECRET` (docs/operators.md, "PostgreSQL").
            _ => match &db {
                Database::Sqlite(path) => SecretSource::beside(path),
                Database::Postgres(_) => SecretSource::File(PathBuf::from("tally.secret")),
            },
        };
        let default_listen: SocketAddr = DEFAULT_LISTEN
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8080)));
        let mail = match args.smtp.or(f.smtp).filter(|u| !u.is_empty()) {
            Some(url) => Some(MailSettings::resolve(
                &url,
                args.mail_from.or(f.mail_from).as_deref(),
                args.smtp_ca.or(f.smtp_ca).as_deref(),
            )?),
            None => None,
        };
        Ok(Self {
            mail,
            report_interval: Duration::from_secs(60),
            listen: args.listen.or(f.listen).unwrap_or(default_listen),
            db,
            db_pool,
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
            admin_token,
            session_lifetime: Duration::from_secs(u64::from(session_hours) * 3600),
            metrics_token,
            redis: args.redis.or(f.redis).filter(|u| !u.is_empty()),
            redis_prefix: args
                .redis_prefix
                .or(f.redis_prefix)
                .unwrap_or_else(|| "tally:".to_owned()),
            secret,
            trusted_proxies,
            proxy_header: args.proxy_header.or(f.proxy_header).unwrap_or_default(),
            live_window_secs: args.live_window_secs.or(f.live_window_secs).unwrap_or(60),
            public_url: args
                .public_url
                .or(f.public_url)
                .map(|u| u.trim_end_matches('/').to_owned())
                .filter(|u| !u.is_empty()),
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
            analytics_cache_bytes: args
                .analytics_cache_mb
                .or(f.analytics_cache_mb)
                .map_or(crate::store::analytics::DEFAULT_BUDGET_BYTES, |mb| {
                    mb.saturating_mul(1 << 20)
                }),
            geoip: args.geoip.or(f.geoip),
            server: server_config(ServerFlags {
                header_timeout_secs: args.header_timeout_secs.or(f.header_timeout_secs),
                body_timeout_secs: args.body_timeout_secs.or(f.body_timeout_secs),
                idle_timeout_secs: args.idle_timeout_secs.or(f.idle_timeout_secs),
                answer_timeout_secs: args.answer_timeout_secs.or(f.answer_timeout_secs),
                max_connections: args.max_connections.or(f.max_connections),
                max_connections_per_address: args
                    .max_connections_per_address
                    .or(f.max_connections_per_address),
                max_requests_per_address: args
                    .max_requests_per_address
                    .or(f.max_requests_per_address),
                shutdown_grace_secs: args.shutdown_grace_secs.or(f.shutdown_grace_secs),
            })?,
        })
    }

    /// The limits of the counting routes.
    pub fn limits(&self) -> crate::state::limits::LimitConfig {
        crate::state::limits::LimitConfig {
            per_site_per_minute: self.rate_limit_per_minute,
            per_address_per_minute: self.address_limit_per_minute,
            new_sites_per_hour: self.new_sites_per_hour,
            proxy_factor: self.proxy_factor,
        }
    }

    /// What the counting pipeline is built from.
    pub fn collect_options(&self) -> crate::collect::CollectOptions {
        crate::collect::CollectOptions {
            window: self.window,
            live_window_secs: self.live_window_secs,
        }
    }

    /// What the HTTP routes are built from.
    pub fn edge_options(&self) -> crate::edge::http::EdgeOptions {
        crate::edge::http::EdgeOptions {
            trusted_proxies: self.trusted_proxies.clone(),
            proxy_header: self.proxy_header,
            stats_concurrency: self.stats_concurrency,
            batch_concurrency: self.batch_concurrency,
            ingest_capacity: self.ingest.capacity,
            live_window_secs: self.live_window_secs,
            public_url: self.public_url.clone(),
            analytics_cache_bytes: self.analytics_cache_bytes,
        }
    }

    /// The credentials.
    pub fn auth_options(&self) -> crate::edge::http::auth::AuthOptions {
        crate::edge::http::auth::AuthOptions {
            admin_token: self.admin_token.clone(),
            metrics_token: self.metrics_token.clone(),
            session_lifetime: self.session_lifetime,
        }
    }

    /// What the shared state is built from.
    pub fn state_options(&self) -> crate::state::StateOptions {
        crate::state::StateOptions {
            live_window_secs: self.live_window_secs,
            repeat_interval_secs: self.repeat_interval_secs,
            limits: self.limits(),
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

/// The server loop's options, flags already merged over the file.
struct ServerFlags {
    header_timeout_secs: Option<u64>,
    body_timeout_secs: Option<u64>,
    idle_timeout_secs: Option<u64>,
    answer_timeout_secs: Option<u64>,
    max_connections: Option<usize>,
    max_connections_per_address: Option<usize>,
    max_requests_per_address: Option<usize>,
    shutdown_grace_secs: Option<u64>,
}

/// The server loop's settings over [`ServerConfig::default`]; zero is refused (a zero timeout
/// or cap would make the server answer nothing).
fn server_config(flags: ServerFlags) -> Result<ServerConfig, ConfigError> {
    let defaults = ServerConfig::default();
    let secs = |name, given: Option<u64>, default: Duration| match given {
        Some(0) => Err(ConfigError::Zero { name }),
        Some(s) => Ok(Duration::from_secs(s)),
        None => Ok(default),
    };
    let count = |name, given: Option<usize>, default: usize| match given {
        Some(0) => Err(ConfigError::Zero { name }),
        given => Ok(given.unwrap_or(default)),
    };
    Ok(ServerConfig {
        header_timeout: secs(
            "header-timeout-secs",
            flags.header_timeout_secs,
            defaults.header_timeout,
        )?,
        body_timeout: secs(
            "body-timeout-secs",
            flags.body_timeout_secs,
            defaults.body_timeout,
        )?,
        idle_timeout: secs(
            "idle-timeout-secs",
            flags.idle_timeout_secs,
            defaults.idle_timeout,
        )?,
        answer_timeout: secs(
            "answer-timeout-secs",
            flags.answer_timeout_secs,
            defaults.answer_timeout,
        )?,
        max_connections: count(
            "max-connections",
            flags.max_connections,
            defaults.max_connections,
        )?,
        max_connections_per_address: count(
            "max-connections-per-address",
            flags.max_connections_per_address,
            defaults.max_connections_per_address,
        )?,
        max_requests_per_address: count(
            "max-requests-per-address",
            flags.max_requests_per_address,
            defaults.max_requests_per_address,
        )?,
        shutdown_grace: secs(
            "shutdown-grace-secs",
            flags.shutdown_grace_secs,
            defaults.shutdown_grace,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_file_beats_defaults() {
        let file: FileConfig = toml::from_str(
            "db = \"/data/t.sqlite\"\nauto-sites = true\nbatch-max = 64\nadmin-token = \"s3cret-s3cret-s3cret\"",
        )
        .expect("toml");
        let args = ServeArgs {
            batch_max: Some(128),
            ..ServeArgs::default()
        };
        let c = ServeConfig::resolve(args, None, file).expect("valid");
        assert_eq!(c.db, Database::Sqlite(PathBuf::from("/data/t.sqlite")));
        assert!(c.auto_sites);
        assert_eq!(c.ingest.max_batch, 128);
        assert_eq!(c.ingest.capacity, IngestConfig::default().capacity);
        assert!(!format!("{c:?}").contains("s3cret"), "secrets are redacted");
        assert_eq!(c.secret, SecretSource::File("/data/tally.secret".into()));
    }

    fn file_error(text: &str) -> String {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tally.toml");
        std::fs::write(&path, text).expect("write");
        FileConfig::load(&path).expect_err("invalid").to_string()
    }

    #[test]
    fn a_postgres_url_selects_postgres_and_hides_its_password() {
        let c = ServeConfig::for_db("postgres://tally:hunter2@db.internal:5432/tally");
        assert!(matches!(c.db, Database::Postgres(_)));
        assert_eq!(c.db_pool, DEFAULT_DB_POOL);
        let shown = format!("{} {:?}", c.db, c);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("db.internal"), "{shown}");
        assert_eq!(c.secret, SecretSource::File(PathBuf::from("tally.secret")));
        let c = ServeConfig::for_db("/data/postgres://x");
        assert_eq!(c.db.sqlite_path(), Some(Path::new("/data/postgres://x")));
        let args = ServeArgs {
            db_pool: Some(0),
            ..ServeArgs::default()
        };
        assert!(ServeConfig::resolve(args, None, FileConfig::default()).is_err());
    }

    #[test]
    fn config_file_errors_never_echo_the_file() {
        const TOKEN: &str = "Zq8-secret-token-Zq8";
        for text in [
            format!("admin-token = \"{TOKEN}"),
            format!("admin-token = {TOKEN}"),
            TOKEN.to_owned(),
            format!("admin-token = [\"{TOKEN}\"]"),
            format!("listen = \"{TOKEN}\""),
            format!("admin-token = \"{TOKEN}\"\nadmin-token = \"{TOKEN}\""),
            "admin-token = 12345678901234567890".to_owned(),
            format!("secret = \"{TOKEN}\"\nsync = \"{TOKEN}\""),
        ] {
            let e = file_error(&text);
            assert!(!e.contains("Zq8") && !e.contains("12345678"), "{e}");
            assert!(e.contains("line "), "{e}");
        }
        // Unknown keys are named (a key is not a value).
        assert!(file_error("listne = \"127.0.0.1:0\"").contains("listne"));
    }

    #[test]
    fn tokens_are_checked_without_being_echoed() {
        for token in [
            "short-token",
            "non-ascii-tökén-non-ascii",
            "has blanks in the token",
        ] {
            let args = ServeArgs {
                admin_token: Some(token.into()),
                ..ServeArgs::default()
            };
            let e = ServeConfig::resolve(args, None, FileConfig::default())
                .expect_err("refused")
                .to_string();
            assert!(e.starts_with("admin-token"), "{e}");
            assert!(!e.contains("token-") && !e.contains("blanks"), "{e}");
        }
        let args = ServeArgs {
            metrics_token: Some("tiny".into()),
            ..ServeArgs::default()
        };
        assert!(ServeConfig::resolve(args, None, FileConfig::default()).is_err());
    }

    #[test]
    fn trusted_proxies_presets_and_the_deprecated_alias() {
        let file: FileConfig =
            toml::from_str("trusted-proxies = [\"loopback\", \"203.0.113.0/24\"]").expect("toml");
        let c = ServeConfig::resolve(ServeArgs::default(), None, file).expect("valid");
        assert!(c.trusted_proxies.contains("127.0.0.1".parse().expect("ip")));
        assert!(
            c.trusted_proxies
                .contains("203.0.113.9".parse().expect("ip"))
        );
        assert!(!c.trusted_proxies.contains("10.0.0.1".parse().expect("ip")));
        let args = ServeArgs {
            trust_proxy: Some(true),
            ..ServeArgs::default()
        };
        let c = ServeConfig::resolve(args, None, FileConfig::default()).expect("valid");
        assert!(c.trusted_proxies.contains("10.0.0.1".parse().expect("ip")));
        assert!(c.trusted_proxies.contains("::1".parse().expect("ip")));
        let args = ServeArgs {
            trusted_proxies: Some(vec!["10.0.0.0/40".into()]),
            ..ServeArgs::default()
        };
        assert!(ServeConfig::resolve(args, None, FileConfig::default()).is_err());
        let none =
            ServeConfig::resolve(ServeArgs::default(), None, FileConfig::default()).expect("valid");
        assert!(none.trusted_proxies.is_empty());
    }

    #[test]
    fn smtp_comes_from_the_file_or_flags_and_never_shows_its_password() {
        let file: FileConfig = toml::from_str(
            "smtp = \"smtps://me%40example.com:hunter2@mail.example.com\"\nmail-from = \"tally@example.com\"",
        )
        .expect("toml");
        let c = ServeConfig::resolve(ServeArgs::default(), None, file).expect("valid");
        let mail = c.mail.as_ref().expect("mail");
        assert_eq!(mail.from.email.to_string(), "tally@example.com");
        assert_eq!(mail.url.port, 465);
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        let args = ServeArgs {
            smtp: Some("smtp://me:hunter2@mail.example.com?tls=none".into()),
            ..ServeArgs::default()
        };
        let e = ServeConfig::resolve(args, None, FileConfig::default())
            .expect_err("plain SMTP off loopback")
            .to_string();
        assert!(e.contains("tls=none") && !e.contains("hunter2"), "{e}");
        let args = ServeArgs {
            smtp: Some("smtp://127.0.0.1:25?tls=none".into()),
            smtp_ca: Some("/nonexistent/ca.pem".into()),
            ..ServeArgs::default()
        };
        let e = ServeConfig::resolve(args, None, FileConfig::default()).expect_err("no CA file");
        assert!(e.to_string().contains("smtp-ca"), "{e}");
        assert!(ServeConfig::for_db("t.sqlite").mail.is_none());
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

    #[test]
    fn server_limits_come_from_flags_and_file_and_refuse_zero() {
        let file: FileConfig =
            toml::from_str("idle-timeout-secs = 5\nmax-connections = 300").expect("toml");
        let args = ServeArgs {
            header_timeout_secs: Some(3),
            max_connections: Some(200),
            ..ServeArgs::default()
        };
        let c = ServeConfig::resolve(args, None, file).expect("valid");
        assert_eq!(c.server.header_timeout, Duration::from_secs(3));
        assert_eq!(c.server.idle_timeout, Duration::from_secs(5));
        assert_eq!(c.server.max_connections, 200);
        assert_eq!(c.server.body_timeout, ServerConfig::default().body_timeout);
        let zero = ServeArgs {
            shutdown_grace_secs: Some(0),
            ..ServeArgs::default()
        };
        assert!(ServeConfig::resolve(zero, None, FileConfig::default()).is_err());
    }
}
