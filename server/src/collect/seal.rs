//! Sealing finished days: which days of a site can no longer change, and the pass that turns
//! them into stored day segments (`core::segment`, `store::SegmentSource::seal_day`).
//!
//! Contract:
//! - A local day is sealable once its end lies more than the accepted event window (back and
//!   ahead) plus [`MARGIN`] in the past: no collector whose clock is within the margin of
//!   this one accepts an event (or an engagement report) of it any more. Only imports write
//!   to such days, and they unseal what they write (the store's contract).
//! - A pass seals days oldest first, site by site, at most `max_days` per call; days whose seal
//!   lost a race with an import are left for the next pass. Raw events are pruned only after
//!   a complete pass, so a day's segment exists before its raw events go (`lib::upkeep_loop`).

use std::sync::Arc;

use jiff::Timestamp;
use jiff::civil::Date;

use crate::core::day::SiteZone;
use crate::core::hit::TimeWindow;
use crate::store::{SegmentSource, SiteStore, StoreError};

/// Slack beyond the event window for collectors whose clocks differ.
pub const MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// Days read per `unsealed_days` call.
const BATCH: u32 = 64;

/// The last local day in `zone` that no event can reach any more at `now`.
pub fn sealable_through(zone: &SiteZone, now: Timestamp, window: TimeWindow) -> Option<Date> {
    let edge = now
        .checked_sub(window.back)
        .and_then(|t| t.checked_sub(window.ahead))
        .and_then(|t| t.checked_sub(MARGIN))
        .ok()?;
    // The day containing `edge` may still be reached; the one before it cannot.
    zone.day_of(edge).yesterday().ok()
}

/// What seals the days of every configured site.
pub struct Sealer {
    pub sites: Arc<dyn SiteStore>,
    pub segments: Arc<dyn SegmentSource>,
    pub window: TimeWindow,
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
            let Some(through) = sealable_through(&site.zone, now, self.window) else {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_seals_after_the_window_and_the_margin() {
        let zone = SiteZone::utc();
        let window = TimeWindow::default();
        // 72 h + 5 min + 1 h after the end of 2026-03-01 is 2026-03-05T01:05.
        let before: Timestamp = "2026-03-05T01:04:59Z".parse().expect("ts");
        let after: Timestamp = "2026-03-05T01:05:00Z".parse().expect("ts");
        assert_eq!(
            sealable_through(&zone, before, window),
            Some(jiff::civil::date(2026, 2, 28))
        );
        assert_eq!(
            sealable_through(&zone, after, window),
            Some(jiff::civil::date(2026, 3, 1))
        );
    }
}
