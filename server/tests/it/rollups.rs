//! Month rollups (`store::rollups`) on every backend: a year read from stored month states
//! answers exactly as counting its days, a write to a sealed day is never hidden by a stored
//! state (nor by months a cold read merged beside its index), a seal pass rolls only the
//! months that changed, and verify finds and repairs a state that differs from a recount.
//! Run on every backend by `segment_store`'s checks.

use std::sync::Arc;

use jiff::civil::{Date, date};
use tally::core::day::SiteZone;
use tally::core::ids::SiteId;
use tally::core::query::Value;
use tally::core::query::{Answer, Dimension, Metric, Query};
use tally::core::site::Site;
use tally::store::analytics::Analytics;
use tally::store::{
    DictionaryRows, PartsWanted, SegmentIndex, SegmentParts, SegmentSource, Store, StoreError,
    rollups,
};

use crate::segment_store::{D1, D2, engagement, morning_views, seal, site, view};
use crate::store_conformance::Harness;

const F1: Date = date(2026, 2, 10);
const F2: Date = date(2026, 2, 20);

/// The stored questions, with every metric their sums give (one counting key each).
fn questions() -> Vec<Query> {
    rollups::questions()
        .into_iter()
        .map(|mut q| {
            q.limit = 100;
            if q.dimensions.is_empty() {
                // Visitors, visits, page views, views per visit, bounce rate, duration.
                q.metrics = Metric::ALL[..6].to_vec();
            }
            if q.dimensions == [Dimension::Page] {
                q.metrics.push(Metric::ScrollDepth);
            }
            q
        })
        .collect()
}

async fn answers(store: &Arc<dyn Store>, from: Date, to: Date) -> (Vec<Answer>, u64) {
    let analytics = Analytics::new(store.clone(), 64 << 20);
    let a = analytics
        .answer(&site(), &SiteZone::utc(), from, to, &questions())
        .await
        .expect("answers");
    (a, analytics.days_counted())
}

pub(crate) async fn month_rollups_answer_exactly_and_never_go_stale(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let zone = SiteZone::utc();
    // Visitor 1 comes back in both months (a year's visitors are a union, not a sum).
    let mut records = morning_views(&[
        (1, 1, F1, "/a"),
        (2, 2, F1, "/b"),
        (3, 1, F2, "/a"),
        (4, 3, F2, "/c"),
        (5, 1, D1, "/a"),
        (6, 4, D1, "/b"),
        (7, 2, D2, "/c"),
    ]);
    // A second page view in visitor 1's visit of D1, and engagement for it.
    let second = view(
        8,
        1,
        "/b",
        &format!("{D1}T10:09:00Z"),
        ("", "Direct", "Firefox"),
    );
    records.push(engagement(&second, 30_000, Some(80)));
    records.push(second);
    store.commit(records).await.expect("commit");
    for day in [F1, F2, D1, D2] {
        seal(&*store, day).await;
    }
    let (from, to) = (date(2026, 2, 1), date(2026, 3, 31));
    let (counted, days) = answers(&store, from, to).await;
    assert_eq!(
        days,
        4 * questions().len() as u64,
        "no rollup yet: every day counted"
    );
    assert_eq!(
        counted[0].rows[0].metrics[..3],
        [
            tally::core::query::Value::Int(4),
            tally::core::query::Value::Int(7),
            tally::core::query::Value::Int(8)
        ],
        "4 visitors, 7 visits, 8 page views"
    );

    let roller = Analytics::new(store.clone(), 0);
    assert_eq!(roller.roll_up(&site(), &zone, D2).await.expect("roll"), 2);
    assert_eq!(
        roller.roll_up(&site(), &zone, D2).await.expect("roll"),
        0,
        "months already current are not counted again"
    );
    let (rolled, days) = answers(&store, from, to).await;
    assert_eq!(days, 0, "both months read from their stored states");
    assert_eq!(rolled, counted);
    // Two questions of one counting key read the same stored state.
    let twice = Analytics::new(store.clone(), 64 << 20);
    let asked = [questions()[0].clone(), questions()[0].clone()];
    let both = twice
        .answer(&site(), &zone, from, to, &asked)
        .await
        .expect("answers");
    assert_eq!(twice.days_counted(), 0, "one state read for both questions");
    assert_eq!(both, [counted[0].clone(), counted[0].clone()]);

    // A late view of a sealed day unseals it: March's state no longer names its days.
    store
        .commit(morning_views(&[(9, 5, D1, "/d")]))
        .await
        .expect("late view");
    let (late, days) = answers(&store, from, to).await;
    assert_eq!(
        days,
        questions().len() as u64,
        "February from its state, March's sealed D2 counted (D1 is open)"
    );
    assert_eq!(
        late[0].rows[0].metrics[..3],
        [
            tally::core::query::Value::Int(5),
            tally::core::query::Value::Int(8),
            tally::core::query::Value::Int(9)
        ],
        "the late view is in the answer"
    );
    seal(&*store, D1).await;
    // A range that starts inside February, counted day by day while March's state is stale
    // (every answer, to compare with the one that takes March from its state below).
    let (part_counted, days) = answers(&store, date(2026, 2, 15), to).await;
    assert_eq!(days, 3 * questions().len() as u64, "F2, D1 and D2 counted");
    assert_eq!(
        roller.roll_up(&site(), &zone, D2).await.expect("roll"),
        1,
        "only March is rolled again"
    );
    let (again, days) = answers(&store, from, to).await;
    assert_eq!(days, 0);
    assert_eq!(again, late);

    // A range that starts inside February reads February's days, March's state.
    let (part, days) = answers(&store, date(2026, 2, 15), to).await;
    assert_eq!(days, questions().len() as u64, "F2 only");
    assert_eq!(
        part[0].rows[0].metrics[0],
        tally::core::query::Value::Int(5),
        "visitors 1 to 5 (3 on F2, 1, 2, 4, 5 in March)"
    );
    assert_eq!(
        part, part_counted,
        "February's days counted beside March's state answer as counting every day"
    );
}

