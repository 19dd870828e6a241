//! Rate limiting by GCRA (the generic cell rate algorithm), in plain Rust with time passed in.
//!
//! Contract:
//! - A [`Quota`] of `per_minute` cells allows a burst of `burst` cells at once and then one cell
//!   every `60 s / per_minute`; a request of `n` cells is admitted whole or not at all.
//! - [`Quota::check`] decides from one key's state (its theoretical arrival time, "TAT") and
//!   `now`; it never mutates, so a caller can check several quotas and commit all or none.
//! - A request of more cells than the burst can never be admitted: [`Verdict::Never`] says so,
//!   so the edge answers a 4xx instead of a `429` that no wait could satisfy.
//! - [`KeyedGcra`] keeps one TAT per key in a map bounded by `max_keys`. Keys whose bucket has
//!   refilled hold no information and are swept (at most once per second of clock time, so a
//!   flood cannot make every call scan the map). When the map is full of keys that are all
//!   still limited, a NEW key is refused ([`Verdict::Full`]): memory stays bounded and no
//!   existing client's limit is forgotten, at the price of refusing newcomers under a flood of
//!   distinct sources.

use std::collections::HashMap;

/// Microseconds per minute.
const MINUTE_US: i64 = 60_000_000;

/// A rate: `per_minute` cells per minute with a burst of `burst` cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Microseconds between two cells at the sustained rate.
    interval_us: i64,
    /// Cells that may arrive at once.
    burst: u32,
}

/// What a quota says about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted; the key's new TAT.
    Admit { tat_us: i64 },
    /// Not now: admitted at the earliest after this many microseconds.
    Wait { us: i64 },
    /// Never: the request is larger than the burst.
    Never { burst: u32 },
    /// The key is new and the map has no room (see the module doc).
    Full,
}

impl Quota {
    /// `per_minute` cells per minute, burst = `per_minute`. `None` for 0 (no limit).
    pub fn per_minute(per_minute: u32) -> Option<Self> {
        Self::with_burst(per_minute, per_minute)
    }

    /// `per_minute` cells per minute with a burst of `burst` (at least 1). `None` for 0.
    pub fn with_burst(per_minute: u32, burst: u32) -> Option<Self> {
        (per_minute > 0).then(|| Self {
            interval_us: (MINUTE_US / i64::from(per_minute)).max(1),
            burst: burst.max(1),
        })
    }

    /// `per_hour` cells per hour, burst = `burst`. `None` for 0.
    pub fn per_hour(per_hour: u32, burst: u32) -> Option<Self> {
        (per_hour > 0).then(|| Self {
            interval_us: (60 * MINUTE_US / i64::from(per_hour)).max(1),
            burst: burst.max(1),
        })
    }

    /// The burst.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Microseconds between two cells at the sustained rate (a shared limiter runs the same
    /// arithmetic elsewhere, e.g. in a Redis script).
    pub fn interval_us(&self) -> i64 {
        self.interval_us
    }

    /// Whether `n` cells fit at `now_us` for a key whose TAT is `tat_us` (`None`: a new key).
    pub fn check(&self, tat_us: Option<i64>, n: u32, now_us: i64) -> Verdict {
        if n > self.burst {
            return Verdict::Never { burst: self.burst };
        }
        let start = tat_us.unwrap_or(now_us).max(now_us);
        let new_tat = start.saturating_add(i64::from(n) * self.interval_us);
        let capacity = i64::from(self.burst) * self.interval_us;
        let over = new_tat - now_us - capacity;
        if over > 0 {
            Verdict::Wait { us: over }
        } else {
            Verdict::Admit { tat_us: new_tat }
        }
    }
}

/// One TAT per key, bounded in entries.
#[derive(Debug)]
pub struct KeyedGcra {
    quota: Quota,
    max_keys: usize,
    tats: HashMap<u64, i64>,
    last_sweep_us: i64,
}

impl KeyedGcra {
    /// A keyed limiter of `quota` remembering at most `max_keys` keys.
    pub fn new(quota: Quota, max_keys: usize) -> Self {
        Self {
            quota,
            max_keys: max_keys.max(1),
            tats: HashMap::new(),
            last_sweep_us: i64::MIN,
        }
    }

    /// The quota.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// What admitting `n` cells for `key` at `now_us` would do; changes nothing but may sweep.
    pub fn check(&mut self, key: u64, n: u32, now_us: i64) -> Verdict {
        let tat = self.tats.get(&key).copied();
        if tat.is_none() && self.tats.len() >= self.max_keys {
            self.sweep(now_us);
            if self.tats.len() >= self.max_keys {
                return match self.quota.check(None, n, now_us) {
                    Verdict::Never { burst } => Verdict::Never { burst },
                    _ => Verdict::Full,
                };
            }
        }
        self.quota.check(tat, n, now_us)
    }

