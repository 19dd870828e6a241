//! Committing a batch in one transaction, set at a time and in key order.
//!
//! Each step is ONE statement over arrays (`unnest`), its rows sorted by the table's key, so
//! two writers lock rows in the same order: keyed custom events (`event_keys`), raw events,
//! the per-day visitor sets of the pages, those of the sites, the all-time sets, then the
//! counters, custom-event counters and referrer counters (summed per key in memory first). The rows a statement
//! really inserted (`RETURNING`) decide, in record order, which record was new: the first
//! record of the batch claiming an inserted key gets it, as the SQLite writer decides one
//! record at a time. A visitor is new to the whole site ever only when its explicit all-time
//! site row (`reach` with the site scope) is inserted, so two writers cannot both count it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use tally_wire::Numbers;
use uuid::Uuid;

use super::intern::Resolver;
use super::prune::raise_marker;
use super::{ALL_TIME, Fail, KIND_EVENT, KIND_PAGEVIEW, PgStore, day_num};
use crate::core::filtered::FilteredRow;
use crate::core::hit::HitKind;
use crate::core::record::{Outcome, Record};
use crate::store::{
    DIM_AGENT, DIM_SOURCE, DailyImport, IMPORTED_SOURCE, ImportOptions, StoreError,
};

/// The advisory lock of one site's counters (`$1` = the site id, a single bigint key of the
/// schema and the site): commits share it for every site of their batch, a repair of that
/// site holds it exclusively.
pub(super) const SITE_LOCK: &str =
    "hashtextextended(current_schema() || ':site:' || ($1::int8)::text, 0)";

/// Take the shared side of the site locks of `sites` (sorted) for this transaction.
async fn share_site_locks(
    tx: &deadpool_postgres::Transaction<'_>,
    sites: &[i64],
) -> Result<(), Fail> {
    let lock = SITE_LOCK.replace("$1", "s");
    tx.execute(
        &format!("SELECT pg_advisory_xact_lock_shared({lock}) FROM unnest($1::int8[]) s"),
        &[&sites],
    )
    .await?;
    Ok(())
}

/// One record, resolved.
struct Row<'r> {
    index: usize,
    site: i64,
    scope: i64,
    source: i16,
    day: i32,
    /// The ids of its source and agent tuples (`dims`), when it has them.
    src: Option<i64>,
    agent: Option<i64>,
    record: &'r Record,
}

/// A per-day visitor row: (site, day, scope, source, visitor).
type VisitKey = (i64, i32, i64, i16, [u8; 16]);
/// An all-time visitor row: (site, source, visitor, scope).
type ReachKey = (i64, i16, [u8; 16], i64);