pub(crate) async fn verify_recounts_rollups_and_repairs_them(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let zone = SiteZone::utc();
    store
        .commit(morning_views(&[(1, 1, F1, "/a"), (2, 2, F2, "/b")]))
        .await
        .expect("commit");
    for day in [F1, F2] {
        seal(&*store, day).await;
    }
    let analytics = Analytics::new(store.clone(), 0);
    assert_eq!(
        analytics.roll_up(&site(), &zone, F2).await.expect("roll"),
        1
    );
    let sites = [Site {
        id: site(),
        origins: vec!["*".into()],
        zone: zone.clone(),
        public: false,
        ingest_key: None,
    }];
    let clean = analytics
        .verify_rollups(&sites, false)
        .await
        .expect("verify");
    assert_eq!(clean.checked, questions().len() as u64);
    assert!(clean.drift.is_empty(), "{:?}", clean.drift);

    // February's states counted over F1 alone, stored as if over both days.
    let feb = date(2026, 2, 1);
    let days = store.sealed_through(&site(), F2).await.expect("days");
    let mut wrong = analytics
        .count_month(&site(), &zone, feb, &days[..1])
        .await
        .expect("count")
        .expect("unchanged");
    for s in &mut wrong {
        s.days = days.clone();
    }
    assert!(
        store
            .put_rollups(&site(), feb, wrong.clone())
            .await
            .expect("tamper")
    );
    let found = analytics
        .verify_rollups(&sites, false)
        .await
        .expect("verify");
    assert!(!found.repaired);
    assert!(
        found.drift.iter().any(|d| d.key == "s/rollup/2026-02-01/0"),
        "the totals' state differs: {:?}",
        found.drift
    );
    // The stored state is what a read uses: it answers the tampered numbers.
    let (read, _) = answers(&store, feb, date(2026, 2, 28)).await;
    assert_eq!(
        read[0].rows[0].metrics[0],
        tally::core::query::Value::Int(1)
    );
    let repaired = analytics
        .verify_rollups(&sites, true)
        .await
        .expect("repair");
    assert!(repaired.repaired);
    let after = analytics
        .verify_rollups(&sites, false)
        .await
        .expect("verify");
    assert!(after.drift.is_empty(), "{:?}", after.drift);
    let (read, _) = answers(&store, feb, date(2026, 2, 28)).await;
    assert_eq!(
        read[0].rows[0].metrics[0],
        tally::core::query::Value::Int(2)
    );

    // Bytes that are no state: reads count the month's days instead, verify reports it.
    for s in &mut wrong {
        s.state = b"not a state".to_vec();
    }
    assert!(
        store
            .put_rollups(&site(), feb, wrong.clone())
            .await
            .expect("tamper")
    );
    let (read, days) = answers(&store, feb, date(2026, 2, 28)).await;
    assert_eq!(
        read[0].rows[0].metrics[0],
        tally::core::query::Value::Int(2)
    );
    assert_eq!(days, 2 * questions().len() as u64, "F1 and F2 counted");
    let found = analytics
        .verify_rollups(&sites, false)
        .await
        .expect("verify");
    assert_eq!(found.drift.len(), questions().len(), "{:?}", found.drift);

    // A state counted before a newer seal never replaces the month: a late view unseals F2.
    store
        .commit(morning_views(&[(3, 3, F2, "/c")]))
        .await
        .expect("late view");
    for s in &mut wrong {
        s.state = b"counted before".to_vec();
    }
    assert!(
        !store
            .put_rollups(&site(), feb, wrong)
            .await
            .expect("refused"),
        "F2 is no longer sealed at the version the states name"
    );
}

