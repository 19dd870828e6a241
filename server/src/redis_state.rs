//! The shared-state traits of [`crate::shared`] on Redis (`tally serve --redis redis://…`), so
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

use async_trait::async_trait;
use jiff::Timestamp;
use redis::aio::MultiplexedConnection;

use crate::core::classify::{Lane, LiveEntry};
use crate::core::day::SiteZone;
use crate::core::gcra::Quota;
use crate::core::ids::{PagePath, SiteId};
use crate::core::live::LiveNumbers;
use crate::core::net::ClientNet;
use crate::limits::{GUESS_PENALTY_CAP, GUESSES_PER_MINUTE, LimitConfig, Limits, Refusal, scaled};
use crate::shared::{
    LiveState, MemoryLive, MemoryRepeatGate, MemorySiteCache, RateLimiter, RepeatGate, SiteCache,
};
use crate::store::Site;

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
fn name_of(parts: &[&str]) -> String {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex()[..32].to_owned()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ------------------------------------------------------------------------------------------
// Live window

/// Live records sent to Redis in one pipeline at most (the rest wait for the next one).
pub const LIVE_FLUSH_MAX: usize = 512;

/// Live pipelines of one collector in flight at once (more records wait and join the next).
const LIVE_IN_FLIGHT: usize = 4;

/// Live records waiting for a flush at most; a record finding the queue full waits for room
/// (within its deadline), so the queue's memory is bounded.
const LIVE_QUEUE: usize = 4096;

/// The live window on Redis.
///
/// Records are written by a flusher task per handle, like the ingest queue's group commit:
/// [`LiveState::record`] queues its entry and waits until a pipeline holding it has been
/// answered, and the flusher takes everything queued meanwhile (up to [`LIVE_FLUSH_MAX`]) into
/// one pipeline with, per visitor set, one `ZADD` of all its (second, visitor) pairs, one trim
/// and one TTL, and per event bucket one `INCRBY` and one TTL; up to [`LIVE_IN_FLIGHT`]
/// pipelines are in flight at once. So N concurrent views cost a few round trips and a few
/// commands per key touched instead of N round trips of ten commands. A record waits at most
/// 2 × [`OP_TIMEOUT`] (for room in the queue, then for its pipeline, which has its own
/// [`OP_TIMEOUT`]); a record that cannot reach Redis in that time counts as a fallback
/// ([`RedisHealth`]) and is only in this process's window.
pub struct RedisLive {
    link: Arc<RedisLink>,
    window_secs: i64,
    fallback: MemoryLive,
    /// The flusher's queue: started by the first record (a runtime exists then), started
    /// again if its task has ended (its runtime shut down).
    queue: std::sync::Mutex<Option<tokio::sync::mpsc::Sender<LiveJob>>>,
    flushes: Arc<FlushCount>,
}

/// One record waiting for the flusher.
struct LiveJob {
    entry: LiveEntry,
    now_ms: i64,
    done: tokio::sync::oneshot::Sender<()>,
}

/// Pipelines built so far (for tests); a pipeline built while Redis rests after a failure is
/// not sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushes {
    pub pipelines: u64,
    /// Records they carried.
    pub records: u64,
    /// Records in the largest one.
    pub largest: u64,
}

#[derive(Debug, Default)]
struct FlushCount {
    pipelines: AtomicU64,
    records: AtomicU64,
    largest: AtomicU64,
}

impl FlushCount {
    fn add(&self, records: usize) {
        let records = records as u64;
        self.pipelines.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.largest.fetch_max(records, Ordering::Relaxed);
    }

    fn get(&self) -> Flushes {
        Flushes {
            pipelines: self.pipelines.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }
}

impl RedisLive {
    /// A window of `window_secs` seconds on `link`, with `fallback` for when Redis is gone.
    pub fn new(link: Arc<RedisLink>, window_secs: u32, fallback: MemoryLive) -> Self {
        Self {
            link,
            window_secs: i64::from(window_secs.max(1)),
            fallback,
            queue: std::sync::Mutex::new(None),
            flushes: Arc::default(),
        }
    }

