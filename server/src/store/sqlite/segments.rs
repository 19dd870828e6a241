//! Day segments on SQLite (see [`crate::store::SegmentSource`]): the analytics' reads, the
//! seal of a finished day, and what a batch does to the segment of a day it adds to.
//!
//! - The index of a range is one read transaction: the sealed days with their versions, and
//!   the raw web events of the other days with their visitor numbers (stored ones, else
//!   numbers of that read). The stored parts are read apart, by day and version.
//! - A seal reads the day in a read transaction, then, in a short write transaction, checks
//!   that the day's write count (`day_revs`) is still what it read (a batch that wrote to the
//!   day since raised it), numbers the new visitor keys, and stores the segment built from
//!   what it read, under a new version. The read and the build stay off the write lock.
//! - A batch that stores or updates an event of a day raises the day's write count and
//!   deletes its segment, in its own transaction.

use std::collections::{HashMap, HashSet};

use super::*;
use crate::core::segment::{self, DayEvent};
use crate::store::numbers::{self, Numbers, Pending};
use crate::store::{DictionaryRows, PartsWanted, SegmentIndex, SegmentParts, TEMP_NUMBERS};

/// One raw web event of a day, before its visitor is numbered.
struct RawEvent {
    day: i64,
    visitor: [u8; 16],
    event: DayEvent,
}

pub(super) fn site_id(conn: &Connection, site: &str) -> Result<Option<i64>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT id FROM site_keys WHERE name = ?1")?
        .query_row([site], |r| r.get(0))
        .optional()?)
}

fn u32_of(n: i64, what: &str) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| StoreError::Invalid(format!("{what} {n} is out of range")))
}

/// The raw web events of `site` on the local days `from..=to` (all of them), in key order.
fn raw_events(
    conn: &Connection,
    site: i64,
    from: i64,
    to: i64,
) -> Result<Vec<RawEvent>, StoreError> {
    let (lo, hi) = event_id_range(from, to);
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, kind, page, name, visitor, at_ms, day, src, agent, engaged_ms, scroll \
         FROM events WHERE event_id >= ?1 AND event_id < ?2 AND site = ?3 AND source = 0 \
         AND day BETWEEN ?4 AND ?5",
    )?;
    let mut rows = stmt.query(params![&lo[..], &hi[..], site, from, to])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let id: Vec<u8> = row.get(0)?;
        let kind: i64 = row.get(1)?;
        let visitor: Vec<u8> = row.get(4)?;
        let (Ok(id), Ok(visitor)) = (<[u8; 16]>::try_from(id), <[u8; 16]>::try_from(visitor))
        else {
            // Only a first-release file could hold other lengths; such events are not visits.
            continue;
        };
        let scroll: Option<i64> = row.get(10)?;
        out.push(RawEvent {
            day: row.get(6)?,
            visitor,
            event: DayEvent {
                visitor: 0,
                at_ms: row.get(5)?,
                id,
                name: if kind == KIND_EVENT {
                    row.get(3)?
                } else {
                    None
                },
                page: u32_of(row.get(2)?, "page id")?,
                src: u32_of(row.get::<_, Option<i64>>(7)?.unwrap_or(0), "source id")?,
                agent: u32_of(row.get::<_, Option<i64>>(8)?.unwrap_or(0), "agent id")?,
                engaged_ms: u32::try_from(row.get::<_, Option<i64>>(9)?.unwrap_or(0).max(0))
                    .unwrap_or(u32::MAX),
                scroll: scroll.and_then(|s| u8::try_from(s).ok()),
            },
        });
    }
    Ok(out)
}

