//! What a question looks at in one segment, resolved once per local dictionary entry (a few
//! hundred per day) instead of once per visit: every filter becomes one flag per local
//! source, agent, page and name; every dimension one interned value number per entry; every
//! time bucket one value number. Verdicts and value numbers of stored ids are memoised across
//! the segments of one question.

use std::collections::HashMap;
use std::sync::Arc;

use jiff::civil::Date;

use super::{Dimension, Filter, Grain, VisitDim};
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::segment::{Column, Events, Segment};

/// What the evaluator needs to know of stored ids.
pub trait Dictionary {
    /// A page's path (`None`: unknown id), shared: every question that names the page holds
    /// this one copy (a site of 100,000 pages has three page breakdowns on its dashboard).
    fn page(&self, id: u32) -> Option<&Arc<str>>;
    /// A source tuple (`None`: none recorded).
    fn source(&self, id: u32) -> Option<&SourceDims>;
    /// An agent tuple (`None`: none recorded).
    fn agent(&self, id: u32) -> Option<&AgentDims>;
}

/// A page view's name for `event:name`.
pub(super) const PAGEVIEW: &str = "pageview";

/// Interned values of one dimension (each value held once, by both maps).
#[derive(Default, Clone)]
pub(super) struct Values {
    pub(super) ids: HashMap<Arc<str>, u32, foldhash::fast::RandomState>,
    pub(super) names: Vec<Arc<str>>,
}

impl Values {
    pub(super) fn id(&mut self, value: &str) -> u32 {
        if let Some(id) = self.ids.get(value) {
            return *id;
        }
        self.add(value.into())
    }

    /// [`Values::id`] of a value already shared (held once more, not copied).
    pub(super) fn id_of_shared(&mut self, value: &Arc<str>) -> u32 {
        if let Some(id) = self.ids.get(&**value) {
            return *id;
        }
        self.add(Arc::clone(value))
    }

    fn add(&mut self, shared: Arc<str>) -> u32 {
        let id = self.names.len() as u32;
        self.names.push(Arc::clone(&shared));
        self.ids.insert(shared, id);
        id
    }
}

/// Where a dimension's value comes from in a segment.
#[derive(Clone, Copy)]
pub(super) enum Slot {
    Src(VisitDim),
    Agent(VisitDim),
    Entry,
    Exit,
    Page,
    Name,
    Time(Grain),
}

