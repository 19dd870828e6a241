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
//!   page view and its exit page from its last.
//! - [`Segment::encode`] is deterministic (the same events give the same bytes), so `verify`
//!   compares a stored segment with a rebuild byte for byte; [`Segment::decode`] refuses
//!   anything it did not write.
//! - Values are local: pages, sources, agents and event names are numbered per segment (in
//!   ascending order of their stored ids or names), so columns stay narrow; each column is
//!   stored with the fewest bytes (0–4) its largest value needs.

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

/// Visits, one row per visit, ordered by visitor then start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Visits {
    pub visitor: Vec<u32>,
    /// Seconds from the day's start to the first event.
    pub start_s: Vec<u32>,
    /// Seconds from the first event to the last (engaged time keeps a visit open but does
    /// not lengthen it, as in Plausible).
    pub duration_s: Vec<u32>,
    pub pageviews: Vec<u32>,
    /// Custom events.
    pub events: Vec<u32>,
    /// Local page index + 1 of the first page view (0: the visit has none).
    pub entry: Vec<u32>,
    /// Local page index + 1 of the last page view (0: none).
    pub exit: Vec<u32>,
    /// Local source index.
    pub src: Vec<u32>,
    /// Local agent index.
    pub agent: Vec<u32>,
}

/// Page views, grouped by visit in visit order (a visit's `pageviews` rows in a row), each
/// visit's in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pageviews {
    /// Local page index.
    pub page: Vec<u32>,
    /// Seconds from the day's start.
    pub at_s: Vec<u32>,
    pub engaged_ms: Vec<u32>,
    /// Scroll depth + 1 (0: none reported).
    pub scroll: Vec<u32>,
}

/// Custom events, grouped by visit like [`Pageviews`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Customs {
    /// Local name index.
    pub name: Vec<u32>,
    /// Local page index.
    pub page: Vec<u32>,
    pub at_s: Vec<u32>,
}

/// One site's day: its local dictionaries and its three tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segment {
    /// The instant the local day starts, ms since 1970.
    pub day_start_ms: i64,
    /// Local page index → stored page id (ascending).
    pub pages: Vec<u32>,
    /// Local source index → stored source id (ascending).
    pub srcs: Vec<u32>,
    /// Local agent index → stored agent id (ascending).
    pub agents: Vec<u32>,
    /// Local name index → custom event name (ascending).
    pub names: Vec<String>,
    pub visits: Visits,
    pub pageviews: Pageviews,
    pub customs: Customs,
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

/// Build the segment of one site's day from its events (any order), the day starting at
/// `day_start_ms`.
pub fn build(day_start_ms: i64, mut events: Vec<DayEvent>) -> Segment {
    events.sort_by_key(|e| (e.visitor, e.at_ms, e.id));
    let pages = dictionary(events.iter().map(|e| e.page));
    let srcs = dictionary(events.iter().map(|e| e.src));
    let agents = dictionary(events.iter().map(|e| e.agent));
    let names = dictionary(events.iter().filter_map(|e| e.name.clone()));
    let mut seg = Segment {
        day_start_ms,
        ..Segment::default()
    };
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
                    seg.pageviews.page.push(page);
                    seg.pageviews.at_s.push(at_s);
                    seg.pageviews.engaged_ms.push(e.engaged_ms);
                    seg.pageviews
                        .scroll
                        .push(e.scroll.map_or(NONE, |s| u32::from(s.min(100)) + 1));
                }
                Some(name) => {
                    customs += 1;
                    seg.customs.name.push(index_of(&names, name));
                    seg.customs.page.push(page);
                    seg.customs.at_s.push(at_s);
                }
            }
        }
        let v = &mut seg.visits;
        v.visitor.push(first.visitor);
        v.start_s.push(seconds(first.at_ms - day_start_ms));
        v.duration_s.push(seconds(last_ms - first.at_ms));
        v.pageviews.push(pageviews);
        v.events.push(customs);
        v.entry.push(entry);
        v.exit.push(exit);
        v.src.push(index_of(&srcs, &first.src));
        v.agent.push(index_of(&agents, &first.agent));
        i = j;
    }
    seg.pages = pages;
    seg.srcs = srcs;
    seg.agents = agents;
    seg.names = names;
    seg
}

