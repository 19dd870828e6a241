//! Committing a batch: raw events, visitor sets and counters in one transaction.

use super::*;

/// Counter increments of one batch: (site, source, page, day) → (views, new visitors).
pub(super) type Deltas<'a> = HashMap<(&'a str, i64, &'a str, String), (i64, i64)>;

pub(super) fn commit_batch(
    conn: &mut Connection,
    seen: &mut SeenVisitors,
    records: &[Record],
) -> Result<Vec<Outcome>, StoreError> {
    // Visitor rows this batch writes; remembered in `seen` only once the batch has committed.
    let mut written: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut outcomes = Vec::with_capacity(records.len());
    {
        let mut insert_event = tx.prepare_cached(
            "INSERT OR IGNORE INTO events (event_id, site, source, kind, page, name, dedupe, \
             visitor, at_ms, day, referrer) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        )?;
        let mut insert_visitor = tx.prepare_cached(
            "INSERT OR IGNORE INTO visitors (site, source, page, day, visitor) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut bump_event = tx.prepare_cached(
            "INSERT INTO event_counters (site, name, day, count) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (site, name, day) DO UPDATE SET count = count + 1",
        )?;
        // Counters are summed in memory and written once per key at the end of the batch: a
        // batch of hits on few pages touches few counter rows.
        let mut deltas: Deltas<'_> = HashMap::new();
        for r in records {
            let day = day_key(r.day);
            let (kind, name, dedupe) = match &r.kind {
                HitKind::Pageview => (KIND_PAGEVIEW, None, None),
                HitKind::Event { name, dedupe } => (
                    KIND_EVENT,
                    Some(name.as_str()),
                    dedupe.as_ref().map(|d| d.as_str()),
                ),
            };
            let inserted = insert_event.execute(params![
                &r.event_id.as_bytes()[..],
                r.site.as_str(),
                r.source.code(),
                kind,
                r.page.as_str(),
                name,
                dedupe,
                &r.visitor.0[..],
                r.at_ms,
                day,
                r.referrer,
            ])?;
            if inserted == 0 {
                outcomes.push(Outcome::Duplicate);
                continue;
            }
            outcomes.push(Outcome::Accepted);
            if let Some(name) = name {
                for d in [day.as_str(), ALL_TIME] {
                    bump_event.execute(params![r.site.as_str(), name, d])?;
                }
                continue;
            }
            let (site, source) = (r.site.as_str(), r.source.code());
            for page in [r.page.as_str(), WHOLE_SITE] {
                for d in [day.as_str(), ALL_TIME] {
                    let key = seen.key(site, source, page, d, &r.visitor.0);
                    let new = if seen.contains(key) || !written.insert(key) {
                        0
                    } else {
                        insert_visitor.execute(params![site, source, page, d, &r.visitor.0[..]])?
                    };
                    let delta = deltas
                        .entry((site, source, page, d.to_owned()))
                        .or_default();
                    delta.0 += 1;
                    delta.1 += new as i64;
                }
            }
        }
        let mut bump_counter = tx.prepare_cached(
            "INSERT INTO counters (site, source, page, day, views, visitors) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (site, source, page, day) \
             DO UPDATE SET views = views + excluded.views, visitors = visitors + excluded.visitors",
        )?;
        for ((site, source, page, day), (views, visitors)) in deltas {
            bump_counter.execute(params![site, source, page, day, views, visitors])?;
        }
    }
    tx.commit()?;
    for key in written {
        seen.insert(key);
    }
    Ok(outcomes)
}
