//! What was not counted, and why: a tally of filtered and refused views per site, local day and
//! [`Reason`], so a site's owner can see what was dropped (dashboard "Not counted", the
//! `/api/v1/sites/{site}/filtered` stats endpoint).
//!
//! Contract: [`FilterTally::record`] adds one to a (site, day, reason) key in memory;
//! [`FilterTally::drain`] hands every pending key to the store (the collector flushes every few
//! seconds and at shutdown) and starts afresh; [`FilterTally::pending`] is what a reader adds
//! to the stored numbers, so a filtered view shows at once. Memory is bounded by `max_keys`:
//! once that many keys are pending, views of new keys are only counted in [`FilterTally::lost`]
//! (and in `/metrics`) until the next drain. These numbers describe dropped traffic: they are
//! not acknowledged hits, and a crash loses at most the last flush interval of them.

use std::collections::HashMap;

use jiff::civil::Date;
use serde::Serialize;

use crate::core::ids::SiteId;

/// Why a view was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The user agent is on the bot list.
    Bot,
    /// No user agent at all (scripts and tools; no browser sends none).
    EmptyUserAgent,
    /// A badge or pixel fetch repeated by the same source within the repeat interval.
    Suppressed,
    /// Over the sender's address allowance: a badge or pixel served without counting, or a
    /// hit answered 429 (the snippet retries those later, and then they may count).
    RateLimited,
    /// A hit, batch record or pixel fetch sent from a page whose origin is not one of the
    /// site's allowed origins (answered 403 `origin_not_allowed`).
    OriginNotAllowed,
}

impl Reason {
    /// Every reason, in the order they are shown.
    pub const ALL: [Reason; 5] = [
        Reason::Bot,
        Reason::EmptyUserAgent,
        Reason::Suppressed,
        Reason::RateLimited,
        Reason::OriginNotAllowed,
    ];

    /// The stable name used in JSON, metrics and the dashboard.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Bot => "bot",
            Reason::EmptyUserAgent => "empty_user_agent",
            Reason::Suppressed => "suppressed",
            Reason::RateLimited => "rate_limited",
            Reason::OriginNotAllowed => "origin_not_allowed",
        }
    }

    /// The stable number a store keeps.
    pub fn code(self) -> u8 {
        match self {
            Reason::Bot => 1,
            Reason::EmptyUserAgent => 2,
            Reason::Suppressed => 3,
            Reason::RateLimited => 4,
            Reason::OriginNotAllowed => 5,
        }
    }

    /// The reason stored as `code`, if any.
    pub fn from_code(code: i64) -> Option<Reason> {
        Reason::ALL
            .into_iter()
            .find(|r| i64::from(r.code()) == code)
    }
}

/// Views not counted over a range, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FilteredCounts {
    pub bot: u64,
    pub empty_user_agent: u64,
    pub suppressed: u64,
    pub rate_limited: u64,
    pub origin_not_allowed: u64,
}

impl FilteredCounts {
    /// Add `n` views of `reason`.
    pub fn add(&mut self, reason: Reason, n: u64) {
        let slot = match reason {
            Reason::Bot => &mut self.bot,
            Reason::EmptyUserAgent => &mut self.empty_user_agent,
            Reason::Suppressed => &mut self.suppressed,
            Reason::RateLimited => &mut self.rate_limited,
            Reason::OriginNotAllowed => &mut self.origin_not_allowed,
        };
        *slot = slot.saturating_add(n);
    }

    /// The count of `reason`.
    pub fn get(&self, reason: Reason) -> u64 {
        match reason {
            Reason::Bot => self.bot,
            Reason::EmptyUserAgent => self.empty_user_agent,
            Reason::Suppressed => self.suppressed,
            Reason::RateLimited => self.rate_limited,
            Reason::OriginNotAllowed => self.origin_not_allowed,
        }
    }

    /// Every reason summed.
    pub fn total(&self) -> u64 {
        Reason::ALL
            .into_iter()
            .fold(0u64, |sum, r| sum.saturating_add(self.get(r)))
    }

    /// Both added together.
    pub fn merge(&mut self, other: &FilteredCounts) {
        for r in Reason::ALL {
            self.add(r, other.get(r));
        }
    }
}

/// One (site, local day, reason) count handed to a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilteredRow {
    pub site: SiteId,
    pub day: Date,
    pub reason: Reason,
    pub count: u64,
}