/// Commit `records` in one transaction; `import` (the import lane, see
/// [`crate::store::ImportSink`]) enters every id in the import ledger first and counts events
/// older than its raw cut without keeping them raw.
pub(super) async fn commit_batch(
    store: &PgStore,
    records: &[Record],
    import: Option<ImportOptions>,
) -> Result<Vec<Outcome>, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let mut resolver = Resolver::new(store, &tx, store.max_new_pages_per_day);

    // Ids, in key order (page-cap tallies are locked per (site, day)).
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&records[a], &records[b]);
        (x.site.as_str(), x.day, x.page.as_str()).cmp(&(y.site.as_str(), y.day, y.page.as_str()))
    });
    let mut rows: Vec<Option<Row<'_>>> = (0..records.len()).map(|_| None).collect();
    let mut scopes: HashMap<(i64, i32, &str), i64> = HashMap::new();
    // Engagement reports count nothing and intern nothing: they update their page view last.
    let mut engagements: Vec<usize> = Vec::new();
    for i in order {
        let r = &records[i];
        if matches!(r.kind, HitKind::Engagement { .. }) {
            engagements.push(i);
            continue;
        }
        let day = day_num(r.day);
        if day < 0 {
            return Err(Fail::Store(StoreError::Invalid(format!(
                "day {} is before 1970-01-01",
                r.day
            ))));
        }
        let site = resolver.site(r.site.as_str()).await?;
        let scope = match scopes.get(&(site, day, r.page.as_str())) {
            Some(scope) => *scope,
            None => {
                let scope = resolver.page(site, r.page.as_str(), day).await?;
                scopes.insert((site, day, r.page.as_str()), scope);
                scope
            }
        };
        rows[i] = Some(Row {
            index: i,
            site,
            scope,
            source: r.source.code() as i16,
            day,
            src: None,
            agent: None,
            record: r,
        });
    }
    let mut rows: Vec<Row<'_>> = rows.into_iter().flatten().collect();
    // Dimension tuples after every page (quota rows locked in one global order: pages first,
    // then tuples, each sorted), so two writers cannot wait on each other.
    let mut tuples: BTreeMap<(i64, i32, i16, &str), i64> = BTreeMap::new();
    for row in &rows {
        for (kind, value) in [
            (DIM_SOURCE as i16, row.record.dims.src.as_str()),
            (DIM_AGENT as i16, &*row.record.dims.agent),
        ] {
            if !value.is_empty() {
                tuples.insert((row.site, row.day, kind, value), 0);
            }
        }
    }
    for ((site, day, kind, value), id) in tuples.iter_mut() {
        *id = resolver.dim(*site, *kind, value, *day).await?;
    }
    for row in &mut rows {
        let id = |kind: i64, value: &str| {
            tuples
                .get(&(row.site, row.day, kind as i16, value))
                .copied()
        };
        row.src = id(DIM_SOURCE, &row.record.dims.src);
        row.agent = id(DIM_AGENT, &row.record.dims.agent);
    }
    // A repair of one of these sites waits for this batch, or this batch for the repair.
    let mut sites: Vec<i64> = rows.iter().map(|row| row.site).collect();
    sites.sort_unstable();
    sites.dedup();
    share_site_locks(&tx, &sites).await?;
    let mut outcomes = vec![Outcome::Duplicate; records.len()];

    // Duplicates inside the batch: only the first record of an id or key is a candidate.
    let mut ids_seen = HashSet::new();
    let mut keys_seen = HashSet::new();
    let mut candidates: Vec<&Row<'_>> = Vec::with_capacity(rows.len());
    for row in &rows {
        if !ids_seen.insert((row.site, row.record.event_id.uuid())) {
            continue;
        }
        if let HitKind::Event {
            name,
            dedupe: Some(key),
        } = &row.record.kind
            && !keys_seen.insert((row.site, name.as_str(), key.as_str()))
        {
            continue;
        }
        candidates.push(row);
    }
    if import.is_some() {
        candidates = enter_in_ledger(&tx, candidates).await?;
    }

    // Keyed custom events: the key first.
    let mut keyed: Vec<(i64, &str, &str, Uuid)> = candidates
        .iter()
        .filter_map(|row| match &row.record.kind {
            HitKind::Event {
                name,
                dedupe: Some(key),
            } => Some((
                row.site,
                name.as_str(),
                key.as_str(),
                row.record.event_id.uuid(),
            )),
            _ => None,
        })
        .collect();
    keyed.sort();
    let mut new_keys: HashSet<(i64, String, String)> = HashSet::new();
    if !keyed.is_empty() {
        let (s, n, k, e) = unzip4(&keyed);
        for row in tx
            .query(
                "INSERT INTO event_keys (site, name, dedupe, event_id) \
                 SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::uuid[]) \
                 ON CONFLICT DO NOTHING RETURNING site, name, dedupe",
                &[&s, &n, &k, &e],
            )
            .await?
        {
            new_keys.insert((row.get(0), row.get(1), row.get(2)));
        }
        candidates.retain(|row| match &row.record.kind {
            HitKind::Event {
                name,
                dedupe: Some(key),
            } => new_keys.contains(&(row.site, name.as_str().to_owned(), key.as_str().to_owned())),
            _ => true,
        });
    }

    // Raw events, in (site, event_id) order; imported events before the raw cut are counted
    // without a raw row, and the raw prune marker is raised past them.
    candidates.sort_by_key(|row| (row.site, row.record.event_id.uuid()));
    let cut = import.and_then(|o| o.raw_before_ms);
    let (kept, not_kept): (Vec<&Row<'_>>, Vec<&Row<'_>>) = candidates
        .iter()
        .partition(|row| cut.is_none_or(|cut| row.record.at_ms >= cut));
    // Days this batch writes: their locks shared (no seal runs across it), their segments
    // deleted (sealed again later).
    let mut days: Vec<(i64, i32)> = kept.iter().map(|row| (row.site, row.day)).collect();
    for &i in &engagements {
        let site = resolver.site(records[i].site.as_str()).await?;
        days.push((site, day_num(records[i].day)));
    }
    days.sort_unstable();
    days.dedup();
    super::segments::lock_days(&tx, &days).await?;
    let mut accepted = insert_events(&tx, &kept).await?;
    let engaged = engage(&tx, &mut resolver, records, &engagements, &mut outcomes).await?;
    let mut written: Vec<(i64, i32)> = kept
        .iter()
        .filter(|row| accepted.contains(&(row.site, row.record.event_id.uuid())))
        .map(|row| (row.site, row.day))
        .chain(engaged)
        .collect();
    written.sort_unstable();
    written.dedup();
    super::segments::unseal(&tx, &written).await?;
    if let Some(until) = import.and_then(|o| o.lease_until_ms) {
        raise_marker(&tx, "import_until_ms", until).await?;
    }
    if let Some(latest) = not_kept.iter().map(|row| row.record.at_ms).max() {
        accepted.extend(
            not_kept
                .iter()
                .map(|row| (row.site, row.record.event_id.uuid())),
        );
        raise_marker(&tx, "pruned_before_ms", latest.saturating_add(1)).await?;
    }
    let mut orphan_keys = Vec::new();
    let mut views: Vec<&Row<'_>> = Vec::new();
    let mut event_deltas: BTreeMap<(i64, String, i32), i64> = BTreeMap::new();
    let mut referrer_deltas: BTreeMap<(i64, i32, String), i64> = BTreeMap::new();
    for row in &candidates {
        let id = row.record.event_id.uuid();
        if !accepted.contains(&(row.site, id)) {
            if let HitKind::Event {
                name,
                dedupe: Some(key),
            } = &row.record.kind
            {
                orphan_keys.push((row.site, name.as_str().to_owned(), key.as_str().to_owned()));
            }
            continue;
        }
        outcomes[row.index] = Outcome::Accepted;
        match &row.record.kind {
            HitKind::Event { name, .. } => {
                for d in [row.day, ALL_TIME] {
                    *event_deltas
                        .entry((row.site, name.as_str().to_owned(), d))
                        .or_default() += 1;
                }
            }
            HitKind::Engagement { .. } => {}
            HitKind::Pageview => {
                if let Some(referrer) = &row.record.referrer {
                    let host = crate::core::hit::referrer_host(referrer).to_owned();
                    *referrer_deltas
                        .entry((row.site, row.day, host))
                        .or_default() += 1;
                }
                views.push(row);
            }
        }
    }
    // A new key whose event id was a duplicate: the key was not used after all.
    if !orphan_keys.is_empty() {
        let (s, n, k): (Vec<i64>, Vec<String>, Vec<String>) = orphan_keys.into_iter().fold(
            (Vec::new(), Vec::new(), Vec::new()),
            |(mut s, mut n, mut k), (a, b, c)| {
                s.push(a);
                n.push(b);
                k.push(c);
                (s, n, k)
            },
        );
        tx.execute(
            "DELETE FROM event_keys WHERE (site, name, dedupe) IN \
             (SELECT * FROM unnest($1::int8[], $2::text[], $3::text[]))",
            &[&s, &n, &k],
        )
        .await?;
    }
    views.sort_by_key(|row| row.index);
    let counter_deltas = count_views(&mut resolver, &tx, &views).await?;
    upsert_counters(&tx, &counter_deltas).await?;
    upsert_event_counters(&tx, &event_deltas).await?;
    upsert_referrer_counters(&tx, &referrer_deltas).await?;
    let pending = resolver.into_pending();
    tx.commit().await?;
    store.known().absorb(pending);
    Ok(outcomes)
}

