//! `GET /api/v1/openapi.json` from a real server: an OpenAPI 3.1 document of every public
//! endpoint, the one `tally::edge::http::openapi_document()` generates, cacheable.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::spawn_app;

/// The operations docs/api.md lists ("Operations"), as `METHOD path`.
const OPERATIONS: &[&str] = &[
    "POST /api/v1/hit",
    "OPTIONS /api/v1/hit",
    "POST /api/v1/events",
    "OPTIONS /api/v1/events",
    "GET /api/v1/counts",
    "OPTIONS /api/v1/counts",
    "GET /api/v1/pixel.gif",
    "GET /api/v1/sites/{site}/series",
    "GET /api/v1/sites/{site}/top",
    "GET /api/v1/sites/{site}/events",
    "GET /api/v1/sites/{site}/filtered",
    "POST /api/v2/query",
    "GET /api/v1/openapi.json",
    "GET /badge/{file}",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
];

fn operations(doc: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            out.insert(format!("{} {path}", method.to_ascii_uppercase()));
        }
    }
    out
}

/// The schema a response's JSON content refers to.
fn json_ref(response: &Value) -> &str {
    response["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("no JSON schema reference in {response}"))
}

#[tokio::test]
async fn the_openapi_document_describes_every_endpoint_with_its_errors() {
    let mut app = spawn_app().await;
    let r = app.get("/api/v1/openapi.json").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.headers()["cache-control"], "public, max-age=300");
    let etag = r.headers()["etag"].to_str().expect("etag").to_owned();
    let doc: Value = r.json().await.expect("valid JSON");

    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1.")),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "Tally");
    let expected: BTreeSet<String> = OPERATIONS.iter().map(|s| s.to_string()).collect();
    assert_eq!(operations(&doc), expected);
    // The served document is the generated one.
    let generated = serde_json::to_value(tally::edge::http::openapi_document()).expect("json");
    assert_eq!(doc, generated);

    // The hit endpoint: its body, its answer, and its errors with the error schema.
    let hit = &doc["paths"]["/api/v1/hit"]["post"];
    for media in ["application/json", "text/plain"] {
        assert_eq!(
            hit["requestBody"]["content"][media]["schema"]["$ref"],
            "#/components/schemas/Hit"
        );
    }
    assert_eq!(
        json_ref(&hit["responses"]["200"]),
        "#/components/schemas/HitResponse"
    );
    for status in ["400", "401", "403", "408", "413", "415", "429", "503"] {
        assert_eq!(
            json_ref(&hit["responses"][status]),
            "#/components/schemas/ErrorBody",
            "hit {status}"
        );
    }
    for status in ["429", "503"] {
        assert_eq!(
            hit["responses"][status]["headers"]["Retry-After"]["schema"]["type"], "integer",
            "hit {status}"
        );
    }
    assert!(
        hit["responses"]["400"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("malformed_json") && d.contains("invalid_event_id")),
        "{}",
        hit["responses"]["400"]
    );

    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["ErrorBody"]["required"],
        serde_json::json!(["error", "message"])
    );
    assert_eq!(
        schemas["Hit"]["required"],
        serde_json::json!(["site", "type", "event_id", "url"])
    );
    assert_eq!(
        schemas["HitType"]["enum"],
        serde_json::json!(["pageview", "event", "engagement"])
    );
    assert_eq!(
        schemas["Status"]["enum"],
        serde_json::json!([
            "accepted",
            "duplicate",
            "suppressed",
            "filtered",
            "rejected"
        ])
    );
    // Unknown sites: 403 where counting, 404 for the stats.
    assert!(doc["paths"]["/api/v1/counts"]["get"]["responses"]["403"].is_object());
    let series = &doc["paths"]["/api/v1/sites/{site}/series"]["get"];
    assert_eq!(
        json_ref(&series["responses"]["404"]),
        "#/components/schemas/ErrorBody"
    );
    assert_eq!(
        json_ref(&series["responses"]["200"]),
        "#/components/schemas/SeriesResponse"
    );
    // The stats are open (public sites), or need the admin token or session.
    assert_eq!(
        series["security"],
        serde_json::json!([{}, {"admin_token": []}, {"admin_session": []}])
    );
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    assert_eq!(schemes["admin_session"]["in"], "cookie");
    assert_eq!(schemes["admin_session"]["name"], "tally_admin");
    assert_eq!(schemes["ingest_key"]["scheme"], "bearer");
    assert_eq!(schemes["metrics_token"]["scheme"], "bearer");
    // The badge answers SVG or shields' JSON.
    let badge = &doc["paths"]["/badge/{file}"]["get"]["responses"]["200"]["content"];
    assert!(badge["image/svg+xml"].is_object() && badge["application/json"].is_object());

    // Cacheable: the same ETag answers 304.
    let r = app
        .client
        .get(app.url("/api/v1/openapi.json"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 304);
    assert_eq!(r.headers()["etag"], etag.as_str());
    app.stop().await;
}
