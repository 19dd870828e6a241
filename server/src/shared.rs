//! State that several collectors behind one load balancer would have to share: the live
//! window, the per-address rate limits, the badge/pixel repeat gate and the site cache. Each
//! is a small trait, so a shared backend (Redis) can replace the in-process implementations
//! here without touching the handlers.
//!
//! Contract (every implementation; proven by the shared-state conformance suite in `tests/`):
//! - **Handles share.** Every handle on one shared state sees what every other handle wrote:
//!   the live window is the union of the events recorded through any handle, a quota charged
//!   through one handle is charged for all, a repeat admitted through one is a repeat for all.
//! - **Never refuse because of the backend.** The methods are infallible: an implementation
//!   whose backend can fail (a network store) falls back to in-process state and reports the
//!   fallback itself (metrics, readiness detail, log). Counting never stops because shared
//!   state is unreachable.
//! - **Time comes in.** Every decision takes `now` from the caller (the app's clock), except
//!   the site cache's time-to-live, which is monotonic process time.
//! - **Bounded.** Every implementation bounds its memory (or its keys' lifetimes: TTLs).
//!
//! In-process implementations: [`MemoryLive`], [`crate::limits::Limits`], [`MemoryRepeatGate`],
//! [`MemorySiteCache`]; [`SharedState::in_process`] bundles them for one collector (a shared
//! backend will offer its own constructor beside it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jiff::Timestamp;

use crate::config::ServeConfig;
use crate::core::classify::{Lane, LiveEntry};
use crate::core::ids::{PagePath, SiteId};
use crate::core::live::{LiveNumbers, LiveWindow};
use crate::core::net::ClientNet;
use crate::core::suppress::Suppressor;
use crate::limits::{Limits, Refusal};
use crate::sites::{MAX_CACHED, SITE_TTL};
use crate::store::Site;

/// Live-window key: a whole site (`None`) or one of its pages.
pub type LiveKey = (SiteId, Option<PagePath>);

/// Most live-window keys (sites and pages) tracked at once in process; new page keys beyond it
/// are not tracked (site keys always are). Each key holds at most [`LIVE_MAX_VISITORS`].
pub const LIVE_MAX_KEYS: usize = 20_000;

/// Most distinct visitors tracked per live key, and in total over all keys, in process.
pub const LIVE_MAX_VISITORS: usize = 100_000;
pub const LIVE_MAX_VISITORS_TOTAL: usize = 400_000;

/// Sources remembered per lane for badge/pixel repeat suppression, in process.
pub const REPEAT_KEYS: usize = 200_000;

/// Within this many milliseconds a known image proxy's fetches of one page count once.
pub const PROXY_REPEAT_MS: i64 = 1000;

/// The shared-state seams of one collector, handed to the app state.
#[derive(Clone)]
pub struct SharedState {
    pub live: Arc<dyn LiveState>,
    pub limits: Arc<dyn RateLimiter>,
    pub repeats: Arc<dyn RepeatGate>,
    pub sites: Arc<dyn SiteCache>,
    /// The Redis behind them, when shared (`--redis`): its health goes to `/metrics` and
    /// `/readyz`.
    pub redis: Option<Arc<crate::redis_state::RedisLink>>,
}

impl SharedState {
    /// This process's own state, as configured (one collector).
    pub fn in_process(config: &ServeConfig) -> Self {
        let (live, repeats, sites) = Self::in_process_parts(config);
        Self {
            live: Arc::new(live),
            limits: Arc::new(Limits::new(config.limits())),
            repeats: Arc::new(repeats),
            sites: Arc::new(sites),
            redis: None,
        }
    }

    /// State shared through Redis by every collector on `link`; each part keeps this
    /// process's own state beside it for when Redis does not answer.
    pub fn on_redis(config: &ServeConfig, link: Arc<crate::redis_state::RedisLink>) -> Self {
        use crate::redis_state::{RedisLimiter, RedisLive, RedisRepeatGate, RedisSiteCache};
        let own = Self::in_process_parts(config);
        Self {
            live: Arc::new(RedisLive::new(
                Arc::clone(&link),
                config.live_window_secs,
                own.0,
            )),
            limits: Arc::new(RedisLimiter::new(Arc::clone(&link), config.limits())),
            repeats: Arc::new(RedisRepeatGate::new(
                Arc::clone(&link),
                i64::from(config.repeat_interval_secs) * 1000,
                PROXY_REPEAT_MS,
                own.1,
            )),
            sites: Arc::new(RedisSiteCache::new(Arc::clone(&link), SITE_TTL, own.2)),
            redis: Some(link),
        }
    }

    fn in_process_parts(config: &ServeConfig) -> (MemoryLive, MemoryRepeatGate, MemorySiteCache) {
        (
            MemoryLive::new(
                config.live_window_secs,
                LIVE_MAX_VISITORS,
                LIVE_MAX_KEYS,
                LIVE_MAX_VISITORS_TOTAL,
            ),
            MemoryRepeatGate::new(
                i64::from(config.repeat_interval_secs) * 1000,
                PROXY_REPEAT_MS,
                REPEAT_KEYS,
            ),
            MemorySiteCache::new(SITE_TTL, MAX_CACHED),
        )
    }
}

/// Events and distinct visitors of the last N seconds, per site and page.
#[async_trait]
pub trait LiveState: Send + Sync {
    /// Record one accepted event ([`crate::core::classify::live_entry`]) at `now_ms`: under its
    /// site, and under its page when it has one.
    async fn record(&self, entry: &LiveEntry, now_ms: i64);
    /// The numbers of a whole site (`page` = `None`) or one page at `now_ms`.
    async fn read(&self, site: &SiteId, page: Option<&PagePath>, now_ms: i64) -> LiveNumbers;
}

