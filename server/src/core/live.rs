//! The live window: events and distinct visitors of the last `window` seconds per key (a site,
//! or a site's page), with an injected clock.
//!
//! Contract:
//! - **Resolution and boundary.** Time is taken in whole seconds (`floor(ms / 1000)`). An event
//!   recorded in second `s` is live at `now` exactly while `now - window < s <= now`: the lower
//!   end is exclusive, the upper inclusive. With the default 60 s window an event at 12:00:00.xxx
//!   is counted through 12:00:59.999 and gone at 12:01:00.000.
//! - **Lazy cleanup.** Expired entries are dropped on every write and read of a key, and keys
//!   with nothing live are dropped by a sweep that runs at most once per second of clock time,
//!   so a key that receives nothing new still reads zero after the window passes.
//! - **Bounded memory.** Per key: one bucket per second that saw events (at most `window`), and
//!   each distinct visitor once per second it was seen. Distinct visitors are exact up to
//!   `max_visitors` per key and `max_total_visitors` over all keys; beyond that new visitors
//!   are not tracked until older ones expire and the count reads as a lower bound
//!   (`saturated`). At most `max_keys` keys are tracked: an event for a new key beyond that is
//!   not tracked at all (its key reads zero). Events of tracked keys are always exact.
//! - Keys never interfere: each has its own buckets and visitor set.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// Numbers of one key inside the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveNumbers {
    pub events: u64,
    pub visitors: u64,
    /// True when the visitor count hit `max_visitors` and is a lower bound.
    pub saturated: bool,
}

#[derive(Debug, Default)]
struct Bucket {
    sec: i64,
    events: u64,
    /// Visitors whose latest sighting is (or was) in this second.
    visitors: Vec<u64>,
}

#[derive(Debug, Default)]
struct KeyState {
    buckets: VecDeque<Bucket>,
    events: u64,
    /// Visitor → the latest second it was seen.
    last_seen: HashMap<u64, i64>,
    saturated: bool,
}

impl KeyState {
    /// Drop buckets that left the window; returns how many visitors stopped being tracked.
    fn expire(&mut self, now_sec: i64, window: i64) -> usize {
        let before = self.last_seen.len();
        while let Some(front) = self.buckets.front() {
            if now_sec - front.sec < window {
                break;
            }
            let Some(bucket) = self.buckets.pop_front() else {
                break;
            };
            self.events -= bucket.events;
            for v in bucket.visitors {
                if self.last_seen.get(&v) == Some(&bucket.sec) {
                    self.last_seen.remove(&v);
                }
            }
        }
        if self.last_seen.is_empty() {
            self.saturated = false;
        }
        before - self.last_seen.len()
    }

    fn numbers(&self) -> LiveNumbers {
        LiveNumbers {
            events: self.events,
            visitors: self.last_seen.len() as u64,
            saturated: self.saturated,
        }
    }
}

/// A sliding-window counter of events and distinct visitors per key.
#[derive(Debug)]
pub struct LiveWindow<K> {
    window_secs: i64,
    max_visitors: usize,
    max_keys: usize,
    max_total_visitors: usize,
    /// Visitors tracked over all keys.
    total_visitors: usize,
    keys: HashMap<K, KeyState>,
    last_sweep_sec: i64,
}

impl<K: Hash + Eq + Clone> LiveWindow<K> {
    /// A window of `window_secs` seconds tracking up to `max_visitors` distinct visitors per
    /// key, `max_keys` keys and `max_total_visitors` visitors over all keys.
    pub fn new(
        window_secs: u32,
        max_visitors: usize,
        max_keys: usize,
        max_total_visitors: usize,
    ) -> Self {
        Self {
            window_secs: i64::from(window_secs.max(1)),
            max_visitors,
            max_keys,
            max_total_visitors,
            total_visitors: 0,
            keys: HashMap::new(),
            last_sweep_sec: i64::MIN,
        }
    }

    /// Visitors tracked over all keys.
    pub fn tracked_visitors(&self) -> usize {
        self.total_visitors
    }

    /// Record one event of `visitor` under `key` at `now_ms`.
    pub fn record(&mut self, key: &K, visitor: u64, now_ms: i64) {
        let sec = now_ms.div_euclid(1000);
        self.sweep(sec);
        let window = self.window_secs;
        let max = self.max_visitors;
        if !self.keys.contains_key(key) && self.keys.len() >= self.max_keys {
            return;
        }
        let room = self.total_visitors < self.max_total_visitors;
        let state = self.keys.entry(key.clone()).or_default();
        self.total_visitors -= state.expire(sec, window);
        if state.buckets.back().is_none_or(|b| b.sec < sec) {
            state.buckets.push_back(Bucket {
                sec,
                ..Bucket::default()
            });
        }
        // Clocks are monotonic in practice; an event from an earlier second joins the newest bucket.
        let Some(bucket) = state.buckets.back_mut() else {
            return;
        };
        bucket.events += 1;
        state.events += 1;
        let bucket_sec = bucket.sec;
        let tracked = state.last_seen.len();
        match state.last_seen.get_mut(&visitor) {
            Some(seen) if *seen == bucket_sec => {}
            Some(seen) => {
                *seen = bucket_sec;
                bucket.visitors.push(visitor);
            }
            None if tracked < max && room => {
                state.last_seen.insert(visitor, bucket_sec);
                bucket.visitors.push(visitor);
                self.total_visitors += 1;
            }
            None => state.saturated = true,
        }
    }

