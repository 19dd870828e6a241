//! `POST /api/v2/query` and the dashboard's filters over real HTTP: hits sent with real user
//! agents, referrers, campaign tags and screen widths come back broken down, filtered and
//! exact, in Plausible's answer shape.

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::support::{Options, TestApp, event_id_at, spawn_app_with};

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1";
const CHROME_WIN: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";

fn options() -> Options {
    Options {
        at: "2026-05-10T12:00:00Z".parse().expect("ts"),
        zone: "UTC",
        configure: |_| {},
    }
}

fn v(n: u32) -> String {
    format!("0b6f5f8e-7d0e-4a55-9d5e-{n:012}")
}

/// A page view sent as a browser sends it; returns its event id.
async fn view(
    app: &TestApp,
    ua: &str,
    at: &str,
    visitor: u32,
    url: &str,
    referrer: Option<&str>,
    width: Option<u32>,
) -> String {
    let at: Timestamp = at.parse().expect("ts");
    let id = event_id_at(at);
    let mut body = json!({"site": "blog", "type": "pageview", "event_id": id,
        "visitor_id": v(visitor), "url": url, "referrer": referrer});
    if let Some(w) = width {
        body["screen_width"] = json!(w);
    }
    let r = app
        .client
        .post(app.url("/api/v1/hit"))
        .header("user-agent", ua)
        .header("content-type", "text/plain")
        .body(body.to_string())
        .send()
        .await
        .expect("hit");
    assert_eq!(r.json::<Value>().await.expect("json")["status"], "accepted");
    id
}

async fn engage(app: &TestApp, id: &str, visitor: u32, url: &str, ms: u64, scroll: u8) -> String {
    let body = json!({"site": "blog", "type": "engagement", "event_id": id,
        "visitor_id": v(visitor), "url": url, "engaged_ms": ms, "scroll": scroll});
    app.hit_status(&body).await
}

