//! The store conformance suite: the same checks for every backend. Each check is an `async fn`
//! taking an `Arc<dyn Store>`; `mod sqlite`/`sqlite_v2` run them on SQLite files and
//! `mod postgres` on PostgreSQL (`TALLY_TEST_POSTGRES`, a fresh schema per test).

use std::sync::Arc;

use jiff::civil::date;
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{DedupeKey, EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Outcome, Record, Source};
use tally::store::{OTHER_PAGE, Retention, Site, Store, StoreError};

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

/// Top events: names ranked by their count over the range (ties by name), cut to the limit,
/// each with its day rows in order; days outside the range, other sites and page views are
/// not counted.
async fn top_events_rank_limit_and_split_by_day(store: Arc<dyn Store>) {
    let (d1, d2, d3) = (date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3));
    let mut n: u8 = 0;
    let mut event = |name: &str, day, site: &str| {
        n += 1;
        Record {
            site: SiteId::parse(site).expect("site"),
            kind: HitKind::Event {
                name: EventName::parse(name).expect("name"),
                dedupe: None,
            },
            ..record(n, 1, "/", day)
        }
    };
    let batch = vec![
        event("signup", d1, "s"),
        event("signup", d2, "s"),
        event("signup", d2, "s"),
        event("download", d1, "s"),
        event("download", d3, "s"),
        event("download", d3, "s"),
        event("zeta", d2, "s"),
        event("alpha", d2, "s"),
        event("signup", d2, "other"),
        event("late", d3, "s"),
    ];
    let mut batch = batch;
    batch.push(record(200, 1, "/", d2));
    store.commit(batch).await.expect("commit");
    let s = SiteId::parse("s").expect("s");
    let rows = store.top_events(&s, d1, d2, 3).await.expect("events");
    let names: Vec<(&str, u64)> = rows.iter().map(|r| (r.name.as_str(), r.count)).collect();
    assert_eq!(names, [("signup", 3), ("alpha", 1), ("download", 1)]);
    assert_eq!(rows[0].days, [(d1, 1), (d2, 2)]);
    assert_eq!(rows[2].days, [(d1, 1)], "d3 is outside the range");
    let all = store.top_events(&s, d1, d3, 50).await.expect("events");
    assert_eq!(all.len(), 5);
    assert_eq!((all[0].name.as_str(), all[0].count), ("download", 3));
    assert!(
        store
            .top_events(&SiteId::parse("nobody").expect("id"), d1, d3, 50)
            .await
            .expect("events")
            .is_empty()
    );
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
    // Raw events older than one day as of 04-04 00:00: everything before 04-03 00:00.
    let now: jiff::Timestamp = "2026-04-04T00:00:00Z".parse().expect("ts");
    let raw = Retention {
        raw_days: 1,
        ..Retention::default()
    };
    assert_eq!(store.prune(raw, now).await.expect("prune").events, 30);
    assert_eq!(store.prune(raw, now).await.expect("again").events, 0);
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
    use tally::store::sqlite::{SqliteStore, StoreOptions};

    fn open() -> (tempfile::TempDir, std::path::PathBuf, Arc<dyn Store>) {
        open_with(StoreOptions::default())
    }

    fn open_with(options: StoreOptions) -> (tempfile::TempDir, std::path::PathBuf, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let store = SqliteStore::open(&path, options).expect("open");
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
    async fn top_events_rank_limit_and_split_by_day() {
        super::top_events_rank_limit_and_split_by_day(open().2).await;
    }

    #[tokio::test]
    async fn verify_finds_and_repairs_drift() {
        let (_dir, path, store) = open();
        super::verify_finds_and_repairs_drift(store, || {
            let conn = rusqlite::Connection::open(&path).expect("open");
            conn.execute(
                "UPDATE counters SET views = views + 5 WHERE day = -1 \
                 AND scope = (SELECT id FROM pages WHERE path = '/a')",
                [],
            )
            .expect("tamper");
            conn.execute(
                "DELETE FROM counters WHERE day != -1 \
                 AND scope = (SELECT id FROM pages WHERE path = '')",
                [],
            )
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
    use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};

    #[tokio::test]
    async fn range_visitors_are_exact_at_100k() {
        let dir = tempfile::tempdir().expect("dir");
        let options = StoreOptions {
            sync: SyncMode::Normal,
            ..StoreOptions::default()
        };
        let store = SqliteStore::open(&dir.path().join("r.sqlite"), options).expect("open");
        super::range_visitors_are_exact_at_100k(Arc::new(store)).await;
    }
}

/// A page view number `i` (any u32) of `visitor` on `page`, at noon UTC of `day`.
fn view(i: u32, visitor: u32, page: &str, day: jiff::civil::Date) -> Record {
    let at = day
        .to_zoned(jiff::tz::TimeZone::UTC)
        .expect("zoned")
        .timestamp()
        + jiff::SignedDuration::from_hours(12);
    // Bytes 4..8 of the random part: the first bytes lose bits to the UUID version and variant.
    let mut id = [0u8; 10];
    id[4..8].copy_from_slice(&i.to_be_bytes());
    let mut key = [0u8; 16];
    key[..4].copy_from_slice(&visitor.to_le_bytes());
    Record {
        event_id: EventId::new_at(at, id),
        page: PagePath::parse(page).expect("page"),
        visitor: VisitorKey(key),
        at_ms: at.as_millisecond(),
        ..record(0, 0, "/", day)
    }
}

fn site_s() -> SiteId {
    SiteId::parse("s").expect("s")
}

fn top_views(rows: &[tally::store::PageRow]) -> Vec<(String, u64, u64)> {
    rows.iter()
        .map(|r| (r.page.clone(), r.numbers.web.views, r.numbers.web.visitors))
        .collect()
}

/// With a cap of 3 new pages per site and day: the 4th and later new pages of the day count
/// under `(other)`, known pages keep counting, the next day has a fresh allowance.
async fn page_cap_counts_new_pages_beyond_it_under_other(store: Arc<dyn Store>) {
    let (d1, d2) = (date(2026, 4, 1), date(2026, 4, 2));
    let batch = vec![
        view(1, 1, "/a", d1),
        view(2, 1, "/b", d1),
        view(3, 2, "/c", d1),
        view(4, 1, "/d", d1),
        view(5, 3, "/e", d1),
        view(6, 2, "/a", d1),
        view(7, 2, "/d", d1),
    ];
    store.commit(batch).await.expect("commit");
    let page = |p: &str| PagePath::parse(p).expect("p");
    let a = store.counts(&site_s(), &page("/a"), d1).await.expect("c");
    assert_eq!((a.page_all.web.views, a.page_all.web.visitors), (2, 2));
    assert_eq!((a.site_all.web.views, a.site_all.web.visitors), (7, 3));
    let d = store.counts(&site_s(), &page("/d"), d1).await.expect("c");
    assert_eq!(d.page_all.web.views, 0, "a page beyond the cap has no row");
    let top = store.top_pages(&site_s(), d1, d1, 10).await.expect("top");
    assert_eq!(
        top_views(&top),
        [
            (OTHER_PAGE.to_owned(), 3, 3),
            ("/a".to_owned(), 2, 2),
            ("/b".to_owned(), 1, 1),
            ("/c".to_owned(), 1, 1),
        ]
    );
    // A new day: /d is a new page within the allowance.
    store
        .commit(vec![view(8, 1, "/d", d2), view(9, 1, "/a", d2)])
        .await
        .expect("commit");
    let top = store.top_pages(&site_s(), d2, d2, 10).await.expect("top");
    assert_eq!(
        top_views(&top),
        [("/a".to_owned(), 1, 1), ("/d".to_owned(), 1, 1)]
    );
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty() && report.checked > 0, "{report:?}");
}

/// Each kind of retention removes its rows, keeps the rest exact, and a repair afterwards
/// (forced by `tamper`, which bumps a whole-site counter of 04-02) brings nothing back.
async fn prune_each_kind_keeps_verify_clean(store: Arc<dyn Store>, tamper: impl FnOnce()) {
    let (d1, d2) = (date(2026, 4, 1), date(2026, 4, 2));
    let mut batch = Vec::new();
    for i in 0..40u32 {
        let day = if i < 20 { d1 } else { d2 };
        batch.push(view(i, i % 7, if i % 2 == 0 { "/a" } else { "/b" }, day));
    }
    store.commit(batch).await.expect("commit");
    let old_salt = store.salt_for(d1, [1; 32]).await.expect("salt");
    assert_eq!(old_salt, [1; 32]);
    let series = store.series(&site_s(), d1, d2).await.expect("series");
    let totals_d2 = store.range_totals(&site_s(), d2, d2).await.expect("t");
    let top_d2 = store.top_pages(&site_s(), d2, d2, 10).await.expect("top");
    let a = PagePath::parse("/a").expect("p");
    let counts = store.counts(&site_s(), &a, d2).await.expect("c");
    assert!(
        store
            .range_totals(&site_s(), d1, d1)
            .await
            .expect("t")
            .web
            .visitors
            > 0
    );

    // On 04-05, keeping 3 days: rows of days before 04-02 go.
    let now: jiff::Timestamp = "2026-04-05T12:00:00Z".parse().expect("ts");
    let policy = Retention {
        raw_days: 0,
        visitor_days: 3,
        page_days: 3,
    };
    let report = store.prune(policy, now).await.expect("prune");
    // 04-01: 7 visitors on the site, and the same 7 on each of /a and /b.
    assert_eq!(report.events, 0);
    assert_eq!(report.visitor_rows, 7 + 7 + 7, "{report:?}");
    assert_eq!(report.counter_rows, 2, "{report:?}");
    assert!(report.salts >= 1, "{report:?}");
    assert_eq!(
        store.prune(policy, now).await.expect("again"),
        tally::store::PruneReport::default()
    );

    assert_eq!(
        store.series(&site_s(), d1, d2).await.expect("s"),
        series,
        "whole-site days stay"
    );
    assert_eq!(
        store.range_totals(&site_s(), d2, d2).await.expect("t"),
        totals_d2
    );
    assert_eq!(
        store.top_pages(&site_s(), d2, d2, 10).await.expect("t"),
        top_d2
    );
    assert!(
        store
            .top_pages(&site_s(), d1, d1, 10)
            .await
            .expect("t")
            .is_empty()
    );
    assert_eq!(store.counts(&site_s(), &a, d2).await.expect("c"), counts);
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty() && report.checked > 0, "{report:?}");

    tamper();
    let report = store.verify(true).await.expect("repair");
    assert!(report.repaired && report.drift.len() == 1, "{report:?}");
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    assert!(
        store
            .top_pages(&site_s(), d1, d1, 10)
            .await
            .expect("t")
            .is_empty(),
        "repair brings back no pruned page row"
    );
    assert_eq!(
        store
            .range_totals(&site_s(), d1, d1)
            .await
            .expect("t")
            .web
            .visitors,
        0,
        "repair brings back no pruned visitor set"
    );
    assert_eq!(store.series(&site_s(), d1, d2).await.expect("s"), series);
    // The salt of 04-01 is gone: asking again stores the new candidate.
    assert_eq!(store.salt_for(d1, [2; 32]).await.expect("salt"), [2; 32]);
}

