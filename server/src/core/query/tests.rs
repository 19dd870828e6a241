//! The metric definitions, held against hand-made days.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::civil::{Date, date};

use super::*;
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::segment::{DayEvent, Events, Segment, build};

const MIN: i64 = 60_000;

struct Dict {
    pages: HashMap<u32, Arc<str>>,
    srcs: HashMap<u32, SourceDims>,
    agents: HashMap<u32, AgentDims>,
}

impl Dictionary for Dict {
    fn page(&self, id: u32) -> Option<&Arc<str>> {
        self.pages.get(&id)
    }
    fn source(&self, id: u32) -> Option<&SourceDims> {
        self.srcs.get(&id)
    }
    fn agent(&self, id: u32) -> Option<&AgentDims> {
        self.agents.get(&id)
    }
}

fn dict() -> Dict {
    let src = |source: &str, channel: &str, campaign: &str| SourceDims {
        source: source.into(),
        channel: channel.into(),
        utm_campaign: campaign.into(),
        ..SourceDims::default()
    };
    let agent = |browser: &str, country: &str, device: &str| AgentDims {
        browser: browser.into(),
        country: country.into(),
        device: device.into(),
        ..AgentDims::default()
    };
    Dict {
        pages: [(1, "/"), (2, "/pricing"), (3, "/blog/a")]
            .into_iter()
            .map(|(i, p)| (i, p.into()))
            .collect(),
        srcs: [
            (1, src("", "Direct", "")),
            (2, src("Hacker News", "Organic Social", "")),
            (3, src("Google", "Organic Search", "spring")),
        ]
        .into_iter()
        .collect(),
        agents: [
            (1, agent("Firefox", "DE", "Desktop")),
            (2, agent("Chrome", "DE", "Mobile")),
            (3, agent("Chrome", "US", "Desktop")),
        ]
        .into_iter()
        .collect(),
    }
}

fn ev(visitor: u32, at_min: i64, page: u32, src: u32, agent: u32) -> DayEvent {
    DayEvent {
        visitor,
        at_ms: at_min * MIN,
        id: [0; 16],
        name: None,
        page,
        src,
        agent,
        engaged_ms: 0,
        scroll: None,
    }
}

fn custom(visitor: u32, at_min: i64, page: u32, name: &str) -> DayEvent {
    DayEvent {
        name: Some(name.into()),
        ..ev(visitor, at_min, page, 1, 1)
    }
}

const DAY: Date = date(2026, 3, 2);

/// Visitor 1: Hacker News on Firefox/DE, views / then /pricing (one visit), comes back 2 h
/// later on /blog/a (a bounce). Visitor 2: Google on Chrome/DE mobile, one page view of
/// /pricing and a `signup` event there (not a bounce). Visitor 3: direct on Chrome/US,
/// one page view of / (a bounce).
fn day() -> (Segment, Events) {
    let mut pricing = ev(1, 5, 2, 2, 1);
    pricing.engaged_ms = 40_000;
    pricing.scroll = Some(80);
    let mut v2 = ev(2, 10, 2, 3, 2);
    v2.engaged_ms = 20_000;
    v2.scroll = Some(40);
    build(
        0,
        vec![
            ev(1, 0, 1, 2, 1),
            pricing,
            ev(1, 125, 3, 1, 1),
            v2,
            custom(2, 11, 2, "signup"),
            ev(3, 30, 1, 1, 3),
        ],
    )
}

/// The day after [`DAY`] (a Tuesday).
const DAY2: Date = date(2026, 3, 3);

/// [`DAY2`]: visitor 1 again, and visitor 9, one page view each on /.
fn day2() -> (Segment, Events) {
    build(
        86_400_000,
        vec![ev(1, 1440 + 3, 1, 1, 1), ev(9, 1440 + 4, 1, 1, 1)],
    )
}

fn ask(metrics: &[Metric], dims: &[Dimension], filters: Vec<Filter>) -> Answer {
    let (seg, events) = day();
    let q = Query {
        metrics: metrics.to_vec(),
        dimensions: dims.to_vec(),
        filters,
        order_by: Vec::new(),
        limit: 100,
        offset: 0,
    };
    run(
        &q,
        DAY,
        DAY,
        &SiteZone::utc(),
        &[(DAY, &seg, Some(&events))],
        &dict(),
    )
    .expect("answers")
}

fn is(dimension: Dimension, value: &str) -> Filter {
    Filter {
        dimension,
        op: Op::Is,
        values: vec![value.into()],
        case_sensitive: true,
    }
}

