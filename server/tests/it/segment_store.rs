//! The analytics part of the store ([`SegmentSource`] and the [`Analytics`] over it), checked
//! on every backend with the conformance suite's harnesses: dimension tuples and engagement
//! stored with the events, open days read from raw events, seals, imports that unseal, the
//! tuple cap, and answers that stay exact across sealed and open days.

use std::sync::Arc;

use jiff::civil::{Date, date};
use tally::core::day::SiteZone;
use tally::core::dims::{AgentDims, SourceDims};
use tally::core::hit::HitKind;
use tally::core::ids::{EventId, PagePath, SiteId, VisitorKey};
use tally::core::query::{Dimension, Filter, Metric, Op, Query, Value, VisitDim};
use tally::core::record::{Dims, Outcome, Record, Source};
use tally::core::segment::{self, Events, Segment};
use tally::store::analytics::Analytics;
use tally::store::{DIM_CAP, ImportOptions, PartsWanted, SegmentIndex, Store, TEMP_NUMBERS};

use crate::rollups::{
    many_months_merge_as_they_are_counted, month_rollups_answer_exactly_and_never_go_stale,
    months_read_beside_the_index_yield_to_a_late_write, verify_recounts_rollups_and_repairs_them,
};
use crate::store_conformance::Harness;

pub(crate) fn site() -> SiteId {
    SiteId::parse("s").expect("site")
}

fn src(source: &str, channel: &str) -> String {
    SourceDims {
        source: source.into(),
        channel: channel.into(),
        ..SourceDims::default()
    }
    .encode()
}

fn agent(browser: &str, country: &str) -> Arc<str> {
    AgentDims {
        browser: browser.into(),
        country: country.into(),
        ..AgentDims::default()
    }
    .encode()
    .into()
}

/// A page view at `at` (UTC) of visitor `visitor` on `page`, with dimensions.
pub(crate) fn view(n: u16, visitor: u8, page: &str, at: &str, dims: (&str, &str, &str)) -> Record {
    let at: jiff::Timestamp = at.parse().expect("ts");
    let mut random = [0u8; 10];
    random[4..6].copy_from_slice(&n.to_be_bytes());
    Record {
        event_id: EventId::new_at(at, random),
        site: site(),
        source: Source::Web,
        kind: HitKind::Pageview,
        page: PagePath::parse(page).expect("page"),
        visitor: VisitorKey([visitor; 16]),
        at_ms: at.as_millisecond(),
        day: SiteZone::utc().day_of(at),
        referrer: None,
        dims: Dims {
            src: src(dims.0, dims.1),
            agent: agent(dims.2, "DE"),
        },
    }
}

pub(crate) fn engagement(of: &Record, engaged_ms: u32, scroll: Option<u8>) -> Record {
    Record {
        kind: HitKind::Engagement { engaged_ms, scroll },
        dims: Dims::default(),
        ..of.clone()
    }
}

pub(crate) const D1: Date = date(2026, 3, 2);
pub(crate) const D2: Date = date(2026, 3, 3);

pub(crate) fn day_start(day: Date) -> i64 {
    SiteZone::utc().span(day, day).0.as_millisecond()
}

/// The index of `from..=to` of `store`, and both decoded parts of each of its sealed days.
async fn read(store: &dyn Store, from: Date, to: Date) -> (SegmentIndex, Vec<(Segment, Events)>) {
    let index = store.segment_index(&site(), from, to).await.expect("index");
    let wanted = index
        .sealed
        .iter()
        .map(|&(day, version)| PartsWanted {
            day,
            version,
            visits: true,
            events: true,
        })
        .collect();
    let parts = store.segment_parts(&site(), wanted).await.expect("parts");
    assert_eq!(parts.len(), index.sealed.len(), "every sealed day is there");
    let decoded = parts
        .into_iter()
        .map(|p| {
            let seg = Segment::decode(p.visits.expect("visits")).expect("decodes");
            let events = Events::decode(p.events.expect("events"), &seg).expect("decodes");
            (seg, events)
        })
        .collect();
    (index, decoded)
}