    /// Pipelines built so far and the records they carried.
    pub fn flushes(&self) -> Flushes {
        self.flushes.get()
    }

    /// The flusher's queue, starting the flusher when there is none (or it has ended).
    fn queue(&self) -> tokio::sync::mpsc::Sender<LiveJob> {
        let mut slot = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = tokio::sync::mpsc::channel(LIVE_QUEUE);
        tokio::spawn(flush_live(
            rx,
            Arc::clone(&self.link),
            self.window_secs,
            Arc::clone(&self.flushes),
        ));
        *slot = Some(tx.clone());
        tx
    }
}

/// The visitor-set key and the event-bucket key prefix of a site or page.
fn live_keys(link: &RedisLink, site: &SiteId, page: Option<&PagePath>) -> (String, String) {
    let name = match page {
        Some(p) => name_of(&[site.as_str(), p.as_str()]),
        None => name_of(&[site.as_str()]),
    };
    (
        link.key(format_args!("live:v:{name}")),
        link.key(format_args!("live:e:{name}:")),
    )
}

/// The flusher of one [`RedisLive`]: runs until the handle (the queue's sender) is dropped.
async fn flush_live(
    mut rx: tokio::sync::mpsc::Receiver<LiveJob>,
    link: Arc<RedisLink>,
    window_secs: i64,
    count: Arc<FlushCount>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(LIVE_IN_FLIGHT));
    loop {
        // Wait for a free slot first: records arriving meanwhile join the next pipeline.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut jobs = Vec::with_capacity(LIVE_FLUSH_MAX);
        if rx.recv_many(&mut jobs, LIVE_FLUSH_MAX).await == 0 {
            return;
        }
        let pipe = live_pipeline(&link, window_secs, &jobs);
        count.add(jobs.len());
        let link = Arc::clone(&link);
        tokio::spawn(async move {
            link.run(|mut c| async move { pipe.query_async::<()>(&mut c).await })
                .await;
            drop(slot);
            // Answered (or fallen back: every record is in the in-process window too).
            for job in jobs {
                let _ = job.done.send(());
            }
        });
    }
}

/// One pipeline for `jobs`: per visitor set one `ZADD GT` of every (second, visitor), one trim
/// and one TTL; per event bucket (key and second) one `INCRBY` and one TTL. Keys in sorted
/// order, so a pipeline's content does not depend on hash order.
fn live_pipeline(link: &RedisLink, window_secs: i64, jobs: &[LiveJob]) -> redis::Pipeline {
    use std::collections::BTreeMap;
    let ttl_ms = (window_secs + 1) * 1000;
    // visitor-set key → (latest second, (second, visitor) pairs)
    let mut sets: BTreeMap<String, (i64, Vec<(i64, u64)>)> = BTreeMap::new();
    let mut buckets: BTreeMap<String, u64> = BTreeMap::new();
    for job in jobs {
        let sec = job.now_ms.div_euclid(1000);
        let entry = &job.entry;
        // The site, and the page when there is one.
        let scopes = std::iter::once(None).chain(entry.page.as_ref().map(Some));
        for (visitors, events) in scopes.map(|page| live_keys(link, &entry.site, page)) {
            let set = sets.entry(visitors).or_insert((sec, Vec::new()));
            set.0 = set.0.max(sec);
            set.1.push((sec, entry.visitor));
            *buckets.entry(format!("{events}{sec}")).or_default() += 1;
        }
    }
    let mut pipe = redis::pipe();
    for (visitors, (latest, members)) in &sets {
        pipe.cmd("ZADD").arg(visitors).arg("GT");
        for (sec, visitor) in members {
            pipe.arg(sec).arg(visitor);
        }
        pipe.ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(visitors)
            .arg("-inf")
            .arg(latest - window_secs)
            .ignore()
            .cmd("PEXPIRE")
            .arg(visitors)
            .arg(ttl_ms)
            .ignore();
    }
    for (bucket, n) in &buckets {
        pipe.cmd("INCRBY")
            .arg(bucket)
            .arg(n)
            .ignore()
            .cmd("PEXPIRE")
            .arg(bucket)
            .arg(ttl_ms)
            .ignore();
    }
    pipe
}