/// Enter the ids of `candidates` in the import ledger (in id order); returns the candidates
/// whose id was not there yet.
async fn enter_in_ledger<'r>(
    tx: &deadpool_postgres::Transaction<'_>,
    candidates: Vec<&'r Row<'r>>,
) -> Result<Vec<&'r Row<'r>>, Fail> {
    let mut ids: Vec<Uuid> = candidates
        .iter()
        .map(|r| r.record.event_id.uuid())
        .collect();
    ids.sort_unstable();
    let new: HashSet<Uuid> = tx
        .query(
            "INSERT INTO import_ledger (event_id) SELECT * FROM unnest($1::uuid[]) \
             ON CONFLICT DO NOTHING RETURNING event_id",
            &[&ids],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(candidates
        .into_iter()
        .filter(|r| new.contains(&r.record.event_id.uuid()))
        .collect())
}

fn unzip4<A: Clone, B: ToString, C: ToString, D: Clone>(
    rows: &[(A, B, C, D)],
) -> (Vec<A>, Vec<String>, Vec<String>, Vec<D>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (a, b, c, d) in rows {
        out.0.push(a.clone());
        out.1.push(b.to_string());
        out.2.push(c.to_string());
        out.3.push(d.clone());
    }
    out
}

/// Insert the raw events; returns the (site, event id) of those really inserted.
async fn insert_events(
    tx: &deadpool_postgres::Transaction<'_>,
    rows: &[&Row<'_>],
) -> Result<HashSet<(i64, Uuid)>, Fail> {
    if rows.is_empty() {
        return Ok(HashSet::new());
    }
    let mut site = Vec::with_capacity(rows.len());
    let mut id = Vec::with_capacity(rows.len());
    let mut source = Vec::with_capacity(rows.len());
    let mut kind = Vec::with_capacity(rows.len());
    let mut page = Vec::with_capacity(rows.len());
    let mut name: Vec<Option<&str>> = Vec::with_capacity(rows.len());
    let mut dedupe: Vec<Option<&str>> = Vec::with_capacity(rows.len());
    let mut visitor: Vec<&[u8]> = Vec::with_capacity(rows.len());
    let mut at = Vec::with_capacity(rows.len());
    let mut day = Vec::with_capacity(rows.len());
    let mut referrer: Vec<Option<&str>> = Vec::with_capacity(rows.len());
    let mut src: Vec<Option<i64>> = Vec::with_capacity(rows.len());
    let mut agent: Vec<Option<i64>> = Vec::with_capacity(rows.len());
    for row in rows {
        src.push(row.src);
        agent.push(row.agent);
        let r = row.record;
        site.push(row.site);
        id.push(r.event_id.uuid());
        source.push(row.source);
        page.push(row.scope);
        let (k, n, d) = match &r.kind {
            HitKind::Pageview | HitKind::Engagement { .. } => (KIND_PAGEVIEW, None, None),
            HitKind::Event { name, dedupe } => (
                KIND_EVENT,
                Some(name.as_str()),
                dedupe.as_ref().map(|d| d.as_str()),
            ),
        };
        kind.push(k);
        name.push(n);
        dedupe.push(d);
        visitor.push(&r.visitor.0[..]);
        at.push(r.at_ms);
        day.push(row.day);
        referrer.push(r.referrer.as_deref());
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO events (site, event_id, source, kind, page, name, dedupe, visitor, \
             at_ms, day, referrer, src, agent) \
             SELECT * FROM unnest($1::int8[], $2::uuid[], $3::int2[], $4::int2[], $5::int8[], \
             $6::text[], $7::text[], $8::bytea[], $9::int8[], $10::int4[], $11::text[], \
             $12::int8[], $13::int8[]) \
             ON CONFLICT DO NOTHING RETURNING site, event_id",
        )
        .await?;
    let inserted = tx
        .query(
            &stmt,
            &[
                &site, &id, &source, &kind, &page, &name, &dedupe, &visitor, &at, &day, &referrer,
                &src, &agent,
            ],
        )
        .await?;
    Ok(inserted.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Apply the engagement reports of a batch (after its raw events, so a page view and its report
/// may share a batch): each page view keeps the largest engaged time and scroll depth it was
/// ever sent. Reports are judged in record order against the row as locked (`FOR UPDATE`, in
/// key order) and the reports before them, as the SQLite writer judges them one at a time: a
/// report is `Accepted` when it raised a value, else a `Duplicate`. Returns the (site, day)s of
/// the page views it changed.
async fn engage(
    tx: &deadpool_postgres::Transaction<'_>,
    resolver: &mut Resolver<'_>,
    records: &[Record],
    indices: &[usize],
    outcomes: &mut [Outcome],
) -> Result<Vec<(i64, i32)>, Fail> {
    if indices.is_empty() {
        return Ok(Vec::new());
    }
    let mut keyed: Vec<(usize, (i64, Uuid), i64, i16)> = Vec::with_capacity(indices.len());
    let mut day_of: HashMap<(i64, Uuid), i32> = HashMap::new();
    for &i in indices {
        let r = &records[i];
        let HitKind::Engagement { engaged_ms, scroll } = r.kind else {
            continue;
        };
        let site = resolver.site(r.site.as_str()).await?;
        day_of.insert((site, r.event_id.uuid()), day_num(r.day));
        keyed.push((
            i,
            (site, r.event_id.uuid()),
            i64::from(engaged_ms),
            scroll.map_or(-1, i16::from),
        ));
    }
    let keys: BTreeSet<(i64, Uuid)> = keyed.iter().map(|k| k.1).collect();
    let (s, id): (Vec<i64>, Vec<Uuid>) = keys.iter().copied().unzip();
    let mut current: HashMap<(i64, Uuid), (i64, i16, bool)> = HashMap::new();
    for row in tx
        .query(
            // One primary-key probe per key, locked in key order (the keys are sorted): a
            // plain join left the plan to the statistics of `kind`, which lag on a young,
            // fast-growing table and once chose a sort of every event (~1 s per batch at
            // 1.8 M events, against 13 ms so).
            "SELECT e.site, e.event_id, COALESCE(e.engaged_ms, 0), COALESCE(e.scroll, -1)::int2 \
             FROM unnest($1::int8[], $2::uuid[]) WITH ORDINALITY AS u(site, id, n) \
             CROSS JOIN LATERAL (SELECT site, event_id, engaged_ms, scroll FROM events \
               WHERE site = u.site AND event_id = u.id AND kind = 0 LIMIT 1 FOR UPDATE) e \
             ORDER BY u.n",
            &[&s, &id],
        )
        .await?
    {
        current.insert((row.get(0), row.get(1)), (row.get(2), row.get(3), false));
    }
    keyed.sort_by_key(|k| k.0);
    for (i, key, eng, scroll) in keyed {
        let Some(cur) = current.get_mut(&key) else {
            continue;
        };
        if eng > cur.0 || scroll > cur.1 {
            cur.0 = cur.0.max(eng);
            cur.1 = cur.1.max(scroll);
            cur.2 = true;
            outcomes[i] = Outcome::Accepted;
        }
    }
    let mut changed: Vec<_> = current.iter().filter(|(_, v)| v.2).collect();
    changed.sort_by_key(|(k, _)| **k);
    if changed.is_empty() {
        return Ok(Vec::new());
    }
    let days: Vec<(i64, i32)> = changed
        .iter()
        .filter_map(|(k, _)| day_of.get(*k).map(|d| (k.0, *d)))
        .collect();
    let (mut s, mut id, mut eng, mut scroll) = (vec![], vec![], vec![], vec![]);
    for ((site, event), (e, sc, _)) in changed {
        s.push(*site);
        id.push(*event);
        eng.push(*e);
        scroll.push(*sc);
    }
    tx.execute(
        "UPDATE events e SET engaged_ms = u.eng, scroll = NULLIF(u.scroll, -1) \
         FROM unnest($1::int8[], $2::uuid[], $3::int8[], $4::int2[]) AS u(site, id, eng, scroll) \
         WHERE e.site = u.site AND e.event_id = u.id",
        &[&s, &id, &eng, &scroll],
    )
    .await?;
    Ok(days)
}

/// Insert per-day visitor rows (sorted); returns those really inserted.
async fn insert_visits(
    tx: &deadpool_postgres::Transaction<'_>,
    keys: &BTreeSet<VisitKey>,
) -> Result<HashSet<VisitKey>, Fail> {
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    let (mut s, mut d, mut p, mut src, mut v) = (vec![], vec![], vec![], vec![], vec![]);
    for (site, day, scope, source, visitor) in keys {
        s.push(*site);
        d.push(*day);
        p.push(*scope);
        src.push(*source);
        v.push(&visitor[..]);
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO visits (site, day, scope, source, visitor) \
             SELECT * FROM unnest($1::int8[], $2::int4[], $3::int8[], $4::int2[], $5::bytea[]) \
             ON CONFLICT DO NOTHING RETURNING site, day, scope, source, visitor",
        )
        .await?;
    let rows = tx.query(&stmt, &[&s, &d, &p, &src, &v]).await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                visitor_key(r.get(4))?,
            ))
        })
        .collect()
}

/// Insert all-time visitor rows (sorted); returns those really inserted.
async fn insert_reach(
    tx: &deadpool_postgres::Transaction<'_>,
    keys: &BTreeSet<ReachKey>,
) -> Result<HashSet<ReachKey>, Fail> {
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    let (mut s, mut src, mut v, mut p) = (vec![], vec![], vec![], vec![]);
    for (site, source, visitor, scope) in keys {
        s.push(*site);
        src.push(*source);
        v.push(&visitor[..]);
        p.push(*scope);
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO reach (site, source, visitor, page) \
             SELECT * FROM unnest($1::int8[], $2::int2[], $3::bytea[], $4::int8[]) \
             ON CONFLICT DO NOTHING RETURNING site, source, visitor, page",
        )
        .await?;
    let rows = tx.query(&stmt, &[&s, &src, &v, &p]).await?;
    rows.iter()
        .map(|r| Ok((r.get(0), r.get(1), visitor_key(r.get(2))?, r.get(3))))
        .collect()
}

fn visitor_key(bytes: &[u8]) -> Result<[u8; 16], Fail> {
    bytes
        .try_into()
        .map_err(|_| Fail::Store(StoreError::Invalid("visitor key is not 16 bytes".into())))
}

/// Counter increments: (site, scope, source, day) → (views, new visitors).
type Deltas = BTreeMap<(i64, i64, i16, i32), (i64, i64)>;

/// The visitor sets and counter increments of the accepted page views (in record order).
async fn count_views(
    resolver: &mut Resolver<'_>,
    tx: &deadpool_postgres::Transaction<'_>,
    views: &[&Row<'_>],
) -> Result<Deltas, Fail> {
    let mut deltas = Deltas::new();
    if views.is_empty() {
        return Ok(deltas);
    }
    let mut site_scopes = Vec::with_capacity(views.len());
    for row in views {
        site_scopes.push(resolver.site_scope(row.site).await?);
    }
    let visitor = |row: &Row<'_>| row.record.visitor.0;
    // The first record claiming an inserted key is the new one.
    fn claim<K: std::hash::Hash + Eq + Clone>(
        inserted: &HashSet<K>,
        claimed: &mut HashSet<K>,
        key: &K,
    ) -> bool {
        inserted.contains(key) && claimed.insert(key.clone())
    }
    let page_keys: Vec<VisitKey> = views
        .iter()
        .map(|r| (r.site, r.day, r.scope, r.source, visitor(r)))
        .collect();
    let inserted = insert_visits(tx, &page_keys.iter().copied().collect()).await?;
    let mut claimed = HashSet::new();
    let page_day: Vec<bool> = page_keys
        .iter()
        .map(|k| claim(&inserted, &mut claimed, k))
        .collect();

    let site_keys: Vec<VisitKey> = views
        .iter()
        .zip(&site_scopes)
        .map(|(r, s)| (r.site, r.day, *s, r.source, visitor(r)))
        .collect();
    let wanted: BTreeSet<VisitKey> = site_keys
        .iter()
        .zip(&page_day)
        .filter(|(_, new)| **new)
        .map(|(k, _)| *k)
        .collect();
    let inserted = insert_visits(tx, &wanted).await?;
    let mut claimed = HashSet::new();
    let site_day: Vec<bool> = site_keys
        .iter()
        .zip(&page_day)
        .map(|(k, new)| *new && claim(&inserted, &mut claimed, k))
        .collect();

    let page_reach: Vec<ReachKey> = views
        .iter()
        .map(|r| (r.site, r.source, visitor(r), r.scope))
        .collect();
    let site_reach: Vec<ReachKey> = views
        .iter()
        .zip(&site_scopes)
        .map(|(r, s)| (r.site, r.source, visitor(r), *s))
        .collect();
    let mut wanted: BTreeSet<ReachKey> = BTreeSet::new();
    for i in 0..views.len() {
        if page_day[i] {
            wanted.insert(page_reach[i]);
        }
        if site_day[i] {
            wanted.insert(site_reach[i]);
        }
    }
    let inserted = insert_reach(tx, &wanted).await?;
    let mut claimed = HashSet::new();
    for (i, row) in views.iter().enumerate() {
        let page_ever = page_day[i] && claim(&inserted, &mut claimed, &page_reach[i]);
        let site_ever = site_day[i] && claim(&inserted, &mut claimed, &site_reach[i]);
        let mut bump = |scope: i64, day: i32, new: bool| {
            let d = deltas
                .entry((row.site, scope, row.source, day))
                .or_default();
            d.0 += 1;
            d.1 += i64::from(new);
        };
        bump(row.scope, row.day, page_day[i]);
        bump(row.scope, ALL_TIME, page_ever);
        bump(site_scopes[i], row.day, site_day[i]);
        bump(site_scopes[i], ALL_TIME, site_ever);
    }
    Ok(deltas)
}

/// Add the increments to `counters`, one statement, in key order.
async fn upsert_counters(
    tx: &deadpool_postgres::Transaction<'_>,
    deltas: &Deltas,
) -> Result<(), Fail> {
    if deltas.is_empty() {
        return Ok(());
    }
    let (mut s, mut p, mut src, mut d, mut v, mut n) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for ((site, scope, source, day), (views, visitors)) in deltas {
        s.push(*site);
        p.push(*scope);
        src.push(*source);
        d.push(*day);
        v.push(*views);
        n.push(*visitors);
    }
    let stmt = tx
        .prepare_cached(
            "INSERT INTO counters (site, scope, source, day, views, visitors) \
             SELECT * FROM unnest($1::int8[], $2::int8[], $3::int2[], $4::int4[], $5::int8[], \
             $6::int8[]) ON CONFLICT (site, scope, source, day) DO UPDATE SET \
             views = counters.views + excluded.views, \
             visitors = counters.visitors + excluded.visitors",
        )
        .await?;
    tx.execute(&stmt, &[&s, &p, &src, &d, &v, &n]).await?;
    Ok(())
}

async fn upsert_event_counters(
    tx: &deadpool_postgres::Transaction<'_>,
    deltas: &BTreeMap<(i64, String, i32), i64>,
) -> Result<(), Fail> {
    if deltas.is_empty() {
        return Ok(());
    }
    let (mut s, mut n, mut d, mut c) = (vec![], vec![], vec![], vec![]);
    for ((site, name, day), count) in deltas {
        s.push(*site);
        n.push(name.as_str());
        d.push(*day);
        c.push(*count);
    }
    tx.execute(
        "INSERT INTO event_counters (site, name, day, count) \
         SELECT * FROM unnest($1::int8[], $2::text[], $3::int4[], $4::int8[]) \
         ON CONFLICT (site, name, day) DO UPDATE SET count = event_counters.count + excluded.count",
        &[&s, &n, &d, &c],
    )
    .await?;
    Ok(())
}

/// Add referred views per (site, day, host), in key order (the lock order of every writer).
async fn upsert_referrer_counters(
    tx: &deadpool_postgres::Transaction<'_>,
    deltas: &BTreeMap<(i64, i32, String), i64>,
) -> Result<(), Fail> {
    if deltas.is_empty() {
        return Ok(());
    }
    let (mut s, mut d, mut h, mut v) = (vec![], vec![], vec![], vec![]);
    for ((site, day, host), views) in deltas {
        s.push(*site);
        d.push(*day);
        h.push(host.as_str());
        v.push(*views);
    }
    tx.execute(
        "INSERT INTO referrer_counters (site, day, host, views) \
         SELECT * FROM unnest($1::int8[], $2::int4[], $3::text[], $4::int8[]) \
         ON CONFLICT (site, day, host) DO UPDATE SET views = referrer_counters.views + excluded.views",
        &[&s, &d, &h, &v],
    )
    .await?;
    Ok(())
}

/// Add views not counted, summed per key and written in key order.
pub(super) async fn add_filtered(store: &PgStore, rows: &[FilteredRow]) -> Result<(), Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let mut resolver = Resolver::new(store, &tx, 0);
    let mut sums: BTreeMap<(i64, i32, i16), i64> = BTreeMap::new();
    let mut names: Vec<&str> = rows.iter().map(|r| r.site.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let mut ids = HashMap::new();
    for name in names {
        ids.insert(name, resolver.site(name).await?);
    }
    for r in rows {
        let site = ids.get(r.site.as_str()).copied().unwrap_or_default();
        *sums
            .entry((site, day_num(r.day), i16::from(r.reason.code())))
            .or_default() += i64::try_from(r.count).unwrap_or(i64::MAX);
    }
    let (mut s, mut d, mut k, mut c) = (vec![], vec![], vec![], vec![]);
    for ((site, day, reason), count) in sums {
        s.push(site);
        d.push(day);
        k.push(reason);
        c.push(count);
    }
    tx.execute(
        "INSERT INTO filtered (site, day, reason, count) \
         SELECT * FROM unnest($1::int8[], $2::int4[], $3::int2[], $4::int8[]) \
         ON CONFLICT (site, day, reason) DO UPDATE SET count = filtered.count + excluded.count",
        &[&s, &d, &k, &c],
    )
    .await?;
    let pending = resolver.into_pending();
    tx.commit().await?;
    store.known().absorb(pending);
    Ok(())
}

/// Set the carried-over numbers of a site (`page` empty) or one page.
pub(super) async fn set_base(
    store: &PgStore,
    site: &str,
    page: &str,
    base: Numbers,
) -> Result<(), Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let mut resolver = Resolver::new(store, &tx, 0);
    let site = resolver.site(site).await?;
    let scope = resolver.page_uncapped(site, page).await?;
    tx.execute(
        "INSERT INTO bases (site, scope, views, visitors) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (site, scope) DO UPDATE SET views = excluded.views, \
         visitors = excluded.visitors",
        &[
            &site,
            &scope,
            &i64::try_from(base.views).unwrap_or(i64::MAX),
            &i64::try_from(base.visitors).unwrap_or(i64::MAX),
        ],
    )
    .await?;
    let pending = resolver.into_pending();
    tx.commit().await?;
    store.known().absorb(pending);
    Ok(())
}

/// Store imported daily aggregates of `site` (see [`crate::store::ImportSink::import_daily`]):
/// each row replaces the one of its (scope, day), then each scope's all-time imported row is
/// summed again.
pub(super) async fn import_daily(
    store: &PgStore,
    site: &str,
    rows: &[DailyImport],
) -> Result<u64, Fail> {
    let mut client = store.client().await?;
    let tx = client.transaction().await?;
    let mut resolver = Resolver::new(store, &tx, 0);
    let site = resolver.site(site).await?;
    let source = IMPORTED_SOURCE as i16;
    let mut keyed: BTreeMap<(i64, i32), (i64, i64)> = BTreeMap::new();
    for row in rows {
        let day = day_num(row.day);
        if day < 0 {
            return Err(Fail::Store(StoreError::Invalid(format!(
                "day {} is before 1970-01-01",
                row.day
            ))));
        }
        let path = row.page.as_ref().map_or("", |p| p.as_str());
        let scope = resolver.page_uncapped(site, path).await?;
        // A later row of the same (scope, day) replaces an earlier one, as in SQLite.
        keyed.insert(
            (scope, day),
            (
                i64::try_from(row.views).unwrap_or(i64::MAX),
                i64::try_from(row.visitors).unwrap_or(i64::MAX),
            ),
        );
    }
    let (mut p, mut d, mut v, mut n) = (vec![], vec![], vec![], vec![]);
    for ((scope, day), (views, visitors)) in &keyed {
        p.push(*scope);
        d.push(*day);
        v.push(*views);
        n.push(*visitors);
    }
    tx.execute(
        "INSERT INTO counters (site, scope, source, day, views, visitors) \
         SELECT $1::int8, u.scope, $2::int2, u.day, u.views, u.visitors \
         FROM unnest($3::int8[], $4::int4[], $5::int8[], $6::int8[]) AS u(scope, day, views, visitors) \
         ON CONFLICT (site, scope, source, day) DO UPDATE SET views = excluded.views, \
         visitors = excluded.visitors",
        &[&site, &source, &p, &d, &v, &n],
    )
    .await?;
    let mut scopes: Vec<i64> = keyed.keys().map(|(scope, _)| *scope).collect();
    scopes.dedup();
    tx.execute(
        "INSERT INTO counters (site, scope, source, day, views, visitors) \
         SELECT $1, c.scope, $2::int2, -1, SUM(c.views), SUM(c.visitors) FROM counters c \
         WHERE c.site = $1 AND c.source = $2 AND c.day >= 0 AND c.scope = ANY($3::int8[]) \
         GROUP BY c.scope ORDER BY c.scope \
         ON CONFLICT (site, scope, source, day) DO UPDATE SET views = excluded.views, \
         visitors = excluded.visitors",
        &[&site, &source, &scopes],
    )
    .await?;
    // Rows are set, not added to: kept page rows of every store are dropped.
    tx.execute(crate::store::daysets::BUMP_GENERATION, &[])
        .await?;
    let pending = resolver.into_pending();
    tx.commit().await?;
    store.known().absorb(pending);
    Ok(rows.len() as u64)
}
