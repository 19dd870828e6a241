//! Day segments on PostgreSQL (see [`crate::store::SegmentSource`]), as on SQLite, with one
//! difference in how a seal and a write to the same day are kept apart: several collectors
//! write at once, so a seal runs in ONE transaction holding the day's advisory lock
//! exclusively, and every batch holds the shared lock of each (site, day) it writes, in key
//! order, and deletes that day's segment. A batch and a seal of one day therefore run one
//! after the other: a seal either sees the batch's events or is deleted by it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use deadpool_postgres::GenericClient;

use super::read::snapshot;
use super::{Fail, PgStore, day_num};
use crate::core::ids::SiteId;
use crate::core::segment::{self, DayEvent};
use crate::store::numbers::{self, Numbers, Pending};
use crate::store::{
    DictionaryRows, PartsWanted, SegmentIndex, SegmentParts, StoreError, TEMP_NUMBERS,
};

/// The advisory lock of one site's day (`$1` = site id, `$2` = day): a seal holds it
/// exclusively, every batch shares it for each day it writes.
pub(super) const DAY_LOCK: &str = "hashtextextended(current_schema() || ':day:' || ($1::int8)::text || ':' || ($2::int4)::text, 0)";

pub(super) async fn site_id(client: &impl GenericClient, site: &str) -> Result<Option<i64>, Fail> {
    let stmt = client
        .prepare_cached("SELECT id FROM site_keys WHERE name = $1")
        .await?;
    Ok(client.query_opt(&stmt, &[&site]).await?.map(|r| r.get(0)))
}

fn u32_of(n: i64, what: &str) -> Result<u32, Fail> {
    u32::try_from(n)
        .map_err(|_| Fail::Store(StoreError::Invalid(format!("{what} {n} is out of range"))))
}

struct RawEvent {
    day: i32,
    visitor: [u8; 16],
    event: DayEvent,
}

/// The raw web events of `site` on the local days `from..=to`.
async fn raw_events(
    client: &impl GenericClient,
    site: i64,
    from: i32,
    to: i32,
) -> Result<Vec<RawEvent>, Fail> {
    let stmt = client
        .prepare_cached(
            "SELECT event_id, kind, page, name, visitor, at_ms, day, src, agent, engaged_ms, \
             scroll FROM events WHERE site = $1 AND day BETWEEN $2 AND $3 AND source = 0",
        )
        .await?;
    let mut out = Vec::new();
    for row in client.query(&stmt, &[&site, &from, &to]).await? {
        let id: uuid::Uuid = row.get(0);
        let kind: i16 = row.get(1);
        let visitor: &[u8] = row.get(4);
        let Ok(visitor) = <[u8; 16]>::try_from(visitor) else {
            continue;
        };
        let scroll: Option<i16> = row.get(10);
        out.push(RawEvent {
            day: row.get(6),
            visitor,
            event: DayEvent {
                visitor: 0,
                at_ms: row.get(5),
                id: *id.as_bytes(),
                name: if kind == super::KIND_EVENT {
                    row.get(3)
                } else {
                    None
                },
                page: u32_of(row.get(2), "page id")?,
                src: u32_of(row.get::<_, Option<i64>>(7).unwrap_or(0), "source id")?,
                agent: u32_of(row.get::<_, Option<i64>>(8).unwrap_or(0), "agent id")?,
                engaged_ms: u32::try_from(row.get::<_, Option<i64>>(9).unwrap_or(0).max(0))
                    .unwrap_or(u32::MAX),
                scroll: scroll.and_then(|s| u8::try_from(s).ok()),
            },
        });
    }
    Ok(out)
}

/// The stored numbers of `keys`.
async fn stored_numbers<'a>(
    client: &impl GenericClient,
    site: i64,
    keys: impl IntoIterator<Item = &'a [u8; 16]>,
) -> Result<HashMap<[u8; 16], u32>, Fail> {
    let list: Vec<&[u8]> = keys.into_iter().map(|k| &k[..]).collect();
    let stmt = client
        .prepare_cached(
            "SELECT visitor, num FROM visitor_numbers WHERE site = $1 AND visitor = ANY($2)",
        )
        .await?;
    let mut out = HashMap::with_capacity(list.len());
    for row in client.query(&stmt, &[&site, &list]).await? {
        let key: &[u8] = row.get(0);
        if let Ok(key) = <[u8; 16]>::try_from(key) {
            out.insert(key, u32_of(row.get(1), "visitor number")?);
        }
    }
    Ok(out)
}

