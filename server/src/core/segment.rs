//! A day segment: one site's web traffic of one local day as visits, page views and custom
//! events in columns. Every analytics answer (visits, bounce rate, durations, every
//! breakdown and filter) is computed from segments (`core::query`), so there is one
//! definition of each number, and a segment is a pure function of the day's raw events.
//!
//! Contract:
//! - [`build`] turns the day's events into visits: one visitor's events in time order, split
//!   where the next event starts more than [`VISIT_GAP_MS`] after the end of the visit's
//!   activity so far (an event's activity ends at its time plus the engaged time reported
//!   for it). Times are the events' own (their UUIDv7 time), not their arrival, so a late
//!   delivery joins, splits or merges visits exactly as if it had come on time. Visits never
//!   cross the site's local midnight: a day's visits depend on that day's events only.
//! - A visit takes its source and agent from its first event, its entry page from its first
//!   page view and its exit page from its last; its duration runs from its first event to
//!   its last.
//! - Two parts, stored and kept apart: the **visits part** ([`Segment`]: the dictionaries of
//!   pages, sources and agents, and one row per visit) answers every question about visits;
//!   the **events part** ([`Events`]: page views and custom events, grouped by visit) is read
//!   only by questions about pages, event names, hours or engagement.
//! - The stored form is deterministic (the same events give the same bytes), so `verify`
//!   compares a stored segment with a rebuild byte for byte, and it is also the form kept in
//!   memory: each column holds its values in the fewest bytes (0–4) its largest value needs,
//!   read in place ([`Column::get`]). Decoding checks every index against its dictionary, so
//!   reads never go out of bounds; bytes not written here are refused.
//! - Values are local: pages, sources, agents and event names are numbered per segment (in
//!   ascending order of their stored ids or names).

use std::sync::Arc;

/// The longest pause inside one visit: 30 minutes.
pub const VISIT_GAP_MS: i64 = 30 * 60 * 1000;

/// No value (no entry page, no scroll depth reported): stored as 0, values as value + 1.
const NONE: u32 = 0;

/// One event of a day, as a segment is built from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayEvent {
    /// The visitor's number (stable across days for one visitor key).
    pub visitor: u32,
    /// The event's own time, ms since 1970.
    pub at_ms: i64,
    /// The event id: orders events of one visitor at the same millisecond.
    pub id: [u8; 16],
    /// A custom event's name; `None` for a page view.
    pub name: Option<String>,
    /// The stored page id.
    pub page: u32,
    /// The stored source id (0: none recorded).
    pub src: u32,
    /// The stored agent id (0: none recorded).
    pub agent: u32,
    /// Visible and focused time reported for a page view, ms (0: none).
    pub engaged_ms: u32,
    /// Largest scroll depth reported for a page view, percent.
    pub scroll: Option<u8>,
}