/// The stored number of each key (looked up in `cache`, then the table, at the numbering
/// generation of this snapshot: [`crate::store::numbers`]); keys without one are left out.
fn stored_numbers(
    conn: &Connection,
    cache: &Mutex<Numbers>,
    site: i64,
    keys: &HashSet<[u8; 16]>,
) -> Result<HashMap<[u8; 16], u32>, StoreError> {
    let generation: i64 = conn
        .prepare_cached(numbers::READ_GENERATION)?
        .query_row([], |r| r.get(0))?;
    let pending = Pending::start(cache, site, keys, generation);
    let mut stmt =
        conn.prepare_cached("SELECT num FROM visitor_numbers WHERE site = ?1 AND visitor = ?2")?;
    let mut found = HashMap::new();
    for key in pending.ask() {
        if let Some(num) = stmt
            .query_row(params![site, &key[..]], |r| r.get::<_, i64>(0))
            .optional()?
        {
            found.insert(*key, u32_of(num, "visitor number")?);
        }
    }
    Ok(pending.finish(found))
}

/// The read of [`crate::store::SegmentSource::segment_index`]; run it in a `snapshot`.
pub(super) fn read_index(
    conn: &Connection,
    numbers: &Mutex<Numbers>,
    site: &str,
    from: i64,
    to: i64,
) -> Result<SegmentIndex, StoreError> {
    let mut index = SegmentIndex::default();
    let Some(site) = site_id(conn, site)? else {
        return Ok(index);
    };
    let mut sealed_days = HashSet::new();
    {
        let mut days = conn.prepare_cached(
            "SELECT day, version FROM segments WHERE site = ?1 AND day BETWEEN ?2 AND ?3 \
             ORDER BY day",
        )?;
        let mut rows = days.query(params![site, from, to])?;
        while let Some(row) = rows.next()? {
            let day: i64 = row.get(0)?;
            sealed_days.insert(day);
            index.sealed.push((num_day(day)?, row.get(1)?));
        }
    }
    // The open days, read in runs of consecutive days between sealed ones.
    let mut raw = Vec::new();
    let mut day = from;
    while day <= to {
        if sealed_days.contains(&day) {
            day += 1;
            continue;
        }
        let start = day;
        while day <= to && !sealed_days.contains(&day) {
            day += 1;
        }
        raw.extend(raw_events(conn, site, start, day - 1)?);
    }
    let keys: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
    let mut known = stored_numbers(conn, numbers, site, &keys)?;
    let mut next = TEMP_NUMBERS;
    let mut by_day: std::collections::BTreeMap<i64, Vec<DayEvent>> = Default::default();
    for mut e in raw {
        e.event.visitor = *known.entry(e.visitor).or_insert_with(|| {
            next += 1;
            next - 1
        });
        by_day.entry(e.day).or_default().push(e.event);
    }
    for (day, events) in by_day {
        index.open.push((num_day(day)?, events));
    }
    Ok(index)
}

/// The read of [`crate::store::SegmentSource::segment_parts`].
pub(super) fn read_parts(
    conn: &Connection,
    site: &str,
    wanted: &[PartsWanted],
) -> Result<Vec<SegmentParts>, StoreError> {
    let Some(site) = site_id(conn, site)? else {
        return Ok(Vec::new());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT CASE WHEN ?4 THEN visits END, CASE WHEN ?5 THEN events END FROM segments \
         WHERE site = ?1 AND day = ?2 AND version = ?3",
    )?;
    let mut out = Vec::with_capacity(wanted.len());
    for w in wanted {
        let found = stmt
            .query_row(
                params![site, day_num(w.day), w.version, w.visits, w.events],
                |r| {
                    Ok((
                        r.get::<_, Option<Vec<u8>>>(0)?,
                        r.get::<_, Option<Vec<u8>>>(1)?,
                    ))
                },
            )
            .optional()?;
        if let Some((visits, events)) = found {
            out.push(SegmentParts {
                day: w.day,
                version: w.version,
                visits,
                events,
            });
        }
    }
    Ok(out)
}