/// The stored numbers of `keys`, looked up in `cache`, then the table, at the numbering
/// generation of this snapshot ([`crate::store::numbers`]).
async fn cached_numbers(
    client: &impl GenericClient,
    cache: &Mutex<Numbers>,
    site: i64,
    keys: &HashSet<[u8; 16]>,
) -> Result<HashMap<[u8; 16], u32>, Fail> {
    let stmt = client.prepare_cached(numbers::READ_GENERATION).await?;
    let generation: i64 = client.query_one(&stmt, &[]).await?.get(0);
    let pending = Pending::start(cache, site, keys, generation);
    let found = if pending.ask().is_empty() {
        HashMap::new()
    } else {
        stored_numbers(client, site, pending.ask()).await?
    };
    Ok(pending.finish(found))
}

pub(super) async fn read_index(
    store: &PgStore,
    site: &str,
    from: i32,
    to: i32,
) -> Result<SegmentIndex, Fail> {
    let mut client = store.client().await?;
    let tx = snapshot(&mut client).await?;
    let mut index = SegmentIndex::default();
    let Some(site) = site_id(&tx, site).await? else {
        return Ok(index);
    };
    let stmt = tx
        .prepare_cached(
            "SELECT day, version FROM segments WHERE site = $1 AND day BETWEEN $2 AND $3 \
             ORDER BY day",
        )
        .await?;
    let mut sealed = HashSet::new();
    for row in tx.query(&stmt, &[&site, &from, &to]).await? {
        let day: i32 = row.get(0);
        sealed.insert(day);
        index
            .sealed
            .push((super::num_day(day).map_err(Fail::Store)?, row.get(1)));
    }
    let mut raw = Vec::new();
    let mut day = from;
    while day <= to {
        if sealed.contains(&day) {
            day += 1;
            continue;
        }
        let start = day;
        while day <= to && !sealed.contains(&day) {
            day += 1;
        }
        raw.extend(raw_events(&tx, site, start, day - 1).await?);
    }
    let keys: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
    let mut known = cached_numbers(&tx, &store.numbers, site, &keys).await?;
    tx.commit().await?;
    let mut next = TEMP_NUMBERS;
    let mut by_day: BTreeMap<i32, Vec<DayEvent>> = BTreeMap::new();
    for mut e in raw {
        e.event.visitor = *known.entry(e.visitor).or_insert_with(|| {
            next += 1;
            next - 1
        });
        by_day.entry(e.day).or_default().push(e.event);
    }
    for (day, events) in by_day {
        index
            .open
            .push((super::num_day(day).map_err(Fail::Store)?, events));
    }
    Ok(index)
}

pub(super) async fn read_parts(
    store: &PgStore,
    site: &str,
    wanted: &[PartsWanted],
) -> Result<Vec<SegmentParts>, Fail> {
    let client = store.client().await?;
    let Some(site) = site_id(&client, site).await? else {
        return Ok(Vec::new());
    };
    let (mut days, mut versions, mut visits, mut events) = (vec![], vec![], vec![], vec![]);
    for w in wanted {
        days.push(day_num(w.day));
        versions.push(w.version);
        visits.push(w.visits);
        events.push(w.events);
    }
    let rows = client
        .query(
            "SELECT s.day, s.version, CASE WHEN w.v THEN s.visits END, \
             CASE WHEN w.e THEN s.events END \
             FROM unnest($2::int4[], $3::int8[], $4::bool[], $5::bool[]) AS w(day, version, v, e) \
             JOIN segments s ON s.site = $1 AND s.day = w.day AND s.version = w.version",
            &[&site, &days, &versions, &visits, &events],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(SegmentParts {
                day: super::num_day(r.get(0)).map_err(Fail::Store)?,
                version: r.get(1),
                visits: r.get(2),
                events: r.get(3),
            })
        })
        .collect()
}

pub(super) async fn read_dictionary(
    store: &PgStore,
    site: &str,
    pages: Vec<u32>,
    dims: Vec<u32>,
) -> Result<DictionaryRows, Fail> {
    let client = store.client().await?;
    let mut out = DictionaryRows::default();
    let Some(site) = site_id(&client, site).await? else {
        return Ok(out);
    };
    let pages: Vec<i64> = pages.into_iter().map(i64::from).collect();
    let dims: Vec<i64> = dims.into_iter().map(i64::from).collect();
    for row in client
        .query(
            "SELECT id, path FROM pages WHERE site = $1 AND id = ANY($2)",
            &[&site, &pages],
        )
        .await?
    {
        out.pages.push((u32_of(row.get(0), "page id")?, row.get(1)));
    }
    for row in client
        .query(
            "SELECT id, kind, value FROM dims WHERE site = $1 AND id = ANY($2)",
            &[&site, &dims],
        )
        .await?
    {
        let kind: i16 = row.get(1);
        out.dims.push((
            u32_of(row.get(0), "dimension id")?,
            i64::from(kind),
            row.get(2),
        ));
    }
    Ok(out)
}

