//! `tally copy-to`: a SQLite database copied into an empty PostgreSQL database answers every
//! read as the SQLite one did, counts the next traffic as SQLite would have (returning
//! visitors, resent event ids and dedupe keys included), verifies clean, and is never copied
//! over live data; visits keep their dimensions, engagement and sealed days. On the real PostgreSQL (`TALLY_TEST_POSTGRES`), a fresh schema per test.

use std::sync::Arc;

use jiff::civil::{Date, date};
use tally::core::day::SiteZone;
use tally::core::filtered::{FilteredRow, Reason};
use tally::core::hit::HitKind;
use tally::core::ids::{DedupeKey, EventName, PagePath, SiteId, VisitorKey};
use tally::core::query::{Dimension, Metric, Value, VisitDim};
use tally::core::record::{Outcome, Record, Source};
use tally::store::analytics::Analytics;
use tally::store::copy::sqlite_to_postgres;
use tally::store::imported::{ImportedRow, ImportedSums, Table, encode};
use tally::store::sqlite::{DailyImport, SqliteStore, StoreOptions, SyncMode};
use tally::store::{EventSink, ImportSink, Site, SiteStore, Store};
use tally_wire::Numbers;

use crate::segment_store as seg;
use crate::store_conformance::postgres::Db;

const SITES: [&str; 2] = ["blog", "shop"];
const PAGES: [&str; 5] = ["/", "/a", "/b", "/c", "/d"];

fn site(id: &str, zone: &str, key: Option<&str>) -> Site {
    Site {
        id: SiteId::parse(id).expect("id"),
        origins: vec![format!("https://{id}.example")],
        zone: SiteZone::parse(zone).expect("zone"),
        public: id == "blog",
        ingest_key: key.map(str::to_owned),
    }
}

/// View `n` of `visitor` on `page` of `site`, on `day` (noon UTC); every third from a
/// referrer.
fn view(n: u32, site: &str, visitor: u8, page: &str, day: Date) -> Record {
    Record {
        site: SiteId::parse(site).expect("site"),
        visitor: VisitorKey([visitor; 16]),
        referrer: n
            .is_multiple_of(3)
            .then(|| format!("https://ref{}.example/x", n % 4)),
        ..crate::store_conformance::view(n, 0, page, day)
    }
}

fn event(n: u32, site: &str, visitor: u8, key: Option<&str>, day: Date) -> Record {
    Record {
        kind: HitKind::Event {
            name: EventName::parse(if key.is_some() { "purchase" } else { "signup" })
                .expect("name"),
            dedupe: key.map(|k| DedupeKey::parse(k).expect("key")),
        },
        ..view(n, site, visitor, "/checkout", day)
    }
}

fn days() -> [Date; 3] {
    [date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3)]
}

/// Two sites over three days: page views of 12 visitors on skewed pages, badge views,
/// custom events with and without dedupe keys, a base, filtered views and a salt.
async fn fill(store: &dyn Store) {
    store
        .put_site(&site("blog", "Europe/Berlin", None))
        .await
        .expect("site");
    store
        .put_site(&site("shop", "UTC", Some("k3y")))
        .await
        .expect("site");
    let mut records = Vec::new();
    let mut n = 0;
    for (d, day) in days().into_iter().enumerate() {
        for visitor in 0..12u8 {
            for (i, page) in PAGES.iter().enumerate() {
                // Visitor v sees the first pages more often; some only on later days.
                if (usize::from(visitor) + d) % (i + 1) != 0 {
                    continue;
                }
                n += 1;
                let site = SITES[usize::from(visitor) % 2];
                let mut r = view(n, site, visitor, page, day);
                if n.is_multiple_of(7) {
                    r.source = Source::Badge;
                }
                records.push(r);
            }
        }
        n += 1;
        records.push(event(n, "shop", 1, Some("order-1"), day));
        n += 1;
        records.push(event(n, "shop", 2, None, day));
    }
    let out = store.commit(records).await.expect("commit");
    assert!(out.contains(&Outcome::Accepted));
    store
        .set_base(
            &SiteId::parse("blog").expect("id"),
            None,
            Numbers {
                views: 1000,
                visitors: 400,
            },
        )
        .await
        .expect("base");
    store
        .set_base(
            &SiteId::parse("blog").expect("id"),
            Some(&PagePath::parse("/a").expect("p")),
            Numbers {
                views: 10,
                visitors: 4,
            },
        )
        .await
        .expect("base");
    store
        .add_filtered(&[FilteredRow {
            site: SiteId::parse("blog").expect("id"),
            day: days()[1],
            reason: Reason::Bot,
            count: 9,
        }])
        .await
        .expect("filtered");
    store.salt_for(days()[2], [7; 32]).await.expect("salt");
}

