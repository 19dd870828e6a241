//! Answering a [`Query`] from day segments: an [`Evaluator`] is fed one day at a time (so a
//! year is never held whole by one question) and passes once over each day's visits.
//!
//! Per segment, every value a question looks at is resolved once per local dictionary entry
//! (`local`); the pass over visits then only indexes small tables. Events are walked only
//! when the question keys, filters or measures them; otherwise a visit's own counts say it
//! all. Distinct visitors are exact: per row, the visitor numbers of a day (which come in
//! ascending order, visits being sorted by visitor) are gathered and merged into the row's
//! bitmap once per day.
//!
//! Sums kept without visitor ids (imported daily aggregates, [`Extra`]) can be added to the
//! rows: their visitors are added as numbers (never merged into the bitmaps), their visits,
//! bounces and durations as the sums they are, so every ratio stays exact over both.

use std::collections::HashMap;

use jiff::civil::Date;
use roaring::RoaringBitmap;

use super::local::{self, Filters, Local, Memo, Slot, Values, bucket_label};
use super::{Dimension, Grain, Invalid, Metric, OrderKey, Query};
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::segment::{Events, Segment};

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
    /// This day's visitors not yet in `visitors`, ascending.
    fresh: Vec<u32>,
    /// Visitors of [`Extra`]s, summed.
    extra_visitors: u64,
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
    /// Count `visitor` in this row (visits of a day come in ascending visitor order).
    #[inline]
    fn visitor(&mut self, visitor: u32, dirty: &mut Vec<usize>, row: usize) {
        match self.fresh.last() {
            Some(&last) if last == visitor => {}
            Some(&last) if last > visitor => {
                // Out of order (never from a built segment): straight in.
                self.visitors.insert(visitor);
            }
            last => {
                if last.is_none() {
                    dirty.push(row);
                }
                self.fresh.push(visitor);
            }
        }
    }

    /// Merge the day's visitors into the bitmap.
    fn settle(&mut self) {
        if self.fresh.is_empty() {
            return;
        }
        // Taken, not drained: a row seen on one day keeps no buffer.
        if let Ok(day) = RoaringBitmap::from_sorted_iter(std::mem::take(&mut self.fresh)) {
            self.visitors |= day;
        }
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
    #[inline]
    fn at(&mut self, key: &[u32]) -> usize {
        match key {
            [] if !self.accs.is_empty() => return 0,
            [v] => {
                if let Some(&r) = self.dense.get(*v as usize)
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

/// Where an event sits in a segment.
#[derive(Clone, Copy)]
enum EventAt {
    Pageview(usize),
    Custom(usize),
}

/// One question being answered, day by day.
pub struct Evaluator<'q> {
    query: &'q Query,
    from: Date,
    to: Date,
    zone: SiteZone,
    slots: Vec<Slot>,
    filters: Filters<'q>,
    has_page_filter: bool,
    event_rows: bool,
    has_page_dim: bool,
    has_name_dim: bool,
    want_total: bool,
    need_events: bool,
    values: Vec<Values>,
    memo: Memo,
    rows: Rows,
    total: RoaringBitmap,
    total_fresh: Vec<u32>,
    key: Vec<u32>,
    /// Rows with visitors of the current day not yet merged.
    dirty: Vec<usize>,
    /// This visit's event contributions per row: (row, engaged ms, engaged?, scroll max + 1).
    touched: Vec<(usize, u64, bool, u32)>,
    /// Visitors of the [`Extra`]s added.
    extra_total: u64,
}

impl<'q> Evaluator<'q> {
    /// A question over the local days `from..=to` of a site in `zone`.
    pub fn new(query: &'q Query, from: Date, to: Date, zone: &SiteZone) -> Result<Self, Invalid> {
        query.check()?;
        let dims = &query.dimensions;
        let (visit, event) = query.filters.iter().partition(|f| !f.dimension.is_event());
        let filters = Filters { visit, event };
        let event_rows = dims.iter().any(|d| d.is_event());
        let need_events = event_rows
            || !filters.event.is_empty()
            || dims.contains(&Dimension::Time(Grain::Hour))
            || query
                .metrics
                .iter()
                .any(|m| matches!(m, Metric::TimeOnPage | Metric::ScrollDepth));
        Ok(Self {
            query,
            from,
            to,
            zone: zone.clone(),
            slots: dims.iter().map(|d| local::slot(*d)).collect(),
            has_page_filter: filters.event.iter().any(|f| f.dimension == Dimension::Page),
            filters,
            event_rows,
            has_page_dim: dims.contains(&Dimension::Page),
            has_name_dim: dims.contains(&Dimension::Name),
            want_total: query.metrics.contains(&Metric::Percentage),
            need_events,
            values: dims.iter().map(|_| Values::default()).collect(),
            memo: Memo::default(),
            rows: Rows::default(),
            total: RoaringBitmap::new(),
            total_fresh: Vec::new(),
            key: vec![0; dims.len()],
            dirty: Vec::new(),
            touched: Vec::new(),
            extra_total: 0,
        })
    }

    /// Whether this question reads the events part of a day (else the visits part is enough).
    pub fn needs_events(&self) -> bool {
        self.need_events
    }

    /// Count one day: its visits part, and its events part when [`Evaluator::needs_events`]
    /// (a day given without it is counted as if it had no events).
    pub fn add(
        &mut self,
        day: Date,
        seg: &Segment,
        events: Option<&Events>,
        dict: &dyn Dictionary,
    ) {
        let events = if self.need_events { events } else { None };
        if self.need_events && events.is_none() {
            return;
        }
        let local = local::resolve(
            &self.slots,
            &self.filters,
            (day, self.from),
            &self.zone,
            seg,
            events,
            dict,
            &mut self.values,
            &mut self.memo,
        );
        let v = &seg.visits;
        let (mut pv_at, mut ev_at) = (0usize, 0usize);
        for i in 0..seg.visit_count() {
            let (pvs, evs) = (v.pageviews.get(i) as usize, v.events.get(i) as usize);
            let (pv_range, ev_range) = (pv_at..pv_at + pvs, ev_at..ev_at + evs);
            pv_at += pvs;
            ev_at += evs;
            let (src, agent, entry, exit) = (
                v.src.get(i) as usize,
                v.agent.get(i) as usize,
                v.entry.get(i) as usize,
                v.exit.get(i) as usize,
            );
            if !(local.src_ok[src]
                && local.agent_ok[agent]
                && local.entry_ok[entry]
                && local.exit_ok[exit])
            {
                continue;
            }
            if let Some(e) = events
                && !self.filters.event.is_empty()
                && !pv_range.clone().any(|p| pv_match(&local, e, p))
                && !ev_range.clone().any(|x| ev_match(&local, e, x))
            {
                continue;
            }
            let visitor = v.visitor.get(i);
            if self.want_total && self.total_fresh.last() != Some(&visitor) {
                self.total_fresh.push(visitor);
            }
            let (pageviews, customs) = (v.pageviews.get(i), v.events.get(i));
            let bounce = pageviews < 2 && customs == 0;
            // Whole-visit sums: keyed by the visit (a page breakdown: its entry page).
            for (k, s) in self.slots.iter().enumerate() {
                self.key[k] = match s {
                    Slot::Src(_) => local.values[k][src],
                    Slot::Agent(_) => local.values[k][agent],
                    Slot::Entry | Slot::Page => local.values[k][entry],
                    Slot::Exit => local.values[k][exit],
                    Slot::Name => 0,
                    Slot::Time(g) => local.time_value(k, *g, v.start_s.get(i)),
                };
            }
            let whole_ok = !self.has_page_dim || entry != 0;
            if whole_ok && !self.has_name_dim {
                let r = self.rows.at(&self.key);
                let acc = &mut self.rows.accs[r];
                acc.whole_visits += 1;
                acc.duration_s += u64::from(v.duration_s.get(i));
                acc.whole_pageviews += u64::from(pageviews);
                let entered_on_page =
                    !self.has_page_filter || (entry != 0 && local.page_ok[entry - 1]);
                if entered_on_page {
                    acc.bounce_visits += 1;
                    acc.bounces += u64::from(bounce);
                }
                if !self.event_rows {
                    acc.visits += 1;
                    acc.visitor(visitor, &mut self.dirty, r);
                }
                if !self.need_events {
                    // Every event of the visit counts, in the visit's row.
                    acc.pageviews += u64::from(pageviews);
                    acc.events += u64::from(pageviews + customs);
                }
            }
            let Some(e) = events else {
                continue;
            };
            // Event sums: keyed by each matching event.
            self.touched.clear();
            for p in pv_range {
                if !self.filters.event.is_empty() && !pv_match(&local, e, p) {
                    continue;
                }
                self.event_key(&local, e, EventAt::Pageview(p));
                let eng = u64::from(e.pageviews.engaged_ms.get(p));
                let scroll = e.pageviews.scroll.get(p);
                self.add_event(true, eng, eng > 0 || scroll > 0, scroll);
            }
            for x in ev_range {
                if !self.filters.event.is_empty() && !ev_match(&local, e, x) {
                    continue;
                }
                self.event_key(&local, e, EventAt::Custom(x));
                self.add_event(false, 0, false, 0);
            }
            for t in 0..self.touched.len() {
                let (r, eng, reported, scroll) = self.touched[t];
                let acc = &mut self.rows.accs[r];
                if self.event_rows {
                    acc.visits += 1;
                    acc.visitor(visitor, &mut self.dirty, r);
                }
                acc.engaged_ms += eng;
                acc.engaged_visits += u64::from(reported && eng > 0);
                if scroll > 0 {
                    acc.scroll_sum += u64::from(scroll - 1);
                    acc.scroll_visits += 1;
                }
            }
        }
        // The day's visitors into the rows' bitmaps.
        for r in self.dirty.drain(..) {
            self.rows.accs[r].settle();
        }
        if !self.total_fresh.is_empty()
            && let Ok(day) = RoaringBitmap::from_sorted_iter(self.total_fresh.drain(..))
        {
            self.total |= day;
        }
    }

    fn event_key(&mut self, local: &Local, e: &Events, at: EventAt) {
        for (k, s) in self.slots.iter().enumerate() {
            match (s, at) {
                (Slot::Page, EventAt::Pageview(p)) => {
                    self.key[k] = local.values[k][e.pageviews.page.get(p) as usize + 1];
                }
                (Slot::Page, EventAt::Custom(x)) => {
                    self.key[k] = local.values[k][e.customs.page.get(x) as usize + 1];
                }
                (Slot::Name, EventAt::Pageview(_)) => self.key[k] = local.pageview_value[k],
                (Slot::Name, EventAt::Custom(x)) => {
                    self.key[k] = local.values[k][e.customs.name.get(x) as usize];
                }
                (Slot::Time(g), EventAt::Pageview(p)) => {
                    self.key[k] = local.time_value(k, *g, e.pageviews.at_s.get(p));
                }
                (Slot::Time(g), EventAt::Custom(x)) => {
                    self.key[k] = local.time_value(k, *g, e.customs.at_s.get(x));
                }
                // Visit dimensions keep the visit's value, set for its whole-visit sums.
                _ => {}
            }
        }
    }

    fn add_event(&mut self, pageview: bool, eng: u64, reported: bool, scroll: u32) {
        let r = self.rows.at(&self.key);
        let acc = &mut self.rows.accs[r];
        acc.events += 1;
        acc.pageviews += u64::from(pageview);
        match self.touched.iter_mut().find(|t| t.0 == r) {
            Some(t) => {
                t.1 += eng;
                t.2 |= reported;
                t.3 = t.3.max(scroll);
            }
            None => self.touched.push((r, eng, reported, scroll)),
        }
    }

    /// Add sums without visitor ids to the rows their values (and day) name. The caller hands
    /// only extras that pass the query's filters, each with one value per non-time dimension;
    /// one with the wrong number of values is an [`Invalid`].
    pub fn add_extra(&mut self, extra: &[Extra]) -> Result<(), Invalid> {
        self.extra_total += extra::add(
            extra,
            &self.slots,
            &mut self.key,
            &mut self.values,
            &mut self.rows,
            self.from,
        )?;
        Ok(())
    }

    /// The answer.
    pub fn finish(self) -> Answer {
        finish(
            self.query,
            self.rows,
            self.values,
            self.total.len() + self.extra_total,
            self.from,
            self.to,
        )
    }
}

#[inline]
fn pv_match(local: &Local, e: &Events, p: usize) -> bool {
    local.page_ok[e.pageviews.page.get(p) as usize] && local.pageview_ok
}

#[inline]
fn ev_match(local: &Local, e: &Events, x: usize) -> bool {
    local.page_ok[e.customs.page.get(x) as usize] && local.name_ok[e.customs.name.get(x) as usize]
}

/// A day's parts as [`run`] takes them.
pub type Day<'a> = (Date, &'a Segment, Option<&'a Events>);

/// Answer `query` from the segments of the local days `from..=to` of a site in `zone`
/// (`segments` holds the days that have data, any order, with their events parts).
pub fn run(
    query: &Query,
    from: Date,
    to: Date,
    zone: &SiteZone,
    segments: &[Day<'_>],
    dict: &dyn Dictionary,
) -> Result<Answer, Invalid> {
    run_with(query, from, to, zone, segments, dict, &[])
}

/// [`run`], with `extra` sums added (see [`Evaluator::add_extra`]).
pub fn run_with(
    query: &Query,
    from: Date,
    to: Date,
    zone: &SiteZone,
    segments: &[Day<'_>],
    dict: &dyn Dictionary,
    extra: &[Extra],
) -> Result<Answer, Invalid> {
    let mut e = Evaluator::new(query, from, to, zone)?;
    for (day, seg, events) in segments {
        e.add(*day, seg, *events, dict);
    }
    e.add_extra(extra)?;
    Ok(e.finish())
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
) -> Answer {
    let label = |k: usize, id: u32| -> &str {
        let v: &str = &values[k].names[id as usize];
        if v.is_empty() {
            query.dimensions[k].empty_label()
        } else {
            v
        }
    };
    // Rank (row, metrics) first; only the rows of the asked page get their labels.
    let mut out: Vec<(usize, Vec<Value>)> = rows
        .accs
        .iter()
        .enumerate()
        .filter(|(_, a)| a.visits > 0 || a.events > 0 || a.whole_visits > 0 || a.extra_visitors > 0)
        .map(|(i, a)| {
            let metrics = query
                .metrics
                .iter()
                .map(|m| metric(*m, a, total_visitors))
                .collect();
            (i, metrics)
        })
        .collect();
    let order = order_of(query);
    let dims_cmp = |a: usize, b: usize, only: Option<usize>| {
        let (ka, kb) = (&rows.keys[a], &rows.keys[b]);
        let positions = match only {
            Some(k) => k..k + 1,
            None => 0..query.dimensions.len(),
        };
        for k in positions {
            let ord = label(k, ka[k]).cmp(label(k, kb[k]));
            if ord != std::cmp::Ordering::Equal {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    };
    out.sort_by(|(ra, ma), (rb, mb)| {
        for (key, desc) in &order {
            let ord = match key {
                OrderKey::Metric(m) => {
                    let i = query.metrics.iter().position(|x| x == m).unwrap_or(0);
                    ma[i].sort_key().total_cmp(&mb[i].sort_key())
                }
                OrderKey::Dimension(d) => {
                    let k = query.dimensions.iter().position(|x| x == d).unwrap_or(0);
                    dims_cmp(*ra, *rb, Some(k))
                }
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord != std::cmp::Ordering::Equal {
                return ord;
            }
        }
        dims_cmp(*ra, *rb, None)
    });
    // With no dimensions there is always exactly one row.
    let empty = query.dimensions.is_empty() && out.is_empty();
    let total_rows = if empty { 1 } else { out.len() };
    let mut rows: Vec<Row> = out
        .into_iter()
        .skip(query.offset)
        .take(query.limit)
        .map(|(i, metrics)| Row {
            dimensions: rows.keys[i]
                .iter()
                .enumerate()
                .map(|(k, id)| label(k, *id).to_owned())
                .collect(),
            metrics,
        })
        .collect();
    if empty && query.offset == 0 && query.limit > 0 {
        rows.push(Row {
            dimensions: Vec::new(),
            metrics: query
                .metrics
                .iter()
                .map(|m| metric(*m, &Acc::default(), total_visitors))
                .collect(),
        });
    }
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
                    out.push(bucket_label(Grain::Hour, day, from, h));
                }
            }
            g => {
                let label = bucket_label(g, day, from, 0);
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
