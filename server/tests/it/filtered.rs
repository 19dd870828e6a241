//! What was not counted, per site and reason: visible at once in the stats API and on the
//! dashboard, and kept in the database across a restart.

use serde_json::Value;

use crate::support::{Options, UA, spawn_app, spawn_app_with};

const CRAWLER: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

async fn filtered(app: &crate::support::TestApp) -> Value {
    let r = app.get("/api/v1/sites/blog/filtered?range=today").await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("json")
}

#[tokio::test]
async fn each_reason_is_tallied_per_site_and_survives_a_restart() {
    let mut app = spawn_app_with(Options {
        configure: |c| c.rate_limit_per_minute = 5,
        ..Options::default()
    })
    .await;
    for i in 0..3 {
        let r: Value = app
            .post_view_as(CRAWLER, &format!("/c{i}"))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "filtered");
    }
    let r: Value = app.post_view_as("", "/x").await.json().await.expect("json");
    assert_eq!(r["status"], "filtered");
    // One browser: the badge twice (the second is a repeat), then hits past its allowance of
    // 5 per minute for this site: the badge and the first hit used 2, so 3 more are counted
    // and the rest answered 429.
    for _ in 0..2 {
        let r = app
            .client
            .get(app.url("/badge/blog.svg"))
            .header("user-agent", UA)
            .send()
            .await
            .expect("badge");
        assert_eq!(r.status(), 200);
    }
    let mut refused = 0;
    for i in 0..6 {
        let r = app.post_view_as(UA, &format!("/p{i}")).await;
        if r.status() == 429 {
            refused += 1;
        } else {
            assert_eq!(r.status(), 200);
        }
    }
    assert!(refused >= 1, "the allowance must run out");

    let v = filtered(&app).await;
    assert_eq!(v["filtered"]["bot"], 3, "{v}");
    assert_eq!(v["filtered"]["empty_user_agent"], 1, "{v}");
    assert_eq!(v["filtered"]["suppressed"], 1, "{v}");
    assert_eq!(v["filtered"]["rate_limited"], refused, "{v}");
    assert_eq!(v["total"], 5 + refused, "{v}");

    let page = app.get("/dashboard/blog").await.text().await.expect("html");
    assert!(
        page.contains("Not counted"),
        "the dashboard shows the panel"
    );
    assert!(
        page.contains(r#"data-reason="bot">3<"#),
        "the dashboard shows the bot count"
    );

    // A graceful stop writes what was pending; a new server on the same file reads it back.
    app.stop().await;
    let stored = app
        .store
        .filtered(
            &tally::core::ids::SiteId::parse("blog").expect("site"),
            app.now().to_zoned(jiff::tz::TimeZone::UTC).date(),
            app.now().to_zoned(jiff::tz::TimeZone::UTC).date(),
        )
        .await
        .expect("stored tallies");
    assert_eq!(stored.bot, 3);
    assert_eq!(stored.empty_user_agent, 1);
    assert_eq!(stored.suppressed, 1);
    assert_eq!(stored.rate_limited, refused);
}

#[tokio::test]
async fn the_filtered_stats_follow_the_site_privacy_and_validation_rules() {
    let app = spawn_app().await;
    assert_eq!(
        app.get("/api/v1/sites/nope/filtered?range=7d")
            .await
            .status(),
        404
    );
    let r = app.get("/api/v1/sites/blog/filtered?range=forever").await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json error");
    assert!(v["error"].is_string());
    // Nothing dropped yet: every reason is listed, at zero.
    let v = filtered(&app).await;
    for reason in ["bot", "empty_user_agent", "suppressed", "rate_limited"] {
        assert_eq!(v["filtered"][reason], 0, "{v}");
    }
    assert_eq!(v["total"], 0);
}

/// A page on an origin the site does not allow is refused, and the refusal shows under "Not
/// counted" for that site at once (before, only `/metrics` said so).
#[tokio::test]
async fn refused_origins_are_tallied_per_site() {
    let app = spawn_app().await;
    for i in 0..2 {
        let body = crate::support::pageview(
            &crate::support::event_id_at(app.now()),
            None,
            &format!("/o{i}"),
        );
        let r = app
            .client
            .post(app.url("/api/v1/hit"))
            .header("user-agent", UA)
            .header("content-type", "text/plain")
            .header("origin", "http://127.0.0.1:8000")
            .body(body.to_string())
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 403);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"], "origin_not_allowed", "{v}");
    }
    // A hit from the registered origin still counts, and is not a refusal.
    assert_eq!(app.post_view_as(UA, "/ok").await.status(), 200);
    let v = filtered(&app).await;
    assert_eq!(v["filtered"]["origin_not_allowed"], 2, "{v}");
    assert_eq!(v["total"], 2, "{v}");
    let page = app.get("/dashboard/blog").await.text().await.expect("html");
    assert!(
        page.contains("Refused origin"),
        "the panel names the reason"
    );
}

/// A bot's hits are not counted but are charged to its address allowance like any other, so
/// a flood with a bot's user agent is refused at once (before its bodies are read) once the
/// allowance is used up.
#[tokio::test]
async fn a_bots_hits_use_up_its_address_allowance() {
    let app = spawn_app_with(Options {
        configure: |c| c.rate_limit_per_minute = 3,
        ..Options::default()
    })
    .await;
    let (mut filtered_hits, mut refused) = (0, 0);
    for i in 0..5 {
        let r = app.post_view_as(CRAWLER, &format!("/b{i}")).await;
        match r.status().as_u16() {
            200 => {
                let v: Value = r.json().await.expect("json");
                assert_eq!(v["status"], "filtered", "{v}");
                filtered_hits += 1;
            }
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((filtered_hits, refused), (3, 2));
    let v = filtered(&app).await;
    assert_eq!(v["filtered"]["bot"], 3, "{v}");
    assert_eq!(v["filtered"]["rate_limited"], 2, "{v}");
}
