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
use crate::serve::ServerConfig;
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
    /// Days raw events are kept (0 = forever); must exceed the accepted window.
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
    /// Script hits (records) one source may send per minute before 429 (0 = no limit).
    #[arg(long, env = "TALLY_RATE_LIMIT_PER_MINUTE")]
    pub rate_limit_per_minute: Option<u32>,
    /// Seconds within which repeated badge/pixel fetches from one source count once (0 = off).
    #[arg(long, env = "TALLY_REPEAT_INTERVAL_SECS")]
    pub repeat_interval_secs: Option<u32>,
    /// Seconds a client has to send a request's headers, from their first byte.
    #[arg(long, env = "TALLY_HEADER_TIMEOUT_SECS")]
    pub header_timeout_secs: Option<u64>,
    /// Seconds a request's body may take to arrive, from the end of its headers (then 408).
    #[arg(long, env = "TALLY_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<u64>,
    /// Seconds a connection may stay idle between requests before it is closed.
    #[arg(long, env = "TALLY_IDLE_TIMEOUT_SECS")]
    pub idle_timeout_secs: Option<u64>,
    /// Connections served at once; past it, new ones are answered 503 and closed.
    #[arg(long, env = "TALLY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Seconds shutdown waits for requests in flight before closing every connection.
    #[arg(long, env = "TALLY_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
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
    /// Timeouts, connection cap and shutdown grace of the HTTP server loop.
    pub server: ServerConfig,
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
            .field("server", &self.server)
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
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
}

/// Default database file.
pub const DEFAULT_DB: &str = "tally.sqlite";
/// Script hits one source may send per minute by default: far above what a reader makes
/// (a page view per click), far below a flood.
pub const DEFAULT_RATE_LIMIT_PER_MINUTE: u32 = 120;
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
        let retention_days = args.retention_days.or(f.retention_days).unwrap_or(0);
        if retention_days != 0 && u64::from(retention_days) * 24 <= u64::from(window_back_hours) {
            return Err(ConfigError::Retention {
                days: retention_days,
                hours: window_back_hours,
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
            server: server_config(ServerFlags {
                header_timeout_secs: args.header_timeout_secs.or(f.header_timeout_secs),
                body_timeout_secs: args.body_timeout_secs.or(f.body_timeout_secs),
                idle_timeout_secs: args.idle_timeout_secs.or(f.idle_timeout_secs),
                max_connections: args.max_connections.or(f.max_connections),
                shutdown_grace_secs: args.shutdown_grace_secs.or(f.shutdown_grace_secs),
            })?,
        })
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
    max_connections: Option<usize>,
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
    let max_connections = match flags.max_connections {
        Some(0) => {
            return Err(ConfigError::Zero {
                name: "max-connections",
            });
        }
        given => given.unwrap_or(defaults.max_connections),
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
        max_connections,
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
