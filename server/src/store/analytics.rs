//! Answering analytics questions ([`crate::core::query::Query`]) for a site over a range of
//! local days: day segments read through [`SegmentSource`], sealed ones kept in memory, open
//! ones built from their raw events at every read, then one pass of the evaluator.
//!
//! Contract:
//! - **Never stale.** A kept segment is used only under the segment generation it was read
//!   under; the generation is read in the same snapshot as everything else of a read, and
//!   whatever deletes or rewrites a stored segment raises it. Open days are read whole at
//!   every read, so an answer includes every acknowledged event.
//! - **Bounded.** Kept segments and dictionary entries stay under their budgets (estimated
//!   bytes); past a budget the oldest kept days are dropped. A read holds its own references,
//!   so a drop never takes a segment from under a running read.
//! - Dictionary rows (page paths, dimension tuples) never change once stored, so they are
//!   kept until their budget is full.
//! - Imported breakdowns are read per question, only when asked ([`Analytics::answer_with`])
//!   and only where `store::merge::plan` says they answer it; they are never kept.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use jiff::civil::Date;

use super::merge::{self, Imports};
use super::{DIM_AGENT, DIM_SOURCE, OTHER_DIM, SegmentSource, StoreError};
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::ids::SiteId;
use crate::core::query::{self, Answer, Invalid, Query};
use crate::core::segment::{self, Segment};

/// Default budget of kept segments, bytes (estimated).
pub const DEFAULT_BUDGET_BYTES: usize = 128 << 20;

/// Budget of dictionary entries per store, estimated bytes.
const DICTIONARY_BUDGET: usize = 32 << 20;

/// Why a question got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnalyticsError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The dictionary of one site's ids.
#[derive(Default, Clone)]
struct SiteDict {
    pages: HashMap<u32, String>,
    srcs: HashMap<u32, SourceDims>,
    agents: HashMap<u32, AgentDims>,
    bytes: usize,
}

impl query::Dictionary for SiteDict {
    fn page(&self, id: u32) -> Option<&str> {
        self.pages.get(&id).map(String::as_str)
    }

    fn source(&self, id: u32) -> Option<&SourceDims> {
        self.srcs.get(&id)
    }

    fn agent(&self, id: u32) -> Option<&AgentDims> {
        self.agents.get(&id)
    }
}

/// The tuples that stand for everything beyond the tuple cap.
fn other_source() -> SourceDims {
    let o = OTHER_DIM.to_owned();
    SourceDims {
        referrer: o.clone(),
        source: o.clone(),
        channel: o.clone(),
        utm_source: o.clone(),
        utm_medium: o.clone(),
        utm_campaign: o.clone(),
        utm_term: o.clone(),
        utm_content: o,
    }
}

fn other_agent() -> AgentDims {
    let o = OTHER_DIM.to_owned();
    AgentDims {
        browser: o.clone(),
        browser_version: o.clone(),
        os: o.clone(),
        os_version: o.clone(),
        device: o.clone(),
        country: o.clone(),
        region: o,
    }
}

#[derive(Default)]
struct Kept {
    generation: i64,
    days: HashMap<(String, Date), Arc<Segment>>,
    /// Kept days in the order they were kept (the oldest go first).
    order: VecDeque<(String, Date)>,
    bytes: usize,
    dicts: HashMap<String, Arc<SiteDict>>,
    dict_bytes: usize,
}

/// Estimated bytes of a decoded segment.
fn segment_bytes(seg: &Segment) -> usize {
    let v = &seg.visits;
    let cols = seg.pages.len()
        + seg.srcs.len()
        + seg.agents.len()
        + v.visitor.len() * 9
        + seg.pageviews.page.len() * 4
        + seg.customs.name.len() * 3;
    cols * 4 + seg.names.iter().map(|n| n.len() + 24).sum::<usize>() + 256
}

/// The analytics of every site of one store.
pub struct Analytics {
    source: Arc<dyn SegmentSource>,
    kept: Mutex<Kept>,
    budget: usize,
}

