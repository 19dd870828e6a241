//! The happy paths of the beacon API: counting, dedupe, CORS, batches, custom events, filters.

use serde_json::{Value, json};

use crate::support::{ORIGIN, event_id_at, pageview, spawn_app};

const V1: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01";
const V2: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e02";

#[tokio::test]
async fn views_count_once_per_event_id_and_visitors_once_per_day() {
    let mut app = spawn_app().await;
    let first = event_id_at(app.now());
    assert_eq!(
        app.hit_status(&pageview(&first, Some(V1), "/a")).await,
        "accepted"
    );
    assert_eq!(
        app.hit_status(&pageview(&first, Some(V1), "/a")).await,
        "duplicate"
    );
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(app.now()), Some(V1), "/a"))
            .await,
        "accepted"
    );
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(app.now()), Some(V2), "/b"))
            .await,
        "accepted"
    );
    let a = app.counts("/a").await;
    assert_eq!((a.page.views, a.page.visitors), (2, 1));
    assert_eq!((a.page.today.views, a.page.today.visitors), (2, 1));
    assert_eq!((a.site.views, a.site.visitors), (3, 2));
    assert_eq!((a.live.events, a.live.visitors), (3, 2));
    let b = app.counts("/b").await;
    assert_eq!((b.page.views, b.page.visitors), (1, 1));
    app.stop().await;
}

#[tokio::test]
async fn hit_with_counts_returns_the_numbers_after_commit() {
    let mut app = spawn_app().await;
    let r = app
        .client
        .post(app.url("/api/v1/hit?counts=1&t=123"))
        .header("content-type", "application/json")
        .header("origin", ORIGIN)
        .body(pageview(&event_id_at(app.now()), Some(V1), "/a").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let headers = r.headers().clone();
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["status"], "accepted");
    assert_eq!(v["counts"]["page"]["views"], 1);
    assert_eq!(v["counts"]["site"]["today"]["visitors"], 1);
    assert_eq!(headers["access-control-allow-origin"], ORIGIN);
    assert_eq!(headers["access-control-allow-credentials"], "true");
    assert!(headers.get_all("vary").iter().any(|v| v == "Origin"));
    assert_eq!(headers["cache-control"], "no-store");
    app.stop().await;
}

#[tokio::test]
async fn preflight_is_answered_with_the_echoed_origin() {
    let mut app = spawn_app().await;
    let r = app
        .client
        .request(reqwest::Method::OPTIONS, app.url("/api/v1/hit"))
        .header("origin", ORIGIN)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], ORIGIN);
    assert!(
        r.headers()["access-control-allow-methods"]
            .to_str()
            .expect("ascii")
            .contains("POST")
    );
    assert!(
        r.headers()["access-control-allow-headers"]
            .to_str()
            .expect("ascii")
            .contains("content-type")
    );
    app.stop().await;
}