/// A column of unsigned values stored in `width` bytes each, read in place.
#[derive(Clone)]
pub struct Column {
    data: Arc<[u8]>,
    off: usize,
    len: usize,
    width: u8,
}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Column {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Column {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `i`-th value (`i < len`; past the end, 0).
    #[inline]
    pub fn get(&self, i: usize) -> u32 {
        if i >= self.len {
            return 0;
        }
        let o = self.off + i * usize::from(self.width);
        let d = &self.data;
        match self.width {
            0 => 0,
            1 => u32::from(d[o]),
            2 => u32::from(u16::from_le_bytes([d[o], d[o + 1]])),
            3 => u32::from_le_bytes([d[o], d[o + 1], d[o + 2], 0]),
            _ => u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]]),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).map(|i| self.get(i))
    }

    /// Every value folded into `init`, in one tight loop per width (a whole column read
    /// through [`Column::get`] pays its width match at every value, several times the fold).
    fn fold<T>(&self, init: T, f: impl Fn(T, u32) -> T) -> T {
        let w = usize::from(self.width);
        let Some(bytes) = self.data.get(self.off..self.off + self.len * w) else {
            return init;
        };
        match w {
            0 => (0..self.len).fold(init, |a, _| f(a, 0)),
            1 => bytes.iter().fold(init, |a, b| f(a, u32::from(*b))),
            2 => bytes.chunks_exact(2).fold(init, |a, c| {
                f(a, u32::from(u16::from_le_bytes([c[0], c[1]])))
            }),
            3 => bytes
                .chunks_exact(3)
                .fold(init, |a, c| f(a, u32::from_le_bytes([c[0], c[1], c[2], 0]))),
            _ => bytes.chunks_exact(4).fold(init, |a, c| {
                f(a, u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            }),
        }
    }

    /// The largest value (0 when empty).
    pub fn max(&self) -> u32 {
        self.fold(0, u32::max)
    }

    /// The values summed.
    pub fn sum(&self) -> u64 {
        self.fold(0, |a, v| a + u64::from(v))
    }

    pub fn to_vec(&self) -> Vec<u32> {
        let mut out = Vec::new();
        self.decode_into(&mut out);
        out
    }

    /// Every value into `out` (cleared first): one tight loop per width.
    pub fn decode_into(&self, out: &mut Vec<u32>) {
        out.clear();
        let w = usize::from(self.width);
        let Some(bytes) = self.data.get(self.off..self.off + self.len * w) else {
            return;
        };
        match w {
            0 => out.resize(self.len, 0),
            1 => out.extend(bytes.iter().map(|b| u32::from(*b))),
            2 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))),
            ),
            3 => out.extend(
                bytes
                    .chunks_exact(3)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], 0])),
            ),
            _ => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
        }
    }
}

/// One day's columns as plain arrays, for passes that read every row; [`Decoded::fill`]
/// reuses the buffers from day to day.
#[derive(Debug, Default)]
pub struct Decoded {
    pub visitor: Vec<u32>,
    pub start_s: Vec<u32>,
    pub duration_s: Vec<u32>,
    pub pageviews: Vec<u32>,
    pub events: Vec<u32>,
    pub entry: Vec<u32>,
    pub exit: Vec<u32>,
    pub src: Vec<u32>,
    pub agent: Vec<u32>,
    /// The events part (empty when it was not given).
    pub pv_page: Vec<u32>,
    pub pv_at_s: Vec<u32>,
    pub pv_engaged_ms: Vec<u32>,
    pub pv_scroll: Vec<u32>,
    pub c_name: Vec<u32>,
    pub c_page: Vec<u32>,
    pub c_at_s: Vec<u32>,
}

impl Decoded {
    /// Decode the visits part, and the events part when given.
    pub fn fill(&mut self, seg: &Segment, events: Option<&Events>) {
        let v = &seg.visits;
        v.visitor.decode_into(&mut self.visitor);
        v.start_s.decode_into(&mut self.start_s);
        v.duration_s.decode_into(&mut self.duration_s);
        v.pageviews.decode_into(&mut self.pageviews);
        v.events.decode_into(&mut self.events);
        v.entry.decode_into(&mut self.entry);
        v.exit.decode_into(&mut self.exit);
        v.src.decode_into(&mut self.src);
        v.agent.decode_into(&mut self.agent);
        let (p, c) = match events {
            Some(e) => (&e.pageviews, &e.customs),
            None => {
                for col in [
                    &mut self.pv_page,
                    &mut self.pv_at_s,
                    &mut self.pv_engaged_ms,
                    &mut self.pv_scroll,
                    &mut self.c_name,
                    &mut self.c_page,
                    &mut self.c_at_s,
                ] {
                    col.clear();
                }
                return;
            }
        };
        p.page.decode_into(&mut self.pv_page);
        p.at_s.decode_into(&mut self.pv_at_s);
        p.engaged_ms.decode_into(&mut self.pv_engaged_ms);
        p.scroll.decode_into(&mut self.pv_scroll);
        c.name.decode_into(&mut self.c_name);
        c.page.decode_into(&mut self.c_page);
        c.at_s.decode_into(&mut self.c_at_s);
    }
}

