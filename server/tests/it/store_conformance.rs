//! The store conformance suite: the same checks for every backend. A backend is added by one
//! line in `backends!` (SQLite now; PostgreSQL joins here).

use std::sync::Arc;

use jiff::civil::date;
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{DedupeKey, EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Outcome, Record, Source};
use tally::store::{Site, Store};

fn record(n: u8, visitor: u8, page: &str, day: jiff::civil::Date) -> Record {
    let at: jiff::Timestamp = "2026-04-01T12:00:00Z".parse().expect("ts");
    Record {
        event_id: EventId::new_at(at, [n; 10]),
        site: SiteId::parse("s").expect("site"),
        source: Source::Web,
        kind: HitKind::Pageview,
        page: PagePath::parse(page).expect("page"),
        visitor: VisitorKey([visitor; 16]),
        at_ms: at.as_millisecond(),
        day,
        referrer: None,
    }
}

async fn dedupes_within_and_across_batches(store: Arc<dyn Store>) {
    let d = date(2026, 4, 1);
    let out = store
        .commit(vec![
            record(1, 1, "/a", d),
            record(1, 1, "/a", d),
            record(2, 1, "/a", d),
        ])
        .await
        .expect("commit");
    assert_eq!(
        out,
        [Outcome::Accepted, Outcome::Duplicate, Outcome::Accepted]
    );
    let out = store
        .commit(vec![record(2, 1, "/a", d), record(3, 2, "/b", d)])
        .await
        .expect("commit");
    assert_eq!(out, [Outcome::Duplicate, Outcome::Accepted]);
    let c = store
        .counts(
            &SiteId::parse("s").expect("s"),
            &PagePath::parse("/a").expect("p"),
            d,
        )
        .await
        .expect("counts");
    assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (2, 1));
    assert_eq!((c.site_today.web.views, c.site_today.web.visitors), (3, 2));
    assert_eq!(c.site_all.badge.views, 0);
}

async fn dedupe_keys_count_custom_events_once(store: Arc<dyn Store>) {
    let d = date(2026, 4, 1);
    let event = |n: u8, key: Option<&str>| Record {
        kind: HitKind::Event {
            name: EventName::parse("purchase").expect("name"),
            dedupe: key.map(|k| DedupeKey::parse(k).expect("key")),
        },
        ..record(n, 1, "/cart", d)
    };
    let out = store
        .commit(vec![
            event(10, Some("o1")),
            event(11, Some("o1")),
            event(12, None),
            event(13, None),
        ])
        .await
        .expect("commit");
    assert_eq!(
        out,
        [
            Outcome::Accepted,
            Outcome::Duplicate,
            Outcome::Accepted,
            Outcome::Accepted
        ]
    );
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty() && report.checked >= 2, "{report:?}");
}

async fn verify_finds_and_repairs_drift(store: Arc<dyn Store>, tamper: impl FnOnce()) {
    let d = date(2026, 4, 1);
    store
        .commit((0..20).map(|n| record(n, n % 3, "/a", d)).collect())
        .await
        .expect("commit");
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    tamper();
    let report = store.verify(false).await.expect("verify");
    assert!(!report.drift.is_empty(), "tampering must show as drift");
    assert!(!report.repaired);
    let report = store.verify(true).await.expect("repair");
    assert!(report.repaired);
    assert!(
        store.verify(false).await.expect("verify").drift.is_empty(),
        "repair leaves no drift"
    );
    let c = store
        .counts(
            &SiteId::parse("s").expect("s"),
            &PagePath::parse("/a").expect("p"),
            d,
        )
        .await
        .expect("c");
    assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (20, 3));
}

async fn sites_round_trip(store: Arc<dyn Store>) {
    let site = Site {
        id: SiteId::parse("blog").expect("id"),
        origins: vec!["https://a.example".into(), "https://b.example".into()],
        zone: SiteZone::parse("Europe/Berlin").expect("zone"),
        public: false,
        ingest_key: None,
    };
    store.put_site(&site).await.expect("put");
    let got = store
        .get_site(&site.id)
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(got.origins, site.origins);
    assert_eq!(got.zone.name(), "Europe/Berlin");
    assert!(!got.public);
    let auto = Site {
        public: true,
        ingest_key: None,
        origins: vec!["*".into()],
        ..site.clone()
    };
    let kept = store
        .ensure_site(&auto, 0)
        .await
        .expect("ensure")
        .expect("exists");
    assert!(!kept.public, "ensure_site keeps an existing site");
    assert!(store.remove_site(&site.id).await.expect("remove"));
    assert!(store.get_site(&site.id).await.expect("get").is_none());
}

async fn salts_are_stable_per_day_and_forgotten(store: Arc<dyn Store>) {
    let d1 = date(2026, 4, 1);
    let a = store.salt_for(d1, [1; 32]).await.expect("salt");
    let b = store.salt_for(d1, [2; 32]).await.expect("salt");
    assert_eq!(a, b, "one salt per day");
    let c = store
        .salt_for(date(2026, 4, 4), [3; 32])
        .await
        .expect("salt");
    assert_eq!(c, [3; 32]);
    // Three days later the first salt is gone: asking again stores the new candidate.
    assert_eq!(store.salt_for(d1, [4; 32]).await.expect("salt"), [4; 32]);
}

