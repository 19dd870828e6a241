//! Recounting every counter from raw events, and repairing drift: the SQLite rule of what is
//! compared (see `store::sqlite::verify`), in PostgreSQL.
//!
//! A plain verify reads one REPEATABLE READ snapshot, so batches committing meanwhile are
//! either wholly in it or wholly out. A repair goes one site at a time, one transaction each:
//! it holds that site's lock exclusively (every commit shares the lock of each site in its
//! batch) and shares the prune lock (each prune chunk holds it exclusively). So it starts once
//! the site's batches in flight have committed, the site's new batches wait until it has
//! committed, other sites' batches never wait, and no batch is lost or counted twice.

use std::fmt::Write as _;

use super::prune::PRUNE_LOCK;
use super::write::SITE_LOCK;
use super::{ALL_TIME, Fail, PgStore, num_day};
use crate::store::{Drift, IMPORTED_SOURCE, VerifyReport};

/// The recount of every view counter: (site, scope, source, name, day, views, visitors).
const RECOUNT: &str = "
    SELECT site, page AS scope, source, ''::text AS name, day, COUNT(*) AS views,
        COUNT(DISTINCT visitor) AS visitors FROM events WHERE kind = 0
        GROUP BY site, page, source, day
    UNION ALL SELECT e.site, p.id, e.source, '', e.day, COUNT(*), COUNT(DISTINCT e.visitor)
        FROM events e JOIN pages p ON p.site = e.site AND p.path = ''
        WHERE e.kind = 0 GROUP BY e.site, p.id, e.source, e.day
    UNION ALL SELECT site, page, source, '', -1, COUNT(*), COUNT(DISTINCT visitor)
        FROM events WHERE kind = 0 GROUP BY site, page, source
    UNION ALL SELECT e.site, p.id, e.source, '', -1, COUNT(*), COUNT(DISTINCT e.visitor)
        FROM events e JOIN pages p ON p.site = e.site AND p.path = ''
        WHERE e.kind = 0 GROUP BY e.site, p.id, e.source";

const STORED: &str = "SELECT site, scope, source, ''::text AS name, day, views, visitors \
                      FROM counters";

/// Custom-event counters shaped like [`RECOUNT`] (scope 0, source -1, the name).
const RECOUNT_EVENTS: &str = "
    SELECT site, 0::int8 AS scope, -1::int2 AS source, name, day, COUNT(*) AS views,
        0::int8 AS visitors FROM events WHERE kind = 1 GROUP BY site, name, day
    UNION ALL SELECT site, 0, -1, name, -1, COUNT(*), 0 FROM events WHERE kind = 1
        GROUP BY site, name";

const STORED_EVENTS: &str = "SELECT site, 0::int8 AS scope, -1::int2 AS source, name, day, \
                             count AS views, 0::int8 AS visitors FROM event_counters";

/// Referrer counters shaped like [`RECOUNT`] (scope 0, source -2, the host in `name`; the
/// host rule of `core::hit::referrer_host`).
const RECOUNT_REFERRERS: &str = "
    SELECT site, 0::int8 AS scope, -2::int2 AS source,
        split_part(substr(referrer, strpos(referrer, '://') + 3), '/', 1) AS name, day,
        COUNT(*) AS views, 0::int8 AS visitors
        FROM events WHERE kind = 0 AND referrer IS NOT NULL GROUP BY site, 4, day";

const STORED_REFERRERS: &str = "SELECT site, 0::int8 AS scope, -2::int2 AS source, host AS name, \
                                day, views, 0::int8 AS visitors FROM referrer_counters";

/// Which rows a verify covers: a condition appended to every query (empty for all sites).
#[derive(Debug, Clone, Default)]
struct Only {
    /// ` AND site = N`, or nothing.
    site: String,
    /// The same on the events of a join (`e.site`).
    joined: String,
}

impl Only {
    fn site(id: i64) -> Self {
        Self {
            site: format!(" AND site = {id}"),
            joined: format!(" AND e.site = {id}"),
        }
    }

    fn recount(&self) -> String {
        RECOUNT
            .replace("WHERE kind = 0", &format!("WHERE kind = 0{}", self.site))
            .replace(
                "WHERE e.kind = 0",
                &format!("WHERE e.kind = 0{}", self.joined),
            )
    }

    fn recount_events(&self) -> String {
        RECOUNT_EVENTS.replace("WHERE kind = 1", &format!("WHERE kind = 1{}", self.site))
    }

    fn recount_referrers(&self) -> String {
        RECOUNT_REFERRERS.replace("WHERE kind = 0", &format!("WHERE kind = 0{}", self.site))
    }

    fn stored_referrers(&self) -> String {
        format!("{STORED_REFERRERS} WHERE TRUE{}", self.site)
    }

    fn stored(&self) -> String {
        format!("{STORED} WHERE TRUE{}", self.site)
    }

