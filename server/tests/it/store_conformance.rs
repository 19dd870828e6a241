//! The store conformance suite: the same checks for every backend.
//!
//! Every check is an `async fn name(db: &impl Harness)` that opens handles on one fresh
//! database of the backend under test. `backends!` (at the end) runs EVERY check against
//! EVERY backend listed there: a backend is added by one line (SQLite now; PostgreSQL joins
//! here) plus its [`Harness`]. Together the checks call every [`Store`] method, and
//! [`two_handles_commit_the_same_ids_at_once`] writes the same ids from two handles at once.
//! What only one backend has (SQLite's disk floor and file identity) is tested beside it.

use std::sync::Arc;

use jiff::civil::date;
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{DedupeKey, EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Outcome, Record, Source};
use tally::store::{OTHER_PAGE, Retention, Site, Store, StoreError};
use tally_wire::Numbers;

/// One fresh database of a backend under test (a temporary file, a fresh schema), and how to
/// reach behind the store's back to damage it.
pub trait Harness: Send + Sync + 'static {
    /// A new, empty database.
    fn fresh() -> Self;
    /// A new handle (its own connections) on this database; `page_cap` is the number of new
    /// pages per site and day (`Some(0)`: none), `None` the backend's default.
    fn handle(&self, page_cap: Option<u32>) -> Arc<dyn Store>;
    /// Change stored counters without the store (for `verify`); panics when nothing changed.
    fn tamper(&self, damage: Tamper);
    /// Whether the backend can be tested here (a database server needs its URL in the
    /// environment; without it its checks say so loudly and pass nothing).
    fn available() -> bool {
        true
    }
    /// A handle as `tally serve` opens it by default (SQLite: `SyncMode::Full`, the WAL synced
    /// beside the writer); the other checks may use a cheaper mode.
    fn serving_handle(&self) -> Arc<dyn Store> {
        self.handle(None)
    }
    /// Whether the backend's writes go through a [`tally::store::BatchWriter`] (SQLite).
    fn has_batch_writer() -> bool {
        false
    }
}

/// Damage to stored counters, for the checks of `verify`.
#[derive(Debug, Clone, Copy)]
pub enum Tamper {
    /// Add `by` web views to the all-time row of `page` (of site `s`).
    PageAllTimeViews { page: &'static str, by: i64 },
    /// Delete every per-day row of the whole site `s`.
    DropSiteDayRows,
    /// Add `by` web views to the whole-site row of `day` (of site `s`).
    SiteDayViews { day: jiff::civil::Date, by: i64 },
    /// Add `by` views to every referrer counter of site `s`.
    ReferrerViews { by: i64 },
    /// Cut the last byte off every stored day segment of site `s`.
    TruncateSegments,
    /// Add [`LONG_KEY`] (a visitor key of 20 bytes, as a first-release file copied over may
    /// hold) to the web visitor set of `page` (of site `s`) on `day`, and count it in that
    /// day's counter row.
    LongVisitorKey {
        page: &'static str,
        day: jiff::civil::Date,
    },
}

/// The visitor key of [`Tamper::LongVisitorKey`], as hexadecimal: it sorts between the keys of
/// visitors 1 and 2 of [`view`], so a day's keys cut every 16 bytes would be cut wrong.
const LONG_KEY: &str = "01ff66697273742d72656c656173652d6b657921";

/// Days since 1970 of `day` (the stored day number).
fn day_number(day: jiff::civil::Date) -> i64 {
    day.duration_since(date(1970, 1, 1))
        .as_secs()
        .div_euclid(86_400)
}

/// The backend's default page cap.
const DEFAULT_CAP: Option<u32> = None;

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
        dims: Default::default(),
    }
}

async fn dedupes_within_and_across_batches(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

/// The ingest queue's write path where a store has one ([`tally::store::BatchWriter`], SQLite):
/// it commits exactly as `commit` does, and by `finish` every batch has had its one answer, in
/// commit order. A store without one (PostgreSQL) is driven through `commit`, checked above.
async fn the_batch_writer_commits_like_commit<H: Harness>(db: &H) {
    let store = db.serving_handle();
    let writer = store.batch_writer();
    assert_eq!(writer.is_some(), H::has_batch_writer());
    let Some(mut writer) = writer else {
        return;
    };
    let d = date(2026, 4, 1);
    let batches = vec![
        vec![record(1, 1, "/a", d), record(2, 2, "/a", d)],
        vec![record(1, 1, "/a", d), record(3, 1, "/b", d)],
        Vec::new(),
        vec![record(4, 2, "/a", d)],
    ];
    let answers = tokio::task::spawn_blocking(move || {
        let (tx, rx) = std::sync::mpsc::channel();
        for (n, batch) in batches.into_iter().enumerate() {
            let tx = tx.clone();
            writer.commit(
                batch,
                Box::new(move |r| {
                    let _ = tx.send((n, r.map_err(|e| e.to_string())));
                }),
            );
        }
        writer.finish();
        drop(tx);
        rx.iter().collect::<Vec<_>>()
    })
    .await
    .expect("join");
    use Outcome::{Accepted as A, Duplicate as D};
    assert_eq!(
        answers,
        [
            (0, Ok(vec![A, A])),
            (1, Ok(vec![D, A])),
            (2, Ok(vec![])),
            (3, Ok(vec![A]))
        ]
    );
    let c = store
        .counts(
            &SiteId::parse("s").expect("s"),
            &PagePath::parse("/a").expect("p"),
            d,
        )
        .await
        .expect("counts");
    assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (3, 2));
    assert_eq!((c.site_today.web.views, c.site_today.web.visitors), (4, 2));
}