/// Everything a reader can ask, as one comparable text.
async fn everything(store: &dyn Store) -> String {
    let mut out = String::new();
    let (first, last) = (date(2025, 12, 1), date(2026, 4, 4));
    let mut sites: Vec<String> = store
        .list_sites()
        .await
        .expect("sites")
        .iter()
        .map(|s| {
            format!(
                "{} {:?} {} {} {:?}",
                s.id,
                s.origins,
                s.zone.name(),
                s.public,
                s.ingest_key
            )
        })
        .collect();
    sites.sort();
    out += &format!("sites {sites:?}\n");
    for id in SITES {
        let id = SiteId::parse(id).expect("id");
        for day in days()
            .into_iter()
            .chain([date(2025, 12, 31), date(2026, 4, 4)])
        {
            for page in PAGES.iter().chain(&["/checkout", "/never"]) {
                let page = PagePath::parse(page).expect("page");
                let c = store.counts(&id, &page, day).await.expect("counts");
                out += &format!("counts {id} {page:?} {day} {c:?}\n");
            }
        }
        out += &format!(
            "series {id} {:?}\n",
            store.series(&id, first, last).await.expect("series")
        );
        out += &format!(
            "range {id} {:?}\n",
            store.range_totals(&id, first, last).await.expect("range")
        );
        out += &format!(
            "pages {id} {:?}\n",
            store.top_pages(&id, first, last, 10).await.expect("pages")
        );
        out += &format!(
            "referrers {id} {:?}\n",
            store
                .top_referrers(&id, first, last, 10)
                .await
                .expect("referrers")
        );
        out += &format!(
            "events {id} {:?}\n",
            store
                .top_events(&id, first, last, 10)
                .await
                .expect("events")
        );
        out += &format!(
            "filtered {id} {:?}\n",
            store.filtered(&id, first, last).await.expect("filtered")
        );
    }
    for table in Table::ALL {
        for by_day in [false, true] {
            let blog = SiteId::parse("blog").expect("id");
            out += &format!(
                "imported {table:?} {by_day} {:?}\n",
                store
                    .imported(&blog, table, first, last, by_day)
                    .await
                    .expect("imported")
            );
        }
    }
    out += &format!(
        "salt {:?}\n",
        store.salt_for(days()[2], [0; 32]).await.expect("salt")
    );
    out
}

/// The next day's traffic: resent ids, a used dedupe key, returning visitors on new and old
/// pages, and new visitors.
fn next_traffic() -> Vec<Record> {
    let day = date(2026, 4, 4);
    vec![
        view(1, "blog", 0, "/", days()[0]),
        event(100_000, "shop", 1, Some("order-1"), day),
        event(100_002, "shop", 1, Some("order-2"), day),
        view(100_001, "blog", 0, "/", day),
        view(100_003, "blog", 2, "/e", day),
        view(100_004, "shop", 3, "/a", day),
        view(100_005, "shop", 77, "/a", day),
        view(100_006, "blog", 78, "/new", day),
        // Seen on the site before (a whole-site row only): new to the page, not to the site.
        view(100_007, "blog", 200, "/a", day),
    ]
}

/// The two stores' answers are the same; else the first line that differs.
fn assert_same(pg: &str, sqlite: &str, when: &str) {
    for (a, b) in pg.lines().zip(sqlite.lines()) {
        assert_eq!(a, b, "{when}: PostgreSQL (left) and SQLite (right) differ");
    }
    assert_eq!(pg.lines().count(), sqlite.lines().count(), "{when}");
}

fn sqlite_at(path: &std::path::Path) -> Arc<SqliteStore> {
    let options = StoreOptions {
        sync: SyncMode::Normal,
        ..StoreOptions::default()
    };
    Arc::new(SqliteStore::open(path, options).expect("open"))
}

