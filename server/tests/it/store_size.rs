//! Bytes on disk per stored hit: a measurement, not a check (run on demand, it takes a while).
//!
//! `cargo test -p tally --test it store_size -- --ignored --nocapture --test-threads 1`
//!
//! Two mixes, committed through `Store::commit` in batches of 500 (group commit under load):
//! - realistic: 200,000 page views over 10 days, 10,000 visitors (uniform), 200 pages with
//!   Zipf popularity (s = 1), one in five with a short referrer; most views are a new
//!   (visitor, page) pair of their day (the bench prints the share);
//! - worst case: 20,000 views, each a new 256-byte path with a 256-byte referrer.
//!
//! Each prints the file size after `PRAGMA wal_checkpoint(TRUNCATE)` divided by the hits, and
//! the bytes per table (SQLite's `dbstat`).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use jiff::civil::date;
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, PagePath, SiteId, VisitorKey};
use tally::core::record::{Record, Source};
use tally::store::Store;
use tally::store::sqlite::{SqliteStore, StoreOptions, SyncMode};

/// A small deterministic generator (splitmix64), so every run stores the same hits.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        for chunk in out.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        out
    }
}

fn open(path: &Path) -> Arc<dyn Store> {
    let options = StoreOptions {
        sync: SyncMode::Normal,
        min_free_bytes: 0,
        max_new_pages_per_day: 1000,
    };
    Arc::new(SqliteStore::open(path, options).expect("open"))
}

async fn commit_all(store: &Arc<dyn Store>, records: Vec<Record>) -> f64 {
    let started = Instant::now();
    for chunk in records.chunks(500) {
        store.commit(chunk.to_vec()).await.expect("commit");
    }
    started.elapsed().as_secs_f64()
}

fn report(label: &str, path: &Path, hits: usize, secs: f64) -> f64 {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    let size = std::fs::metadata(path).expect("size").len();
    let per_hit = size as f64 / hits as f64;
    println!(
        "{label}: {hits} hits, file {size} B, {per_hit:.1} B/hit, commit {:.0} hits/s (this build)",
        hits as f64 / secs
    );
    if let Ok(mut stmt) =
        conn.prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY SUM(pgsize) DESC")
    {
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .expect("dbstat");
        for row in rows {
            let (name, bytes) = row.expect("row");
            println!(
                "  {name:<32} {bytes:>12} B  {:>7.1} B/hit",
                bytes as f64 / hits as f64
            );
        }
    }
    per_hit
}

fn pageview(rng: &mut Rng, day: jiff::civil::Date, page: String, visitor: [u8; 16]) -> Record {
    let at = day
        .to_zoned(jiff::tz::TimeZone::UTC)
        .expect("zoned")
        .timestamp()
        + jiff::SignedDuration::from_millis(rng.below(86_400_000) as i64);
    Record {
        event_id: EventId::new_at(at, rng.bytes()),
        site: SiteId::parse("blog").expect("site"),
        source: Source::Web,
        kind: HitKind::Pageview,
        page: PagePath::parse(&page).expect("page"),
        visitor: VisitorKey(visitor),
        at_ms: at.as_millisecond(),
        day,
        referrer: None,
        dims: Default::default(),
    }
}

#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn bytes_per_hit_realistic() {
    let mut rng = Rng(7);
    // Zipf (s = 1) over 200 pages: cumulative weights 1/k.
    let weights: Vec<f64> = (1..=200).map(|k| 1.0 / f64::from(k)).collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(200);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cumulative.push(acc);
    }
    let visitors: Vec<[u8; 16]> = (0..10_000).map(|_| rng.bytes()).collect();
    let mut records = Vec::with_capacity(200_000);
    let mut pairs = HashSet::new();
    let mut new_pairs = 0usize;
    for i in 0..200_000u32 {
        let day = date(2026, 4, 1)
            .checked_add(jiff::Span::new().days(i64::from(i / 20_000)))
            .expect("day");
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        let page = cumulative.partition_point(|c| *c < u).min(199);
        let visitor = visitors[rng.below(10_000) as usize];
        if pairs.insert((day, page, visitor)) {
            new_pairs += 1;
        }
        let mut r = pageview(
            &mut rng,
            day,
            format!("/posts/article-number-{page}"),
            visitor,
        );
        if rng.below(5) == 0 {
            r.referrer = Some(format!("https://news{}.example/item", rng.below(20)));
        }
        records.push(r);
    }
    println!(
        "realistic mix: {:.1} % of views are a new (visitor, page) pair of their day",
        100.0 * new_pairs as f64 / records.len() as f64
    );
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("size.sqlite");
    let store = open(&path);
    let hits = records.len();
    let secs = commit_all(&store, records).await;
    let per_hit = report("realistic", &path, hits, secs);
    assert!(per_hit > 0.0);
}

#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn bytes_per_hit_worst_case() {
    let mut rng = Rng(11);
    let mut records = Vec::with_capacity(20_000);
    for i in 0..20_000u32 {
        let day = date(2026, 4, 1)
            .checked_add(jiff::Span::new().days(i64::from(i / 10_000)))
            .expect("day");
        let tail: String = (0..255)
            .map(|_| char::from(b'a' + rng.below(26) as u8))
            .collect();
        let visitor = rng.bytes();
        let mut r = pageview(&mut rng, day, format!("/{tail}"), visitor);
        let host: String = (0..238)
            .map(|_| char::from(b'a' + rng.below(26) as u8))
            .collect();
        r.referrer = Some(format!("https://{host}.example/x"));
        assert_eq!(r.page.as_str().len(), 256);
        assert_eq!(r.referrer.as_deref().map(str::len), Some(256));
        records.push(r);
    }
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("worst.sqlite");
    let store = open(&path);
    let hits = records.len();
    let secs = commit_all(&store, records).await;
    let per_hit = report("worst case", &path, hits, secs);
    assert!(per_hit > 0.0);
}
