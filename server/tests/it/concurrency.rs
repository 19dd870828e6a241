//! Many clients at once, with the same event ids sent by several clients at the same moment:
//! every counter must be exact and agree with a recount from raw events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Barrier;

use crate::support::{Options, event_id_at, pageview, spawn_app_with};

const CLIENTS: usize = 32;
const UNIQUE: usize = 15_000;
const DUPLICATED: usize = 6_000;
const PAGES: usize = 25;
const VISITORS: usize = 4_000;

/// A tiny deterministic generator, so a failure can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

struct Event {
    id: String,
    page: String,
    /// `None`: the client keeps no visitor id (counted by the source hash: one visitor per day).
    visitor: Option<String>,
    day: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_counts_under_concurrent_duplicates() {
    // One test machine is one source: the per-source limit is off for this load.
    let mut app = spawn_app_with(Options {
        configure: crate::support::unlimited,
        ..Options::default()
    })
    .await;
    let now = app.now();
    let mut rng = Lcg(42);
    let visitors: Vec<String> = (0..VISITORS)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let events: Vec<Event> = (0..UNIQUE)
        .map(|_| {
            // Spread over the last 30 hours so two UTC days are involved.
            let at = now - jiff::SignedDuration::from_secs(rng.below(30 * 3600) as i64);
            Event {
                id: event_id_at(at),
                page: format!("/p{}", rng.below(PAGES)),
                visitor: (rng.below(20) != 0).then(|| visitors[rng.below(VISITORS)].clone()),
                day: at.to_zoned(jiff::tz::TimeZone::UTC).date().to_string(),
            }
        })
        .collect();

    // Rounds of CLIENTS slots; the copies of one event share a round, so several clients send
    // the same id at the same moment (a barrier starts every round).
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for (i, _) in events.iter().enumerate() {
        let copies = if i < DUPLICATED { 2 + rng.below(2) } else { 1 };
        if current.len() + copies > CLIENTS {
            rounds.push(std::mem::take(&mut current));
        }
        current.extend(std::iter::repeat_n(i, copies));
    }
    rounds.push(current);
    let total: usize = rounds.iter().map(Vec::len).sum();
    assert!(total >= 20_000, "{total} hits");
    assert!((total - UNIQUE) * 4 >= total, "at least 25% duplicates");

    let events = Arc::new(events);
    let rounds = Arc::new(rounds);
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for worker in 0..CLIENTS {
        let (events, rounds, barrier) = (
            Arc::clone(&events),
            Arc::clone(&rounds),
            Arc::clone(&barrier),
        );
        let client = crate::support::client();
        let url = app.url("/api/v1/hit");
        tasks.push(tokio::spawn(async move {
            let mut statuses: HashMap<String, usize> = HashMap::new();
            for round in rounds.iter() {
                barrier.wait().await;
                let Some(&i) = round.get(worker) else {
                    continue;
                };
                let e = &events[i];
                let body = pageview(&e.id, e.visitor.as_deref(), &e.page);
                let r = client
                    .post(&url)
                    .header("content-type", "text/plain")
                    .header("origin", crate::support::ORIGIN)
                    .body(body.to_string())
                    .send()
                    .await
                    .expect("request");
                assert_eq!(r.status(), 200);
                let v: Value = r.json().await.expect("json");
                *statuses
                    .entry(v["status"].as_str().expect("status").to_owned())
                    .or_default() += 1;
            }
            statuses
        }));
    }
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for (k, v) in t.await.expect("worker") {
            *statuses.entry(k).or_default() += v;
        }
    }
    assert_eq!(statuses.get("accepted"), Some(&UNIQUE), "{statuses:?}");
    assert_eq!(
        statuses.get("duplicate"),
        Some(&(total - UNIQUE)),
        "{statuses:?}"
    );

    // Expected numbers from the generated data.
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date().to_string();
    let key = |e: &Event| {
        e.visitor
            .clone()
            .unwrap_or_else(|| format!("source-hash-{}", e.day))
    };
    let mut page_all: HashMap<&str, (u64, HashSet<String>)> = HashMap::new();
    let mut page_today: HashMap<&str, (u64, HashSet<String>)> = HashMap::new();
    let mut site_all: (u64, HashSet<String>) = (0, HashSet::new());
    let mut site_today: (u64, HashSet<String>) = (0, HashSet::new());
    for e in events.iter() {
        let mut scopes = [page_all.entry(&e.page).or_default(), &mut site_all];
        for (views, visitors) in scopes.iter_mut() {
            *views += 1;
            visitors.insert(key(e));
        }
        if e.day == today {
            let mut scopes = [page_today.entry(&e.page).or_default(), &mut site_today];
            for (views, visitors) in scopes.iter_mut() {
                *views += 1;
                visitors.insert(key(e));
            }
        }
    }
    assert!(
        !page_today.is_empty() && site_today.0 < UNIQUE as u64,
        "both days are exercised"
    );
    for (page, (views, visitors)) in &page_all {
        let c = app.counts(page).await;
        assert_eq!(
            (c.page.views, c.page.visitors),
            (*views, visitors.len() as u64),
            "{page} all-time"
        );
        let (tv, tvis) = page_today
            .get(page)
            .map(|(v, s)| (*v, s.len() as u64))
            .unwrap_or((0, 0));
        assert_eq!(
            (c.page.today.views, c.page.today.visitors),
            (tv, tvis),
            "{page} today"
        );
        assert_eq!(
            (c.site.views, c.site.visitors),
            (site_all.0, site_all.1.len() as u64)
        );
        assert_eq!(
            (c.site.today.views, c.site.today.visitors),
            (site_today.0, site_today.1.len() as u64)
        );
    }
    let report = app.store.verify(false).await.expect("verify");
    assert!(
        report.drift.is_empty(),
        "{:?}",
        &report.drift[..report.drift.len().min(5)]
    );
    assert!(report.checked > 2 * PAGES as u64);
    app.stop().await;
}