/// `full` and `roomy` are two stores on one database; `full` has a floor no disk reaches.
async fn disk_floor_refuses_and_stores_nothing(full: Arc<dyn Store>, roomy: Arc<dyn Store>) {
    let d = date(2026, 4, 1);
    let batch = vec![view(1, 1, "/a", d), view(2, 2, "/b", d)];
    match full.commit(batch.clone()).await {
        Err(StoreError::DiskFull { free, floor }) => {
            assert_eq!(floor, u64::MAX);
            assert!(free > 0 && Some(free) <= full.free_bytes().map(|f| f + (64 << 20)));
        }
        other => panic!("expected DiskFull, got {other:?}"),
    }
    assert!(matches!(
        full.probe().await,
        Err(StoreError::DiskFull { .. })
    ));
    roomy.probe().await.expect("probe");
    assert_eq!(
        roomy.commit(batch).await.expect("commit"),
        [Outcome::Accepted, Outcome::Accepted],
        "nothing of the refused batch was stored"
    );
}

async fn ensure_site_respects_max_sites(store: Arc<dyn Store>) {
    let site = |id: &str| Site {
        id: SiteId::parse(id).expect("id"),
        origins: vec!["*".into()],
        zone: SiteZone::utc(),
        public: true,
        ingest_key: None,
    };
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&store);
            let site = site(&format!("auto{i}"));
            tokio::spawn(async move { store.ensure_site(&site, 5).await.expect("ensure") })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        created += usize::from(task.await.expect("join").is_some());
    }
    assert_eq!(
        created, 5,
        "exactly max_sites sites, even when asked at once"
    );
    assert_eq!(store.site_count().await.expect("count"), 5);
    let existing = store.list_sites().await.expect("list")[0].clone();
    assert!(
        store.ensure_site(&existing, 5).await.expect("e").is_some(),
        "an existing site is returned at the limit"
    );
    assert!(
        store
            .ensure_site(&site("more"), 5)
            .await
            .expect("e")
            .is_none()
    );
    assert!(
        store
            .ensure_site(&site("more"), 0)
            .await
            .expect("e")
            .is_some(),
        "0 = no limit"
    );
    assert_eq!(store.site_count().await.expect("count"), 6);
}

