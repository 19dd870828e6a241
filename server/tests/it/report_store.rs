//! The email-report part of the store ([`ReportStore`] and [`StatsReader::visits`]), checked
//! on every backend with the conformance suite's harnesses: schedules, the send lease (two
//! handles claiming the same periods at once: exactly one wins each), backoff, and visits
//! counted from raw events.

use std::sync::Arc;

use jiff::civil::date;
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, EventName, PagePath, SiteId, VisitorKey};
use tally::core::period::Every;
use tally::core::record::{Record, Source};
use tally::store::{ReportSchedule, SendKey, Store, Visits};

use crate::store_conformance::Harness;

fn site() -> SiteId {
    SiteId::parse("s").expect("site")
}

fn schedule(recipient: &str, every: Every) -> ReportSchedule {
    ReportSchedule {
        site: site(),
        recipient: recipient.into(),
        every,
        created_ms: 1_000,
    }
}

fn key(period: jiff::civil::Date) -> SendKey {
    SendKey {
        site: site(),
        recipient: "ann@example.com".into(),
        every: Every::Week,
        period,
    }
}

async fn schedules_round_trip(db: &impl Harness) {
    let store = db.handle(None);
    assert!(
        store
            .add_report(&schedule("ann@example.com", Every::Week))
            .await
            .expect("add")
    );
    assert!(
        !store
            .add_report(&schedule("ann@example.com", Every::Week))
            .await
            .expect("again")
    );
    assert!(
        store
            .add_report(&schedule("ann@example.com", Every::Month))
            .await
            .expect("add")
    );
    let mut other = schedule("bob@example.com", Every::Week);
    other.site = SiteId::parse("t").expect("site");
    assert!(store.add_report(&other).await.expect("add"));
    let of_s = store.list_reports(Some(&site())).await.expect("list");
    assert_eq!(
        of_s,
        [
            schedule("ann@example.com", Every::Month),
            schedule("ann@example.com", Every::Week)
        ]
    );
    assert_eq!(store.list_reports(None).await.expect("list").len(), 3);
    let again = db.handle(None);
    assert!(
        again
            .remove_report(&site(), "ann@example.com", Every::Week)
            .await
            .expect("rm")
    );
    assert!(
        !again
            .remove_report(&site(), "ann@example.com", Every::Week)
            .await
            .expect("rm")
    );
    assert_eq!(
        store.list_reports(Some(&site())).await.expect("list").len(),
        1
    );
}

async fn a_lease_is_held_until_it_expires_and_a_sent_period_never_returns(db: &impl Harness) {
    let (a, b) = (db.handle(None), db.handle(None));
    let k = key(date(2026, 11, 23));
    assert_eq!(
        a.claim_send(&k, "a", 1_000, 61_000).await.expect("claim"),
        Some(0)
    );
    assert_eq!(
        b.claim_send(&k, "b", 2_000, 62_000).await.expect("claim"),
        None
    );
    assert_eq!(
        a.claim_send(&k, "a", 3_000, 63_000).await.expect("claim"),
        None
    );
    // The holder died: its lease expires and another collector takes the send over.
    assert_eq!(
        b.claim_send(&k, "b", 61_000, 121_000).await.expect("claim"),
        Some(0)
    );
    assert!(
        !a.mark_sent(&k, "a", 62_000).await.expect("mark"),
        "a lost the lease"
    );
    assert!(b.mark_sent(&k, "b", 62_000).await.expect("mark"));
    assert_eq!(
        a.claim_send(&k, "a", i64::MAX - 1, i64::MAX)
            .await
            .expect("claim"),
        None
    );
    // Another period is a send of its own.
    let next = key(date(2026, 11, 30));
    assert_eq!(
        a.claim_send(&next, "a", 70_000, 80_000)
            .await
            .expect("claim"),
        Some(0)
    );
}

async fn a_failed_send_waits_for_its_next_try(db: &impl Harness) {
    let store = db.handle(None);
    let k = key(date(2026, 11, 23));
    assert_eq!(
        store.claim_send(&k, "a", 0, 600_000).await.expect("claim"),
        Some(0)
    );
    assert_eq!(store.retries_waiting().await.expect("n"), 0);
    assert!(
        store
            .mark_failed(&k, "a", "451 try later", 60_000)
            .await
            .expect("fail")
    );
    assert_eq!(store.retries_waiting().await.expect("n"), 1);
    assert_eq!(
        store
            .claim_send(&k, "b", 59_999, 600_000)
            .await
            .expect("claim"),
        None
    );
    assert_eq!(
        store
            .claim_send(&k, "b", 60_000, 660_000)
            .await
            .expect("claim"),
        Some(1)
    );
    assert!(
        !store
            .mark_failed(&k, "a", "not the holder", 0)
            .await
            .expect("fail")
    );
    // Given up: never claimable again, and no longer waiting.
    assert!(
        store
            .mark_failed(&k, "b", "451 again", i64::MAX)
            .await
            .expect("fail")
    );
    assert_eq!(store.retries_waiting().await.expect("n"), 0);
    assert_eq!(
        store
            .claim_send(&k, "c", i64::MAX - 1, i64::MAX)
            .await
            .expect("claim"),
        None
    );
}