#[async_trait]
impl LiveState for RedisLive {
    async fn record(&self, entry: &LiveEntry, now_ms: i64) {
        self.fallback.record(entry, now_ms).await;
        let (done, flushed) = tokio::sync::oneshot::channel();
        let job = LiveJob {
            entry: entry.clone(),
            now_ms,
            done,
        };
        let queue = self.queue();
        let queued = async {
            queue.send(job).await.map_err(|_| "live flusher gone")?;
            flushed.await.map_err(|_| "live flusher gone")
        };
        // The pipeline answers within its own OP_TIMEOUT; this also bounds the wait for room.
        match tokio::time::timeout(2 * OP_TIMEOUT, queued).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.link.health.failed(e),
            Err(_) => self
                .link
                .health
                .failed("live records queued beyond their deadline"),
        }
    }

    async fn read(&self, site: &SiteId, page: Option<&PagePath>, now_ms: i64) -> LiveNumbers {
        let sec = now_ms.div_euclid(1000);
        let (visitors, events) = live_keys(&self.link, site, page);
        // An event of second `s` is in the window while `sec - s < window`.
        let buckets: Vec<String> = ((sec - self.window_secs + 1)..=sec)
            .map(|s| format!("{events}{s}"))
            .collect();
        let from = format!("({}", sec - self.window_secs);
        let answer = self
            .link
            .run(|mut c| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("ZCOUNT").arg(&visitors).arg(&from).arg("+inf");
                pipe.cmd("MGET").arg(&buckets);
                pipe.query_async::<(u64, Vec<Option<u64>>)>(&mut c).await
            })
            .await;
        match answer {
            Some((visitors, counts)) => LiveNumbers {
                events: counts.into_iter().flatten().sum(),
                visitors,
                saturated: false,
            },
            None => self.fallback.read(site, page, now_ms).await,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Rate limits

/// GCRA over several buckets, all or nothing. KEYS: the buckets. ARGV: now (µs), charge (1/0),
/// then per bucket: interval (µs), burst, cells. Returns {0, 0} admitted, {1, µs} wait,
/// {2, burst} never (more cells than the burst). The arithmetic is `core::gcra::Quota::check`.
const GCRA_LUA: &str = r"
local now = tonumber(ARGV[1])
local charge = ARGV[2] == '1'
local tats = {}
for i, key in ipairs(KEYS) do
  local base = 2 + (i - 1) * 3
  local interval = tonumber(ARGV[base + 1])
  local burst = tonumber(ARGV[base + 2])
  local n = tonumber(ARGV[base + 3])
  if n > burst then return {2, burst} end
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local new_tat = tat + n * interval
  local over = new_tat - now - burst * interval
  if over > 0 then return {1, over} end
  tats[i] = new_tat
end
if charge then
  for i, key in ipairs(KEYS) do
    local ttl = math.ceil((tats[i] - now) / 1000) + 1000
    redis.call('SET', key, string.format('%.0f', tats[i]), 'PX', ttl)
  end
end
return {0, 0}
";

/// Charge ARGV[2] µs to the TAT in KEYS[1] (µs) from max(TAT, now = ARGV[1]), even over the
/// allowance, but never past now + ARGV[3] µs (a wrong token guess: `limits::wrong_guess`).
const PENALTY_LUA: &str = r"
local now = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
tat = math.min(tat + tonumber(ARGV[2]), now + tonumber(ARGV[3]))
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
return 0
";

/// One bucket of a request: its key, quota and cells.
struct Charge {
    key: String,
    quota: Quota,
    cells: u32,
}

/// The per-address limits on Redis (the rules of [`crate::limits`]).
pub struct RedisLimiter {
    link: Arc<RedisLink>,
    direct: (Option<Quota>, Option<Quota>),
    proxy: (Option<Quota>, Option<Quota>),
    new_sites: Option<Quota>,
    guesses: Option<Quota>,
    script: redis::Script,
    penalty: redis::Script,
    fallback: Limits,
}

impl RedisLimiter {
    /// The limits of `config` on `link`, with in-process [`Limits`] for when Redis is gone.
    pub fn new(link: Arc<RedisLink>, config: LimitConfig) -> Self {
        Self {
            link,
            direct: (
                scaled(config.per_site_per_minute, 1),
                scaled(config.per_address_per_minute, 1),
            ),
            proxy: (
                scaled(config.per_site_per_minute, config.proxy_factor),
                scaled(config.per_address_per_minute, config.proxy_factor),
            ),
            new_sites: Quota::per_hour(config.new_sites_per_hour, config.new_sites_per_hour),
            guesses: Quota::per_minute(GUESSES_PER_MINUTE),
            script: redis::Script::new(GCRA_LUA),
            penalty: redis::Script::new(PENALTY_LUA),
            fallback: Limits::new(config),
        }
    }

    /// The hash tag of a network's keys (one Redis Cluster slot per network).
    fn net_tag(&self, net: ClientNet) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.link.hash_key);
        h.update(b"tally limits");
        h.update(&net.to_bytes());
        h.finalize().to_hex()[..24].to_owned()
    }

    fn lane_name(lane: Lane) -> &'static str {
        match lane {
            Lane::Direct => "d",
            Lane::Proxy => "p",
        }
    }

    fn quotas(&self, lane: Lane) -> (Option<Quota>, Option<Quota>) {
        match lane {
            Lane::Direct => self.direct,
            Lane::Proxy => self.proxy,
        }
    }

    /// The charge of one token guess by `net` (none when guesses are unlimited).
    fn guess_charge(&self, net: ClientNet) -> Option<Charge> {
        self.guesses.map(|quota| Charge {
            key: self
                .link
                .key(format_args!("lim:{{{}}}:guess", self.net_tag(net))),
            quota,
            cells: 1,
        })
    }

    /// Run the script; `None` when Redis did not answer.
    async fn gcra(
        &self,
        charges: Vec<Charge>,
        now: Timestamp,
        charge: bool,
    ) -> Option<Result<(), Refusal>> {
        if charges.is_empty() {
            return Some(Ok(()));
        }
        let mut invocation = self.script.prepare_invoke();
        invocation
            .arg(now.as_microsecond())
            .arg(if charge { "1" } else { "0" });
        for c in &charges {
            invocation
                .key(&c.key)
                .arg(c.quota.interval_us())
                .arg(c.quota.burst())
                .arg(c.cells);
        }
        let (code, value): (i64, i64) = self
            .link
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await?;
        Some(match code {
            0 => Ok(()),
            1 => Err(Refusal::Wait(Duration::from_micros(
                u64::try_from(value).unwrap_or(0),
            ))),
            _ => Err(Refusal::Never {
                allowance: u32::try_from(value).unwrap_or(0),
            }),
        })
    }
}

