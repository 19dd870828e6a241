//! Answering a [`Query`] from day segments in one pass over their visits.
//!
//! Per segment, every value a question looks at is resolved once per local dictionary entry
//! (a few hundred per day), not per visit: filters become one flag per local source, agent,
//! page and name, dimensions one interned value number each. The pass over visits then only
//! indexes small tables. Distinct visitors are exact (a bitmap of visitor numbers per row).
//!
//! Sums kept without visitor ids (imported daily aggregates, [`Extra`]) can be added to the
//! rows: their visitors are added as numbers (never merged into the bitmaps), their visits,
//! bounces and durations as the sums they are, so every ratio stays exact over both.

use std::collections::HashMap;

use jiff::civil::Date;
use roaring::RoaringBitmap;

use super::{Dimension, Filter, Grain, Invalid, Metric, OrderKey, Query, VisitDim};
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::segment::Segment;

mod extra;

pub use extra::{Extra, Sums};

/// What the evaluator needs to know of stored ids.
pub trait Dictionary {
    /// A page's path (`None`: unknown id).
    fn page(&self, id: u32) -> Option<&str>;
    /// A source tuple (`None`: none recorded).
    fn source(&self, id: u32) -> Option<&SourceDims>;
    /// An agent tuple (`None`: none recorded).
    fn agent(&self, id: u32) -> Option<&AgentDims>;
}

/// A metric's value in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    Null,
}

impl Value {
    fn sort_key(self) -> f64 {
        match self {
            Value::Int(n) => n as f64,
            Value::Float(x) => x,
            Value::Null => f64::NEG_INFINITY,
        }
    }
}

/// One row of an answer: the dimension values in query order, the metrics in query order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub dimensions: Vec<String>,
    pub metrics: Vec<Value>,
}

/// The rows of one page of the answer, with what the caller may report beside them.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub rows: Vec<Row>,
    /// Rows before pagination.
    pub total_rows: usize,
    /// Every bucket label of the range, when the query has a time dimension.
    pub time_labels: Vec<String>,
}

/// Sums of one row.
#[derive(Default)]
struct Acc {
    visitors: RoaringBitmap,
    /// Visitors of [`Extra`]s, summed.
    extra_visitors: u64,
    /// The visitor inserted last (visits come sorted by visitor: a repeat skips the bitmap).
    last: Option<u32>,
    visits: u64,
    pageviews: u64,
    events: u64,
    /// Visits counted whole (duration, views per visit).
    whole_visits: u64,
    duration_s: u64,
    whole_pageviews: u64,
    /// Visits counted for the bounce rate, and their bounces.
    bounce_visits: u64,
    bounces: u64,
    engaged_ms: u64,
    engaged_visits: u64,
    scroll_sum: u64,
    scroll_visits: u64,
}

impl Acc {
    fn visitor(&mut self, visitor: u32) {
        if self.last != Some(visitor) {
            self.last = Some(visitor);
            self.visitors.insert(visitor);
        }
    }
}