/// Dictionary rows of `site` for the given ids.
pub(super) fn read_dictionary(
    conn: &Connection,
    site: &str,
    pages: &[u32],
    dims: &[u32],
) -> Result<DictionaryRows, StoreError> {
    let mut out = DictionaryRows::default();
    let Some(site) = site_id(conn, site)? else {
        return Ok(out);
    };
    let mut page = conn.prepare_cached("SELECT path FROM pages WHERE id = ?1 AND site = ?2")?;
    for &id in pages {
        if let Some(path) = page
            .query_row(params![id, site], |r| r.get::<_, String>(0))
            .optional()?
        {
            out.pages.push((id, path));
        }
    }
    let mut dim =
        conn.prepare_cached("SELECT kind, value FROM dims WHERE id = ?1 AND site = ?2")?;
    for &id in dims {
        if let Some((kind, value)) = dim
            .query_row(params![id, site], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .optional()?
        {
            out.dims.push((id, kind, value));
        }
    }
    Ok(out)
}

/// Days of `site` up to `through` with web page views or custom events and no segment, after
/// the raw-event prune marker (a pruned day cannot be rebuilt), oldest first.
/// The first day all of whose raw events are still kept: days before it may have lost some
/// to retention (`meta.pruned_before_ms`).
fn first_complete_day(conn: &Connection) -> Result<i64, StoreError> {
    let pruned: Option<i64> = conn
        .prepare_cached("SELECT value FROM meta WHERE key = 'pruned_before_ms'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    // A day may start up to 26 h before its UTC date (see `event_id_range`): only days
    // entirely after the marker are complete.
    Ok(pruned.map_or(0, |ms| {
        utc_day_num(jiff::Timestamp::from_millisecond(ms).unwrap_or_default()) + 2
    }))
}

pub(super) fn read_unsealed(
    conn: &Connection,
    site: &str,
    through: i64,
    limit: u32,
) -> Result<Vec<i64>, StoreError> {
    let Some(site) = site_id(conn, site)? else {
        return Ok(Vec::new());
    };
    let first = first_complete_day(conn)?;
    let mut stmt = conn.prepare_cached(
        "SELECT day FROM ( \
             SELECT c.day FROM counters c JOIN pages p ON p.id = c.scope \
             WHERE p.site = ?1 AND p.path = '' AND c.source = 0 AND c.day BETWEEN ?2 AND ?3 \
             UNION SELECT day FROM event_counters WHERE site = ?1 AND day BETWEEN ?2 AND ?3 \
         ) d WHERE NOT EXISTS (SELECT 1 FROM segments s WHERE s.site = ?1 AND s.day = d.day) \
         ORDER BY day LIMIT ?4",
    )?;
    let days = stmt
        .query_map(params![site, first, through, limit], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(days)
}

/// The day's write count: raised by every batch that stores or updates an event of it.
fn day_rev(conn: &Connection, site: i64, day: i64) -> Result<i64, StoreError> {
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(rev), 0) FROM day_revs WHERE site = ?1 AND day = ?2")?
        .query_row([site, day], |r| r.get(0))?)
}

/// What a seal read: the day's events with their keys, the numbers already stored, the day's
/// write count.
pub(super) struct SealRead {
    site: i64,
    day: i64,
    rev: i64,
    raw: Vec<RawEvent>,
    known: HashMap<[u8; 16], u32>,
}

/// The read half of a seal (in a `snapshot`): `None` when the day is sealed already or the
/// site unknown.
pub(super) fn seal_read(
    conn: &Connection,
    numbers: &Mutex<Numbers>,
    site: &str,
    day: i64,
) -> Result<Option<SealRead>, StoreError> {
    let Some(site) = site_id(conn, site)? else {
        return Ok(None);
    };
    let sealed: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM segments WHERE site = ?1 AND day = ?2)")?
        .query_row([site, day], |r| r.get(0))?;
    if sealed {
        return Ok(None);
    }
    let rev = day_rev(conn, site, day)?;
    let raw = raw_events(conn, site, day, day)?;
    let keys: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
    let known = stored_numbers(conn, numbers, site, &keys)?;
    Ok(Some(SealRead {
        site,
        day,
        rev,
        raw,
        known,
    }))
}

/// Visitor numbers a seal assigned: (key, number).
pub(super) type Assigned = Vec<([u8; 16], u32)>;

