//! Sealing finished days: which days of a site can no longer change, and the pass that turns
//! them into stored day segments (`core::segment`, `store::SegmentSource::seal_day`).
//!
//! Contract:
//! - A local day is sealable once it has been over for [`SEAL_AFTER`]: most of its late
//!   arrivals (engagement reports of its last page views, retried hits) are in by then. What
//!   still arrives for it later (a retry hours late, an import) deletes its segment in the
//!   batch that writes it (the store's contract), and a later pass seals it again: a sealed
//!   day is never stale, only sealed more than once.
//! - A pass seals days oldest first, site by site, at most `max_days` per call; days whose seal
//!   lost a race with an import are left for the next pass. Raw events are pruned only after
//!   a complete pass, so a day's segment exists before its raw events go (`lib::upkeep_loop`).
//! - After a complete pass, [`Sealer::roll_up`] stores the month rollups of what it sealed
//!   (`store::rollups`): a month whose sealed days changed is counted again whole.

use std::sync::Arc;

use jiff::Timestamp;
use jiff::civil::Date;

use crate::core::day::SiteZone;
use crate::store::analytics::{Analytics, AnalyticsError};
use crate::store::{SegmentSource, SiteStore, StoreError};

/// How long a day must have been over before it is sealed.
pub const SEAL_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// Days read per `unsealed_days` call.
const BATCH: u32 = 64;

/// The last local day in `zone` that has been over for [`SEAL_AFTER`] at `now`.
pub fn sealable_through(zone: &SiteZone, now: Timestamp) -> Option<Date> {
    let edge = now.checked_sub(SEAL_AFTER).ok()?;
    // The day containing `edge` is not over by SEAL_AFTER; the one before it is.
    zone.day_of(edge).yesterday().ok()
}

/// What seals the days of every configured site.
pub struct Sealer {
    pub sites: Arc<dyn SiteStore>,
    pub segments: Arc<dyn SegmentSource>,
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SealReport {
    /// Days sealed.
    pub sealed: u64,
    /// Whether every sealable day is now sealed.
    pub complete: bool,
}

impl Sealer {
    /// Seal up to `max_days` sealable days as of `now`.
    pub async fn pass(&self, now: Timestamp, max_days: u64) -> Result<SealReport, StoreError> {
        let mut report = SealReport {
            sealed: 0,
            complete: true,
        };
        for site in self.sites.list_sites().await? {
            let Some(through) = sealable_through(&site.zone, now) else {
                continue;
            };
            loop {
                let days = self
                    .segments
                    .unsealed_days(&site.id, through, BATCH)
                    .await?;
                let mut progressed = false;
                for day in &days {
                    if report.sealed >= max_days {
                        report.complete = false;
                        return Ok(report);
                    }
                    let (start, _) = site.zone.span(*day, *day);
                    if self
                        .segments
                        .seal_day(&site.id, *day, start.as_millisecond())
                        .await?
                    {
                        report.sealed += 1;
                        progressed = true;
                    } else {
                        // Raced a write to the day: the next pass seals it.
                        report.complete = false;
                    }
                }
                if days.len() < BATCH as usize || !progressed {
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Store the month rollups (`store::rollups`) of every site's days sealed as of `now`
    /// where they are missing or out of date; how many months were stored. Counting work at
    /// the analytics' lower priority: live hits go first.
    pub async fn roll_up(&self, now: Timestamp) -> Result<u64, AnalyticsError> {
        // Nothing of a pass is worth keeping in memory: each month is counted once.
        let analytics = Analytics::new(Arc::clone(&self.segments), 0);
        let mut rolled = 0;
        for site in self.sites.list_sites().await? {
            let Some(through) = sealable_through(&site.zone, now) else {
                continue;
            };
            // One site's failure leaves the others' rollups to be done.
            match analytics.roll_up(&site.id, &site.zone, through).await {
                Ok(n) => rolled += n,
                Err(e) => {
                    tracing::warn!(site = %site.id, error = %e, "rolling up a site's months failed; will retry")
                }
            }
        }
        Ok(rolled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_seals_an_hour_after_it_ends_in_its_zone() {
        let zone = SiteZone::parse("Europe/Berlin").expect("zone");
        // 2026-03-01 ends in Berlin at 23:00 UTC; sealable from 2026-03-02T00:00Z.
        let before: Timestamp = "2026-03-01T23:59:59Z".parse().expect("ts");
        let after: Timestamp = "2026-03-02T00:00:00Z".parse().expect("ts");
        assert_eq!(
            sealable_through(&zone, before),
            Some(jiff::civil::date(2026, 2, 28))
        );
        assert_eq!(
            sealable_through(&zone, after),
            Some(jiff::civil::date(2026, 3, 1))
        );
    }
}
