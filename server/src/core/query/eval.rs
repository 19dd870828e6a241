//! Answering a [`Query`] from day segments: an [`Evaluator`] is fed one day at a time (so a
//! year is never held whole by one question) and passes once over each day's visits.
//!
//! Per segment, every value a question looks at is resolved once per local dictionary entry
//! (`local`); the pass over visits then only indexes small tables. Events are walked only
//! when the question keys, filters or measures them; otherwise a visit's own counts say it
//! all. Distinct visitors are exact: per row, the visitor numbers of a day (which come in
//! ascending order, visits being sorted by visitor) are gathered and merged into the row's
//! bitmap once per day. A question without a visitor metric keeps no visitor sets.
//!
//! Sums kept without visitor ids (imported daily aggregates, [`Extra`]) can be added to the
//! rows: their visitors are added as numbers (never merged into the bitmaps), their visits,
//! bounces and durations as the sums they are, so every ratio stays exact over both.

use std::collections::HashMap;

use jiff::civil::Date;
use roaring::RoaringBitmap;

pub use super::local::Dictionary;
use super::local::{self, Filters, Local, Memo, Slot, Values, bucket_label};
use super::{Dimension, Grain, Invalid, Metric, OrderKey, Query};
use crate::core::day::SiteZone;
use crate::core::segment::{Decoded, Events, Segment};

mod extra;
mod stored;

pub use extra::{Extra, Sums};
pub use stored::StateError;

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

/// Sums of one row. The fields every event or visit touches come first, in one cache line
/// (a row is a random access among thousands when rows are pages).
#[derive(Default, Clone)]
#[repr(C, align(64))]
struct Acc {
    events: u64,
    pageviews: u64,
    visits: u64,
    /// The engaged time of the row's last visit so far (added by `close_visit`).
    visit_engaged_ms: u64,
    /// The last visit (`Evaluator::visit_seq`) with an event in this row.
    visit: u32,
    /// That visit's deepest scroll + 1 in this row so far.
    visit_scroll: u32,
    /// The visitor counted last (`has_last`), so a repeat never reaches `pending`.
    last: u32,
    has_last: bool,
    /// Visitors not yet in `visitors`, in runs of ascending numbers (one per day).
    pending: Vec<u32>,
    visitors: RoaringBitmap,
    /// `visitors.len()` as of the last merge (counting a bitmap walks its containers).
    held: u64,
    /// Visitors counted as a number, not as ids: of [`Extra`]s (summed), and of a row
    /// [`Evaluator::close_sealed`] closed (its set no day can add to any more).
    counted_visitors: u64,
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
    /// Add the engagement of the row's last visit.
    fn close_visit(&mut self) {
        self.engaged_ms += self.visit_engaged_ms;
        self.engaged_visits += u64::from(self.visit_engaged_ms > 0);
        if self.visit_scroll > 0 {
            self.scroll_sum += u64::from(self.visit_scroll - 1);
            self.scroll_visits += 1;
        }
        self.visit_engaged_ms = 0;
        self.visit_scroll = 0;
    }

    /// Count `visitor` in this row: gathered in `pending` (a repeat of the last one skipped:
    /// a day's visits come in ascending visitor order), merged into the bitmap later.
    #[inline]
    fn visitor(&mut self, visitor: u32, dirty: &mut Vec<usize>, row: usize, pending: &mut usize) {
        if self.has_last && self.last == visitor {
            return;
        }
        self.last = visitor;
        self.has_last = true;
        if self.pending.is_empty() {
            dirty.push(row);
        }
        self.pending.push(visitor);
        *pending += 1;
    }

    /// Add `other`'s sums (not its visitor sets: the caller unites or counts them).
    fn add_sums(&mut self, other: &Acc) {
        self.events += other.events;
        self.pageviews += other.pageviews;
        self.visits += other.visits;
        self.counted_visitors += other.counted_visitors;
        self.whole_visits += other.whole_visits;
        self.duration_s += other.duration_s;
        self.whole_pageviews += other.whole_pageviews;
        self.bounce_visits += other.bounce_visits;
        self.bounces += other.bounces;
        self.engaged_ms += other.engaged_ms;
        self.engaged_visits += other.engaged_visits;
        self.scroll_sum += other.scroll_sum;
        self.scroll_visits += other.scroll_visits;
    }

