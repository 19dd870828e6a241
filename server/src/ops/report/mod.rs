//! Email reports: a summary of a site's week or month (`content`), sent through an SMTP relay
//! (`mail`), on schedule by every collector with `--smtp` ([`report_loop`]) or at once by
//! `tally site report --now` ([`send_now`]).
//!
//! Contract:
//! - A period (Monday–Sunday, or a calendar month, of the site's local days) is due once it
//!   has ended; a schedule sends only the last ended period, and none that ended before the
//!   schedule was added.
//! - Exactly once per period across collectors and restarts: a send is claimed through
//!   [`ReportStore::claim_send`] (an atomic lease in the database, [`LEASE`]) before the mail
//!   goes out and marked sent after. A collector that dies between the two leaves the lease
//!   to expire, and the period may then go out once more: at most one duplicate, never a
//!   missed period.
//! - A failed send is retried with backoff ([`backoff`]: 1 min doubling to 1 h), at most
//!   [`MAX_ATTEMPTS`] times per period; then it is given up and logged. Sends and failures
//!   are counted in `/metrics`, with a gauge of sends waiting for a retry.

pub mod content;
pub mod mail;

use std::sync::Arc;
use std::time::Duration;

use crate::core::clock::Clock;
use crate::core::period::{Every, Period};
use crate::core::site::Site;
use crate::metrics::Metrics;
use crate::store::{ReportSchedule, SendKey, Store};
use content::Summary;
use mail::{MailError, Mailer};

/// How long a claimed send belongs to its collector: longer than a send can take (the SMTP
/// timeouts), so a live holder never loses it mid-send.
pub const LEASE: Duration = Duration::from_secs(10 * 60);

/// Attempts per period before a report is given up.
pub const MAX_ATTEMPTS: u32 = 10;

/// The wait after the `failed`-th failure: 1 min, doubling, at most 1 h.
pub fn backoff(failed: u32) -> Duration {
    let minutes = 1u64 << failed.saturating_sub(1).min(6);
    Duration::from_secs(minutes.min(60) * 60)
}

/// A report could not be made or sent.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Mail(#[from] MailError),
    #[error("rendering the report failed: {0}")]
    Render(String),
}

/// Make and send the report of `period` of `site` to `to`.
pub async fn send_report(
    store: &dyn Store,
    mailer: &Mailer,
    site: &Site,
    to: &str,
    period: Period,
) -> Result<(), ReportError> {
    let to = mail::parse_address(to)?;
    let summary = Summary::gather(store, site, period).await?;
    let html = summary
        .html()
        .map_err(|e| ReportError::Render(e.to_string()))?;
    mailer
        .send(&to, &summary.subject(), summary.text(), html)
        .await?;
    Ok(())
}

/// `tally site report --now`: send the last ended period as of `now`, outside the schedule
/// (no lease taken, nothing recorded). Returns the period sent.
pub async fn send_now(
    store: &dyn Store,
    mailer: &Mailer,
    site: &Site,
    to: &str,
    every: Every,
    now: jiff::Timestamp,
) -> Result<Period, ReportError> {
    let period = Period::last_complete(every, site.zone.day_of(now));
    send_report(store, mailer, site, to, period).await?;
    Ok(period)
}

/// The scheduled sends of one collector.
pub struct Reporter {
    pub store: Arc<dyn Store>,
    pub mailer: Mailer,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    /// This collector's name in the leases (random per process).
    pub holder: String,
}

impl Reporter {
    /// Send every due report this collector can claim; one failure stops no other.
    pub async fn pass(&self) {
        let reports = match self.store.list_reports(None).await {
            Ok(reports) => reports,
            Err(e) => return tracing::warn!(error = %e, "reading report schedules failed"),
        };
        for report in reports {
            if let Err(e) = self.due(&report).await {
                tracing::warn!(site = %report.site, error = %e, "a scheduled report failed");
            }
        }
        match self.store.retries_waiting().await {
            Ok(n) => {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                self.metrics.reports_retry_waiting.set(n);
            }
            Err(e) => tracing::debug!(error = %e, "counting report retries failed"),
        }
        self.metrics.report_checks.inc();
    }

    /// Send `report`'s last ended period if it is due and this collector claims it.
    async fn due(&self, report: &ReportSchedule) -> Result<(), ReportError> {
        let Some(site) = self.store.get_site(&report.site).await? else {
            return Ok(());
        };
        let now = self.clock.now();
        let period = Period::last_complete(report.every, site.zone.day_of(now));
        let added = jiff::Timestamp::from_millisecond(report.created_ms)
            .map_or(period.last, |t| site.zone.day_of(t));
        if period.last < added {
            return Ok(());
        }
        let key = SendKey {
            site: report.site.clone(),
            recipient: report.recipient.clone(),
            every: report.every,
            period: period.first,
        };
        let now_ms = now.as_millisecond();
        let lease_until = now_ms.saturating_add(LEASE.as_millis() as i64);
        let Some(failed) = self
            .store
            .claim_send(&key, &self.holder, now_ms, lease_until)
            .await?
        else {
            return Ok(());
        };
        let sent = send_report(
            self.store.as_ref(),
            &self.mailer,
            &site,
            &report.recipient,
            period,
        )
        .await;
        let done_ms = self.clock.now().as_millisecond();
        match sent {
            Ok(()) => {
                self.metrics.reports_sent.inc();
                if self.store.mark_sent(&key, &self.holder, done_ms).await? {
                    tracing::info!(site = %key.site, every = %key.every, period = %key.period,
                        "report sent");
                } else {
                    // The send outlived its lease and another collector took it over.
                    tracing::warn!(site = %key.site, every = %key.every, period = %key.period,
                        "report sent after its lease expired; it may go out twice");
                }
                Ok(())
            }
            Err(e) => {
                self.metrics.report_failures.inc();
                let failed = failed + 1;
                let (next, given_up) = if failed >= MAX_ATTEMPTS {
                    (i64::MAX, true)
                } else {
                    let wait = backoff(failed).as_millis() as i64;
                    (done_ms.saturating_add(wait), false)
                };
                let why = e.to_string();
                self.store
                    .mark_failed(&key, &self.holder, &why, next)
                    .await?;
                if given_up {
                    tracing::error!(site = %key.site, every = %key.every, period = %key.period,
                        attempts = failed, error = %why, "report given up after its last attempt");
                } else {
                    tracing::warn!(site = %key.site, every = %key.every, period = %key.period,
                        attempts = failed, error = %why, "report not sent; will retry");
                }
                Ok(())
            }
        }
    }
}

/// Check due reports now and every `interval` until `stop` changes.
pub async fn report_loop(
    reporter: Reporter,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = reporter.pass() => {}
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_minute_to_an_hour() {
        let minutes: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs() / 60).collect();
        assert_eq!(minutes, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
