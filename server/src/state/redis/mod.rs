//! The shared-state traits of [`crate::state`] on Redis (`tally serve --redis redis://…`), so
//! several collectors behind one load balancer share the live window, the per-address limits,
//! the badge/pixel repeat gate and the site cache.
//!
//! Contract, beyond the traits':
//! - **Exact and atomic.** Live visitors are a sorted set per key (member = visitor, score = the
//!   second it was last seen, `ZADD GT`), trimmed on every record, counted with `ZCOUNT` over
//!   the window: exact distinct visitors across collectors. Live events are per-second counters.
//!   Records are written in shared pipelines ([`RedisLive`]): a record is in Redis when its
//!   call returns (or counted as a fallback after 2 × [`OP_TIMEOUT`]), and concurrent records
//!   of one collector share round trips.
//!   The limits are GCRA in one Lua script that checks every quota of a request and charges all
//!   or none (the same arithmetic as `core::gcra`); the repeat gate is a Lua compare-and-set on
//!   the time of the last admission. Time comes from the caller, like the in-process versions.
//! - **Bounded.** Every key has a TTL (live: the window + 1 s; limits: until the bucket is full
//!   again; repeat gate: its interval; sites: the cache's TTL) and every name starts with the
//!   configured prefix (`--redis-prefix`, default `tally:`). A key holds no address: limits are
//!   keyed by a keyed hash (blake3, key derived from the server secret, so every collector with
//!   the same secret derives the same keys) of the client network; a network's keys share a
//!   Redis Cluster hash tag, so the script's keys live on one node.
//! - **Never refuse because Redis is gone.** Every operation has a deadline
//!   ([`OP_TIMEOUT`]); on an error or a timeout the call is answered by the in-process
//!   implementation this handle keeps beside Redis (which also sees every live record, so its
//!   numbers are this collector's own), Redis is left alone for [`RETRY_AFTER`], and
//!   [`RedisHealth`] counts the fallback for `/metrics`, `/readyz` and the log (one line per
//!   change of state, not per request).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::state::{PROXY_REPEAT_MS, SITE_TTL, SharedState, StateOptions};

mod gate;
mod limiter;
mod live;
mod sites;

pub use gate::RedisRepeatGate;
pub use limiter::RedisLimiter;
pub use live::{Flushes, LIVE_FLUSH_MAX, RedisLive};
pub use sites::RedisSiteCache;

/// State shared through Redis by every collector on `link`; each part keeps this process's own
/// state beside it for when Redis does not answer.
pub fn shared(options: StateOptions, link: Arc<RedisLink>) -> SharedState {
    let (live, repeats, sites) = crate::state::memory::parts(options);
    SharedState {
        live: Arc::new(RedisLive::new(
            Arc::clone(&link),
            options.live_window_secs,
            live,
        )),
        limits: Arc::new(RedisLimiter::new(Arc::clone(&link), options.limits)),
        repeats: Arc::new(RedisRepeatGate::new(
            Arc::clone(&link),
            options.repeat_interval_ms(),
            PROXY_REPEAT_MS,
            repeats,
        )),
        sites: Arc::new(RedisSiteCache::new(Arc::clone(&link), SITE_TTL, sites)),
        redis: Some(link),
    }
}

/// How long one Redis operation may take before the in-process state answers instead.
pub const OP_TIMEOUT: Duration = Duration::from_millis(250);

/// After a failure, how long Redis is not asked (every call uses the fallback meanwhile).
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Whether Redis answers, and how often it did not.
#[derive(Debug)]
pub struct RedisHealth {
    started: Instant,
    /// Milliseconds after `started` before which Redis is not asked again.
    quiet_until_ms: AtomicU64,
    up: AtomicBool,
    fallbacks: AtomicU64,
}

impl Default for RedisHealth {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            quiet_until_ms: AtomicU64::new(0),
            up: AtomicBool::new(true),
            fallbacks: AtomicU64::new(0),
        }
    }
}

impl RedisHealth {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether Redis may be asked now.
    fn may_ask(&self) -> bool {
        self.elapsed_ms() >= self.quiet_until_ms.load(Ordering::Relaxed)
    }

    fn failed(&self, what: &str) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        let quiet = u64::try_from(RETRY_AFTER.as_millis()).unwrap_or(u64::MAX);
        self.quiet_until_ms
            .store(self.elapsed_ms().saturating_add(quiet), Ordering::Relaxed);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error = what,
                "redis unavailable: live numbers, limits, repeat gate and site cache fall back to this process"
            );
        }
    }

    fn answered(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("redis answers again: shared state restored");
        }
    }

    /// Whether the last operation reached Redis.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Calls answered by the in-process fallback since start (one failed call counts once;
    /// calls skipped during [`RETRY_AFTER`] are not counted).
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }
}

/// One Redis server for every shared state of a collector: a multiplexed connection, opened
/// lazily and reopened after a failure.
pub struct RedisLink {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    prefix: String,
    /// Keys the limiter's hashes (from the server secret: the same on every collector).
    hash_key: [u8; 32],
    pub health: Arc<RedisHealth>,
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLink {
    /// A link to `url` (`redis://host:port/db`); nothing is connected yet. Keys start with
    /// `prefix`; limiter keys are hashed with `hash_key`.
    pub fn new(
        url: &str,
        prefix: &str,
        hash_key: [u8; 32],
    ) -> Result<Arc<Self>, redis::RedisError> {
        Ok(Arc::new(Self {
            client: redis::Client::open(url)?,
            conn: tokio::sync::Mutex::new(None),
            prefix: prefix.to_owned(),
            hash_key,
            health: Arc::new(RedisHealth::default()),
        }))
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn connection(&self) -> Result<MultiplexedConnection, String> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let conn = self
            .client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Run `op` on Redis within [`OP_TIMEOUT`]; `None` (and the fallback counted) when Redis is
    /// resting after a failure, fails, or is too slow.
    async fn run<T, F, Fut>(&self, op: F) -> Option<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        if !self.health.may_ask() {
            return None;
        }
        let attempt = async {
            let conn = self.connection().await?;
            op(conn).await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(OP_TIMEOUT, attempt).await {
            Ok(Ok(value)) => {
                self.health.answered();
                Some(value)
            }
            Ok(Err(e)) => {
                *self.conn.lock().await = None;
                self.health.failed(&e);
                None
            }
            Err(_) => {
                *self.conn.lock().await = None;
                self.health.failed("timed out");
                None
            }
        }
    }

    /// Whether Redis answers `PING` now (for `/readyz` detail).
    pub async fn ping(&self) -> bool {
        self.run(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await })
            .await
            .is_some()
    }

    /// Delete every key under the prefix (tests clean up with it). Uses `SCAN`, never `KEYS`.
    pub async fn delete_all(&self) -> redis::RedisResult<u64> {
        let mut conn = self
            .connection()
            .await
            .map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "connect", e)))?;
        let pattern = format!("{}*", self.prefix);
        let mut cursor: u64 = 0;
        let mut deleted = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                deleted += redis::cmd("DEL")
                    .arg(&keys)
                    .query_async::<u64>(&mut conn)
                    .await?;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }

    fn key(&self, parts: std::fmt::Arguments<'_>) -> String {
        format!("{}{parts}", self.prefix)
    }
}

/// A short hex name for arbitrary text (site ids and page paths in key names).
pub(super) fn name_of(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex()[..32].to_owned()
}

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