    /// A copy of this settled row's sums, its last visit closed and its visitors counted as
    /// a number (no set).
    fn counts(&self) -> Acc {
        let mut out = Acc::default();
        out.add_sums(self);
        out.counted_visitors += self.visitors.len();
        out.visit_engaged_ms = self.visit_engaged_ms;
        out.visit_scroll = self.visit_scroll;
        out.close_visit();
        out
    }

    /// Merge the pending visitors into the bitmap (sorted once: merging a day at a time would
    /// copy a row's growing containers every day).
    fn settle(&mut self) {
        if !self.pending.is_empty() {
            settle(&mut self.visitors, &mut self.pending);
            self.held = self.visitors.len();
        }
    }
}

/// Merge `pending` visitor numbers (any order, repeats allowed) into `bitmap`.
fn settle(bitmap: &mut RoaringBitmap, pending: &mut Vec<u32>) {
    if pending.is_empty() {
        return;
    }
    // Taken, not drained: a row seen once keeps no buffer.
    *bitmap |= set_of(std::mem::take(pending));
}

/// The set of `numbers` (any order, repeats allowed): built in a bitset when they are many
/// over a narrow span ([`dense_set`]), else sorted (runs of ascending numbers, as each day's
/// visitors come, are merged run by run by the stable sort) and built in one pass.
pub fn set_of(mut numbers: Vec<u32>) -> RoaringBitmap {
    if let Some(set) = dense_set(&numbers) {
        return set;
    }
    numbers.sort_unstable();
    numbers.dedup();
    RoaringBitmap::from_sorted_iter(numbers).unwrap_or_default()
}

/// Fewest numbers [`dense_set`] takes (below it, sorting them is cheap anyway).
const DENSE_MIN: usize = 4096;

/// Most bits [`dense_set`]'s bitset spans per number: at 64, it holds at most two bytes per
/// byte of the numbers it replaces sorting.
const DENSE_SPREAD: u64 = 64;

