//! The dashboard page and its JSON (series, top) over real HTTP, with known data on known days.

use jiff::Timestamp;
use serde_json::{Value, json};
use tally::core::day::SiteZone;
use tally::core::ids::SiteId;
use tally::store::Site;

use crate::support::{Options, TestApp, event_id_at, spawn_app_with};

const TOKEN: &str = "s3cret-admin-token";

fn options() -> Options {
    Options {
        at: "2026-05-10T12:00:00Z".parse().expect("ts"),
        zone: "Europe/Berlin",
        configure: |c| c.admin_token = Some(TOKEN.into()),
    }
}

fn v(n: u32) -> String {
    format!("0b6f5f8e-7d0e-4a55-9d5e-{n:012}")
}

/// One hit: (page, visitor number, referrer).
type Hit = (&'static str, u32, Option<&'static str>);

/// Three days of known traffic; the expectations are in the tests.
async fn fill(app: &TestApp) {
    let days: [(&str, &[Hit]); 3] = [
        (
            "2026-05-08T10:00:00Z",
            &[
                ("/", 1, Some("https://news.example/a")),
                ("/", 2, None),
                ("/a&b='x'", 1, None),
            ],
        ),
        (
            "2026-05-09T10:00:00Z",
            &[
                ("/", 1, Some("https://news.example/b")),
                ("/post", 3, Some("https://search.example/?q=1")),
            ],
        ),
        (
            "2026-05-10T10:00:00Z",
            &[
                ("/post", 3, None),
                ("/post", 4, Some("https://news.example/c")),
                ("/", 5, Some("https://blog.example/internal")),
            ],
        ),
    ];
    for (at, hits) in days {
        let at: Timestamp = at.parse().expect("ts");
        for (page, visitor, referrer) in hits {
            let body = json!({"site": "blog", "type": "pageview", "event_id": event_id_at(at),
                "visitor_id": v(*visitor), "url": format!("https://blog.example{page}"), "referrer": referrer});
            assert_eq!(app.hit_status(&body).await, "accepted");
        }
    }
}

#[tokio::test]
async fn series_and_top_json_match_the_data() {
    let mut app = spawn_app_with(options()).await;
    fill(&app).await;
    let series: Value = app
        .get("/api/v1/sites/blog/series?range=7d")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(series["timezone"], "Europe/Berlin");
    assert_eq!(
        (series["from"].as_str(), series["to"].as_str()),
        (Some("2026-05-04"), Some("2026-05-10"))
    );
    let days = series["days"].as_array().expect("days");
    assert_eq!(days.len(), 7, "every day of the range, zeros included");
    let by_day = |d: &str| days.iter().find(|x| x["day"] == d).cloned().expect("day");
    assert_eq!(
        (
            by_day("2026-05-08")["views"].as_u64(),
            by_day("2026-05-08")["visitors"].as_u64()
        ),
        (Some(3), Some(2))
    );
    assert_eq!(
        (
            by_day("2026-05-09")["views"].as_u64(),
            by_day("2026-05-09")["visitors"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(
        (
            by_day("2026-05-10")["views"].as_u64(),
            by_day("2026-05-10")["visitors"].as_u64()
        ),
        (Some(3), Some(3))
    );
    assert_eq!(by_day("2026-05-07")["views"], 0);
    // Visitors 1..=5 over the range: distinct, not the sum of days (7).
    assert_eq!(series["total"], json!({"views": 8, "visitors": 5}));

    let top: Value = app
        .get("/api/v1/sites/blog/top?from=2026-05-08&to=2026-05-10&limit=2")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(
        top["pages"],
        json!([{"page": "/", "views": 4, "visitors": 3}, {"page": "/post", "views": 3, "visitors": 2}])
    );
    assert_eq!(
        top["referrers"],
        json!([{"host": "news.example", "views": 3}, {"host": "search.example", "views": 1}])
    );

    let r = app.get("/api/v1/sites/blog/series?range=2w").await;
    assert_eq!(r.status(), 400);
    let r = app.get("/api/v1/sites/blog/top?limit=1000").await;
    assert_eq!(r.status(), 400);
    app.stop().await;
}

#[tokio::test]
async fn dashboard_html_shows_the_numbers_escaped() {
    let mut app = spawn_app_with(options()).await;
    fill(&app).await;
    // One fresh view: /post has one visitor "now" (the live column).
    let now = json!({"site": "blog", "type": "pageview", "event_id": event_id_at(app.now()),
        "visitor_id": v(9), "url": "https://blog.example/post", "referrer": null});
    assert_eq!(app.hit_status(&now).await, "accepted");
    let r = app.get("/dashboard/blog?range=7d").await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/html")
    );
    let html = r.text().await.expect("html");
    assert!(html.contains("Europe/Berlin"));
    assert!(html.contains("<svg"), "the chart is inline SVG");
    assert!(!html.contains("/a&b='x'"), "page paths are escaped");
    assert!(
        [
            "/a&#38;b=&#39;x&#39;",
            "/a&amp;b=&#39;x&#39;",
            "/a&amp;b=&#x27;x&#x27;"
        ]
        .iter()
        .any(|e| html.contains(e)),
        "{html}"
    );
    let post_row = html
        .lines()
        .find(|l| l.contains(">/post<"))
        .expect("a /post row");
    assert!(
        post_row.ends_with(r#"<td class="n">1</td></tr>"#),
        "the last column is visitors now: {post_row}"
    );
    assert!(html.contains("news.example"));
    assert!(
        !html.contains("https://cdn") && !html.contains("src=\"http"),
        "no external assets"
    );
    app.stop().await;
}

#[tokio::test]
async fn private_sites_need_the_token_or_the_login_cookie() {
    let mut app = spawn_app_with(options()).await;
    app.store
        .put_site(&Site {
            id: SiteId::parse("secret").expect("id"),
            origins: vec!["*".into()],
            zone: SiteZone::utc(),
            public: false,
            ingest_key: None,
        })
        .await
        .expect("site");
    let r = app.get("/api/v1/sites/secret/series").await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.expect("json")["error"],
        "unauthorized"
    );
    let r = app
        .client
        .get(app.url("/api/v1/sites/secret/series"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), 200);
    let r = app.get("/dashboard/secret").await;
    assert_eq!(r.status(), 401);
    assert!(
        r.text().await.expect("html").contains("name=\"token\""),
        "a login form"
    );

    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("c");
    let r = no_redirects
        .post(app.url("/dashboard/secret/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), 401);
    let r = no_redirects
        .post(app.url("/dashboard/secret/login"))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("Secure")
            && cookie.contains("SameSite=Strict")
    );
    assert!(!cookie.contains(TOKEN), "the cookie never holds the token");
    let pair = cookie.split(';').next().expect("pair").to_owned();
    let r = no_redirects
        .get(app.url("/dashboard/secret"))
        .header("cookie", pair)
        .send()
        .await
        .expect("r");
    assert_eq!(r.status(), 200);
    let r = app.get("/dashboard/nosuchsite").await;
    assert_eq!(r.status(), 404);
    app.stop().await;
}