async fn engagement_keeps_the_largest_values_and_tuples_are_stored(db: &impl Harness) {
    let store = db.handle(None);
    let v = view(
        1,
        1,
        "/a",
        "2026-03-02T10:00:00Z",
        ("Google", "Organic Search", "Firefox"),
    );
    let out = store
        .commit(vec![v.clone(), engagement(&v, 5_000, Some(40))])
        .await
        .expect("commit");
    assert_eq!(
        out,
        vec![Outcome::Accepted, Outcome::Accepted],
        "same batch"
    );
    let out = store
        .commit(vec![
            engagement(&v, 5_000, Some(40)),
            engagement(&v, 3_000, Some(90)),
            engagement(&v, 9_000, None),
        ])
        .await
        .expect("commit");
    assert_eq!(
        out,
        vec![Outcome::Duplicate, Outcome::Accepted, Outcome::Accepted],
        "a resend changes nothing; each larger value is kept"
    );
    let unknown = engagement(
        &view(99, 9, "/x", "2026-03-02T10:00:00Z", ("", "", "")),
        1,
        None,
    );
    assert_eq!(
        store.commit(vec![unknown]).await.expect("commit"),
        vec![Outcome::Duplicate],
        "no page view to report on"
    );
    let (input, _) = read(&*store, D1, D1).await;
    assert!(input.sealed.is_empty());
    let (day, events) = &input.open[0];
    assert_eq!(*day, D1);
    assert_eq!(events.len(), 1, "engagement reports are not events");
    let e = &events[0];
    assert_eq!((e.engaged_ms, e.scroll), (9_000, Some(90)));
    assert!(e.visitor >= TEMP_NUMBERS, "not numbered before the seal");
    let dict = store
        .dictionary(&site(), vec![e.page], vec![e.src, e.agent])
        .await
        .expect("dictionary");
    assert_eq!(dict.pages, vec![(e.page, "/a".to_owned())]);
    let values: Vec<&str> = dict.dims.iter().map(|(_, _, v)| v.as_str()).collect();
    assert!(
        values.contains(&src("Google", "Organic Search").as_str()),
        "{values:?}"
    );
    assert!(values.contains(&&*agent("Firefox", "DE")), "{values:?}");
}

async fn a_sealed_day_is_the_build_of_its_events(db: &impl Harness) {
    let store = db.handle(None);
    store
        .commit(vec![
            view(
                1,
                1,
                "/a",
                "2026-03-02T10:00:00Z",
                ("Google", "Organic Search", "Firefox"),
            ),
            view(
                2,
                1,
                "/b",
                "2026-03-02T10:05:00Z",
                ("", "Direct", "Firefox"),
            ),
            view(3, 2, "/a", "2026-03-02T11:00:00Z", ("", "Direct", "Chrome")),
            view(
                4,
                1,
                "/a",
                "2026-03-03T09:00:00Z",
                ("", "Direct", "Firefox"),
            ),
        ])
        .await
        .expect("commit");
    assert_eq!(
        store.unsealed_days(&site(), D2, 10).await.expect("days"),
        vec![D1, D2]
    );
    let (open, _) = read(&*store, D1, D1).await;
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    assert!(
        !store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal"),
        "once"
    );
    assert!(
        store
            .seal_day(&site(), D2, day_start(D2))
            .await
            .expect("seal")
    );
    assert!(
        store
            .unsealed_days(&site(), D2, 10)
            .await
            .expect("days")
            .is_empty()
    );
    let (input, segs) = read(&*store, D1, D2).await;
    assert!(input.open.is_empty());
    assert_ne!(input.sealed[0].1, input.sealed[1].1, "a version per seal");
    // The same visits and events as the open read, with stored numbers instead of read-only
    // ones.
    let (built, built_events) = segment::build(day_start(D1), open.open[0].1.clone());
    let (seg1, events1) = &segs[0];
    assert_eq!(
        seg1.visits.pageviews.to_vec(),
        built.visits.pageviews.to_vec()
    );
    assert_eq!(seg1.pages.to_vec(), built.pages.to_vec());
    assert_eq!(
        events1.pageviews.page.to_vec(),
        built_events.pageviews.page.to_vec()
    );
    assert_eq!(seg1.pageview_count, 3);
    assert_eq!(seg1.visit_count(), 2);
    assert!(seg1.visits.visitor.iter().all(|n| n < TEMP_NUMBERS));
    // Visitor 1 keeps one number on both days.
    let v1_day1 = seg1.visits.visitor.get(0);
    assert_eq!(segs[1].0.visits.visitor.to_vec(), vec![v1_day1]);
    // Asking for a version that is not stored gives nothing.
    let stale = store
        .segment_parts(
            &site(),
            vec![PartsWanted {
                day: D1,
                version: input.sealed[0].1 + 1_000,
                visits: true,
                events: false,
            }],
        )
        .await
        .expect("parts");
    assert!(stale.is_empty());
    // A second handle sees the same (numbers are stored, not per process).
    let other = db.handle(None);
    let (input2, segs2) = read(&*other, D1, D2).await;
    assert_eq!(input2.sealed, input.sealed);
    assert_eq!(segs2, segs);
}

