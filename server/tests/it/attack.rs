//! The attack suite: one test per way a single hostile client could exhaust disk, memory,
//! connections or sites, each asserting the bound that now holds (SECURITY.md maps threats to
//! these tests). Real HTTP over loopback; the real binary where memory or files matter.

use std::collections::HashMap;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{
    Binary, ORIGIN, Options, client, client_from, event_id_at, pageview, post_hit, spawn_app_with,
};

/// Answers by status code.
fn tally_statuses(codes: &[u16]) -> HashMap<u16, usize> {
    let mut by = HashMap::new();
    for c in codes {
        *by.entry(*c).or_default() += 1;
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_agent_rotation_buys_no_fresh_allowance() {
    // Default limits: 120 records per minute per (address, site). The clock stands still.
    let mut app = spawn_app_with(Options::default()).await;
    let allowance = 120usize;
    let now = app.now();
    let bodies: Vec<(String, String)> = (0..5_000)
        .map(|i| {
            (
                format!("Mozilla/5.0 (X11; Linux x86_64) Chrome/126.{i}"),
                pageview(
                    &event_id_at(now),
                    Some(&uuid::Uuid::new_v4().to_string()),
                    &format!("/p{i}"),
                )
                .to_string(),
            )
        })
        .collect();
    let http = client();
    let url = app.url("/api/v1/hit");
    let codes: Vec<u16> = futures_util::stream::iter(bodies)
        .map(|(ua, body)| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                http.post(url)
                    .header("user-agent", ua)
                    .header("content-type", "text/plain")
                    .header("origin", ORIGIN)
                    .body(body)
                    .send()
                    .await
                    .expect("request")
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let by = tally_statuses(&codes);
    assert_eq!(by.get(&200).copied().unwrap_or(0), allowance, "{by:?}");
    assert_eq!(by.get(&429).copied().unwrap_or(0), 5_000 - allowance);
    let counts = app.counts("/").await;
    assert_eq!(
        counts.site.views, allowance as u64,
        "only admitted hits stored"
    );
    app.assert_no_drift().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sites_badges_and_pixels_draw_on_one_address_allowance() {
    let mut app = spawn_app_with(Options {
        configure: |c| {
            c.auto_sites = true;
            c.repeat_interval_secs = 0;
        },
        ..Options::default()
    })
    .await;
    let now = app.now();
    // 200 new site ids from one address: at most 10 sites are created (per hour).
    let mut created = 0;
    let mut limited = 0;
    for i in 0..200 {
        let body = json!({"site": format!("rnd{i}"), "type": "pageview",
            "event_id": event_id_at(now), "visitor_id": null,
            "url": format!("https://rnd{i}.example/x"), "referrer": null});
        let r = app.post_hit(&body).await;
        match r.status().as_u16() {
            200 => created += 1,
            429 => {
                limited += 1;
                assert_eq!(
                    r.json::<Value>().await.expect("json")["error"],
                    "rate_limited"
                );
            }
            other => panic!("unexpected {other}"),
        }
    }
    let sites = app.store.list_sites().await.expect("sites").len();
    assert_eq!(created, 10);
    assert_eq!(limited, 190);
    assert_eq!(sites, 11, "blog + 10 created");
    // Badge and pixel fetches of 1,000 distinct pages with a new user agent each: counted
    // views stop at the (address, site) allowance of 120, the images are still served.
    let mut counted = 0;
    for i in 0..1_000 {
        let path = if i % 2 == 0 {
            format!("/badge/blog.svg?page=/b{i}")
        } else {
            format!("/api/v1/pixel.gif?site=blog&page=/p{i}")
        };
        let r = app
            .client
            .get(app.url(&path))
            .header("user-agent", format!("Mozilla/5.0 Chrome/{i}"))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "images never break");
        let status = r.headers()["x-tally-status"]
            .to_str()
            .expect("ascii")
            .to_owned();
        match status.as_str() {
            "accepted" => counted += 1,
            "rate_limited" => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(counted, 120, "the (address, site) allowance");
    // Pixels for the ten created sites: their own per-site buckets have room, but the address
    // allowance across all sites (600) is spent after 600 - 10 - 120 = 470 more.
    let mut counted = 0;
    for i in 0..1_000 {
        let r = app
            .client
            .get(app.url(&format!("/api/v1/pixel.gif?site=rnd{}&page=/q{i}", i % 10)))
            .header("user-agent", format!("Mozilla/5.0 Firefox/{i}"))
            .send()
            .await
            .expect("request");
        if r.headers()["x-tally-status"] == "accepted" {
            counted += 1;
        }
    }
    assert_eq!(counted, 470, "the address allowance across sites");
    app.stop().await;
}

#[tokio::test]
async fn reads_head_and_display_only_badges_never_create_sites() {
    let mut app = spawn_app_with(Options {
        configure: |c| c.auto_sites = true,
        ..Options::default()
    })
    .await;
    for path in [
        "/api/v1/counts?site=ghost1&page=/",
        "/dashboard/ghost2",
        "/api/v1/sites/ghost3/series",
        "/api/v1/sites/ghost4/top",
        "/badge/ghost5.svg?count=0",
    ] {
        let r = app.get(path).await;
        assert!(r.status().is_client_error(), "{path}: {}", r.status());
    }
    for path in ["/badge/ghost6.svg", "/api/v1/pixel.gif?site=ghost7&page=/"] {
        let r = app
            .client
            .head(app.url(path))
            .send()
            .await
            .expect("request");
        assert!(r.status().is_client_error(), "HEAD {path}: {}", r.status());
    }
    let sites: Vec<String> = app
        .store
        .list_sites()
        .await
        .expect("sites")
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    assert_eq!(sites, ["blog"], "reads created nothing");
    // HEAD never counts on an existing site either.
    for path in [
        "/badge/blog.svg?page=/h",
        "/api/v1/pixel.gif?site=blog&page=/h",
    ] {
        let r = app
            .client
            .head(app.url(path))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "HEAD {path}");
    }
    assert_eq!(app.counts("/h").await.page.views, 0);
    // A counting fetch creates the site (and counts).
    let r = app.get("/badge/fresh.svg").await;
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert!(
        app.store
            .list_sites()
            .await
            .expect("sites")
            .iter()
            .any(|s| s.id.as_str() == "fresh")
    );
    app.stop().await;
}

#[tokio::test]
async fn max_sites_refuses_with_a_clear_4xx() {
    let mut app = spawn_app_with(Options {
        configure: |c| {
            c.auto_sites = true;
            c.max_sites = 2;
        },
        ..Options::default()
    })
    .await;
    let now = app.now();
    let hit = |site: &str| {
        json!({"site": site, "type": "pageview", "event_id": event_id_at(now),
               "visitor_id": null, "url": "https://x.example/", "referrer": null})
    };
    assert_eq!(app.post_hit(&hit("second")).await.status(), 200);
    let r = app.post_hit(&hit("third")).await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "site_limit_reached"
    );
    app.stop().await;
}

fn batch(n: usize, now: jiff::Timestamp) -> Value {
    json!({"events": (0..n)
        .map(|i| pageview(&event_id_at(now), Some("0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01"), &format!("/b{i}")))
        .collect::<Vec<_>>()})
}

async fn post_batch(app: &crate::support::TestApp, body: &Value) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/events"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn an_anonymous_batch_over_its_allowance_gets_a_4xx_never_an_endless_429() {
    let mut app = spawn_app_with(Options::default()).await;
    let now = app.now();
    let big = batch(121, now);
    for _ in 0..3 {
        let r = post_batch(&app, &big).await;
        assert_eq!(r.status(), 400, "the same answer on every retry");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"], "batch_over_allowance", "{v}");
        assert!(
            v["message"]
                .as_str()
                .expect("message")
                .contains("ingest key"),
            "{v}"
        );
    }
    assert_eq!(app.counts("/").await.site.views, 0, "nothing of it counted");
    let r = post_batch(&app, &batch(120, now)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(app.counts("/").await.site.views, 120);
    app.stop().await;
}

/// `{"events":[{"a":[]},{"a":[]},…]}` filling a whole 4 MiB batch body.
fn hostile_batch() -> String {
    let mut body = String::from("{\"events\":[");
    while body.len() < tally_wire::MAX_BATCH_BYTES - 32 {
        body.push_str("{\"a\":[]},");
    }
    body.push_str("{\"a\":[]}]}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_4_mib_batch_is_refused_before_it_is_built() {
    let server = Binary::start(&["--auto-sites"]).await;
    let body = hostile_batch();
    let http = client();
    // Warm up, then measure the peak while 16 hostile batches arrive at once.
    let r = http
        .post(server.url("/api/v1/events"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "batch_too_large"
    );
    let before = server.proc_kib("VmRSS");
    // 0 stands for "the server closed the connection before reading the body": past the
    // batch slots it answers 503 at once and does not read 4 MiB it will not parse.
    let answers: Vec<u16> = futures_util::future::join_all((0..16).map(|_| {
        let (http, url, body) = (http.clone(), server.url("/api/v1/events"), body.clone());
        async move {
            match http
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
            {
                Ok(r) => r.status().as_u16(),
                Err(e) if e.is_request() => 0,
                Err(e) => panic!("request: {e}"),
            }
        }
    }))
    .await;
    let peak = server.proc_kib("VmHWM");
    assert!(
        answers.iter().all(|s| matches!(s, 0 | 400 | 503)),
        "{answers:?}"
    );
    // Before the fix one such batch took 300 MB. Now: at most `--batch-concurrency` (8) bodies
    // of 4 MiB are held at once, and no record is built.
    let grown_mib = peak.saturating_sub(before) / 1024;
    assert!(grown_mib <= 64, "RSS grew by {grown_mib} MiB");
    server.stop().await;
}

#[tokio::test]
async fn image_proxies_count_each_fetch_within_their_own_bounded_allowance() {
    let mut app = spawn_app_with(Options::default()).await;
    let camo = "github-camo (876de43e)";
    let fetch = |page: &'static str| {
        let req = app
            .client
            .get(app.url(&format!("/badge/blog.svg?page={page}")))
            .header("user-agent", camo);
        async move {
            let r = req.send().await.expect("request");
            assert_eq!(r.status(), 200);
            r.headers()["x-tally-status"]
                .to_str()
                .expect("ascii")
                .to_owned()
        }
    };
    // Readers behind the proxy: the proxy is not filtered as a bot; within one second one
    // fetch of a page counts, the next second it counts again.
    assert_eq!(fetch("/readme").await, "accepted");
    assert_eq!(fetch("/readme").await, "suppressed");
    assert_eq!(fetch("/other").await, "accepted");
    app.clock.advance_millis(1000);
    assert_eq!(fetch("/readme").await, "accepted");
    // A direct client with the same pattern is gated for the repeat interval (10 s).
    let direct = |page: &'static str| {
        let req = client_from("127.0.0.3").get(app.url(&format!("/badge/blog.svg?page={page}")));
        async move {
            req.send().await.expect("request").headers()["x-tally-status"]
                .to_str()
                .expect("ascii")
                .to_owned()
        }
    };
    assert_eq!(direct("/readme").await, "accepted");
    app.clock.advance_millis(1000);
    assert_eq!(direct("/readme").await, "suppressed");
    app.stop().await;
}

fn hit_for(site: &str, now: jiff::Timestamp) -> Value {
    json!({"site": site, "type": "pageview", "event_id": event_id_at(now),
           "visitor_id": "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01",
           "url": "https://lost.example/a", "referrer": null})
}

/// `/readyz` answers 503 with `why` in its text.
async fn not_ready_because(http: &reqwest::Client, server: &Binary, why: &str) {
    let ready = http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503);
    let text = ready.text().await.expect("text");
    assert!(text.contains(why), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_moved_away_while_serving_acknowledges_nothing_more() {
    let server = Binary::start(&["--auto-sites"]).await;
    let http = client();
    let now = jiff::Timestamp::now();
    let before: Vec<Value> = (0..10).map(|_| hit_for("lost", now)).collect();
    for h in &before {
        assert_eq!(post_hit(&http, &server, h).await.status(), 200);
    }
    // The operator (or a cleanup job) moves the database away under the running server.
    let moved = server.db.with_extension("moved");
    let files = |base: &std::path::Path| -> Vec<std::path::PathBuf> {
        ["", "-wal", "-shm"]
            .iter()
            .map(|s| std::path::PathBuf::from(format!("{}{s}", base.display())))
            .collect()
    };
    for (from, to) in files(&server.db).iter().zip(files(&moved)) {
        if from.exists() {
            std::fs::rename(from, to).expect("move");
        }
    }
    let after: Vec<Value> = (0..10).map(|_| hit_for("lost", now)).collect();
    for h in &after {
        let r = post_hit(&http, &server, h).await;
        assert_eq!(r.status(), 503, "nothing is acknowledged into a lost file");
        assert!(r.headers().contains_key("retry-after"));
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"], "storage_unavailable", "{v}");
    }
    let ready = http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503, "not ready while the file is gone");
    let db = server.db.clone();
    // Keeps the database directory until the end of the test.
    let _dir = server.stop().await;
    // Put it back and restart: every acknowledged hit is there; the refused ones count once
    // when the client retries them.
    for (from, to) in files(&moved).iter().zip(files(&db)) {
        if from.exists() {
            std::fs::rename(from, to).expect("move back");
        }
    }
    let dir = db.parent().expect("dir").to_owned();
    let server = Binary::start_in(&dir, &["--auto-sites"]).await;
    for h in &before {
        let r: Value = post_hit(&http, &server, h)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "duplicate", "acknowledged before the move");
    }
    for h in &after {
        let r: Value = post_hit(&http, &server, h)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "accepted", "refused, so not counted before");
    }
    server.stop().await;
}

/// The database moved away and back while the server runs (an operator's mistake, undone):
/// `/readyz` names the file and says what to do, and once it is back the same process counts
/// again, without a restart, and every acknowledged hit is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_moved_back_while_serving_counts_again_without_a_restart() {
    let server = Binary::start(&["--auto-sites"]).await;
    let http = client();
    let now = jiff::Timestamp::now();
    let first = hit_for("back", now);
    assert_eq!(post_hit(&http, &server, &first).await.status(), 200);
    let moved = server.db.with_extension("moved");
    let pairs: Vec<(std::path::PathBuf, std::path::PathBuf)> = ["", "-wal", "-shm"]
        .iter()
        .map(|s| {
            (
                std::path::PathBuf::from(format!("{}{s}", server.db.display())),
                std::path::PathBuf::from(format!("{}{s}", moved.display())),
            )
        })
        .filter(|(from, _)| from.exists())
        .collect();
    for (from, to) in &pairs {
        std::fs::rename(from, to).expect("move away");
    }
    let refused = hit_for("back", now);
    assert_eq!(post_hit(&http, &server, &refused).await.status(), 503);
    not_ready_because(&http, &server, "move it back").await;
    not_ready_because(&http, &server, &server.db.display().to_string()).await;
    for (from, to) in &pairs {
        std::fs::rename(to, from).expect("move back");
    }
    let ready = http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "ready again once the file is back");
    // The hit refused meanwhile counts when the client retries it; the first was kept.
    for (hit, want) in [(&refused, "accepted"), (&first, "duplicate")] {
        let r: Value = post_hit(&http, &server, hit)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], want, "{r}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_free_disk_floor_writes_are_refused_and_reads_keep_working() {
    // A floor of 1 EiB: this disk is always below it.
    let server = Binary::start(&["--auto-sites", "--min-free-mb", "1099511627776"]).await;
    let http = client();
    let r = post_hit(&http, &server, &hit_for("full", jiff::Timestamp::now())).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "60");
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "disk_full");
    not_ready_because(&http, &server, "disk").await;
    let metrics = server.text("/metrics").await;
    assert!(
        metrics.contains(r#"tally_refused_total{reason="disk_full"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("tally_disk_free_bytes "), "{metrics}");
    let dash = http
        .get(server.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(dash.status(), 200, "reads keep working");
    server.stop().await;
}

#[tokio::test]
async fn the_ingest_key_lane_is_exempt_from_address_limits_and_a_wrong_key_is_a_401() {
    let mut app = spawn_app_with(Options::default()).await;
    let site = tally::core::ids::SiteId::parse("blog").expect("id");
    assert!(
        app.store
            .set_ingest_key(&site, Some("tk_test_0123456789abcdef"))
            .await
            .expect("key")
    );
    let now = app.now();
    let send = |body: Value, key: &'static str| {
        app.client
            .post(app.url("/api/v1/events"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(body.to_string())
    };
    // 500 records (the most a batch holds), twice: far beyond one address's 120 per minute.
    for _ in 0..2 {
        let r = send(batch(500, now), "tk_test_0123456789abcdef")
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        let accepted = v["results"]
            .as_array()
            .expect("results")
            .iter()
            .filter(|r| r["status"] == "accepted")
            .count();
        assert_eq!(accepted, 500, "{v}");
    }
    let r = send(batch(1, now), "tk_wrong")
        .send()
        .await
        .expect("request");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["results"][0]["error"], "invalid_ingest_key", "{v}");
    let r = app
        .client
        .post(app.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .header("authorization", "Bearer tk_wrong")
        .body(pageview(&event_id_at(now), None, "/k").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "invalid_ingest_key"
    );
    // The keyed lane spent nothing of the address's own allowance.
    assert_eq!(post_batch(&app, &batch(120, now)).await.status(), 200);
    assert_eq!(app.counts("/").await.site.views, 1_120);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_readers_are_bounded_on_a_site_with_100k_pages() {
    use tally::core::hit::HitKind;
    use tally::core::ids::{EventId, PagePath, SiteId, VisitorKey};
    use tally::core::record::{Record, Source};
    use tally::store::prelude::*;
    use tally::store::sqlite::{SqliteStore, StoreOptions};
    let dir = tempfile::tempdir().expect("dir");
    let db = dir.path().join("tally.sqlite");
    let now = jiff::Timestamp::now();
    let today = jiff::tz::TimeZone::UTC.to_datetime(now).date();
    {
        let store = SqliteStore::open(
            &db,
            StoreOptions {
                max_new_pages_per_day: 0,
                ..StoreOptions::default()
            },
        )
        .expect("open");
        let site = SiteId::parse("big").expect("id");
        store
            .put_site(&tally::store::Site {
                id: site.clone(),
                origins: vec!["*".into()],
                zone: tally::core::day::SiteZone::utc(),
                public: true,
                ingest_key: None,
            })
            .await
            .expect("site");
        let records: Vec<Record> = (0..100_000u32)
            .map(|i| Record {
                event_id: EventId::new_at(now, {
                    let mut r = [0u8; 10];
                    r[..4].copy_from_slice(&i.to_be_bytes());
                    r
                }),
                site: site.clone(),
                source: Source::Web,
                kind: HitKind::Pageview,
                page: PagePath::parse(&format!("/page/{i:06}/{}", "x".repeat(200))).expect("p"),
                visitor: VisitorKey([(i % 251) as u8; 16]),
                at_ms: now.as_millisecond(),
                day: today,
                referrer: Some(format!("https://ref{}.example/", i % 5000)),
                dims: Default::default(),
            })
            .collect();
        for chunk in records.chunks(5_000) {
            store.commit(chunk.to_vec()).await.expect("commit");
        }
    }
    let keep = tempfile::tempdir().expect("keep");
    let server = Binary::start_on(keep, db, &[]).await;
    let http = client();
    let before = server.proc_kib("VmRSS");
    let answers: Vec<(u16, Option<String>)> = futures_util::future::join_all((0..64).map(|i| {
        let path = if i % 2 == 0 {
            "/api/v1/sites/big/top?range=30d&limit=100"
        } else {
            "/dashboard/big?range=365d&limit=100"
        };
        let req = http.get(server.url(path));
        async move {
            let r = req.send().await.expect("request");
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap_or_default().to_owned());
            (r.status().as_u16(), retry)
        }
    }))
    .await;
    let peak = server.proc_kib("VmHWM");
    for (status, retry) in &answers {
        match status {
            200 => {}
            503 => assert_eq!(retry.as_deref(), Some("1"), "busy answers say when"),
            other => panic!("unexpected {other}"),
        }
    }
    assert!(answers.iter().any(|(s, _)| *s == 200));
    let grown_mib = peak.saturating_sub(before) / 1024;
    println!(
        "64 concurrent stats reads over 100,000 pages: {} ok, {} busy, RSS +{grown_mib} MiB (peak {} MiB)",
        answers.iter().filter(|(s, _)| *s == 200).count(),
        answers.iter().filter(|(s, _)| *s == 503).count(),
        peak / 1024
    );
    // Before: 6.0 GB peak for 64 readers of 300,000 pages. The budget: 200 MB in all.
    assert!(peak / 1024 <= 200, "peak RSS {} MiB", peak / 1024);

    // One address reading without pause holds at most half the stats slots: a reader from
    // another address is answered, not told `busy`.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker: Vec<_> = (0..64)
        .map(|_| {
            let (http, url, stop) = (
                http.clone(),
                server.url("/dashboard/big?range=365d&limit=100"),
                std::sync::Arc::clone(&stop),
            );
            tokio::spawn(async move {
                let mut busy = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = http.get(&url).send().await.expect("request");
                    busy += u32::from(r.status() == 503);
                    let _ = r.bytes().await;
                }
                busy
            })
        })
        .collect();
    let other = client_from("127.0.0.2");
    let mut slowest = std::time::Duration::ZERO;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let r = other
            .get(server.url("/api/v1/sites/big/top?range=30d&limit=100"))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "another address's read");
        let _ = r.bytes().await;
        slowest = slowest.max(started.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut busy = 0;
    for task in attacker {
        busy += task.await.expect("attacker");
    }
    println!(
        "beside 64 readers of one address ({busy} told busy): another address's slowest read {slowest:?}"
    );
    assert!(busy > 0, "the reading address was never held to its share");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_shm_file_truncated_while_serving_is_a_503_not_a_sigbus() {
    let mut server = Binary::start(&["--auto-sites"]).await;
    let http = client();
    let now = jiff::Timestamp::now();
    let first = hit_for("lost", now);
    assert_eq!(post_hit(&http, &server, &first).await.status(), 200);
    // Someone truncates the shared-memory index SQLite has mapped (this used to kill the
    // process with SIGBUS at its next access, exit 135, no log line).
    let shm = std::path::PathBuf::from(format!("{}-shm", server.db.display()));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shm)
        .expect("shm exists while serving")
        .set_len(0)
        .expect("truncate");
    let r = post_hit(&http, &server, &hit_for("lost", now)).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "storage_unavailable");
    not_ready_because(&http, &server, "-shm").await;
    // A counts read touches the index too: refused, not a crash.
    let r = http
        .get(server.url("/api/v1/counts?site=lost&page=/a"))
        .send()
        .await
        .expect("counts");
    assert_eq!(r.status(), 503);
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "the process is still running"
    );
    // A restart rebuilds the index; the acknowledged hit is there.
    let dir = server.stop().await;
    let server = Binary::start_in(dir.path(), &["--auto-sites"]).await;
    let r: Value = post_hit(&http, &server, &first)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "duplicate", "acknowledged before the damage");
    server.stop().await;
}
