//! A site's page views over a range of days, from per-day page rows kept in memory.
//!
//! Ranking a site's pages over a range sums every page's counter rows of the range: 962 k
//! rows for a year of a site with 3,000 pages, each a random read on disk. Here each day's
//! page rows, once read, are kept as one compact list, and a range is the sum of its days'
//! lists, which takes milliseconds.
//!
//! Contract (both backends; `tests/it/store_conformance.rs` proves it through the top pages):
//! - **Exact, never stale.** A day's page rows are kept with the views of that day's
//!   whole-site rows (one per source, the day's *stamp*), read in the same snapshot, and used
//!   only while the stamp is unchanged. Every write that adds views to a page row adds the
//!   same views to the whole-site row of its day and source in the same transaction (ingest
//!   and record imports both commit through one batch writer), and views only grow, so an
//!   unchanged stamp means unchanged page rows. Whatever sets, removes or rewrites page rows
//!   otherwise (daily aggregate imports, retention of page rows, `verify --repair`) bumps the
//!   store's generation ([`super::daysets::BUMP_GENERATION`]) in its transaction, and a read
//!   that sees a new generation drops everything kept. So another process that writes the
//!   same database is seen at the next read.
//! - **Bounded.** The kept lists stay under [`BUDGET_BYTES`] (estimated); past it everything
//!   is dropped and rebuilt by the reads that follow.
//!
//! What is kept is process memory only: a fresh process reads each day once (the cold read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Estimated bytes of kept lists above which everything is dropped.
pub(crate) const BUDGET_BYTES: usize = 32 << 20;

/// Estimated bytes per kept day beyond its list: the map entry and the shared pointer.
const BYTES_PER_DAY: usize = 64;

/// The views of the whole-site rows of one day, by source code (0, 1, 2).
pub(crate) type Stamp = [i64; 3];

/// One counter row as read: (page scope or day, source code, views).
pub(crate) type DayRow = (i64, i64, i64);

/// One page's views on one day, as kept: views past `u32::MAX` keep the day out of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    scope: i64,
    web: u32,
    badge: u32,
}

/// A page's views summed over a range: web (sources 0 and 2) and badge (source 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PageViews {
    pub(crate) web: u64,
    pub(crate) badge: u64,
}

struct KeptDay {
    stamp: Stamp,
    pages: Arc<[Kept]>,
}

struct Inner {
    generation: i64,
    kept: HashMap<(i64, i64), KeptDay>,
    bytes: usize,
}

/// The kept per-day page rows of one store (see the module docs).
pub(crate) struct DayPages {
    inner: Mutex<Inner>,
    budget: usize,
}

impl Default for DayPages {
    fn default() -> Self {
        Self::with_budget(BUDGET_BYTES)
    }
}

impl DayPages {
    /// Kept lists that drop everything past `budget` estimated bytes.
    pub(crate) fn with_budget(budget: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                generation: 0,
                kept: HashMap::new(),
                bytes: 0,
            }),
            budget,
        }
    }

    /// Estimated bytes of the kept lists.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.inner.lock().map_or(0, |inner| inner.bytes)
    }

    /// Begin summing the page views of the site whose whole-site scope is `site_scope` over
    /// `days`, each a day and its stamp read now at generation `generation` (a day without
    /// whole-site rows has the stamp `[0, 0, 0]`: daily imports may still have given it page
    /// rows). The days not kept are [`PageSum::missing`]: the caller reads each one's page
    /// rows and hands them to [`PageSum::add_day`].
    pub(crate) fn sum(
        &self,
        generation: i64,
        site_scope: i64,
        days: &[(i64, Stamp)],
    ) -> PageSum<'_> {
        let mut sum = PageSum {
            owner: self,
            generation,
            site_scope,
            totals: HashMap::default(),
            missing: Vec::new(),
        };
        let Ok(mut inner) = self.inner.lock() else {
            // A poisoned lock keeps nothing: every day is read.
            sum.missing = days.to_vec();
            return sum;
        };
        if inner.generation != generation || inner.bytes > self.budget {
            inner.generation = generation;
            inner.kept = HashMap::new();
            inner.bytes = 0;
        }
        let mut lists = Vec::new();
        for &(day, stamp) in days {
            match inner.kept.get(&(site_scope, day)) {
                Some(kept) if kept.stamp == stamp => lists.push(Arc::clone(&kept.pages)),
                _ => sum.missing.push((day, stamp)),
            }
        }
        drop(inner);
        for list in lists {
            for page in list.iter() {
                sum.add(page.scope, u64::from(page.web), u64::from(page.badge));
            }
        }
        sum
    }
}

/// One range sum in progress (see [`DayPages::sum`]).
pub(crate) struct PageSum<'a> {
    owner: &'a DayPages,
    generation: i64,
    site_scope: i64,
    totals: HashMap<i64, PageViews, foldhash::fast::RandomState>,
    missing: Vec<(i64, Stamp)>,
}

