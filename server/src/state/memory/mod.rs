//! The in-process implementations of the shared-state traits: one collector's own state,
//! bounded in memory. [`shared`] bundles them.

mod limiter;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{
    LIVE_MAX_KEYS, LIVE_MAX_VISITORS, LIVE_MAX_VISITORS_TOTAL, LiveKey, LiveState, MAX_CACHED,
    PROXY_REPEAT_MS, REPEAT_KEYS, RepeatGate, SITE_TTL, SharedState, SiteCache, StateOptions,
};
use crate::core::classify::{Lane, LiveEntry};
use crate::core::ids::{PagePath, SiteId};
use crate::core::live::{LiveNumbers, LiveWindow};
use crate::core::site::Site;
use crate::core::suppress::Suppressor;
pub use limiter::Limits;

/// This process's own state, as configured (one collector).
pub fn shared(options: StateOptions) -> SharedState {
    let (live, repeats, sites) = parts(options);
    SharedState {
        live: Arc::new(live),
        limits: Arc::new(Limits::new(options.limits)),
        repeats: Arc::new(repeats),
        sites: Arc::new(sites),
        redis: None,
    }
}

/// The in-process parts, also kept by the Redis implementations for when Redis does not answer.
pub fn parts(options: StateOptions) -> (MemoryLive, MemoryRepeatGate, MemorySiteCache) {
    (
        MemoryLive::new(
            options.live_window_secs,
            LIVE_MAX_VISITORS,
            LIVE_MAX_KEYS,
            LIVE_MAX_VISITORS_TOTAL,
        ),
        MemoryRepeatGate::new(options.repeat_interval_ms(), PROXY_REPEAT_MS, REPEAT_KEYS),
        MemorySiteCache::new(SITE_TTL, MAX_CACHED),
    )
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