    fn stored_events(&self) -> String {
        format!("{STORED_EVENTS} WHERE TRUE{}", self.site)
    }
}

/// `scope` is a per-page scope (not a whole site's).
const PAGE_ROW: &str = "scope NOT IN (SELECT id FROM pages WHERE path = '')";

/// Which rows can be recounted.
struct Cuts {
    /// Day rows up to this day (inclusive) lost raw events; `None`: nothing was pruned.
    raw: Option<i64>,
    /// Per-page day rows before this day were pruned.
    pages: i64,
    /// Per-day visitor sets before this day were pruned.
    visitors: i64,
}

impl Cuts {
    async fn read(tx: &deadpool_postgres::Transaction<'_>) -> Result<Self, Fail> {
        let mut raw = None;
        let (mut pages, mut visitors) = (i64::MIN, i64::MIN);
        for row in tx.query("SELECT key, value FROM meta", &[]).await? {
            let value: i64 = row.get(1);
            match row.get::<_, &str>(0) {
                "pruned_before_ms" => {
                    raw = Some(value.saturating_add(86_400_000).div_euclid(86_400_000));
                }
                "page_rows_before_day" => pages = value,
                "visitor_rows_before_day" => visitors = value,
                _ => {}
            }
        }
        Ok(Self {
            raw,
            pages,
            visitors,
        })
    }

    fn comparable_sql(&self, page_row: &str) -> String {
        let raw = match self.raw {
            None => "TRUE".to_owned(),
            Some(cut) => format!("(day != -1 AND day > {cut})"),
        };
        format!(
            "{raw} AND (day = -1 OR day >= {} OR NOT ({page_row}))",
            self.pages
        )
    }
}

async fn compare(
    tx: &deadpool_postgres::Transaction<'_>,
    (stored, recount): (&str, &str),
    condition: &str,
    events: bool,
    report: &mut VerifyReport,
) -> Result<(), Fail> {
    let sql = format!(
        "WITH s AS ({stored}), r AS ({recount}),
              j AS (SELECT site, scope, source, name, day, s.views AS sv, s.visitors AS sw,
                           r.views AS rv, r.visitors AS rw
                    FROM s FULL OUTER JOIN r USING (site, scope, source, name, day))
         SELECT site, scope, source, name, day, sv, sw, rv, rw FROM j WHERE {condition}
         ORDER BY site, scope, source, name, day"
    );
    for row in tx.query(&sql, &[]).await? {
        report.checked += 1;
        let stored = (
            row.get::<_, Option<i64>>(5).unwrap_or(0),
            row.get::<_, Option<i64>>(6).unwrap_or(0),
        );
        let recounted = (
            row.get::<_, Option<i64>>(7).unwrap_or(0),
            row.get::<_, Option<i64>>(8).unwrap_or(0),
        );
        if stored != recounted {
            let key = label(
                tx,
                events,
                (row.get(0), row.get(1), row.get(2)),
                row.get(3),
                row.get(4),
            )
            .await?;
            report.drift.push(Drift {
                key,
                stored,
                recounted,
            });
        }
    }
    Ok(())
}

/// `site/source/page/day` (page empty for the whole site, day `*` for all time); custom
/// events as `site/-1/name/day`, referrer counters as `site/-2/host/day`.
async fn label(
    tx: &deadpool_postgres::Transaction<'_>,
    events: bool,
    (site, scope, source): (i64, i64, i16),
    name: &str,
    day: i32,
) -> Result<String, Fail> {
    let site_name: String = tx
        .query_opt("SELECT name FROM site_keys WHERE id = $1", &[&site])
        .await?
        .map_or_else(|| format!("#{site}"), |r| r.get(0));
    let page = if events {
        name.to_owned()
    } else {
        tx.query_opt(
            "SELECT path FROM pages WHERE site = $1 AND id = $2",
            &[&site, &scope],
        )
        .await?
        .map_or_else(|| format!("#{scope}"), |r| r.get(0))
    };
    let day = if day == ALL_TIME {
        "*".to_owned()
    } else {
        num_day(day).map_or_else(|_| day.to_string(), |d| d.to_string())
    };
    Ok(format!("{site_name}/{source}/{page}/{day}"))
}

/// The id of site `name`, if it was ever counted.
async fn site_id(client: &deadpool_postgres::Client, name: &str) -> Result<Option<i64>, Fail> {
    Ok(client
        .query_opt("SELECT id FROM site_keys WHERE name = $1", &[&name])
        .await?
        .map(|r| r.get(0)))
}