/// The write half of a seal, in the writer's transaction: whether the segment was stored.
/// Returns the numbers it assigned, for the cache once committed.
pub(super) fn seal_write(
    tx: &Connection,
    read: SealRead,
    day_start_ms: i64,
) -> Result<Option<Assigned>, StoreError> {
    let SealRead {
        site,
        day,
        rev,
        raw,
        mut known,
    } = read;
    let sealed: bool = tx
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM segments WHERE site = ?1 AND day = ?2)")?
        .query_row([site, day], |r| r.get(0))?;
    if sealed || day_rev(tx, site, day)? != rev {
        return Ok(None);
    }
    let mut assigned = Vec::new();
    {
        let mut insert =
            tx.prepare_cached("INSERT INTO visitor_numbers (site, visitor) VALUES (?1, ?2)")?;
        let mut find =
            tx.prepare_cached("SELECT num FROM visitor_numbers WHERE site = ?1 AND visitor = ?2")?;
        for e in &raw {
            if known.contains_key(&e.visitor) {
                continue;
            }
            // Another store on the file may have numbered it since the read.
            let num = match find
                .query_row(params![site, &e.visitor[..]], |r| r.get::<_, i64>(0))
                .optional()?
            {
                Some(num) => num,
                None => {
                    insert.execute(params![site, &e.visitor[..]])?;
                    tx.last_insert_rowid()
                }
            };
            let num = u32_of(num, "visitor number")?;
            if num >= TEMP_NUMBERS {
                return Err(StoreError::Invalid(
                    "visitor numbers are used up (2^31 per database)".into(),
                ));
            }
            known.insert(e.visitor, num);
            assigned.push((e.visitor, num));
        }
    }
    if !assigned.is_empty() {
        tx.prepare_cached(numbers::BUMP_GENERATION)?.execute([])?;
    }
    let events: Vec<DayEvent> = raw
        .into_iter()
        .map(|mut e| {
            e.event.visitor = known.get(&e.visitor).copied().unwrap_or(0);
            e.event
        })
        .collect();
    let (seg, events) = segment::build(day_start_ms, events);
    let version: i64 = tx
        .prepare_cached(
            "INSERT INTO meta (key, value) VALUES ('segment_version', 1) \
             ON CONFLICT (key) DO UPDATE SET value = meta.value + 1 RETURNING value",
        )?
        .query_row([], |r| r.get(0))?;
    tx.prepare_cached(
        "INSERT INTO segments (site, day, version, visits, events) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![site, day, version, seg.bytes(), events.bytes()])?;
    Ok(Some(assigned))
}

/// In a batch's transaction: raise the write count of each (site, day) it stored or updated an
/// event of, and delete the day's segment if it was sealed (it is sealed again later). A day
/// whose raw events may be pruned keeps its segment: it could not be sealed again whole
/// (`read_unsealed` never offers it), so the segment is what stays of its visits.
pub(super) fn touched(tx: &Connection, days: &HashSet<(i64, i64)>) -> Result<(), StoreError> {
    if days.is_empty() {
        return Ok(());
    }
    let mut days: Vec<&(i64, i64)> = days.iter().collect();
    days.sort_unstable();
    let first = first_complete_day(tx)?;
    let mut rev = tx.prepare_cached(
        "INSERT INTO day_revs (site, day, rev) VALUES (?1, ?2, 1) \
         ON CONFLICT (site, day) DO UPDATE SET rev = rev + 1",
    )?;
    let mut delete = tx.prepare_cached("DELETE FROM segments WHERE site = ?1 AND day = ?2")?;
    for (site, day) in days {
        rev.execute([site, day])?;
        if *day >= first {
            delete.execute([site, day])?;
        }
    }
    Ok(())
}

impl SealRead {
    pub(super) fn site(&self) -> i64 {
        self.site
    }
}

