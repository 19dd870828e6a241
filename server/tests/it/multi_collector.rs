//! Three real `tally serve` processes on one PostgreSQL schema and one Redis prefix, behind no
//! balancer (the clients pick collectors themselves, as a balancer would): 32 clients send
//! 20,000+ hits, 30 % of them duplicates, many of those to two collectors at the same moment;
//! one collector is killed with SIGKILL mid-load and the clients carry on with the others.
//! Then: every acknowledged hit is counted exactly once, the counters are exact, `tally verify`
//! is clean, and "live now" read from either surviving collector is the union.
//! Needs `TALLY_TEST_POSTGRES` and `TALLY_TEST_REDIS` (`.ci/run` sets both).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::Mutex;

use crate::store_conformance::postgres::Db;
use crate::support::{Binary, client, event_id_at, redis_cleanup, redis_url};

const SECRET: &str = "a-shared-secret-of-the-three-collectors-0123";
const CLIENTS: usize = 32;
/// Distinct events; with the duplicates, more than 20,000 requests.
const EVENTS: usize = 16_000;
const VISITORS: usize = 1_500;
const PAGES: usize = 60;

/// A collector: `tally serve` on the schema at `db_url`, sharing `redis` under `prefix`.
async fn start(db_url: &str, redis: &str, prefix: &str) -> Binary {
    let args = [
        "--db-pool",
        "4",
        "--redis",
        redis,
        "--redis-prefix",
        prefix,
        // One address sends everything here: no per-address limits.
        "--rate-limit-per-minute",
        "0",
        "--address-limit-per-minute",
        "0",
        // Long enough that every visitor of the run is still "live" when it is read.
        "--live-window-secs",
        "900",
        "--secret",
        SECRET,
    ];
    let dir = tempfile::tempdir().expect("dir");
    Binary::start_on(dir, db_url.into(), &args).await
}

/// One planned hit: its body, visitor and page.
#[derive(Clone)]
struct Planned {
    body: String,
    visitor: usize,
    page: usize,
}

fn plan() -> Vec<Planned> {
    let now = jiff::Timestamp::now();
    (0..EVENTS)
        .map(|i| {
            // Skewed pages: page k is picked about 1/(k+1) as often as page 0.
            let r = (i * 7919) % 1000;
            let page = ((PAGES as f64).powf(r as f64 / 1000.0) as usize).min(PAGES) - 1;
            let visitor = (i * 104_729) % VISITORS;
            let body = json!({
                "site": "multi", "type": "pageview", "event_id": event_id_at(now),
                "visitor_id": format!("00000000-0000-4000-8000-{visitor:012}"),
                "url": format!("https://multi.example/p{page}"), "referrer": null,
            })
            .to_string();
            Planned {
                body,
                visitor,
                page,
            }
        })
        .collect()
}

