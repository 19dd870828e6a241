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
//! Layout, as in `store/`: the traits and the bundle ([`SharedState`]) are here, built from
//! [`StateOptions`]; [`limits`] holds the rate-limit policy both limiters share; [`memory`]
//! holds the in-process implementations ([`memory::shared`]: one collector) and [`redis`] the
//! Redis ones, split by job ([`redis::shared`]: several collectors). Callers hold only the
//! traits.

pub mod limits;
pub mod memory;
pub mod redis;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;

use crate::core::classify::{Lane, LiveEntry};
use crate::core::ids::{PagePath, SiteId};
use crate::core::live::LiveNumbers;
use crate::core::net::ClientNet;
use crate::core::site::Site;
use limits::{LimitConfig, Refusal};

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

/// How long a cached site (or the knowledge that it does not exist) is trusted: a change made
/// by `tally site` on another process shows within this time.
pub const SITE_TTL: Duration = Duration::from_secs(5);

/// Most site ids remembered (known and unknown); the cache is cleared when it grows past this.
pub const MAX_CACHED: usize = 10_000;

/// What the shared state is built from (the settings of `tally serve` that concern it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateOptions {
    /// Seconds an event stays in the live window.
    pub live_window_secs: u32,
    /// Seconds within which a badge or pixel view of one source and page counts once.
    pub repeat_interval_secs: u32,
    /// The per-address limits.
    pub limits: LimitConfig,
}

impl StateOptions {
    /// The direct lane's repeat interval, in milliseconds.
    pub fn repeat_interval_ms(&self) -> i64 {
        i64::from(self.repeat_interval_secs) * 1000
    }
}

/// The shared-state seams of one collector, handed to the app state.
#[derive(Clone)]
pub struct SharedState {
    pub live: Arc<dyn LiveState>,
    pub limits: Arc<dyn RateLimiter>,
    pub repeats: Arc<dyn RepeatGate>,
    pub sites: Arc<dyn SiteCache>,
    /// The Redis behind them, when shared (`--redis`): its health goes to `/metrics` and
    /// `/readyz`.
    pub redis: Option<Arc<redis::RedisLink>>,
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

/// Per-address allowances (see [`crate::state::limits`] for the rules).
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
