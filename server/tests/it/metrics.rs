//! `/metrics` as real scrapers read it: the classic text format by default, checked by
//! Prometheus' own `promtool check metrics` (installed by `.ci/run`), OpenMetrics on request.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::support::{event_id_at, pageview, spawn_app};

/// `promtool check metrics` over `text`: its exit status and what it printed.
async fn promtool(text: &str) -> (bool, String) {
    let mut child = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs (apt-get install prometheus; .ci/run installs it)");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("write");
    drop(stdin);
    let out = child.wait_with_output().await.expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[tokio::test]
async fn classic_format_by_default_passes_promtool_with_every_family_described() {
    let mut app = spawn_app().await;
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(app.now()), None, "/"))
            .await,
        "accepted"
    );
    let r = app.get("/metrics").await;
    assert_eq!(
        r.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = r.text().await.expect("text");
    assert!(!text.contains("# EOF"), "no OpenMetrics terminator");
    let (ok, said) = promtool(&text).await;
    assert!(ok && said.trim().is_empty(), "promtool: {said}\n{text}");

    // Every sample's family has HELP and TYPE.
    let described = |kind: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(kind))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect()
    };
    let (helps, types) = (described("# HELP "), described("# TYPE "));
    assert_eq!(helps, types);
    for sample in text.lines().filter(|l| !l.starts_with('#')) {
        let name = sample.split(['{', ' ']).next().expect("name");
        assert!(
            types.iter().any(|t| name == t
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(t))),
            "{name} has no TYPE"
        );
    }
    // Known label values are there before they happen.
    assert!(text.contains("tally_hits_total{status=\"accepted\"} 1"));
    assert!(text.contains("tally_hits_total{status=\"suppressed\"} 0"));
    assert!(text.contains("tally_filtered_total{reason=\"bot\"} 0"));
    assert!(text.contains("tally_refused_total{reason=\"overloaded\"} 0"));
    assert!(text.contains("tally_rejected_total{code=\"malformed_json\"} 0"));
    app.stop().await;
}

#[tokio::test]
async fn openmetrics_when_the_scraper_asks() {
    let mut app = spawn_app().await;
    // What Prometheus 2.x sends.
    let accept = "application/openmetrics-text;version=1.0.0;q=0.5,\
                  application/openmetrics-text;version=0.0.1;q=0.4,\
                  text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let r = app
        .client
        .get(app.url("/metrics"))
        .header("accept", accept)
        .send()
        .await
        .expect("request");
    assert_eq!(
        r.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let text = r.text().await.expect("text");
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains("# TYPE tally_hits counter"));
    // A refusal of OpenMetrics (q=0) gets the classic format.
    let r = app
        .client
        .get(app.url("/metrics"))
        .header("accept", "application/openmetrics-text;q=0, text/plain")
        .send()
        .await
        .expect("request");
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/plain")
    );
    app.stop().await;
}

/// The bytes each read cache keeps: every cache from the first scrape, and the analytics'
/// dictionary once a read has resolved a page.
#[tokio::test]
async fn read_caches_are_on_metrics_from_the_first_scrape() {
    let mut app = spawn_app().await;
    let caches = tally::metrics::READ_CACHES;
    let series = |cache: &str| format!("tally_read_cache_bytes{{cache=\"{cache}\"}}");
    for cache in caches {
        assert_eq!(app.metric(&series(cache)).await, Some(0.0), "{cache}");
    }
    assert_eq!(
        app.hit_status(&pageview(&event_id_at(app.now()), None, "/a"))
            .await,
        "accepted"
    );
    let asked = app
        .client
        .post(app.url("/api/v2/query"))
        .json(&serde_json::json!({"site_id": "blog", "date_range": "day",
            "metrics": ["visitors"], "dimensions": ["event:page"]}))
        .send()
        .await
        .expect("query");
    assert_eq!(asked.status(), 200);
    let dictionaries = app.metric(&series("dictionaries")).await.unwrap_or(0.0);
    assert!(dictionaries > 0.0, "the page read is kept: {dictionaries}");
    // A v1 top list keeps its days' page rows and visitor sets.
    assert_eq!(
        app.get("/api/v1/sites/blog/top?range=7d").await.status(),
        200
    );
    for cache in ["day_pages", "day_sets"] {
        let bytes = app.metric(&series(cache)).await.unwrap_or(0.0);
        assert!(bytes > 0.0, "{cache} kept nothing after a top list");
    }
    app.stop().await;
}