/// Verify every site (`site` = `None`) or one; repairs go site by site (see the module doc).
pub(super) async fn verify(
    store: &PgStore,
    site: Option<&str>,
    repair: bool,
) -> Result<VerifyReport, Fail> {
    let mut client = store.client().await?;
    let only = match site {
        None => None,
        Some(name) => match site_id(&client, name).await? {
            Some(id) => Some(id),
            // Never counted: nothing to check.
            None => return Ok(VerifyReport::default()),
        },
    };
    if !repair {
        let tx = super::read::snapshot(&mut client).await?;
        let only = only.map_or_else(Only::default, Only::site);
        let report = check(&tx, &only).await?.0;
        tx.commit().await?;
        return Ok(report);
    }
    let sites: Vec<i64> = match only {
        Some(id) => vec![id],
        None => client
            .query("SELECT id FROM site_keys ORDER BY id", &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect(),
    };
    drop(client);
    let mut report = VerifyReport::default();
    for id in sites {
        let one = repair_site(store, id).await?;
        report.checked += one.checked;
        report.drift.extend(one.drift);
        report.repaired |= one.repaired;
    }
    Ok(report)
}

/// Compare the stored counters of `only` with their recount; also returns the cuts and the
/// conditions a repair rewrites under.
async fn check(
    tx: &deadpool_postgres::Transaction<'_>,
    only: &Only,
) -> Result<(VerifyReport, Cuts, String, String), Fail> {
    let cuts = Cuts::read(tx).await?;
    // Imported daily aggregates have no raw events: never compared nor rewritten.
    let counters = format!(
        "source != {IMPORTED_SOURCE} AND {}{}",
        cuts.comparable_sql(PAGE_ROW),
        only.site
    );
    let event_counters = format!("{}{}", cuts.comparable_sql("FALSE"), only.site);
    let mut report = VerifyReport::default();
    compare(
        tx,
        (&only.stored(), &only.recount()),
        &counters,
        false,
        &mut report,
    )
    .await?;
    compare(
        tx,
        (&only.stored_events(), &only.recount_events()),
        &event_counters,
        true,
        &mut report,
    )
    .await?;
    compare(
        tx,
        (&only.stored_referrers(), &only.recount_referrers()),
        &event_counters,
        true,
        &mut report,
    )
    .await?;
    Ok((report, cuts, counters, event_counters))
}

/// Recount site `id` and rewrite what drifted, in one transaction under its site lock.
async fn repair_site(store: &PgStore, id: i64) -> Result<VerifyReport, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock_shared($1, hashtext(current_schema()))",
        &[&PRUNE_LOCK],
    )
    .await?;
    tx.execute(
        &format!("SELECT pg_advisory_xact_lock({SITE_LOCK})"),
        &[&id],
    )
    .await?;
    let only = Only::site(id);
    let (mut report, cuts, counters, event_counters) = check(&tx, &only).await?;
    if !report.drift.is_empty() {
        let mut visit_days = format!("day >= {}", cuts.visitors);
        if let Some(cut) = cuts.raw {
            let _ = write!(visit_days, " AND day > {cut}");
        }
        let (recount, recount_events) = (only.recount(), only.recount_events());
        let recount_referrers = only.recount_referrers();
        let (site, joined) = (&only.site, &only.joined);
        // The visitor sets are rewritten: kept sets of every collector are dropped.
        let bump = crate::store::daysets::BUMP_GENERATION;
        tx.batch_execute(&format!(
            "DELETE FROM counters WHERE {counters};
             INSERT INTO counters (site, scope, source, day, views, visitors)
                 SELECT site, scope, source, day, views, visitors FROM ({recount}) r
                 WHERE {counters};
             DELETE FROM event_counters WHERE {event_counters};
             INSERT INTO event_counters (site, name, day, count)
                 SELECT site, name, day, views FROM ({recount_events}) r WHERE {event_counters};
             DELETE FROM referrer_counters WHERE {event_counters};
             INSERT INTO referrer_counters (site, day, host, views)
                 SELECT site, day, name, views FROM ({recount_referrers}) r
                 WHERE {event_counters};
             DELETE FROM visits WHERE {visit_days}{site};
             {bump};
             INSERT INTO visits (site, day, scope, source, visitor)
                 SELECT site, day, page, source, visitor FROM events
                     WHERE kind = 0 AND {visit_days}{site}
                 UNION SELECT e.site, e.day, p.id, e.source, e.visitor FROM events e
                     JOIN pages p ON p.site = e.site AND p.path = ''
                     WHERE e.kind = 0 AND {visit_days}{joined}
                 ON CONFLICT DO NOTHING;"
        ))
        .await?;
        if cuts.raw.is_none() {
            tx.execute(&format!("DELETE FROM reach WHERE TRUE{site}"), &[])
                .await?;
        }
        tx.execute(
            &format!(
                "INSERT INTO reach (site, source, visitor, page)
                     SELECT site, source, visitor, page FROM events WHERE kind = 0{site}
                     UNION SELECT e.site, e.source, e.visitor, p.id FROM events e
                         JOIN pages p ON p.site = e.site AND p.path = '' WHERE e.kind = 0{joined}
                 ON CONFLICT DO NOTHING"
            ),
            &[],
        )
        .await?;
        report.repaired = true;
    }
    tx.commit().await?;
    Ok(report)
}
