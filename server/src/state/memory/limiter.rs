//! [`Limits`]: the in-process [`RateLimiter`], this collector's own GCRA buckets (the rules
//! are in [`crate::state::limits`]). State is in memory, keyed by a process-random hash (no
//! address is stored), each map bounded ([`MAX_KEYS`], see `core::gcra`).

use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;

use crate::core::classify::Lane;
use crate::core::gcra::{KeyedGcra, Quota, Verdict};
use crate::core::ids::SiteId;
use crate::core::net::ClientNet;
use crate::state::RateLimiter;
use crate::state::limits::{
    GUESS_PENALTY_CAP, GUESSES_PER_MINUTE, LimitConfig, MAX_KEYS, Refusal, scaled,
};

/// One keyed quota behind a lock.
struct Bucket(Mutex<KeyedGcra>);

impl Bucket {
    fn new(quota: Option<Quota>) -> Option<Self> {
        quota.map(|q| Self(Mutex::new(KeyedGcra::new(q, MAX_KEYS))))
    }

    /// The limiter (a panic elsewhere under the lock left it consistent: every change is one
    /// map insert).
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyedGcra> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether one cell of `key` fits now. Charges nothing.
    fn peek(&self, key: u64, now: Timestamp) -> Result<(), Refusal> {
        refusal(self.lock().check(key, 1, micros(now))).map_or(Ok(()), Err)
    }

    /// Admit and charge one cell of `key`, or refuse and charge nothing.
    fn take(&self, key: u64, now: Timestamp) -> Result<(), Refusal> {
        let mut gcra = self.lock();
        let verdict = gcra.check(key, 1, micros(now));
        if let Verdict::Admit { tat_us } = verdict {
            gcra.commit(key, tat_us);
        }
        refusal(verdict).map_or(Ok(()), Err)
    }
}

/// The buckets of one lane.
struct LaneBuckets {
    per_site: Option<Bucket>,
    per_address: Option<Bucket>,
}

/// The limits of one collector process.
pub struct Limits {
    direct: LaneBuckets,
    proxy: LaneBuckets,
    new_sites: Option<Bucket>,
    /// Wrong token guesses per network.
    guesses: Option<Bucket>,
    /// Keys buckets for this process only.
    hasher: std::collections::hash_map::RandomState,
}

fn micros(now: Timestamp) -> i64 {
    now.as_microsecond()
}

fn refusal(verdict: Verdict) -> Option<Refusal> {
    match verdict {
        Verdict::Admit { .. } => None,
        Verdict::Wait { us } => Some(Refusal::Wait(Duration::from_micros(
            u64::try_from(us).unwrap_or(0),
        ))),
        Verdict::Never { burst } => Some(Refusal::Never { allowance: burst }),
        // Every key is busy: an overload answer, retried after a second.
        Verdict::Full => Some(Refusal::Wait(Duration::from_secs(1))),
    }
}