async fn ingest_key_is_kept_by_put_site(store: Arc<dyn Store>) {
    let mut site = Site {
        id: SiteId::parse("api").expect("id"),
        origins: vec!["https://a.example".into()],
        zone: SiteZone::utc(),
        public: false,
        ingest_key: None,
    };
    store.put_site(&site).await.expect("put");
    assert!(
        store
            .set_ingest_key(&site.id, Some("k-secret-1"))
            .await
            .expect("set")
    );
    let unknown = SiteId::parse("nope").expect("id");
    assert!(
        !store
            .set_ingest_key(&unknown, Some("x"))
            .await
            .expect("set")
    );
    site.origins = vec!["https://b.example".into()];
    store.put_site(&site).await.expect("put again");
    let got = store.get_site(&site.id).await.expect("get").expect("site");
    assert_eq!(got.origins, ["https://b.example"]);
    assert_eq!(
        got.ingest_key.as_deref(),
        Some("k-secret-1"),
        "site add keeps the key"
    );
    assert!(
        !format!("{got:?}").contains("k-secret-1"),
        "Debug hides the key"
    );
    let kept = store.ensure_site(&site, 0).await.expect("e").expect("site");
    assert_eq!(kept.ingest_key.as_deref(), Some("k-secret-1"));
    assert!(store.set_ingest_key(&site.id, None).await.expect("clear"));
    let got = store.get_site(&site.id).await.expect("get").expect("site");
    assert_eq!(got.ingest_key, None);
}

