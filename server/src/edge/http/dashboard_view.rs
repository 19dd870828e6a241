//! What the dashboard shows of a site's visits: the range's cards with their change against
//! the period before, the daily chart, and the panels (sources, pages, locations, devices,
//! events), all from one read of the analytics (`store::analytics`) and all under the filters
//! in the page's address.
//!
//! Filters travel in the address as `f=<operator>,<dimension>,<value>` (`f=is,visit:country,DE`),
//! so a view can be shared; a panel row is a link that adds (or replaces) the filter on its
//! dimension, and each filter chip a link that removes it. `format=csv` answers the same view
//! as CSV.

use jiff::civil::Date;

use super::{ApiError, AppState};
use crate::core::badge::group;
use crate::core::chart::DayPoint;
use crate::core::query::{Answer, Dimension, Filter, Grain, Metric, Op, Query, Value, VisitDim};
use crate::core::range::DayRange;
use crate::core::site::Site;

/// Rows of each panel.
const ROWS: usize = 10;
/// Most filters in an address.
const MAX_FILTERS: usize = 16;

/// The filters of a dashboard address (`f=…` pairs of its query string).
pub(super) fn parse_filters(raw_query: Option<&str>) -> Result<Vec<Filter>, ApiError> {
    let mut out: Vec<Filter> = Vec::new();
    for (key, value) in url::form_urlencoded::parse(raw_query.unwrap_or("").as_bytes()) {
        if key != "f" {
            continue;
        }
        let mut parts = value.splitn(3, ',');
        let (Some(op), Some(dim), Some(val)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ApiError::bad(
                "invalid_filter",
                "a filter is f=<is|is_not|contains>,<dimension>,<value>",
            ));
        };
        let op = Op::parse(op)
            .filter(|o| matches!(o, Op::Is | Op::IsNot | Op::Contains))
            .ok_or_else(|| {
                ApiError::bad("invalid_filter", "operator must be is, is_not or contains")
            })?;
        let dimension = Dimension::parse(dim)
            .filter(|d| !matches!(d, Dimension::Time(_)))
            .ok_or_else(|| ApiError::bad("invalid_filter", format!("no dimension {dim:?}")))?;
        out.retain(|f| f.dimension != dimension);
        out.push(Filter {
            dimension,
            op,
            values: vec![val.chars().take(256).collect()],
            case_sensitive: op != Op::Contains,
        });
        if out.len() > MAX_FILTERS {
            return Err(ApiError::bad("invalid_filter", "at most 16 filters"));
        }
    }
    Ok(out)
}

/// The query string of a view: its range and filters.
fn address(range: &[(&'static str, String)], filters: &[Filter]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in range {
        s.append_pair(k, v);
    }
    for f in filters {
        let value = f.values.first().map(String::as_str).unwrap_or("");
        s.append_pair(
            "f",
            &format!("{},{},{value}", f.op.name(), f.dimension.name()),
        );
    }
    format!("?{}", s.finish())
}

/// A card: one metric of the range, with its change against the period before.
pub(super) struct MetricCard {
    pub id: &'static str,
    pub label: &'static str,
    pub value: String,
    /// `+12%`, `−3%`, or empty when the period before had nothing.
    pub change: String,
    /// Whether the change is good news (green) or not (red); a bounce rate going up is not.
    pub good: bool,
    /// The change in words, for screen readers and the tooltip.
    pub change_text: String,
}

/// A row of a panel: a link that filters the dashboard by its value.
pub(super) struct PanelRow {
    /// The value as stored (a page path as sent).
    pub value: String,
    pub label: String,
    pub href: String,
    /// Bar width in percent of the first row.
    pub share: u64,
    pub cells: Vec<String>,
}

/// A panel: one breakdown.
pub(super) struct Panel {
    pub id: &'static str,
    pub title: &'static str,
    pub column: &'static str,
    pub heads: Vec<&'static str>,
    pub rows: Vec<PanelRow>,
    pub empty: &'static str,
}

/// A section of the page: a title and its panels.
pub(super) struct Section {
    pub title: &'static str,
    pub panels: Vec<Panel>,
}

/// A filter in force, and the address without it.
pub(super) struct Chip {
    pub label: String,
    pub remove: String,
}

/// Everything the visits part of the page shows.
pub(super) struct Visits {
    pub cards: Vec<MetricCard>,
    pub points: Vec<DayPoint>,
    /// The panels, by section of the page.
    pub sections: Vec<Section>,
    pub chips: Vec<Chip>,
    /// This view as CSV.
    pub csv_href: String,
    /// Said when an imported export's numbers are part of what is shown.
    pub imports_note: Option<String>,
}

/// What the page says when it shows imported numbers.
const IMPORTS_NOTE: &str = "Includes imported data: its visitors are summed per day and row \
     (an export has no visitor ids), and panels it cannot break down (or filters it cannot \
     apply) show counted visits only.";

/// One panel's question and how its rows are shown.
struct PanelSpec {
    id: &'static str,
    title: &'static str,
    column: &'static str,
    dimension: Dimension,
    metrics: &'static [Metric],
    heads: &'static [&'static str],
    empty: &'static str,
    /// An extra filter of the panel alone (custom events leave page views out).
    only_custom: bool,
}

