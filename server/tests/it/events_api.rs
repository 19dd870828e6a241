//! `GET /api/v1/sites/{site}/events` and the dashboard's custom events panel, over real HTTP.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::support::{Options, event_id_at, spawn_app_with};

const TOKEN: &str = "events-admin-token";

fn options() -> Options {
    Options {
        at: "2026-05-10T12:00:00Z".parse().expect("ts"),
        zone: "UTC",
        configure: |c| c.admin_token = Some(TOKEN.into()),
    }
}

#[tokio::test]
async fn events_json_ranks_names_with_their_days_and_the_panel_shows_them() {
    let mut app = spawn_app_with(options()).await;
    let sends: [(&str, &str); 4] = [
        ("2026-05-09T10:00:00Z", "signup"),
        ("2026-05-10T10:00:00Z", "signup"),
        ("2026-05-10T10:01:00Z", "signup"),
        ("2026-05-10T10:02:00Z", "<b>download</b>"),
    ];
    for (at, name) in sends {
        let at: Timestamp = at.parse().expect("ts");
        let body = json!({"site": "blog", "type": "event", "name": name,
            "event_id": event_id_at(at), "url": "https://blog.example/", "referrer": null});
        assert_eq!(app.hit_status(&body).await, "accepted", "{name}");
    }
    let r = app.get("/api/v1/sites/blog/events?range=7d").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        v["events"],
        json!([
            {"name": "signup", "count": 3, "days": [
                {"day": "2026-05-09", "count": 1}, {"day": "2026-05-10", "count": 2}]},
            {"name": "<b>download</b>", "count": 1, "days": [{"day": "2026-05-10", "count": 1}]},
        ])
    );
    let today: Value = app
        .get("/api/v1/sites/blog/events?range=today")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(today["events"][0]["count"], 2);
    assert_eq!(
        app.get("/api/v1/sites/blog/events?range=nope")
            .await
            .status(),
        400
    );

    let html = app
        .get("/dashboard/blog?range=7d")
        .await
        .text()
        .await
        .expect("html");
    assert!(html.contains(r#"<table id="events">"#), "{html}");
    // Ranked by visitors, then events: signup (3 events) above the escaped download (1).
    let signup = html
        .find(">signup</a></td><td class=\"n\">")
        .expect("signup row");
    let download = html
        .find("&#60;b&#62;download&#60;/b&#62;</a>")
        .expect("download row");
    assert!(signup < download, "{html}");
    assert!(
        html[signup..download].contains(r#"<td class="n">3</td>"#),
        "{html}"
    );
    assert!(!html.contains("<b>download</b>"), "event names are escaped");
    app.stop().await;
}

#[tokio::test]
async fn events_of_a_private_site_need_the_token() {
    let mut app = spawn_app_with(options()).await;
    app.store
        .put_site(&tally::store::Site {
            id: tally::core::ids::SiteId::parse("secret").expect("id"),
            origins: vec!["*".into()],
            zone: tally::core::day::SiteZone::utc(),
            public: false,
            ingest_key: None,
        })
        .await
        .expect("site");
    let url = app.url("/api/v1/sites/secret/events?range=30d");
    assert_eq!(
        app.client.get(&url).send().await.expect("get").status(),
        401
    );
    let r = app
        .client
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["events"], json!([]));
    app.stop().await;
}

#[tokio::test]
async fn dashboard_page_has_a_heading_a_favicon_no_inline_script_and_readable_paths() {
    let mut app = spawn_app_with(options()).await;
    let at: Timestamp = "2026-05-10T10:00:00Z".parse().expect("ts");
    for (n, path) in ["/posts/%E4%B8%AD%E6%96%87", "/bad%FF", "/x%3Cb%3E"]
        .iter()
        .enumerate()
    {
        let body = json!({"site": "blog", "type": "pageview",
            "event_id": event_id_at(at + jiff::SignedDuration::from_secs(n as i64)),
            "url": format!("https://blog.example{path}"), "referrer": null});
        assert_eq!(app.hit_status(&body).await, "accepted");
    }
    let html = app
        .get("/dashboard/blog?range=7d")
        .await
        .text()
        .await
        .expect("html");
    assert!(html.contains("<h1"), "an h1");
    assert!(html.contains(r#"<link rel="icon" href="/favicon.ico""#));
    // Every script is a file: nothing inline for a CSP to forbid.
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script src=").count()
    );
    assert!(html.contains(r#"<script src="/assets/dashboard.js" defer></script>"#));
    // Paths decoded for reading (still escaped), in a link that filters by the page.
    assert!(
        html.contains(r#"title="Filter by page: /posts/中文">/posts/中文</a>"#),
        "{html}"
    );
    assert!(html.contains(">/bad%FF<"), "invalid UTF-8 stays encoded");
    assert!(
        html.contains("/x&#60;b&#62;") || html.contains("/x&lt;b&gt;"),
        "{html}"
    );
    assert!(html.contains("https://blog.example/#tally-ignore"));
    // The chart's text is not scaled: no viewBox.
    assert!(!html.contains("viewBox=\"0 0 720"));

    let r = app.get("/favicon.ico").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/svg+xml");
    let r = app.get("/assets/dashboard.js").await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.expect("js").contains("card-live"));
    app.stop().await;
}