/// Visits, one row per visit, ordered by visitor then start.
#[derive(Debug, Clone, PartialEq)]
pub struct Visits {
    pub visitor: Column,
    /// Seconds from the day's start to the first event.
    pub start_s: Column,
    /// Seconds from the first event to the last (engaged time keeps a visit open but does
    /// not lengthen it, as in Plausible).
    pub duration_s: Column,
    pub pageviews: Column,
    /// Custom events.
    pub events: Column,
    /// Local page index + 1 of the first page view (0: the visit has none).
    pub entry: Column,
    /// Local page index + 1 of the last page view (0: none).
    pub exit: Column,
    /// Local source index.
    pub src: Column,
    /// Local agent index.
    pub agent: Column,
}

/// The visits part of a day: its dictionaries and its visits.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The instant the local day starts, ms since 1970.
    pub day_start_ms: i64,
    /// Local page index → stored page id (ascending).
    pub pages: Column,
    /// Local source index → stored source id (ascending).
    pub srcs: Column,
    /// Local agent index → stored agent id (ascending).
    pub agents: Column,
    pub visits: Visits,
    /// Page views and custom events of the day (what the events part must hold).
    pub pageview_count: usize,
    pub custom_count: usize,
    bytes: Arc<[u8]>,
}

/// Page views, grouped by visit in visit order (a visit's `pageviews` rows in a row), each
/// visit's in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Pageviews {
    /// Local page index.
    pub page: Column,
    /// Seconds from the day's start.
    pub at_s: Column,
    pub engaged_ms: Column,
    /// Scroll depth + 1 (0: none reported).
    pub scroll: Column,
}

/// Custom events, grouped by visit like [`Pageviews`].
#[derive(Debug, Clone, PartialEq)]
pub struct Customs {
    /// Local name index.
    pub name: Column,
    /// Local page index.
    pub page: Column,
    pub at_s: Column,
}

/// The events part of a day: page views and custom events.
#[derive(Debug, Clone, PartialEq)]
pub struct Events {
    /// Local name index → custom event name (ascending).
    pub names: Vec<String>,
    pub pageviews: Pageviews,
    pub customs: Customs,
    bytes: Arc<[u8]>,
}

/// A local dictionary of one value kind: sorted distinct values, looked up by binary search.
fn dictionary<T: Ord + Clone>(values: impl Iterator<Item = T>) -> Vec<T> {
    let mut all: Vec<T> = values.collect();
    all.sort_unstable();
    all.dedup();
    all
}

fn index_of<T: Ord>(dict: &[T], value: &T) -> u32 {
    // Every value was put in its dictionary first.
    dict.binary_search(value).unwrap_or(0) as u32
}

fn seconds(ms: i64) -> u32 {
    u32::try_from(ms.max(0) / 1000).unwrap_or(u32::MAX)
}

/// The columns of a day while it is built.
#[derive(Default)]
struct Cols {
    visitor: Vec<u32>,
    start_s: Vec<u32>,
    duration_s: Vec<u32>,
    pageviews: Vec<u32>,
    events: Vec<u32>,
    entry: Vec<u32>,
    exit: Vec<u32>,
    src: Vec<u32>,
    agent: Vec<u32>,
    p_page: Vec<u32>,
    p_at_s: Vec<u32>,
    p_engaged: Vec<u32>,
    p_scroll: Vec<u32>,
    c_name: Vec<u32>,
    c_page: Vec<u32>,
    c_at_s: Vec<u32>,
}