async fn two_handles_claiming_the_same_periods_at_once_one_wins_each(db: &impl Harness) {
    let (a, b) = (db.handle(None), db.handle(None));
    let periods: Vec<_> = (0..20)
        .map(|w| {
            date(2026, 1, 5)
                .checked_add(jiff::Span::new().weeks(w))
                .expect("day")
        })
        .collect();
    let race = |store: Arc<dyn Store>, holder: &'static str, periods: Vec<jiff::civil::Date>| {
        tokio::spawn(async move {
            let mut won = Vec::new();
            for p in periods {
                if store
                    .claim_send(&key(p), holder, 1_000, 600_000)
                    .await
                    .expect("claim")
                    .is_some()
                {
                    won.push(p);
                }
            }
            won
        })
    };
    let mut reversed = periods.clone();
    reversed.reverse();
    let (wa, wb) = (race(a, "a", periods.clone()), race(b, "b", reversed));
    let (wa, wb) = (wa.await.expect("a"), wb.await.expect("b"));
    for p in &periods {
        let wins = usize::from(wa.contains(p)) + usize::from(wb.contains(p));
        assert_eq!(wins, 1, "period {p}: {wa:?} / {wb:?}");
    }
}

fn view(n: u8, visitor: u8, source: Source, at: &str) -> Record {
    let at: jiff::Timestamp = at.parse().expect("ts");
    Record {
        event_id: EventId::new_at(at, [n; 10]),
        site: site(),
        source,
        kind: HitKind::Pageview,
        page: PagePath::parse("/a").expect("page"),
        visitor: VisitorKey([visitor; 16]),
        at_ms: at.as_millisecond(),
        day: at.to_zoned(jiff::tz::TimeZone::UTC).date(),
        referrer: None,
        dims: Default::default(),
    }
}

async fn visits_are_page_views_with_gaps_of_at_most_30_minutes(db: &impl Harness) {
    let store = db.handle(None);
    let mut event = view(9, 1, Source::Web, "2026-04-01T10:20:00Z");
    event.kind = HitKind::Event {
        name: EventName::parse("signup").expect("name"),
        dedupe: None,
    };
    store
        .commit(vec![
            // Visitor 1: 10:00, 10:30 (a gap of exactly 30 min: same visit), 11:01 (new).
            view(1, 1, Source::Web, "2026-04-01T10:00:00Z"),
            view(2, 1, Source::Web, "2026-04-01T10:30:00Z"),
            view(3, 1, Source::Web, "2026-04-01T11:01:00Z"),
            // Visitor 2: one visit across midnight, on two days of the range.
            view(4, 2, Source::Web, "2026-04-01T23:50:00Z"),
            view(5, 2, Source::Web, "2026-04-02T00:10:00Z"),
            // A badge view: its own source.
            view(6, 3, Source::Badge, "2026-04-01T12:00:00Z"),
            // Outside the range, and a custom event: neither is a visit.
            view(7, 1, Source::Web, "2026-04-05T10:00:00Z"),
            event,
        ])
        .await
        .expect("commit");
    let v = store
        .visits(&site(), date(2026, 4, 1), date(2026, 4, 2))
        .await
        .expect("visits");
    assert_eq!(v, Visits { web: 3, badge: 1 });
    let one_day = store
        .visits(&site(), date(2026, 4, 2), date(2026, 4, 2))
        .await
        .expect("v");
    assert_eq!(one_day, Visits { web: 1, badge: 0 });
    let none = store
        .visits(
            &SiteId::parse("nobody").expect("id"),
            date(2026, 4, 1),
            date(2026, 4, 2),
        )
        .await
        .expect("visits");
    assert_eq!(none, Visits::default());
}

macro_rules! report_checks {
    ($($backend:ident => $harness:ty),* $(,)?) => {$(
        mod $backend {
            report_checks!(@checks $harness;
                schedules_round_trip,
                a_lease_is_held_until_it_expires_and_a_sent_period_never_returns,
                a_failed_send_waits_for_its_next_try,
                two_handles_claiming_the_same_periods_at_once_one_wins_each,
                visits_are_page_views_with_gaps_of_at_most_30_minutes,
            );
        }
    )*};
    (@checks $harness:ty; $($check:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $check() {
            if !<$harness as crate::store_conformance::Harness>::available() {
                return;
            }
            let db = <$harness as crate::store_conformance::Harness>::fresh();
            super::$check(&db).await;
        }
    )*};
}

report_checks! {
    sqlite => crate::store_conformance::sqlite_backend::SqliteDb,
    postgres => crate::store_conformance::postgres::PgDb,
}