const fn spec(
    id: &'static str,
    title: &'static str,
    column: &'static str,
    dimension: Dimension,
    metrics: &'static [Metric],
    heads: &'static [&'static str],
) -> PanelSpec {
    PanelSpec {
        id,
        title,
        column,
        dimension,
        metrics,
        heads,
        empty: "Nothing in this range.",
        only_custom: false,
    }
}

use Dimension::Visit as V;
const VISITORS: &[Metric] = &[Metric::Visitors];
const VISITORS_HEAD: &[&str] = &["Visitors"];

const SOURCES: [PanelSpec; 4] = [
    spec(
        "channels",
        "Channels",
        "Channel",
        V(VisitDim::Channel),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "sources",
        "Sources",
        "Source",
        V(VisitDim::Source),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "referrers",
        "Referrers",
        "Referrer",
        V(VisitDim::Referrer),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "campaigns",
        "Campaigns",
        "Campaign",
        V(VisitDim::UtmCampaign),
        VISITORS,
        VISITORS_HEAD,
    ),
];

const PAGES: [PanelSpec; 3] = [
    spec(
        "top-pages",
        "Top pages",
        "Page",
        Dimension::Page,
        &[Metric::Visitors, Metric::Pageviews, Metric::TimeOnPage],
        &["Visitors", "Views", "Time on page"],
    ),
    spec(
        "entry-pages",
        "Entry pages",
        "Page",
        V(VisitDim::EntryPage),
        &[Metric::Visits, Metric::BounceRate],
        &["Visits", "Bounce rate"],
    ),
    spec(
        "exit-pages",
        "Exit pages",
        "Page",
        V(VisitDim::ExitPage),
        &[Metric::Visits],
        &["Visits"],
    ),
];

const PLACES: [PanelSpec; 2] = [
    spec(
        "countries",
        "Countries",
        "Country",
        V(VisitDim::Country),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "regions",
        "Regions",
        "Region",
        V(VisitDim::Region),
        VISITORS,
        VISITORS_HEAD,
    ),
];

const DEVICES: [PanelSpec; 3] = [
    spec(
        "browsers",
        "Browsers",
        "Browser",
        V(VisitDim::Browser),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "systems",
        "Operating systems",
        "System",
        V(VisitDim::Os),
        VISITORS,
        VISITORS_HEAD,
    ),
    spec(
        "devices",
        "Devices",
        "Device",
        V(VisitDim::Device),
        VISITORS,
        VISITORS_HEAD,
    ),
];

const EVENTS: [PanelSpec; 1] = [PanelSpec {
    empty: "No custom events in this range. Send them with tally('event', 'name').",
    only_custom: true,
    ..spec(
        "events",
        "Custom events",
        "Event",
        Dimension::Name,
        &[Metric::Visitors, Metric::Events],
        &["Visitors", "Events"],
    )
}];

const CARDS: [(&str, &str, Metric); 6] = [
    ("visitors", "Visitors", Metric::Visitors),
    ("visits", "Visits", Metric::Visits),
    ("pageviews", "Pageviews", Metric::Pageviews),
    ("views-per-visit", "Views per visit", Metric::ViewsPerVisit),
    ("bounce-rate", "Bounce rate", Metric::BounceRate),
    ("visit-duration", "Visit duration", Metric::VisitDuration),
];

fn query(
    metrics: &[Metric],
    dimensions: Vec<Dimension>,
    filters: Vec<Filter>,
    limit: usize,
) -> Query {
    Query {
        metrics: metrics.to_vec(),
        dimensions,
        filters,
        order_by: Vec::new(),
        limit,
        offset: 0,
    }
}