fn ints(row: &Row) -> Vec<u64> {
    row.metrics
        .iter()
        .map(|v| match v {
            Value::Int(n) => *n,
            Value::Float(x) => *x as u64,
            Value::Null => u64::MAX,
        })
        .collect()
}

#[test]
fn totals_follow_the_definitions() {
    use Metric::*;
    let a = ask(
        &[
            Visitors,
            Visits,
            Pageviews,
            Events,
            BounceRate,
            VisitDuration,
            ViewsPerVisit,
        ],
        &[],
        vec![],
    );
    assert_eq!(a.rows.len(), 1);
    // 4 visits: v1 (2 views, 5 min), v1 again (bounce), v2 (view + event: not a bounce), v3
    // (bounce). Duration: (300 + 0 + 60 + 0) / 4 = 90 s. Views per visit: 5 / 4 = 1.25.
    assert_eq!(
        a.rows[0].metrics[..6],
        [
            Value::Int(3),
            Value::Int(4),
            Value::Int(5),
            Value::Int(6),
            Value::Float(50.0),
            Value::Int(90),
        ]
    );
    assert_eq!(a.rows[0].metrics[6], Value::Float(1.25));
}

#[test]
fn breakdowns_by_visit_dimensions_count_visitors_once_per_row() {
    let a = ask(
        &[Metric::Visitors, Metric::Visits],
        &[Dimension::Visit(VisitDim::Browser)],
        vec![],
    );
    let got: Vec<(String, Vec<u64>)> = a
        .rows
        .iter()
        .map(|r| (r.dimensions[0].clone(), ints(r)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("Chrome".to_owned(), vec![2, 2]),
            ("Firefox".to_owned(), vec![1, 2]),
        ]
    );
    let a = ask(
        &[Metric::Visits],
        &[Dimension::Visit(VisitDim::Source)],
        vec![],
    );
    let labels: Vec<&str> = a.rows.iter().map(|r| r.dimensions[0].as_str()).collect();
    assert!(labels.contains(&"Direct / None"), "{labels:?}");
}

#[test]
fn filters_combine_with_and_across_dimensions() {
    let de_chrome = ask(
        &[Metric::Visitors, Metric::Pageviews],
        &[],
        vec![
            is(Dimension::Visit(VisitDim::Country), "DE"),
            is(Dimension::Visit(VisitDim::Browser), "Chrome"),
        ],
    );
    assert_eq!(ints(&de_chrome.rows[0]), vec![1, 1]);
    let not_de = ask(
        &[Metric::Visitors],
        &[],
        vec![Filter {
            op: Op::IsNot,
            ..is(Dimension::Visit(VisitDim::Country), "DE")
        }],
    );
    assert_eq!(ints(&not_de.rows[0]), vec![1]);
    let contains = ask(
        &[Metric::Visits],
        &[],
        vec![Filter {
            op: Op::Contains,
            case_sensitive: false,
            ..is(Dimension::Visit(VisitDim::Source), "hacker")
        }],
    );
    assert_eq!(
        ints(&contains.rows[0]),
        vec![1],
        "the first visit only: the second is direct"
    );
}

#[test]
fn event_filters_keep_visits_with_a_matching_event() {
    use Metric::*;
    let a = ask(
        &[Visitors, Visits, Pageviews, BounceRate],
        &[],
        vec![is(Dimension::Page, "/pricing")],
    );
    // Visits with a /pricing view: v1's first and v2's; page views of /pricing: 2. Bounce rate
    // counts visits that entered on /pricing: v2 only, not a bounce.
    assert_eq!(ints(&a.rows[0]), vec![2, 2, 2, 0]);
    let signups = ask(
        &[Visitors, Events],
        &[],
        vec![is(Dimension::Name, "signup")],
    );
    assert_eq!(ints(&signups.rows[0]), vec![1, 1]);
    let views = ask(&[Events], &[], vec![is(Dimension::Name, "pageview")]);
    assert_eq!(ints(&views.rows[0]), vec![5]);
}