/// Send `body` to collector `first`, then to the next live ones until one acknowledges it;
/// returns the status it was acknowledged with.
async fn deliver(
    http: &reqwest::Client,
    bases: &[String],
    dead: &Mutex<HashSet<usize>>,
    first: usize,
    body: &str,
) -> String {
    for attempt in 0..(bases.len() * 20) {
        let c = (first + attempt) % bases.len();
        if dead.lock().await.contains(&c) {
            continue;
        }
        let sent = http
            .post(format!("{}/api/v1/hit", bases[c]))
            .header("content-type", "text/plain")
            .body(body.to_owned())
            .send()
            .await;
        if let Ok(r) = sent
            && r.status() == 200
            && let Ok(v) = r.json::<Value>().await
        {
            return v["status"].as_str().expect("status").to_owned();
        }
        // Refused, cut or not answered: not acknowledged, try another collector.
    }
    panic!("no collector acknowledged a hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_collectors_on_postgres_and_redis_count_exactly_through_a_kill() {
    let Some(db) = Db::new() else { return };
    let Some(redis) = redis_url() else { return };
    let url = db.url_in_schema();
    let prefix = format!("tally-test:{}:", uuid::Uuid::new_v4().simple());
    let status = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--db")
        .arg(&url)
        .args(["site", "add", "multi", "--origin", "*", "--public"])
        .env("TALLY_LOG", "warn")
        .status()
        .await
        .expect("site add");
    assert!(status.success());
    let mut collectors = Vec::new();
    for _ in 0..3 {
        collectors.push(start(&url, &redis, &prefix).await);
    }
    let bases: Arc<Vec<String>> = Arc::new(collectors.iter().map(|c| c.base.clone()).collect());
    let dead = Arc::new(Mutex::new(HashSet::new()));
    let planned = Arc::new(plan());
    // Statuses per event: every send's acknowledged status.
    let acks: Arc<Mutex<HashMap<usize, Vec<String>>>> = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client_no in 0..CLIENTS {
        let (bases, dead, planned, acks, next, sent) = (
            Arc::clone(&bases),
            Arc::clone(&dead),
            Arc::clone(&planned),
            Arc::clone(&acks),
            Arc::clone(&next),
            Arc::clone(&sent),
        );
        tasks.push(tokio::spawn(async move {
            let http = client();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= planned.len() {
                    return;
                }
                let first = (i + client_no) % bases.len();
                let body = &planned[i].body;
                let mut got = Vec::new();
                if i % 10 < 3 {
                    // A duplicate: the same hit to two collectors at the same moment.
                    let (a, b) = tokio::join!(
                        deliver(&http, &bases, &dead, first, body),
                        deliver(&http, &bases, &dead, first + 1, body)
                    );
                    got.extend([a, b]);
                    sent.fetch_add(2, Ordering::Relaxed);
                } else {
                    got.push(deliver(&http, &bases, &dead, first, body).await);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                acks.lock().await.entry(i).or_default().extend(got);
            }
        }));
    }
    // Mid-load, collector 2 is killed without warning.
    while next.load(Ordering::Relaxed) < EVENTS / 2 {
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    dead.lock().await.insert(2);
    collectors[2].child.start_kill().expect("kill -9");
    let _ = collectors[2].child.wait().await;
    for t in tasks {
        t.await.expect("client");
    }
    let total_sent = sent.load(Ordering::Relaxed);
    println!(
        "3 collectors, one killed at half time: {total_sent} requests for {EVENTS} events in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(total_sent > 20_000, "{total_sent} requests");

    // Every event acknowledged, never accepted twice. (Accepted zero times: its first commit's
    // answer died with the killed collector, and the resend found it stored — the counters
    // below prove it counted once.)
    let acks = acks.lock().await;
    assert_eq!(acks.len(), EVENTS);
    let mut unanswered_commits = 0;
    for (i, statuses) in acks.iter() {
        let accepted = statuses.iter().filter(|s| *s == "accepted").count();
        assert!(accepted <= 1, "event {i}: {statuses:?}");
        unanswered_commits += usize::from(accepted == 0);
    }
    assert!(
        unanswered_commits <= CLIENTS,
        "{unanswered_commits} hits without an accept"
    );
    println!(
        "{unanswered_commits} hits committed by the killed collector without an answer, found stored on resend"
    );
    // The counters are exact: views and distinct visitors of the site and of each page.
    let visitors: HashSet<usize> = planned.iter().map(|p| p.visitor).collect();
    let http = client();
    let counts = |base: String, page: String| {
        let http = http.clone();
        async move {
            http.get(format!("{base}/api/v1/counts?site=multi&page={page}"))
                .send()
                .await
                .expect("counts")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let mut page_views: HashMap<usize, (u64, HashSet<usize>)> = HashMap::new();
    for p in planned.iter() {
        let e = page_views.entry(p.page).or_default();
        e.0 += 1;
        e.1.insert(p.visitor);
    }
    let live_of: Vec<Value> = {
        let mut out = Vec::new();
        for base in bases.iter().take(2) {
            let v = counts(base.clone(), "/p0".into()).await;
            assert_eq!(v["site"]["views"], EVENTS as u64, "{v}");
            assert_eq!(v["site"]["visitors"], visitors.len() as u64, "{v}");
            out.push(v["live"].clone());
        }
        out
    };
    assert_eq!(
        live_of[0], live_of[1],
        "live read from either collector is the same union"
    );
    assert_eq!(
        live_of[0]["visitors"],
        visitors.len() as u64,
        "every visitor is live: the union of the three collectors"
    );
    for (page, (views, who)) in &page_views {
        let v = counts(bases[0].clone(), format!("/p{page}")).await;
        assert_eq!(v["page"]["views"], *views, "page {page}: {v}");
        assert_eq!(v["page"]["visitors"], who.len() as u64, "page {page}: {v}");
    }
    for c in collectors.iter_mut().take(2) {
        c.child.start_kill().expect("stop");
        let _ = c.child.wait().await;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tally"))
        .arg("--db")
        .arg(&url)
        .arg("verify")
        .env("TALLY_LOG", "warn")
        .output()
        .await
        .expect("verify");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && text.contains(", 0 drifted"),
        "{text}"
    );
    // Clean up the Redis keys (the schema goes with `db`).
    redis_cleanup(&redis, &prefix);
}