async fn prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify(store: Arc<dyn Store>) {
    let d = date(2026, 4, 1);
    let keyed = |n: u8| Record {
        kind: HitKind::Event {
            name: EventName::parse("purchase").expect("name"),
            dedupe: Some(DedupeKey::parse("order_9").expect("key")),
        },
        ..record(n, 1, "/cart", d)
    };
    let mut batch: Vec<Record> = (0..30).map(|n| record(n, n % 4, "/a", d)).collect();
    batch.push(keyed(200));
    store.commit(batch).await.expect("commit");
    let site = SiteId::parse("s").expect("s");
    let before = store.range_totals(&site, d, d).await.expect("totals");
    let pruned_at: jiff::Timestamp = "2026-04-03T00:00:00Z".parse().expect("ts");
    assert_eq!(
        store
            .prune(pruned_at.as_millisecond())
            .await
            .expect("prune"),
        30
    );
    assert_eq!(
        store
            .prune(pruned_at.as_millisecond())
            .await
            .expect("again"),
        0
    );
    // The dedupe key outlives the raw page views: the purchase still counts once.
    assert_eq!(
        store.commit(vec![keyed(201)]).await.expect("commit"),
        [Outcome::Duplicate]
    );
    assert_eq!(
        store.range_totals(&site, d, d).await.expect("totals"),
        before,
        "range visitors stay exact"
    );
    let report = store.verify(false).await.expect("verify");
    assert!(
        report.drift.is_empty(),
        "pruned days are not recounted: {report:?}"
    );
    let page = PagePath::parse("/a").expect("p");
    assert_eq!(
        store
            .counts(&site, &page, d)
            .await
            .expect("c")
            .page_all
            .web
            .views,
        30
    );
}

mod sqlite {
    use super::*;
    use tally::store::sqlite::{SqliteStore, SyncMode};

    fn open() -> (tempfile::TempDir, std::path::PathBuf, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let store = SqliteStore::open(&path, SyncMode::Full).expect("open");
        (dir, path, Arc::new(store))
    }

    #[tokio::test]
    async fn dedupes_within_and_across_batches() {
        super::dedupes_within_and_across_batches(open().2).await;
    }

    #[tokio::test]
    async fn dedupe_keys_count_custom_events_once() {
        super::dedupe_keys_count_custom_events_once(open().2).await;
    }

    #[tokio::test]
    async fn verify_finds_and_repairs_drift() {
        let (_dir, path, store) = open();
        super::verify_finds_and_repairs_drift(store, || {
            let conn = rusqlite::Connection::open(&path).expect("open");
            conn.execute(
                "UPDATE counters SET views = views + 5 WHERE page = '/a' AND day = '*'",
                [],
            )
            .expect("tamper");
            conn.execute("DELETE FROM counters WHERE page = '' AND day != '*'", [])
                .expect("tamper");
        })
        .await;
    }

    #[tokio::test]
    async fn prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify() {
        super::prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify(open().2).await;
    }

    #[tokio::test]
    async fn sites_round_trip() {
        super::sites_round_trip(open().2).await;
    }

    #[tokio::test]
    async fn salts_are_stable_per_day_and_forgotten() {
        super::salts_are_stable_per_day_and_forgotten(open().2).await;
    }
}

/// Range visitors are exact (not estimated): 100k distinct visitors over three overlapping days.
async fn range_visitors_are_exact_at_100k(store: Arc<dyn Store>) {
    let days = [date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3)];
    let mut n: u32 = 0;
    for (i, day) in days.iter().enumerate() {
        // Day i sees visitors [i*50k/… ]: 0..50k, 25k..75k, 50k..100k.
        let start = i as u32 * 25_000;
        let batch: Vec<Record> = (start..start + 50_000)
            .map(|v| {
                n += 1;
                let mut key = [0u8; 16];
                key[..4].copy_from_slice(&v.to_le_bytes());
                let mut id = [0u8; 10];
                id[4..8].copy_from_slice(&n.to_le_bytes());
                Record {
                    event_id: EventId::new_at("2026-04-02T12:00:00Z".parse().expect("ts"), id),
                    visitor: VisitorKey(key),
                    page: PagePath::parse(if v % 2 == 0 { "/even" } else { "/odd" }).expect("p"),
                    ..record(0, 0, "/", *day)
                }
            })
            .collect();
        for chunk in batch.chunks(10_000) {
            store.commit(chunk.to_vec()).await.expect("commit");
        }
    }
    let site = SiteId::parse("s").expect("s");
    let total = store
        .range_totals(&site, days[0], days[2])
        .await
        .expect("totals");
    assert_eq!(total.web.views, 150_000);
    assert_eq!(
        total.web.visitors, 100_000,
        "distinct over the range, exactly"
    );
    let two = store
        .range_totals(&site, days[0], days[1])
        .await
        .expect("totals");
    assert_eq!(two.web.visitors, 75_000);
    let top = store
        .top_pages(&site, days[0], days[2], 10)
        .await
        .expect("top");
    assert_eq!(top.len(), 2);
    assert_eq!(
        top.iter().map(|p| p.numbers.web.visitors).sum::<u64>(),
        100_000
    );
}

mod sqlite_ranges {
    use super::*;
    use tally::store::sqlite::{SqliteStore, SyncMode};

    #[tokio::test]
    async fn range_visitors_are_exact_at_100k() {
        let dir = tempfile::tempdir().expect("dir");
        let store =
            SqliteStore::open(&dir.path().join("r.sqlite"), SyncMode::Normal).expect("open");
        super::range_visitors_are_exact_at_100k(Arc::new(store)).await;
    }
}