/// What only SQLite writes: imported daily aggregates (site and page), and a whole-site
/// all-time row of a visitor with no page row (as the v1 migration leaves them).
async fn fill_sqlite_only(sqlite: &SqliteStore, path: &std::path::Path) {
    let blog = SiteId::parse("blog").expect("id");
    let daily = |page: Option<&str>, day, views, visitors| DailyImport {
        page: page.map(|p| PagePath::parse(p).expect("page")),
        day,
        views,
        visitors,
    };
    sqlite
        .import_daily(
            &blog,
            vec![
                daily(None, date(2025, 12, 30), 100, 40),
                daily(None, date(2025, 12, 31), 50, 30),
                daily(Some("/a"), date(2025, 12, 31), 20, 15),
                daily(None, days()[0], 7, 5),
            ],
        )
        .await
        .expect("import daily");
    let row = |table, day, value: &str, visitors| ImportedRow {
        day,
        table,
        value: value.to_owned(),
        sums: ImportedSums {
            visitors,
            visits: visitors + 1,
            pageviews: visitors * 2,
            bounces: 1,
            visit_duration: 60,
            ..ImportedSums::default()
        },
    };
    let dec31 = date(2025, 12, 31);
    sqlite
        .import_breakdowns(
            &blog,
            vec![
                row(Table::Visitors, dec31, "", 30),
                row(Table::Browsers, dec31, &encode(&["Chrome", "131"]), 20),
                row(Table::Browsers, dec31, &encode(&["Firefox", ""]), 10),
            ],
            vec![(Table::Browsers, dec31)],
        )
        .await
        .expect("import breakdowns");
    let conn = rusqlite::Connection::open(path).expect("open");
    let added = conn
        .execute(
            "INSERT INTO reach (site, source, visitor, page) \
             SELECT k.id, 0, ?1, p.id FROM site_keys k JOIN pages p ON p.site = k.id \
             WHERE k.name = 'blog' AND p.path = ''",
            [&[200u8; 16][..]],
        )
        .expect("whole-site row");
    assert_eq!(added, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_answers_and_counts_on_as_the_sqlite_file_did() {
    let Some(db) = Db::new() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.sqlite");
    let sqlite = sqlite_at(&path);
    fill(sqlite.as_ref()).await;
    fill_sqlite_only(&sqlite, &path).await;
    // Visits with sources, agents and engagement, their first day sealed: after the copy they
    // answer the same, the sealed day from its copied segment.
    let a = seg::view(
        1,
        1,
        "/a",
        "2026-03-02T10:00:00Z",
        ("Google", "Organic Search", "Firefox"),
    );
    let analytics_days = vec![
        a.clone(),
        seg::engagement(&a, 30_000, Some(70)),
        seg::view(2, 2, "/b", "2026-03-02T11:00:00Z", ("", "Direct", "Chrome")),
        seg::view(
            3,
            1,
            "/b",
            "2026-03-03T09:00:00Z",
            ("", "Direct", "Firefox"),
        ),
    ];
    let sqlite_store: Arc<dyn Store> = sqlite.clone();
    sqlite_store.commit(analytics_days).await.expect("commit");
    assert!(
        sqlite_store
            .seal_day(&seg::site(), seg::D1, seg::day_start(seg::D1))
            .await
            .expect("seal")
    );
    let pg = db.pg_store(1000).await;
    let report = sqlite_to_postgres(&sqlite, &pg).await.expect("copy");
    let rows = |name: &str| {
        report
            .tables
            .iter()
            .find(|(t, _)| *t == name)
            .map(|(_, n)| *n)
            .expect("table in the report")
    };
    assert_eq!(rows("sites"), 2);
    assert!(rows("events") > 50 && rows("visits") > 50 && rows("reach") > 20);
    assert_eq!(rows("event_keys"), 1, "the one dedupe key");
    assert_eq!(rows("salts"), 1);
    assert_eq!(rows("imported_dims"), 3);
    assert_eq!(rows("segments"), 1);
    assert!(rows("dims") >= 4 && rows("visitor_numbers") == 2);

    let (sqlite_dyn, pg_dyn): (Arc<dyn Store>, Arc<dyn Store>) = (sqlite.clone(), Arc::new(pg));
    assert_same(
        &everything(pg_dyn.as_ref()).await,
        &everything(sqlite_dyn.as_ref()).await,
        "after the copy",
    );
    let questions = [
        seg::q(
            &[Metric::Visitors, Metric::Visits, Metric::BounceRate],
            &[Dimension::Visit(VisitDim::Source)],
            vec![],
        ),
        seg::q(
            &[Metric::Visitors, Metric::TimeOnPage, Metric::ScrollDepth],
            &[Dimension::Page],
            vec![],
        ),
        seg::q(
            &[Metric::Visitors],
            &[Dimension::Visit(VisitDim::Browser)],
            vec![],
        ),
    ];
    let ask = |store: Arc<dyn Store>| {
        let questions = questions.clone();
        async move {
            let index = store
                .segment_index(&seg::site(), seg::D1, seg::D2)
                .await
                .expect("index");
            let answers = Analytics::new(store, 8 << 20)
                .answer(&seg::site(), &SiteZone::utc(), seg::D1, seg::D2, &questions)
                .await
                .expect("answers");
            (index.sealed.len(), answers)
        }
    };
    let (pg_sealed, on_pg) = ask(pg_dyn.clone()).await;
    let (sqlite_sealed, on_sqlite) = ask(sqlite_dyn.clone()).await;
    assert_eq!(
        (pg_sealed, sqlite_sealed),
        (1, 1),
        "the sealed day stays sealed"
    );
    assert_eq!(on_pg, on_sqlite);
    assert!(
        on_pg[0]
            .rows
            .iter()
            .any(|r| r.dimensions == ["Google"] && r.metrics[0] == Value::Int(1)),
        "the source survived the copy: {:?}",
        on_pg[0].rows
    );

    let report = pg_dyn.verify(false).await.expect("verify");
    assert!(report.drift.is_empty() && report.checked > 20, "{report:?}");

    // A repair finds nothing to do, and keeps what it cannot recount (imported aggregates).
    let report = pg_dyn.verify(true).await.expect("repair");
    assert!(report.drift.is_empty(), "{report:?}");
    assert_same(
        &everything(pg_dyn.as_ref()).await,
        &everything(sqlite_dyn.as_ref()).await,
        "after a repair on PostgreSQL",
    );

    let on_sqlite = sqlite_dyn.commit(next_traffic()).await.expect("commit");
    let on_pg = pg_dyn.commit(next_traffic()).await.expect("commit");
    assert_eq!(on_pg, on_sqlite);
    assert_eq!(
        on_pg[..3],
        [Outcome::Duplicate, Outcome::Duplicate, Outcome::Accepted],
        "a resent id and a used dedupe key stay duplicates after the copy"
    );
    assert_same(
        &everything(pg_dyn.as_ref()).await,
        &everything(sqlite_dyn.as_ref()).await,
        "after the same next traffic on both",
    );
    // New sites and pages get new ids (the sequences moved past the copied ones).
    let mut more = view(200_000, "newsite", 5, "/x", date(2026, 4, 4));
    more.referrer = None;
    assert_eq!(
        pg_dyn.commit(vec![more]).await.expect("commit"),
        [Outcome::Accepted]
    );
    // The one drift both report: visitor 200's view, not new to the site for its whole-site
    // row, which has no raw event behind it (as after the v1 migration).
    let (on_pg, on_sqlite) = (
        pg_dyn.verify(false).await.expect("verify"),
        sqlite_dyn.verify(false).await.expect("verify"),
    );
    assert_eq!(on_pg.drift, on_sqlite.drift);
    assert_eq!(on_pg.drift.len(), 1, "{on_pg:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_never_goes_over_data_and_changes_nothing_when_refused() {
    let Some(db) = Db::new() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let sqlite = sqlite_at(&dir.path().join("t.sqlite"));
    fill(sqlite.as_ref()).await;
    let pg = db.pg_store(1000).await;
    pg.put_site(&site("elsewhere", "UTC", None))
        .await
        .expect("site");
    let err = sqlite_to_postgres(&sqlite, &pg).await.expect_err("refused");
    assert!(err.to_string().contains("not empty"), "{err}");
    assert!(err.to_string().contains("sites"), "names the table: {err}");
    let sites = pg.list_sites().await.expect("sites");
    assert_eq!(sites.len(), 1, "nothing was copied");
    assert_eq!(db.exec("SELECT 1 FROM events"), 0);
    // The SQLite file's write lock was given back: it still counts.
    let out = sqlite
        .commit(vec![view(900_000, "blog", 1, "/", date(2026, 4, 4))])
        .await
        .expect("commit after a refused copy");
    assert_eq!(out, [Outcome::Accepted]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_file_takes_no_write_while_the_copy_holds_it() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.sqlite");
    let sqlite = sqlite_at(&path);
    fill(sqlite.as_ref()).await;
    // A second handle, as a collector on the same file: its batch cannot commit meanwhile.
    let collector = sqlite_at(&path);
    let dump = tally::store::sqlite::Dump::open(&path).expect("lock");
    let held = collector
        .commit(vec![view(900_001, "blog", 1, "/", date(2026, 4, 4))])
        .await;
    assert!(
        held.is_err(),
        "a write went through the copy's lock: {held:?}"
    );
    drop(dump);
    let out = collector
        .commit(vec![view(900_001, "blog", 1, "/", date(2026, 4, 4))])
        .await
        .expect("commit after the copy");
    assert_eq!(out, [Outcome::Accepted]);
}

/// The command as an operator runs it: rows per table, a clean verify, exit 0; run again on
/// the now full database, it refuses with a non-zero exit and copies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_copies_verifies_and_refuses_a_second_time() {
    let Some(db) = Db::new() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("t.sqlite");
    fill(sqlite_at(&path).as_ref()).await;
    let url = db.url_in_schema();
    let run = move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tally"))
            .env_remove("TALLY_DB")
            .env("TALLY_LOG", "warn")
            .arg("--db")
            .arg(&path)
            .args(["copy-to", &url])
            .output()
            .expect("run tally");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let (ok, text) = tokio::task::spawn_blocking(run.clone()).await.expect("run");
    assert!(ok, "{text}");
    assert!(text.contains("sites                      2 rows"), "{text}");
    assert!(text.contains(", 0 drifted"), "{text}");
    let (ok, text) = tokio::task::spawn_blocking(run).await.expect("run");
    assert!(!ok, "a second copy went over the first: {text}");
    assert!(
        text.contains("nothing was copied") && text.contains("not empty"),
        "{text}"
    );
    assert_eq!(
        db.exec("SELECT 1 FROM sites"),
        2,
        "still the first copy only"
    );
}

/// A target whose tables a collector holds (here: a lock taken by another connection) is
/// refused after the lock wait, and the SQLite file is never held meanwhile: a batch commits
/// on it while the copy waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_target_is_refused_without_holding_the_sqlite_file() {
    let Some(db) = Db::new() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let sqlite = sqlite_at(&dir.path().join("t.sqlite"));
    fill(sqlite.as_ref()).await;
    let pg = db.pg_store(1000).await;
    let (mut holder, connection) =
        tokio_postgres::connect(&db.url_in_schema(), tokio_postgres::NoTls)
            .await
            .expect("connect");
    let conn_task = tokio::spawn(connection);
    let hold = holder.transaction().await.expect("begin");
    hold.batch_execute("LOCK TABLE sites IN ROW EXCLUSIVE MODE")
        .await
        .expect("lock");
    let copy = {
        let sqlite = Arc::clone(&sqlite);
        tokio::spawn(async move { sqlite_to_postgres(&sqlite, &pg).await })
    };
    // Wait until the copy waits for its lock (observed in pg_locks, bounded).
    let (watcher, connection) = tokio_postgres::connect(&db.url_in_schema(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let watch_task = tokio::spawn(connection);
    let mut waiting = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(8);
    while !waiting && std::time::Instant::now() < deadline {
        let row = watcher
            .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
            .await
            .expect("pg_locks");
        waiting = row.get::<_, i64>(0) > 0;
    }
    assert!(waiting, "the copy never waited for the held lock");
    let out = sqlite
        .commit(vec![view(900_002, "blog", 1, "/", date(2026, 4, 4))])
        .await
        .expect("the SQLite file takes writes while the copy waits");
    assert_eq!(out, [Outcome::Accepted]);
    let err = copy.await.expect("task").expect_err("refused");
    assert!(err.to_string().contains("could not be locked"), "{err}");
    drop(hold);
    drop(holder);
    drop(watcher);
    let _ = (conn_task.await, watch_task.await);
    assert_eq!(db.exec("SELECT 1 FROM events"), 0, "nothing was copied");
}

/// Tables of several chunks stream through the bounded channel whole: 2.5 chunks of raw
/// events (and of visitor-set rows) arrive, each counted once, and verify clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_larger_than_one_chunk_are_copied_whole() {
    let Some(db) = Db::new() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let sqlite = sqlite_at(&dir.path().join("t.sqlite"));
    let views = tally::store::copy::CHUNK_ROWS * 5 / 2;
    let records: Vec<Record> = (0..views as u32)
        .map(|n| {
            view(
                n,
                "blog",
                (n % 251) as u8,
                PAGES[n as usize % PAGES.len()],
                days()[(n % 3) as usize],
            )
        })
        .collect();
    for batch in records.chunks(2_000) {
        sqlite.commit(batch.to_vec()).await.expect("commit");
    }
    let pg = db.pg_store(1000).await;
    let report = sqlite_to_postgres(&sqlite, &pg).await.expect("copy");
    let events = report
        .tables
        .iter()
        .find(|(t, _)| *t == "events")
        .map(|(_, n)| *n);
    assert_eq!(events, Some(views as u64));
    let pg: Arc<dyn Store> = Arc::new(pg);
    let sqlite: Arc<dyn Store> = sqlite;
    assert_same(
        &everything(pg.as_ref()).await,
        &everything(sqlite.as_ref()).await,
        "after the copy",
    );
    let report = pg.verify(false).await.expect("verify");
    assert!(report.drift.is_empty(), "{report:?}");
}