    /// Charge `n` cells to `key` whether or not they fit (a penalty): its TAT moves on by `n`
    /// intervals from `max(TAT, now)`, but never past `now_us + cap_us`. A full map forgets
    /// the penalty of a new key (like [`Self::check`] answering `Full`).
    pub fn penalize(&mut self, key: u64, n: u32, now_us: i64, cap_us: i64) {
        let tat = self.tats.get(&key).copied();
        if tat.is_none() && self.tats.len() >= self.max_keys {
            self.sweep(now_us);
            if self.tats.len() >= self.max_keys {
                return;
            }
        }
        let start = tat.unwrap_or(now_us).max(now_us);
        let new_tat = start
            .saturating_add(i64::from(n) * self.quota.interval_us())
            .min(now_us.saturating_add(cap_us));
        self.tats.insert(key, new_tat);
    }

    /// Store an admitted TAT (from [`Self::check`]).
    pub fn commit(&mut self, key: u64, tat_us: i64) {
        self.tats.insert(key, tat_us);
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.tats.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.tats.is_empty()
    }

    /// Forget keys whose bucket is full again (TAT in the past): they carry no state.
    fn sweep(&mut self, now_us: i64) {
        if now_us.saturating_sub(self.last_sweep_us) < 1_000_000 {
            return;
        }
        self.last_sweep_us = now_us;
        self.tats.retain(|_, tat| *tat > now_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    fn admit(g: &mut KeyedGcra, key: u64, n: u32, now: i64) -> Verdict {
        let v = g.check(key, n, now);
        if let Verdict::Admit { tat_us } = v {
            g.commit(key, tat_us);
        }
        v
    }

    #[test]
    fn a_penalty_is_charged_over_the_burst_up_to_its_cap() {
        let quota = Quota::per_minute(10).expect("quota");
        let mut g = KeyedGcra::new(quota, 10);
        for _ in 0..15 {
            g.penalize(1, 1, 0, 3_600_000_000);
        }
        // 15 intervals of 6 s: 30 s beyond the 60 s burst.
        assert_eq!(g.check(1, 1, 0), Verdict::Wait { us: 36_000_000 });
        for _ in 0..10_000 {
            g.penalize(1, 1, 0, 3_600_000_000);
        }
        assert_eq!(
            g.check(1, 0, 0),
            Verdict::Wait { us: 3_540_000_000 },
            "capped at an hour"
        );
    }

    #[test]
    fn burst_then_the_sustained_rate() {
        let q = Quota::per_minute(60).expect("quota");
        let mut g = KeyedGcra::new(q, 10);
        for _ in 0..60 {
            assert!(matches!(admit(&mut g, 1, 1, 0), Verdict::Admit { .. }));
        }
        assert_eq!(admit(&mut g, 1, 1, 0), Verdict::Wait { us: SEC });
        assert!(matches!(admit(&mut g, 1, 1, SEC), Verdict::Admit { .. }));
        assert!(
            matches!(admit(&mut g, 2, 1, SEC), Verdict::Admit { .. }),
            "keys are independent"
        );
    }

    #[test]
    fn a_request_larger_than_the_burst_is_never_admitted() {
        let q = Quota::per_minute(120).expect("quota");
        assert_eq!(q.check(None, 121, 0), Verdict::Never { burst: 120 });
        assert!(matches!(q.check(None, 120, 0), Verdict::Admit { .. }));
    }

    #[test]
    fn a_checked_but_uncommitted_request_costs_nothing() {
        let q = Quota::per_minute(1).expect("quota");
        let mut g = KeyedGcra::new(q, 10);
        assert!(matches!(g.check(7, 1, 0), Verdict::Admit { .. }));
        assert!(matches!(g.check(7, 1, 0), Verdict::Admit { .. }));
    }

    #[test]
    fn the_map_is_bounded_and_refuses_newcomers_only_while_everyone_is_limited() {
        let q = Quota::per_minute(1).expect("quota");
        let mut g = KeyedGcra::new(q, 100);
        for key in 0..100 {
            assert!(matches!(admit(&mut g, key, 1, 0), Verdict::Admit { .. }));
        }
        assert_eq!(admit(&mut g, 1000, 1, 0), Verdict::Full);
        assert_eq!(g.len(), 100);
        // A minute later every bucket has refilled: the sweep frees the map.
        assert!(matches!(
            admit(&mut g, 1000, 1, 61 * SEC),
            Verdict::Admit { .. }
        ));
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn zero_means_no_quota() {
        assert_eq!(Quota::per_minute(0), None);
        assert_eq!(Quota::per_hour(0, 5), None);
    }
}