#[tokio::test]
async fn batch_gives_one_result_per_record_in_order() {
    let mut app = spawn_app().await;
    let a = event_id_at(app.now());
    let body = json!({"events": [
        pageview(&a, Some(V1), "/a"),
        {"site": "blog", "type": "pageview", "event_id": "not-a-uuid", "url": "https://blog.example/"},
        pageview(&a, Some(V1), "/a"),
        {"site": 7},
        pageview(&event_id_at(app.now()), None, "/c"),
    ]});
    let r = app
        .client
        .post(app.url("/api/v1/events"))
        .header("origin", ORIGIN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let results = v["results"].as_array().expect("results");
    let statuses: Vec<&str> = results
        .iter()
        .map(|r| r["status"].as_str().expect("s"))
        .collect();
    assert_eq!(
        statuses,
        ["accepted", "rejected", "duplicate", "rejected", "accepted"]
    );
    assert_eq!(results[0]["event_id"], a.as_str());
    assert_eq!(results[1]["error"], "invalid_event_id");
    assert_eq!(results[3]["error"], "invalid_field");
    assert_eq!(app.counts("/").await.site.views, 2);
    app.stop().await;
}

#[tokio::test]
async fn custom_events_count_once_per_dedupe_key() {
    let mut app = spawn_app().await;
    let purchase = |key: Option<&str>| {
        let mut v = json!({"site": "blog", "type": "event", "event_id": event_id_at(app.now()),
            "visitor_id": V1, "url": "https://blog.example/cart", "name": "purchase"});
        if let Some(key) = key {
            v["dedupe"] = json!(key);
        }
        v
    };
    assert_eq!(
        app.hit_status(&purchase(Some("order_123"))).await,
        "accepted"
    );
    // A new event id with the same dedupe key: the retry of a purchase page reload.
    assert_eq!(
        app.hit_status(&purchase(Some("order_123"))).await,
        "duplicate"
    );
    assert_eq!(
        app.hit_status(&purchase(Some("order_124"))).await,
        "accepted"
    );
    assert_eq!(app.hit_status(&purchase(None)).await, "accepted");
    app.assert_no_drift().await;
    // Custom events are not page views.
    let c = app.counts("/cart").await;
    assert_eq!(c.page.views, 0);
    assert_eq!(c.live.events, 3);
    app.stop().await;
}

#[tokio::test]
async fn bots_and_empty_user_agents_are_filtered_and_show_in_metrics() {
    let mut app = spawn_app().await;
    let send = |ua: &'static str| {
        app.client
            .post(app.url("/api/v1/hit"))
            .header("user-agent", ua)
            .header("content-type", "application/json")
            .body(pageview(&event_id_at(app.now()), Some(V1), "/a").to_string())
            .send()
    };
    for ua in ["Googlebot/2.1 (+http://www.google.com/bot.html)", ""] {
        let v: Value = send(ua).await.expect("request").json().await.expect("json");
        assert_eq!(v["status"], "filtered", "{ua:?}");
    }
    assert_eq!(app.counts("/a").await.page.views, 0);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"tally_filtered_total{reason="bot"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"tally_filtered_total{reason="empty_user_agent"} 1"#));
    assert!(metrics.contains(r#"tally_hits_total{status="filtered"} 2"#));
    app.stop().await;
}

#[tokio::test]
async fn visitors_without_an_id_are_told_apart_by_a_daily_source_hash() {
    let mut app = spawn_app().await;
    for _ in 0..3 {
        app.hit_status(&pageview(&event_id_at(app.now()), None, "/a"))
            .await;
    }
    let other = app
        .client
        .post(app.url("/api/v1/hit"))
        .header("user-agent", "Mozilla/5.0 (Macintosh) Safari/605")
        .header("content-type", "text/plain")
        .body(pageview(&event_id_at(app.now()), None, "/a").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(other.status(), 200);
    let c = app.counts("/a").await;
    assert_eq!((c.page.views, c.page.visitors), (4, 2));
    // No raw address is stored anywhere in the file.
    app.stop().await;
    let bytes = std::fs::read(&app.db).expect("db");
    let wal = std::fs::read(app.db.with_extension("sqlite-wal")).unwrap_or_default();
    for hay in [&bytes, &wal] {
        assert!(
            !hay.windows(9).any(|w| w == b"127.0.0.1"),
            "raw IP found on disk"
        );
    }
}

#[tokio::test]
async fn health_ready_and_json_404() {
    let mut app = spawn_app().await;
    assert_eq!(app.get("/healthz").await.status(), 200);
    assert_eq!(app.get("/readyz").await.status(), 200);
    let r = app.get("/nope").await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "not_found");
    app.stop().await;
}

#[tokio::test]
async fn late_deliveries_count_but_are_not_live() {
    let mut app = spawn_app().await;
    let hour_ago = app.now() - jiff::SignedDuration::from_hours(1);
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(hour_ago), Some(V1), "/a"))
            .await,
        "accepted"
    );
    let c = app.counts("/a").await;
    assert_eq!((c.page.views, c.live.events), (1, 0));
    // Live entries leave the window when the clock moves on, with no new event.
    app.hit_status(&pageview(&event_id_at(app.now()), Some(V2), "/a"))
        .await;
    assert_eq!(app.counts("/a").await.live.events, 1);
    app.clock.advance_millis(60_000);
    assert_eq!(app.counts("/a").await.live, tally_wire::Live::default());
    app.stop().await;
}

#[tokio::test]
async fn cors_is_narrow_stats_json_is_never_readable_cross_origin() {
    let mut app = spawn_app().await;
    let get = |path: &'static str| {
        app.client
            .get(app.url(path))
            .header("origin", ORIGIN)
            .send()
    };
    let counts = get("/api/v1/counts?site=blog").await.expect("r");
    assert_eq!(counts.headers()["access-control-allow-origin"], ORIGIN);
    assert!(
        !counts
            .headers()
            .contains_key("access-control-allow-credentials")
    );
    let series = get("/api/v1/sites/blog/series").await.expect("r");
    assert_eq!(series.status(), 200);
    assert!(!series.headers().contains_key("access-control-allow-origin"));
    let hit = app
        .post_hit(&pageview(&event_id_at(app.now()), Some(V1), "/a"))
        .await;
    assert_eq!(hit.headers()["access-control-allow-credentials"], "true");
    assert_eq!(
        hit.headers()["access-control-expose-headers"],
        "Retry-After"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_flooding_source_gets_429_with_retry_after_and_nothing_is_lost() {
    let mut app = crate::support::spawn_app_with(crate::support::Options {
        configure: |c| c.rate_limit_per_minute = 3,
        ..crate::support::Options::default()
    })
    .await;
    let ids: Vec<String> = (0..4).map(|_| event_id_at(app.now())).collect();
    for id in &ids[..3] {
        assert_eq!(
            app.hit_status(&pageview(id, Some(V1), "/a")).await,
            "accepted"
        );
    }
    let r = app.post_hit(&pageview(&ids[3], Some(V1), "/a")).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "rate_limited"
    );
    // Another user agent from the same address buys no fresh allowance.
    let same_address = app
        .client
        .post(app.url("/api/v1/hit"))
        .header("user-agent", "Mozilla/5.0 (Macintosh) Safari/605")
        .header("content-type", "text/plain")
        .body(pageview(&event_id_at(app.now()), Some(V2), "/a").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(same_address.status(), 429);
    // Another address is not affected; the refused hits were not counted.
    let other = crate::support::client_from("127.0.0.2")
        .post(app.url("/api/v1/hit"))
        .header("content-type", "text/plain")
        .body(pageview(&event_id_at(app.now()), Some(V2), "/a").to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(
        other.json::<Value>().await.expect("json")["status"],
        "accepted"
    );
    assert_eq!(app.counts("/a").await.page.views, 4);
    assert!(
        app.metrics()
            .await
            .contains(r#"tally_refused_total{reason="rate_limited"} 2"#)
    );
    app.stop().await;
}