/// Interned values of one dimension.
#[derive(Default)]
struct Values {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Values {
    fn id(&mut self, value: &str) -> u32 {
        if let Some(id) = self.ids.get(value) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(value.to_owned());
        self.ids.insert(value.to_owned(), id);
        id
    }
}

/// The rows seen so far, by key (one interned value number per dimension): without
/// dimensions one row, with one a dense table by value number, else a hash of the key.
#[derive(Default)]
struct Rows {
    index: HashMap<Box<[u32]>, usize, foldhash::fast::RandomState>,
    /// With one dimension: row + 1 by value number (0: no row yet).
    dense: Vec<u32>,
    keys: Vec<Box<[u32]>>,
    accs: Vec<Acc>,
}

impl Rows {
    fn at(&mut self, key: &[u32]) -> usize {
        match key {
            [] if !self.accs.is_empty() => return 0,
            [v] => {
                let v = *v as usize;
                if let Some(&r) = self.dense.get(v)
                    && r > 0
                {
                    return r as usize - 1;
                }
            }
            _ => {
                if let Some(i) = self.index.get(key) {
                    return *i;
                }
            }
        }
        let i = self.accs.len();
        match key {
            [] => {}
            [v] => {
                let v = *v as usize;
                if self.dense.len() <= v {
                    self.dense.resize(v + 1, 0);
                }
                self.dense[v] = i as u32 + 1;
            }
            _ => {
                self.index.insert(key.into(), i);
            }
        }
        self.keys.push(key.into());
        self.accs.push(Acc::default());
        i
    }
}

/// A visit dimension's value for a source or agent tuple.
fn visit_value<'a>(dim: VisitDim, src: &'a SourceDims, agent: &'a AgentDims) -> &'a str {
    match dim {
        VisitDim::Source => &src.source,
        VisitDim::Referrer => &src.referrer,
        VisitDim::Channel => &src.channel,
        VisitDim::UtmSource => &src.utm_source,
        VisitDim::UtmMedium => &src.utm_medium,
        VisitDim::UtmCampaign => &src.utm_campaign,
        VisitDim::UtmTerm => &src.utm_term,
        VisitDim::UtmContent => &src.utm_content,
        VisitDim::Browser => &agent.browser,
        VisitDim::BrowserVersion => &agent.browser_version,
        VisitDim::Os => &agent.os,
        VisitDim::OsVersion => &agent.os_version,
        VisitDim::Device => &agent.device,
        VisitDim::Country => &agent.country,
        VisitDim::Region => &agent.region,
        VisitDim::EntryPage | VisitDim::ExitPage => "",
    }
}

fn is_agent_dim(dim: VisitDim) -> bool {
    matches!(
        dim,
        VisitDim::Browser
            | VisitDim::BrowserVersion
            | VisitDim::Os
            | VisitDim::OsVersion
            | VisitDim::Device
            | VisitDim::Country
            | VisitDim::Region
    )
}

/// Where a dimension's value comes from in a segment.
#[derive(Clone, Copy)]
enum Slot {
    Src(VisitDim),
    Agent(VisitDim),
    Entry,
    Exit,
    Page,
    Name,
    Time(Grain),
}

fn slot(d: Dimension) -> Slot {
    match d {
        Dimension::Visit(VisitDim::EntryPage) => Slot::Entry,
        Dimension::Visit(VisitDim::ExitPage) => Slot::Exit,
        Dimension::Visit(v) if is_agent_dim(v) => Slot::Agent(v),
        Dimension::Visit(v) => Slot::Src(v),
        Dimension::Page => Slot::Page,
        Dimension::Name => Slot::Name,
        Dimension::Time(g) => Slot::Time(g),
    }
}

static EMPTY_SRC: SourceDims = SourceDims {
    referrer: String::new(),
    source: String::new(),
    channel: String::new(),
    utm_source: String::new(),
    utm_medium: String::new(),
    utm_campaign: String::new(),
    utm_term: String::new(),
    utm_content: String::new(),
};

static EMPTY_AGENT: AgentDims = AgentDims {
    browser: String::new(),
    browser_version: String::new(),
    os: String::new(),
    os_version: String::new(),
    device: String::new(),
    country: String::new(),
    region: String::new(),
};

/// A page view's name for `event:name`.
const PAGEVIEW: &str = "pageview";

/// Per-segment tables: every local dictionary entry resolved once.
struct Local {
    src_ok: Vec<bool>,
    agent_ok: Vec<bool>,
    /// Indexed by local page + 1 (0: no page view).
    entry_ok: Vec<bool>,
    exit_ok: Vec<bool>,
    /// Event filters: per local page, per local name, and for page views.
    page_ok: Vec<bool>,
    name_ok: Vec<bool>,
    pageview_ok: bool,
    /// Per dimension position: value number per local index of its slot.
    values: Vec<Vec<u32>>,
    /// `event:name`'s value number of page views, per dimension position (unused elsewhere).
    pageview_value: Vec<u32>,
    /// Local time of day boundaries, for hours: (seconds from the day's start, hour).
    hours: Vec<(u32, i8)>,
    /// Per dimension position of a time dimension: the day's bucket value number (day, week,
    /// month), or the value number of each entry of `hours`.
    time_ids: Vec<Vec<u32>>,
}

/// Answer `query` from the segments of the local days `from..=to` of a site in `zone`
/// (`segments` holds the days that have data, any order).
pub fn run(
    query: &Query,
    from: Date,
    to: Date,
    zone: &SiteZone,
    segments: &[(Date, &Segment)],
    dict: &dyn Dictionary,
) -> Result<Answer, Invalid> {
    run_with(query, from, to, zone, segments, dict, &[])
}

/// [`run`], with `extra` sums added to the rows their values (and day) name. The caller
/// hands only extras that pass the query's filters, each with one value per non-time
/// dimension; one with the wrong number of values is an [`Invalid`].
pub fn run_with(
    query: &Query,
    from: Date,
    to: Date,
    zone: &SiteZone,
    segments: &[(Date, &Segment)],
    dict: &dyn Dictionary,
    extra: &[Extra],
) -> Result<Answer, Invalid> {
    query.check()?;
    let dims = &query.dimensions;
    let slots: Vec<Slot> = dims.iter().map(|d| slot(*d)).collect();
    let event_rows = dims.iter().any(|d| d.is_event());
    let (visit_filters, event_filters): (Vec<&Filter>, Vec<&Filter>) =
        query.filters.iter().partition(|f| !f.dimension.is_event());
    let page_filters: Vec<&Filter> = event_filters
        .iter()
        .copied()
        .filter(|f| f.dimension == Dimension::Page)
        .collect();
    let mut values: Vec<Values> = dims.iter().map(|_| Values::default()).collect();
    let mut rows = Rows::default();
    let mut total = RoaringBitmap::new();
    // Filter verdicts and value numbers by stored id, across segments.
    let mut src_memo: HashMap<u32, (bool, Vec<u32>)> = HashMap::new();
    let mut agent_memo: HashMap<u32, (bool, Vec<u32>)> = HashMap::new();
    let mut page_memo: HashMap<u32, (bool, bool, bool, Vec<u32>)> = HashMap::new();
    let mut key = vec![0u32; dims.len()];
    let has_page_dim = dims.contains(&Dimension::Page);
    let has_name_dim = dims.contains(&Dimension::Name);
    let want_total = query.metrics.contains(&Metric::Percentage);
    // Whether events must be visited one by one: to key them by their page, name or hour, to
    // filter them, or for their engagement. Otherwise a visit's counts say it all.
    let need_events = event_rows
        || !event_filters.is_empty()
        || dims.contains(&Dimension::Time(Grain::Hour))
        || query
            .metrics
            .iter()
            .any(|m| matches!(m, Metric::TimeOnPage | Metric::ScrollDepth));
    for (day, seg) in segments {
        let local = resolve(
            query,
            &slots,
            (&visit_filters, &event_filters, &page_filters),
            (*day, from),
            zone,
            seg,
            dict,
            &mut values,
            (&mut src_memo, &mut agent_memo, &mut page_memo),
        );
        let v = &seg.visits;
        let (mut pv_at, mut ev_at) = (0usize, 0usize);
        // This visit's contributions per row: (row, engaged ms, engaged?, scroll max + 1).
        let mut touched: Vec<(usize, u64, bool, u32)> = Vec::new();
        for i in 0..seg.visit_count() {
            let (pvs, evs) = (v.pageviews[i] as usize, v.events[i] as usize);
            let (pv_range, ev_range) = (pv_at..pv_at + pvs, ev_at..ev_at + evs);
            pv_at += pvs;
            ev_at += evs;
            if !(local.src_ok[v.src[i] as usize]
                && local.agent_ok[v.agent[i] as usize]
                && local.entry_ok[v.entry[i] as usize]
                && local.exit_ok[v.exit[i] as usize])
            {
                continue;
            }
            let pv_match =
                |p: usize| local.page_ok[seg.pageviews.page[p] as usize] && local.pageview_ok;
            let ev_match = |e: usize| {
                local.page_ok[seg.customs.page[e] as usize]
                    && local.name_ok[seg.customs.name[e] as usize]
            };
            if !event_filters.is_empty()
                && !pv_range.clone().any(pv_match)
                && !ev_range.clone().any(ev_match)
            {
                continue;
            }
            let visitor = v.visitor[i];
            if want_total {
                total.insert(visitor);
            }
            let bounce = v.pageviews[i] < 2 && v.events[i] == 0;
            // Whole-visit sums: keyed by the visit (a page breakdown: its entry page).
            for (k, s) in slots.iter().enumerate() {
                key[k] = match s {
                    Slot::Src(_) => local.values[k][v.src[i] as usize],
                    Slot::Agent(_) => local.values[k][v.agent[i] as usize],
                    Slot::Entry | Slot::Page => local.values[k][v.entry[i] as usize],
                    Slot::Exit => local.values[k][v.exit[i] as usize],
                    Slot::Name => 0,
                    Slot::Time(g) => time_value(&local, k, *g, v.start_s[i]),
                };
            }
            let whole_ok = !has_page_dim || v.entry[i] != 0;
            if whole_ok && !has_name_dim {
                let r = rows.at(&key);
                let acc = &mut rows.accs[r];
                acc.whole_visits += 1;
                acc.duration_s += u64::from(v.duration_s[i]);
                acc.whole_pageviews += u64::from(v.pageviews[i]);
                let entered_on_page = page_filters.is_empty()
                    || (v.entry[i] != 0 && local.page_ok[v.entry[i] as usize - 1]);
                if entered_on_page {
                    acc.bounce_visits += 1;
                    acc.bounces += u64::from(bounce);
                }
                if !event_rows {
                    acc.visits += 1;
                    acc.visitor(visitor);
                }
                if !need_events {
                    // Every event of the visit counts, in the visit's row.
                    acc.pageviews += u64::from(v.pageviews[i]);
                    acc.events += u64::from(v.pageviews[i] + v.events[i]);
                }
            }
            if !need_events {
                continue;
            }
            // Event sums: keyed by each matching event.
            touched.clear();
            let mut add = |key: &[u32],
                           rows: &mut Rows,
                           pageview: bool,
                           eng: u64,
                           reported: bool,
                           scroll: u32| {
                let r = rows.at(key);
                let acc = &mut rows.accs[r];
                acc.events += 1;
                acc.pageviews += u64::from(pageview);
                match touched.iter_mut().find(|t| t.0 == r) {
                    Some(t) => {
                        t.1 += eng;
                        t.2 |= reported;
                        t.3 = t.3.max(scroll);
                    }
                    None => touched.push((r, eng, reported, scroll)),
                }
            };
            for p in pv_range {
                if !event_filters.is_empty() && !pv_match(p) {
                    continue;
                }
                event_key(&mut key, &slots, &local, seg, i, EventAt::Pageview(p));
                let eng = u64::from(seg.pageviews.engaged_ms[p]);
                let scroll = seg.pageviews.scroll[p];
                add(&key, &mut rows, true, eng, eng > 0 || scroll > 0, scroll);
            }
            for e in ev_range {
                if !event_filters.is_empty() && !ev_match(e) {
                    continue;
                }
                event_key(&mut key, &slots, &local, seg, i, EventAt::Custom(e));
                add(&key, &mut rows, false, 0, false, 0);
            }
            for &(r, eng, reported, scroll) in &touched {
                let acc = &mut rows.accs[r];
                if event_rows {
                    acc.visits += 1;
                    acc.visitor(visitor);
                }
                acc.engaged_ms += eng;
                acc.engaged_visits += u64::from(reported && eng > 0);
                if scroll > 0 {
                    acc.scroll_sum += u64::from(scroll - 1);
                    acc.scroll_visits += 1;
                }
            }
        }
    }
    let extra_total = extra::add(extra, &slots, &mut key, &mut values, &mut rows, from)?;
    Ok(finish(
        query,
        rows,
        values,
        total.len() + extra_total,
        from,
        to,
        zone,
    ))
}

/// Where an event sits in a segment.
#[derive(Clone, Copy)]
enum EventAt {
    Pageview(usize),
    Custom(usize),
}

#[allow(clippy::too_many_arguments)]
fn event_key(
    key: &mut [u32],
    slots: &[Slot],
    local: &Local,
    seg: &Segment,
    visit: usize,
    at: EventAt,
) {
    let v = &seg.visits;
    for (k, s) in slots.iter().enumerate() {
        key[k] = match (s, at) {
            (Slot::Src(_), _) => local.values[k][v.src[visit] as usize],
            (Slot::Agent(_), _) => local.values[k][v.agent[visit] as usize],
            (Slot::Entry, _) => local.values[k][v.entry[visit] as usize],
            (Slot::Exit, _) => local.values[k][v.exit[visit] as usize],
            (Slot::Page, EventAt::Pageview(p)) => {
                local.values[k][seg.pageviews.page[p] as usize + 1]
            }
            (Slot::Page, EventAt::Custom(e)) => local.values[k][seg.customs.page[e] as usize + 1],
            (Slot::Name, EventAt::Pageview(_)) => local.pageview_value[k],
            (Slot::Name, EventAt::Custom(e)) => local.values[k][seg.customs.name[e] as usize],
            (Slot::Time(g), EventAt::Pageview(p)) => {
                time_value(local, k, *g, seg.pageviews.at_s[p])
            }
            (Slot::Time(g), EventAt::Custom(e)) => time_value(local, k, *g, seg.customs.at_s[e]),
        };
    }
}

/// The bucket value number of a moment `at_s` seconds into the segment's day.
fn time_value(local: &Local, k: usize, grain: Grain, at_s: u32) -> u32 {
    let ids = &local.time_ids[k];
    match grain {
        Grain::Hour => {
            let i = local.hours.partition_point(|(s, _)| *s <= at_s);
            ids.get(i.saturating_sub(1)).copied().unwrap_or(0)
        }
        _ => ids.first().copied().unwrap_or(0),
    }
}

/// Labels as Plausible writes them: `2026-01-05 13:00:00`, `2026-01-05`; a week by its
/// Monday (never before the range's first day), a month by its first day.
fn bucket_label(grain: Grain, day: Date, from: Date, hour: impl FnOnce() -> i8) -> String {
    match grain {
        Grain::Hour => format!("{day} {:02}:00:00", hour()),
        Grain::Day => day.to_string(),
        Grain::Week => {
            let back = i64::from(day.weekday().to_monday_zero_offset());
            let monday = day.checked_sub(jiff::Span::new().days(back)).unwrap_or(day);
            monday.max(from).to_string()
        }
        Grain::Month => day.first_of_month().to_string(),
    }
}

#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn resolve(
    query: &Query,
    slots: &[Slot],
    filters: (&[&Filter], &[&Filter], &[&Filter]),
    (day, from): (Date, Date),
    zone: &SiteZone,
    seg: &Segment,
    dict: &dyn Dictionary,
    values: &mut [Values],
    memo: (
        &mut HashMap<u32, (bool, Vec<u32>)>,
        &mut HashMap<u32, (bool, Vec<u32>)>,
        &mut HashMap<u32, (bool, bool, bool, Vec<u32>)>,
    ),
) -> Local {
    let (visit_filters, event_filters, _) = filters;
    let (src_memo, agent_memo, page_memo) = memo;
    let dims = &query.dimensions;
    let mut local = Local {
        src_ok: Vec::with_capacity(seg.srcs.len()),
        agent_ok: Vec::with_capacity(seg.agents.len()),
        entry_ok: vec![true; seg.pages.len() + 1],
        exit_ok: vec![true; seg.pages.len() + 1],
        page_ok: Vec::with_capacity(seg.pages.len()),
        name_ok: Vec::with_capacity(seg.names.len()),
        pageview_ok: true,
        values: slots.iter().map(|_| Vec::new()).collect(),
        pageview_value: vec![0; slots.len()],
        hours: Vec::new(),
        time_ids: Vec::new(),
    };
    // Sources.
    for &id in &seg.srcs {
        let (ok, vals) = src_memo.entry(id).or_insert_with(|| {
            let src = dict.source(id).unwrap_or(&EMPTY_SRC);
            let ok = visit_filters.iter().all(|f| match f.dimension {
                Dimension::Visit(d)
                    if !is_agent_dim(d)
                        && !matches!(d, VisitDim::EntryPage | VisitDim::ExitPage) =>
                {
                    f.accepts(visit_value(d, src, &EMPTY_AGENT))
                }
                _ => true,
            });
            let vals = slots
                .iter()
                .enumerate()
                .map(|(k, s)| match s {
                    Slot::Src(d) => values[k].id(visit_value(*d, src, &EMPTY_AGENT)),
                    _ => 0,
                })
                .collect();
            (ok, vals)
        });
        local.src_ok.push(*ok);
        for (k, s) in slots.iter().enumerate() {
            if matches!(s, Slot::Src(_)) {
                local.values[k].push(vals[k]);
            }
        }
    }
    // Agents.
    for &id in &seg.agents {
        let (ok, vals) = agent_memo.entry(id).or_insert_with(|| {
            let agent = dict.agent(id).unwrap_or(&EMPTY_AGENT);
            let ok = visit_filters.iter().all(|f| match f.dimension {
                Dimension::Visit(d) if is_agent_dim(d) => {
                    f.accepts(visit_value(d, &EMPTY_SRC, agent))
                }
                _ => true,
            });
            let vals = slots
                .iter()
                .enumerate()
                .map(|(k, s)| match s {
                    Slot::Agent(d) => values[k].id(visit_value(*d, &EMPTY_SRC, agent)),
                    _ => 0,
                })
                .collect();
            (ok, vals)
        });
        local.agent_ok.push(*ok);
        for (k, s) in slots.iter().enumerate() {
            if matches!(s, Slot::Agent(_)) {
                local.values[k].push(vals[k]);
            }
        }
    }
    // Pages: entry/exit filters, event:page filters, page-valued dimensions (index + 1).
    for (k, s) in slots.iter().enumerate() {
        if matches!(s, Slot::Entry | Slot::Exit | Slot::Page) {
            local.values[k].push(values[k].id(""));
        }
    }
    for (i, &id) in seg.pages.iter().enumerate() {
        let (entry_ok, exit_ok, page_ok, vals) = page_memo.entry(id).or_insert_with(|| {
            let path = dict.page(id).unwrap_or("");
            let pass = |dim: Dimension, fs: &[&Filter]| {
                fs.iter()
                    .filter(|f| f.dimension == dim)
                    .all(|f| f.accepts(path))
            };
            let vals = slots
                .iter()
                .enumerate()
                .map(|(k, s)| match s {
                    Slot::Entry | Slot::Exit | Slot::Page => values[k].id(path),
                    _ => 0,
                })
                .collect();
            (
                pass(Dimension::Visit(VisitDim::EntryPage), visit_filters),
                pass(Dimension::Visit(VisitDim::ExitPage), visit_filters),
                pass(Dimension::Page, event_filters),
                vals,
            )
        });
        local.entry_ok[i + 1] = *entry_ok;
        local.exit_ok[i + 1] = *exit_ok;
        local.page_ok.push(*page_ok);
        for (k, s) in slots.iter().enumerate() {
            if matches!(s, Slot::Entry | Slot::Exit | Slot::Page) {
                local.values[k].push(vals[k]);
            }
        }
    }
    // A visit without page views has the empty entry and exit page.
    for f in visit_filters {
        match f.dimension {
            Dimension::Visit(VisitDim::EntryPage) => local.entry_ok[0] &= f.accepts(""),
            Dimension::Visit(VisitDim::ExitPage) => local.exit_ok[0] &= f.accepts(""),
            _ => {}
        }
    }
    // Names.
    let name_filters: Vec<&&Filter> = event_filters
        .iter()
        .filter(|f| f.dimension == Dimension::Name)
        .collect();
    local.pageview_ok = name_filters.iter().all(|f| f.accepts(PAGEVIEW));
    for name in &seg.names {
        local
            .name_ok
            .push(name_filters.iter().all(|f| f.accepts(name)));
    }
    for (k, s) in slots.iter().enumerate() {
        if matches!(s, Slot::Name) {
            local.values[k] = seg.names.iter().map(|n| values[k].id(n)).collect();
            local.pageview_value[k] = values[k].id(PAGEVIEW);
        }
    }
    if slots.iter().any(|s| matches!(s, Slot::Time(Grain::Hour))) {
        local.hours = hours_of(day, zone, seg.day_start_ms);
    }
    local.time_ids = slots
        .iter()
        .enumerate()
        .map(|(k, s)| match s {
            Slot::Time(Grain::Hour) => local
                .hours
                .iter()
                .map(|(_, h)| values[k].id(&bucket_label(Grain::Hour, day, from, || *h)))
                .collect(),
            Slot::Time(g) => vec![values[k].id(&bucket_label(*g, day, from, || 0))],
            _ => Vec::new(),
        })
        .collect();
    let _ = dims;
    local
}