/// A number as shown.
pub(super) fn show(metric: Metric, v: Value) -> String {
    let n = |v: Value| match v {
        Value::Int(n) => n as f64,
        Value::Float(x) => x,
        Value::Null => f64::NAN,
    };
    match (metric, v) {
        (_, Value::Null) => "–".to_owned(),
        (Metric::BounceRate, v) => format!("{}%", n(v).round()),
        (Metric::ViewsPerVisit, v) => format!("{:.2}", n(v)),
        (Metric::VisitDuration | Metric::TimeOnPage, v) => duration(n(v) as u64),
        (_, Value::Int(x)) => group(x),
        (_, Value::Float(x)) => format!("{x}"),
    }
}

fn duration(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m {:02}s", secs / 60, secs % 60),
        _ => format!("{}h {:02}m", secs / 3600, secs % 3600 / 60),
    }
}

fn number(v: Value) -> Option<f64> {
    match v {
        Value::Int(n) => Some(n as f64),
        Value::Float(x) => Some(x),
        Value::Null => None,
    }
}

fn card(
    id: &'static str,
    label: &'static str,
    metric: Metric,
    now: Value,
    before: Value,
) -> MetricCard {
    let value = show(metric, now);
    let (change, good, change_text) = match (number(now), number(before)) {
        (Some(a), Some(b)) if b > 0.0 => {
            let pct = ((a - b) / b * 100.0).round();
            let up = pct >= 0.0;
            // A bounce rate is better when it falls.
            let good = if metric == Metric::BounceRate {
                !up
            } else {
                up
            };
            let sign = if up { "+" } else { "−" };
            (
                format!("{sign}{}%", pct.abs()),
                good,
                format!(
                    "{} {}% on the period before ({})",
                    if up { "up" } else { "down" },
                    pct.abs(),
                    show(metric, before)
                ),
            )
        }
        _ => (
            String::new(),
            true,
            "nothing to compare with in the period before".to_owned(),
        ),
    };
    MetricCard {
        id,
        label,
        value,
        change,
        good,
        change_text,
    }
}

/// The period of the same length just before `range`.
pub(super) fn before(range: DayRange) -> DayRange {
    let days = range
        .from
        .until(range.to)
        .map(|s| s.get_days())
        .unwrap_or(0)
        + 1;
    let to = range.from.yesterday().unwrap_or(range.from);
    let from = to
        .checked_sub(jiff::Span::new().days(i64::from(days) - 1))
        .unwrap_or(to);
    DayRange { from, to }
}

/// Every panel, in the order of the page.
fn panels() -> Vec<&'static PanelSpec> {
    SOURCES
        .iter()
        .chain(&PAGES)
        .chain(&PLACES)
        .chain(&DEVICES)
        .chain(&EVENTS)
        .collect()
}

/// The questions of the visits part under `filters`: the cards, the daily series, then each
/// panel's (without filters, each has a stored month state: `store::rollups`).
fn questions(filters: &[Filter]) -> Vec<Query> {
    let card_metrics: Vec<Metric> = CARDS.iter().map(|c| c.2).collect();
    let mut questions = vec![
        query(&card_metrics, Vec::new(), filters.to_vec(), 1),
        query(
            &[Metric::Visitors, Metric::Pageviews],
            vec![Dimension::Time(Grain::Day)],
            filters.to_vec(),
            400,
        ),
    ];
    for p in panels() {
        let mut f = filters.to_vec();
        if p.only_custom && !f.iter().any(|x| x.dimension == Dimension::Name) {
            f.push(Filter {
                dimension: Dimension::Name,
                op: Op::IsNot,
                values: vec!["pageview".into()],
                case_sensitive: true,
            });
        }
        questions.push(query(p.metrics, vec![p.dimension], f, ROWS));
    }
    questions
}