/// Why bytes are not a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a day segment: {0}")]
pub struct DecodeError(&'static str);

const MAGIC: &[u8; 4] = b"TSG1";

impl Segment {
    /// Visits in this segment.
    pub fn visit_count(&self) -> usize {
        self.visits.visitor.len()
    }

    /// The stored form (deterministic).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.visit_count() * 24);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.day_start_ms.to_le_bytes());
        for n in [
            self.visit_count(),
            self.pageviews.page.len(),
            self.customs.name.len(),
            self.pages.len(),
            self.srcs.len(),
            self.agents.len(),
            self.names.len(),
        ] {
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
        for name in &self.names {
            let bytes = name.as_bytes();
            out.extend_from_slice(&(bytes.len().min(u16::MAX as usize) as u16).to_le_bytes());
            out.extend_from_slice(&bytes[..bytes.len().min(u16::MAX as usize)]);
        }
        for column in self.columns() {
            put_column(&mut out, column);
        }
        out
    }

    /// Every column in stored order.
    fn columns(&self) -> [&Vec<u32>; 19] {
        let (v, p, c) = (&self.visits, &self.pageviews, &self.customs);
        [
            &self.pages,
            &self.srcs,
            &self.agents,
            &v.visitor,
            &v.start_s,
            &v.duration_s,
            &v.pageviews,
            &v.events,
            &v.entry,
            &v.exit,
            &v.src,
            &v.agent,
            &p.page,
            &p.at_s,
            &p.engaged_ms,
            &p.scroll,
            &c.name,
            &c.page,
            &c.at_s,
        ]
    }

    /// Read a segment written by [`Segment::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != MAGIC {
            return Err(DecodeError("unknown format"));
        }
        let day_start_ms = i64::from_le_bytes(
            r.take(8)?
                .try_into()
                .map_err(|_| DecodeError("truncated"))?,
        );
        let mut counts = [0usize; 7];
        for n in &mut counts {
            *n = r.u32()? as usize;
        }
        let [visits, pageviews, customs, pages, srcs, agents, names] = counts;
        let mut name_list = Vec::with_capacity(names.min(1 << 16));
        for _ in 0..names {
            let len = u16::from_le_bytes(
                r.take(2)?
                    .try_into()
                    .map_err(|_| DecodeError("truncated"))?,
            );
            let text = std::str::from_utf8(r.take(usize::from(len))?)
                .map_err(|_| DecodeError("a name is not UTF-8"))?;
            name_list.push(text.to_owned());
        }
        let mut col = |n: usize| r.column(n);
        let seg = Segment {
            day_start_ms,
            pages: col(pages)?,
            srcs: col(srcs)?,
            agents: col(agents)?,
            names: name_list,
            visits: Visits {
                visitor: col(visits)?,
                start_s: col(visits)?,
                duration_s: col(visits)?,
                pageviews: col(visits)?,
                events: col(visits)?,
                entry: col(visits)?,
                exit: col(visits)?,
                src: col(visits)?,
                agent: col(visits)?,
            },
            pageviews: Pageviews {
                page: col(pageviews)?,
                at_s: col(pageviews)?,
                engaged_ms: col(pageviews)?,
                scroll: col(pageviews)?,
            },
            customs: Customs {
                name: col(customs)?,
                page: col(customs)?,
                at_s: col(customs)?,
            },
        };
        if r.at != bytes.len() {
            return Err(DecodeError("trailing bytes"));
        }
        seg.check()?;
        Ok(seg)
    }

    /// Every index points into its dictionary and the tables add up, so reads never go out of
    /// bounds.
    fn check(&self) -> Result<(), DecodeError> {
        let v = &self.visits;
        let within = |col: &[u32], len: usize| col.iter().all(|&x| (x as usize) < len);
        let pages = self.pages.len();
        let ok = within(&v.src, self.srcs.len())
            && within(&v.agent, self.agents.len())
            && within(&v.entry, pages + 1)
            && within(&v.exit, pages + 1)
            && within(&self.pageviews.page, pages)
            && within(&self.customs.page, pages)
            && within(&self.customs.name, self.names.len())
            && v.pageviews.iter().map(|&n| n as usize).sum::<usize>() == self.pageviews.page.len()
            && v.events.iter().map(|&n| n as usize).sum::<usize>() == self.customs.name.len();
        if ok {
            Ok(())
        } else {
            Err(DecodeError("an index is out of range"))
        }
    }
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

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(DecodeError("truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn column(&mut self, n: usize) -> Result<Vec<u32>, DecodeError> {
        let width = usize::from(self.take(1)?[0]);
        if width > 4 {
            return Err(DecodeError("a column is wider than 4 bytes"));
        }
        let data = self.take(
            n.checked_mul(width)
                .ok_or(DecodeError("a column is too long"))?,
        )?;
        if width == 0 {
            return Ok(vec![0; n]);
        }
        Ok(data
            .chunks_exact(width)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..width].copy_from_slice(c);
                u32::from_le_bytes(b)
            })
            .collect())
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
        let seg = build(
            0,
            vec![pv(1, 0, 10), pv(1, 30 * MIN, 11), pv(1, 60 * MIN + 1, 12)],
        );
        assert_eq!(seg.visits.pageviews, vec![2, 1]);
        assert_eq!(seg.visits.duration_s, vec![1800, 0]);
        // entry and exit are local page indices + 1: pages [10, 11, 12].
        assert_eq!(seg.visits.entry, vec![1, 3]);
        assert_eq!(seg.visits.exit, vec![2, 3]);
    }

    #[test]
    fn a_late_event_merges_two_visits_as_if_it_came_on_time() {
        let on_time = build(0, vec![pv(1, 0, 1), pv(1, 25 * MIN, 2), pv(1, 50 * MIN, 3)]);
        let late_last = build(0, vec![pv(1, 50 * MIN, 3), pv(1, 0, 1), pv(1, 25 * MIN, 2)]);
        assert_eq!(on_time, late_last);
        assert_eq!(on_time.visit_count(), 1);
        let without = build(0, vec![pv(1, 0, 1), pv(1, 50 * MIN, 3)]);
        assert_eq!(without.visit_count(), 2);
    }

    #[test]
    fn engaged_time_extends_a_visit() {
        let mut first = pv(1, 0, 1);
        first.engaged_ms = 20 * MIN as u32;
        let seg = build(0, vec![first, pv(1, 45 * MIN, 2)]);
        assert_eq!(
            seg.visit_count(),
            1,
            "45 min after the start, 25 after the engagement"
        );
        assert_eq!(seg.visits.duration_s, vec![45 * 60]);
    }

    #[test]
    fn custom_events_count_in_their_visit_and_name_their_page() {
        let mut buy = pv(1, MIN, 2);
        buy.name = Some("buy".into());
        let seg = build(0, vec![pv(1, 0, 1), buy, pv(2, 0, 1)]);
        assert_eq!(seg.visits.events, vec![1, 0]);
        assert_eq!(seg.names, vec!["buy".to_owned()]);
        assert_eq!(seg.customs.page, vec![1]);
    }

    #[test]
    fn encoding_round_trips_and_is_deterministic() {
        let mut e = pv(70_000, 5 * MIN, 300);
        e.engaged_ms = 123_456;
        e.scroll = Some(80);
        let mut c = pv(3, 0, 1);
        c.name = Some("sign up".into());
        let seg = build(1_000_000, vec![e, pv(3, 0, 1), c]);
        let bytes = seg.encode();
        assert_eq!(Segment::decode(&bytes).expect("decodes"), seg);
        assert_eq!(
            build(1_000_000, seg_events()).encode(),
            build(1_000_000, seg_events()).encode()
        );
        assert!(Segment::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(Segment::decode(&bad).is_err());
    }

    fn seg_events() -> Vec<DayEvent> {
        (0..50)
            .map(|i| pv(i % 7, i64::from(i) * MIN, i % 5))
            .collect()
    }
}