/// Build both parts of one site's day from its events (any order), the day starting at
/// `day_start_ms`.
pub fn build(day_start_ms: i64, mut events: Vec<DayEvent>) -> (Segment, Events) {
    events.sort_by_key(|e| (e.visitor, e.at_ms, e.id));
    let pages = dictionary(events.iter().map(|e| e.page));
    let srcs = dictionary(events.iter().map(|e| e.src));
    let agents = dictionary(events.iter().map(|e| e.agent));
    let names = dictionary(events.iter().filter_map(|e| e.name.clone()));
    let mut c = Cols::default();
    let mut i = 0;
    while i < events.len() {
        // One visit: from events[i] while the next event starts within the gap.
        let first = &events[i];
        let mut end_ms = first.at_ms + i64::from(first.engaged_ms);
        let mut j = i + 1;
        while j < events.len()
            && events[j].visitor == first.visitor
            && events[j].at_ms - end_ms <= VISIT_GAP_MS
        {
            end_ms = end_ms.max(events[j].at_ms + i64::from(events[j].engaged_ms));
            j += 1;
        }
        let visit = &events[i..j];
        let last_ms = visit.last().map_or(first.at_ms, |e| e.at_ms);
        let (mut pageviews, mut customs, mut entry, mut exit) = (0, 0, NONE, NONE);
        for e in visit {
            let page = index_of(&pages, &e.page);
            let at_s = seconds(e.at_ms - day_start_ms);
            match &e.name {
                None => {
                    pageviews += 1;
                    if entry == NONE {
                        entry = page + 1;
                    }
                    exit = page + 1;
                    c.p_page.push(page);
                    c.p_at_s.push(at_s);
                    c.p_engaged.push(e.engaged_ms);
                    c.p_scroll
                        .push(e.scroll.map_or(NONE, |s| u32::from(s.min(100)) + 1));
                }
                Some(name) => {
                    customs += 1;
                    c.c_name.push(index_of(&names, name));
                    c.c_page.push(page);
                    c.c_at_s.push(at_s);
                }
            }
        }
        c.visitor.push(first.visitor);
        c.start_s.push(seconds(first.at_ms - day_start_ms));
        c.duration_s.push(seconds(last_ms - first.at_ms));
        c.pageviews.push(pageviews);
        c.events.push(customs);
        c.entry.push(entry);
        c.exit.push(exit);
        c.src.push(index_of(&srcs, &first.src));
        c.agent.push(index_of(&agents, &first.agent));
        i = j;
    }
    let visits = encode_visits(day_start_ms, &pages, &srcs, &agents, &c);
    let evts = encode_events(&names, &c);
    // The stored form is the form read: decode what was just written (it always decodes; an
    // empty day stands in should it ever not).
    let seg = Segment::decode(visits).unwrap_or_else(|_| Segment::empty(day_start_ms));
    let events = Events::decode(evts, &seg).unwrap_or_else(|_| Events::empty());
    (seg, events)
}

/// Why bytes are not a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a day segment: {0}")]
pub struct DecodeError(&'static str);

const VISITS_MAGIC: &[u8; 4] = b"TSV2";
const EVENTS_MAGIC: &[u8; 4] = b"TSE2";

fn encode_visits(
    day_start_ms: i64,
    pages: &[u32],
    srcs: &[u32],
    agents: &[u32],
    c: &Cols,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + c.visitor.len() * 20);
    out.extend_from_slice(VISITS_MAGIC);
    out.extend_from_slice(&day_start_ms.to_le_bytes());
    for n in [
        c.visitor.len(),
        c.p_page.len(),
        c.c_name.len(),
        pages.len(),
        srcs.len(),
        agents.len(),
    ] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for column in [
        pages,
        srcs,
        agents,
        &c.visitor,
        &c.start_s,
        &c.duration_s,
        &c.pageviews,
        &c.events,
        &c.entry,
        &c.exit,
        &c.src,
        &c.agent,
    ] {
        put_column(&mut out, column);
    }
    out
}

fn encode_events(names: &[String], c: &Cols) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + c.p_page.len() * 10);
    out.extend_from_slice(EVENTS_MAGIC);
    for n in [c.p_page.len(), c.c_name.len(), names.len()] {
        out.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for name in names {
        let bytes = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    for column in [
        &c.p_page,
        &c.p_at_s,
        &c.p_engaged,
        &c.p_scroll,
        &c.c_name,
        &c.c_page,
        &c.c_at_s,
    ] {
        put_column(&mut out, column);
    }
    out
}

/// A column: its width in bytes (0–4: the fewest that hold its largest value), then its
/// values little-endian.
fn put_column(out: &mut Vec<u8>, values: &[u32]) {
    let max = values.iter().copied().max().unwrap_or(0);
    let width = (32 - max.leading_zeros()).div_ceil(8) as usize;
    out.push(width as u8);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes()[..width]);
    }
}