/// The first day all of whose raw events are still kept: days before it may have lost some
/// to retention (`meta.pruned_before_ms`; a local day starts up to 26 h before its UTC date).
async fn first_complete_day(client: &impl GenericClient) -> Result<i32, Fail> {
    let pruned: Option<i64> = client
        .query_opt("SELECT value FROM meta WHERE key = 'pruned_before_ms'", &[])
        .await?
        .map(|r| r.get(0));
    Ok(pruned.map_or(0, |ms| {
        i32::try_from(ms.div_euclid(86_400_000) + 2).unwrap_or(i32::MAX)
    }))
}

pub(super) async fn read_unsealed(
    store: &PgStore,
    site: &str,
    through: i32,
    limit: u32,
) -> Result<Vec<i32>, Fail> {
    let client = store.client().await?;
    let Some(site) = site_id(&client, site).await? else {
        return Ok(Vec::new());
    };
    let first = first_complete_day(&client).await?;
    let rows = client
        .query(
            "SELECT day FROM ( \
                 SELECT c.day FROM counters c JOIN pages p ON p.site = c.site AND p.id = c.scope \
                 WHERE c.site = $1 AND p.path = '' AND c.source = 0 AND c.day BETWEEN $2 AND $3 \
                 UNION SELECT day FROM event_counters WHERE site = $1 AND day BETWEEN $2 AND $3 \
             ) d WHERE NOT EXISTS (SELECT 1 FROM segments s WHERE s.site = $1 AND s.day = d.day) \
             ORDER BY day LIMIT $4",
            &[&site, &first, &through, &i64::from(limit)],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Seal one day in one transaction under its advisory lock.
pub(super) async fn seal_day(
    store: &PgStore,
    site: &SiteId,
    day: i32,
    day_start_ms: i64,
) -> Result<bool, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let Some(site) = site_id(&tx, site.as_str()).await? else {
        return Ok(false);
    };
    tx.execute(
        &format!("SELECT pg_advisory_xact_lock({DAY_LOCK})"),
        &[&site, &day],
    )
    .await?;
    let sealed: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM segments WHERE site = $1 AND day = $2)",
            &[&site, &day],
        )
        .await?
        .get(0);
    if sealed {
        return Ok(false);
    }
    let raw = raw_events(&tx, site, day, day).await?;
    let mut keys: Vec<&[u8]> = raw.iter().map(|e| &e.visitor[..]).collect();
    keys.sort_unstable();
    keys.dedup();
    let numbered = tx
        .execute(
            "INSERT INTO visitor_numbers (site, visitor) SELECT $1, v FROM unnest($2::bytea[]) v \
             ORDER BY v ON CONFLICT DO NOTHING",
            &[&site, &keys],
        )
        .await?;
    let set: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
    let known = stored_numbers(&tx, site, &set).await?;
    let events: Vec<DayEvent> = raw
        .into_iter()
        .map(|mut e| {
            e.event.visitor = known.get(&e.visitor).copied().unwrap_or(0);
            e.event
        })
        .collect();
    let (seg, events) = segment::build(day_start_ms, events);
    let stored = tx
        .execute(
            "INSERT INTO segments (site, day, version, visits, events) \
             VALUES ($1, $2, nextval('segment_versions'), $3, $4) ON CONFLICT DO NOTHING",
            &[&site, &day, &seg.bytes(), &events.bytes()],
        )
        .await?;
    if numbered > 0 {
        // Last: the row's lock is held until the commit.
        tx.execute(numbers::BUMP_GENERATION, &[]).await?;
    }
    tx.commit().await?;
    Ok(stored > 0)
}

/// In a batch's transaction, before it writes: share the day lock of every (site, day) it may
/// write (sorted), so no seal of those days runs across it.
pub(super) async fn lock_days(
    tx: &deadpool_postgres::Transaction<'_>,
    days: &[(i64, i32)],
) -> Result<(), Fail> {
    if days.is_empty() {
        return Ok(());
    }
    let (s, d): (Vec<i64>, Vec<i32>) = days.iter().copied().unzip();
    let lock = DAY_LOCK.replace("$1", "x.s").replace("$2", "x.d");
    tx.execute(
        &format!(
            "SELECT pg_advisory_xact_lock_shared({lock}) \
             FROM unnest($1::int8[], $2::int4[]) AS x(s, d) ORDER BY x.s, x.d"
        ),
        &[&s, &d],
    )
    .await?;
    Ok(())
}

