//! Committing a batch: raw events, visitor sets and counters in one transaction.
//!
//! Per new page view the visitor sets answer four questions — is the visitor new for the
//! page today, for the site today, for the page ever, for the site ever — with at most three
//! rows (`visits` for the page's and the site's day, `reach` for the page ever; the site ever
//! is the `reach` prefix) and lookups in lattice order: a page row of the day that exists
//! already implies all four answers ("not new"), so a repeat view costs one lookup or none
//! ([`SeenVisitors`]); a visitor already seen on the site today is not new to the site ever.
//! A row is looked up in the journal's copy and the tables, and a new one is appended to the
//! journal, not written into its table (see `journal`: a batch dirties a page or two for its
//! visitor rows instead of one page per row).
//!
//! Counter rows (`counters`, `event_counters`, `referrer_counters`) are summed in memory and upserted once per key
//! at the end of the batch, in ascending key order (a `BTreeMap`, never hash-map order): two
//! writers on one database then take row locks in the same order, which is what keeps
//! writers on a multi-writer backend from deadlocking each other (the [`EventSink`] contract).

use super::*;

/// The write transaction of one batch. `BEGIN IMMEDIATE` and `COMMIT` are cached statements,
/// prepared once per connection instead of parsed again for every batch (as rusqlite's
/// `Transaction` does); dropped while its transaction is still open (an error, a failed
/// `COMMIT`, a panic), it rolls back.
struct BatchTx<'c>(&'c Connection);

impl<'c> BatchTx<'c> {
    fn begin(conn: &'c Connection) -> Result<Self, StoreError> {
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        Ok(Self(conn))
    }

    fn commit(self) -> Result<(), StoreError> {
        self.0.prepare_cached("COMMIT")?.execute([])?;
        Ok(())
    }
}

impl std::ops::Deref for BatchTx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.0
    }
}