/// Read and shape everything the visits part shows.
pub(super) async fn visits(
    state: &AppState,
    site: &Site,
    range: DayRange,
    range_pairs: &[(&'static str, String)],
    filters: &[Filter],
) -> Result<Visits, ApiError> {
    let all = panels();
    let questions = questions(filters);
    // Imported breakdowns are included wherever they answer a panel, as Plausible's
    // dashboard does (a few indexed reads per view).
    let answered = state
        .analytics
        .answer_with(&site.id, &site.zone, range.from, range.to, &questions, true)
        .await?;
    let imports_note = answered
        .iter()
        .any(|(_, i)| i.included)
        .then(|| IMPORTS_NOTE.to_owned());
    let answers: Vec<Answer> = answered.into_iter().map(|(a, _)| a).collect();
    let prior = before(range);
    let earlier: Vec<Answer> = state
        .analytics
        .answer_with(
            &site.id,
            &site.zone,
            prior.from,
            prior.to,
            &questions[..1],
            true,
        )
        .await?
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    let totals = answers[0]
        .rows
        .first()
        .map(|r| r.metrics.clone())
        .unwrap_or_default();
    let old = earlier[0]
        .rows
        .first()
        .map(|r| r.metrics.clone())
        .unwrap_or_default();
    let cards = CARDS
        .iter()
        .enumerate()
        .map(|(i, (id, label, metric))| {
            card(
                id,
                label,
                *metric,
                totals.get(i).copied().unwrap_or(Value::Int(0)),
                old.get(i).copied().unwrap_or(Value::Null),
            )
        })
        .collect();
    let points = day_points(range, &answers[1]);
    let mut panels = all
        .iter()
        .zip(&answers[2..])
        .map(|(p, a)| panel(p, a, range_pairs, filters));
    let sections = [
        ("Sources", SOURCES.len()),
        ("Pages", PAGES.len()),
        ("Locations", PLACES.len()),
        ("Devices", DEVICES.len()),
        ("Events", EVENTS.len()),
    ]
    .into_iter()
    .map(|(title, n)| Section {
        title,
        panels: panels.by_ref().take(n).collect(),
    })
    .collect();
    let chips = filters
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let rest: Vec<Filter> = filters
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, f)| f.clone())
                .collect();
            Chip {
                label: format!(
                    "{} {} {}",
                    dimension_label(f.dimension),
                    match f.op {
                        Op::IsNot => "is not",
                        Op::Contains | Op::ContainsNot => "contains",
                        Op::Is => "is",
                    },
                    f.values.first().map(String::as_str).unwrap_or("")
                ),
                remove: address(range_pairs, &rest),
            }
        })
        .collect();
    let mut csv = range_pairs.to_vec();
    csv.push(("format", "csv".to_owned()));
    Ok(Visits {
        cards,
        points,
        sections,
        chips,
        csv_href: address(&csv, filters),
        imports_note,
    })
}

/// What a dimension is called on the page.
fn dimension_label(d: Dimension) -> &'static str {
    SOURCES
        .iter()
        .chain(&PAGES)
        .chain(&PLACES)
        .chain(&DEVICES)
        .chain(&EVENTS)
        .find(|p| p.dimension == d)
        .map_or(d.name(), |p| p.column)
}

fn day_points(range: DayRange, answer: &Answer) -> Vec<DayPoint> {
    let by_day: std::collections::HashMap<&str, &[Value]> = answer
        .rows
        .iter()
        .filter_map(|r| Some((r.dimensions.first()?.as_str(), r.metrics.as_slice())))
        .collect();
    range
        .days()
        .into_iter()
        .map(|day: Date| {
            let key = day.to_string();
            let m = by_day.get(key.as_str());
            let at = |i: usize| match m.and_then(|m| m.get(i)) {
                Some(Value::Int(n)) => *n,
                _ => 0,
            };
            DayPoint {
                day,
                views: at(1),
                visitors: at(0),
            }
        })
        .collect()
}

