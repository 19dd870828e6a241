//! Email reports on PostgreSQL: the schedules (`reports`), the lease of each send
//! (`report_sends`) and the visits read.
//!
//! A claim is one `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`: of collectors
//! claiming one period at once, the first inserts (or takes over the expired lease) and the
//! others wait for its transaction, then find the row leased and get nothing back.

use async_trait::async_trait;
use uuid::Uuid;

use super::{Fail, PgStore, retry};
use crate::core::ids::SiteId;
use crate::core::period::Every;
use crate::core::record::Source;
use crate::store::{ReportSchedule, ReportStore, SendKey, StoreError, VISIT_GAP_MS, Visits};

/// Visits of `site` over the day numbers `from..=to`, by source.
pub(super) async fn visits(
    store: &PgStore,
    site: &str,
    (from, to): (i32, i32),
    (lo, hi): (Uuid, Uuid),
) -> Result<Visits, StoreError> {
    retry("count visits", || async {
        let client = store.client().await?;
        let rows = client
            .query(
                "WITH v AS (SELECT e.source, e.at_ms - LAG(e.at_ms) OVER \
                              (PARTITION BY e.source, e.visitor ORDER BY e.at_ms) AS gap \
                            FROM events e JOIN site_keys k ON k.id = e.site AND k.name = $1 \
                            WHERE e.event_id >= $4 AND e.event_id < $5 AND e.kind = 0 \
                              AND e.day BETWEEN $2 AND $3) \
                 SELECT source, COUNT(*) FROM v WHERE gap IS NULL OR gap > $6 GROUP BY source",
                &[&site, &from, &to, &lo, &hi, &VISIT_GAP_MS],
            )
            .await?;
        let mut visits = Visits::default();
        for row in rows {
            let n = row.get::<_, i64>(1).max(0) as u64;
            if i64::from(row.get::<_, i16>(0)) == Source::Badge.code() {
                visits.badge += n;
            } else {
                visits.web += n;
            }
        }
        Ok(visits)
    })
    .await
}

fn schedule(row: &tokio_postgres::Row) -> Result<ReportSchedule, Fail> {
    let site: String = row.get(0);
    let every: String = row.get(2);
    Ok(ReportSchedule {
        site: SiteId::parse(&site)
            .map_err(|e| Fail::Store(StoreError::Invalid(format!("{site:?}: {e}"))))?,
        recipient: row.get(1),
        every: Every::parse(&every).map_err(|e| Fail::Store(StoreError::Invalid(e.to_string())))?,
        created_ms: row.get(3),
    })
}

/// `UPDATE report_sends SET {set}` of `key`'s row while `holder` holds it and it is not sent;
/// `set` reads `extra` as `$6` and `$7`. Whether the row was changed.
async fn update_held(
    store: &PgStore,
    key: &SendKey,
    holder: &str,
    set: &'static str,
    extra: (i64, Option<&str>),
) -> Result<bool, StoreError> {
    let period = key.period.to_string();
    let sql = format!(
        "UPDATE report_sends SET {set} WHERE site = $1 AND recipient = $2 AND every = $3 \
         AND period = $4 AND holder = $5 AND sent_ms IS NULL"
    );
    retry("update a report send", || async {
        let client = store.client().await?;
        let n = client
            .execute(
                &sql,
                &[
                    &key.site.as_str(),
                    &key.recipient,
                    &key.every.as_str(),
                    &period,
                    &holder,
                    &extra.0,
                    &extra.1,
                ],
            )
            .await?;
        Ok(n == 1)
    })
    .await
}

#[async_trait]
impl ReportStore for PgStore {
    async fn add_report(&self, report: &ReportSchedule) -> Result<bool, StoreError> {
        retry("add a report", || async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "INSERT INTO reports (site, recipient, every, created_ms) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                    &[
                        &report.site.as_str(),
                        &report.recipient,
                        &report.every.as_str(),
                        &report.created_ms,
                    ],
                )
                .await?;
            Ok(n == 1)
        })
        .await
    }

    async fn remove_report(
        &self,
        site: &SiteId,
        recipient: &str,
        every: Every,
    ) -> Result<bool, StoreError> {
        retry("remove a report", || async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let key: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&site.as_str(), &recipient, &every.as_str()];
            let n = tx
                .execute(
                    "DELETE FROM reports WHERE site = $1 AND recipient = $2 AND every = $3",
                    &key,
                )
                .await?;
            tx.execute(
                "DELETE FROM report_sends WHERE site = $1 AND recipient = $2 AND every = $3",
                &key,
            )
            .await?;
            tx.commit().await?;
            Ok(n == 1)
        })
        .await
    }

    async fn list_reports(&self, site: Option<&SiteId>) -> Result<Vec<ReportSchedule>, StoreError> {
        let site = site.map(|s| s.as_str().to_owned());
        retry("list reports", || async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT site, recipient, every, created_ms FROM reports \
                     WHERE $1::text IS NULL OR site = $1 \
                     ORDER BY site COLLATE \"C\", recipient COLLATE \"C\", every",
                    &[&site],
                )
                .await?;
            rows.iter().map(schedule).collect()
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
        let period = key.period.to_string();
        retry("claim a report send", || async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "INSERT INTO report_sends (site, recipient, every, period, holder, \
                       lease_until_ms, attempts, next_try_ms) VALUES ($1, $2, $3, $4, $5, $6, 0, $7) \
                     ON CONFLICT (site, recipient, every, period) DO UPDATE \
                       SET holder = excluded.holder, lease_until_ms = excluded.lease_until_ms \
                       WHERE report_sends.sent_ms IS NULL AND report_sends.lease_until_ms <= $7 \
                         AND report_sends.next_try_ms <= $7 \
                     RETURNING attempts",
                    &[
                        &key.site.as_str(),
                        &key.recipient,
                        &key.every.as_str(),
                        &period,
                        &holder,
                        &lease_until_ms,
                        &now_ms,
                    ],
                )
                .await?;
            Ok(row.map(|r| u32::try_from(r.get::<_, i32>(0)).unwrap_or(0)))
        })
        .await
    }

    async fn mark_sent(
        &self,
        key: &SendKey,
        holder: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let set = "sent_ms = $6, attempts = attempts + 1, last_error = $7";
        update_held(self, key, holder, set, (now_ms, None)).await
    }

    async fn mark_failed(
        &self,
        key: &SendKey,
        holder: &str,
        error: &str,
        next_try_ms: i64,
    ) -> Result<bool, StoreError> {
        let set = "attempts = attempts + 1, next_try_ms = $6, last_error = $7, lease_until_ms = 0";
        update_held(self, key, holder, set, (next_try_ms, Some(error))).await
    }

    async fn retries_waiting(&self) -> Result<u64, StoreError> {
        retry("count report retries", || async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "SELECT COUNT(*) FROM report_sends \
                     WHERE sent_ms IS NULL AND attempts > 0 AND next_try_ms < $1",
                    &[&i64::MAX],
                )
                .await?;
            Ok(row.get::<_, i64>(0).max(0) as u64)
        })
        .await
    }
}
