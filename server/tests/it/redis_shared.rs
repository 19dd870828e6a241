//! Several collectors sharing one Redis (`--redis`): the live window is the union, the
//! per-address limits are charged once for all; and a Redis that does not answer never costs a
//! hit, nor does one that answers too late. Real `tally serve` processes; the tests on a real
//! Redis need `TALLY_TEST_REDIS`.

use serde_json::{Value, json};

use crate::support::{
    Binary, client, event_id_at, metric_value, post_hit, redis_cleanup, redis_url, slow_redis,
};

fn hit(visitor: &str) -> Value {
    json!({"site": "shared", "type": "pageview", "event_id": event_id_at(jiff::Timestamp::now()),
           "visitor_id": visitor, "url": "https://shared.example/a", "referrer": null})
}

async fn live(http: &reqwest::Client, server: &Binary) -> Value {
    let v: Value = http
        .get(server.url("/api/v1/counts?site=shared&page=/a"))
        .send()
        .await
        .expect("counts")
        .json()
        .await
        .expect("json");
    v["live"].clone()
}

const V1: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01";
const V2: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e02";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_share_the_live_window_and_the_limits_through_redis() {
    let Some(url) = redis_url() else { return };
    let prefix = format!("tally-test:{}:", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().expect("dir");
    let args = [
        "--auto-sites",
        "--redis",
        &url,
        "--redis-prefix",
        &prefix,
        "--rate-limit-per-minute",
        "4",
    ];
    // One database (and so one server secret) for both, like two collectors of one deployment.
    let a = Binary::start_in(dir.path(), &args).await;
    let b = Binary::start_in(dir.path(), &args).await;
    let http = client();
    let r: Value = post_hit(&http, &a, &hit(V1))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "accepted");
    let r: Value = post_hit(&http, &b, &hit(V2))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "accepted");
    for server in [&a, &b] {
        let live = live(&http, server).await;
        assert_eq!(live["visitors"], 2, "the union of both collectors: {live}");
        assert_eq!(live["events"], 2, "{live}");
    }
    // 4 a minute per address and site, over both collectors: 2 used, 2 more, then 429.
    assert_eq!(post_hit(&http, &a, &hit(V1)).await.status(), 200);
    assert_eq!(post_hit(&http, &b, &hit(V2)).await.status(), 200);
    assert_eq!(post_hit(&http, &a, &hit(V1)).await.status(), 429);
    assert_eq!(post_hit(&http, &b, &hit(V2)).await.status(), 429);
    a.stop().await;
    b.stop().await;
    assert!(
        redis_cleanup(&url, &prefix) > 0,
        "the collectors kept their shared state in Redis"
    );
}

/// A collector on the Redis at `redis` (with `args`), which cannot serve it in time: two
/// views are accepted and in this collector's own live window, `/readyz` says ready with
/// Redis unavailable, and `/metrics` reports the fallback.
async fn counts_without_redis(redis: &str, args: &[&str]) {
    let server = Binary::start(&[&["--auto-sites", "--redis", redis], args].concat()).await;
    let http = client();
    for visitor in [V1, V2] {
        let r: Value = post_hit(&http, &server, &hit(visitor))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "accepted", "Redis never costs a hit");
    }
    let live = live(&http, &server).await;
    assert_eq!(
        live["visitors"], 2,
        "this collector's own live window: {live}"
    );
    let ready = http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.status(),
        200,
        "Redis is never a reason to refuse hits"
    );
    assert!(
        ready
            .text()
            .await
            .expect("text")
            .contains("redis unavailable")
    );
    let metrics = server.text("/metrics").await;
    assert_eq!(
        metric_value(&metrics, "tally_redis_fallback_active"),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metric_value(&metrics, "tally_redis_fallbacks_total").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_does_not_answer_never_costs_a_hit() {
    // Port 1 on loopback: nothing listens, every connection is refused.
    counts_without_redis("redis://127.0.0.1:1/", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_answers_too_late_falls_back_and_never_costs_a_hit() {
    let Some(url) = redis_url() else { return };
    // Every answer arrives after 350 ms: more than a call's 250 ms budget, less than the redis
    // client's own 500 ms response timeout, so tally's budget is what must catch it.
    let slow = slow_redis(&url, std::time::Duration::from_millis(350)).await;
    let prefix = format!("tally-test:{}:", uuid::Uuid::new_v4().simple());
    counts_without_redis(&slow, &["--redis-prefix", &prefix]).await;
    redis_cleanup(&url, &prefix);
}