async fn an_import_into_a_sealed_day_unseals_it(db: &impl Harness) {
    let store = db.handle(None);
    store
        .commit(vec![view(
            1,
            1,
            "/a",
            "2026-03-02T10:00:00Z",
            ("", "Direct", "Firefox"),
        )])
        .await
        .expect("commit");
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    let (before, _) = read(&*store, D1, D1).await;
    let out = store
        .import_events(
            vec![view(
                7,
                3,
                "/c",
                "2026-03-02T18:00:00Z",
                ("", "Direct", "Chrome"),
            )],
            ImportOptions::default(),
        )
        .await
        .expect("import");
    assert_eq!(out, vec![Outcome::Accepted]);
    let (after, _) = read(&*store, D1, D1).await;
    assert!(after.sealed.is_empty(), "unsealed");
    assert_eq!(after.open[0].1.len(), 2);
    assert_eq!(
        store.unsealed_days(&site(), D1, 10).await.expect("days"),
        vec![D1]
    );
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    let (resealed, segs) = read(&*store, D1, D1).await;
    assert_ne!(resealed.sealed[0].1, before.sealed[0].1, "a new version");
    assert_eq!(segs[0].0.visit_count(), 2);
}

async fn tuples_beyond_the_cap_count_as_other(db: &impl Harness) {
    let store = db.handle(None);
    let n = DIM_CAP as usize + 3;
    let records: Vec<Record> = (0..n)
        .map(|i| {
            let mut r = view(
                i as u16,
                (i % 200) as u8,
                "/a",
                "2026-03-02T10:00:00Z",
                ("", "", ""),
            );
            r.dims.src = src(&format!("campaign-{i}"), "Referral");
            r
        })
        .collect();
    store.commit(records).await.expect("commit");
    let (input, _) = read(&*store, D1, D1).await;
    let mut srcs: Vec<u32> = input.open[0].1.iter().map(|e| e.src).collect();
    srcs.sort_unstable();
    srcs.dedup();
    assert_eq!(
        srcs.len(),
        DIM_CAP as usize + 1,
        "the cap, and the one (other) tuple"
    );
    let dict = store.dictionary(&site(), vec![], srcs).await.expect("dict");
    assert!(
        dict.dims
            .iter()
            .any(|(_, _, v)| v == tally::store::OTHER_DIM)
    );
}

pub(crate) fn q(metrics: &[Metric], dims: &[Dimension], filters: Vec<Filter>) -> Query {
    Query {
        metrics: metrics.to_vec(),
        dimensions: dims.to_vec(),
        filters,
        order_by: vec![],
        limit: 100,
        offset: 0,
    }
}