#[async_trait]
impl RateLimiter for RedisLimiter {
    async fn admit_many(
        &self,
        lane: Lane,
        net: ClientNet,
        per_site: &[(&SiteId, u32)],
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let tag = self.net_tag(net);
        let (site_quota, address_quota) = self.quotas(lane);
        let lane_name = Self::lane_name(lane);
        let mut charges = Vec::with_capacity(per_site.len() + 1);
        if let Some(quota) = site_quota {
            for (site, cells) in per_site {
                let site = name_of(&[site.as_str()]);
                charges.push(Charge {
                    key: self
                        .link
                        .key(format_args!("lim:{{{tag}}}:{lane_name}:s:{site}")),
                    quota,
                    cells: *cells,
                });
            }
        }
        if let Some(quota) = address_quota {
            let total = per_site
                .iter()
                .fold(0u32, |sum, (_, n)| sum.saturating_add(*n));
            charges.push(Charge {
                key: self.link.key(format_args!("lim:{{{tag}}}:{lane_name}:a")),
                quota,
                cells: total,
            });
        }
        match self.gcra(charges, now, true).await {
            Some(verdict) => verdict,
            None => self.fallback.admit_many(lane, net, per_site, now),
        }
    }

    async fn has_room(&self, lane: Lane, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(quota) = self.quotas(lane).1 else {
            return Ok(());
        };
        let tag = self.net_tag(net);
        let lane_name = Self::lane_name(lane);
        let charges = vec![Charge {
            key: self.link.key(format_args!("lim:{{{tag}}}:{lane_name}:a")),
            quota,
            cells: 1,
        }];
        match self.gcra(charges, now, false).await {
            Some(verdict) => verdict,
            None => self.fallback.has_room(lane, net, now),
        }
    }