impl Drop for BatchTx<'_> {
    fn drop(&mut self) {
        // Back in autocommit mode only after a successful COMMIT: anything else rolls back.
        if !self.0.is_autocommit() {
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

/// Counter increments of one batch: (scope, source, day) → (views, new visitors), in key order.
type Deltas = std::collections::BTreeMap<(i64, i64, i64), (i64, i64)>;

/// Custom event increments of one batch: (site, name, day) → events, in key order.
type EventDeltas = std::collections::BTreeMap<(i64, String, i64), i64>;

/// Referred page views of one batch: (site, day, referring host) → views, in key order.
type ReferrerDeltas = std::collections::BTreeMap<(i64, i64, String), i64>;

pub(super) fn commit_batch(
    writer: &mut Writer,
    guard: &FileGuard,
    cap: u32,
    records: &[Record],
    import: Option<ImportOptions>,
) -> Result<Vec<Outcome>, StoreError> {
    let result = commit_inner(writer, guard, cap, records, import);
    if result.is_err() {
        // The journal's copy may hold rows of the rolled-back batch: never trust it again.
        writer.pending.invalidate();
    }
    result
}

fn commit_inner(
    writer: &mut Writer,
    guard: &FileGuard,
    cap: u32,
    records: &[Record],
    import: Option<ImportOptions>,
) -> Result<Vec<Outcome>, StoreError> {
    let Writer {
        conn,
        seen,
        ids,
        pending,
    } = writer;
    // Visitor rows this batch writes; remembered in `seen` only once the batch has committed.
    let mut written: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let tx = BatchTx::begin(conn)?;
    pending.begin(&tx)?;
    // The journal's highest seq after this batch's appends.
    let mut last_seq: Option<i64> = None;
    let mut outcomes = Vec::with_capacity(records.len());
    let mut resolver = Resolver::new(&tx, ids, cap);
    {
        let mut insert_event = tx.prepare_cached(
            "INSERT OR IGNORE INTO events (event_id, site, source, kind, page, name, dedupe, \
             visitor, at_ms, day, referrer, src, agent) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        )?;
        // An engagement report keeps the largest values sent for its page view: a resend or
        // a late, smaller report changes nothing (and is a duplicate).
        let mut engage = tx.prepare_cached(
            "UPDATE events SET engaged_ms = max(coalesce(engaged_ms, 0), ?3), \
             scroll = max(coalesce(scroll, -1), coalesce(?4, -1)) \
             WHERE event_id = ?1 AND site = ?2 AND kind = 0 \
             AND (coalesce(engaged_ms, 0) < ?3 OR coalesce(scroll, -1) < coalesce(?4, -1))",
        )?;
        let mut visit_exists = tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM visits WHERE day = ?1 AND scope = ?2 AND source = ?3 \
             AND visitor = ?4)",
        )?;
        let mut reach_exists = tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM reach WHERE site = ?1 AND source = ?2 AND visitor = ?3 \
             AND page = ?4)",
        )?;
        let mut reached_elsewhere = tx.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM reach WHERE site = ?1 AND source = ?2 AND visitor = ?3 \
             AND page != ?4)",
        )?;
        let mut append = journal::Appender::new(&tx)?;
        let mut insert_ledger =
            tx.prepare_cached("INSERT OR IGNORE INTO import_ledger (event_id) VALUES (?1)")?;
        // The latest event counted without being kept raw (imports of old events).
        let mut not_kept_until: Option<i64> = None;
        // Counters are summed in memory and written once per key at the end of the batch: a
        // batch of hits on few pages touches few counter rows.
        let mut deltas = Deltas::new();
        let mut event_deltas = EventDeltas::new();
        let mut referrer_deltas = ReferrerDeltas::new();
        // (site, day)s this batch stored events of: their segments, if sealed, are stale.
        let mut touched_days: std::collections::HashSet<(i64, i64)> = Default::default();
        for r in records {
            let day = day_num(r.day);
            if day < 0 {
                return Err(StoreError::Invalid(format!(
                    "day {} is before 1970-01-01",
                    r.day
                )));
            }
            let (kind, name, dedupe) = match &r.kind {
                HitKind::Engagement { engaged_ms, scroll } => {
                    let site = resolver.site(r.site.as_str())?;
                    let changed = engage.execute(params![
                        &r.event_id.as_bytes()[..],
                        site,
                        engaged_ms,
                        scroll,
                    ])?;
                    outcomes.push(if changed > 0 {
                        touched_days.insert((site, day));
                        Outcome::Accepted
                    } else {
                        Outcome::Duplicate
                    });
                    continue;
                }
                HitKind::Pageview => (KIND_PAGEVIEW, None, None),
                HitKind::Event { name, dedupe } => (
                    KIND_EVENT,
                    Some(name.as_str()),
                    dedupe.as_ref().map(|d| d.as_str()),
                ),
            };
            let site = resolver.site(r.site.as_str())?;
            let page = resolver.page(site, r.page.as_str(), day)?;
            let source = r.source.code();
            let src = match r.dims.src.as_str() {
                "" => None,
                value => Some(resolver.dim(site, DIM_SOURCE, value, day)?),
            };
            let agent = match &*r.dims.agent {
                "" => None,
                value => Some(resolver.dim(site, DIM_AGENT, value, day)?),
            };
            let visitor = &r.visitor.0;
            let keep_raw = import
                .and_then(|o| o.raw_before_ms)
                .is_none_or(|cut| r.at_ms >= cut);
            if import.is_some() && insert_ledger.execute([&r.event_id.as_bytes()[..]])? == 0 {
                outcomes.push(Outcome::Duplicate);
                continue;
            }
            if !keep_raw {
                not_kept_until = not_kept_until.max(Some(r.at_ms));
            }
            let inserted = if !keep_raw {
                1
            } else {
                insert_event.execute(params![
                    &r.event_id.as_bytes()[..],
                    site,
                    source,
                    kind,
                    page,
                    name,
                    dedupe,
                    &visitor[..],
                    r.at_ms,
                    day,
                    r.referrer,
                    src,
                    agent,
                ])?
            };
            if inserted == 0 {
                outcomes.push(Outcome::Duplicate);
                continue;
            }
            outcomes.push(Outcome::Accepted);
            touched_days.insert((site, day));
            if let Some(name) = name {
                for d in [day, ALL_TIME] {
                    *event_deltas.entry((site, name.to_owned(), d)).or_default() += 1;
                }
                continue;
            }
            if let Some(referrer) = &r.referrer {
                let host = crate::core::hit::referrer_host(referrer).to_owned();
                *referrer_deltas.entry((site, day, host)).or_default() += 1;
            }
            let site_scope = resolver.site_scope(site)?;
            let mut bump = |scope: i64, d: i64, new_visitor: bool| {
                let delta = deltas.entry((scope, source, d)).or_default();
                delta.0 += 1;
                delta.1 += i64::from(new_visitor);
            };
            // Lattice order: each answer "not new" settles the ones below it. A row is new
            // when it is in neither the journal nor its table; then it goes to the journal.
            let mut new_visit = |scope: i64| -> Result<bool, StoreError> {
                if pending.has_visit(day, scope, source, visitor)
                    || visit_exists.query_row(params![day, scope, source, &visitor[..]], |r| {
                        r.get::<_, bool>(0)
                    })?
                {
                    return Ok(false);
                }
                last_seq =
                    Some(pending.add_visit(&mut append, site, (day, scope, source, *visitor))?);
                Ok(true)
            };
            let page_key = seen.key(page, source, day, visitor);
            let page_day = !seen.contains(page_key) && written.insert(page_key) && new_visit(page)?;
            let (mut site_day, mut page_ever, mut site_ever) = (false, false, false);
            if page_day {
                let site_key = seen.key(site_scope, source, day, visitor);
                site_day =
                    !seen.contains(site_key) && written.insert(site_key) && new_visit(site_scope)?;
                page_ever = !pending.has_reach(site, source, visitor, page)
                    && !reach_exists.query_row(params![site, source, &visitor[..], page], |r| {
                        r.get::<_, bool>(0)
                    })?;
                if page_ever {
                    last_seq =
                        Some(pending.add_reach(&mut append, (site, source, *visitor, page))?);
                }
                site_ever = site_day
                    && page_ever
                    && !pending.reached_elsewhere(site, source, visitor, page)
                    && !reached_elsewhere
                        .query_row(params![site, source, &visitor[..], page], |r| {
                            r.get::<_, bool>(0)
                        })?;
            }
            bump(page, day, page_day);
            bump(page, ALL_TIME, page_ever);
            bump(site_scope, day, site_day);
            bump(site_scope, ALL_TIME, site_ever);
        }
        let mut bump_counter = tx.prepare_cached(
            "INSERT INTO counters (scope, source, day, views, visitors) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (scope, source, day) \
             DO UPDATE SET views = views + excluded.views, visitors = visitors + excluded.visitors",
        )?;
        for ((scope, source, day), (views, visitors)) in deltas {
            bump_counter.execute(params![scope, source, day, views, visitors])?;
        }
        let mut bump_event = tx.prepare_cached(
            "INSERT INTO event_counters (site, name, day, count) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (site, name, day) DO UPDATE SET count = count + excluded.count",
        )?;
        for ((site, name, day), count) in event_deltas {
            bump_event.execute(params![site, name, day, count])?;
        }
        let mut bump_referrer = tx.prepare_cached(
            "INSERT INTO referrer_counters (site, day, host, views) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (site, day, host) DO UPDATE SET views = views + excluded.views",
        )?;
        for ((site, day, host), views) in referrer_deltas {
            bump_referrer.execute(params![site, day, host, views])?;
        }
        super::segments::touched(&tx, &touched_days)?;
        if let Some(until) = import.and_then(|o| o.lease_until_ms) {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('import_until_ms', ?1) \
                 ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                [until],
            )?;
        }
        if let Some(ms) = not_kept_until {
            // Counted without raw events: for `verify`, exactly like raw events pruned.
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('pruned_before_ms', ?1) \
                 ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                [ms.saturating_add(1)],
            )?;
        }
    }
    let pending_ids = resolver.into_pending();
    // Last check before acknowledging: is this still the file everyone will open?
    guard.check_file()?;
    tx.commit()?;
    ids.absorb(pending_ids);
    pending.committed(last_seq);
    for key in written {
        seen.insert(key);
    }
    Ok(outcomes)
}
