//! The committed schema-v2 fixture (`tests/fixtures/tally-v2.sqlite`, written by the v2 code
//! with [`make_v2_fixture`]) opens with the current store, after whatever migrations exist
//! now, and answers the numbers it was made with; opening it first writes a backup copy of
//! the unmigrated file beside it. Every future migration is tested against it.

use std::path::{Path, PathBuf};

use jiff::civil::date;
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Record, Source};
use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};
use tally::store::{Site, Store};
use tally_wire::Numbers;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tally-v2.sqlite")
}

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

/// Writes the fixture; run by hand only when the fixture must be remade by the v2 code.
#[tokio::test]
#[ignore = "writes tests/fixtures/tally-v2.sqlite"]
async fn make_v2_fixture() {
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
    let _ = std::fs::remove_file(fixture());
    store.backup_to(&fixture()).await.expect("backup");
    // v3 is v2 plus the import ledger: without it, this is the file the v2 code wrote.
    let conn = rusqlite::Connection::open(fixture()).expect("fixture");
    conn.execute_batch("DROP TABLE import_ledger; PRAGMA user_version = 2; VACUUM;")
        .expect("to v2");
}

#[tokio::test]
async fn the_v2_fixture_opens_and_keeps_its_numbers() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("tally.sqlite");
    std::fs::copy(fixture(), &path).expect("copy fixture");
    let store = SqliteStore::open(&path, options()).expect("open migrated");
    let copy = tally::store::sqlite::migration_backup_path(&path, 2);
    let version: i64 = rusqlite::Connection::open(&copy)
        .expect("backup copy beside the file")
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 2, "the copy is the unmigrated file");
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