async fn ask(app: &TestApp, q: Value) -> (u16, Value) {
    let r = app
        .client
        .post(app.url("/api/v2/query"))
        .json(&q)
        .send()
        .await
        .expect("query");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// Visitor 1: Firefox on Linux from Hacker News, two pages, engaged 40 s on /pricing.
/// Visitor 2: an iPhone from a newsletter campaign, one page. Visitor 3: Chrome on Windows,
/// direct, a page and a signup.
async fn fill(app: &TestApp) {
    view(
        app,
        FIREFOX,
        "2026-05-09T10:00:00Z",
        1,
        "https://blog.example/",
        Some("https://news.ycombinator.com/item?id=1"),
        Some(1920),
    )
    .await;
    let pricing = view(
        app,
        FIREFOX,
        "2026-05-09T10:02:00Z",
        1,
        "https://blog.example/pricing",
        None,
        Some(1920),
    )
    .await;
    assert_eq!(
        engage(app, &pricing, 1, "https://blog.example/pricing", 40_000, 90).await,
        "accepted"
    );
    assert_eq!(
        engage(app, &pricing, 1, "https://blog.example/pricing", 40_000, 90).await,
        "duplicate",
        "a resend adds nothing"
    );
    view(
        app,
        IPHONE,
        "2026-05-09T11:00:00Z",
        2,
        "https://blog.example/pricing?utm_source=newsletter&utm_medium=email&utm_campaign=may",
        None,
        Some(390),
    )
    .await;
    view(
        app,
        CHROME_WIN,
        "2026-05-10T09:00:00Z",
        3,
        "https://blog.example/",
        None,
        None,
    )
    .await;
    let signup = json!({"site": "blog", "type": "event", "name": "signup",
        "event_id": event_id_at("2026-05-10T09:01:00Z".parse().expect("ts")),
        "visitor_id": v(3), "url": "https://blog.example/"});
    assert_eq!(app.hit_status(&signup).await, "accepted");
}

fn rows(answer: &Value) -> Vec<(Vec<String>, Vec<Value>)> {
    answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            (
                r["dimensions"]
                    .as_array()
                    .expect("dims")
                    .iter()
                    .map(|d| d.as_str().expect("str").to_owned())
                    .collect(),
                r["metrics"].as_array().expect("metrics").clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn totals_breakdowns_and_filters_answer_in_plausibles_shape() {
    let mut app = spawn_app_with(options()).await;
    fill(&app).await;
    let (status, a) = ask(
        &app,
        json!({"site_id": "blog", "date_range": ["2026-05-09", "2026-05-10"],
            "metrics": ["visitors", "visits", "pageviews", "events", "bounce_rate", "visit_duration"]}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    // Visits: v1 (2 views, 120 s), v2 (bounce), v3 (a view and a signup: not a bounce).
    assert_eq!(
        rows(&a),
        vec![(
            vec![],
            vec![
                json!(3),
                json!(3),
                json!(4),
                json!(5),
                json!(33.0),
                json!(60)
            ]
        )]
    );
    assert_eq!(
        a["query"]["date_range"],
        json!(["2026-05-09T00:00:00+00:00", "2026-05-10T23:59:59+00:00"])
    );
    assert_eq!(a["query"]["order_by"], json!([["visitors", "desc"]]));
    assert_eq!(a["meta"], json!({}));

    let by = |dim: &str| {
        json!({"site_id": "blog", "date_range": ["2026-05-09", "2026-05-10"],
        "metrics": ["visitors"], "dimensions": [dim], "order_by": [[dim, "asc"]]})
    };
    let (_, a) = ask(&app, by("visit:browser")).await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["Chrome".into()], vec![json!(1)]),
            (vec!["Firefox".into()], vec![json!(1)]),
            (vec!["Safari".into()], vec![json!(1)]),
        ]
    );
    let (_, a) = ask(&app, by("visit:device")).await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["Desktop".into()], vec![json!(2)]),
            (vec!["Mobile".into()], vec![json!(1)]),
        ],
        "by screen width, else by the user agent"
    );
    let (_, a) = ask(&app, by("visit:channel")).await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["Direct".into()], vec![json!(1)]),
            (vec!["Email".into()], vec![json!(1)]),
            (vec!["Organic Social".into()], vec![json!(1)]),
        ]
    );
    let (_, a) = ask(&app, by("visit:source")).await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["Direct / None".into()], vec![json!(1)]),
            (vec!["Hacker News".into()], vec![json!(1)]),
            (vec!["newsletter".into()], vec![json!(1)]),
        ]
    );
    let (_, a) = ask(&app, by("visit:utm_campaign")).await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["(not set)".into()], vec![json!(2)]),
            (vec!["may".into()], vec![json!(1)]),
        ]
    );
    // Filters combine with AND, on visit and event dimensions.
    let (_, a) = ask(
        &app,
        json!({"site_id": "blog", "date_range": ["2026-05-09", "2026-05-10"],
            "metrics": ["visitors", "time_on_page", "scroll_depth"],
            "filters": [["is", "event:page", ["/pricing"]], ["is_not", "visit:device", ["Mobile"]]]}),
    )
    .await;
    assert_eq!(
        rows(&a),
        vec![(vec![], vec![json!(1), json!(40), json!(90)])]
    );
    let (_, a) = ask(
        &app,
        json!({"site_id": "blog", "date_range": "day", "metrics": ["visitors", "events"],
            "dimensions": ["event:name"], "filters": [["is_not", "event:name", ["pageview"]]],
            "include": {"total_rows": true}}),
    )
    .await;
    assert_eq!(
        rows(&a),
        vec![(vec!["signup".into()], vec![json!(1), json!(1)])]
    );
    assert_eq!(a["meta"]["total_rows"], 1);
    let (_, a) = ask(
        &app,
        json!({"site_id": "blog", "date_range": ["2026-05-09", "2026-05-10"], "metrics": ["visitors"],
            "dimensions": ["time:day"], "include": {"time_labels": true}}),
    )
    .await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["2026-05-09".into()], vec![json!(2)]),
            (vec!["2026-05-10".into()], vec![json!(1)]),
        ]
    );
    assert_eq!(
        a["meta"]["time_labels"],
        json!(["2026-05-09", "2026-05-10"])
    );
    app.assert_no_drift().await;
    app.stop().await;
}

#[tokio::test]
async fn what_is_not_supported_is_a_400_that_lists_what_is() {
    let mut app = spawn_app_with(options()).await;
    let base = json!({"site_id": "blog", "date_range": "30d", "metrics": ["visitors"]});
    let cases = [
        (
            json!({"metrics": ["visitors", "conversion_rate"]}),
            "bounce_rate",
        ),
        (json!({"dimensions": ["visit:city"]}), "visit:country"),
        (
            json!({"filters": [["matches", "event:page", ["^/a"]]]}),
            "contains",
        ),
        (
            json!({"filters": [["or", [["is", "event:page", ["/"]]]]]}),
            "is_not",
        ),
        (json!({"date_range": "fortnight"}), "7d"),
        (json!({"metrics": ["time_on_page"]}), "event:page"),
        (json!({"include": {"comparisons": true}}), "unknown field"),
    ];
    for (patch, hint) in cases {
        let mut q = base.clone();
        for (k, v) in patch.as_object().expect("obj") {
            q[k] = v.clone();
        }
        let (status, a) = ask(&app, q.clone()).await;
        assert_eq!(status, 400, "{q}: {a}");
        assert!(
            a["message"].as_str().expect("message").contains(hint),
            "{q}: {a}"
        );
    }
    let (status, _) = ask(
        &app,
        json!({"site_id": "nosuch", "date_range": "30d", "metrics": ["visitors"]}),
    )
    .await;
    assert_eq!(status, 404);
    app.stop().await;
}