fn panel(
    spec: &PanelSpec,
    answer: &Answer,
    range_pairs: &[(&'static str, String)],
    filters: &[Filter],
) -> Panel {
    let top = answer
        .rows
        .first()
        .and_then(|r| number(r.metrics[0]))
        .unwrap_or(0.0);
    let rows = answer
        .rows
        .iter()
        .map(|r| {
            let value = r.dimensions.first().cloned().unwrap_or_default();
            let mut with: Vec<Filter> = filters
                .iter()
                .filter(|f| f.dimension != spec.dimension)
                .cloned()
                .collect();
            // The empty-value labels stand for the empty value in a filter too.
            with.push(Filter {
                dimension: spec.dimension,
                op: Op::Is,
                values: vec![value.clone()],
                case_sensitive: true,
            });
            let first = number(r.metrics[0]).unwrap_or(0.0);
            Panel::row(
                value.clone(),
                if spec.dimension == Dimension::Page
                    || matches!(spec.dimension, V(VisitDim::EntryPage | VisitDim::ExitPage))
                {
                    crate::core::display::display_path(&value)
                } else {
                    value
                },
                address(range_pairs, &with),
                if top > 0.0 {
                    (first * 100.0 / top).ceil() as u64
                } else {
                    0
                },
                spec.metrics
                    .iter()
                    .zip(&r.metrics)
                    .map(|(m, v)| show(*m, *v))
                    .collect(),
            )
        })
        .collect();
    Panel {
        id: spec.id,
        title: spec.title,
        column: spec.column,
        heads: spec.heads.to_vec(),
        rows,
        empty: spec.empty,
    }
}

impl Panel {
    fn row(value: String, label: String, href: String, share: u64, cells: Vec<String>) -> PanelRow {
        PanelRow {
            value,
            label,
            href,
            share: share.min(100),
            cells,
        }
    }
}

/// The view as CSV: the cards, then every panel's rows.
pub(super) fn csv(site: &Site, range: DayRange, v: &Visits) -> String {
    let mut out = String::from("section,name,value,visitors_or_visits,more\n");
    let field = |s: &str| {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_owned()
        }
    };
    out.push_str(&format!(
        "range,{},{} – {},,\n",
        field(site.id.as_str()),
        range.from,
        range.to
    ));
    for c in &v.cards {
        out.push_str(&format!(
            "card,{},{},,{}\n",
            c.id,
            field(&c.value),
            field(&c.change)
        ));
    }
    for p in v.sections.iter().flat_map(|s| &s.panels) {
        for r in &p.rows {
            out.push_str(&format!(
                "{},{},{},{},{}\n",
                p.id,
                field(&r.label),
                field(r.cells.first().map(String::as_str).unwrap_or("")),
                field(r.cells.get(1).map(String::as_str).unwrap_or("")),
                field(r.cells.get(2).map(String::as_str).unwrap_or("")),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_round_trip_through_the_address() {
        let fs = parse_filters(Some(
            "range=7d&f=is,visit:country,DE&f=contains,event:page,%2Fblog%2Ca",
        ))
        .expect("filters");
        assert_eq!(fs.len(), 2);
        assert_eq!(fs[1].values, vec!["/blog,a".to_owned()]);
        let back = address(&[("range", "7d".into())], &fs);
        assert_eq!(parse_filters(Some(&back[1..])).expect("again"), fs);
        assert!(parse_filters(Some("f=matches,visit:os,x")).is_err());
        assert!(parse_filters(Some("f=is,time:day,x")).is_err());
        // A second filter on one dimension replaces the first.
        let one = parse_filters(Some("f=is,visit:os,a&f=is,visit:os,b")).expect("filters");
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn changes_say_which_way_is_good() {
        let c = card(
            "b",
            "Bounce rate",
            Metric::BounceRate,
            Value::Float(60.0),
            Value::Float(50.0),
        );
        assert_eq!((c.change.as_str(), c.good), ("+20%", false));
        let v = card(
            "v",
            "Visitors",
            Metric::Visitors,
            Value::Int(5),
            Value::Int(10),
        );
        assert_eq!((v.change.as_str(), v.good), ("−50%", false));
        let none = card(
            "v",
            "Visitors",
            Metric::Visitors,
            Value::Int(5),
            Value::Int(0),
        );
        assert_eq!(none.change, "");
        assert_eq!(duration(65), "1m 05s");
    }

    #[test]
    fn every_unfiltered_question_has_a_stored_month_state() {
        let zone = crate::core::day::SiteZone::utc();
        let day = jiff::civil::date(2026, 3, 2);
        let key = |q: &Query| {
            let e = crate::core::query::Evaluator::new(q, day, day, &zone).expect("valid");
            crate::store::rollups::key(&zone, &e)
        };
        let stored: std::collections::HashSet<String> =
            crate::store::rollups::questions().iter().map(key).collect();
        let asked = questions(&[]);
        assert_eq!(asked.len(), 2 + panels().len());
        for q in &asked {
            assert!(stored.contains(&key(q)), "no stored state answers {q:?}");
        }
    }

    #[test]
    fn the_period_before_has_the_same_length() {
        let r = DayRange {
            from: jiff::civil::date(2026, 3, 1),
            to: jiff::civil::date(2026, 3, 7),
        };
        let b = before(r);
        assert_eq!(
            (b.from.to_string(), b.to.to_string()),
            ("2026-02-22".into(), "2026-02-28".into())
        );
    }
}