    async fn admit_new_site(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(quota) = self.new_sites else {
            return Ok(());
        };
        let tag = self.net_tag(net);
        let charges = vec![Charge {
            key: self.link.key(format_args!("lim:{{{tag}}}:new-sites")),
            quota,
            cells: 1,
        }];
        match self.gcra(charges, now, true).await {
            Some(verdict) => verdict,
            None => self.fallback.admit_new_site(net, now),
        }
    }

    async fn may_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let charges = self.guess_charge(net).into_iter().collect();
        match self.gcra(charges, now, false).await {
            Some(verdict) => verdict,
            None => self.fallback.may_guess(net, now),
        }
    }

    async fn wrong_guess(&self, net: ClientNet, now: Timestamp) {
        let Some(charge) = self.guess_charge(net) else {
            return;
        };
        let mut invocation = self.penalty.prepare_invoke();
        invocation
            .key(&charge.key)
            .arg(now.as_microsecond())
            .arg(charge.quota.interval_us())
            .arg(i64::try_from(GUESS_PENALTY_CAP.as_micros()).unwrap_or(i64::MAX));
        let done: Option<i64> = self
            .link
            .run(|mut conn| async move { invocation.invoke_async(&mut conn).await })
            .await;
        if done.is_none() {
            self.fallback.wrong_guess(net, now);
        }
    }
}

// ------------------------------------------------------------------------------------------
// Repeat gate

/// Admit when the key's last admission is at least ARGV[2] ms before ARGV[1] (now, ms);
/// remember the admission for ARGV[3] ms. Returns 1 admitted, 0 a repeat.
const GATE_LUA: &str = r"
local now = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[1]) or '')
if last and now - last < tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
";

/// The badge/pixel repeat gate on Redis.
pub struct RedisRepeatGate {
    link: Arc<RedisLink>,
    direct_ms: i64,
    proxy_ms: i64,
    script: redis::Script,
    fallback: MemoryRepeatGate,
}

impl RedisRepeatGate {
    /// Direct repeats within `direct_ms` and proxy repeats within `proxy_ms` count once.
    pub fn new(
        link: Arc<RedisLink>,
        direct_ms: i64,
        proxy_ms: i64,
        fallback: MemoryRepeatGate,
    ) -> Self {
        Self {
            link,
            direct_ms,
            proxy_ms,
            script: redis::Script::new(GATE_LUA),
            fallback,
        }
    }
}

