//! The committed fixtures of earlier schemas (`tests/fixtures/tally-v2.sqlite` to
//! `tally-v7.sqlite`, made with [`make_fixtures`]: the current code's file with the tables later
//! versions added dropped) open with the current store, after whatever migrations exist now,
//! and answer the numbers they were made with; opening one first writes a backup copy of the
//! unmigrated file beside it. Every future migration is tested against each of them: when the
//! schema changes again, add its tables to [`ADDED_AFTER`] and commit one more fixture.

use std::path::{Path, PathBuf};

use jiff::civil::date;
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Record, Source};
use tally::store::Site;
use tally::store::prelude::*;
use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};
use tally_wire::Numbers;

fn fixture(version: i64) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/tally-v{version}.sqlite"))
}

/// What each schema version after the first fixture's added: dropping those of versions
/// above N turns a current file into the file version N's code wrote.
const ADDED_AFTER: [(i64, &str); 8] = [
    (2, "DROP TABLE import_ledger;"),
    (3, "DROP TABLE filtered;"),
    (4, "DROP TABLE set_journal;"),
    // v6 keyed `counters` day first; versions 2–5 keyed it scope first.
    (
        5,
        "CREATE TABLE counters_v5 (
             scope INTEGER NOT NULL, source INTEGER NOT NULL, day INTEGER NOT NULL,
             views INTEGER NOT NULL, visitors INTEGER NOT NULL,
             PRIMARY KEY (scope, source, day)
         ) WITHOUT ROWID;
         INSERT INTO counters_v5 SELECT scope, source, day, views, visitors FROM counters;
         DROP TABLE counters;
         ALTER TABLE counters_v5 RENAME TO counters;",
    ),
    (
        6,
        "DROP TABLE shares; DROP TABLE reports; DROP TABLE report_sends;",
    ),
    (7, "DROP TABLE referrer_counters;"),
    (
        8,
        "DROP TABLE dims; DROP TABLE dim_quota; DROP TABLE visitor_numbers; DROP TABLE segments;
         ALTER TABLE events DROP COLUMN src; ALTER TABLE events DROP COLUMN agent;
         ALTER TABLE events DROP COLUMN engaged_ms; ALTER TABLE events DROP COLUMN scroll;",
    ),
    (9, "DROP TABLE rollups;"),
];

/// The fixtures committed (and checked), by schema version.
const FIXTURES: [i64; 6] = [2, 3, 4, 5, 6, 7];

fn options() -> StoreOptions {
    StoreOptions {
        sync: SyncMode::Normal,
        min_free_bytes: 0,
        max_new_pages_per_day: 1000,
    }
}

fn site() -> SiteId {
    SiteId::parse("blog").expect("site")
}

/// Ten views of `/a` by visitors 0..5 (two each) and four of `/b` by visitors 0..4 on
/// 2026-03-01, one custom event `signup`, and a base of 1000 views / 300 visitors.
fn records() -> Vec<Record> {
    let mut out = Vec::new();
    let at = jiff::Timestamp::from_second(1_772_366_400).expect("time"); // 2026-03-01T12:00Z
    let mut n = 0u8;
    let mut push = |page: &str, visitor: u8, kind: HitKind| {
        n += 1;
        let mut v = [0u8; 16];
        v[0] = visitor;
        out.push(Record {
            event_id: EventId::new_at(at, [n; 10]),
            site: site(),
            source: Source::Web,
            kind,
            page: PagePath::parse(page).expect("page"),
            visitor: VisitorKey(v),
            at_ms: at.as_millisecond(),
            day: date(2026, 3, 1),
            referrer: Some("https://news.example.net/".into()),
            dims: Default::default(),
        });
    };
    for i in 0..10 {
        push("/a", i % 5, HitKind::Pageview);
    }
    for i in 0..4 {
        push("/b", i, HitKind::Pageview);
    }
    push(
        "/a",
        0,
        HitKind::Event {
            name: EventName::parse("signup").expect("name"),
            dedupe: None,
        },
    );
    out
}

/// Writes the fixtures that are missing; run by hand (delete one to remake it).
#[tokio::test]
#[ignore = "writes tests/fixtures/tally-v*.sqlite"]
async fn make_fixtures() {
    for version in FIXTURES {
        if !fixture(version).exists() {
            make_fixture(version).await;
        }
    }
}