/// Seven months read from their stored states, merged one into the next, answer exactly as
/// counting their days, rows in the same order.
pub(crate) async fn many_months_merge_as_they_are_counted(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let zone = SiteZone::utc();
    let pages = ["/a", "/b", "/c", "/d", "/e"];
    let mut views = Vec::new();
    for month in 1..=7i8 {
        for (i, day) in [3i8, 17].into_iter().enumerate() {
            let d = date(2025, month, day);
            let n = (month as u16) * 2 + i as u16;
            // Visitors come back across months; pages appear month by month.
            let visitor = (month as u8 + i as u8 * 3) % 6 + 1;
            views.push((n % 10, visitor, d, pages[(n as usize) % pages.len()]));
        }
    }
    let days: Vec<Date> = views.iter().map(|v| v.2).collect();
    store.commit(morning_views(&views)).await.expect("commit");
    for day in &days {
        seal(&*store, *day).await;
    }
    let (from, to) = (date(2025, 1, 1), date(2025, 7, 31));
    let (counted, _) = answers(&store, from, to).await;
    let roller = Analytics::new(store.clone(), 0);
    assert_eq!(
        roller
            .roll_up(&site(), &zone, date(2025, 7, 31))
            .await
            .expect("roll"),
        7
    );
    let (rolled, days) = answers(&store, from, to).await;
    assert_eq!(days, 0, "every month read from its stored states");
    assert_eq!(rolled, counted);
    assert_eq!(
        counted[0].rows[0].metrics[0],
        tally::core::query::Value::Int(6),
        "six visitors, each in several months"
    );
}

/// A write [`LateWrite`] makes between listing the sealed days and reading the index.
enum Late {
    /// Views of a sealed day: they unseal it.
    Views(Vec<tally::core::record::Record>),
    /// A day to seal.
    Seal(Date),
}

/// A store that makes its `late` write right after it lists the sealed days for a read, and
/// holds that read's index until the write is in: the months a cold read takes from their
/// stored states beside the index were checked against sealed days that are no longer the
/// index's.
struct LateWrite {
    inner: Arc<dyn Store>,
    late: tokio::sync::Mutex<Option<Late>>,
    written: tokio::sync::Notify,
}

impl LateWrite {
    fn new(inner: &Arc<dyn Store>, late: Late) -> Arc<Self> {
        Arc::new(Self {
            inner: inner.clone(),
            late: tokio::sync::Mutex::new(Some(late)),
            written: tokio::sync::Notify::new(),
        })
    }
}

