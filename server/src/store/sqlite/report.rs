//! Email reports on SQLite: the schedules (`reports`), the lease of each send
//! (`report_sends`) and the visits read.
//!
//! A claim is one upsert (`INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`) on the one
//! writer connection: it creates the period's row or takes it over only when the row is not
//! sent, its lease has expired and its next try is due, so two stores on one file cannot
//! both win. Visits are counted from raw page views with `LAG` over each visitor's views.

use super::*;
use crate::core::period::Every;
use crate::store::{ReportSchedule, ReportStore, SendKey, VISIT_GAP_MS, Visits};

/// Visits of `site` over the local days `from..=to` (day numbers), by source.
pub(super) fn read_visits(
    conn: &Connection,
    site: &str,
    (from, to): (i64, i64),
    (lo, hi): ([u8; 16], [u8; 16]),
) -> Result<Visits, StoreError> {
    let mut stmt = conn.prepare_cached(
        "WITH v AS (SELECT e.source, e.at_ms - LAG(e.at_ms) OVER \
                      (PARTITION BY e.source, e.visitor ORDER BY e.at_ms) AS gap \
                    FROM events e JOIN site_keys k ON k.id = e.site AND k.name = ?1 \
                    WHERE e.event_id >= ?4 AND e.event_id < ?5 AND e.kind = 0 \
                      AND e.day BETWEEN ?2 AND ?3) \
         SELECT source, COUNT(*) FROM v WHERE gap IS NULL OR gap > ?6 GROUP BY source",
    )?;
    let mut rows = stmt.query(params![site, from, to, &lo[..], &hi[..], VISIT_GAP_MS])?;
    let mut visits = Visits::default();
    while let Some(row) = rows.next()? {
        let n = row.get::<_, i64>(1)?.max(0) as u64;
        if row.get::<_, i64>(0)? == crate::core::record::Source::Badge.code() {
            visits.badge += n;
        } else {
            visits.web += n;
        }
    }
    Ok(visits)
}

fn schedule(row: &rusqlite::Row<'_>) -> Result<ReportSchedule, StoreError> {
    let site: String = row.get(0)?;
    let every: String = row.get(2)?;
    Ok(ReportSchedule {
        site: SiteId::parse(&site).map_err(|e| StoreError::Invalid(format!("{site:?}: {e}")))?,
        recipient: row.get(1)?,
        every: Every::parse(&every).map_err(|e| StoreError::Invalid(e.to_string()))?,
        created_ms: row.get(3)?,
    })
}

impl SqliteStore {
    /// `UPDATE report_sends SET {set}` of `key`'s row while `holder` holds it and it is not
    /// sent; `set` reads `extra` as `?6` and `?7`. Whether the row was changed.
    async fn update_held(
        &self,
        key: &SendKey,
        holder: &str,
        set: &'static str,
        extra: (i64, Option<String>),
    ) -> Result<bool, StoreError> {
        let (key, holder) = (key.clone(), holder.to_owned());
        self.write(move |w| {
            let sql = format!(
                "UPDATE report_sends SET {set} WHERE site = ?1 AND recipient = ?2 \
                 AND every = ?3 AND period = ?4 AND holder = ?5 AND sent_ms IS NULL"
            );
            Ok(w.conn.execute(
                &sql,
                params![
                    key.site.as_str(),
                    key.recipient,
                    key.every.as_str(),
                    key.period.to_string(),
                    holder,
                    extra.0,
                    extra.1
                ],
            )? == 1)
        })
        .await
    }
}

#[async_trait]
impl ReportStore for SqliteStore {
    async fn add_report(&self, report: &ReportSchedule) -> Result<bool, StoreError> {
        let r = report.clone();
        self.write(move |w| {
            Ok(w.conn.execute(
                "INSERT OR IGNORE INTO reports (site, recipient, every, created_ms) \
                 VALUES (?1, ?2, ?3, ?4)",
                params![r.site.as_str(), r.recipient, r.every.as_str(), r.created_ms],
            )? == 1)
        })
        .await
    }

    async fn remove_report(
        &self,
        site: &SiteId,
        recipient: &str,
        every: Every,
    ) -> Result<bool, StoreError> {
        let (site, recipient) = (site.as_str().to_owned(), recipient.to_owned());
        self.write(move |w| {
            let tx = w
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let key = params![site, recipient, every.as_str()];
            let removed = tx.execute(
                "DELETE FROM reports WHERE site = ?1 AND recipient = ?2 AND every = ?3",
                key,
            )?;
            tx.execute(
                "DELETE FROM report_sends WHERE site = ?1 AND recipient = ?2 AND every = ?3",
                key,
            )?;
            tx.commit()?;
            Ok(removed == 1)
        })
        .await
    }

    async fn list_reports(&self, site: Option<&SiteId>) -> Result<Vec<ReportSchedule>, StoreError> {
        let site = site.map(|s| s.as_str().to_owned());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT site, recipient, every, created_ms FROM reports \
                 WHERE ?1 IS NULL OR site = ?1 ORDER BY site, recipient, every",
            )?;
            let mut rows = stmt.query([site])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                out.push(schedule(row)?);
            }
            Ok(out)
        })
        .await
    }

    async fn claim_send(
        &self,
        key: &SendKey,
        holder: &str,
        now_ms: i64,
        lease_until_ms: i64,
    ) -> Result<Option<u32>, StoreError> {
        let (key, holder) = (key.clone(), holder.to_owned());
        self.write(move |w| {
            Ok(w.conn
                .query_row(
                    "INSERT INTO report_sends (site, recipient, every, period, holder, \
                       lease_until_ms, attempts, next_try_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7) \
                     ON CONFLICT (site, recipient, every, period) DO UPDATE \
                       SET holder = excluded.holder, lease_until_ms = excluded.lease_until_ms \
                       WHERE report_sends.sent_ms IS NULL AND report_sends.lease_until_ms <= ?7 \
                         AND report_sends.next_try_ms <= ?7 \
                     RETURNING attempts",
                    params![
                        key.site.as_str(),
                        key.recipient,
                        key.every.as_str(),
                        key.period.to_string(),
                        holder,
                        lease_until_ms,
                        now_ms
                    ],
                    |r| r.get::<_, i64>(0),
                )
                .optional()?
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
        })
        .await
    }

    async fn mark_sent(
        &self,
        key: &SendKey,
        holder: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let set = "sent_ms = ?6, attempts = attempts + 1, last_error = ?7";
        self.update_held(key, holder, set, (now_ms, None)).await
    }

    async fn mark_failed(
        &self,
        key: &SendKey,
        holder: &str,
        error: &str,
        next_try_ms: i64,
    ) -> Result<bool, StoreError> {
        let set = "attempts = attempts + 1, next_try_ms = ?6, last_error = ?7, lease_until_ms = 0";
        let extra = (next_try_ms, Some(error.to_owned()));
        self.update_held(key, holder, set, extra).await
    }

    async fn retries_waiting(&self) -> Result<u64, StoreError> {
        self.read(|conn| {
            let n: i64 = conn.query_row(
                "SELECT COUNT(*) FROM report_sends \
                 WHERE sent_ms IS NULL AND attempts > 0 AND next_try_ms < ?1",
                [i64::MAX],
                |r| r.get(0),
            )?;
            Ok(n.max(0) as u64)
        })
        .await
    }
}