#[test]
fn page_breakdowns_carry_engagement_and_entry_based_bounces() {
    use Metric::*;
    let a = ask(
        &[
            Visitors,
            Visits,
            Pageviews,
            BounceRate,
            TimeOnPage,
            ScrollDepth,
        ],
        &[Dimension::Page],
        vec![],
    );
    let pricing = a
        .rows
        .iter()
        .find(|r| r.dimensions[0] == "/pricing")
        .expect("row");
    // Two visits viewed it; (40 s + 20 s) / 2 visits = 30 s; scroll (80 + 40) / 2 = 60.
    // Only v2 entered on it, not a bounce.
    assert_eq!(
        pricing.metrics,
        vec![
            Value::Int(2),
            Value::Int(2),
            Value::Int(2),
            Value::Float(0.0),
            Value::Int(30),
            Value::Int(60),
        ]
    );
    let home = a.rows.iter().find(|r| r.dimensions[0] == "/").expect("row");
    // Entered twice (v1, v3): v1 went on, v3 bounced → 50 %; no engagement → null.
    assert_eq!(home.metrics[3], Value::Float(50.0));
    assert_eq!(home.metrics[4], Value::Null);
}

#[test]
fn invalid_combinations_are_refused_with_a_reason() {
    let (seg, events) = day();
    let one = [(DAY, &seg, Some(&events))];
    let q = Query {
        metrics: vec![Metric::TimeOnPage],
        dimensions: vec![],
        filters: vec![],
        order_by: vec![],
        limit: 10,
        offset: 0,
    };
    let err = run(&q, DAY, DAY, &SiteZone::utc(), &one, &dict()).expect_err("refused");
    assert!(err.0.contains("event:page"), "{err}");
    let q = Query {
        metrics: vec![Metric::BounceRate],
        dimensions: vec![Dimension::Name],
        ..q
    };
    assert!(run(&q, DAY, DAY, &SiteZone::utc(), &one, &dict()).is_err());
}

#[test]
fn distinct_visitors_hold_across_days_and_time_rows_fill_in_order() {
    let (day2, seg1, seg2) = (DAY2, day(), day2());
    let q = Query {
        metrics: vec![Metric::Visitors],
        dimensions: vec![],
        filters: vec![],
        order_by: vec![],
        limit: 10,
        offset: 0,
    };
    let segs = [
        (DAY, &seg1.0, Some(&seg1.1)),
        (day2, &seg2.0, Some(&seg2.1)),
    ];
    let a = run(&q, DAY, day2, &SiteZone::utc(), &segs, &dict()).expect("answers");
    assert_eq!(
        a.rows[0].metrics,
        vec![Value::Int(4)],
        "visitor 1 came both days"
    );
    let q = Query {
        dimensions: vec![Dimension::Time(Grain::Day)],
        ..q
    };
    let a = run(&q, DAY, day2, &SiteZone::utc(), &segs, &dict()).expect("answers");
    let rows: Vec<(&str, Value)> = a
        .rows
        .iter()
        .map(|r| (r.dimensions[0].as_str(), r.metrics[0]))
        .collect();
    assert_eq!(
        rows,
        vec![("2026-03-02", Value::Int(3)), ("2026-03-03", Value::Int(2))]
    );
    assert_eq!(a.time_labels, vec!["2026-03-02", "2026-03-03"]);
}

#[test]
fn hours_are_local_and_pagination_counts_all_rows() {
    let zone = SiteZone::parse("Europe/Berlin").expect("zone");
    // Local midnight in Berlin (winter, UTC+1) is 23:00 UTC the day before.
    let start = -3_600_000;
    let (seg, events) = build(start, vec![ev(1, 0, 1, 1, 1), ev(2, 61, 1, 1, 1)]);
    let q = Query {
        metrics: vec![Metric::Pageviews],
        dimensions: vec![Dimension::Time(Grain::Hour)],
        filters: vec![],
        order_by: vec![],
        limit: 1,
        offset: 1,
    };
    let day = date(1970, 1, 1);
    let a = run(&q, day, day, &zone, &[(day, &seg, Some(&events))], &dict()).expect("answers");
    assert_eq!(a.total_rows, 2);
    assert_eq!(a.rows[0].dimensions, vec!["1970-01-01 02:00:00".to_owned()]);
}