/// Ranked by the larger of web and badge views over the range, ties by path, cut to `limit`.
async fn top_pages_rank_by_the_larger_source_and_limit(store: Arc<dyn Store>) {
    let (d1, d2) = (date(2026, 4, 1), date(2026, 4, 2));
    let badge = |r: Record| Record {
        source: Source::Badge,
        ..r
    };
    let mut batch = Vec::new();
    let mut i = 0u32;
    let mut add = |r: &dyn Fn(u32) -> Record| {
        i += 1;
        batch.push(r(i));
    };
    for v in 0..3 {
        add(&|i| view(i, v, "/b", d1));
        add(&|i| view(i, v, "/a", d2));
    }
    add(&|i| view(i, 9, "/c", d1));
    for v in 0..5 {
        add(&|i| badge(view(i, v % 2, "/c", if v < 3 { d1 } else { d2 })));
    }
    add(&|i| view(i, 1, "/d", d1));
    add(&|i| view(i, 1, "/d", d2));
    store.commit(batch).await.expect("commit");
    let top = store.top_pages(&site_s(), d1, d2, 3).await.expect("top");
    let got: Vec<_> = top
        .iter()
        .map(|r| {
            (
                r.page.as_str(),
                r.numbers.web.views,
                r.numbers.web.visitors,
                r.numbers.badge.views,
                r.numbers.badge.visitors,
            )
        })
        .collect();
    assert_eq!(
        got,
        [("/c", 1, 1, 5, 2), ("/a", 3, 3, 0, 0), ("/b", 3, 3, 0, 0)]
    );
    let top = store.top_pages(&site_s(), d1, d2, 10).await.expect("top");
    assert_eq!(top.len(), 4);
    assert_eq!(
        (
            top[3].page.as_str(),
            top[3].numbers.web.views,
            top[3].numbers.web.visitors
        ),
        ("/d", 2, 1),
        "visitors distinct over the range"
    );
    let top = store.top_pages(&site_s(), d2, d2, 1).await.expect("top");
    assert_eq!(top_views(&top), [("/a".to_owned(), 3, 3)]);
}

async fn filtered_tallies_add_up_per_site_day_and_reason(store: Arc<dyn Store>) {
    use tally::core::filtered::{FilteredRow, Reason};
    let (d1, d2) = (date(2026, 4, 1), date(2026, 4, 2));
    let row = |site: &str, day, reason, count| FilteredRow {
        site: SiteId::parse(site).expect("site"),
        day,
        reason,
        count,
    };
    store
        .add_filtered(&[
            row("s", d1, Reason::Bot, 3),
            row("s", d1, Reason::Suppressed, 2),
            row("s", d2, Reason::Bot, 1),
            row("other", d1, Reason::Bot, 100),
        ])
        .await
        .expect("add");
    // Adding again sums into the same keys.
    store
        .add_filtered(&[
            row("s", d1, Reason::Bot, 4),
            row("s", d2, Reason::RateLimited, 5),
        ])
        .await
        .expect("add again");
    let s = SiteId::parse("s").expect("site");
    let one = store.filtered(&s, d1, d1).await.expect("d1");
    assert_eq!((one.bot, one.suppressed, one.rate_limited), (7, 2, 0));
    let both = store.filtered(&s, d1, d2).await.expect("d1..d2");
    assert_eq!(
        (both.bot, both.suppressed, both.rate_limited, both.total()),
        (8, 2, 5, 15)
    );
    let none = store
        .filtered(&SiteId::parse("never").expect("site"), d1, d2)
        .await
        .expect("unknown site");
    assert_eq!(none.total(), 0);
}

