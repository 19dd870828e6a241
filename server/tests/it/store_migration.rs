//! Schema v1 → v2: a database written in the v1 shape opens with the v2 store and answers
//! exactly as a v2 store that stored the same records.

use std::path::Path;
use std::sync::Arc;

use jiff::civil::{Date, date};
use tally::core::day::SiteZone;
use tally::core::hit::HitKind;
use tally::core::ids::{DedupeKey, EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::record::{Record, Source};
use tally::store::prelude::*;
use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};
use tally::store::{Site, StoreError};
use tally_wire::Numbers;

/// The v1 schema, exactly as the first release created it (the fixture).
const V1_SCHEMA: &str = r"
CREATE TABLE IF NOT EXISTS sites (
    id TEXT PRIMARY KEY,
    origins TEXT NOT NULL,
    timezone TEXT NOT NULL,
    public INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    event_id BLOB PRIMARY KEY,
    site TEXT NOT NULL,
    source INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    page TEXT NOT NULL,
    name TEXT,
    dedupe TEXT,
    visitor BLOB NOT NULL,
    at_ms INTEGER NOT NULL,
    day TEXT NOT NULL,
    referrer TEXT
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_dedupe ON events (site, name, dedupe) WHERE dedupe IS NOT NULL;
-- No index on (site, day): range reads use the time-ordered event id (UUIDv7) instead,
-- so every stored hit updates one b-tree less.
DROP INDEX IF EXISTS events_site_day;
CREATE TABLE IF NOT EXISTS visitors (
    site TEXT NOT NULL, source INTEGER NOT NULL, page TEXT NOT NULL, day TEXT NOT NULL,
    visitor BLOB NOT NULL,
    PRIMARY KEY (site, source, page, day, visitor)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    site TEXT NOT NULL, source INTEGER NOT NULL, page TEXT NOT NULL, day TEXT NOT NULL,
    views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (site, source, page, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_counters (
    site TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (site, name, day)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bases (
    site TEXT NOT NULL, page TEXT NOT NULL, views INTEGER NOT NULL, visitors INTEGER NOT NULL,
    PRIMARY KEY (site, page)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS salts (day TEXT PRIMARY KEY, salt BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
";

/// How v1 committed one record: the raw event, then for a page view the four visitor-set
/// rows and counter increments (page/site × day/all time), for a custom event its counters.
fn v1_commit(conn: &rusqlite::Connection, r: &Record) {
    let day = r.day.to_string();
    let (kind, name, dedupe) = match &r.kind {
        HitKind::Pageview | HitKind::Engagement { .. } => (0, None, None),
        HitKind::Event { name, dedupe } => {
            (1, Some(name.as_str()), dedupe.as_ref().map(|d| d.as_str()))
        }
    };
    let inserted = conn
        .execute(
            "INSERT OR IGNORE INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            rusqlite::params![
                &r.event_id.as_bytes()[..],
                r.site.as_str(),
                r.source.code(),
                kind,
                r.page.as_str(),
                name,
                dedupe,
                &r.visitor.0[..],
                r.at_ms,
                day,
                r.referrer,
            ],
        )
        .expect("event");
    if inserted == 0 {
        return;
    }
    if let Some(name) = name {
        for d in [day.as_str(), "*"] {
            conn.execute(
                "INSERT INTO event_counters VALUES (?1, ?2, ?3, 1) \
                 ON CONFLICT DO UPDATE SET count = count + 1",
                rusqlite::params![r.site.as_str(), name, d],
            )
            .expect("event counter");
        }
        return;
    }
    for page in [r.page.as_str(), ""] {
        for d in [day.as_str(), "*"] {
            let new = conn
                .execute(
                    "INSERT OR IGNORE INTO visitors VALUES (?1, ?2, ?3, ?4, ?5)",
                    rusqlite::params![r.site.as_str(), r.source.code(), page, d, &r.visitor.0[..]],
                )
                .expect("visitor");
            conn.execute(
                "INSERT INTO counters VALUES (?1, ?2, ?3, ?4, 1, ?5) ON CONFLICT DO UPDATE \
                 SET views = views + 1, visitors = visitors + excluded.visitors",
                rusqlite::params![r.site.as_str(), r.source.code(), page, d, new as i64],
            )
            .expect("counter");
        }
    }
}

fn records() -> Vec<Record> {
    let days = [date(2026, 4, 1), date(2026, 4, 2), date(2026, 4, 3)];
    let mut out = Vec::new();
    for i in 0..300u32 {
        let day = days[(i % 3) as usize];
        let at = day
            .to_zoned(jiff::tz::TimeZone::UTC)
            .expect("zoned")
            .timestamp()
            + jiff::SignedDuration::from_mins(i64::from(i));
        let mut random = [0u8; 10];
        random[4..8].copy_from_slice(&i.to_be_bytes());
        let mut visitor = [0u8; 16];
        visitor[0] = (i % 13) as u8;
        let kind = match i % 50 {
            7 | 8 => HitKind::Event {
                name: EventName::parse("signup").expect("name"),
                dedupe: Some(DedupeKey::parse("order-1").expect("key")),
            },
            9 => HitKind::Event {
                name: EventName::parse("signup").expect("name"),
                dedupe: None,
            },
            _ => HitKind::Pageview,
        };
        let record = Record {
            event_id: EventId::new_at(at, random),
            site: SiteId::parse(if i % 7 == 0 { "docs" } else { "blog" }).expect("site"),
            source: if i % 10 == 0 {
                Source::Badge
            } else {
                Source::Web
            },
            kind,
            page: PagePath::parse(["/", "/a", "/b"][(i % 3) as usize]).expect("page"),
            visitor: VisitorKey(visitor),
            at_ms: at.as_millisecond(),
            day,
            referrer: (i % 4 == 0).then(|| format!("https://news{}.example/x", i % 2)),
            dims: Default::default(),
        };
        // Every tenth record is delivered twice.
        if i % 10 == 3 {
            out.push(record.clone());
        }
        out.push(record);
    }
    out
}

fn blog() -> Site {
    Site {
        id: SiteId::parse("blog").expect("id"),
        origins: vec!["https://blog.example".into()],
        zone: SiteZone::parse("Europe/Berlin").expect("zone"),
        public: false,
        ingest_key: None,
    }
}

const SALT_DAY: &str = "2026-04-03";

fn write_v1(path: &Path) {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.execute_batch(V1_SCHEMA).expect("v1 schema");
    conn.execute_batch("BEGIN").expect("begin");
    conn.execute(
        "INSERT INTO sites VALUES ('blog', '[\"https://blog.example\"]', 'Europe/Berlin', 0)",
        [],
    )
    .expect("site");
    for r in records() {
        v1_commit(&conn, &r);
    }
    conn.execute_batch(&format!(
        "INSERT INTO bases VALUES ('blog', '', 1000, 100), ('blog', '/a', 50, 5);
         INSERT INTO salts VALUES ('{SALT_DAY}', x'{}');",
        "07".repeat(32)
    ))
    .expect("bases, salt");
    conn.execute_batch("COMMIT").expect("commit");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 0, "v1 never set a version");
}

async fn write_v2(store: &dyn Store) {
    store.put_site(&blog()).await.expect("site");
    for chunk in records().chunks(40) {
        store.commit(chunk.to_vec()).await.expect("commit");
    }
    let n = |views, visitors| Numbers { views, visitors };
    let site = SiteId::parse("blog").expect("id");
    store
        .set_base(&site, None, n(1000, 100))
        .await
        .expect("base");
    let a = PagePath::parse("/a").expect("p");
    store
        .set_base(&site, Some(&a), n(50, 5))
        .await
        .expect("base");
    store
        .salt_for(SALT_DAY.parse().expect("day"), [7; 32])
        .await
        .expect("salt");
}

/// Everything the read side can tell about the data, for comparison.
async fn answers(store: &dyn Store) -> String {
    let (from, to): (Date, Date) = (date(2026, 4, 1), date(2026, 4, 3));
    let mut out = String::new();
    for site in ["blog", "docs", "none"] {
        let site = SiteId::parse(site).expect("site");
        for page in ["/", "/a", "/b", "/c"] {
            let page = PagePath::parse(page).expect("page");
            for today in [from, to] {
                let c = store.counts(&site, &page, today).await.expect("counts");
                out += &format!("counts {site} {} {today}: {c:?}\n", page.as_str());
            }
        }
        let series = store.series(&site, from, to).await.expect("series");
        out += &format!("series {site}: {series:?}\n");
        for (a, b) in [(from, to), (from, from), (to, to)] {
            let t = store.range_totals(&site, a, b).await.expect("totals");
            let top = store.top_pages(&site, a, b, 10).await.expect("top");
            let refs = store
                .top_referrers(&site, a, b, 10)
                .await
                .expect("referrers");
            out += &format!("{site} {a}..{b}: {t:?} {top:?} {refs:?}\n");
        }
    }
    out += &format!("sites: {:?}\n", store.list_sites().await.expect("sites"));
    let report = store.verify(false).await.expect("verify");
    assert!(report.drift.is_empty(), "{report:?}");
    out += &format!("verify checked {}\n", report.checked);
    out
}

fn options() -> StoreOptions {
    StoreOptions {
        sync: SyncMode::Normal,
        ..StoreOptions::default()
    }
}

#[tokio::test]
async fn a_v1_database_migrates_with_every_number_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let (old, fresh) = (dir.path().join("v1.sqlite"), dir.path().join("v2.sqlite"));
    write_v1(&old);
    let migrated: Arc<dyn Store> = Arc::new(SqliteStore::open(&old, options()).expect("migrate"));
    let reference: Arc<dyn Store> = Arc::new(SqliteStore::open(&fresh, options()).expect("open"));
    write_v2(reference.as_ref()).await;

    let expected = answers(reference.as_ref()).await;
    assert!(expected.contains("views: 1000") && expected.contains("news0.example"));
    assert_eq!(answers(migrated.as_ref()).await, expected);

    // The salt, and the dedupe key of the keyed custom event, came along.
    let day: Date = SALT_DAY.parse().expect("day");
    assert_eq!(
        migrated.salt_for(day, [9; 32]).await.expect("salt"),
        [7; 32]
    );
    let again: Vec<Record> = records().into_iter().take(20).collect();
    let outcomes = migrated.commit(again).await.expect("commit");
    assert!(
        outcomes
            .iter()
            .all(|o| *o == tally::core::record::Outcome::Duplicate)
    );
    // New hits count on top of migrated ones exactly as on the reference.
    let more: Vec<Record> = records()
        .into_iter()
        .map(|mut r| {
            let mut random = [0u8; 10];
            random[..].copy_from_slice(&r.event_id.as_bytes()[6..]);
            random[9] ^= 0x55;
            r.event_id = EventId::new_at(r.event_id.time(), random);
            r
        })
        .collect();
    for store in [&migrated, &reference] {
        store.commit(more.clone()).await.expect("commit");
    }
    assert_eq!(
        answers(migrated.as_ref()).await,
        answers(reference.as_ref()).await
    );
    drop(migrated);
    assert!(
        tally::store::sqlite::migration_backup_path(&old, 1).exists(),
        "the v1 file is copied beside itself before the migration"
    );

    let conn = rusqlite::Connection::open(&old).expect("open");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, 10);
    let leftovers: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_schema WHERE name LIKE 'v1_%' OR name = 'visitors'",
            [],
            |r| r.get(0),
        )
        .expect("tables");
    assert_eq!(leftovers, 0, "the v1 tables are gone");
    drop(conn);
    // Opening again is a no-op.
    let reopened = SqliteStore::open(&old, options()).expect("reopen");
    assert!(
        reopened
            .verify(false)
            .await
            .expect("verify")
            .drift
            .is_empty()
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("v11.sqlite");
    drop(SqliteStore::open(&path, options()).expect("open"));
    rusqlite::Connection::open(&path)
        .expect("open")
        .pragma_update(None, "user_version", 11)
        .expect("version");
    match SqliteStore::open(&path, options()) {
        Err(StoreError::Invalid(why)) => assert!(why.contains("version 11"), "{why}"),
        Err(e) => panic!("expected Invalid, got {e}"),
        Ok(_) => panic!("a newer schema must be refused"),
    }
}