/// Per-address allowances (see [`crate::limits`] for the rules).
#[async_trait]
pub trait RateLimiter: Send + Sync {
    /// Admit a request holding `n` records for each listed site: every per-site quota and the
    /// address quota must pass, then all are charged; otherwise nothing is.
    async fn admit_many(
        &self,
        lane: Lane,
        net: ClientNet,
        per_site: &[(&SiteId, u32)],
        now: Timestamp,
    ) -> Result<(), Refusal>;
    /// Whether `net` could send one more record at all now. Charges nothing.
    async fn has_room(&self, lane: Lane, net: ClientNet, now: Timestamp) -> Result<(), Refusal>;
    /// Admit (and charge) the creation of one new site by `net`.
    async fn admit_new_site(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal>;
    /// Whether `net` may guess a token now (wrong guesses left). Charges nothing.
    async fn may_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal>;
    /// Charge one wrong token guess to `net`.
    async fn wrong_guess(&self, net: ClientNet, now: Timestamp);

    /// Admit `n` records of `net` for one site.
    async fn admit(
        &self,
        lane: Lane,
        net: ClientNet,
        site: &SiteId,
        n: u32,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.admit_many(lane, net, &[(site, n)], now).await
    }
}

/// The repeat gate of views without a visitor id (badge, pixel).
#[async_trait]
pub trait RepeatGate: Send + Sync {
    /// Whether the view with repeat key `key` ([`crate::core::classify::View::repeat_key`])
    /// may count at `now_ms`: true at most once per the lane's interval; an admitted key is
    /// remembered, a refused one is not renewed.
    async fn admit(&self, lane: Lane, key: u64, now_ms: i64) -> bool;
}

/// A short-lived cache of site configurations (and of ids known not to exist).
#[async_trait]
pub trait SiteCache: Send + Sync {
    /// `Some(Some(site))` cached, `Some(None)` cached as absent, `None` not cached (or expired).
    async fn get(&self, id: &SiteId) -> Option<Option<Arc<Site>>>;
    /// Remember `site` (or that there is none) under `id`.
    async fn put(&self, id: &SiteId, site: Option<Arc<Site>>);
}

/// This process's live window.
pub struct MemoryLive(Mutex<LiveWindow<LiveKey>>);

impl MemoryLive {
    /// A window of `window_secs` seconds with the bounds of [`LiveWindow::new`].
    pub fn new(
        window_secs: u32,
        max_visitors: usize,
        max_keys: usize,
        max_total_visitors: usize,
    ) -> Self {
        Self(Mutex::new(LiveWindow::new(
            window_secs,
            max_visitors,
            max_keys,
            max_total_visitors,
        )))
    }
}

#[async_trait]
impl LiveState for MemoryLive {
    async fn record(&self, entry: &LiveEntry, now_ms: i64) {
        let mut live = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        live.record(&(entry.site.clone(), None), entry.visitor, now_ms);
        if let Some(page) = &entry.page {
            live.record(
                &(entry.site.clone(), Some(page.clone())),
                entry.visitor,
                now_ms,
            );
        }
    }

    async fn read(&self, site: &SiteId, page: Option<&PagePath>, now_ms: i64) -> LiveNumbers {
        let mut live = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        live.read(&(site.clone(), page.cloned()), now_ms)
    }
}

/// This process's repeat gates, one per lane.
pub struct MemoryRepeatGate {
    direct: Mutex<Suppressor>,
    proxy: Mutex<Suppressor>,
}

impl MemoryRepeatGate {
    /// Direct repeats within `direct_ms`, proxy repeats within `proxy_ms`, count once; each
    /// lane remembers up to `max_keys` keys.
    pub fn new(direct_ms: i64, proxy_ms: i64, max_keys: usize) -> Self {
        Self {
            direct: Mutex::new(Suppressor::new(direct_ms, max_keys)),
            proxy: Mutex::new(Suppressor::new(proxy_ms, max_keys)),
        }
    }
}

#[async_trait]
impl RepeatGate for MemoryRepeatGate {
    async fn admit(&self, lane: Lane, key: u64, now_ms: i64) -> bool {
        let gate = match lane {
            Lane::Direct => &self.direct,
            Lane::Proxy => &self.proxy,
        };
        gate.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(key, now_ms)
    }
}

/// A cached lookup: the site (or `None`: known not to exist) and when it was read.
type Cached = (Option<Arc<Site>>, Instant);

/// This process's site cache: entries live `ttl`; at most `max_entries` ids are held (the
/// cache is cleared when it would grow past that).
pub struct MemorySiteCache {
    ttl: Duration,
    max_entries: usize,
    entries: RwLock<HashMap<SiteId, Cached>>,
}

impl MemorySiteCache {
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self {
            ttl,
            max_entries: max_entries.max(1),
            entries: RwLock::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl SiteCache for MemorySiteCache {
    async fn get(&self, id: &SiteId) -> Option<Option<Arc<Site>>> {
        let entries = self.entries.read().unwrap_or_else(PoisonError::into_inner);
        let (site, at) = entries.get(id)?;
        (at.elapsed() < self.ttl).then(|| site.clone())
    }

    async fn put(&self, id: &SiteId, site: Option<Arc<Site>>) {
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.max_entries && !entries.contains_key(id) {
            entries.clear();
        }
        entries.insert(id.clone(), (site, Instant::now()));
    }
}
