//! Views not counted, by site, local day and [`Reason`]: held in memory ([`FilterTally`]),
//! flushed to the store every few seconds and at shutdown, and added to the stored numbers on
//! every read, so the dashboard's "Not counted" panel shows a dropped view at once.
//!
//! Contract: every reason except the repeat gate's is also counted in `/metrics`
//! (`tally_filtered_total{reason}`; refused origins are already in
//! `tally_rejected_total{code="origin_not_allowed"}`). A refused origin is also logged, at most
//! once per site per [`ORIGIN_LOG_EVERY`], naming the origin and the site's allowed ones: the
//! usual cause is a site registered for another origin than the page that sends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use jiff::civil::Date;

use crate::core::clock::Clock;
use crate::core::day::SiteZone;
use crate::core::filtered::{FilterTally, FilteredCounts, Reason};
use crate::core::ids::SiteId;
use crate::core::site::Site;
use crate::metrics::{Metrics, ReasonLabel};
use crate::store::EventSink;

/// Most (site, day, reason) keys held between two flushes (5 reasons × 2 days × 40,000 sites;
/// the flush runs every few seconds).
const TALLY_KEYS: usize = 400_000;

/// How often the tallies are written to the store.
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// A site's refused origins are logged at most this often.
pub const ORIGIN_LOG_EVERY: Duration = Duration::from_secs(600);

/// Sites whose last origin log line is remembered; the memory is cleared when full.
const ORIGIN_LOG_SITES: usize = 10_000;

/// The tallies of views not counted.
pub struct NotCounted {
    tally: Mutex<FilterTally>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// When each site's refused origins were last logged.
    origin_logged: Mutex<HashMap<SiteId, Instant>>,
}

impl NotCounted {
    pub fn new(metrics: Arc<Metrics>, clock: Arc<dyn Clock>) -> Self {
        Self {
            tally: Mutex::new(FilterTally::new(TALLY_KEYS)),
            metrics,
            clock,
            origin_logged: Mutex::new(HashMap::new()),
        }
    }

    /// `n` views of `site` not counted for `reason`, on today's local day of `zone`.
    pub fn record(&self, site: &SiteId, zone: &SiteZone, reason: Reason, n: u64) {
        if !matches!(reason, Reason::Suppressed | Reason::OriginNotAllowed) {
            self.metrics
                .filtered
                .get_or_create(&ReasonLabel {
                    reason: reason.name(),
                })
                .inc_by(n);
        }
        let day = zone.day_of(self.clock.now());
        let kept = self
            .tally
            .lock()
            .map(|mut t| t.record(site, day, reason, n))
            .unwrap_or(false);
        if !kept {
            self.metrics.filtered_untallied.inc_by(n);
        }
    }

    /// A counting request for `site` refused because its page's `origin` is not one of the
    /// site's: tallied, and logged at most once per site per [`ORIGIN_LOG_EVERY`].
    pub fn origin_refused(&self, site: &Site, origin: &str) {
        self.record(&site.id, &site.zone, Reason::OriginNotAllowed, 1);
        let now = Instant::now();
        let mut logged = self
            .origin_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if logged
            .get(&site.id)
            .is_some_and(|at| now.duration_since(*at) < ORIGIN_LOG_EVERY)
        {
            return;
        }
        if logged.len() >= ORIGIN_LOG_SITES {
            logged.clear();
        }
        logged.insert(site.id.clone(), now);
        tracing::warn!(
            site = %site.id,
            origin,
            allowed = %site.origins.join(" "),
            "hits refused: origin not allowed for this site (add it with `tally site add {} \
             --origin {origin}`; logged at most every {} min per site)",
            site.id,
            ORIGIN_LOG_EVERY.as_secs() / 60,
        );
    }

    /// The tallies not yet flushed for `site` over `from..=to` (a reader adds them to the
    /// stored ones).
    pub fn pending(&self, site: &SiteId, from: Date, to: Date) -> FilteredCounts {
        self.tally
            .lock()
            .map(|t| t.pending(site, from, to))
            .unwrap_or_default()
    }

    /// Hand the pending tallies to the store; on failure they go back and wait for the next
    /// flush.
    pub async fn flush(&self, store: &dyn EventSink) {
        let rows = match self.tally.lock() {
            Ok(mut t) if !t.is_empty() => t.drain(),
            _ => return,
        };
        if let Err(e) = store.add_filtered(&rows).await {
            tracing::warn!(error = %e, "storing the tallies of views not counted failed; will retry");
            if let Ok(mut t) = self.tally.lock() {
                t.restore(rows);
            }
        }
    }

    /// Flush every [`FLUSH_EVERY`] until `stop` changes.
    pub async fn flush_loop(
        &self,
        store: Arc<dyn EventSink>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(FLUSH_EVERY) => self.flush(store.as_ref()).await,
            }
        }
    }
}