#[async_trait::async_trait]
impl SegmentSource for LateWrite {
    async fn segment_index(
        &self,
        site: &SiteId,
        from: Date,
        to: Date,
    ) -> Result<SegmentIndex, StoreError> {
        let written = self.written.notified();
        if self.late.lock().await.is_some() {
            // Bounded: a read that never lists the sealed days apart goes on (and the test
            // fails on what it asserts, not by hanging).
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), written).await;
        }
        self.inner.segment_index(site, from, to).await
    }

    async fn segment_parts(
        &self,
        site: &SiteId,
        wanted: Vec<PartsWanted>,
    ) -> Result<Vec<SegmentParts>, StoreError> {
        self.inner.segment_parts(site, wanted).await
    }

    async fn dictionary(
        &self,
        site: &SiteId,
        pages: Vec<u32>,
        dims: Vec<u32>,
    ) -> Result<DictionaryRows, StoreError> {
        self.inner.dictionary(site, pages, dims).await
    }

    async fn unsealed_days(
        &self,
        site: &SiteId,
        through: Date,
        limit: u32,
    ) -> Result<Vec<Date>, StoreError> {
        self.inner.unsealed_days(site, through, limit).await
    }

    async fn seal_day(&self, site: &SiteId, day: Date, start_ms: i64) -> Result<bool, StoreError> {
        self.inner.seal_day(site, day, start_ms).await
    }

    async fn sealed_through(
        &self,
        site: &SiteId,
        through: Date,
    ) -> Result<Vec<(Date, i64)>, StoreError> {
        let sealed = self.inner.sealed_through(site, through).await?;
        match self.late.lock().await.take() {
            Some(Late::Views(views)) => {
                self.inner.commit(views).await?;
            }
            Some(Late::Seal(day)) => seal(&*self.inner, day).await,
            None => return Ok(sealed),
        }
        self.written.notify_waiters();
        Ok(sealed)
    }

    async fn rollup_index(&self, site: &SiteId) -> Result<Vec<rollups::RollupInfo>, StoreError> {
        self.inner.rollup_index(site).await
    }

    async fn rollup_states(
        &self,
        site: &SiteId,
        month: Date,
        keys: Vec<String>,
    ) -> Result<Vec<rollups::RollupState>, StoreError> {
        self.inner.rollup_states(site, month, keys).await
    }

    async fn put_rollups(
        &self,
        site: &SiteId,
        month: Date,
        states: Vec<rollups::RollupState>,
    ) -> Result<bool, StoreError> {
        self.inner.put_rollups(site, month, states).await
    }

    async fn imported(
        &self,
        site: &SiteId,
        table: tally::store::imported::Table,
        from: Date,
        to: Date,
        by_day: bool,
    ) -> Result<Vec<tally::store::imported::ImportedRow>, StoreError> {
        self.inner.imported(site, table, from, to, by_day).await
    }
}

/// A cold read takes its stored months beside the index; a day unsealed between the two
/// (a late view) leaves those months unused, and the answer is the index's: the late view
/// counted once, as a read that starts after it answers.
pub(crate) async fn months_read_beside_the_index_yield_to_a_late_write(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let zone = SiteZone::utc();
    store
        .commit(morning_views(&[
            (1, 1, F1, "/a"),
            (2, 2, F2, "/b"),
            (3, 1, D1, "/a"),
            (4, 3, D2, "/c"),
        ]))
        .await
        .expect("commit");
    for day in [F1, F2, D1, D2] {
        seal(&*store, day).await;
    }
    let roller = Analytics::new(store.clone(), 0);
    assert_eq!(roller.roll_up(&site(), &zone, D2).await.expect("roll"), 2);
    let (from, to) = (date(2026, 2, 1), date(2026, 3, 31));
    let (before, days) = answers(&store, from, to).await;
    assert_eq!(days, 0, "both months from their stored states");

    let racing = LateWrite::new(&store, Late::Views(morning_views(&[(5, 4, F2, "/d")])));
    let analytics = Analytics::new(racing.clone(), 64 << 20);
    let raced = analytics
        .answer(&site(), &zone, from, to, &questions())
        .await
        .expect("answers");
    assert!(
        racing.late.lock().await.is_none(),
        "the months were read beside the index"
    );
    let (after, days) = answers(&store, from, to).await;
    assert_eq!(days, questions().len() as u64, "F2 is open: counted");
    assert_eq!(
        after[0].rows[0].metrics[..3],
        [Value::Int(4), Value::Int(5), Value::Int(5)],
        "4 visitors, 5 visits, 5 page views"
    );
    assert_ne!(after, before);
    assert_eq!(
        raced, after,
        "the late view once, February not from its stale state"
    );

    // A day sealed in between: February's state (rolled while F2 was open) lacks it, and
    // must not stand for February once the index has F2 sealed.
    seal(&*store, F2).await;
    store
        .commit(morning_views(&[(6, 5, F1, "/e")]))
        .await
        .expect("late view");
    seal(&*store, F1).await;
    store
        .commit(morning_views(&[(7, 6, F2, "/f")]))
        .await
        .expect("late view");
    assert_eq!(roller.roll_up(&site(), &zone, D2).await.expect("roll"), 1);
    let racing = LateWrite::new(&store, Late::Seal(F2));
    let analytics = Analytics::new(racing.clone(), 64 << 20);
    let raced = analytics
        .answer(&site(), &zone, from, to, &questions())
        .await
        .expect("answers");
    assert!(racing.late.lock().await.is_none());
    let (after, _) = answers(&store, from, to).await;
    assert_eq!(
        after[0].rows[0].metrics[..3],
        [Value::Int(6), Value::Int(7), Value::Int(7)],
        "6 visitors, 7 visits, 7 page views"
    );
    assert_eq!(raced, after, "F2, sealed in between, counted");
}