    /// The live numbers of `key` at `now_ms`.
    pub fn read(&mut self, key: &K, now_ms: i64) -> LiveNumbers {
        let sec = now_ms.div_euclid(1000);
        self.sweep(sec);
        let window = self.window_secs;
        match self.keys.get_mut(key) {
            Some(state) => {
                self.total_visitors -= state.expire(sec, window);
                state.numbers()
            }
            None => LiveNumbers::default(),
        }
    }

    /// Number of keys holding state (for tests and metrics).
    pub fn tracked_keys(&self) -> usize {
        self.keys.len()
    }

    fn sweep(&mut self, now_sec: i64) {
        if now_sec <= self.last_sweep_sec {
            return;
        }
        self.last_sweep_sec = now_sec;
        let window = self.window_secs;
        let mut dropped = 0;
        self.keys.retain(|_, state| {
            dropped += state.expire(now_sec, window);
            !state.buckets.is_empty()
        });
        self.total_visitors -= dropped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_780_000_000_000; // a whole second

    #[test]
    fn boundary_lower_end_exclusive_upper_inclusive() {
        let mut w = LiveWindow::new(60, 100, 100, 1000);
        w.record(&"a", 1, T0 + 999);
        assert_eq!(w.read(&"a", T0).events, 1, "same second counts");
        assert_eq!(
            w.read(&"a", T0 + 59_999).events,
            1,
            "59.999 s later still inside"
        );
        assert_eq!(
            w.read(&"a", T0 + 60_000).events,
            0,
            "60 s later it has left"
        );
    }

    #[test]
    fn expired_entries_drop_without_new_events() {
        let mut w = LiveWindow::new(60, 100, 100, 1000);
        for v in 0..10 {
            w.record(&"a", v, T0 + v as i64 * 1000);
        }
        let n = w.read(&"a", T0 + 9_000);
        assert_eq!((n.events, n.visitors), (10, 10));
        let n = w.read(&"a", T0 + 65_000);
        assert_eq!(
            (n.events, n.visitors),
            (4, 4),
            "events of seconds 0..=5 expired"
        );
        assert_eq!(w.read(&"a", T0 + 200_000), LiveNumbers::default());
        assert_eq!(w.tracked_keys(), 0, "the sweep dropped the idle key");
    }

    #[test]
    fn a_returning_visitor_stays_live_from_its_latest_event() {
        let mut w = LiveWindow::new(60, 100, 100, 1000);
        w.record(&"a", 7, T0);
        w.record(&"a", 7, T0 + 30_000);
        let n = w.read(&"a", T0 + 60_000);
        assert_eq!((n.events, n.visitors), (1, 1));
        let n = w.read(&"a", T0 + 90_000);
        assert_eq!((n.events, n.visitors), (0, 0));
    }

    #[test]
    fn keys_are_independent() {
        let mut w = LiveWindow::new(60, 100, 100, 1000);
        w.record(&"a", 1, T0);
        w.record(&"a", 2, T0);
        w.record(&"b", 1, T0 + 10_000);
        assert_eq!(w.read(&"a", T0 + 10_000).visitors, 2);
        assert_eq!(w.read(&"b", T0 + 10_000).visitors, 1);
        assert_eq!(w.read(&"a", T0 + 60_000).events, 0);
        assert_eq!(w.read(&"b", T0 + 60_000).events, 1);
    }

    #[test]
    fn visitors_saturate_at_the_cap_events_stay_exact() {
        let mut w = LiveWindow::new(60, 3, 100, 1000);
        for v in 0..5 {
            w.record(&"a", v, T0);
        }
        let n = w.read(&"a", T0);
        assert_eq!(
            n,
            LiveNumbers {
                events: 5,
                visitors: 3,
                saturated: true
            }
        );
        assert_eq!(w.read(&"a", T0 + 60_000), LiveNumbers::default());
    }

    #[test]
    fn keys_and_total_visitors_are_bounded() {
        let mut w = LiveWindow::new(60, 100, 3, 5);
        for k in 0..10 {
            w.record(&k, k as u64, T0);
        }
        assert_eq!(w.tracked_keys(), 3, "keys beyond the bound are not tracked");
        assert_eq!(w.read(&9, T0).events, 0);
        for v in 100..110 {
            w.record(&0, v, T0);
        }
        assert_eq!(
            w.tracked_visitors(),
            5,
            "visitors over all keys are bounded"
        );
        assert!(w.read(&0, T0).saturated);
        assert_eq!(
            w.read(&0, T0).events,
            11,
            "events of tracked keys stay exact"
        );
        // Once everything expired the budget is free again.
        assert_eq!(w.read(&0, T0 + 61_000).visitors, 0);
        assert_eq!(w.tracked_visitors(), 0);
        w.record(&42, 1, T0 + 61_000);
        assert_eq!(w.read(&42, T0 + 61_000).visitors, 1);
    }
}