/// The local hours of `day`: (seconds from the day's start, hour), 23–25 of them.
fn hours_of(day: Date, zone: &SiteZone, day_start_ms: i64) -> Vec<(u32, i8)> {
    let (start, end) = zone.span(day, day);
    let tz = zone.time_zone();
    let mut out = Vec::with_capacity(25);
    let mut t = start;
    while t < end {
        let at = t.as_millisecond() - day_start_ms;
        out.push((
            u32::try_from(at.max(0) / 1000).unwrap_or(0),
            t.to_zoned(tz.clone()).hour(),
        ));
        match t.checked_add(jiff::SignedDuration::from_hours(1)) {
            Ok(next) => t = next,
            Err(_) => break,
        }
    }
    out
}

fn ratio(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| n as f64 / d as f64)
}

fn finish(
    query: &Query,
    rows: Rows,
    values: Vec<Values>,
    total_visitors: u64,
    from: Date,
    to: Date,
    zone: &SiteZone,
) -> Answer {
    let _ = zone;
    let mut out: Vec<Row> = rows
        .keys
        .iter()
        .zip(&rows.accs)
        .filter(|(_, a)| a.visits > 0 || a.events > 0 || a.whole_visits > 0 || a.extra_visitors > 0)
        .map(|(key, a)| Row {
            dimensions: key
                .iter()
                .zip(&query.dimensions)
                .zip(&values)
                .map(|((id, d), vals)| {
                    let v = &vals.names[*id as usize];
                    if v.is_empty() {
                        d.empty_label().to_owned()
                    } else {
                        v.clone()
                    }
                })
                .collect(),
            metrics: query
                .metrics
                .iter()
                .map(|m| metric(*m, a, total_visitors))
                .collect(),
        })
        .collect();
    // With no dimensions there is always exactly one row.
    if query.dimensions.is_empty() && out.is_empty() {
        out.push(Row {
            dimensions: Vec::new(),
            metrics: query
                .metrics
                .iter()
                .map(|m| metric(*m, &Acc::default(), total_visitors))
                .collect(),
        });
    }
    let order = order_of(query);
    out.sort_by(|a, b| {
        for (key, desc) in &order {
            let ord = match key {
                OrderKey::Metric(m) => {
                    let i = query.metrics.iter().position(|x| x == m).unwrap_or(0);
                    a.metrics[i].sort_key().total_cmp(&b.metrics[i].sort_key())
                }
                OrderKey::Dimension(d) => {
                    let i = query.dimensions.iter().position(|x| x == d).unwrap_or(0);
                    a.dimensions[i].cmp(&b.dimensions[i])
                }
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord != std::cmp::Ordering::Equal {
                return ord;
            }
        }
        a.dimensions.cmp(&b.dimensions)
    });
    let total_rows = out.len();
    let rows: Vec<Row> = out
        .into_iter()
        .skip(query.offset)
        .take(query.limit)
        .collect();
    let time_labels = query
        .dimensions
        .iter()
        .find_map(|d| match d {
            Dimension::Time(g) => Some(*g),
            _ => None,
        })
        .map(|g| labels(g, from, to))
        .unwrap_or_default();
    Answer {
        rows,
        total_rows,
        time_labels,
    }
}

/// The order rows are sorted in: as asked, else time ascending, then the first metric
/// descending (Plausible's default).
pub fn order_of(query: &Query) -> Vec<(OrderKey, bool)> {
    if !query.order_by.is_empty() {
        return query.order_by.clone();
    }
    let mut order = Vec::new();
    if let Some(t) = query
        .dimensions
        .iter()
        .find(|d| matches!(d, Dimension::Time(_)))
    {
        order.push((OrderKey::Dimension(*t), false));
    }
    if let Some(m) = query.metrics.first() {
        order.push((OrderKey::Metric(*m), true));
    }
    order
}

/// Every bucket label of `from..=to`.
fn labels(grain: Grain, from: Date, to: Date) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut day = from;
    while day <= to {
        match grain {
            Grain::Hour => {
                for h in 0..24 {
                    out.push(format!("{day} {h:02}:00:00"));
                }
            }
            g => {
                let label = bucket_label(g, day, from, || 0);
                if out.last() != Some(&label) {
                    out.push(label);
                }
            }
        }
        match day.tomorrow() {
            Ok(next) => day = next,
            Err(_) => break,
        }
    }
    out
}