async fn answers_stay_exact_across_sealed_and_open_days(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let a = view(
        1,
        1,
        "/a",
        "2026-03-02T10:00:00Z",
        ("Google", "Organic Search", "Firefox"),
    );
    store
        .commit(vec![
            a.clone(),
            engagement(&a, 30_000, Some(70)),
            view(2, 2, "/a", "2026-03-02T11:00:00Z", ("", "Direct", "Chrome")),
            view(
                3,
                1,
                "/b",
                "2026-03-03T09:00:00Z",
                ("", "Direct", "Firefox"),
            ),
            view(
                4,
                3,
                "/a",
                "2026-03-03T09:30:00Z",
                ("Google", "Organic Search", "Chrome"),
            ),
        ])
        .await
        .expect("commit");
    let analytics = Analytics::new(store.clone(), 64 << 20);
    let zone = SiteZone::utc();
    let questions = [
        q(
            &[Metric::Visitors, Metric::Visits, Metric::Pageviews],
            &[],
            vec![],
        ),
        q(
            &[Metric::Visitors],
            &[Dimension::Visit(VisitDim::Browser)],
            vec![],
        ),
        q(
            &[Metric::Visitors, Metric::TimeOnPage, Metric::ScrollDepth],
            &[],
            vec![
                Filter {
                    dimension: Dimension::Page,
                    op: Op::Is,
                    values: vec!["/a".into()],
                    case_sensitive: true,
                },
                Filter {
                    dimension: Dimension::Visit(VisitDim::Source),
                    op: Op::Is,
                    values: vec!["Google".into()],
                    case_sensitive: true,
                },
            ],
        ),
    ];
    let open = analytics
        .answer(&site(), &zone, D1, D2, &questions)
        .await
        .expect("answers");
    assert_eq!(
        open[0].rows[0].metrics,
        vec![Value::Int(3), Value::Int(4), Value::Int(4)],
        "visitor 1 on both days counts once"
    );
    assert_eq!(
        open[2].rows[0].metrics,
        vec![Value::Int(2), Value::Int(30), Value::Int(70)]
    );
    // Seal D1: the same answers from the stored segment (and the kept one on a second read).
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    for _ in 0..2 {
        let sealed = analytics
            .answer(&site(), &zone, D1, D2, &questions)
            .await
            .expect("answers");
        assert_eq!(sealed, open);
    }
    // An import into the sealed day shows at once.
    store
        .import_events(
            vec![view(
                9,
                4,
                "/c",
                "2026-03-02T20:00:00Z",
                ("", "Direct", "Safari"),
            )],
            ImportOptions::default(),
        )
        .await
        .expect("import");
    let after = analytics
        .answer(&site(), &zone, D1, D2, &questions[..1])
        .await
        .expect("answers");
    assert_eq!(
        after[0].rows[0].metrics,
        vec![Value::Int(4), Value::Int(5), Value::Int(5)]
    );
    // Sealed again (a new version): counted anew, then kept; a hit on the open day after
    // that shows at once beside the kept state of the sealed day.
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    let resealed = analytics
        .answer(&site(), &zone, D1, D2, &questions[..1])
        .await
        .expect("answers");
    assert_eq!(resealed, after);
    store
        .commit(vec![view(
            10,
            1,
            "/c",
            "2026-03-03T23:00:00Z",
            ("", "Direct", "Firefox"),
        )])
        .await
        .expect("commit");
    let later = analytics
        .answer(&site(), &zone, D1, D2, &questions[..1])
        .await
        .expect("answers");
    assert_eq!(
        later[0].rows[0].metrics,
        vec![Value::Int(4), Value::Int(6), Value::Int(6)],
        "visitor 1 is counted once over the kept day and the open one"
    );
}

