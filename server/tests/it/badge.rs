//! The counter badge and the no-JavaScript pixel over real HTTP.

use tally::core::ids::{PagePath, SiteId};
use tally_wire::Numbers;

use crate::support::{TestApp, event_id_at, pageview, spawn_app};

const OTHER_UA: &str =
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_0) AppleWebKit/605.1.15 Safari/605.1.15";

async fn badge(app: &TestApp, query: &str, ua: Option<&str>) -> reqwest::Response {
    let mut req = app.client.get(app.url(&format!("/badge/blog.svg{query}")));
    if let Some(ua) = ua {
        req = req.header("user-agent", ua);
    }
    req.send().await.expect("request")
}

fn title(svg: &str) -> &str {
    let start = svg.find("<title>").map(|i| i + 7).unwrap_or(0);
    let end = svg[start..]
        .find("</title>")
        .map(|i| start + i)
        .unwrap_or(start);
    &svg[start..end]
}

#[tokio::test]
async fn badge_counts_with_proxy_proof_headers_and_suppresses_repeats() {
    let mut app = spawn_app().await;
    let r = badge(&app, "?page=/readme", None).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "image/svg+xml; charset=utf-8");
    let csp = h["content-security-policy"].to_str().expect("csp");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("sandbox"),
        "{csp}"
    );
    assert_eq!(
        h["cache-control"],
        "no-cache, no-store, must-revalidate, max-age=0"
    );
    assert_eq!(h["expires"], "Thu, 01 Jan 1970 00:00:00 GMT");
    assert!(h.contains_key("etag"));
    assert_eq!(h["x-tally-status"], "accepted");
    let svg = r.text().await.expect("svg");
    assert!(svg.starts_with("<svg"), "{svg}");
    assert_eq!(title(&svg), "views: 1");

    // The same source again within the interval: shown, not counted.
    let r = badge(&app, "?page=/readme", None).await;
    assert_eq!(r.headers()["x-tally-status"], "suppressed");
    assert_eq!(title(&r.text().await.expect("svg")), "views: 1");
    // Another source counts.
    let r = badge(&app, "?page=/readme", Some(OTHER_UA)).await;
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert_eq!(title(&r.text().await.expect("svg")), "views: 2");
    // After the interval the first source counts again.
    app.clock.advance_millis(10_001);
    let r = badge(&app, "?page=/readme&metric=visitors", None).await;
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert_eq!(title(&r.text().await.expect("svg")), "visitors: 2");
    // Display only.
    let r = badge(&app, "?page=/readme&count=0&label=reads", Some(OTHER_UA)).await;
    assert_eq!(r.headers()["x-tally-status"], "display_only");
    let etag = r.headers()["etag"].clone();
    assert_eq!(title(&r.text().await.expect("svg")), "reads: 3");
    let r = app
        .client
        .get(app.url("/badge/blog.svg?page=/readme&count=0&label=reads"))
        .header("if-none-match", etag)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 304);
    app.stop().await;
}