/// The daily series (whole site, by source, days without views absent) and the top referring
/// hosts (page views only, within the range's instants, ranked then by host, limited).
async fn series_and_top_referrers(store: Arc<dyn Store>) {
    let (d1, d2, d3) = (date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3));
    let from = |r: Record, referrer: &str| Record {
        referrer: Some(referrer.to_owned()),
        ..r
    };
    let badge = |r: Record| Record {
        source: Source::Badge,
        ..r
    };
    let event = Record {
        kind: HitKind::Event {
            name: EventName::parse("signup").expect("name"),
            dedupe: None,
        },
        ..from(view(9, 1, "/", d1), "https://ignored.example/")
    };
    store
        .commit(vec![
            from(view(1, 1, "/a", d1), "https://news.example/x?y=1"),
            from(view(2, 2, "/b", d1), "https://news.example/"),
            from(view(3, 3, "/a", d1), "https://blog.example"),
            badge(view(4, 1, "/a", d1)),
            from(view(5, 1, "/a", d3), "https://late.example/"),
            event,
        ])
        .await
        .expect("commit");
    let series = store.series(&site_s(), d1, d3).await.expect("series");
    let got: Vec<_> = series
        .iter()
        .map(|r| {
            (
                r.day,
                r.numbers.web.views,
                r.numbers.web.visitors,
                r.numbers.badge.views,
            )
        })
        .collect();
    assert_eq!(got, [(d1, 3, 3, 1), (d3, 1, 1, 0)], "{series:?}");
    assert!(store.series(&site_s(), d2, d2).await.expect("s").is_empty());
    let zone = SiteZone::utc();
    let top = store
        .top_referrers(&site_s(), d1, d2, zone.span(d1, d2), 10)
        .await
        .expect("referrers");
    let got: Vec<_> = top.iter().map(|r| (r.host.as_str(), r.views)).collect();
    assert_eq!(got, [("news.example", 2), ("blog.example", 1)]);
    let top = store
        .top_referrers(&site_s(), d1, d3, zone.span(d1, d3), 1)
        .await
        .expect("referrers");
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].host, "news.example");
}

