//! Compression over real HTTP: brotli or gzip by `Accept-Encoding`, `Vary` on every
//! compressible answer, nothing compressed twice, tiny bodies left alone.

use std::io::Read;

use serde_json::json;

use crate::support::{TestApp, event_id_at, pageview, spawn_app};

async fn fetch(app: &TestApp, path: &str, accept: Option<&str>) -> reqwest::Response {
    let mut req = app.client.get(app.url(path));
    if let Some(a) = accept {
        req = req.header("accept-encoding", a);
    }
    req.send().await.expect("request")
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).and_then(|v| v.to_str().ok())
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

fn unbrotli(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(bytes, 4096)
        .read_to_end(&mut out)
        .expect("valid brotli");
    out
}

fn varies_on_encoding(r: &reqwest::Response) -> bool {
    r.headers()
        .get_all("vary")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("accept-encoding"))
}

#[tokio::test]
async fn dashboard_is_brotli_or_gzip_as_asked_and_plain_otherwise() {
    let mut app = spawn_app().await;
    let hit = pageview(&event_id_at(app.now()), None, "/");
    assert_eq!(app.hit_status(&hit).await, "accepted");

    let plain = fetch(&app, "/dashboard/blog", None).await;
    assert_eq!(plain.status(), 200);
    assert_eq!(header(&plain, "content-encoding"), None);
    assert!(varies_on_encoding(&plain), "Vary: Accept-Encoding");
    let html = plain.bytes().await.expect("body").to_vec();
    assert!(html.starts_with(b"<!DOCTYPE html>") || html.starts_with(b"<!doctype html>"));

    let br = fetch(&app, "/dashboard/blog", Some("gzip, deflate, br")).await;
    assert_eq!(header(&br, "content-encoding"), Some("br"));
    assert!(varies_on_encoding(&br));
    let body = br.bytes().await.expect("body");
    assert!(body.len() * 2 < html.len(), "brotli shrinks the page");
    let decoded = unbrotli(&body);
    assert!(decoded.starts_with(&html[..15]), "decodes to the page");
    assert_eq!(decoded.len(), html.len());

    let gz = fetch(&app, "/dashboard/blog", Some("gzip")).await;
    assert_eq!(header(&gz, "content-encoding"), Some("gzip"));
    let decoded = gunzip(&gz.bytes().await.expect("body"));
    assert_eq!(decoded.len(), html.len());

    let identity = fetch(&app, "/dashboard/blog", Some("identity")).await;
    assert_eq!(header(&identity, "content-encoding"), None);
    app.stop().await;
}

#[tokio::test]
async fn json_and_svg_are_compressed_tiny_bodies_are_not() {
    let mut app = spawn_app().await;
    let hit = pageview(&event_id_at(app.now()), None, "/");
    assert_eq!(app.hit_status(&hit).await, "accepted");

    let series = fetch(&app, "/api/v1/sites/blog/series?range=30d", Some("br")).await;
    assert_eq!(series.status(), 200);
    assert_eq!(header(&series, "content-encoding"), Some("br"));
    let v: serde_json::Value =
        serde_json::from_slice(&unbrotli(&series.bytes().await.expect("body"))).expect("json");
    assert_eq!(v["days"].as_array().map(Vec::len), Some(30));

    let badge = fetch(&app, "/badge/blog.svg?count=0", Some("gzip")).await;
    assert_eq!(badge.status(), 200);
    assert_eq!(header(&badge, "content-encoding"), Some("gzip"));
    assert!(varies_on_encoding(&badge));
    let svg = gunzip(&badge.bytes().await.expect("body"));
    assert!(svg.starts_with(b"<svg"));

    // A body under the threshold is sent as it is.
    let healthz = fetch(&app, "/healthz", Some("gzip, br")).await;
    assert_eq!(header(&healthz, "content-encoding"), None);
    assert_eq!(healthz.text().await.expect("body"), "ok\n");

    // A hit's answer is tiny JSON: never compressed.
    let r = app
        .client
        .post(app.url("/api/v1/hit"))
        .header("origin", crate::support::ORIGIN)
        .header("accept-encoding", "gzip, br")
        .json(&json!(pageview(&event_id_at(app.now()), None, "/x")))
        .send()
        .await
        .expect("hit");
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-encoding"), None);
    app.stop().await;
}

#[tokio::test]
async fn the_snippet_is_decoded_once_to_the_plain_bytes() {
    let mut app = spawn_app().await;
    let plain = fetch(&app, "/tally.js", None).await;
    assert_eq!(plain.status(), 200);
    let plain = plain.bytes().await.expect("body");
    for (accept, decode) in [("gzip", gunzip as fn(&[u8]) -> Vec<u8>), ("br", unbrotli)] {
        let r = fetch(&app, "/tally.js", Some(accept)).await;
        assert_eq!(header(&r, "content-encoding"), Some(accept));
        // Already-encoded answers pass the layer untouched: one decode gives the script.
        assert_eq!(decode(&r.bytes().await.expect("body")), plain.to_vec());
    }
    app.stop().await;
}