#[test]
fn extras_add_their_sums_and_keep_every_ratio_exact() {
    use Metric::*;
    let (seg, events) = day();
    let q = Query {
        metrics: vec![Visitors, Visits, BounceRate, VisitDuration, Percentage],
        dimensions: vec![
            Dimension::Time(Grain::Day),
            Dimension::Visit(VisitDim::Browser),
        ],
        filters: Vec::new(),
        order_by: Vec::new(),
        limit: 100,
        offset: 0,
    };
    let before = date(2026, 3, 1);
    let extra = |day, browser: &str, visitors, visits, bounces, duration_s| Extra {
        day: Some(day),
        values: vec![browser.to_owned()],
        sums: Sums {
            visitors,
            visits,
            pageviews: visits,
            events: visits,
            whole_visits: visits,
            whole_pageviews: visits,
            bounces,
            duration_s,
        },
    };
    let extras = [
        // The day before: only imported numbers.
        extra(before, "Safari", 10, 12, 6, 1200),
        // The live day: Firefox has 1 visitor, 2 visits (1 bounce, 300 s); 3 imported
        // visitors with 2 visits (2 bounces, 0 s) make 4 visitors, 4 visits, 75 %, 75 s.
        extra(DAY, "Firefox", 3, 2, 2, 0),
    ];
    let a = run_with(
        &q,
        before,
        DAY,
        &SiteZone::utc(),
        &[(DAY, &seg, Some(&events))],
        &dict(),
        &extras,
    )
    .expect("answers");
    let got: Vec<(Vec<String>, Vec<u64>)> = a
        .rows
        .iter()
        .map(|r| (r.dimensions.clone(), ints(r)[..4].to_vec()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                vec!["2026-03-01".into(), "Safari".into()],
                vec![10, 12, 50, 100]
            ),
            (
                vec!["2026-03-02".into(), "Firefox".into()],
                vec![4, 4, 75, 75]
            ),
            (
                vec!["2026-03-02".into(), "Chrome".into()],
                vec![2, 2, 50, 30]
            ),
        ]
    );
    // Percentages are of every visitor, live and imported: 3 distinct live visitors and 13
    // imported ones make 16; Safari has 10 of them.
    assert_eq!(a.rows[0].metrics[4], Value::Float(62.5));
    let wrong = [Extra {
        values: Vec::new(),
        ..extras[0].clone()
    }];
    assert!(run_with(&q, before, DAY, &SiteZone::utc(), &[], &dict(), &wrong).is_err());
}