struct Reader {
    bytes: Arc<[u8]>,
    at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError("truncated"))?;
        let at = self.at;
        self.at = end;
        Ok(&self.bytes[at..end])
    }

    fn u32(&mut self) -> Result<usize, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// A column of `n` values, each below `bound` (`None`: any).
    fn column(&mut self, n: usize, bound: Option<usize>) -> Result<Column, DecodeError> {
        let width = self.take(1)?[0];
        if width > 4 {
            return Err(DecodeError("a column is wider than 4 bytes"));
        }
        let off = self.at;
        self.take(
            n.checked_mul(usize::from(width))
                .ok_or(DecodeError("a column is too long"))?,
        )?;
        let col = Column {
            data: Arc::clone(&self.bytes),
            off,
            len: n,
            width,
        };
        if let Some(bound) = bound
            && !col.is_empty()
            && col.max() as usize >= bound
        {
            return Err(DecodeError("an index is out of range"));
        }
        Ok(col)
    }

    fn end(&self) -> Result<(), DecodeError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

impl Segment {
    /// Visits in this segment.
    pub fn visit_count(&self) -> usize {
        self.visits.visitor.len()
    }

    /// The stored form of the visits part.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes held in memory.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    fn empty(day_start_ms: i64) -> Self {
        let data: Arc<[u8]> = Arc::from(Vec::new());
        let col = Column {
            data: Arc::clone(&data),
            off: 0,
            len: 0,
            width: 0,
        };
        Segment {
            day_start_ms,
            pages: col.clone(),
            srcs: col.clone(),
            agents: col.clone(),
            visits: Visits {
                visitor: col.clone(),
                start_s: col.clone(),
                duration_s: col.clone(),
                pageviews: col.clone(),
                events: col.clone(),
                entry: col.clone(),
                exit: col.clone(),
                src: col.clone(),
                agent: col,
            },
            pageview_count: 0,
            custom_count: 0,
            bytes: data,
        }
    }

    /// Read a visits part written by [`build`].
    pub fn decode(bytes: Vec<u8>) -> Result<Self, DecodeError> {
        let mut r = Reader {
            bytes: Arc::from(bytes),
            at: 0,
        };
        if r.take(4)? != VISITS_MAGIC {
            return Err(DecodeError("unknown format"));
        }
        let day_start_ms = i64::from_le_bytes(
            r.take(8)?
                .try_into()
                .map_err(|_| DecodeError("truncated"))?,
        );
        let (visits, pageview_count, custom_count) = (r.u32()?, r.u32()?, r.u32()?);
        let (pages, srcs, agents) = (r.u32()?, r.u32()?, r.u32()?);
        let pages_col = r.column(pages, None)?;
        let srcs_col = r.column(srcs, None)?;
        let agents_col = r.column(agents, None)?;
        let v = Visits {
            visitor: r.column(visits, None)?,
            start_s: r.column(visits, None)?,
            duration_s: r.column(visits, None)?,
            pageviews: r.column(visits, None)?,
            events: r.column(visits, None)?,
            entry: r.column(visits, Some(pages + 1))?,
            exit: r.column(visits, Some(pages + 1))?,
            src: r.column(visits, Some(srcs))?,
            agent: r.column(visits, Some(agents))?,
        };
        r.end()?;
        if v.pageviews.sum() != pageview_count as u64 || v.events.sum() != custom_count as u64 {
            return Err(DecodeError("the visits do not add up to their events"));
        }
        Ok(Segment {
            day_start_ms,
            pages: pages_col,
            srcs: srcs_col,
            agents: agents_col,
            visits: v,
            pageview_count,
            custom_count,
            bytes: r.bytes,
        })
    }
}