async fn make_fixture(version: i64) {
    let dir = tempfile::tempdir().expect("dir");
    let store = SqliteStore::open(&dir.path().join("t.sqlite"), options()).expect("open");
    store
        .put_site(&Site {
            id: site(),
            origins: vec!["https://blog.example.com".into()],
            zone: SiteZone::utc(),
            public: true,
            ingest_key: None,
        })
        .await
        .expect("site");
    store.commit(records()).await.expect("commit");
    store
        .set_base(
            &site(),
            None,
            Numbers {
                views: 1000,
                visitors: 300,
            },
        )
        .await
        .expect("base");
    // Moves the visitor-set journal into its tables (older versions had no journal).
    store.verify(false).await.expect("verify");
    let _ = std::fs::remove_file(fixture(version));
    store.backup_to(&fixture(version)).await.expect("backup");
    let conn = rusqlite::Connection::open(fixture(version)).expect("fixture");
    let drops: String = ADDED_AFTER
        .iter()
        .filter(|(v, _)| *v >= version)
        .map(|(_, sql)| *sql)
        .collect();
    conn.execute_batch(&format!("{drops} PRAGMA user_version = {version}; VACUUM;"))
        .expect("to the old version");
}

#[tokio::test]
async fn the_v2_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(2).await;
}

#[tokio::test]
async fn the_v3_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(3).await;
}

#[tokio::test]
async fn the_v4_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(4).await;
}

#[tokio::test]
async fn the_v5_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(5).await;
}

#[tokio::test]
async fn the_v6_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(6).await;
}

#[tokio::test]
async fn the_v7_fixture_opens_and_keeps_its_numbers() {
    opens_and_keeps_its_numbers(7).await;
}

async fn opens_and_keeps_its_numbers(fixture_version: i64) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tally.sqlite");
    std::fs::copy(fixture(fixture_version), &path).expect("copy fixture");
    let store = SqliteStore::open(&path, options()).expect("open migrated");
    let copy = tally::store::sqlite::migration_backup_path(&path, fixture_version);
    let version: i64 = rusqlite::Connection::open(&copy)
        .expect("backup copy beside the file")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, fixture_version, "the copy is the unmigrated file");
    let counters: String = rusqlite::Connection::open(&path)
        .expect("migrated file")
        .query_row(
            "SELECT group_concat(sql, ';') FROM sqlite_schema WHERE tbl_name = 'counters'",
            [],
            |r| r.get(0),
        )
        .expect("counters");
    assert!(
        counters.contains("PRIMARY KEY (day, scope, source)")
            && counters.contains("counters_scope ON counters (scope, source, day)"),
        "counters keyed day first (v6): {counters}"
    );
    let v7: i64 = rusqlite::Connection::open(&path)
        .expect("migrated file")
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' \
             AND name IN ('shares', 'reports', 'report_sends')",
            [],
            |r| r.get(0),
        )
        .expect("tables");
    assert_eq!(v7, 3, "the v7 tables are there");
    let page = PagePath::parse("/a").expect("page");
    let counts = store
        .counts(&site(), &page, date(2026, 3, 1))
        .await
        .expect("counts");
    assert_eq!(
        counts.site_all.web,
        Numbers {
            views: 14,
            visitors: 5
        }
    );
    assert_eq!(
        counts.site_today.web,
        Numbers {
            views: 14,
            visitors: 5
        }
    );
    assert_eq!(
        counts.page_all.web,
        Numbers {
            views: 10,
            visitors: 5
        }
    );
    assert_eq!(
        counts.site_base,
        Numbers {
            views: 1000,
            visitors: 300
        }
    );
    // The referrer counters (v8) are filled from the raw events: 14 views, not the event.
    let referrers: Vec<(String, u64)> = store
        .top_referrers(&site(), date(2026, 3, 1), date(2026, 3, 1), 10)
        .await
        .expect("referrers")
        .into_iter()
        .map(|r| (r.host, r.views))
        .collect();
    assert_eq!(referrers, [("news.example.net".to_owned(), 14)]);
    let sites = store.list_sites().await.expect("sites");
    assert_eq!(sites.len(), 1);
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    assert!(report.checked > 0);
    // The raw event ids are still there: the same records are duplicates.
    let outcomes = store.commit(records()).await.expect("commit again");
    assert!(
        outcomes
            .iter()
            .all(|o| *o == tally::core::record::Outcome::Duplicate)
    );
}