mod sqlite_v2 {
    use super::*;
    use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};

    fn options() -> StoreOptions {
        StoreOptions {
            sync: SyncMode::Normal,
            ..StoreOptions::default()
        }
    }

    fn open_at(path: &std::path::Path, options: StoreOptions) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(path, options).expect("open"))
    }

    #[tokio::test]
    async fn series_and_top_referrers() {
        let dir = tempfile::tempdir().expect("dir");
        super::series_and_top_referrers(open_at(&dir.path().join("t.sqlite"), options())).await;
    }

    #[tokio::test]
    async fn filtered_tallies_add_up_per_site_day_and_reason() {
        let dir = tempfile::tempdir().expect("dir");
        super::filtered_tallies_add_up_per_site_day_and_reason(open_at(
            &dir.path().join("t.sqlite"),
            options(),
        ))
        .await;
    }

    #[tokio::test]
    async fn page_cap_counts_new_pages_beyond_it_under_other() {
        let dir = tempfile::tempdir().expect("dir");
        let options = StoreOptions {
            max_new_pages_per_day: 3,
            ..options()
        };
        super::page_cap_counts_new_pages_beyond_it_under_other(open_at(
            &dir.path().join("t.sqlite"),
            options,
        ))
        .await;
    }

    #[tokio::test]
    async fn prune_each_kind_keeps_verify_clean() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let store = open_at(&path, options());
        super::prune_each_kind_keeps_verify_clean(store, || {
            let conn = rusqlite::Connection::open(&path).expect("open");
            let changed = conn
                .execute(
                    "UPDATE counters SET views = views + 1 WHERE day = 20545 \
                     AND scope = (SELECT id FROM pages WHERE path = '')",
                    [],
                )
                .expect("tamper");
            assert_eq!(changed, 1);
        })
        .await;
    }

    #[tokio::test]
    async fn disk_floor_refuses_and_stores_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let full = StoreOptions {
            min_free_bytes: u64::MAX,
            ..options()
        };
        super::disk_floor_refuses_and_stores_nothing(
            open_at(&path, full),
            open_at(&path, options()),
        )
        .await;
    }

    #[tokio::test]
    async fn ensure_site_respects_max_sites() {
        let dir = tempfile::tempdir().expect("dir");
        super::ensure_site_respects_max_sites(open_at(&dir.path().join("t.sqlite"), options()))
            .await;
    }

    #[tokio::test]
    async fn ingest_key_is_kept_by_put_site() {
        let dir = tempfile::tempdir().expect("dir");
        super::ingest_key_is_kept_by_put_site(open_at(&dir.path().join("t.sqlite"), options()))
            .await;
    }

    #[tokio::test]
    async fn top_pages_rank_by_the_larger_source_and_limit() {
        let dir = tempfile::tempdir().expect("dir");
        super::top_pages_rank_by_the_larger_source_and_limit(open_at(
            &dir.path().join("t.sqlite"),
            options(),
        ))
        .await;
    }

    /// The file deleted under an open store: every later commit is refused (`FileLost`) and
    /// nothing refused was stored anywhere; a file put in its place is noticed too.
    #[tokio::test]
    async fn a_lost_database_file_refuses_commits() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let d = date(2026, 4, 1);
        let store = open_at(&path, options());
        store
            .commit(vec![view(1, 1, "/a", d)])
            .await
            .expect("commit");
        store.probe().await.expect("probe");
        std::fs::remove_file(&path).expect("delete the database");
        let lost = vec![view(2, 2, "/a", d), view(3, 3, "/b", d)];
        for _ in 0..2 {
            match store.commit(lost.clone()).await {
                Err(StoreError::FileLost(why)) => assert!(why.contains("deleted"), "{why}"),
                other => panic!("expected FileLost, got {other:?}"),
            }
        }
        assert!(matches!(store.probe().await, Err(StoreError::FileLost(_))));
        drop(store);

        // A new file at the path: the refused records were never acknowledged, so they are
        // accepted now, and whatever this store acknowledges is there after a reopen.
        let store = open_at(&path, options());
        assert_eq!(
            store.commit(lost.clone()).await.expect("commit"),
            [Outcome::Accepted, Outcome::Accepted]
        );
        drop(store);
        let store = open_at(&path, options());
        let c = store
            .counts(&site_s(), &PagePath::parse("/a").expect("p"), d)
            .await
            .expect("counts");
        assert_eq!(c.site_all.web.views, 2);
        assert!(store.verify(false).await.expect("verify").drift.is_empty());

        // Replaced: another database moved onto the path.
        let other = dir.path().join("other.sqlite");
        drop(open_at(&other, options()));
        std::fs::rename(&other, &path).expect("replace");
        match store.commit(vec![view(4, 4, "/a", d)]).await {
            Err(StoreError::FileLost(why)) => assert!(why.contains("replaced"), "{why}"),
            other => panic!("expected FileLost, got {other:?}"),
        }
    }

    /// Two stores on one file commit the same event ids at the same time: each id counts once.
    #[tokio::test]
    async fn two_stores_on_one_file_count_each_id_once() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.sqlite");
        let (a, b) = (open_at(&path, options()), open_at(&path, options()));
        let d = date(2026, 4, 1);
        let records: Vec<Record> = (0..600u32)
            .map(|i| view(i, i % 37, &format!("/p{}", i % 11), d))
            .collect();
        let mut tasks = Vec::new();
        for (n, chunk) in records.chunks(50).enumerate() {
            // Each chunk goes to both stores, in opposite orders.
            let (first, second) = if n % 2 == 0 { (&a, &b) } else { (&b, &a) };
            for store in [first, second] {
                let (store, chunk) = (Arc::clone(store), chunk.to_vec());
                tasks.push(tokio::spawn(async move { store.commit(chunk).await }));
            }
        }
        let mut accepted = 0;
        for task in tasks {
            let outcomes = task.await.expect("join").expect("commit");
            accepted += outcomes.iter().filter(|o| **o == Outcome::Accepted).count();
        }
        assert_eq!(
            accepted,
            records.len(),
            "each id accepted by exactly one store"
        );
        for store in [&a, &b] {
            let c = store
                .counts(&site_s(), &PagePath::parse("/p0").expect("p"), d)
                .await
                .expect("counts");
            assert_eq!((c.site_all.web.views, c.site_all.web.visitors), (600, 37));
            let report = store.verify(false).await.expect("verify");
            assert!(report.drift.is_empty(), "{report:?}");
        }
    }

    fn rss_kib() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// 100,000 pages in one day: the top 10 come ranked and limited from SQL.
    #[tokio::test]
    async fn top_pages_of_100k_pages() {
        let dir = tempfile::tempdir().expect("dir");
        let options = StoreOptions {
            max_new_pages_per_day: 0,
            ..options()
        };
        let store = open_at(&dir.path().join("t.sqlite"), options);
        let d = date(2026, 4, 1);
        let mut records: Vec<Record> = (0..100_000u32)
            .map(|i| view(i, i % 1000, &format!("/page/{i:06}"), d))
            .collect();
        // Pages 50,000 + k (k < 12) get 30 - 2k more views, each from another visitor.
        let mut n = 100_000u32;
        for k in 0..12u32 {
            for j in 0..(30 - 2 * k) {
                n += 1;
                records.push(view(n, 5000 + j, &format!("/page/{:06}", 50_000 + k), d));
            }
        }
        for chunk in records.chunks(5000) {
            store.commit(chunk.to_vec()).await.expect("commit");
        }
        let before = rss_kib();
        let top = store.top_pages(&site_s(), d, d, 10).await.expect("top");
        let after = rss_kib();
        let expected: Vec<(String, u64, u64)> = (0..10u32)
            .map(|k| {
                let extra = u64::from(30 - 2 * k);
                (format!("/page/{:06}", 50_000 + k), extra + 1, extra + 1)
            })
            .collect();
        assert_eq!(top_views(&top), expected);
        if let (Some(before), Some(after)) = (before, after) {
            println!(
                "top_pages over 100,000 pages: RSS {before} KiB -> {after} KiB ({:+} KiB)",
                after as i64 - before as i64
            );
        }
    }
}

/// Every check above on PostgreSQL (`TALLY_TEST_POSTGRES=postgres://…`), each test in a fresh
/// schema dropped at its end. Not here: the disk floor and the lost file (a database server
/// owns its disk and files; `free_bytes` is `None`).
pub(crate) mod postgres {
    use super::*;
    use tally::store::postgres::{PgOptions, PgStore};

    /// A fresh schema on the test server; dropped (with everything in it) when this is dropped,
    /// also when the test panics.
    pub(crate) struct Db {
        url: String,
        schema: String,
    }