impl PageSum<'_> {
    /// The days to read, each with its stamp, in the order given.
    pub(crate) fn missing(&self) -> &[(i64, Stamp)] {
        &self.missing
    }

    fn add(&mut self, scope: i64, web: u64, badge: u64) {
        let total = self.totals.entry(scope).or_default();
        total.web = total.web.saturating_add(web);
        total.badge = total.badge.saturating_add(badge);
    }

    /// Add one missing day's page rows, each (page scope, source code, views), read in the
    /// same snapshot as its `stamp`; the day is kept for the reads that follow.
    pub(crate) fn add_day(&mut self, day: i64, stamp: Stamp, rows: &[DayRow]) {
        let mut by_page: Vec<(i64, u64, u64)> = Vec::new();
        for &(scope, source, views) in rows {
            let views = views.max(0) as u64;
            let (web, badge) = if source == 1 { (0, views) } else { (views, 0) };
            match by_page.last_mut() {
                Some(last) if last.0 == scope => {
                    last.1 = last.1.saturating_add(web);
                    last.2 = last.2.saturating_add(badge);
                }
                _ => by_page.push((scope, web, badge)),
            }
        }
        for &(scope, web, badge) in &by_page {
            self.add(scope, web, badge);
        }
        let kept: Option<Arc<[Kept]>> = by_page
            .iter()
            .map(|&(scope, web, badge)| {
                Some(Kept {
                    scope,
                    web: u32::try_from(web).ok()?,
                    badge: u32::try_from(badge).ok()?,
                })
            })
            .collect();
        if let Some(pages) = kept
            && let Ok(mut inner) = self.owner.inner.lock()
            && inner.generation == self.generation
        {
            let bytes = std::mem::size_of_val(&*pages) + BYTES_PER_DAY;
            let old = inner
                .kept
                .insert((self.site_scope, day), KeptDay { stamp, pages });
            let freed = old.map_or(0, |old| std::mem::size_of_val(&*old.pages) + BYTES_PER_DAY);
            inner.bytes = inner.bytes.saturating_sub(freed) + bytes;
        }
    }

    /// Every page with a row in the range and its summed views.
    pub(crate) fn totals(self) -> impl Iterator<Item = (i64, PageViews)> {
        self.totals.into_iter()
    }
}

/// The stamp of every day `from..=to` from the whole-site rows (day, source code, views) of
/// the range; a day without rows has the stamp `[0, 0, 0]`.
pub(crate) fn stamps(
    rows: impl IntoIterator<Item = DayRow>,
    (from, to): (i64, i64),
) -> Vec<(i64, Stamp)> {
    let mut by_day: HashMap<i64, Stamp> = HashMap::new();
    for (day, source, views) in rows {
        if let Some(slot) = by_day.entry(day).or_default().get_mut(source as usize) {
            *slot = views;
        }
    }
    (from..=to)
        .map(|day| (day, by_day.get(&day).copied().unwrap_or_default()))
        .collect()
}

fn best(v: &PageViews) -> u64 {
    v.web.max(v.badge)
}

/// The pages of `totals` that can be among the `limit` best by their larger count (ties are
/// broken by path, so every page tied with the last place is one); the caller names them and
/// offers them to [`Ranked`].
pub(crate) fn candidates(
    totals: impl Iterator<Item = (i64, PageViews)>,
    limit: usize,
) -> Vec<(i64, PageViews)> {
    let mut all: Vec<(i64, PageViews)> = totals.collect();
    if limit == 0 || all.is_empty() {
        return Vec::new();
    }
    all.sort_unstable_by_key(|(_, v)| std::cmp::Reverse(best(v)));
    let cut = best(&all[(limit - 1).min(all.len() - 1)].1);
    all.retain(|(_, v)| best(v) >= cut);
    all
}

/// The `limit` best of the named candidates as they are named: larger count first, ties by
/// path. Only the best `limit` so far are held (a site of 100,000 pages viewed once each has
/// every page tied for the last place, and each path can be long).
pub(crate) struct Ranked {
    limit: usize,
    /// In rank order (the better sorts first; paths are unique in a site), the worst on top.
    held: std::collections::BinaryHeap<(std::cmp::Reverse<u64>, String, i64, PageViews)>,
}