impl Limits {
    /// Limits as configured.
    pub fn new(config: LimitConfig) -> Self {
        let lane = |factor| LaneBuckets {
            per_site: Bucket::new(scaled(config.per_site_per_minute, factor)),
            per_address: Bucket::new(scaled(config.per_address_per_minute, factor)),
        };
        Self {
            direct: lane(1),
            proxy: lane(config.proxy_factor),
            new_sites: Bucket::new(Quota::per_hour(
                config.new_sites_per_hour,
                config.new_sites_per_hour,
            )),
            guesses: Bucket::new(Quota::per_minute(GUESSES_PER_MINUTE)),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn lane(&self, lane: Lane) -> &LaneBuckets {
        match lane {
            Lane::Direct => &self.direct,
            Lane::Proxy => &self.proxy,
        }
    }

    /// Admit `n` records of `net` for `site`, charging both quotas of the lane, or neither.
    pub fn admit(
        &self,
        lane: Lane,
        net: ClientNet,
        site: &SiteId,
        n: u32,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.admit_many(lane, net, &[(site, n)], now)
    }

    /// Admit a request holding `n` records for each listed site (a batch may mix sites):
    /// every per-site quota and the address quota (with the total) must pass, and then all
    /// are charged; otherwise nothing is. A request that could never pass says so
    /// ([`Refusal::Never`]), also when only its total exceeds the address allowance.
    pub fn admit_many(
        &self,
        lane: Lane,
        net: ClientNet,
        per_site: &[(&SiteId, u32)],
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let buckets = self.lane(lane);
        let now = micros(now);
        let total = per_site
            .iter()
            .fold(0u32, |sum, (_, n)| sum.saturating_add(*n));
        let mut charges: Vec<(bool, u64, i64)> = Vec::with_capacity(per_site.len() + 1);
        // Fixed lock order: per site, then per address; both held while deciding.
        let mut site_gcra = buckets.per_site.as_ref().map(Bucket::lock);
        let mut address_gcra = buckets.per_address.as_ref().map(Bucket::lock);
        if let Some(gcra) = site_gcra.as_deref_mut() {
            for (site, n) in per_site {
                let key = self.hasher.hash_one((lane, net, site.as_str()));
                match gcra.check(key, *n, now) {
                    Verdict::Admit { tat_us } => charges.push((true, key, tat_us)),
                    verdict => {
                        return Err(refusal(verdict).unwrap_or(Refusal::Never { allowance: 0 }));
                    }
                }
            }
        }
        if let Some(gcra) = address_gcra.as_deref_mut() {
            let key = self.hasher.hash_one((lane, net));
            match gcra.check(key, total, now) {
                Verdict::Admit { tat_us } => charges.push((false, key, tat_us)),
                verdict => return Err(refusal(verdict).unwrap_or(Refusal::Never { allowance: 0 })),
            }
        }
        for (per_site, key, tat) in charges {
            let gcra = if per_site {
                site_gcra.as_deref_mut()
            } else {
                address_gcra.as_deref_mut()
            };
            if let Some(gcra) = gcra {
                gcra.commit(key, tat);
            }
        }
        Ok(())
    }

    /// Whether `net` could send one more record at all now (checked before a body is read,
    /// so a client that is over its allowance costs no parsing). Charges nothing.
    pub fn has_room(&self, lane: Lane, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(bucket) = &self.lane(lane).per_address else {
            return Ok(());
        };
        bucket.peek(self.hasher.hash_one((lane, net)), now)
    }

    /// Whether `net` may guess a token now (it has wrong guesses left). Charges nothing.
    pub fn may_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(bucket) = &self.guesses else {
            return Ok(());
        };
        bucket.peek(self.hasher.hash_one(("guess", net)), now)
    }

    /// Charge one wrong guess to `net`, even over its allowance (see [`GUESS_PENALTY_CAP`]).
    pub fn wrong_guess(&self, net: ClientNet, now: Timestamp) {
        let Some(bucket) = &self.guesses else {
            return;
        };
        let cap = i64::try_from(GUESS_PENALTY_CAP.as_micros()).unwrap_or(i64::MAX);
        bucket
            .lock()
            .penalize(self.hasher.hash_one(("guess", net)), 1, micros(now), cap);
    }

    /// Admit the creation of one new site by `net`.
    pub fn admit_new_site(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        let Some(bucket) = &self.new_sites else {
            return Ok(());
        };
        bucket.take(self.hasher.hash_one(("new-site", net)), now)
    }
}

/// The in-process [`RateLimiter`]: this collector's own buckets.
#[async_trait::async_trait]
impl RateLimiter for Limits {
    async fn admit_many(
        &self,
        lane: Lane,
        net: ClientNet,
        per_site: &[(&SiteId, u32)],
        now: Timestamp,
    ) -> Result<(), Refusal> {
        Limits::admit_many(self, lane, net, per_site, now)
    }

    async fn has_room(&self, lane: Lane, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        Limits::has_room(self, lane, net, now)
    }

    async fn admit_new_site(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        Limits::admit_new_site(self, net, now)
    }

    async fn may_guess(&self, net: ClientNet, now: Timestamp) -> Result<(), Refusal> {
        Limits::may_guess(self, net, now)
    }