async fn dedupe_keys_count_custom_events_once(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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
async fn top_events_rank_limit_and_split_by_day(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

async fn verify_finds_and_repairs_drift(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let d = date(2026, 4, 1);
    store
        .commit((0..20).map(|n| record(n, n % 3, "/a", d)).collect())
        .await
        .expect("commit");
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    db.tamper(Tamper::PageAllTimeViews { page: "/a", by: 5 });
    db.tamper(Tamper::DropSiteDayRows);
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

async fn sites_round_trip(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

async fn salts_are_stable_per_day_and_forgotten(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

async fn logouts_are_kept_shared_and_never_move_back(db: &impl Harness) {
    let a = db.handle(DEFAULT_CAP);
    assert_eq!(a.sessions_not_before().await.expect("read"), i64::MIN);
    assert_eq!(a.end_sessions(1_000).await.expect("logout"), 1_000);
    assert_eq!(
        a.end_sessions(500).await.expect("logout"),
        1_000,
        "never back"
    );
    // Another handle (another collector, or after a restart) sees it and moves it on.
    let b = db.handle(DEFAULT_CAP);
    assert_eq!(b.sessions_not_before().await.expect("read"), 1_000);
    assert_eq!(b.end_sessions(2_000).await.expect("logout"), 2_000);
    assert_eq!(a.sessions_not_before().await.expect("read"), 2_000);
}

async fn prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

/// Range visitors are exact (not estimated): 100k distinct visitors over three overlapping days.
async fn range_visitors_are_exact_at_100k(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

/// Range visitors one handle keeps in memory follow what another handle (a second collector,
/// `tally verify`, retention) writes to the same database: late views into an old day, and
/// visitor sets pruned under it. Each answer equals what a fresh handle reads.
async fn kept_range_visitors_follow_other_handles(db: &impl Harness) {
    use std::collections::BTreeSet;
    let (reader, writer) = (db.handle(DEFAULT_CAP), db.handle(DEFAULT_CAP));
    let days = [date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3)];
    let page_of = |v: u32| if v.is_multiple_of(3) { "/a" } else { "/b" };
    // Day i: visitors 10 i .. 10 i + 20, so the days overlap.
    let mut seen: Vec<(u32, &str)> = Vec::new();
    let mut batch = Vec::new();
    for (i, day) in days.iter().enumerate() {
        for v in i as u32 * 10..i as u32 * 10 + 20 {
            batch.push(view(batch.len() as u32, v, page_of(v), *day));
            seen.push((v, page_of(v)));
        }
    }
    let n = batch.len() as u32;
    writer.commit(batch).await.expect("commit");
    let visitors = |store: &Arc<dyn Store>| {
        let store = Arc::clone(store);
        async move {
            let range = store.range_totals(&site_s(), days[0], days[2]).await;
            let top = store.top_pages(&site_s(), days[0], days[2], 10).await;
            let top = top.expect("top");
            let a = top
                .iter()
                .find(|p| p.page == "/a")
                .map(|p| p.numbers.web.visitors);
            (range.expect("range").web.visitors, a.unwrap_or(0))
        }
    };
    let distinct = |rows: &[(u32, &str)], page: Option<&str>| {
        let set: BTreeSet<u32> = rows
            .iter()
            .filter(|(_, p)| page.is_none_or(|page| page == *p))
            .map(|(v, _)| *v)
            .collect();
        set.len() as u64
    };
    let expected = (distinct(&seen, None), distinct(&seen, Some("/a")));
    assert_eq!(expected, (40, 14));
    assert_eq!(visitors(&reader).await, expected);
    assert_eq!(
        visitors(&reader).await,
        expected,
        "read again, from what is kept"
    );

    // Late views into the first day through the other handle: a new visitor, and one known
    // from the later days only.
    let late = vec![view(n, 100, "/a", days[0]), view(n + 1, 25, "/a", days[0])];
    assert_eq!(
        writer.commit(late).await.expect("late"),
        vec![Outcome::Accepted; 2]
    );
    seen.extend([(100, "/a"), (25, "/a")]);
    let expected = (distinct(&seen, None), distinct(&seen, Some("/a")));
    assert_eq!(expected, (41, 16));
    assert_eq!(
        visitors(&reader).await,
        expected,
        "the late views are counted"
    );
    assert_eq!(visitors(&db.handle(DEFAULT_CAP)).await, expected);

    // On 04-05, keeping 2 days of visitor sets: the sets of 04-01 and 04-02 go, their counter
    // rows stay (same counts, so only the pruning itself can tell the kept sets are gone).
    let now: jiff::Timestamp = "2026-04-05T12:00:00Z".parse().expect("ts");
    let policy = Retention {
        raw_days: 0,
        visitor_days: 2,
        page_days: 0,
    };
    let report = writer.prune(policy, now).await.expect("prune");
    assert!(report.visitor_rows > 0, "{report:?}");
    let left: Vec<(u32, &str)> = (20..40).map(|v| (v, page_of(v))).collect();
    let expected = (distinct(&left, None), distinct(&left, Some("/a")));
    assert_eq!(
        visitors(&reader).await,
        expected,
        "pruned sets are not counted"
    );
    assert_eq!(visitors(&db.handle(DEFAULT_CAP)).await, expected);
}

/// Top pages read through one handle follow what other handles write: late views into an
/// old day, daily imports that set page rows (no whole-site row changes), and pruned page rows.
async fn kept_top_pages_follow_other_handles(db: &impl Harness) {
    use tally::store::DailyImport;
    let (reader, writer) = (db.handle(DEFAULT_CAP), db.handle(DEFAULT_CAP));
    let days = [date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3)];
    let mut n = 0u32;
    let mut views = |spec: &[(usize, &str, u32)]| {
        let mut batch = Vec::new();
        for &(day, page, count) in spec {
            for _ in 0..count {
                batch.push(view(n, 1_000 + n, page, days[day]));
                n += 1;
            }
        }
        batch
    };
    let first = views(&[(0, "/a", 5), (0, "/b", 3), (1, "/a", 2), (1, "/b", 4)]);
    let first = [first, views(&[(2, "/b", 1), (2, "/c", 2)])].concat();
    writer.commit(first).await.expect("commit");
    let late = views(&[(0, "/c", 6)]);
    let top = |store: &Arc<dyn Store>| {
        let store = Arc::clone(store);
        async move {
            let top = store.top_pages(&site_s(), days[0], days[2], 10).await;
            let top = top.expect("top");
            top.into_iter()
                .map(|p| (p.page, p.numbers.web.views))
                .collect::<Vec<_>>()
        }
    };
    let expect = |rows: &[(&str, u64)]| -> Vec<(String, u64)> {
        rows.iter().map(|(p, v)| ((*p).to_owned(), *v)).collect()
    };
    let check = async |want: Vec<(String, u64)>, why: &str| {
        assert_eq!(top(&reader).await, want, "{why}");
        assert_eq!(
            top(&db.handle(DEFAULT_CAP)).await,
            want,
            "{why}, fresh handle"
        );
    };
    check(expect(&[("/b", 8), ("/a", 7), ("/c", 2)]), "first read").await;
    check(
        expect(&[("/b", 8), ("/a", 7), ("/c", 2)]),
        "read again, from what is kept",
    )
    .await;

    writer.commit(late).await.expect("late");
    check(
        expect(&[("/b", 8), ("/c", 8), ("/a", 7)]),
        "late views of the first day",
    )
    .await;

    let daily = |views| DailyImport {
        page: Some(PagePath::parse("/d").expect("page")),
        day: days[1],
        views,
        visitors: 1,
    };
    writer
        .import_daily(&site_s(), vec![daily(1_000)])
        .await
        .expect("import");
    let imported = expect(&[("/d", 1_000), ("/b", 8), ("/c", 8), ("/a", 7)]);
    check(imported, "a page-only daily import").await;
    writer
        .import_daily(&site_s(), vec![daily(3)])
        .await
        .expect("again");
    let replaced = expect(&[("/b", 8), ("/c", 8), ("/a", 7), ("/d", 3)]);
    check(replaced, "a daily import that lowers a row").await;

    // On 04-05, keeping 3 days of page rows: the page rows of 04-01 go.
    let now: jiff::Timestamp = "2026-04-05T12:00:00Z".parse().expect("ts");
    let policy = Retention {
        raw_days: 0,
        visitor_days: 0,
        page_days: 3,
    };
    let report = writer.prune(policy, now).await.expect("prune");
    assert!(report.counter_rows > 0, "{report:?}");
    let pruned = expect(&[("/b", 5), ("/d", 3), ("/a", 2), ("/c", 2)]);
    check(pruned, "pruned page rows").await;
}

/// A page view number `i` (any u32) of `visitor` on `page`, at noon UTC of `day`.
pub(crate) fn view(i: u32, visitor: u32, page: &str, day: jiff::civil::Date) -> Record {
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

/// A visitor key of another length than 16 bytes counts as one distinct visitor in range
/// totals and top pages, wherever it is (PostgreSQL sends a day's 16-byte keys joined in one
/// value; a day holding another key is read row by row).
async fn range_visitors_count_keys_of_any_length(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let (d1, d2, d3) = (date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3));
    let views = vec![
        view(1, 1, "/a", d1),
        view(2, 2, "/a", d2),
        view(3, 1, "/a", d2),
        view(4, 3, "/a", d3),
        view(5, 2, "/a", d3),
        view(6, 4, "/b", d3),
    ];
    store.commit(views).await.expect("commit");
    for (page, day) in [("", d1), ("", d2), ("/a", d2)] {
        db.tamper(Tamper::LongVisitorKey { page, day });
    }
    // A fresh handle and the one that wrote: neither may count the long key twice, or lose it.
    for handle in [db.handle(DEFAULT_CAP), store] {
        let totals = handle
            .range_totals(&site_s(), d1, d3)
            .await
            .expect("totals");
        assert_eq!(
            totals.web.visitors, 5,
            "visitors 1, 2, 3, 4 and the long key"
        );
        let two = handle
            .range_totals(&site_s(), d2, d3)
            .await
            .expect("totals");
        assert_eq!(two.web.visitors, 5);
        // Two pages: on PostgreSQL their visitors are counted on two connections.
        let top = handle.top_pages(&site_s(), d1, d3, 10).await.expect("top");
        assert_eq!(
            top_views(&top),
            vec![("/a".to_owned(), 5, 4), ("/b".to_owned(), 1, 1)]
        );
    }
}

fn top_views(rows: &[tally::store::PageRow]) -> Vec<(String, u64, u64)> {
    rows.iter()
        .map(|r| (r.page.clone(), r.numbers.web.views, r.numbers.web.visitors))
        .collect()
}

/// With a cap of 3 new pages per site and day: the 4th and later new pages of the day count
/// under `(other)`, known pages keep counting, the next day has a fresh allowance.
async fn page_cap_counts_new_pages_beyond_it_under_other(db: &impl Harness) {
    let store = db.handle(Some(3));
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
/// (forced by tampering: one more view on the whole-site counter of 04-02) brings nothing back.
async fn prune_each_kind_keeps_verify_clean(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

    db.tamper(Tamper::SiteDayViews {
        day: date(2026, 4, 2),
        by: 1,
    });
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

async fn ensure_site_respects_max_sites(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

async fn ingest_key_is_kept_by_put_site(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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
async fn top_pages_rank_by_the_larger_source_and_limit(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

async fn filtered_tallies_add_up_per_site_day_and_reason(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
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

/// Two handles (each with its own connections, like two collectors) commit overlapping
/// batches of the same event ids, and custom events with the same dedupe keys under different
/// event ids, at the same time: each id and each key counts exactly once, both handles read
/// the same numbers, and `verify` finds no drift.
/// One visitor, two handles taking turns (as two collectors on one database): each
/// (visitor, page, day) and (visitor, site) is new once, whichever handle saw it first; the
/// range reads and a verify agree.
async fn visitors_seen_through_two_handles_count_once(db: &impl Harness) {
    let (a, b) = (db.handle(DEFAULT_CAP), db.handle(DEFAULT_CAP));
    let (d1, d2) = (date(2026, 4, 1), date(2026, 4, 2));
    let turns: [(&Arc<dyn Store>, Vec<Record>); 5] = [
        (&a, vec![view(1, 1, "/a", d1)]),
        (&b, vec![view(2, 1, "/a", d1), view(3, 1, "/b", d1)]),
        (&a, vec![view(4, 1, "/b", d1), view(5, 2, "/b", d1)]),
        (&b, vec![view(6, 2, "/a", d1), view(7, 1, "/a", d2)]),
        (&a, vec![view(8, 1, "/b", d2), view(9, 3, "/a", d2)]),
    ];
    for (store, batch) in turns {
        let n = batch.len();
        let outcomes = store.commit(batch).await.expect("commit");
        assert_eq!(outcomes, vec![Outcome::Accepted; n]);
    }
    let page = |p: &str| PagePath::parse(p).expect("page");
    for store in [&a, &b] {
        let c = store
            .counts(&site_s(), &page("/a"), d1)
            .await
            .expect("counts");
        assert_eq!((c.site_today.web.views, c.site_today.web.visitors), (6, 2));
        assert_eq!((c.page_today.web.views, c.page_today.web.visitors), (3, 2));
        let c = store
            .counts(&site_s(), &page("/b"), d2)
            .await
            .expect("counts");
        assert_eq!((c.site_today.web.views, c.site_today.web.visitors), (3, 2));
        assert_eq!((c.page_today.web.views, c.page_today.web.visitors), (1, 1));
        // All time: visitors 1, 2 and 3 on the site; 1 and 2 on /b (4 views).
        assert_eq!((c.site_all.web.views, c.site_all.web.visitors), (9, 3));
        assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (4, 2));
        let range = store.range_totals(&site_s(), d1, d2).await.expect("range");
        assert_eq!(
            (range.web.views, range.web.visitors),
            (9, 3),
            "distinct over both days"
        );
    }
    let report = b.verify(false).await.expect("verify");
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    // After verify (which moves any pending visitor rows into their tables) nothing changes.
    let range = a.range_totals(&site_s(), d1, d2).await.expect("range");
    assert_eq!((range.web.views, range.web.visitors), (9, 3));
    let more = a.commit(vec![view(10, 3, "/a", d2)]).await.expect("commit");
    assert_eq!(more, vec![Outcome::Accepted]);
    let c = b.counts(&site_s(), &page("/a"), d2).await.expect("counts");
    assert_eq!((c.page_today.web.views, c.page_today.web.visitors), (3, 2));
}

async fn two_handles_commit_the_same_ids_at_once(db: &impl Harness) {
    let (a, b) = (db.handle(DEFAULT_CAP), db.handle(DEFAULT_CAP));
    let d = date(2026, 4, 1);
    let records: Vec<Record> = (0..600u32)
        .map(|i| view(i, i % 37, &format!("/p{}", i % 11), d))
        .collect();
    let keyed = |i: u32, key: u32| Record {
        kind: HitKind::Event {
            name: EventName::parse("purchase").expect("name"),
            dedupe: Some(DedupeKey::parse(&format!("order_{key}")).expect("key")),
        },
        ..view(i, key, "/cart", d)
    };
    let mut tasks = Vec::new();
    for (n, chunk) in records.chunks(50).enumerate() {
        // Each chunk goes to both handles, in opposite orders, with 5 keyed events each: the
        // same keys, different event ids per handle.
        let (first, second) = if n % 2 == 0 { (&a, &b) } else { (&b, &a) };
        for (h, store) in [first, second].into_iter().enumerate() {
            let mut batch = chunk.to_vec();
            let base = 10_000 + (n as u32) * 100 + (h as u32) * 10;
            batch.extend((0..5u32).map(|k| keyed(base + k, n as u32 * 5 + k)));
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move { store.commit(batch).await }));
        }
    }
    let mut accepted = 0;
    for task in tasks {
        let outcomes = task.await.expect("join").expect("commit");
        accepted += outcomes.iter().filter(|o| **o == Outcome::Accepted).count();
    }
    let keys = records.chunks(50).count() * 5;
    assert_eq!(
        accepted,
        records.len() + keys,
        "each id and each dedupe key accepted by exactly one handle"
    );
    for store in [&a, &b] {
        let c = store
            .counts(&site_s(), &PagePath::parse("/p0").expect("p"), d)
            .await
            .expect("counts");
        assert_eq!((c.site_all.web.views, c.site_all.web.visitors), (600, 37));
        let events = store.top_events(&site_s(), d, d, 10).await.expect("events");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].count, keys as u64);
        let report = store.verify(false).await.expect("verify");
        assert!(report.drift.is_empty(), "{report:?}");
    }
}

/// The daily series of a whole site: one row per day with views, in day order, by source;
/// days without views are absent; custom events are not views.
async fn series_lists_days_with_views_by_source(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let (d1, d2, d3) = (date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3));
    let badge = |i: u32, visitor: u32| Record {
        source: Source::Badge,
        ..view(i, visitor, "/b", d3)
    };
    let event = Record {
        kind: HitKind::Event {
            name: EventName::parse("signup").expect("name"),
            dedupe: None,
        },
        ..view(9, 9, "/a", d2)
    };
    store
        .commit(vec![
            view(1, 1, "/a", d1),
            view(2, 1, "/b", d1),
            view(3, 2, "/a", d1),
            badge(4, 5),
            badge(5, 5),
            event,
        ])
        .await
        .expect("commit");
    let series = store.series(&site_s(), d1, d3).await.expect("series");
    let rows: Vec<_> = series
        .iter()
        .map(|r| {
            let n = r.numbers;
            (
                r.day,
                n.web.views,
                n.web.visitors,
                n.badge.views,
                n.badge.visitors,
            )
        })
        .collect();
    assert_eq!(rows, [(d1, 3, 2, 0, 0), (d3, 0, 0, 2, 1)]);
    assert_eq!(store.series(&site_s(), d2, d2).await.expect("s"), []);
    let unknown = SiteId::parse("nobody").expect("id");
    assert_eq!(store.series(&unknown, d1, d3).await.expect("s"), []);
}

/// Referring hosts of page views over local days, ranked by views then host, limited. The
/// events of a local day may lie up to 14 h before or 12 h after the UTC day of that date:
/// they count (the backend may not assume UTC days), and so do referrers with paths.
async fn top_referrers_rank_hosts_of_local_days(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let (d, next) = (date(2026, 4, 2), date(2026, 4, 3));
    let from = |i: u32, at: &str, day, referrer: &str| {
        let at: jiff::Timestamp = at.parse().expect("ts");
        let mut id = [0u8; 10];
        id[4..8].copy_from_slice(&i.to_be_bytes());
        Record {
            event_id: EventId::new_at(at, id),
            at_ms: at.as_millisecond(),
            referrer: Some(referrer.to_owned()),
            ..view(i, i, "/a", day)
        }
    };
    let event = Record {
        kind: HitKind::Event {
            name: EventName::parse("click").expect("name"),
            dedupe: None,
        },
        ..from(7, "2026-04-02T12:00:00Z", d, "https://d.example/")
    };
    store
        .commit(vec![
            from(1, "2026-04-02T12:00:00Z", d, "https://a.example/x"),
            // 00:00 on 04-02 at UTC+14 and 23:59 on 04-02 at UTC-12.
            from(2, "2026-04-01T10:00:00Z", d, "https://a.example/y"),
            from(3, "2026-04-03T11:59:00Z", d, "https://a.example"),
            from(4, "2026-04-02T12:00:00Z", d, "https://b.example/1"),
            from(5, "2026-04-02T13:00:00Z", d, "https://b.example/2"),
            from(6, "2026-04-02T14:00:00Z", d, "http://c.example/"),
            event,
            from(8, "2026-04-03T12:00:00Z", next, "https://a.example/z"),
        ])
        .await
        .expect("commit");
    let hosts = |rows: Vec<tally::store::ReferrerRow>| -> Vec<(String, u64)> {
        rows.into_iter().map(|r| (r.host, r.views)).collect()
    };
    let all = store.top_referrers(&site_s(), d, d, 10).await.expect("top");
    assert_eq!(
        hosts(all),
        [
            ("a.example".to_owned(), 3),
            ("b.example".to_owned(), 2),
            ("c.example".to_owned(), 1)
        ]
    );
    let two = store.top_referrers(&site_s(), d, d, 2).await.expect("top");
    assert_eq!(two.len(), 2);
    let both = store
        .top_referrers(&site_s(), d, next, 1)
        .await
        .expect("top");
    assert_eq!(hosts(both), [("a.example".to_owned(), 4)]);
}

/// Top referrers read counters written with the views: `verify` recounts them from the raw
/// events (and repairs them), and once the raw events of a day are pruned the day's referrers
/// read the same as before.
async fn referrer_counters_outlive_raw_events_and_are_recounted(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let (old, recent) = (date(2026, 1, 10), date(2026, 4, 4));
    let referred = |i: u32, day, referrer: &str| Record {
        referrer: Some(referrer.to_owned()),
        ..view(i, i, "/a", day)
    };
    store
        .commit(vec![
            referred(1, old, "https://a.example/x"),
            referred(2, old, "https://a.example/y"),
            referred(3, old, "https://b.example/"),
            view(4, 4, "/a", old),
            referred(5, recent, "https://b.example/z"),
        ])
        .await
        .expect("commit");
    // A resent view counts nothing twice.
    store
        .commit(vec![referred(1, old, "https://a.example/x")])
        .await
        .expect("resend");
    let hosts = |rows: Vec<tally::store::ReferrerRow>| -> Vec<(String, u64)> {
        rows.into_iter().map(|r| (r.host, r.views)).collect()
    };
    let old_top = [("a.example".to_owned(), 2), ("b.example".to_owned(), 1)];
    let top = store.top_referrers(&site_s(), old, old, 10).await;
    assert_eq!(hosts(top.expect("top")), old_top);
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty(), "{report:?}");

    db.tamper(Tamper::ReferrerViews { by: 2 });
    let report = store.verify(false).await.expect("verify");
    assert_eq!(
        report.drift.len(),
        3,
        "every referrer row drifted: {report:?}"
    );
    assert!(
        report.drift.iter().all(|d| d.key.starts_with("s/-2/")),
        "{report:?}"
    );
    assert!(store.verify(true).await.expect("repair").repaired);
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    let top = store.top_referrers(&site_s(), old, old, 10).await;
    assert_eq!(
        hosts(top.expect("top")),
        old_top,
        "repair restores the counts"
    );

    // Keep 30 days of raw events on 04-05: the old day's events go, its referrers stay.
    let now: jiff::Timestamp = "2026-04-05T12:00:00Z".parse().expect("ts");
    let policy = Retention {
        raw_days: 30,
        visitor_days: 0,
        page_days: 0,
    };
    let report = store.prune(policy, now).await.expect("prune");
    assert_eq!(report.events, 4, "{report:?}");
    let top = store.top_referrers(&site_s(), old, old, 10).await;
    assert_eq!(hosts(top.expect("top")), old_top);
    let top = store.top_referrers(&site_s(), old, recent, 10).await;
    assert_eq!(
        hosts(top.expect("top")),
        [("a.example".to_owned(), 2), ("b.example".to_owned(), 2)],
        "ties go by host"
    );
    let report = store.verify(false).await.expect("verify");
    assert!(
        report.drift.is_empty(),
        "pruned rows are not compared: {report:?}"
    );
}

/// Carried-over numbers of a site and of a page are shown in `counts`; setting them again
/// replaces them (it does not add).
async fn set_base_replaces_carried_over_numbers(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let d = date(2026, 4, 1);
    let page = PagePath::parse("/a").expect("p");
    store
        .commit(vec![view(1, 1, "/a", d)])
        .await
        .expect("commit");
    let n = |views, visitors| Numbers { views, visitors };
    store
        .set_base(&site_s(), None, n(100, 50))
        .await
        .expect("base");
    store
        .set_base(&site_s(), Some(&page), n(10, 5))
        .await
        .expect("base");
    let c = store.counts(&site_s(), &page, d).await.expect("counts");
    assert_eq!((c.site_base, c.page_base), (n(100, 50), n(10, 5)));
    assert_eq!(
        c.site_all.web.views, 1,
        "bases are kept apart from counters"
    );
    store
        .set_base(&site_s(), None, n(7, 3))
        .await
        .expect("base");
    let c = store.counts(&site_s(), &page, d).await.expect("counts");
    assert_eq!((c.site_base, c.page_base), (n(7, 3), n(10, 5)));
    // A base for a site nobody counted yet.
    let fresh = SiteId::parse("fresh").expect("id");
    store.set_base(&fresh, None, n(1, 1)).await.expect("base");
    let c = store.counts(&fresh, &page, d).await.expect("counts");
    assert_eq!(c.site_base, n(1, 1));
}

/// `list_sites` and `site_count` see exactly the configured sites, removals included.
async fn list_sites_sees_every_configured_site(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    assert!(store.list_sites().await.expect("list").is_empty());
    for (id, public) in [("b", true), ("a", false), ("c", true)] {
        let site = Site {
            id: SiteId::parse(id).expect("id"),
            origins: vec!["*".into()],
            zone: SiteZone::parse("America/New_York").expect("zone"),
            public,
            ingest_key: None,
        };
        store.put_site(&site).await.expect("put");
    }
    let listed = |sites: Vec<Site>| {
        let mut v: Vec<(String, bool, String)> = sites
            .into_iter()
            .map(|s| (s.id.to_string(), s.public, s.zone.name().to_owned()))
            .collect();
        v.sort();
        v
    };
    let ny = || "America/New_York".to_owned();
    assert_eq!(
        listed(store.list_sites().await.expect("list")),
        [
            ("a".into(), false, ny()),
            ("b".into(), true, ny()),
            ("c".into(), true, ny())
        ]
    );
    assert_eq!(store.site_count().await.expect("count"), 3);
    assert!(
        store
            .remove_site(&SiteId::parse("b").expect("id"))
            .await
            .expect("rm")
    );
    assert!(
        !store
            .remove_site(&SiteId::parse("b").expect("id"))
            .await
            .expect("rm")
    );
    assert_eq!(store.site_count().await.expect("count"), 2);
    assert_eq!(store.list_sites().await.expect("list").len(), 2);
}

/// A fresh handle answers its readiness probe; free space, when known, is not zero.
async fn probe_answers_on_a_healthy_store(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    store.probe().await.expect("probe");
    if let Some(free) = store.free_bytes() {
        assert!(free > 0);
    }
    store
        .commit(vec![view(1, 1, "/a", date(2026, 4, 1))])
        .await
        .expect("commit");
    store.probe().await.expect("probe after a commit");
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// 100,000 pages in one day: the top 10 come ranked and limited from SQL.
async fn top_pages_of_100k_pages(db: &impl Harness) {
    let store = db.handle(Some(0));
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

/// `verify_site` checks and repairs one site's rows only: another site's drift stays until
/// its own verify, and a site never counted checks nothing.
async fn verify_site_checks_and_repairs_one_site_only(db: &impl Harness) {
    let store = db.handle(DEFAULT_CAP);
    let d = date(2026, 4, 1);
    let t = SiteId::parse("t").expect("t");
    store
        .commit((0..20).map(|n| record(n, n % 3, "/a", d)).collect())
        .await
        .expect("commit s");
    store
        .commit(
            (100..130)
                .map(|n| Record {
                    site: t.clone(),
                    ..record(n, n % 4, "/a", d)
                })
                .collect(),
        )
        .await
        .expect("commit t");
    db.tamper(Tamper::PageAllTimeViews { page: "/a", by: 5 });
    let clean = store.verify_site(&t, false).await.expect("verify t");
    assert!(clean.checked > 0 && clean.drift.is_empty(), "{clean:?}");
    let drifted = store.verify_site(&site_s(), false).await.expect("verify s");
    assert_eq!(drifted.drift.len(), 1, "{drifted:?}");
    assert!(drifted.drift[0].key.starts_with("s/"), "{drifted:?}");
    let all = store.verify(false).await.expect("verify");
    assert_eq!(all.checked, clean.checked + drifted.checked, "{all:?}");
    let nothing = store.verify_site(&t, true).await.expect("repair t");
    assert!(!nothing.repaired, "t had no drift: {nothing:?}");
    assert_eq!(store.verify(false).await.expect("verify").drift.len(), 1);
    let fixed = store.verify_site(&site_s(), true).await.expect("repair s");
    assert!(fixed.repaired, "{fixed:?}");
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    let c = store
        .counts(&site_s(), &PagePath::parse("/a").expect("p"), d)
        .await
        .expect("counts");
    assert_eq!((c.page_all.web.views, c.page_all.web.visitors), (20, 3));
    let never = SiteId::parse("never").expect("id");
    assert_eq!(
        store.verify_site(&never, true).await.expect("verify"),
        tally::store::VerifyReport::default()
    );
}

/// Runs every check above against one backend's [`Harness`], each on a fresh database.
macro_rules! conformance {
    ($harness:ty; $($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            if !<$harness as crate::store_conformance::Harness>::available() {
                return;
            }
            let db = <$harness as crate::store_conformance::Harness>::fresh();
            crate::store_conformance::$check(&db).await;
        }
    )*};
}

/// One module per backend, each running the whole suite. Every check is listed here once.
macro_rules! backends {
    ($($name:ident => $harness:ty),* $(,)?) => {$(
        mod $name {
            conformance!($harness;
                dedupes_within_and_across_batches,
                the_batch_writer_commits_like_commit,
                dedupe_keys_count_custom_events_once,
                two_handles_commit_the_same_ids_at_once,
                visitors_seen_through_two_handles_count_once,
                top_events_rank_limit_and_split_by_day,
                verify_finds_and_repairs_drift,
                verify_site_checks_and_repairs_one_site_only,
                sites_round_trip,
                list_sites_sees_every_configured_site,
                ensure_site_respects_max_sites,
                ingest_key_is_kept_by_put_site,
                set_base_replaces_carried_over_numbers,
                salts_are_stable_per_day_and_forgotten,
                logouts_are_kept_shared_and_never_move_back,
                prune_keeps_dedupe_keys_visitor_sets_and_a_clean_verify,
                prune_each_kind_keeps_verify_clean,
                range_visitors_are_exact_at_100k,
                range_visitors_count_keys_of_any_length,
                kept_range_visitors_follow_other_handles,
                kept_top_pages_follow_other_handles,
                page_cap_counts_new_pages_beyond_it_under_other,
                series_lists_days_with_views_by_source,
                top_pages_rank_by_the_larger_source_and_limit,
                top_pages_of_100k_pages,
                top_referrers_rank_hosts_of_local_days,
                referrer_counters_outlive_raw_events_and_are_recounted,
                filtered_tallies_add_up_per_site_day_and_reason,
                probe_answers_on_a_healthy_store,
            );
        }
    )*};
}

backends! {
    sqlite => crate::store_conformance::sqlite_backend::SqliteDb,
    postgres_backend => crate::store_conformance::postgres::PgDb,
}

/// The SQLite harness, and what only SQLite has: the disk floor and the file's identity.
pub(crate) mod sqlite_backend {
    use super::*;
    use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};

    /// A database file in its own temporary directory.
    pub struct SqliteDb {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
    }

    fn options() -> StoreOptions {
        StoreOptions {
            sync: SyncMode::Normal,
            ..StoreOptions::default()
        }
    }

    fn open_at(path: &std::path::Path, options: StoreOptions) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(path, options).expect("open"))
    }

    impl Harness for SqliteDb {
        fn fresh() -> Self {
            let dir = tempfile::tempdir().expect("dir");
            let path = dir.path().join("t.sqlite");
            Self { _dir: dir, path }
        }

        fn handle(&self, page_cap: Option<u32>) -> Arc<dyn Store> {
            let mut options = options();
            if let Some(cap) = page_cap {
                options.max_new_pages_per_day = cap;
            }
            open_at(&self.path, options)
        }

        fn serving_handle(&self) -> Arc<dyn Store> {
            open_at(
                &self.path,
                StoreOptions {
                    sync: SyncMode::Full,
                    ..options()
                },
            )
        }

        fn has_batch_writer() -> bool {
            true
        }

        fn tamper(&self, damage: Tamper) {
            let conn = rusqlite::Connection::open(&self.path).expect("open");
            let site = "(SELECT p.id FROM pages p JOIN site_keys k ON p.site = k.id \
                        WHERE k.name = 's' AND p.path = ?1)";
            let changed = match damage {
                Tamper::PageAllTimeViews { page, by } => conn.execute(
                    &format!("UPDATE counters SET views = views + ?2 WHERE day = -1 AND scope = {site}"),
                    rusqlite::params![page, by],
                ),
                Tamper::DropSiteDayRows => conn.execute(
                    &format!("DELETE FROM counters WHERE day != -1 AND scope = {site}"),
                    [""],
                ),
                Tamper::SiteDayViews { day, by } => {
                    let n = day_number(day);
                    conn.execute(
                        &format!(
                            "UPDATE counters SET views = views + ?2 WHERE day = ?3 AND scope = {site}"
                        ),
                        rusqlite::params!["", by, n],
                    )
                }
                Tamper::ReferrerViews { by } => conn.execute(
                    "UPDATE referrer_counters SET views = views + ?1 \
                     WHERE site = (SELECT id FROM site_keys WHERE name = 's')",
                    [by],
                ),
                Tamper::TruncateSegments => conn.execute(
                    "UPDATE segments SET visits = substr(visits, 1, length(visits) - 1) \
                     WHERE site = (SELECT id FROM site_keys WHERE name = 's')",
                    [],
                ),
                Tamper::LongVisitorKey { page, day } => conn
                    .execute(
                        &format!(
                            "INSERT INTO visits (day, scope, source, visitor) \
                             VALUES (?2, {site}, 0, x'{LONG_KEY}')"
                        ),
                        rusqlite::params![page, day_number(day)],
                    )
                    .and_then(|inserted| {
                        conn.execute(
                            &format!(
                                "UPDATE counters SET visitors = visitors + 1 \
                                 WHERE day = ?2 AND source = 0 AND scope = {site}"
                            ),
                            rusqlite::params![page, day_number(day)],
                        )
                        .map(|updated| inserted.min(updated))
                    }),
            }
            .expect("tamper");
            assert!(changed > 0, "{damage:?} changed nothing");
        }
    }

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

    /// The visitor-set journal stays within its bound (docs/operators.md, Limits: 16,384 rows and one
    /// batch) under a flood of new (visitor, page) pairs, and the numbers stay exact.
    #[tokio::test]
    async fn the_visitor_set_journal_stays_bounded_under_a_flood_of_new_visitors() {
        let db = SqliteDb::fresh();
        let store = db.handle(Some(0));
        let d = date(2026, 4, 1);
        let batch = 500u32;
        let mut largest = 0i64;
        for b in 0..120u32 {
            let records: Vec<Record> = (0..batch)
                .map(|i| {
                    let n = b * batch + i;
                    view(n, n, &format!("/p{}", n % 97), d)
                })
                .collect();
            store.commit(records).await.expect("commit");
            let rows: i64 = rusqlite::Connection::open(&db.path)
                .expect("open")
                .query_row("SELECT COUNT(*) FROM set_journal", [], |r| r.get(0))
                .expect("journal rows");
            largest = largest.max(rows);
        }
        // Each new view appends at most three rows (page day, site day, page ever).
        assert!(largest <= 16_384 + 3 * i64::from(batch), "{largest} rows");
        assert!(
            largest > 16_384 / 2,
            "the flood did fill the journal: {largest}"
        );
        let totals = store.range_totals(&site_s(), d, d).await.expect("totals");
        assert_eq!((totals.web.views, totals.web.visitors), (60_000, 60_000));
    }

    #[tokio::test]
    async fn disk_floor_refuses_commits_and_stores_nothing() {
        let db = SqliteDb::fresh();
        let full = StoreOptions {
            min_free_bytes: u64::MAX,
            ..options()
        };
        disk_floor_refuses_and_stores_nothing(
            open_at(&db.path, full),
            open_at(&db.path, options()),
        )
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
}

/// Every check above on PostgreSQL (`TALLY_TEST_POSTGRES=postgres://…`), each in a fresh schema
/// dropped at its end; and what needs two PostgreSQL stores. Not here: the disk floor and the
/// lost file (a database server owns its disk and files; `free_bytes` is `None`).
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
            crate::support::postgres_url().map(|url| Self {
                url,
                schema: format!("tally_test_{}", uuid::Uuid::new_v4().simple()),
            })
        }

        /// The schema's name.
        pub(crate) fn schema(&self) -> &str {
            &self.schema
        }

        /// The URL of the test schema, for another process (created here if missing).
        pub(crate) fn url_in_schema(&self) -> String {
            self.exec(&format!("CREATE SCHEMA IF NOT EXISTS {}", self.schema));
            let sep = if self.url.contains('?') { '&' } else { '?' };
            format!("{}{sep}options=-csearch_path%3D{}", self.url, self.schema)
        }

        async fn open(&self, max_new_pages_per_day: u32) -> Arc<dyn Store> {
            Arc::new(self.pg_store(max_new_pages_per_day).await)
        }

        /// The store on this schema as itself (for what only PostgreSQL has, e.g. `load`).
        pub(crate) async fn pg_store(&self, max_new_pages_per_day: u32) -> PgStore {
            let options = PgOptions {
                pool_size: 4,
                max_new_pages_per_day,
                schema: Some(self.schema.clone()),
            };
            PgStore::open(&self.url, options).await.expect("open")
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

    /// A fresh schema per check (the conformance suite's [`Harness`] on PostgreSQL).
    pub(crate) struct PgDb(Db);

    impl Harness for PgDb {
        fn available() -> bool {
            std::env::var("TALLY_TEST_POSTGRES").is_ok_and(|u| !u.is_empty()) || Db::new().is_some()
        }

        fn fresh() -> Self {
            Self(Db::new().expect("checked by available()"))
        }

        fn handle(&self, page_cap: Option<u32>) -> Arc<dyn Store> {
            // The checks run on a multi-threaded runtime: open the pool on it.
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(self.0.open(page_cap.unwrap_or(1000)))
            })
        }

        fn tamper(&self, damage: Tamper) {
            let scope = |path: &str| {
                format!(
                    "(SELECT p.id FROM pages p JOIN site_keys k ON p.site = k.id \
                     WHERE k.name = 's' AND p.path = '{path}')"
                )
            };
            let changed = match damage {
                Tamper::PageAllTimeViews { page, by } => self.0.exec(&format!(
                    "UPDATE counters SET views = views + {by} WHERE day = -1 AND scope = {}",
                    scope(page)
                )),
                Tamper::DropSiteDayRows => self.0.exec(&format!(
                    "DELETE FROM counters WHERE day != -1 AND scope = {}",
                    scope("")
                )),
                Tamper::SiteDayViews { day, by } => {
                    let n = day_number(day);
                    self.0.exec(&format!(
                        "UPDATE counters SET views = views + {by} WHERE day = {n} AND scope = {}",
                        scope("")
                    ))
                }
                Tamper::ReferrerViews { by } => self.0.exec(&format!(
                    "UPDATE referrer_counters SET views = views + {by} \
                     WHERE site = (SELECT id FROM site_keys WHERE name = 's')"
                )),
                Tamper::TruncateSegments => self.0.exec(
                    "UPDATE segments SET visits = substring(visits from 1 for length(visits) - 1) \
                     WHERE site = (SELECT id FROM site_keys WHERE name = 's')",
                ),
                Tamper::LongVisitorKey { page, day } => {
                    let n = day_number(day);
                    self.0
                        .exec(&format!(
                            "INSERT INTO visits (site, day, scope, source, visitor) \
                         VALUES ((SELECT id FROM site_keys WHERE name = 's'), {n}, {}, 0, \
                         '\\x{LONG_KEY}'::bytea)",
                            scope(page)
                        ))
                        .min(self.0.exec(&format!(
                            "UPDATE counters SET visitors = visitors + 1 \
                         WHERE day = {n} AND source = 0 AND scope = {}",
                            scope(page)
                        )))
                }
            };
            assert!(changed > 0, "{damage:?} changed nothing");
        }
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
        assert_eq!(db.exec("SELECT version FROM schema_version"), 5);
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

    /// A repair holds only its own site's lock: while site `s`'s lock is held (as a repair of
    /// `s` holds it), another site's batch commits, and `s`'s batch waits for the lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_site_repair_never_holds_another_sites_commits() {
        let Some(db) = Db::new() else { return };
        let store = db.open(1000).await;
        let d = date(2026, 4, 1);
        let t = SiteId::parse("t").expect("t");
        let on_t = |n: u32| Record {
            site: t.clone(),
            ..view(n, n % 5, "/b", d)
        };
        store
            .commit(vec![view(0, 0, "/a", d)])
            .await
            .expect("commit s");
        store.commit(vec![on_t(1)]).await.expect("commit t");
        let (mut client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let conn = tokio::spawn(connection);
        client
            .batch_execute(&format!("SET search_path = {}", db.schema))
            .await
            .expect("search_path");
        let lock = client.transaction().await.expect("begin");
        let key: i64 = lock
            .query_one(
                "SELECT hashtextextended(current_schema() || ':site:' || id::text, 0) \
                 FROM site_keys WHERE name = 's'",
                &[],
            )
            .await
            .expect("key")
            .get(0);
        lock.execute("SELECT pg_advisory_xact_lock($1)", &[&key])
            .await
            .expect("lock s");
        let waiting = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.commit(vec![view(2, 1, "/a", d)]).await })
        };
        // The batch of `s` queues behind the lock ...
        let probe_url = db.url_in_schema();
        crate::support::wait_until(|| {
            let url = probe_url.clone();
            async move {
                let (c, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                let task = tokio::spawn(connection);
                let n: i64 = c
                    .query_one(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                         AND NOT granted AND ((classid::int8 << 32) | objid::int8) = $1",
                        &[&key],
                    )
                    .await
                    .expect("locks")
                    .get(0);
                drop(c);
                let _ = task.await;
                n == 1
            }
        })
        .await;
        // ... while `t`'s commits go on.
        for n in 10..15 {
            store.commit(vec![on_t(n)]).await.expect("commit t");
        }
        assert!(!waiting.is_finished(), "s waits for its repair");
        lock.commit().await.expect("release");
        waiting
            .await
            .expect("join")
            .expect("commit s after the lock");
        drop(client);
        let _ = conn.await;
        let c = store
            .counts(&t, &PagePath::parse("/b").expect("p"), d)
            .await
            .expect("counts");
        assert_eq!(c.site_all.web.views, 6);
        assert!(store.verify(false).await.expect("verify").drift.is_empty());
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
