//! Table-driven bad input: every case gets its status and error code, and nothing is counted.

use serde_json::{Value, json};

use crate::support::{ORIGIN, event_id_at, pageview, spawn_app};

struct Case {
    name: &'static str,
    method: reqwest::Method,
    path: &'static str,
    content_type: Option<&'static str>,
    origin: Option<&'static str>,
    body: String,
    status: u16,
    code: &'static str,
}

fn case(name: &'static str, body: String, status: u16, code: &'static str) -> Case {
    Case {
        name,
        method: reqwest::Method::POST,
        path: "/api/v1/hit",
        content_type: Some("text/plain"),
        origin: Some(ORIGIN),
        body,
        status,
        code,
    }
}

fn with(mut v: Value, key: &str, value: Value) -> String {
    v[key] = value;
    v.to_string()
}

#[tokio::test]
async fn every_bad_input_gets_its_4xx_and_counts_do_not_move() {
    let mut app = spawn_app().await;
    let now = app.now();
    let good = pageview(&event_id_at(now), None, "/a");
    let old = event_id_at(now - jiff::SignedDuration::from_hours(73));
    let future = event_id_at(now + jiff::SignedDuration::from_mins(6));
    let cases = vec![
        case(
            "malformed json",
            "{\"site\": ".into(),
            400,
            "malformed_json",
        ),
        case("not json at all", "hello".into(), 400, "malformed_json"),
        case("empty body", String::new(), 400, "empty_body"),
        case("whitespace body", "  \n".into(), 400, "empty_body"),
        case(
            "site is a number",
            with(good.clone(), "site", json!(5)),
            400,
            "invalid_field",
        ),
        case(
            "url is an object",
            with(good.clone(), "url", json!({})),
            400,
            "invalid_field",
        ),
        case(
            "missing event id",
            {
                let mut v = good.clone();
                v.as_object_mut().map(|o| o.remove("event_id"));
                v.to_string()
            },
            400,
            "invalid_field",
        ),
        case("json array body", "[1,2]".into(), 400, "invalid_field"),
        case(
            "bad site id",
            with(good.clone(), "site", json!("Blog!")),
            400,
            "invalid_site",
        ),
        case(
            "event id not a uuid",
            with(good.clone(), "event_id", json!("123")),
            400,
            "invalid_event_id",
        ),
        case(
            "event id v4",
            with(
                good.clone(),
                "event_id",
                json!(uuid::Uuid::new_v4().to_string()),
            ),
            400,
            "invalid_event_id",
        ),
        case(
            "event id too old",
            with(good.clone(), "event_id", json!(old)),
            400,
            "event_id_out_of_window",
        ),
        case(
            "event id in the future",
            with(good.clone(), "event_id", json!(future)),
            400,
            "event_id_out_of_window",
        ),
        case(
            "visitor id not a uuid",
            with(good.clone(), "visitor_id", json!("me")),
            400,
            "invalid_visitor_id",
        ),
        case(
            "relative url",
            with(good.clone(), "url", json!("/a")),
            400,
            "invalid_url",
        ),
        case(
            "javascript url",
            with(good.clone(), "url", json!("javascript:alert(1)")),
            400,
            "invalid_url",
        ),
        case(
            "bad referrer",
            with(good.clone(), "referrer", json!("not a url")),
            400,
            "invalid_referrer",
        ),
        case(
            "unknown type",
            with(good.clone(), "type", json!("click")),
            400,
            "invalid_type",
        ),
        case(
            "event without name",
            with(good.clone(), "type", json!("event")),
            400,
            "invalid_name",
        ),
        case(
            "unknown site",
            with(good.clone(), "site", json!("other")),
            403,
            "unknown_site",
        ),
        Case {
            origin: Some("https://evil.example"),
            ..case(
                "disallowed origin",
                good.to_string(),
                403,
                "origin_not_allowed",
            )
        },
        case(
            "oversize body",
            with(
                good.clone(),
                "referrer",
                json!(format!("https://x.example/{}", "a".repeat(9000))),
            ),
            413,
            "body_too_large",
        ),
        Case {
            content_type: Some("application/x-www-form-urlencoded"),
            ..case("form body", good.to_string(), 415, "unsupported_media_type")
        },
        Case {
            method: reqwest::Method::GET,
            ..case("wrong method", String::new(), 405, "method_not_allowed")
        },
        Case {
            method: reqwest::Method::PUT,
            ..case("put", good.to_string(), 405, "method_not_allowed")
        },
        Case {
            path: "/api/v1/events",
            ..case("batch not an object", "[]".into(), 400, "invalid_field")
        },
        Case {
            path: "/api/v1/events",
            ..case(
                "batch too many",
                json!({"events": vec![json!({}); 501]}).to_string(),
                400,
                "batch_too_large",
            )
        },
        Case {
            path: "/api/v1/counts?site=blog&page=nope",
            method: reqwest::Method::GET,
            ..case("counts bad page", String::new(), 400, "invalid_page")
        },
        Case {
            path: "/api/v1/counts",
            method: reqwest::Method::GET,
            ..case("counts no site", String::new(), 400, "invalid_query")
        },
        Case {
            path: "/api/v1/counts?site=other",
            method: reqwest::Method::GET,
            ..case("counts unknown site", String::new(), 403, "unknown_site")
        },
    ];
    for c in &cases {
        let mut req = app
            .client
            .request(c.method.clone(), app.url(c.path))
            .body(c.body.clone());
        if let Some(ct) = c.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(origin) = c.origin {
            req = req.header("origin", origin);
        }
        let r = req.send().await.expect("request");
        assert_eq!(r.status().as_u16(), c.status, "{}: status", c.name);
        let text = r.text().await.expect("body");
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{}: not JSON: {text}", c.name));
        assert_eq!(v["error"], c.code, "{}: {text}", c.name);
        assert!(
            v["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}: message",
            c.name
        );
    }
    let counts = app.counts("/a").await;
    assert_eq!(
        (counts.site.views, counts.site.visitors, counts.live.events),
        (0, 0, 0)
    );
    // The good body itself is accepted: the cases above failed for their one defect only.
    assert_eq!(app.hit_status(&good).await, "accepted");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains(r#"tally_rejected_total{code="invalid_event_id"} 2"#),
        "{metrics}"
    );
    app.stop().await;
}

/// Found by probing the OpenAPI document's promises: a `{site}` or badge `{file}` segment that
/// is not UTF-8 once percent-decoded got axum's plain-text 400, not the JSON error body.
#[tokio::test]
async fn a_path_segment_that_is_not_utf8_gets_a_json_400() {
    let mut app = spawn_app().await;
    for path in [
        "/api/v1/sites/%FF/series",
        "/api/v1/sites/%FF/top",
        "/api/v1/sites/%C3%28/events",
        "/badge/%FF.svg",
        "/badge/%FF.json",
        "/dashboard/%FF",
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status(), 400, "{path}");
        let content_type = r.headers()["content-type"].to_str().expect("ascii");
        assert_eq!(content_type, "application/json", "{path}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"], "invalid_site", "{path}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let r = app
        .client
        .post(app.url("/dashboard/%FF/logout"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "invalid_site");
    app.stop().await;
}