fn metric(m: Metric, a: &Acc, total_visitors: u64) -> Value {
    let round = |x: f64| Value::Int(x.round() as u64);
    match m {
        Metric::Visitors => Value::Int(a.visitors.len() + a.extra_visitors),
        Metric::Visits => Value::Int(a.visits),
        Metric::Pageviews => Value::Int(a.pageviews),
        Metric::Events => Value::Int(a.events),
        Metric::ViewsPerVisit => Value::Float(
            ratio(a.whole_pageviews, a.whole_visits).map_or(0.0, |x| (x * 100.0).round() / 100.0),
        ),
        Metric::BounceRate => {
            Value::Float(ratio(a.bounces * 100, a.bounce_visits).map_or(0.0, f64::round))
        }
        Metric::VisitDuration => ratio(a.duration_s, a.whole_visits).map_or(Value::Null, round),
        Metric::TimeOnPage => {
            ratio(a.engaged_ms, a.engaged_visits * 1000).map_or(Value::Null, round)
        }
        Metric::ScrollDepth => ratio(a.scroll_sum, a.scroll_visits).map_or(Value::Null, round),
        Metric::Percentage => Value::Float(
            ratio((a.visitors.len() + a.extra_visitors) * 100, total_visitors)
                .map_or(0.0, |x| (x * 10.0).round() / 10.0),
        ),
    }
}
