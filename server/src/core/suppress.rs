//! Repeat suppression for sources without a visitor id (badge and pixel fetches): a source
//! (a keyed hash, see `collect::privacy`) is counted at most once per `interval`.
//!
//! Contract: `admit(key, now)` is true when `key` was not admitted in `(now - interval, now]`.
//! Memory is bounded by `max_keys`: entries expire lazily (oldest first) on every call, and
//! when the map is full the oldest entry is dropped early — under a flood of distinct
//! sources that can only admit more, never lose a count that should have been made.

use std::collections::{HashMap, VecDeque};

/// Remembers when each source was last admitted.
#[derive(Debug)]
pub struct Suppressor {
    interval_ms: i64,
    max_keys: usize,
    last: HashMap<u64, i64>,
    /// Admission times in order, to expire without scanning the map.
    order: VecDeque<(i64, u64)>,
}

impl Suppressor {
    /// Admit each key at most once per `interval_ms`, remembering up to `max_keys` keys.
    pub fn new(interval_ms: i64, max_keys: usize) -> Self {
        Self {
            interval_ms,
            max_keys: max_keys.max(1),
            last: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `key` may be counted at `now_ms`; if so it is remembered.
    pub fn admit(&mut self, key: u64, now_ms: i64) -> bool {
        while let Some(&(at, k)) = self.order.front() {
            let expired = now_ms - at >= self.interval_ms;
            if !expired && self.order.len() < self.max_keys {
                break;
            }
            self.order.pop_front();
            if self.last.get(&k) == Some(&at) {
                self.last.remove(&k);
            }
        }
        if self.interval_ms <= 0 {
            return true;
        }
        if self
            .last
            .get(&key)
            .is_some_and(|&at| now_ms - at < self.interval_ms)
        {
            return false;
        }
        self.last.insert(key, now_ms);
        self.order.push_back((now_ms, key));
        true
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_counts_once_per_interval() {
        let mut s = Suppressor::new(10_000, 100);
        assert!(s.admit(1, 0));
        assert!(!s.admit(1, 9_999));
        assert!(s.admit(2, 5_000), "other sources are independent");
        assert!(s.admit(1, 10_000), "the interval has passed");
        assert!(!s.admit(2, 14_999));
    }

    #[test]
    fn memory_stays_bounded_and_expires_lazily() {
        let mut s = Suppressor::new(60_000, 3);
        for k in 0..10 {
            assert!(s.admit(k, 0));
        }
        assert!(s.len() <= 3);
        assert!(s.admit(100, 120_000));
        assert_eq!(s.len(), 1, "everything older than the interval expired");
    }

    #[test]
    fn zero_interval_admits_everything() {
        let mut s = Suppressor::new(0, 3);
        assert!(s.admit(1, 0) && s.admit(1, 0));
    }
}