/// Whether a visit dimension is a field of the source tuple (`SourceDims`).
fn is_src_dim(dim: VisitDim) -> bool {
    !is_agent_dim(dim) && !matches!(dim, VisitDim::EntryPage | VisitDim::ExitPage)
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

pub(super) fn slot(d: Dimension) -> Slot {
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

/// Stored ids of one kind of tuple (sources or agents), packed (no allocation per id, so a
/// day's lookups stay in few cache lines): id → memo index, then per index its filter
/// verdict and the value number of each dimension position in turn.
#[derive(Default, Clone)]
pub(super) struct Packed {
    index: HashMap<u32, u32, foldhash::fast::RandomState>,
    ok: Vec<bool>,
    values: Vec<u32>,
}

impl Packed {
    fn size(&self) -> usize {
        self.index.len() * 16 + self.ok.len() + self.values.len() * 4
    }
}

/// What one question memoises across its segments.
#[derive(Default, Clone)]
pub(super) struct Memo {
    srcs: Packed,
    agents: Packed,
    /// Pages (a site may have 100,000s, so packed): stored id → memo index, then per index
    /// its verdicts (bit 0 entry, 1 exit, 2 event page) and the value number of each
    /// page-valued dimension position in turn.
    pages: HashMap<u32, u32, foldhash::fast::RandomState>,
    page_flags: Vec<u8>,
    page_values: Vec<u32>,
}

impl Memo {
    /// About how many bytes the memo holds.
    pub(super) fn size(&self) -> usize {
        self.srcs.size()
            + self.agents.size()
            + self.pages.len() * 16
            + self.page_flags.len()
            + self.page_values.len() * 4
    }
}

/// The filters of a question, by where they apply.
#[derive(Clone)]
pub(super) struct Filters {
    pub visit: Vec<Filter>,
    pub event: Vec<Filter>,
}

/// Per-segment tables: every local dictionary entry resolved once.
pub(super) struct Local {
    pub src_ok: Vec<bool>,
    pub agent_ok: Vec<bool>,
    /// Indexed by local page + 1 (0: no page view).
    pub entry_ok: Vec<bool>,
    pub exit_ok: Vec<bool>,
    /// Event filters: per local page, per local name, and for page views.
    pub page_ok: Vec<bool>,
    pub name_ok: Vec<bool>,
    pub pageview_ok: bool,
    /// Per dimension position: value number per local index of its slot (pages: index + 1).
    pub values: Vec<Vec<u32>>,
    /// `event:name`'s value number of page views, per dimension position.
    pub pageview_value: Vec<u32>,
    /// Local time of day boundaries, for hours: (seconds from the day's start, hour).
    hours: Vec<(u32, i8)>,
    /// Per dimension position of a time dimension: the day's bucket value number (day, week,
    /// month), or the value number of each entry of `hours`.
    time_ids: Vec<Vec<u32>>,
}

impl Local {
    /// The bucket value number of a moment `at_s` seconds into the segment's day.
    #[inline]
    pub(super) fn time_value(&self, k: usize, grain: Grain, at_s: u32) -> u32 {
        let ids = &self.time_ids[k];
        match grain {
            Grain::Hour => {
                let i = self.hours.partition_point(|(s, _)| *s <= at_s);
                ids.get(i.saturating_sub(1)).copied().unwrap_or(0)
            }
            _ => ids.first().copied().unwrap_or(0),
        }
    }
}

/// Labels as Plausible writes them: `2026-01-05 13:00:00`, `2026-01-05`; a week by its
/// Monday (never before the range's first day), a month by its first day.
pub(super) fn bucket_label(grain: Grain, day: Date, from: Date, hour: i8) -> String {
    match grain {
        Grain::Hour => format!("{day} {hour:02}:00:00"),
        Grain::Day => day.to_string(),
        Grain::Week => {
            let back = i64::from(day.weekday().to_monday_zero_offset());
            let monday = day.checked_sub(jiff::Span::new().days(back)).unwrap_or(day);
            monday.max(from).to_string()
        }
        Grain::Month => day.first_of_month().to_string(),
    }
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

/// One kind of tuple of a segment (`ids`, its local dictionary: sources or agents) resolved
/// through `memo`: per local index, whether it passes the visit filters on dimensions of that
/// kind (`is_kind`) into `ok`, and for each slot keyed by such a dimension (`slot_dim`) its
/// value number into that slot's `local_values`. A kind no slot keys by and no filter looks
/// at passes whole, unread.
#[allow(clippy::type_complexity)]
fn tuples<'d>(
    ids: &Column,
    memo: &mut Packed,
    (slot_dim, is_kind): (fn(&Slot) -> Option<VisitDim>, fn(VisitDim) -> bool),
    lookup: impl Fn(u32) -> (&'d SourceDims, &'d AgentDims),
    (slots, visit_filters, values): (&[Slot], &[Filter], &mut [Values]),
    (ok, local_values): (&mut Vec<bool>, &mut [Vec<u32>]),
) {
    let filtered = visit_filters
        .iter()
        .any(|f| matches!(f.dimension, Dimension::Visit(d) if is_kind(d)));
    if !filtered && !slots.iter().any(|s| slot_dim(s).is_some()) {
        *ok = vec![true; ids.len()];
        return;
    }
    let width = slots.len();
    for id in ids.iter() {
        let at = match memo.index.get(&id) {
            Some(&at) => at as usize,
            None => {
                let (src, agent) = lookup(id);
                let at = memo.ok.len();
                memo.ok
                    .push(visit_filters.iter().all(|f| match f.dimension {
                        Dimension::Visit(d) if is_kind(d) => f.accepts(visit_value(d, src, agent)),
                        _ => true,
                    }));
                for (k, s) in slots.iter().enumerate() {
                    let v = slot_dim(s).map_or(0, |d| values[k].id(visit_value(d, src, agent)));
                    memo.values.push(v);
                }
                memo.index.insert(id, at as u32);
                at
            }
        };
        ok.push(memo.ok[at]);
        for (k, s) in slots.iter().enumerate() {
            if slot_dim(s).is_some() {
                local_values[k].push(memo.values[at * width + k]);
            }
        }
    }
}

/// Everything `slots` and `filters` look at in one segment (`events`: its events part, when
/// the question reads events).
#[allow(clippy::too_many_arguments)]
pub(super) fn resolve(
    slots: &[Slot],
    filters: &Filters,
    (day, from): (Date, Date),
    zone: &SiteZone,
    seg: &Segment,
    events: Option<&Events>,
    dict: &dyn Dictionary,
    values: &mut [Values],
    memo: &mut Memo,
) -> Local {
    let (visit_filters, event_filters) = (&filters.visit, &filters.event);
    let names: &[String] = events.map_or(&[], |e| &e.names);
    let mut local = Local {
        src_ok: Vec::with_capacity(seg.srcs.len()),
        agent_ok: Vec::with_capacity(seg.agents.len()),
        entry_ok: vec![true; seg.pages.len() + 1],
        exit_ok: vec![true; seg.pages.len() + 1],
        page_ok: Vec::with_capacity(seg.pages.len()),
        name_ok: Vec::with_capacity(names.len()),
        pageview_ok: true,
        values: slots.iter().map(|_| Vec::new()).collect(),
        pageview_value: vec![0; slots.len()],
        hours: Vec::new(),
        time_ids: Vec::new(),
    };
    tuples(
        &seg.srcs,
        &mut memo.srcs,
        (
            |s| match s {
                Slot::Src(d) => Some(*d),
                _ => None,
            },
            is_src_dim,
        ),
        |id| (dict.source(id).unwrap_or(&EMPTY_SRC), &EMPTY_AGENT),
        (slots, visit_filters, values),
        (&mut local.src_ok, &mut local.values),
    );
    tuples(
        &seg.agents,
        &mut memo.agents,
        (
            |s| match s {
                Slot::Agent(d) => Some(*d),
                _ => None,
            },
            is_agent_dim,
        ),
        |id| (&EMPTY_SRC, dict.agent(id).unwrap_or(&EMPTY_AGENT)),
        (slots, visit_filters, values),
        (&mut local.agent_ok, &mut local.values),
    );
    // Pages: entry/exit filters, event:page filters, page-valued dimensions (index + 1).
    let page_slots: Vec<usize> = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Slot::Entry | Slot::Exit | Slot::Page))
        .map(|(k, _)| k)
        .collect();
    let page_filtered = visit_filters.iter().chain(event_filters.iter()).any(|f| {
        matches!(
            f.dimension,
            Dimension::Page | Dimension::Visit(VisitDim::EntryPage | VisitDim::ExitPage)
        )
    });
    for &k in &page_slots {
        local.values[k].push(values[k].id(""));
    }
    if page_slots.is_empty() && !page_filtered {
        local.page_ok = vec![true; seg.pages.len()];
    }
    for (i, id) in seg
        .pages
        .iter()
        .enumerate()
        .filter(|_| !page_slots.is_empty() || page_filtered)
    {
        let at = match memo.pages.get(&id) {
            Some(at) => *at as usize,
            None => {
                let shared = dict.page(id);
                let path: &str = shared.map_or("", |p| p);
                let pass = |dim: Dimension, fs: &[Filter]| {
                    fs.iter()
                        .filter(|f| f.dimension == dim)
                        .all(|f| f.accepts(path))
                };
                let at = memo.page_flags.len();
                memo.page_flags.push(
                    u8::from(pass(Dimension::Visit(VisitDim::EntryPage), visit_filters))
                        | u8::from(pass(Dimension::Visit(VisitDim::ExitPage), visit_filters)) << 1
                        | u8::from(pass(Dimension::Page, event_filters)) << 2,
                );
                for &k in &page_slots {
                    let v = match shared {
                        Some(p) => values[k].id_of_shared(p),
                        None => values[k].id(""),
                    };
                    memo.page_values.push(v);
                }
                memo.pages.insert(id, at as u32);
                at
            }
        };
        let flags = memo.page_flags[at];
        local.entry_ok[i + 1] = flags & 1 != 0;
        local.exit_ok[i + 1] = flags & 2 != 0;
        local.page_ok.push(flags & 4 != 0);
        for (j, &k) in page_slots.iter().enumerate() {
            local.values[k].push(memo.page_values[at * page_slots.len() + j]);
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
    let name_filters: Vec<&Filter> = event_filters
        .iter()
        .filter(|f| f.dimension == Dimension::Name)
        .collect();
    local.pageview_ok = name_filters.iter().all(|f| f.accepts(PAGEVIEW));
    for name in names {
        local
            .name_ok
            .push(name_filters.iter().all(|f| f.accepts(name)));
    }
    for (k, s) in slots.iter().enumerate() {
        if matches!(s, Slot::Name) {
            local.values[k] = names.iter().map(|n| values[k].id(n)).collect();
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
                .map(|(_, h)| values[k].id(&bucket_label(Grain::Hour, day, from, *h)))
                .collect(),
            Slot::Time(g) => vec![values[k].id(&bucket_label(*g, day, from, 0))],
            _ => Vec::new(),
        })
        .collect();
    local
}