impl Ranked {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            held: std::collections::BinaryHeap::with_capacity(limit.min(1024) + 1),
        }
    }

    /// Offer a named candidate: held while it is among the best `limit` so far.
    pub(crate) fn offer(&mut self, scope: i64, path: String, views: PageViews) {
        if self.limit == 0 {
            return;
        }
        self.held
            .push((std::cmp::Reverse(best(&views)), path, scope, views));
        if self.held.len() > self.limit {
            self.held.pop();
        }
    }

    /// The best, best first.
    pub(crate) fn best(self) -> Vec<(i64, String, PageViews)> {
        self.held
            .into_sorted_vec()
            .into_iter()
            .map(|(_, path, scope, views)| (scope, path, views))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sum `days` (day, stamp, rows) through `pages`; returns the sorted totals and how many
    /// days were read.
    fn sum(
        pages: &DayPages,
        generation: i64,
        days: &[(i64, Stamp, Vec<DayRow>)],
    ) -> (Vec<(i64, PageViews)>, usize) {
        let stamps: Vec<(i64, Stamp)> = days.iter().map(|(d, s, _)| (*d, *s)).collect();
        let mut sum = pages.sum(generation, 1, &stamps);
        let missing = sum.missing().to_vec();
        for (day, stamp) in &missing {
            if let Some((_, _, rows)) = days.iter().find(|(d, _, _)| d == day) {
                sum.add_day(*day, *stamp, rows);
            }
        }
        let mut totals: Vec<_> = sum.totals().collect();
        totals.sort_by_key(|(scope, _)| *scope);
        (totals, missing.len())
    }

    fn views(web: u64, badge: u64) -> PageViews {
        PageViews { web, badge }
    }

    #[test]
    fn a_range_sums_its_days_and_kept_days_are_not_read_again() {
        let pages = DayPages::default();
        let days = vec![
            (1, [5, 1, 0], vec![(2, 0, 3), (2, 1, 1), (3, 0, 2)]),
            (2, [4, 0, 2], vec![(2, 0, 1), (2, 2, 2), (4, 0, 3)]),
        ];
        let expected = vec![(2, views(6, 1)), (3, views(2, 0)), (4, views(3, 0))];
        assert_eq!(sum(&pages, 0, &days), (expected.clone(), 2));
        assert_eq!(sum(&pages, 0, &days), (expected, 0));
    }

    #[test]
    fn a_changed_stamp_or_generation_reads_the_day_again() {
        let pages = DayPages::default();
        let mut days = vec![
            (1, [3, 0, 0], vec![(2, 0, 3)]),
            (2, [1, 0, 0], vec![(3, 0, 1)]),
        ];
        assert_eq!(sum(&pages, 0, &days).1, 2);
        days[1] = (2, [2, 0, 0], vec![(3, 0, 2)]);
        assert_eq!(
            sum(&pages, 0, &days),
            (vec![(2, views(3, 0)), (3, views(2, 0))], 1)
        );
        // Same stamp, other rows: only a generation bump may do that.
        days[0].2 = vec![(5, 0, 3)];
        assert_eq!(
            sum(&pages, 1, &days),
            (vec![(3, views(2, 0)), (5, views(3, 0))], 2)
        );
    }

    #[test]
    fn past_the_budget_everything_is_dropped_and_sums_stay_exact() {
        let pages = DayPages::with_budget(300);
        let days: Vec<_> = (0..10)
            .map(|d| (d, [10, 0, 0], (0..10).map(|p| (p, 0, 1)).collect()))
            .collect();
        let expected: Vec<_> = (0..10).map(|p| (p, views(10, 0))).collect();
        assert_eq!(sum(&pages, 0, &days), (expected.clone(), 10));
        assert_eq!(sum(&pages, 0, &days), (expected, 10));
    }

    #[test]
    fn views_past_u32_are_summed_but_not_kept() {
        let pages = DayPages::default();
        let big = i64::from(u32::MAX) + 1;
        let days = vec![(1, [big, 0, 0], vec![(2, 0, big)])];
        assert_eq!(sum(&pages, 0, &days), (vec![(2, views(big as u64, 0))], 1));
        assert_eq!(sum(&pages, 0, &days).1, 1);
    }

    #[test]
    fn only_pages_that_can_make_the_cut_are_named_and_ties_go_by_path() {
        let totals = vec![
            (1, views(5, 0)),
            (2, views(0, 9)),
            (3, views(5, 1)),
            (4, views(1, 0)),
            (5, views(5, 0)),
        ];
        let mut asked: Vec<i64> = candidates(totals.into_iter(), 2)
            .iter()
            .map(|(scope, _)| *scope)
            .collect();
        asked.sort_unstable();
        assert_eq!(asked, [1, 2, 3, 5]);
        let named = [
            (1, "/b", views(5, 0)),
            (2, "/z", views(0, 9)),
            (3, "/c", views(5, 1)),
            (5, "/a", views(5, 0)),
        ];
        let names = |limit: usize| -> Vec<String> {
            let mut ranked = Ranked::new(limit);
            for (scope, path, v) in &named {
                ranked.offer(*scope, (*path).to_owned(), *v);
            }
            ranked.best().into_iter().map(|(_, p, _)| p).collect()
        };
        assert_eq!(names(2), ["/z", "/a"]);
        assert_eq!(names(3), ["/z", "/a", "/b"]);
        assert_eq!(names(9), ["/z", "/a", "/b", "/c"]);
        assert!(names(0).is_empty());
    }
}