#[tokio::test]
async fn the_dashboard_filters_by_a_clicked_row_and_exports_csv() {
    let mut app = spawn_app_with(options()).await;
    fill(&app).await;
    let html = app
        .get("/dashboard/blog?range=7d")
        .await
        .text()
        .await
        .expect("html");
    // The browsers panel links each row to the dashboard filtered by it.
    let href = html
        .split("href=\"")
        .map(|s| s.split('"').next().unwrap_or(""))
        .find(|h| h.contains("visit%3Abrowser%2CFirefox") || h.contains("visit:browser,Firefox"))
        .expect("a Firefox row link")
        .replace("&amp;", "&")
        .replace("&#38;", "&");
    let filtered = app
        .get(&format!("/dashboard/blog{href}"))
        .await
        .text()
        .await
        .expect("html");
    let visitors = filtered
        .split("id=\"card-visitors\"")
        .nth(1)
        .and_then(|s| s.split("data-field=\"value\">").nth(1))
        .and_then(|s| s.split('<').next())
        .expect("visitors card");
    assert_eq!(visitors, "1", "one Firefox visitor in the range");
    assert!(filtered.contains("Remove filter: Browser is Firefox"));
    let csv = app.get(&format!("/dashboard/blog{href}&format=csv")).await;
    assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
    let csv = csv.text().await.expect("csv");
    assert!(csv.lines().any(|l| l == "browsers,Firefox,1,,"), "{csv}");
    assert!(
        !csv.contains("Chrome"),
        "the export is the filtered view: {csv}"
    );
    app.stop().await;
}

/// The small location database of [`countries_come_from_the_location_database`].
static GEO: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

#[tokio::test]
async fn countries_come_from_the_location_database_and_are_credited() {
    use mmdb_writer::{IpVersion, Ipv4Aliasing, Value as Mmdb, Writer};
    let dir = tempfile::tempdir().expect("dir");
    let mut w = Writer::builder("country ipvAll")
        .ip_version(IpVersion::V6)
        .ipv4_aliasing(Ipv4Aliasing::Disabled)
        .build();
    for (net, cc) in [("198.51.100.0/24", "FR"), ("203.0.113.0/24", "JP")] {
        let net: ipnet::IpNet = net.parse().expect("net");
        w.insert_value(net, Mmdb::map([("country_code", Mmdb::from(cc))]))
            .expect("insert");
    }
    // Named as DB-IP's file is: the dashboard then credits it.
    let path = dir.path().join("dbip-country.mmdb");
    std::fs::write(&path, w.to_bytes().expect("db")).expect("write");
    GEO.set(path).expect("once");
    let mut app = spawn_app_with(Options {
        configure: |c| {
            c.geoip = GEO.get().cloned();
            c.trusted_proxies =
                tally::core::forwarded::TrustedProxies::parse(["loopback"]).expect("preset");
        },
        ..options()
    })
    .await;
    for (n, from) in [
        (1, "198.51.100.7"),
        (2, "198.51.100.8"),
        (3, "203.0.113.5"),
        (4, "10.1.2.3"),
    ] {
        let body = json!({"site": "blog", "type": "pageview",
            "event_id": event_id_at("2026-05-10T10:00:00Z".parse().expect("ts")),
            "visitor_id": v(n), "url": "https://blog.example/"});
        let r = app
            .client
            .post(app.url("/api/v1/hit"))
            .header("x-forwarded-for", from)
            .header("content-type", "text/plain")
            .body(body.to_string())
            .send()
            .await
            .expect("hit");
        assert_eq!(r.json::<Value>().await.expect("json")["status"], "accepted");
    }
    let (_, a) = ask(
        &app,
        json!({"site_id": "blog", "date_range": "day", "metrics": ["visitors"],
            "dimensions": ["visit:country"]}),
    )
    .await;
    assert_eq!(
        rows(&a),
        vec![
            (vec!["FR".into()], vec![json!(2)]),
            (vec!["(not set)".into()], vec![json!(1)]),
            (vec!["JP".into()], vec![json!(1)]),
        ]
    );
    let html = app
        .get("/dashboard/blog?range=today")
        .await
        .text()
        .await
        .expect("html");
    assert!(html.contains("IP Geolocation by DB-IP"));
    // The addresses themselves are nowhere in the database.
    let bytes = std::fs::read(&app.db).expect("db");
    assert!(!bytes.windows(12).any(|w| w == b"198.51.100.7"));
    app.stop().await;
}