    async fn wrong_guess(&self, net: ClientNet, now: Timestamp) {
        Limits::wrong_guess(self, net, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::limits::is_image_proxy;

    fn config(per_site: u32, per_address: u32) -> LimitConfig {
        LimitConfig {
            per_site_per_minute: per_site,
            per_address_per_minute: per_address,
            new_sites_per_hour: 2,
            proxy_factor: 10,
        }
    }

    fn net(s: &str) -> ClientNet {
        ClientNet::of(s.parse().expect("ip"))
    }

    fn site(s: &str) -> SiteId {
        SiteId::parse(s).expect("site")
    }

    const T0: &str = "2026-06-01T12:00:00Z";

    #[test]
    fn per_site_then_across_sites() {
        let limits = Limits::new(config(3, 5));
        let now: Timestamp = T0.parse().expect("ts");
        let a = net("192.0.2.1");
        for _ in 0..3 {
            assert!(limits.admit(Lane::Direct, a, &site("s1"), 1, now).is_ok());
        }
        assert!(matches!(
            limits.admit(Lane::Direct, a, &site("s1"), 1, now),
            Err(Refusal::Wait(_))
        ));
        // Another site has its own per-site bucket, but shares the address bucket (5).
        assert!(limits.admit(Lane::Direct, a, &site("s2"), 2, now).is_ok());
        assert!(limits.admit(Lane::Direct, a, &site("s3"), 1, now).is_err());
        assert!(limits.has_room(Lane::Direct, a, now).is_err());
        // Another address is independent; a proxy lane is separate and larger.
        assert!(
            limits
                .admit(Lane::Direct, net("192.0.2.2"), &site("s1"), 3, now)
                .is_ok()
        );
        assert!(limits.admit(Lane::Proxy, a, &site("s1"), 30, now).is_ok());
    }

    #[test]
    fn a_refused_request_charges_neither_bucket() {
        let limits = Limits::new(config(10, 4));
        let now: Timestamp = T0.parse().expect("ts");
        let a = net("192.0.2.1");
        // 5 > the address burst of 4: refused as never admissible, nothing charged.
        assert_eq!(
            limits.admit(Lane::Direct, a, &site("s"), 5, now),
            Err(Refusal::Never { allowance: 4 })
        );
        assert!(limits.admit(Lane::Direct, a, &site("s"), 4, now).is_ok());
    }

    #[test]
    fn a_batch_over_several_sites_is_judged_by_its_total() {
        let limits = Limits::new(config(10, 12));
        let now: Timestamp = T0.parse().expect("ts");
        let a = net("192.0.2.1");
        let (s1, s2) = (site("s1"), site("s2"));
        assert_eq!(
            limits.admit_many(Lane::Direct, a, &[(&s1, 8), (&s2, 8)], now),
            Err(Refusal::Never { allowance: 12 })
        );
        assert!(
            limits
                .admit_many(Lane::Direct, a, &[(&s1, 6), (&s2, 6)], now)
                .is_ok()
        );
        assert!(limits.admit(Lane::Direct, a, &s1, 1, now).is_err());
    }

    #[test]
    fn new_sites_per_address_per_hour() {
        let limits = Limits::new(config(10, 10));
        let now: Timestamp = T0.parse().expect("ts");
        let a = net("2001:db8::1");
        assert!(limits.admit_new_site(a, now).is_ok());
        assert!(limits.admit_new_site(net("2001:db8::2"), now).is_ok());
        assert!(
            limits.admit_new_site(net("2001:db8::3"), now).is_err(),
            "same /64"
        );
        assert!(limits.admit_new_site(net("2001:db8:0:1::1"), now).is_ok());
    }

    #[test]
    fn known_image_proxies() {
        assert!(is_image_proxy("github-camo (876de43e)"));
        assert!(is_image_proxy(
            "Mozilla/5.0 (Windows NT 5.1; rv:11.0) Gecko Firefox/11.0 (via ggpht.com GoogleImageProxy)"
        ));
        assert!(!is_image_proxy(
            "Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0"
        ));
    }
}