/// The sealed days of `site` (or of every site) whose raw events are all kept, oldest first:
/// (site id, site name, day).
fn sealed_days(
    conn: &Connection,
    site: Option<&str>,
) -> Result<Vec<(i64, String, i64)>, StoreError> {
    let first = first_complete_day(conn)?;
    let mut stmt = conn.prepare_cached(
        "SELECT s.site, k.name, s.day FROM segments s JOIN site_keys k ON k.id = s.site \
         WHERE s.day >= ?1 AND (?2 IS NULL OR k.name = ?2) ORDER BY s.site, s.day",
    )?;
    let rows = stmt
        .query_map(params![first, site], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// The visits and page views a stored visits part says (for a drift report).
fn said(bytes: &[u8]) -> (i64, i64) {
    segment::Segment::decode(bytes.to_vec()).map_or((-1, -1), |s| {
        (s.visit_count() as i64, s.pageview_count as i64)
    })
}

/// Recount every sealed day of `site` (or of every site) whose raw events are kept: the
/// stored parts must be the build of its raw events with their stored numbers. With
/// `repair`, a differing segment is rebuilt (numbering keys that have none).
pub(super) async fn verify(
    store: &SqliteStore,
    site: Option<String>,
    repair: bool,
) -> Result<crate::store::VerifyReport, StoreError> {
    let days = {
        let site = site.clone();
        store
            .read(move |conn| snapshot(conn, |tx| sealed_days(tx, site.as_deref())))
            .await?
    };
    let mut report = crate::store::VerifyReport::default();
    for (id, name, day) in days {
        report.checked += 1;
        let numbers = Arc::clone(&store.numbers);
        type Stored = Option<(Vec<u8>, Vec<u8>)>;
        let (stored, recount): (Stored, Stored) = store
            .read(move |conn| {
                snapshot(conn, |tx| {
                    let stored: Stored = tx
                        .prepare_cached(
                            "SELECT visits, events FROM segments WHERE site = ?1 AND day = ?2",
                        )?
                        .query_row([id, day], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()?;
                    let raw = raw_events(tx, id, day, day)?;
                    let keys: HashSet<[u8; 16]> = raw.iter().map(|e| e.visitor).collect();
                    let known = stored_numbers(tx, &numbers, id, &keys)?;
                    // A key without a number cannot be in a right segment.
                    let complete = keys.iter().all(|k| known.contains_key(k));
                    let start = stored
                        .as_ref()
                        .and_then(|(v, _)| segment::Segment::decode(v.clone()).ok())
                        .map_or(0, |s| s.day_start_ms);
                    let events = raw
                        .into_iter()
                        .map(|mut e| {
                            e.event.visitor = known.get(&e.visitor).copied().unwrap_or(u32::MAX);
                            e.event
                        })
                        .collect();
                    let (seg, evs) = segment::build(start, events);
                    Ok((
                        stored,
                        complete.then(|| (seg.bytes().to_vec(), evs.bytes().to_vec())),
                    ))
                })
            })
            .await?;
        let Some((visits, events)) = stored else {
            continue;
        };
        if recount.as_ref() == Some(&(visits.clone(), events.clone())) {
            continue;
        }
        let day_date = num_day(day)?;
        report.drift.push(crate::store::Drift {
            key: format!("{name}/segment/{day_date}"),
            stored: said(&visits),
            recounted: recount.as_ref().map_or((-1, -1), |(v, _)| said(v)),
        });
        if repair {
            let start = segment::Segment::decode(visits).map_or(0, |s| s.day_start_ms);
            let numbers = Arc::clone(&store.numbers);
            let assigned = store
                .write(move |w| {
                    let tx = w
                        .conn
                        .transaction_with_behavior(TransactionBehavior::Immediate)?;
                    tx.execute(
                        "DELETE FROM segments WHERE site = ?1 AND day = ?2",
                        [id, day],
                    )?;
                    let read = seal_read(&tx, &numbers, &name, day)?;
                    let out = match read {
                        Some(read) => seal_write(&tx, read, start)?,
                        None => None,
                    };
                    tx.commit()?;
                    Ok(out)
                })
                .await?;
            if let Some(assigned) = assigned {
                Numbers::remember(&store.numbers, id, assigned);
            }
            report.repaired = true;
        }
    }
    Ok(report)
}
