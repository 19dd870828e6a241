//! Month rollups on PostgreSQL (see [`crate::store::rollups`]): a month's states are
//! replaced in one transaction (upserts, so collectors rolling the same month at once never
//! collide on a key), leaving one whole set: the last to commit.

use deadpool_postgres::GenericClient;
use jiff::civil::Date;

use super::segments::site_id;
use super::{Fail, PgStore, day_num, num_day};
use crate::store::rollups::{RollupInfo, RollupState, encode_days, stored_days};

/// The sealed days of `site` up to `through`, with their versions, oldest first.
pub(super) async fn sealed_through(
    store: &PgStore,
    site: &str,
    through: Date,
) -> Result<Vec<(Date, i64)>, Fail> {
    let client = store.client().await?;
    let Some(site) = site_id(&client, site).await? else {
        return Ok(Vec::new());
    };
    let rows = client
        .query(
            "SELECT day, version FROM segments WHERE site = $1 AND day <= $2 ORDER BY day",
            &[&site, &day_num(through)],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((num_day(r.get(0)).map_err(Fail::Store)?, r.get(1))))
        .collect()
}

/// Every stored state of `site`, without its bytes, by month and key.
pub(super) async fn index(store: &PgStore, site: &str) -> Result<Vec<RollupInfo>, Fail> {
    let client = store.client().await?;
    let Some(site) = site_id(&client, site).await? else {
        return Ok(Vec::new());
    };
    let rows = client
        .query(
            "SELECT month, key, days FROM rollups WHERE site = $1 ORDER BY month, key",
            &[&site],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let month: i32 = r.get(0);
            Ok(RollupInfo {
                month: num_day(month).map_err(Fail::Store)?,
                key: r.get(1),
                days: stored_days(r.get(2), site, i64::from(month)),
            })
        })
        .collect()
}

/// The stored states of `site`'s month `month` named `keys` (those stored).
pub(super) async fn states(
    store: &PgStore,
    site: &str,
    month: Date,
    keys: &[String],
) -> Result<Vec<RollupState>, Fail> {
    let client = store.client().await?;
    let Some(site) = site_id(&client, site).await? else {
        return Ok(Vec::new());
    };
    let month = day_num(month);
    let rows = client
        .query(
            "SELECT key, days, state FROM rollups WHERE site = $1 AND month = $2 \
             AND key = ANY($3::text[])",
            &[&site, &month, &keys],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(RollupState {
                key: r.get(0),
                days: stored_days(r.get(1), site, i64::from(month)),
                state: r.get(2),
            })
        })
        .collect()
}

/// Replace every stored state of `site`'s month `month` by `states`, in one transaction,
/// if the month's sealed days are still the days they counted; whether they were stored. A
/// site without a stored id stores nothing.
pub(super) async fn put(
    store: &PgStore,
    site: &str,
    month: Date,
    states: &[RollupState],
) -> Result<bool, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let Some(site) = site_id(&tx, site).await? else {
        return Ok(false);
    };
    let (first, last) = (day_num(month), day_num(month.last_of_month()));
    let sealed = tx
        .query(
            "SELECT day, version FROM segments WHERE site = $1 AND day BETWEEN $2 AND $3 \
             ORDER BY day",
            &[&site, &first, &last],
        )
        .await?
        .iter()
        .map(|r| Ok((num_day(r.get(0)).map_err(Fail::Store)?, r.get::<_, i64>(1))))
        .collect::<Result<Vec<_>, Fail>>()?;
    if states.iter().any(|s| s.days != sealed) {
        return Ok(false);
    }
    // Upserts, not a delete and inserts: two collectors replacing one month at once would
    // otherwise both insert the same keys.
    let keys: Vec<&str> = states.iter().map(|s| s.key.as_str()).collect();
    tx.execute(
        "DELETE FROM rollups WHERE site = $1 AND month = $2 AND NOT (key = ANY($3::text[]))",
        &[&site, &first, &keys],
    )
    .await?;
    for s in states {
        tx.execute(
            "INSERT INTO rollups (site, month, key, days, state) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (site, month, key) DO UPDATE SET days = excluded.days, \
             state = excluded.state",
            &[&site, &first, &s.key, &encode_days(&s.days), &s.state],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(true)
}
