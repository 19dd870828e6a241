//! "Never a lie": a locked database answers 503 storage_unavailable, a full queue answers
//! 503 overloaded, both with Retry-After, nothing of theirs is counted, and retries with the
//! same event ids then count exactly once.

use serde_json::Value;

use crate::support::{Options, TestApp, event_id_at, pageview, spawn_app_with};

const V: &str = "0b6f5f8e-7d0e-4a55-9d5e-6c1b8f0a1e01";

async fn queue_depth(app: &TestApp) -> f64 {
    app.metric("tally_queue_depth").await.unwrap_or(0.0)
}

/// The writer has taken a batch when it reports an age for the batch it is committing.
async fn writer_busy(app: &TestApp) -> bool {
    app.metric("tally_oldest_pending_age_seconds")
        .await
        .is_some_and(|age| age > 0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locked_store_and_full_queue_refuse_honestly_and_retries_count_once() {
    let mut app = spawn_app_with(Options {
        configure: |c| {
            c.ingest.capacity = 2;
            crate::support::unlimited(c);
        },
        ..Options::default()
    })
    .await;
    let ids: Vec<String> = (0..4).map(|_| event_id_at(app.now())).collect();
    let body = |i: usize| pageview(&ids[i], Some(V), "/a");

    // Another process holds the write lock: the writer's commit will fail after its busy timeout.
    let locker = rusqlite::Connection::open(&app.db).expect("open");
    locker.execute_batch("BEGIN EXCLUSIVE").expect("lock");

    let client = app.client.clone();
    let url = app.url("/api/v1/hit");
    let send = move |b: Value| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            let r = client
                .post(url)
                .header("content-type", "text/plain")
                .header("origin", crate::support::ORIGIN)
                .body(b.to_string())
                .send()
                .await
                .expect("request");
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap_or("").to_owned());
            let v: Value = r.json().await.expect("json");
            (status, retry, v)
        })
    };
    // A is taken by the writer, which then waits on the lock.
    let a = send(body(0));
    // The writer has taken A when it reports an age for the batch it is committing.
    crate::support::wait_until(|| async { writer_busy(&app).await }).await;
    let b = send(body(1));
    crate::support::wait_until(|| async { queue_depth(&app).await >= 1.0 }).await;
    let c = send(body(2));
    crate::support::wait_until(|| async { queue_depth(&app).await >= 2.0 }).await;
    // The queue holds B and C: D is refused at once.
    let (status, retry, v) = send(body(3)).await.expect("d");
    assert_eq!(
        (status, v["error"].as_str()),
        (503, Some("overloaded")),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("1"));

    let (status, retry, v) = a.await.expect("a");
    assert_eq!(
        (status, v["error"].as_str()),
        (503, Some("storage_unavailable")),
        "{v}"
    );
    assert_eq!(retry.as_deref(), Some("5"));
    // Nothing of a refused or failed request was counted; then the lock goes away.
    assert_eq!(app.counts("/a").await.page.views, 0);
    locker.execute_batch("ROLLBACK").expect("unlock");
    for (i, job) in [(1, b), (2, c)] {
        let (status, _, v) = job.await.expect("job");
        assert_eq!(
            (status, v["status"].as_str()),
            (200, Some("accepted")),
            "hit {i}: {v}"
        );
    }
    // The clients retry A and D with the same event ids: counted once each, and B again is a duplicate.
    assert_eq!(app.hit_status(&body(0)).await, "accepted");
    assert_eq!(app.hit_status(&body(3)).await, "accepted");
    assert_eq!(app.hit_status(&body(1)).await, "duplicate");
    assert_eq!(app.counts("/a").await.page.views, 4);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"tally_refused_total{reason="overloaded"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"tally_refused_total{reason="storage_unavailable"} 1"#));
    app.assert_no_drift().await;
    app.stop().await;
}
