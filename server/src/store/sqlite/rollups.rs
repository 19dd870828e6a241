//! Month rollups on SQLite (see [`crate::store::rollups`]): read in the stats lane beside
//! the segments, replaced a month at a time in one write transaction.

use super::*;
use crate::store::rollups::{RollupInfo, RollupState, encode_days, stored_days};

/// The sealed days of `site` up to `through`, with their versions, oldest first.
pub(super) fn sealed_through(
    conn: &Connection,
    site: &str,
    through: i64,
) -> Result<Vec<(Date, i64)>, StoreError> {
    match segments::site_id(conn, site)? {
        Some(site) => sealed_in(conn, site, (i64::MIN, through)),
        None => Ok(Vec::new()),
    }
}

/// The sealed days of site id `site` in `first..=last` (day numbers), oldest first.
fn sealed_in(
    conn: &Connection,
    site: i64,
    (first, last): (i64, i64),
) -> Result<Vec<(Date, i64)>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT day, version FROM segments WHERE site = ?1 AND day BETWEEN ?2 AND ?3 \
         ORDER BY day",
    )?;
    let mut rows = stmt.query(params![site, first, last])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push((num_day(row.get(0)?)?, row.get(1)?));
    }
    Ok(out)
}

/// Every stored state of `site`, without its bytes, by month and key.
pub(super) fn index(conn: &Connection, site: &str) -> Result<Vec<RollupInfo>, StoreError> {
    let Some(site) = segments::site_id(conn, site)? else {
        return Ok(Vec::new());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT month, key, days FROM rollups WHERE site = ?1 ORDER BY month, key",
    )?;
    let mut rows = stmt.query([site])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let month: i64 = row.get(0)?;
        let days: Vec<u8> = row.get(2)?;
        out.push(RollupInfo {
            month: num_day(month)?,
            key: row.get(1)?,
            days: stored_days(&days, site, month),
        });
    }
    Ok(out)
}

/// The stored states of `site`'s month `month` named `keys` (those stored).
pub(super) fn states(
    conn: &Connection,
    site: &str,
    month: i64,
    keys: &[String],
) -> Result<Vec<RollupState>, StoreError> {
    let Some(site) = segments::site_id(conn, site)? else {
        return Ok(Vec::new());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT days, state FROM rollups WHERE site = ?1 AND month = ?2 AND key = ?3",
    )?;
    let mut out = Vec::new();
    for key in keys {
        let row: Option<(Vec<u8>, Vec<u8>)> = stmt
            .query_row(params![site, month, key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((days, state)) = row {
            out.push(RollupState {
                key: key.clone(),
                days: stored_days(&days, site, month),
                state,
            });
        }
    }
    Ok(out)
}

/// In a write transaction: replace every stored state of `site`'s month (its first and
/// last day numbers) by `states`, if the month's sealed days are still the days they
/// counted; whether they were stored. A site without a stored id stores nothing.
pub(super) fn put(
    tx: &Connection,
    site: &str,
    (month, last): (i64, i64),
    states: &[RollupState],
) -> Result<bool, StoreError> {
    let Some(site) = segments::site_id(tx, site)? else {
        return Ok(false);
    };
    let sealed = sealed_in(tx, site, (month, last))?;
    if states.iter().any(|s| s.days != sealed) {
        return Ok(false);
    }
    tx.prepare_cached("DELETE FROM rollups WHERE site = ?1 AND month = ?2")?
        .execute(params![site, month])?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO rollups (site, month, key, days, state) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for s in states {
        insert.execute(params![site, month, s.key, encode_days(&s.days), s.state])?;
    }
    Ok(true)
}