/// Filtered views not yet handed to the store.
#[derive(Debug)]
pub struct FilterTally {
    max_keys: usize,
    pending: HashMap<(SiteId, Date, Reason), u64>,
    lost: u64,
}

impl FilterTally {
    /// A tally holding at most `max_keys` pending keys.
    pub fn new(max_keys: usize) -> Self {
        Self {
            max_keys: max_keys.max(1),
            pending: HashMap::new(),
            lost: 0,
        }
    }

    /// One view of `site` on local `day` not counted for `reason`, times `n`. False when the
    /// tally is full and the view was only counted as lost.
    pub fn record(&mut self, site: &SiteId, day: Date, reason: Reason, n: u64) -> bool {
        let key = (site.clone(), day, reason);
        if let Some(count) = self.pending.get_mut(&key) {
            *count = count.saturating_add(n);
            return true;
        }
        if self.pending.len() >= self.max_keys {
            self.lost = self.lost.saturating_add(n);
            return false;
        }
        self.pending.insert(key, n);
        true
    }

    /// Every pending count, in a fixed order (site, day, reason), leaving the tally empty.
    pub fn drain(&mut self) -> Vec<FilteredRow> {
        let mut rows: Vec<FilteredRow> = self
            .pending
            .drain()
            .map(|((site, day, reason), count)| FilteredRow {
                site,
                day,
                reason,
                count,
            })
            .collect();
        rows.sort_by(|a, b| (&a.site, a.day, a.reason).cmp(&(&b.site, b.day, b.reason)));
        rows
    }

    /// Put rows back after a failed flush (they count again at the next one).
    pub fn restore(&mut self, rows: Vec<FilteredRow>) {
        for row in rows {
            self.record(&row.site, row.day, row.reason, row.count);
        }
    }

    /// Pending counts of `site` for days in `from..=to`.
    pub fn pending(&self, site: &SiteId, from: Date, to: Date) -> FilteredCounts {
        let mut out = FilteredCounts::default();
        for ((s, day, reason), n) in &self.pending {
            if s == site && (from..=to).contains(day) {
                out.add(*reason, *n);
            }
        }
        out
    }

    /// Views not tallied per site because the tally was full (since start).
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Keys pending now.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// No key pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn site(s: &str) -> SiteId {
        SiteId::parse(s).expect("site")
    }

    #[test]
    fn records_accumulate_per_key_and_drain_in_order() {
        let mut t = FilterTally::new(10);
        let d = date(2026, 5, 10);
        assert!(t.record(&site("b"), d, Reason::Bot, 1));
        assert!(t.record(&site("a"), d, Reason::Suppressed, 2));
        assert!(t.record(&site("a"), d, Reason::Bot, 1));
        assert!(t.record(&site("a"), d, Reason::Bot, 1));
        let p = t.pending(&site("a"), d, d);
        assert_eq!((p.bot, p.suppressed, p.total()), (2, 2, 4));
        assert_eq!(
            t.pending(&site("a"), date(2026, 5, 11), date(2026, 5, 12))
                .total(),
            0
        );
        let rows = t.drain();
        let keys: Vec<(&str, Reason, u64)> = rows
            .iter()
            .map(|r| (r.site.as_str(), r.reason, r.count))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("a", Reason::Bot, 2),
                ("a", Reason::Suppressed, 2),
                ("b", Reason::Bot, 1)
            ]
        );
        assert!(t.is_empty());
        t.restore(rows);
        assert_eq!(t.pending(&site("a"), d, d).total(), 4);
    }

    #[test]
    fn a_full_tally_counts_new_keys_as_lost_and_keeps_counting_known_ones() {
        let mut t = FilterTally::new(2);
        let d = date(2026, 5, 10);
        assert!(t.record(&site("a"), d, Reason::Bot, 1));
        assert!(t.record(&site("b"), d, Reason::Bot, 1));
        assert!(!t.record(&site("c"), d, Reason::Bot, 5));
        assert!(t.record(&site("a"), d, Reason::Bot, 1));
        assert_eq!((t.len(), t.lost()), (2, 5));
        assert_eq!(t.pending(&site("a"), d, d).bot, 2);
    }

    #[test]
    fn reason_codes_round_trip() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_code(i64::from(r.code())), Some(r));
        }
        assert_eq!(Reason::from_code(0), None);
    }
}