/// The set of `values` built in a plain bitset, when they are many over a span at most
/// [`DENSE_SPREAD`] times their count (a popular page's or a whole site's visitors over
/// months: millions of numbers in a few hundred sorted runs); `None` when sorting them is
/// the better way. One pass setting bits replaces a sort of every number, and the bitmap it
/// gives unites with another container by container.
pub(super) fn dense_set(values: &[u32]) -> Option<RoaringBitmap> {
    if values.len() < DENSE_MIN {
        return None;
    }
    let (min, max) = values
        .iter()
        .fold((u32::MAX, 0u32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    // From the start of `min`'s container, so the bitset's bytes map onto whole containers.
    let base = min & !0xFFFF;
    let span = u64::from(max - base) + 1;
    if span > values.len() as u64 * DENSE_SPREAD || max > u32::MAX - 64 {
        return None;
    }
    let mut bits = vec![0u8; usize::try_from(span.div_ceil(8)).ok()?];
    for &v in values {
        let i = (v - base) as usize;
        bits[i >> 3] |= 1 << (i & 7);
    }
    Some(RoaringBitmap::from_lsb0_bytes(base, &bits))
}

/// Pending visitor numbers of one question beyond which all are merged at the end of a day
/// (2 MiB; a dashboard's 15 questions have a state on each of two threads, so at most 60
/// MiB wait, about half when the questions are shared out and each counts in one state.
/// Twice as many saved ~3 % of a cold year dashboard's CPU but took 64 concurrent reads
/// over 100,000 pages past their 200 MB bound).
const MAX_PENDING: usize = 1 << 19;

/// Whether a row merges its pending visitors at the end of a day: once they are as many as
/// it holds (a merge copies the row's containers, so each visitor is copied about twice in
/// all; merging at every eighth added copied it about nine times, ~7 % of a first year
/// view), and never for a few (most rows merge once, at the end). [`MAX_PENDING`] bounds
/// what waits in all rows.
fn due(held: u64, pending: &[u32]) -> bool {
    pending.len() as u64 >= held.max(4096)
}

/// The rows seen so far, by key (one interned value number per dimension): without
/// dimensions one row, with one a dense table by value number, else a hash of the key.
#[derive(Default, Clone)]
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
#[derive(Clone)]
pub struct Evaluator {
    query: Query,
    from: Date,
    to: Date,
    zone: SiteZone,
    slots: Vec<Slot>,
    filters: Filters,
    has_page_filter: bool,
    event_rows: bool,
    has_page_dim: bool,
    has_name_dim: bool,
    want_total: bool,
    /// Whether a metric counts distinct visitors (else no row keeps a visitor set).
    want_visitors: bool,
    need_events: bool,
    values: Vec<Values>,
    memo: Memo,
    rows: Rows,
    total: RoaringBitmap,
    total_pending: Vec<u32>,
    /// Pending visitor numbers in all rows.
    pending: usize,
    key: Vec<u32>,
    /// Rows with visitors of the current day not yet merged.
    dirty: Vec<usize>,
    /// The visits walked event by event so far (each row notes the last one it was in).
    visit_seq: u32,
    /// Visitors of the [`Extra`]s added.
    extra_total: u64,
}

impl Evaluator {
    /// A question over the local days `from..=to` of a site in `zone`.
    pub fn new(query: &Query, from: Date, to: Date, zone: &SiteZone) -> Result<Self, Invalid> {
        query.check()?;
        Ok(Self::checked(query, from, to, zone))
    }

    /// [`Evaluator::new`] of a question already checked.
    fn checked(query: &Query, from: Date, to: Date, zone: &SiteZone) -> Self {
        let dims = &query.dimensions;
        let (visit, event) = query
            .filters
            .iter()
            .cloned()
            .partition(|f| !f.dimension.is_event());
        let filters = Filters { visit, event };
        let event_rows = dims.iter().any(|d| d.is_event());
        let need_events = event_rows
            || !filters.event.is_empty()
            || dims.contains(&Dimension::Time(Grain::Hour))
            || query
                .metrics
                .iter()
                .any(|m| matches!(m, Metric::TimeOnPage | Metric::ScrollDepth));
        Self {
            query: query.clone(),
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
            want_visitors: query
                .metrics
                .iter()
                .any(|m| matches!(m, Metric::Visitors | Metric::Percentage)),
            need_events,
            values: dims.iter().map(|_| Values::default()).collect(),
            memo: Memo::default(),
            rows: Rows::default(),
            total: RoaringBitmap::new(),
            total_pending: Vec::new(),
            pending: 0,
            key: vec![0; dims.len()],
            dirty: Vec::new(),
            visit_seq: 0,
            extra_total: 0,
        }
    }

    /// What decides how this question counts: its dimensions, filters and which sums it
    /// keeps (events walked, visitor sets, the total set); not its metrics as such, order or
    /// page. Two questions with one counting key count the same state, so a kept state of
    /// one serves the other ([`Evaluator::finish_over`]).
    pub fn counting_key(&self) -> String {
        format!(
            "{:?}\u{1f}{:?}\u{1f}{}{}{}",
            self.query.dimensions,
            self.query.filters,
            u8::from(self.need_events),
            u8::from(self.want_visitors),
            u8::from(self.want_total)
        )
    }

    /// Whether this question reads the events part of a day (else the visits part is enough).
    pub fn needs_events(&self) -> bool {
        self.need_events
    }

    /// Count one day. A question that [`Evaluator::needs_events`] skips a day given without
    /// its events part (the caller reads it whenever one of its questions needs it).
    pub fn add(&mut self, input: &DayInput<'_>, dict: &dyn Dictionary) {
        let DayInput {
            day,
            seg,
            events,
            cols,
        } = *input;
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
        if !self.need_events && self.slots.len() <= 1 {
            self.add_visits(&local, cols);
            self.end_day();
            return;
        }
        let c = cols;
        let has_event_filters = !self.filters.event.is_empty();
        let (mut pv_at, mut ev_at) = (0usize, 0usize);
        for i in 0..c.visitor.len() {
            let (pageviews, customs) = (c.pageviews[i], c.events[i]);
            let (pv_range, ev_range) = (
                pv_at..pv_at + pageviews as usize,
                ev_at..ev_at + customs as usize,
            );
            pv_at = pv_range.end;
            ev_at = ev_range.end;
            let (src, agent, entry, exit) = (
                c.src[i] as usize,
                c.agent[i] as usize,
                c.entry[i] as usize,
                c.exit[i] as usize,
            );
            if !(local.src_ok[src]
                && local.agent_ok[agent]
                && local.entry_ok[entry]
                && local.exit_ok[exit])
            {
                continue;
            }
            if events.is_some()
                && has_event_filters
                && !pv_range.clone().any(|p| pv_match(&local, c, p))
                && !ev_range.clone().any(|x| ev_match(&local, c, x))
            {
                continue;
            }
            let visitor = c.visitor[i];
            if self.want_total && self.total_pending.last() != Some(&visitor) {
                self.total_pending.push(visitor);
                self.pending += 1;
            }
            let bounce = pageviews < 2 && customs == 0;
            // Whole-visit sums: keyed by the visit (a page breakdown: its entry page).
            for (k, s) in self.slots.iter().enumerate() {
                self.key[k] = match s {
                    Slot::Src(_) => local.values[k][src],
                    Slot::Agent(_) => local.values[k][agent],
                    Slot::Entry | Slot::Page => local.values[k][entry],
                    Slot::Exit => local.values[k][exit],
                    Slot::Name => 0,
                    Slot::Time(g) => local.time_value(k, *g, c.start_s[i]),
                };
            }
            let whole_ok = !self.has_page_dim || entry != 0;
            if whole_ok && !self.has_name_dim {
                let r = self.rows.at(&self.key);
                let acc = &mut self.rows.accs[r];
                acc.whole_visits += 1;
                acc.duration_s += u64::from(c.duration_s[i]);
                acc.whole_pageviews += u64::from(pageviews);
                let entered_on_page =
                    !self.has_page_filter || (entry != 0 && local.page_ok[entry - 1]);
                if entered_on_page {
                    acc.bounce_visits += 1;
                    acc.bounces += u64::from(bounce);
                }
                if !self.event_rows {
                    acc.visits += 1;
                    if self.want_visitors {
                        acc.visitor(visitor, &mut self.dirty, r, &mut self.pending);
                    }
                }
                if !self.need_events {
                    // Every event of the visit counts, in the visit's row.
                    acc.pageviews += u64::from(pageviews);
                    acc.events += u64::from(pageviews + customs);
                }
            }
            if events.is_none() {
                continue;
            }
            // Event sums: keyed by each matching event.
            self.visit_seq += 1;
            for p in pv_range {
                if has_event_filters && !pv_match(&local, c, p) {
                    continue;
                }
                self.event_key(&local, c, EventAt::Pageview(p));
                let r = self.rows.at(&self.key);
                self.add_event(r, visitor, true, c.pv_engaged_ms[p], c.pv_scroll[p]);
            }
            for x in ev_range {
                if has_event_filters && !ev_match(&local, c, x) {
                    continue;
                }
                self.event_key(&local, c, EventAt::Custom(x));
                let r = self.rows.at(&self.key);
                self.add_event(r, visitor, false, 0, 0);
            }
        }
        self.end_day();
    }

    /// The visits of a day for a question that keys them by at most one visit value and
    /// needs no events (most questions): each local value's row looked up once, then one
    /// tight pass.
    fn add_visits(&mut self, local: &Local, c: &Decoded) {
        let n = c.visitor.len();
        // The row of each local index of the keying column (all visits: one row).
        let (col, rows_of): (&[u32], Vec<u32>) = match self.slots.first() {
            None => (&[], vec![self.rows.at(&[]) as u32]),
            Some(Slot::Time(g)) => {
                let v = local.time_value(0, *g, 0);
                (&[], vec![self.rows.at(&[v]) as u32])
            }
            Some(s) => {
                let col: &[u32] = match s {
                    Slot::Src(_) => &c.src,
                    Slot::Agent(_) => &c.agent,
                    Slot::Entry | Slot::Page => &c.entry,
                    _ => &c.exit,
                };
                let rows = &mut self.rows;
                (
                    col,
                    local.values[0]
                        .iter()
                        .map(|v| rows.at(&[*v]) as u32)
                        .collect(),
                )
            }
        };
        let filtered = !self.filters.visit.is_empty();
        let want_visitors = self.want_visitors;
        let accs = &mut self.rows.accs;
        for i in 0..n {
            if filtered
                && !(local.src_ok[c.src[i] as usize]
                    && local.agent_ok[c.agent[i] as usize]
                    && local.entry_ok[c.entry[i] as usize]
                    && local.exit_ok[c.exit[i] as usize])
            {
                continue;
            }
            let r = match col.get(i) {
                Some(&x) => rows_of[x as usize] as usize,
                None => rows_of[0] as usize,
            };
            let (pageviews, customs, visitor) = (c.pageviews[i], c.events[i], c.visitor[i]);
            let acc = &mut accs[r];
            acc.visits += 1;
            acc.whole_visits += 1;
            acc.bounce_visits += 1;
            acc.bounces += u64::from(pageviews < 2 && customs == 0);
            acc.duration_s += u64::from(c.duration_s[i]);
            acc.whole_pageviews += u64::from(pageviews);
            acc.pageviews += u64::from(pageviews);
            acc.events += u64::from(pageviews + customs);
            if want_visitors {
                acc.visitor(visitor, &mut self.dirty, r, &mut self.pending);
            }
            if self.want_total && self.total_pending.last() != Some(&visitor) {
                self.total_pending.push(visitor);
                self.pending += 1;
            }
        }
    }

    /// Merge what is due of the day's visitors.
    fn end_day(&mut self) {
        if self.pending > MAX_PENDING {
            self.settle();
        } else {
            let accs = &mut self.rows.accs;
            let mut settled = 0;
            self.dirty.retain(|&r| {
                let acc = &mut accs[r];
                if due(acc.held, &acc.pending) {
                    settled += acc.pending.len();
                    acc.settle();
                    false
                } else {
                    true
                }
            });
            if due(self.total.len(), &self.total_pending) {
                settled += self.total_pending.len();
                settle(&mut self.total, &mut self.total_pending);
            }
            self.pending -= settled;
        }
    }

    /// Merge every pending visitor into the bitmaps now (else they are merged when due, and
    /// at the end).
    pub fn settle(&mut self) {
        for r in self.dirty.drain(..) {
            self.rows.accs[r].settle();
        }
        settle(&mut self.total, &mut self.total_pending);
        self.pending = 0;
    }

    fn event_key(&mut self, local: &Local, c: &Decoded, at: EventAt) {
        for (k, s) in self.slots.iter().enumerate() {
            match (s, at) {
                (Slot::Page, EventAt::Pageview(p)) => {
                    self.key[k] = local.values[k][c.pv_page[p] as usize + 1];
                }
                (Slot::Page, EventAt::Custom(x)) => {
                    self.key[k] = local.values[k][c.c_page[x] as usize + 1];
                }
                (Slot::Name, EventAt::Pageview(_)) => self.key[k] = local.pageview_value[k],
                (Slot::Name, EventAt::Custom(x)) => {
                    self.key[k] = local.values[k][c.c_name[x] as usize];
                }
                (Slot::Time(g), EventAt::Pageview(p)) => {
                    self.key[k] = local.time_value(k, *g, c.pv_at_s[p]);
                }
                (Slot::Time(g), EventAt::Custom(x)) => {
                    self.key[k] = local.time_value(k, *g, c.c_at_s[x]);
                }
                // Visit dimensions keep the visit's value, set for its whole-visit sums.
                _ => {}
            }
        }
    }

    /// Count an event of the current visit (`visit_seq`) by `visitor` in row `r`.
    #[inline]
    fn add_event(&mut self, r: usize, visitor: u32, pageview: bool, engaged_ms: u32, scroll: u32) {
        let acc = &mut self.rows.accs[r];
        acc.events += 1;
        acc.pageviews += u64::from(pageview);
        if acc.visit != self.visit_seq {
            // The row's first event of this visit: the row's previous visit is complete.
            acc.close_visit();
            acc.visit = self.visit_seq;
            if self.event_rows {
                acc.visits += 1;
                if self.want_visitors {
                    acc.visitor(visitor, &mut self.dirty, r, &mut self.pending);
                }
            }
        }
        acc.visit_engaged_ms += u64::from(engaged_ms);
        acc.visit_scroll = acc.visit_scroll.max(scroll);
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

    /// About how many bytes this state holds (rows, their visitor sets, interned values and
    /// memoised verdicts): what keeping a copy of it costs.
    pub fn size(&self) -> usize {
        let rows: usize = self
            .rows
            .accs
            .iter()
            .map(|a| size_of::<Acc>() + a.visitors.serialized_size() + a.pending.capacity() * 4)
            .sum();
        let keys = self.rows.keys.len() * (16 + 4 * self.key.len()) * 2 + self.rows.dense.len() * 4;
        let values: usize = self
            .values
            .iter()
            .flat_map(|v| v.names.iter())
            .map(|n| n.len() + 48)
            .sum();
        rows + keys
            + values
            + self.memo.size()
            + self.total.serialized_size()
            + self.total_pending.capacity() * 4
    }

    /// Drop the visitor sets of the time rows no day can add to any more, keeping their
    /// counts: rows whose bucket holds only days `sealed` says are sealed (a sealed day
    /// changes only by a new seal, which makes a state over it stale anyway). What a kept
    /// state needs of a year by day is then 365 numbers, not 365 visitor sets. Call it on a
    /// state counted over sealed days only, settled.
    pub fn close_sealed(&mut self, sealed: impl Fn(Date) -> bool) {
        let Some((k, grain)) = self.slots.iter().enumerate().find_map(|(k, s)| match s {
            Slot::Time(g) => Some((k, *g)),
            _ => None,
        }) else {
            return;
        };
        self.settle();
        // Each bucket label of the range (an hour by its day), and whether all its days are
        // sealed.
        let of = |day: Date| match grain {
            Grain::Hour => day.to_string(),
            g => bucket_label(g, day, self.from, 0),
        };
        let mut closed: HashMap<String, bool> = HashMap::new();
        let mut day = self.from;
        while day <= self.to {
            let sealed_day = sealed(day);
            closed
                .entry(of(day))
                .and_modify(|c| *c &= sealed_day)
                .or_insert(sealed_day);
            match day.tomorrow() {
                Ok(next) => day = next,
                Err(_) => break,
            }
        }
        for (key, acc) in self.rows.keys.iter().zip(&mut self.rows.accs) {
            let name: &str = &self.values[k].names[key[k] as usize];
            let bucket = match grain {
                Grain::Hour => name.get(..10).unwrap_or(name),
                _ => name,
            };
            if closed.get(bucket).copied().unwrap_or(false) && !acc.visitors.is_empty() {
                acc.counted_visitors += acc.visitors.len();
                acc.visitors = RoaringBitmap::new();
                acc.held = 0;
            }
        }
    }

    /// The same question over no days yet: for other days, to [`Evaluator::merge`] back.
    pub fn fresh(&self) -> Self {
        Self::checked(&self.query, self.from, self.to, &self.zone)
    }

    /// Fold in `other`, the same question over other days (visits never span two days, so
    /// sums add and visitor sets unite exactly).
    pub fn merge(&mut self, mut other: Evaluator) {
        other.settle();
        let width = self.key.len();
        let mut key = vec![0u32; width];
        for (other_key, mut acc) in other.rows.keys.iter().zip(other.rows.accs) {
            acc.close_visit();
            for (k, id) in other_key.iter().enumerate() {
                key[k] = self.values[k].id(&other.values[k].names[*id as usize]);
            }
            let r = self.rows.at(&key);
            let mine = &mut self.rows.accs[r];
            mine.add_sums(&acc);
            mine.visitors |= acc.visitors;
            mine.held = mine.visitors.len();
        }
        self.total |= other.total;
        self.extra_total += other.extra_total;
    }

    /// The answer over this state's days and `base`'s: `base` is the same question (any
    /// page, order or metrics of one [`Evaluator::counting_key`]) over other days, settled,
    /// and is only read (a kept state serves many readers without a copy of its visitor
    /// sets: a row's visitors are counted as the size of the union of both sets).
    pub fn finish_over(mut self, base: &Evaluator) -> Answer {
        debug_assert_eq!(base.pending, 0, "a base is settled");
        self.settle();
        let mut values = base.values.clone();
        let mut rows = Rows {
            index: base.rows.index.clone(),
            dense: base.rows.dense.clone(),
            keys: base.rows.keys.clone(),
            accs: base.rows.accs.iter().map(Acc::counts).collect(),
        };
        let mut key = vec![0u32; self.key.len()];
        for (own_key, acc) in self.rows.keys.iter().zip(&mut self.rows.accs) {
            acc.close_visit();
            for (k, id) in own_key.iter().enumerate() {
                key[k] = values[k].id(&self.values[k].names[*id as usize]);
            }
            let r = rows.at(&key);
            let new = match base.rows.accs.get(r) {
                Some(b) => acc.visitors.len() - acc.visitors.intersection_len(&b.visitors),
                None => acc.visitors.len(),
            };
            let mine = &mut rows.accs[r];
            mine.add_sums(acc);
            mine.counted_visitors += new;
        }
        let total = base.total.len() + self.total.len() - self.total.intersection_len(&base.total)
            + base.extra_total
            + self.extra_total;
        finish(&self.query, rows, values, total, self.from, self.to)
    }

    /// The answer.
    pub fn finish(mut self) -> Answer {
        self.settle();
        for acc in &mut self.rows.accs {
            acc.close_visit();
        }
        finish(
            &self.query,
            self.rows,
            self.values,
            self.total.len() + self.extra_total,
            self.from,
            self.to,
        )
    }
}

#[inline]
fn pv_match(local: &Local, c: &Decoded, p: usize) -> bool {
    local.page_ok[c.pv_page[p] as usize] && local.pageview_ok
}

#[inline]
fn ev_match(local: &Local, c: &Decoded, x: usize) -> bool {
    local.page_ok[c.c_page[x] as usize] && local.name_ok[c.c_name[x] as usize]
}

/// A day's parts as [`run`] takes them.
pub type Day<'a> = (Date, &'a Segment, Option<&'a Events>);

/// One day as an [`Evaluator`] reads it: its parts, and their columns decoded
/// ([`Decoded::fill`] of the same parts, once for every question of a read).
#[derive(Clone, Copy)]
pub struct DayInput<'a> {
    pub day: Date,
    pub seg: &'a Segment,
    pub events: Option<&'a Events>,
    pub cols: &'a Decoded,
}

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
    let mut cols = Decoded::default();
    for &(day, seg, events) in segments {
        let events = events.filter(|_| e.needs_events());
        cols.fill(seg, events);
        let input = DayInput {
            day,
            seg,
            events,
            cols: &cols,
        };
        e.add(&input, dict);
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
    // Rank (row, its metrics) first; only the rows of the asked page get their labels. The
    // metrics of every row sit in one flat table (a site's page breakdown can have 100,000
    // rows: one small vector each would hold twice the memory).
    let width = query.metrics.len();
    let mut table: Vec<Value> = Vec::new();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, a) in rows.accs.iter().enumerate().filter(|(_, a)| {
        a.visits > 0 || a.events > 0 || a.whole_visits > 0 || a.counted_visitors > 0
    }) {
        out.push((i, out.len()));
        table.extend(query.metrics.iter().map(|m| metric(*m, a, total_visitors)));
    }
    let metrics_of = |at: usize| &table[at * width..(at + 1) * width];
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
    out.sort_by(|&(ra, at_a), &(rb, at_b)| {
        let (ma, mb) = (metrics_of(at_a), metrics_of(at_b));
        for (key, desc) in &order {
            let ord = match key {
                OrderKey::Metric(m) => {
                    let i = query.metrics.iter().position(|x| x == m).unwrap_or(0);
                    ma[i].sort_key().total_cmp(&mb[i].sort_key())
                }
                OrderKey::Dimension(d) => {
                    let k = query.dimensions.iter().position(|x| x == d).unwrap_or(0);
                    dims_cmp(ra, rb, Some(k))
                }
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord != std::cmp::Ordering::Equal {
                return ord;
            }
        }
        dims_cmp(ra, rb, None)
    });
    // With no dimensions there is always exactly one row.
    let empty = query.dimensions.is_empty() && out.is_empty();
    let total_rows = if empty { 1 } else { out.len() };
    let mut rows: Vec<Row> = out
        .into_iter()
        .skip(query.offset)
        .take(query.limit)
        .map(|(i, at)| Row {
            dimensions: rows.keys[i]
                .iter()
                .enumerate()
                .map(|(k, id)| label(k, *id).to_owned())
                .collect(),
            metrics: metrics_of(at).to_vec(),
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
        Metric::Visitors => Value::Int(a.visitors.len() + a.counted_visitors),
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
            ratio(
                (a.visitors.len() + a.counted_visitors) * 100,
                total_visitors,
            )
            .map_or(0.0, |x| (x * 10.0).round() / 10.0),
        ),
    }
}