/// Count `days` into a fresh state of `q` over `from..=to`.
fn state_over(q: &Query, from: Date, to: Date, days: &[Day<'_>]) -> Evaluator {
    let mut e = Evaluator::new(q, from, to, &SiteZone::utc()).expect("valid");
    let mut cols = crate::core::segment::Decoded::default();
    for &(day, seg, events) in days {
        cols.fill(seg, events);
        e.add(
            &DayInput {
                day,
                seg,
                events,
                cols: &cols,
            },
            &dict(),
        );
    }
    e
}

#[test]
fn questions_without_visitor_metrics_keep_no_visitor_sets() {
    let (seg, events) = day();
    let days = [(DAY, &seg, Some(&events))];
    let entry = |metrics: Vec<Metric>| Query {
        metrics,
        dimensions: vec![Dimension::Visit(VisitDim::EntryPage)],
        filters: vec![],
        order_by: vec![],
        limit: 10,
        offset: 0,
    };
    let with = state_over(
        &entry(vec![Metric::Visits, Metric::BounceRate, Metric::Visitors]),
        DAY,
        DAY,
        &days,
    );
    let without = state_over(
        &entry(vec![Metric::Visits, Metric::BounceRate]),
        DAY,
        DAY,
        &days,
    );
    assert!(
        without.size() < with.size(),
        "no visitor sets: {} bytes against {}",
        without.size(),
        with.size()
    );
    let (with, without) = (with.finish(), without.finish());
    let pairs = |a: &Answer| -> Vec<(String, Vec<Value>)> {
        a.rows
            .iter()
            .map(|r| (r.dimensions[0].clone(), r.metrics[..2].to_vec()))
            .collect()
    };
    assert_eq!(pairs(&with), pairs(&without));
    assert_eq!(with.rows.len(), 3, "entry pages /, /pricing, /blog/a");
}

#[test]
fn closed_time_rows_keep_their_counts_and_open_buckets_stay_exact() {
    // Two days, Monday and Tuesday of one week; visitor 1 comes both days.
    let (day2, one, two) = (DAY2, day(), day2());
    let by = |grain| Query {
        metrics: vec![Metric::Visitors],
        dimensions: vec![Dimension::Time(grain)],
        filters: vec![],
        order_by: vec![],
        limit: 10,
        offset: 0,
    };
    for grain in [Grain::Day, Grain::Hour, Grain::Week] {
        let q = by(grain);
        let whole = run(
            &q,
            DAY,
            day2,
            &SiteZone::utc(),
            &[(DAY, &one.0, Some(&one.1)), (day2, &two.0, Some(&two.1))],
            &dict(),
        )
        .expect("answers");
        // Monday sealed and counted, its rows closed; Tuesday (open) counted on top.
        let mut e = state_over(&q, DAY, day2, &[(DAY, &one.0, Some(&one.1))]);
        e.settle();
        let open = e.size();
        e.close_sealed(|d| d == DAY);
        let closed = e.size();
        let open_day = state_over(&q, DAY, day2, &[(day2, &two.0, Some(&two.1))]);
        assert_eq!(open_day.finish_over(&e), whole, "{grain:?}");
        if grain == Grain::Week {
            // The week also holds Tuesday: its set stays, so visitor 1 counts once.
            assert_eq!(closed, open);
            assert_eq!(whole.rows[0].metrics, vec![Value::Int(4)]);
        } else {
            assert!(closed < open, "{grain:?}: {closed} against {open}");
        }
    }
    // Shares of all visitors: the total set is united the same way (visitor 1 came both days).
    let q = Query {
        metrics: vec![Metric::Visitors, Metric::Percentage],
        dimensions: vec![Dimension::Visit(VisitDim::Browser)],
        ..by(Grain::Day)
    };
    let both = [(DAY, &one.0, Some(&one.1)), (day2, &two.0, Some(&two.1))];
    let whole = run(&q, DAY, day2, &SiteZone::utc(), &both, &dict()).expect("answers");
    let mut base = state_over(&q, DAY, day2, &both[..1]);
    base.settle();
    let open_day = state_over(&q, DAY, day2, &both[1..]);
    assert_eq!(open_day.finish_over(&base), whole);
    let firefox = &whole.rows[1];
    assert_eq!(firefox.dimensions, vec!["Firefox".to_owned()]);
    assert_eq!(
        firefox.metrics,
        vec![Value::Int(2), Value::Float(50.0)],
        "visitors 1 (both days) and 9 of 4"
    );
}

#[test]
fn another_page_order_or_metric_of_the_same_sums_shares_a_counted_state() {
    let (seg, events) = day();
    let days = [(DAY, &seg, Some(&events))];
    let q = |metrics: Vec<Metric>, limit, offset, order_by| Query {
        metrics,
        dimensions: vec![Dimension::Page],
        filters: vec![],
        order_by,
        limit,
        offset,
    };
    let first = q(vec![Metric::Visitors, Metric::Pageviews], 1, 0, vec![]);
    let mut state = state_over(&first, DAY, DAY, &days);
    state.settle();
    let next = q(
        vec![Metric::Pageviews, Metric::Visitors, Metric::Visits],
        1,
        1,
        vec![(OrderKey::Metric(Metric::Pageviews), true)],
    );
    // Asked over no days of its own, on top of the counted state.
    let asked = Evaluator::new(&next, DAY, DAY, &SiteZone::utc()).expect("valid");
    assert_eq!(state.counting_key(), asked.counting_key());
    let want = run(&next, DAY, DAY, &SiteZone::utc(), &days, &dict()).expect("answers");
    assert_eq!(asked.finish_over(&state), want);
    assert_eq!(want.rows.len(), 1, "one row per page");
    // Other sums, other filters: another state.
    for other in [
        q(vec![Metric::Pageviews], 1, 0, vec![]),
        q(vec![Metric::Visitors, Metric::Percentage], 1, 0, vec![]),
        Query {
            filters: vec![is(Dimension::Visit(VisitDim::Browser), "Firefox")],
            ..first.clone()
        },
    ] {
        let e = Evaluator::new(&other, DAY, DAY, &SiteZone::utc()).expect("valid");
        assert_ne!(state.counting_key(), e.counting_key(), "{other:?}");
    }
}

#[test]
fn a_saved_state_loads_merges_and_answers_as_the_counted_one() {
    let (seg, events) = day();
    let (seg2, events2) = day2();
    let q = |metrics: Vec<Metric>, dims: Vec<Dimension>| Query {
        metrics,
        dimensions: dims,
        filters: vec![],
        order_by: vec![],
        limit: 100,
        offset: 0,
    };
    let zone = SiteZone::utc();
    for question in [
        q(
            vec![Metric::Visitors, Metric::Visits, Metric::BounceRate],
            vec![],
        ),
        q(
            vec![Metric::Visitors, Metric::TimeOnPage, Metric::ScrollDepth],
            vec![Dimension::Page],
        ),
        q(vec![Metric::Visitors], vec![Dimension::Time(Grain::Day)]),
        q(
            vec![Metric::Visits],
            vec![
                Dimension::Visit(VisitDim::Browser),
                Dimension::Visit(VisitDim::Country),
            ],
        ),
    ] {
        let both = [(DAY, &seg, Some(&events)), (DAY2, &seg2, Some(&events2))];
        let want = run(&question, DAY, DAY2, &zone, &both, &dict()).expect("answers");
        // Each day counted and saved alone, then loaded and merged: the same answer.
        let mut first = state_over(&question, DAY, DAY2, &both[..1]);
        let mut second = state_over(&question, DAY, DAY2, &both[1..]);
        let (a, b) = (first.save(), second.save());
        assert_eq!(a, first.save(), "saving twice gives the same bytes");
        let mut loaded = Evaluator::load(&question, DAY, DAY2, &zone, &a).expect("loads");
        assert!(loaded.same_as(&mut first), "{question:?}");
        assert!(!loaded.same_as(&mut second) || a == b, "{question:?}");
        loaded.merge(Evaluator::load(&question, DAY, DAY2, &zone, &b).expect("loads"));
        assert_eq!(loaded.finish(), want, "{question:?}");
        // Bytes not written here are refused, never read past their end.
        for bad in [
            &a[..a.len() - 1],
            &a[1..],
            &[a.as_slice(), &[0]].concat()[..],
        ] {
            assert!(Evaluator::load(&question, DAY, DAY2, &zone, bad).is_err());
        }
    }
    // A state of one question is not another's.
    let totals = q(vec![Metric::Visitors], vec![]);
    let pages = q(vec![Metric::Visitors], vec![Dimension::Page]);
    let saved = state_over(&pages, DAY, DAY, &[(DAY, &seg, Some(&events))]).save();
    assert!(Evaluator::load(&totals, DAY, DAY, &zone, &saved).is_err());
}

mod dense_sets {
    use proptest::prelude::*;
    use roaring::RoaringBitmap;

    use super::super::eval::dense_set;

    /// The set as the sorting path builds it.
    fn sorted(values: &[u32]) -> RoaringBitmap {
        let mut all = values.to_vec();
        all.sort_unstable();
        all.dedup();
        RoaringBitmap::from_sorted_iter(all).expect("sorted")
    }

    /// Runs of ascending numbers, as days of visitors come: `runs` runs of `per_run` numbers
    /// drawn from `base..base + span`.
    fn days(base: u32, span: u32, runs: usize, per_run: usize, seed: u64) -> Vec<u32> {
        let mut x = seed | 1;
        let mut out = Vec::new();
        for _ in 0..runs {
            let mut run: Vec<u32> = (0..per_run)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    base + (x % u64::from(span)) as u32
                })
                .collect();
            run.sort_unstable();
            out.extend(run);
        }
        out
    }

    #[test]
    fn a_dense_spread_is_built_as_a_bitset_and_equals_the_sorted_set() {
        // A popular page over a year: 300 runs of 5,000 visitors among 1,000,000.
        let values = days(0, 1_000_000, 300, 5_000, 7);
        let set = dense_set(&values).expect("dense enough for the bitset");
        assert_eq!(set, sorted(&values));
        // Across a container boundary, starting mid-container.
        let values = days(65_530, 200_000, 20, 1_000, 3);
        assert_eq!(dense_set(&values).expect("dense"), sorted(&values));
        // Near the top of the number space.
        let values = days(u32::MAX - 100_000, 90_000, 10, 1_000, 5);
        assert_eq!(dense_set(&values).expect("dense"), sorted(&values));
    }

    #[test]
    fn few_or_spread_numbers_are_left_to_the_sort() {
        assert!(dense_set(&days(0, 1_000, 1, 4_000, 1)).is_none(), "too few");
        let spread = days(0, 4_000_000_000, 4, 2_000, 9);
        assert!(
            dense_set(&spread).is_none(),
            "a bitset would be mostly empty"
        );
    }

    proptest! {
        #[test]
        fn whatever_path_builds_it_the_set_is_the_same(
            base in 0u32..u32::MAX - 300_000,
            span in 1u32..300_000,
            runs in 1usize..40,
            per_run in 1usize..800,
            seed in any::<u64>(),
        ) {
            let values = days(base, span, runs, per_run, seed);
            if let Some(set) = dense_set(&values) {
                prop_assert_eq!(set, sorted(&values));
            }
        }
    }
}