#[async_trait]
impl RepeatGate for RedisRepeatGate {
    async fn admit(&self, lane: Lane, key: u64, now_ms: i64) -> bool {
        let (interval, name) = match lane {
            Lane::Direct => (self.direct_ms, "d"),
            Lane::Proxy => (self.proxy_ms, "p"),
        };
        if interval <= 0 {
            return true;
        }
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.link.key(format_args!("gate:{name}:{key:016x}")))
            .arg(now_ms)
            .arg(interval)
            // Kept a second longer than the interval: clocks of collectors differ a little.
            .arg(interval + 1000);
        let admitted = self
            .link
            .run(|mut c| async move { invocation.invoke_async::<i64>(&mut c).await })
            .await;
        match admitted {
            Some(n) => n == 1,
            None => self.fallback.admit(lane, key, now_ms).await,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Site cache

/// The site cache on Redis: a site added or changed through one collector is served by every
/// collector at once (the in-process cache is per collector, up to its TTL behind).
pub struct RedisSiteCache {
    link: Arc<RedisLink>,
    ttl: Duration,
    fallback: MemorySiteCache,
}

impl RedisSiteCache {
    /// Entries live `ttl` in Redis (and in the fallback).
    pub fn new(link: Arc<RedisLink>, ttl: Duration, fallback: MemorySiteCache) -> Self {
        Self {
            link,
            ttl,
            fallback,
        }
    }

    fn key(&self, id: &SiteId) -> String {
        self.link
            .key(format_args!("site:{}", name_of(&[id.as_str()])))
    }
}

fn encode_site(site: Option<&Site>) -> String {
    match site {
        None => serde_json::json!({ "absent": true }).to_string(),
        Some(s) => serde_json::json!({
            "id": s.id.as_str(),
            "origins": s.origins,
            "zone": s.zone.name(),
            "public": s.public,
            "ingest_key": s.ingest_key,
        })
        .to_string(),
    }
}

/// A cached entry: `Some(None)` absent, `Some(Some(site))`, `None` unreadable.
fn decode_site(text: &str) -> Option<Option<Site>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    if v.get("absent").is_some() {
        return Some(None);
    }
    Some(Some(Site {
        id: SiteId::parse(v.get("id")?.as_str()?).ok()?,
        origins: v
            .get("origins")?
            .as_array()?
            .iter()
            .filter_map(|o| o.as_str().map(str::to_owned))
            .collect(),
        zone: SiteZone::parse(v.get("zone")?.as_str()?).ok()?,
        public: v.get("public")?.as_bool()?,
        ingest_key: v
            .get("ingest_key")
            .and_then(|k| k.as_str())
            .map(str::to_owned),
    }))
}

#[async_trait]
impl SiteCache for RedisSiteCache {
    async fn get(&self, id: &SiteId) -> Option<Option<Arc<Site>>> {
        if self.ttl.is_zero() {
            return None;
        }
        let key = self.key(id);
        let answer = self
            .link
            .run(|mut c| async move {
                redis::cmd("GET")
                    .arg(&key)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        match answer {
            Some(Some(text)) => decode_site(&text).map(|s| s.map(Arc::new)),
            Some(None) => None,
            None => self.fallback.get(id).await,
        }
    }

    async fn put(&self, id: &SiteId, site: Option<Arc<Site>>) {
        self.fallback.put(id, site.clone()).await;
        if self.ttl.is_zero() {
            return;
        }
        let (key, value, ttl) = (self.key(id), encode_site(site.as_deref()), ms(self.ttl));
        self.link
            .run(|mut c| async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("PX")
                    .arg(ttl)
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_round_trip_through_their_encoding() {
        let site = Site {
            id: SiteId::parse("blog").expect("id"),
            origins: vec!["https://a.example".into(), "*".into()],
            zone: SiteZone::parse("Asia/Tokyo").expect("zone"),
            public: true,
            ingest_key: Some("k".repeat(32)),
        };
        let back = decode_site(&encode_site(Some(&site)))
            .expect("readable")
            .expect("a site");
        assert_eq!(back.id, site.id);
        assert_eq!(back.origins, site.origins);
        assert_eq!(back.zone.name(), "Asia/Tokyo");
        assert!(back.public);
        assert_eq!(back.ingest_key, site.ingest_key);
        assert!(matches!(decode_site(&encode_site(None)), Some(None)));
        assert!(decode_site("not json").is_none());
    }
}