/// In a batch's transaction, after it wrote: delete the segments of the (site, day)s it stored
/// or updated an event of (they are sealed again later).
pub(super) async fn unseal(
    tx: &deadpool_postgres::Transaction<'_>,
    days: &[(i64, i32)],
) -> Result<(), Fail> {
    if days.is_empty() {
        return Ok(());
    }
    // A day whose raw events may be pruned keeps its segment: it could not be sealed again
    // whole (`read_unsealed` never offers it), so the segment is what stays of its visits
    // (`first_complete_day`, in the same statement).
    let (s, d): (Vec<i64>, Vec<i32>) = days.iter().copied().unzip();
    tx.execute(
        "DELETE FROM segments WHERE (site, day) IN \
         (SELECT * FROM unnest($1::int8[], $2::int4[])) \
         AND day >= coalesce((SELECT (value / 86400000 + 2)::int4 FROM meta \
                              WHERE key = 'pruned_before_ms'), 0)",
        &[&s, &d],
    )
    .await?;
    Ok(())
}

/// Day numbers of the store for a read.
pub(super) fn days(from: jiff::civil::Date, to: jiff::civil::Date) -> (i32, i32) {
    (day_num(from), day_num(to))
}

/// Recount every sealed day of `site` (or of every site) whose raw events are kept, as on
/// SQLite (`store::sqlite::segments::verify`); a repair rebuilds a differing segment under
/// the day's lock.
pub(super) async fn verify(
    store: &PgStore,
    site: Option<&str>,
    repair: bool,
) -> Result<crate::store::VerifyReport, Fail> {
    let client = store.client().await?;
    let first = first_complete_day(&client).await?;
    let days: Vec<(i64, String, i32)> = client
        .query(
            "SELECT s.site, k.name, s.day FROM segments s JOIN site_keys k ON k.id = s.site \
             WHERE s.day >= $1 AND ($2::text IS NULL OR k.name = $2) ORDER BY s.site, s.day",
            &[&first, &site],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    drop(client);
    let mut report = crate::store::VerifyReport::default();
    for (id, name, day) in days {
        report.checked += 1;
        let mut client = store.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            &format!("SELECT pg_advisory_xact_lock({DAY_LOCK})"),
            &[&id, &day],
        )
        .await?;
        let stored: Option<(Vec<u8>, Vec<u8>)> = tx
            .query_opt(
                "SELECT visits, events FROM segments WHERE site = $1 AND day = $2",
                &[&id, &day],
            )
            .await?
            .map(|r| (r.get(0), r.get(1)));
        let Some((visits, events_part)) = stored else {
            continue;
        };
        let start = segment::Segment::decode(visits.clone()).map_or(0, |s| s.day_start_ms);
        let raw = raw_events(&tx, id, day, day).await?;
        let keys: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
        let known = stored_numbers(&tx, id, &keys).await?;
        let complete = keys.iter().all(|k| known.contains_key(k));
        let events: Vec<DayEvent> = raw
            .into_iter()
            .map(|mut e| {
                e.event.visitor = known.get(&e.visitor).copied().unwrap_or(u32::MAX);
                e.event
            })
            .collect();
        let (seg, evs) = segment::build(start, events);
        if complete && seg.bytes() == visits.as_slice() && evs.bytes() == events_part.as_slice() {
            continue;
        }
        let said = |b: &[u8]| {
            segment::Segment::decode(b.to_vec()).map_or((-1, -1), |s| {
                (s.visit_count() as i64, s.pageview_count as i64)
            })
        };
        let day_date = super::num_day(day).map_err(Fail::Store)?;
        report.drift.push(crate::store::Drift {
            key: format!("{name}/segment/{day_date}"),
            stored: said(&visits),
            recounted: if complete {
                said(seg.bytes())
            } else {
                (-1, -1)
            },
        });
        if repair {
            tx.execute(
                "DELETE FROM segments WHERE site = $1 AND day = $2",
                &[&id, &day],
            )
            .await?;
            tx.commit().await?;
            let site = SiteId::parse(&name)
                .map_err(|e| Fail::Store(StoreError::Invalid(format!("site {name:?}: {e}"))))?;
            seal_day(store, &site, day, start).await?;
            report.repaired = true;
        }
    }
    Ok(report)
}