/// Direct Firefox page views at 10:0n on their day: (n, visitor, day, page).
pub(crate) fn morning_views(views: &[(u16, u8, Date, &str)]) -> Vec<Record> {
    views
        .iter()
        .map(|&(n, visitor, day, page)| {
            let at = format!("{day}T10:0{n}:00Z");
            view(n, visitor, page, &at, ("", "Direct", "Firefox"))
        })
        .collect()
}

pub(crate) async fn seal(store: &dyn Store, day: Date) {
    assert!(
        store
            .seal_day(&site(), day, day_start(day))
            .await
            .expect("seal")
    );
}

async fn concurrent_readers_of_one_question_count_it_once(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let records = morning_views(&[
        (1, 1, D1, "/a"),
        (2, 2, D1, "/b"),
        (3, 1, D2, "/a"),
        (4, 2, D2, "/c"),
    ]);
    store.commit(records).await.expect("commit");
    for day in [D1, D2] {
        seal(&*store, day).await;
    }
    let analytics = Analytics::new(store.clone(), 64 << 20);
    let zone = SiteZone::utc();
    let page = |limit| Query {
        limit,
        ..q(
            &[Metric::Visitors, Metric::Pageviews],
            &[Dimension::Page],
            vec![],
        )
    };
    let questions = [
        q(&[Metric::Visitors, Metric::Visits], &[], vec![]),
        page(100),
    ];
    // Eight readers at once: one counts each state, the others wait and take it.
    let id = site();
    let reads = (0..8).map(|_| analytics.answer(&id, &zone, D1, D2, &questions));
    let answers = futures_util::future::join_all(reads).await;
    let first = answers[0].as_ref().expect("answers").clone();
    assert!(answers.iter().all(|a| a.as_ref().ok() == Some(&first)));
    assert_eq!(first[0].rows[0].metrics, vec![Value::Int(2), Value::Int(4)]);
    assert_eq!(first[1].rows.len(), 3, "pages /a, /b, /c");
    assert_eq!(analytics.states_counted(), 2);
    // Another page of the same breakdown is the same state.
    let next = analytics
        .answer(&site(), &zone, D1, D2, &[page(1)])
        .await
        .expect("answers");
    assert_eq!(next[0].rows, first[1].rows[..1]);
    assert_eq!(analytics.states_counted(), 2);
}

async fn a_kept_state_grows_by_the_days_sealed_since(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let records = morning_views(&[
        (1, 1, D1, "/a"),
        (2, 2, D1, "/b"),
        (3, 1, D2, "/a"),
        (4, 3, D2, "/c"),
    ]);
    store.commit(records).await.expect("commit");
    seal(&*store, D1).await;
    let analytics = Analytics::new(store.clone(), 64 << 20);
    let zone = SiteZone::utc();
    let questions = [
        q(&[Metric::Visitors, Metric::Visits], &[], vec![]),
        q(&[Metric::Visitors], &[Dimension::Page], vec![]),
        q(
            &[Metric::Visitors],
            &[Dimension::Time(tally::core::query::Grain::Week)],
            vec![],
        ),
    ];
    let before = analytics
        .answer(&site(), &zone, D1, D2, &questions)
        .await
        .expect("answers");
    assert_eq!(
        before[0].rows[0].metrics,
        vec![Value::Int(3), Value::Int(4)]
    );
    assert_eq!(analytics.days_counted(), 3, "D1 for each question");
    // D2 sealed: each state grows by D2 alone, and answers the same.
    seal(&*store, D2).await;
    let after = analytics
        .answer(&site(), &zone, D1, D2, &questions)
        .await
        .expect("answers");
    assert_eq!(after, before);
    assert_eq!(
        analytics.days_counted(),
        6,
        "then D2 for each, not D1 and D2 again"
    );
}

