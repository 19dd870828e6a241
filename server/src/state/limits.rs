//! Per-address limits on every counting route (hit, events, badge, pixel) and on new sites.
//!
//! Contract:
//! - A client is its network ([`ClientNet`]: IPv4 /32, IPv6 /64). Nothing the client can vary
//!   for free — user agent, site id, page, visitor id — is part of any key, so rotating them
//!   buys no fresh allowance.
//! - Two quotas apply to every counted record, checked together and charged together (all or
//!   nothing): per (network, site) and per network across all sites. A request of more records
//!   than a quota's burst can never pass and is reported as such ([`Refusal::Never`]), so the
//!   edge answers a 4xx that says so instead of an endless 429.
//! - Known image proxies (GitHub's camo and the like, see [`is_image_proxy`]) fetch badges for
//!   many readers from few addresses; they get their own buckets, `proxy_factor` times larger.
//!   A client that claims to be a proxy gains only that separate, still bounded allowance.
//! - New sites (`--auto-sites`) are limited per network per hour.
//! - Wrong token guesses (admin and metrics tokens, ingest keys) are limited per network:
//!   [`GUESSES_PER_MINUTE`], then one every 6 s; a network out of guesses is refused before
//!   its guess is compared (see `edge::http::auth`).
//! - Requests from a site's own server with its ingest key never come here (their own lane).
//! - State is in memory, keyed by a process-random hash (no address is stored), each map
//!   bounded ([`MAX_KEYS`], see `core::gcra`). Time comes from the app's clock.
//!
//! This module is the policy (settings, refusals, quotas) that both limiters share: the
//! in-process one ([`crate::state::memory::Limits`]) and the Redis one
//! ([`crate::state::redis::RedisLimiter`]). The lane of a request ([`Lane`],
//! [`is_image_proxy`]) is decided in [`crate::core::classify`].

use std::time::Duration;

pub use crate::core::classify::{Lane, is_image_proxy};
use crate::core::gcra::Quota;

/// Keys each limiter remembers at most (about 40 bytes each).
pub const MAX_KEYS: usize = 200_000;

/// Wrong token guesses (admin, metrics, ingest keys) one network may make per minute, also the
/// burst; after them one every 6 s (see `edge::http::auth`).
pub const GUESSES_PER_MINUTE: u32 = 10;

/// How far ahead wrong guesses can push a network's next allowed guess (guesses made at the
/// same instant are all compared before any is charged, so each is charged even when over:
/// a burst of concurrent guesses is paid for by waiting, up to this long).
pub const GUESS_PENALTY_CAP: Duration = Duration::from_secs(3600);

/// Limit settings; 0 turns a quota off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitConfig {
    /// Records per minute one network may send to one site.
    pub per_site_per_minute: u32,
    /// Records per minute one network may send to all sites together.
    pub per_address_per_minute: u32,
    /// Sites one network may create per hour (`--auto-sites`).
    pub new_sites_per_hour: u32,
    /// How many times larger the buckets of known image proxies are.
    pub proxy_factor: u32,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over the allowance now; admitted after this wait.
    Wait(Duration),
    /// More records in one request than the allowance holds at all.
    Never { allowance: u32 },
}

impl Refusal {
    /// The wait a guess throttle announces (`Retry-After`): whole seconds rounded up, at least
    /// one.
    pub fn guess_retry_after(self) -> u64 {
        match self {
            Refusal::Wait(wait) => wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
            Refusal::Never { .. } => 1,
        }
        .max(1)
    }
}

/// The quota of `per_minute` records, `factor` times larger (the image-proxy lane); the Redis
/// limiter uses the same.
pub fn scaled(per_minute: u32, factor: u32) -> Option<Quota> {
    Quota::per_minute(per_minute.saturating_mul(factor.max(1)))
}