impl Analytics {
    pub fn new(source: Arc<dyn SegmentSource>, budget: usize) -> Self {
        Self {
            source,
            kept: Mutex::default(),
            budget,
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answer each query over `site`'s local days `from..=to` in `zone`, from one read: the
    /// counted events alone.
    pub async fn answer(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        from: Date,
        to: Date,
        queries: &[Query],
    ) -> Result<Vec<Answer>, AnalyticsError> {
        let answers = self
            .answer_with(site, zone, from, to, queries, false)
            .await?;
        Ok(answers.into_iter().map(|(a, _)| a).collect())
    }

    /// [`Analytics::answer`], with `imports`: each answer also includes the imported
    /// breakdowns where they can answer its question (`store::imported`), and says whether
    /// it did and what its reader should know.
    pub async fn answer_with(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        from: Date,
        to: Date,
        queries: &[Query],
        imports: bool,
    ) -> Result<Vec<(Answer, Imports)>, AnalyticsError> {
        for q in queries {
            q.check()?;
        }
        let (segments, dict) = self.load(site, zone, from, to).await?;
        let refs: Vec<(Date, &Segment)> = segments.iter().map(|(d, s)| (*d, &**s)).collect();
        let mut out = Vec::with_capacity(queries.len());
        for q in queries {
            let (extra, said) = if imports {
                merge::extras(&*self.source, site, from, to, q).await?
            } else {
                (Vec::new(), Imports::default())
            };
            out.push((
                query::run_with(q, from, to, zone, &refs, &*dict, &extra)?,
                said,
            ));
        }
        Ok(out)
    }

    /// The segments of the range (kept, read or built) and the site's dictionary.
    async fn load(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        from: Date,
        to: Date,
    ) -> Result<(Vec<(Date, Arc<Segment>)>, Arc<SiteDict>), StoreError> {
        let name = site.as_str().to_owned();
        // Hold the kept days of the range before asking, so nothing drops them meanwhile.
        let (generation, held): (i64, HashMap<Date, Arc<Segment>>) = {
            let kept = self.kept();
            let held = kept
                .days
                .iter()
                .filter(|((s, d), _)| *s == name && *d >= from && *d <= to)
                .map(|((_, d), seg)| (*d, Arc::clone(seg)))
                .collect();
            (kept.generation, held)
        };
        let input = self
            .source
            .segment_input(
                site,
                from,
                to,
                Some((generation, held.keys().copied().collect())),
            )
            .await?;
        let mut segments = Vec::with_capacity(input.sealed.len() + input.open.len());
        let mut fresh = Vec::new();
        for (day, bytes) in input.sealed {
            match bytes {
                Some(bytes) => {
                    let seg = Arc::new(Segment::decode(&bytes).map_err(|e| {
                        StoreError::Invalid(format!("segment of {name} {day}: {e}"))
                    })?);
                    fresh.push((day, Arc::clone(&seg)));
                    segments.push((day, seg));
                }
                None => match held.get(&day) {
                    Some(seg) => segments.push((day, Arc::clone(seg))),
                    None => {
                        return Err(StoreError::Invalid(format!(
                            "segment of {name} {day} was not sent nor held"
                        )));
                    }
                },
            }
        }
        for (day, events) in input.open {
            let (start, _) = zone.span(day, day);
            segments.push((
                day,
                Arc::new(segment::build(start.as_millisecond(), events)),
            ));
        }
        self.keep(&name, input.generation, fresh);
        let dict = self.dictionary(site, &segments).await?;
        Ok((segments, dict))
    }

    /// Keep freshly read sealed days (under `generation`), within the budget.
    fn keep(&self, site: &str, generation: i64, fresh: Vec<(Date, Arc<Segment>)>) {
        let mut kept = self.kept();
        if kept.generation != generation {
            kept.days.clear();
            kept.order.clear();
            kept.bytes = 0;
            kept.generation = generation;
        }
        for (day, seg) in fresh {
            let bytes = segment_bytes(&seg);
            if bytes > self.budget {
                continue;
            }
            while kept.bytes + bytes > self.budget {
                let Some(old) = kept.order.pop_front() else {
                    break;
                };
                if let Some(gone) = kept.days.remove(&old) {
                    kept.bytes -= segment_bytes(&gone);
                }
            }
            let key = (site.to_owned(), day);
            if kept.days.insert(key.clone(), seg).is_none() {
                kept.order.push_back(key);
                kept.bytes += bytes;
            }
        }
    }

    /// The site's dictionary, completed with the ids these segments use.
    async fn dictionary(
        &self,
        site: &SiteId,
        segments: &[(Date, Arc<Segment>)],
    ) -> Result<Arc<SiteDict>, StoreError> {
        let current = self
            .kept()
            .dicts
            .get(site.as_str())
            .cloned()
            .unwrap_or_default();
        let mut pages: Vec<u32> = Vec::new();
        let mut dims: Vec<u32> = Vec::new();
        for (_, seg) in segments {
            pages.extend(
                seg.pages
                    .iter()
                    .filter(|id| !current.pages.contains_key(id)),
            );
            dims.extend(
                seg.srcs
                    .iter()
                    .filter(|id| **id != 0 && !current.srcs.contains_key(id)),
            );
            dims.extend(
                seg.agents
                    .iter()
                    .filter(|id| **id != 0 && !current.agents.contains_key(id)),
            );
        }
        pages.sort_unstable();
        pages.dedup();
        dims.sort_unstable();
        dims.dedup();
        if pages.is_empty() && dims.is_empty() {
            return Ok(current);
        }
        let rows = self.source.dictionary(site, pages, dims).await?;
        let mut kept = self.kept();
        let entry = kept.dicts.entry(site.as_str().to_owned()).or_default();
        let dict = Arc::make_mut(entry);
        let mut added = 0;
        for (id, path) in rows.pages {
            added += path.len() + 48;
            dict.pages.insert(id, path);
        }
        for (id, kind, value) in rows.dims {
            added += value.len() * 2 + 200;
            match kind {
                DIM_SOURCE => {
                    let v = if value == OTHER_DIM {
                        other_source()
                    } else {
                        SourceDims::decode(&value)
                    };
                    dict.srcs.insert(id, v);
                }
                DIM_AGENT => {
                    let v = if value == OTHER_DIM {
                        other_agent()
                    } else {
                        AgentDims::decode(&value)
                    };
                    dict.agents.insert(id, v);
                }
                _ => {}
            }
        }
        dict.bytes += added;
        let out = Arc::clone(entry);
        kept.dict_bytes += added;
        if kept.dict_bytes > DICTIONARY_BUDGET {
            // Start over; this read keeps its own copy.
            kept.dicts.clear();
            kept.dict_bytes = 0;
        }
        Ok(out)
    }
}