#[tokio::test]
async fn badge_escapes_user_text_and_falls_back_on_bad_parameters() {
    let mut app = spawn_app().await;
    let r = badge(
        &app,
        "?count=0&label=%3C%2Ftext%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E%22%27%26",
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    let svg = r.text().await.expect("svg");
    assert!(!svg.contains("<script"), "{svg}");
    assert!(svg.contains("&lt;/text&gt;&lt;script&gt;"), "{svg}");
    // Invalid parameters never break the image: defaults are used and named in a header.
    for (query, ignored) in [
        ("?metric=pageviews&count=0", "metric"),
        ("?color=javascript:alert(1)&count=0", "color"),
        ("?labelColor=nope&count=0", "labelColor"),
        ("?style=3d&count=0", "style"),
        ("?abbreviate=maybe&count=0", "abbreviate"),
        ("?page=//evil&count=0", "page"),
    ] {
        let r = badge(&app, query, None).await;
        assert_eq!(r.status(), 200, "{query}");
        assert_eq!(
            r.headers()["x-tally-warning"],
            format!("ignored invalid {ignored} (defaults used)").as_str(),
            "{query}"
        );
        assert!(
            r.headers()["content-type"]
                .to_str()
                .expect("ct")
                .starts_with("image/svg+xml")
        );
        let svg = r.text().await.expect("svg");
        assert_eq!(title(&svg), "views: 0", "{query}");
        assert!(svg.contains(r##"fill="#007ec6""##), "default colour: {svg}");
    }
    let r = badge(
        &app,
        "?count=0&style=plastic&labelColor=fff&color=red",
        None,
    )
    .await;
    assert!(r.headers().get("x-tally-warning").is_none());
    let svg = r.text().await.expect("svg");
    assert!(svg.contains(r#"height="18""#) && svg.contains(r##"fill="#fff""##));
    let r = app.get("/badge/nope.svg").await;
    assert_eq!(r.status(), 403);
    assert_eq!(app.counts("/").await.site.views, 0, "nothing was counted");
    // A flag that is not a flag takes its default: `count=maybe` counts.
    let r = badge(&app, "?count=maybe", None).await;
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert_eq!(
        r.headers()["x-tally-warning"],
        "ignored invalid count (defaults used)"
    );
    app.stop().await;
}

#[tokio::test]
async fn badge_json_follows_the_shields_endpoint_schema_and_the_same_counting() {
    let mut app = spawn_app().await;
    let r = app
        .get("/badge/blog.json?label=reads&color=green&labelColor=333")
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("application/json")
    );
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        v,
        serde_json::json!({"schemaVersion": 1, "label": "reads", "message": "1",
            "color": "#67ac09", "labelColor": "#333"})
    );
    let r = app.get("/badge/blog.json?count=0&color=bogus").await;
    assert_eq!(r.headers()["x-tally-status"], "display_only");
    assert!(r.headers().get("x-tally-warning").is_some());
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        v,
        serde_json::json!({"schemaVersion": 1, "label": "views", "message": "1", "color": "#007ec6"})
    );
    assert_eq!(app.get("/badge/blog.png").await.status(), 404);
    app.stop().await;
}

#[tokio::test]
async fn badge_and_script_on_one_page_are_not_double_counted_and_bases_add() {
    let mut app = spawn_app().await;
    for _ in 0..2 {
        app.hit_status(&pageview(&event_id_at(app.now()), None, "/post"))
            .await;
    }
    let r = badge(&app, "?page=/post", None).await;
    assert_eq!(
        title(&r.text().await.expect("svg")),
        "views: 2",
        "the larger source is shown"
    );
    let site = SiteId::parse("blog").expect("id");
    app.store
        .set_base(
            &site,
            None,
            Numbers {
                views: 1000,
                visitors: 300,
            },
        )
        .await
        .expect("base");
    app.store
        .set_base(
            &site,
            Some(&PagePath::parse("/post").expect("p")),
            Numbers {
                views: 50,
                visitors: 5,
            },
        )
        .await
        .expect("base");
    let c = app.counts("/post").await;
    assert_eq!((c.site.views, c.site.visitors), (1002, 301));
    assert_eq!((c.page.views, c.page.visitors), (52, 6));
    let r = badge(&app, "?count=0&abbreviate=1", None).await;
    assert_eq!(title(&r.text().await.expect("svg")), "views: 1k");
    // Bases are never part of the raw-event recount.
    app.assert_no_drift().await;
    app.stop().await;
}

#[tokio::test]
async fn pixel_counts_once_per_source_and_checks_the_embedding_origin() {
    let mut app = spawn_app().await;
    let get = |query: &'static str, referer: Option<&'static str>| {
        let mut req = app
            .client
            .get(app.url(&format!("/api/v1/pixel.gif{query}")));
        if let Some(r) = referer {
            req = req.header("referer", r);
        }
        req.send()
    };
    let r = get("?site=blog&page=/np", None).await.expect("r");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "image/gif");
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.bytes().await.expect("gif").len(), 43);
    let r = get("?site=blog&page=/np", None).await.expect("r");
    assert_eq!(r.headers()["x-tally-status"], "suppressed");
    // The page may come from the Referer of the embedding page.
    let r = get("?site=blog", Some("https://blog.example/from-referer?x=1"))
        .await
        .expect("r");
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    let r = get("?site=blog", Some("https://evil.example/"))
        .await
        .expect("r");
    assert_eq!(r.status(), 403);
    assert_eq!(app.counts("/np").await.page.views, 1);
    assert_eq!(app.counts("/from-referer").await.page.views, 1);
    app.stop().await;
}

#[tokio::test]
async fn behind_a_proxy_the_last_forwarded_hop_is_the_source() {
    let mut app = crate::support::spawn_app_with(crate::support::Options {
        configure: |c| {
            c.trusted_proxies =
                tally::core::forwarded::TrustedProxies::parse(["loopback"]).expect("preset")
        },
        ..crate::support::Options::default()
    })
    .await;
    let fetch = |xff: &'static str| {
        app.client
            .get(app.url("/badge/blog.svg?page=/p"))
            .header("x-forwarded-for", xff)
            .send()
    };
    let r = fetch("1.1.1.1, 203.0.113.7").await.expect("r");
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    // A client rotating the (client-controlled) leftmost entry is still the same source.
    let r = fetch("9.9.9.9, 203.0.113.7").await.expect("r");
    assert_eq!(r.headers()["x-tally-status"], "suppressed");
    let r = fetch("1.1.1.1, 198.51.100.2").await.expect("r");
    assert_eq!(r.headers()["x-tally-status"], "accepted");
    app.stop().await;
}