/// Kept question states and kept segment parts share one budget: a state kept evicts
/// parts, so both together stay within it, and answers stay those of a roomy cache.
async fn kept_states_and_parts_share_one_budget(db: &impl Harness) {
    let store: Arc<dyn Store> = db.handle(None);
    let days = [D1, D2, date(2026, 3, 4)];
    let mut records = Vec::new();
    for (d, day) in days.iter().enumerate() {
        // Many views of few visitors and pages: parts grow with views, states do not.
        for i in 0..1_200u16 {
            let at = format!("{day}T{:02}:{:02}:00Z", i / 60, i % 60);
            let visitor = u8::try_from((i * 7 + d as u16 * 13) % 60).expect("a byte");
            let page = format!("/p{}", (i * 3 + d as u16) % 25);
            records.push(view(i, visitor, &page, &at, ("", "Direct", "Firefox")));
        }
    }
    store.commit(records).await.expect("commit");
    for day in days {
        seal(&*store, day).await;
    }
    let zone = SiteZone::utc();
    let (from, to) = (days[0], days[2]);
    let questions = [
        q(&[Metric::Visitors, Metric::Visits], &[], vec![]),
        q(
            &[Metric::Visitors, Metric::Pageviews],
            &[Dimension::Page],
            vec![],
        ),
    ];
    // What a roomy cache keeps: every part and both states.
    let roomy = Analytics::new(store.clone(), 64 << 20);
    let want = roomy
        .answer(&site(), &zone, from, to, &questions)
        .await
        .expect("answers");
    let (parts, states, _) = roomy.kept_bytes();
    // A budget the states fit (within half, each within a quarter) but not beside the parts.
    let budget = 4 * states;
    assert!(
        states > 0 && parts > budget - states,
        "parts {parts}, states {states}"
    );
    let tight = Analytics::new(store.clone(), budget);
    for _ in 0..2 {
        let got = tight
            .answer(&site(), &zone, from, to, &questions)
            .await
            .expect("answers");
        assert_eq!(got, want);
        let (kept_parts, kept_states, _) = tight.kept_bytes();
        assert_eq!(kept_states, states, "both states kept");
        assert!(
            kept_parts + kept_states <= budget,
            "{kept_parts} + {kept_states} bytes kept, budget {budget}"
        );
    }
    assert_eq!(
        tight.states_counted(),
        2,
        "the second read used the kept states"
    );
    // Parts read while the states are kept (a month's rollup keeps no state) fit what the
    // states leave.
    let index = store.segment_index(&site(), from, to).await.expect("index");
    let month = tight
        .count_month(&site(), &zone, date(2026, 3, 1), &index.sealed)
        .await
        .expect("counted");
    assert!(month.is_some(), "the days stayed sealed");
    let (kept_parts, kept_states, _) = tight.kept_bytes();
    assert_eq!(kept_states, states);
    assert!(
        kept_parts + kept_states <= budget,
        "{kept_parts} + {kept_states} bytes kept after the month, budget {budget}"
    );
}

