//! The bot list against committed corpora (see `server/data/bots/SOURCES.md`): at most 1 % of
//! known crawler user agents counted, no real browser filtered; and the filter on the wire.

use serde_json::Value;
use tally::collect::bots::BotList;

use crate::support::spawn_app;

fn corpus(name: &str) -> Vec<String> {
    let path = format!(
        "{}/tests/data/user-agents/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("corpus file");
    serde_json::from_str(&text).expect("a JSON array of strings")
}

#[test]
fn user_agent_corpus_crawlers_are_filtered_and_browsers_never() {
    let list = BotList::bundled();
    let crawlers = corpus("crawlers.json");
    let browsers = corpus("browsers.json");
    assert!(crawlers.len() > 2000 && browsers.len() > 900);

    let started = std::time::Instant::now();
    let counted: Vec<&String> = crawlers.iter().filter(|ua| !list.is_bot(ua)).collect();
    let filtered: Vec<&String> = browsers.iter().filter(|ua| list.is_bot(ua)).collect();
    let per_agent = started.elapsed() / (crawlers.len() + browsers.len()) as u32;

    let share = counted.len() as f64 / crawlers.len() as f64;
    println!(
        "crawlers counted: {} of {} ({:.2} %); browsers filtered: {} of {}; {per_agent:?} per agent, uncached",
        counted.len(),
        crawlers.len(),
        share * 100.0,
        filtered.len(),
        browsers.len()
    );
    assert!(share <= 0.01, "crawlers counted: {counted:#?}");
    assert!(filtered.is_empty(), "browsers filtered: {filtered:#?}");
}

#[tokio::test]
async fn crawlers_are_answered_filtered_and_browsers_accepted_on_the_wire() {
    let mut app = spawn_app().await;
    let crawlers = corpus("crawlers.json");
    let browsers = corpus("browsers.json");
    // A sample of each (every 200th), within the default per-address allowance.
    for (i, ua) in crawlers.iter().step_by(200).enumerate() {
        let r: Value = app
            .post_view_as(ua, &format!("/c{i}"))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "filtered", "{ua}");
    }
    for (i, ua) in browsers.iter().step_by(100).enumerate() {
        let r: Value = app
            .post_view_as(ua, &format!("/b{i}"))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(r["status"], "accepted", "{ua}");
    }
    assert!(
        app.metric("tally_filtered_total{reason=\"bot\"}")
            .await
            .is_some_and(|n| n >= 10.0)
    );
    app.stop().await;
}