    impl Db {
        pub(crate) fn new() -> Option<Self> {
            match std::env::var("TALLY_TEST_POSTGRES") {
                Ok(url) if !url.is_empty() => Some(Self {
                    url,
                    schema: format!("tally_test_{}", uuid::Uuid::new_v4().simple()),
                }),
                _ => {
                    // Straight to the stream, past the test harness's capture: loud in any run.
                    use std::io::Write as _;
                    let _ = writeln!(
                        std::io::stderr(),
                        "SKIPPED: set TALLY_TEST_POSTGRES=postgres://user@host:port/db to run \
                         the PostgreSQL store tests"
                    );
                    None
                }
            }
        }

        /// The URL of the test schema, for another process (created here if missing).
        pub(crate) fn url_in_schema(&self) -> String {
            self.exec(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema));
            let sep = if self.url.contains('?') { '&' } else { '?' };
            format!("{}{sep}options=-csearch_path%3D{}", self.url, self.schema)
        }

        async fn open(&self, max_new_pages_per_day: u32) -> Arc<dyn Store> {
            let options = PgOptions {
                pool_size: 4,
                max_new_pages_per_day,
                schema: Some(self.schema.clone()),
            };
            Arc::new(PgStore::open(&self.url, options).await.expect("open"))
        }