impl Events {
    /// The stored form of the events part.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes held in memory.
    pub fn size(&self) -> usize {
        self.bytes.len() + self.names.iter().map(|n| n.len() + 24).sum::<usize>()
    }

    fn empty() -> Self {
        let data: Arc<[u8]> = Arc::from(Vec::new());
        let col = Column {
            data: Arc::clone(&data),
            off: 0,
            len: 0,
            width: 0,
        };
        Events {
            names: Vec::new(),
            pageviews: Pageviews {
                page: col.clone(),
                at_s: col.clone(),
                engaged_ms: col.clone(),
                scroll: col.clone(),
            },
            customs: Customs {
                name: col.clone(),
                page: col.clone(),
                at_s: col,
            },
            bytes: data,
        }
    }

    /// Read an events part written by [`build`], for the visits part `seg` of the same day.
    pub fn decode(bytes: Vec<u8>, seg: &Segment) -> Result<Self, DecodeError> {
        let mut r = Reader {
            bytes: Arc::from(bytes),
            at: 0,
        };
        if r.take(4)? != EVENTS_MAGIC {
            return Err(DecodeError("unknown format"));
        }
        let (pageviews, customs, names) = (r.u32()?, r.u32()?, r.u32()?);
        if pageviews != seg.pageview_count || customs != seg.custom_count {
            return Err(DecodeError("the events part is of another day"));
        }
        let mut name_list = Vec::with_capacity(names.min(1 << 16));
        for _ in 0..names {
            let b = r.take(2)?;
            let len = usize::from(u16::from_le_bytes([b[0], b[1]]));
            let text = std::str::from_utf8(r.take(len)?)
                .map_err(|_| DecodeError("a name is not UTF-8"))?;
            name_list.push(text.to_owned());
        }
        let pages = seg.pages.len();
        let events = Events {
            pageviews: Pageviews {
                page: r.column(pageviews, Some(pages))?,
                at_s: r.column(pageviews, None)?,
                engaged_ms: r.column(pageviews, None)?,
                scroll: r.column(pageviews, Some(102))?,
            },
            customs: Customs {
                name: r.column(customs, Some(names))?,
                page: r.column(customs, Some(pages))?,
                at_s: r.column(customs, None)?,
            },
            names: name_list,
            bytes: Arc::from(Vec::new()),
        };
        r.end()?;
        Ok(Events {
            bytes: r.bytes,
            ..events
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn pv(visitor: u32, at_ms: i64, page: u32) -> DayEvent {
        DayEvent {
            visitor,
            at_ms,
            id: [0; 16],
            name: None,
            page,
            src: 7,
            agent: 9,
            engaged_ms: 0,
            scroll: None,
        }
    }

    #[test]
    fn a_gap_longer_than_30_minutes_starts_a_new_visit() {
        let (seg, _) = build(
            0,
            vec![pv(1, 0, 10), pv(1, 30 * MIN, 11), pv(1, 60 * MIN + 1, 12)],
        );
        assert_eq!(seg.visits.pageviews.to_vec(), vec![2, 1]);
        assert_eq!(seg.visits.duration_s.to_vec(), vec![1800, 0]);
        // entry and exit are local page indices + 1: pages [10, 11, 12].
        assert_eq!(seg.visits.entry.to_vec(), vec![1, 3]);
        assert_eq!(seg.visits.exit.to_vec(), vec![2, 3]);
    }

    #[test]
    fn a_late_event_merges_two_visits_as_if_it_came_on_time() {
        let on_time = build(0, vec![pv(1, 0, 1), pv(1, 25 * MIN, 2), pv(1, 50 * MIN, 3)]);
        let late_last = build(0, vec![pv(1, 50 * MIN, 3), pv(1, 0, 1), pv(1, 25 * MIN, 2)]);
        assert_eq!(on_time.0.bytes(), late_last.0.bytes());
        assert_eq!(on_time.0.visit_count(), 1);
        let without = build(0, vec![pv(1, 0, 1), pv(1, 50 * MIN, 3)]);
        assert_eq!(without.0.visit_count(), 2);
    }

    #[test]
    fn engaged_time_keeps_a_visit_open_without_lengthening_it() {
        let mut first = pv(1, 0, 1);
        first.engaged_ms = 20 * MIN as u32;
        let (seg, _) = build(0, vec![first, pv(1, 45 * MIN, 2)]);
        assert_eq!(
            seg.visit_count(),
            1,
            "45 min after the start, 25 after the engagement"
        );
        assert_eq!(seg.visits.duration_s.to_vec(), vec![45 * 60]);
    }

    #[test]
    fn custom_events_count_in_their_visit_and_name_their_page() {
        let mut buy = pv(1, MIN, 2);
        buy.name = Some("buy".into());
        let (seg, events) = build(0, vec![pv(1, 0, 1), buy, pv(2, 0, 1)]);
        assert_eq!(seg.visits.events.to_vec(), vec![1, 0]);
        assert_eq!(events.names, vec!["buy".to_owned()]);
        assert_eq!(events.customs.page.to_vec(), vec![1]);
    }

    #[test]
    fn both_parts_round_trip_and_are_deterministic() {
        let mut e = pv(70_000, 5 * MIN, 300);
        e.engaged_ms = 123_456;
        e.scroll = Some(80);
        let mut c = pv(3, 0, 1);
        c.name = Some("sign up".into());
        let (seg, events) = build(1_000_000, vec![e, pv(3, 0, 1), c]);
        let again = Segment::decode(seg.bytes().to_vec()).expect("decodes");
        assert_eq!(again, seg);
        assert_eq!(
            Events::decode(events.bytes().to_vec(), &again).expect("decodes"),
            events
        );
        assert_eq!(events.pageviews.engaged_ms.to_vec(), vec![0, 123_456]);
        let many = || {
            (0..50)
                .map(|i| pv(i % 7, i64::from(i) * MIN, i % 5))
                .collect()
        };
        assert_eq!(build(9, many()).0.bytes(), build(9, many()).0.bytes());
        assert!(Segment::decode(seg.bytes()[..seg.bytes().len() - 1].to_vec()).is_err());
        let mut bad = seg.bytes().to_vec();
        bad[0] = b'X';
        assert!(Segment::decode(bad).is_err());
        // An events part of another day is refused.
        let (other, _) = build(0, vec![pv(1, 0, 1)]);
        assert!(Events::decode(events.bytes().to_vec(), &other).is_err());
    }

    #[test]
    fn an_index_out_of_its_dictionary_is_refused() {
        let mut other = pv(2, 0, 2);
        other.agent = 10;
        let (seg, _) = build(0, vec![pv(1, 0, 1), other]);
        let mut bytes = seg.bytes().to_vec();
        // The last column is the agent index: two agents, so every value must be 0 or 1.
        let last = bytes.len() - 1;
        bytes[last] = 5;
        assert!(Segment::decode(bytes).is_err());
    }

    #[test]
    fn max_and_sum_read_every_width_as_get_does() {
        for values in [
            vec![],
            vec![0, 0, 0],
            vec![3, 200, 7],
            vec![1, 65_535, 300],
            vec![70_000, 16_777_215, 9],
            vec![u32::MAX, 1, u32::MAX - 5],
        ] {
            let mut bytes = Vec::new();
            put_column(&mut bytes, &values);
            let mut r = Reader {
                bytes: Arc::from(bytes),
                at: 0,
            };
            let col = r.column(values.len(), None).expect("column");
            let by_get: Vec<u32> = (0..col.len()).map(|i| col.get(i)).collect();
            assert_eq!(by_get, values);
            assert_eq!(col.max(), values.iter().copied().max().unwrap_or(0));
            assert_eq!(col.sum(), values.iter().map(|v| u64::from(*v)).sum::<u64>());
        }
    }
}