/// A reader keeps the keys it found without a number (`store::numbers`); a number another
/// handle gives since (a seal by another collector) is seen at its next read.
async fn a_number_given_since_a_read_is_seen_at_the_next(db: &impl Harness) {
    let reader = db.handle(None);
    let sealer = db.handle(None);
    let d0 = date(2026, 3, 1);
    let records = morning_views(&[
        (1, 1, D1, "/a"),
        (3, 1, D2, "/a"),
        (4, 2, D2, "/c"),
        (5, 9, d0, "/a"),
    ]);
    reader.commit(records).await.expect("commit");
    // Some number is stored before the reader looks: the generation is not new.
    seal(&*sealer, d0).await;
    let at = |n: u8, day: Date| day_start(day) + (10 * 60 + i64::from(n)) * 60_000;
    let number = |index: &SegmentIndex, n: u8, day: Date| {
        index
            .open
            .iter()
            .flat_map(|(_, events)| events)
            .find(|e| e.at_ms == at(n, day))
            .map(|e| e.visitor)
            .expect("the view is open")
    };
    let zone = SiteZone::utc();
    let visitors = q(&[Metric::Visitors], &[], vec![]);
    // Both days open: no visitor has a number yet; the reader keeps that, twice.
    for _ in 0..2 {
        let index = reader.segment_index(&site(), D1, D2).await.expect("index");
        assert!(number(&index, 1, D1) >= TEMP_NUMBERS);
        assert_eq!(number(&index, 1, D1), number(&index, 3, D2), "one visitor");
    }
    // Another handle seals D1: visitor 1 has a number now, visitor 2 still none.
    seal(&*sealer, D1).await;
    let index = reader.segment_index(&site(), D2, D2).await.expect("index");
    assert!(
        number(&index, 3, D2) < TEMP_NUMBERS,
        "visitor 1's stored number"
    );
    assert!(number(&index, 4, D2) >= TEMP_NUMBERS);
    let analytics = Analytics::new(reader.clone(), 64 << 20);
    for _ in 0..2 {
        let answer = analytics
            .answer(&site(), &zone, D1, D2, std::slice::from_ref(&visitors))
            .await
            .expect("answers");
        assert_eq!(answer[0].rows[0].metrics, vec![Value::Int(2)], "not 3");
    }
}

async fn verify_recounts_segments_and_repairs_them(db: &impl Harness) {
    let store = db.handle(None);
    store
        .commit(vec![
            view(
                1,
                1,
                "/a",
                "2026-03-02T10:00:00Z",
                ("", "Direct", "Firefox"),
            ),
            view(2, 2, "/b", "2026-03-02T11:00:00Z", ("", "Direct", "Chrome")),
        ])
        .await
        .expect("commit");
    assert!(
        store
            .seal_day(&site(), D1, day_start(D1))
            .await
            .expect("seal")
    );
    let clean = store.verify(false).await.expect("verify");
    assert!(clean.drift.is_empty(), "{:?}", clean.drift);
    let plain = db.handle(None);
    let before = plain.verify(false).await.expect("verify").checked;
    db.tamper(crate::store_conformance::Tamper::TruncateSegments);
    let found = store.verify(false).await.expect("verify");
    assert_eq!(found.checked, before);
    assert_eq!(
        found
            .drift
            .iter()
            .map(|d| d.key.as_str())
            .collect::<Vec<_>>(),
        vec!["s/segment/2026-03-02"]
    );
    assert_eq!(
        found.drift[0].recounted,
        (2, 2),
        "visits and page views of the rebuild"
    );
    let repaired = store.verify(true).await.expect("repair");
    assert!(repaired.repaired);
    assert!(store.verify(false).await.expect("verify").drift.is_empty());
    // The repaired segment answers like the original.
    let (_, segs) = read(&*store, D1, D1).await;
    assert_eq!(segs[0].0.visit_count(), 2);
}

macro_rules! segment_checks {
    ($($backend:ident => $harness:ty),* $(,)?) => {$(
        mod $backend {
            segment_checks!(@checks $harness;
                engagement_keeps_the_largest_values_and_tuples_are_stored,
                a_sealed_day_is_the_build_of_its_events,
                an_import_into_a_sealed_day_unseals_it,
                tuples_beyond_the_cap_count_as_other,
                answers_stay_exact_across_sealed_and_open_days,
                verify_recounts_segments_and_repairs_them,
                concurrent_readers_of_one_question_count_it_once,
                kept_states_and_parts_share_one_budget,
                a_kept_state_grows_by_the_days_sealed_since,
                a_number_given_since_a_read_is_seen_at_the_next,
                month_rollups_answer_exactly_and_never_go_stale,
                many_months_merge_as_they_are_counted,
                months_read_beside_the_index_yield_to_a_late_write,
                verify_recounts_rollups_and_repairs_them,
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

segment_checks! {
    sqlite => crate::store_conformance::sqlite_backend::SqliteDb,
    postgres => crate::store_conformance::postgres::PgDb,
}