        /// Run `sql` in the test schema through a separate connection, from a thread of its
        /// own (tamper closures are synchronous); returns the rows changed.
        pub(crate) fn exec(&self, sql: &str) -> u64 {
            let (url, schema, sql) = (self.url.clone(), self.schema.clone(), sql.to_owned());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                    let task = tokio::spawn(connection);
                    client
                        .batch_execute(&format!("SET search_path = {schema}"))
                        .await
                        .expect("search_path");
                    let n = client.execute(&sql, &[]).await.expect("sql");
                    drop(client);
                    let _ = task.await;
                    n
                })
            })
            .join()
            .expect("thread")
        }
    }

    impl Drop for Db {
        fn drop(&mut self) {
            let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
            let (url, schema) = (self.url.clone(), self.schema.clone());
            let dropped = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .ok()?;
                    let task = tokio::spawn(connection);
                    client.batch_execute(&sql).await.ok()?;
                    drop(client);
                    let _ = task.await;
                    Some(())
                })
            })
            .join();
            if !matches!(dropped, Ok(Some(()))) {
                eprintln!("could not drop the test schema {schema}");
            }
        }
    }

    /// Run `check` against a fresh store (default page cap), unless PostgreSQL is not configured.
    macro_rules! pg_test {
        ($name:ident) => {
            #[tokio::test]
            async fn $name() {
                let Some(db) = Db::new() else { return };
                super::$name(db.open(1000).await).await;
            }
        };
    }

    pg_test!(dedupes_within_and_across_batches);
    pg_test!(dedupe_keys_count_custom_events_once);
    pg_test!(top_events_rank_limit_and_split_by_day);
    pg_test!(prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify);
    pg_test!(sites_round_trip);
    pg_test!(salts_are_stable_per_day_and_forgotten);
    pg_test!(filtered_tallies_add_up_per_site_day_and_reason);
    pg_test!(ensure_site_respects_max_sites);
    pg_test!(ingest_key_is_kept_by_put_site);
    pg_test!(top_pages_rank_by_the_larger_source_and_limit);
    pg_test!(range_visitors_are_exact_at_100k);
    pg_test!(series_and_top_referrers);

    #[tokio::test]
    async fn page_cap_counts_new_pages_beyond_it_under_other() {
        let Some(db) = Db::new() else { return };
        super::page_cap_counts_new_pages_beyond_it_under_other(db.open(3).await).await;
    }

    #[tokio::test]
    async fn verify_finds_and_repairs_drift() {
        let Some(db) = Db::new() else { return };
        let store = db.open(1000).await;
        super::verify_finds_and_repairs_drift(store, || {
            db.exec(
                "UPDATE counters SET views = views + 5 WHERE day = -1 \
                 AND scope = (SELECT id FROM pages WHERE path = '/a')",
            );
            db.exec(
                "DELETE FROM counters WHERE day != -1 \
                 AND scope = (SELECT id FROM pages WHERE path = '')",
            );
        })
        .await;
    }

    #[tokio::test]
    async fn prune_each_kind_keeps_verify_clean() {
        let Some(db) = Db::new() else { return };
        let store = db.open(1000).await;
        super::prune_each_kind_keeps_verify_clean(store, || {
            let changed = db.exec(
                "UPDATE counters SET views = views + 1 WHERE day = 20545 \
                 AND scope = (SELECT id FROM pages WHERE path = '')",
            );
            assert_eq!(changed, 1);
        })
        .await;
    }

    /// Two stores (two pools) on one schema commit overlapping batches at once, in opposite
    /// orders: every id is accepted exactly once, no deadlock reaches the caller, the counters
    /// are exact and verify is clean.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_stores_commit_overlapping_batches_once() {
        let Some(db) = Db::new() else { return };
        let (a, b) = (db.open(1000).await, db.open(1000).await);
        let d = date(2026, 4, 1);
        let records: Vec<Record> = (0..2000u32)
            .map(|i| view(i, i % 97, &format!("/p{}", i % 13), d))
            .collect();
        // Windows of 100 records that overlap by half, each sent to both stores, reversed
        // for one of them so the two transactions meet the shared ids in opposite orders.
        let mut tasks = Vec::new();
        for (n, start) in (0..records.len()).step_by(50).enumerate() {
            let window = &records[start..(start + 100).min(records.len())];
            for (k, store) in [&a, &b].into_iter().enumerate() {
                let mut batch = window.to_vec();
                if (n + k) % 2 == 1 {
                    batch.reverse();
                }
                let store = Arc::clone(store);
                tasks.push(tokio::spawn(async move {
                    let outcomes = store.commit(batch.clone()).await.expect("commit");
                    batch
                        .iter()
                        .zip(outcomes)
                        .filter(|(_, o)| *o == Outcome::Accepted)
                        .map(|(r, _)| r.event_id.uuid())
                        .collect::<Vec<_>>()
                }));
            }
        }
        let mut accepted = std::collections::HashMap::new();
        for task in tasks {
            for id in task.await.expect("join") {
                *accepted.entry(id).or_insert(0) += 1;
            }
        }
        assert_eq!(accepted.len(), records.len(), "every id accepted");
        assert!(accepted.values().all(|n| *n == 1), "no id accepted twice");
        for store in [&a, &b] {
            let c = store
                .counts(&site_s(), &PagePath::parse("/p0").expect("p"), d)
                .await
                .expect("counts");
            assert_eq!((c.site_all.web.views, c.site_all.web.visitors), (2000, 97));
            assert_eq!(
                (c.site_today.web.views, c.site_today.web.visitors),
                (2000, 97)
            );
            // /p0 gets ids 0, 13, 26, …: 154 views from the visitors i % 97 of those ids.
            let p0: std::collections::HashSet<u32> = (0..2000u32)
                .filter(|i| i % 13 == 0)
                .map(|i| i % 97)
                .collect();
            assert_eq!(
                (c.page_all.web.views, c.page_all.web.visitors),
                (154, p0.len() as u64)
            );
            let report = store.verify(false).await.expect("verify");
            assert!(report.drift.is_empty() && report.checked > 0, "{report:?}");
        }
    }

    /// Eight collectors starting at once on an empty schema: the migrations run once (the
    /// advisory lock), every store opens; a database newer than this tally is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn migrations_run_once_and_refuse_a_newer_schema() {
        let Some(db) = Db::new() else { return };
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let (url, schema) = (db.url.clone(), db.schema.clone());
                tokio::spawn(async move {
                    let options = PgOptions {
                        pool_size: 1,
                        schema: Some(schema),
                        ..PgOptions::default()
                    };
                    PgStore::open(&url, options).await.map(|_| ())
                })
            })
            .collect();
        for open in opens {
            open.await.expect("join").expect("open");
        }
        assert_eq!(db.exec("SELECT version FROM schema_version"), 1);
        db.exec("INSERT INTO schema_version (version) VALUES (99)");
        let options = PgOptions {
            schema: Some(db.schema.clone()),
            ..PgOptions::default()
        };
        match PgStore::open(&db.url, options).await {
            Err(StoreError::Invalid(why)) => assert!(why.contains("99"), "{why}"),
            Err(other) => panic!("expected Invalid, got {other:?}"),
            Ok(_) => panic!("a newer schema must be refused"),
        }
    }

    /// A repair while two stores keep committing: no batch is lost or counted twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn repair_while_collectors_commit() {
        let Some(db) = Db::new() else { return };
        let (a, b) = (db.open(1000).await, db.open(1000).await);
        let d = date(2026, 4, 1);
        a.commit((0..200u32).map(|i| view(i, i % 11, "/a", d)).collect())
            .await
            .expect("commit");
        db.exec("UPDATE counters SET views = views + 7 WHERE day = -1");
        let writer = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                for n in 0..20u32 {
                    let batch = (0..50u32)
                        .map(|i| view(1000 + n * 50 + i, i % 13, "/b", d))
                        .collect();
                    b.commit(batch).await.expect("commit");
                }
            })
        };
        let report = a.verify(true).await.expect("repair");
        assert!(report.repaired && !report.drift.is_empty(), "{report:?}");
        writer.await.expect("writer");
        let report = a.verify(false).await.expect("verify");
        assert!(report.drift.is_empty(), "{report:?}");
        let c = a
            .counts(&site_s(), &PagePath::parse("/b").expect("p"), d)
            .await
            .expect("counts");
        assert_eq!(c.site_all.web.views, 200 + 20 * 50);
        assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (1000, 13));
    }
}
