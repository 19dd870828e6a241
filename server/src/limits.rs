//! Per-source rate limits for script hits (`/api/v1/hit`, `/api/v1/events`).
//!
//! Contract: a source is (site, client address, user agent), hashed in memory with a
//! process-random key (nothing is stored). Each source may send `per_minute` records per
//! minute (a GCRA bucket from `governor`, burst = `per_minute`). A request beyond that is
//! refused with 429 and `Retry-After` — refused, not dropped, so a real client retries later
//! with the same event ids and nothing legitimate is lost, while a flood never reaches the
//! store. `per_minute = 0` turns limiting off. Memory is bounded: sources idle for a full
//! bucket period are forgotten every [`SWEEP_EVERY`] checks.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::core::ids::SiteId;

/// Checks between two sweeps of idle sources.
pub const SWEEP_EVERY: u64 = 10_000;

/// The limiter of one collector process.
pub struct SourceLimiter {
    /// `None` when limiting is off.
    limiter: Option<DefaultKeyedRateLimiter<u64>>,
    /// Keys sources for this process only.
    hasher: std::collections::hash_map::RandomState,
    checks: AtomicU64,
}

impl SourceLimiter {
    /// `per_minute` records per source and minute; 0 = no limit.
    pub fn new(per_minute: u32) -> Self {
        Self {
            limiter: NonZeroU32::new(per_minute)
                .map(|n| DefaultKeyedRateLimiter::keyed(Quota::per_minute(n))),
            hasher: std::collections::hash_map::RandomState::new(),
            checks: AtomicU64::new(0),
        }
    }

    /// Admit `n` records from a source, or say how long it must wait.
    pub fn check(
        &self,
        site: &SiteId,
        ip: IpAddr,
        user_agent: &str,
        n: usize,
    ) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
        let key = self.hasher.hash_one((site.as_str(), ip, user_agent));
        let n = NonZeroU32::new(u32::try_from(n).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        match limiter.check_key_n(&key, n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(not_until.wait_time_from(DefaultClock::default().now())),
            // More records in one request than a whole minute's allowance.
            Err(_) => Err(Duration::from_secs(60)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_allowance_then_a_wait() {
        let limiter = SourceLimiter::new(3);
        let site = SiteId::parse("s").expect("site");
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        for _ in 0..3 {
            assert!(limiter.check(&site, ip, "ua", 1).is_ok());
        }
        let wait = limiter
            .check(&site, ip, "ua", 1)
            .expect_err("over the limit");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(
            limiter.check(&site, ip, "other ua", 1).is_ok(),
            "sources are independent"
        );
        assert!(
            limiter
                .check(&site, "192.0.2.2".parse().expect("ip"), "ua", 2)
                .is_ok()
        );
        assert!(
            limiter.check(&site, ip, "third", 4).is_err(),
            "a batch beyond the burst"
        );
    }

    #[test]
    fn zero_means_off() {
        let limiter = SourceLimiter::new(0);
        let site = SiteId::parse("s").expect("site");
        for _ in 0..1000 {
            assert!(
                limiter
                    .check(&site, "192.0.2.1".parse().expect("ip"), "ua", 1)
                    .is_ok()
            );
        }
    }
}
