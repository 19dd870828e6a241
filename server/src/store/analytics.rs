//! Answering analytics questions ([`crate::core::query::Query`]) for a site over a range of
//! local days: day segments read through [`SegmentSource`], sealed ones kept in memory, open
//! ones built from their raw events at every read, and every question evaluated day by day.
//!
//! Contract:
//! - **Never stale.** A kept segment part is used only while the day is still sealed at the
//!   same version, read in the same snapshot as the rest of the index (a write to a sealed
//!   day deletes its segment; a new seal has a new version). Open days are read whole at every
//!   read, so an answer includes every acknowledged event. A day unsealed or sealed again
//!   between the index and the read of its parts restarts the answer.
//! - **Bounded.** The days of a range are read and evaluated in chunks of [`CHUNK_DAYS`], the
//!   next read while one is counted: a question holds at most two chunks it does not keep.
//! - **One budget.** Kept question states and kept parts share one budget of bytes
//!   (`--analytics-cache-mb`): states take at most half of it (none over a quarter), parts
//!   what the states leave (visits and events parts apart: most questions read only the
//!   visits part), the oldest kept of each first to go. A state kept evicts parts until both
//!   fit. Dictionary entries stay under their own budget.
//! - **Kept states are exact.** Each question's state over the sealed days of its range is
//!   kept with the days and versions it counted, and used again only for exactly those
//!   days at those versions; the open days are always counted anew, apart, and the answer
//!   finished over the kept state, which is shared, never copied
//!   ([`Evaluator::finish_over`]). A repeated question costs its open days. Time rows of
//!   sealed days are kept as counts ([`Evaluator::close_sealed`]): no open day adds to them.
//!   A state is named by how its question counts ([`Evaluator::counting_key`]), so another
//!   page, order or metric of the same sums uses it too. A kept state over some of the
//!   sealed days (each still at its version) grows by the days it lacks, counted alone and
//!   merged: the seal of yesterday costs one day.
//! - **Counted once.** Reads missing the same state take turns: one counts it, the others
//!   wait and take what it kept (turns are taken in key order, so reads never wait on each
//!   other in a cycle).
//! - **Months beside the index.** A read with no kept state for any of its questions, all
//!   of which the month rollups answer, over a range that holds a month's first day, takes
//!   its turns while it reads the index (which never waits for them) and merges the stored
//!   months ([`rollups`]) then, holding the turns until it answers (not when another read
//!   kept a state meanwhile, nor when no day is sealed). The months are checked against the
//!   sealed days listed apart, and used only if the index's snapshot has exactly those
//!   sealed days; else they are read again against the index's.
//! - **Two threads.** Each question has a state on each of two counting threads, folded
//!   together at the end (visits never span two days, so sums add and visitor sets unite
//!   exactly, whichever state counted a day). The questions of a read are shared out between
//!   the threads by what each took so far (weighed on the first day of a read), so each
//!   counts every day in one state; when they do not balance (one question, or one that
//!   outweighs the rest), the days of each chunk are split in two halves of about equal
//!   weight instead. A single day (an open day) is counted on one thread. Counting threads
//!   are the analytics' own, at a lower CPU priority than the collector's: reads yield to
//!   live hits. They take memory from one jemalloc arena of their own, so a read reuses
//!   what the last one freed ([`counting_thread`]).
//! - Dictionary rows (page paths, dimension tuples) never change once stored, so they are
//!   kept until their budget is full.
//! - Imported breakdowns are read per question, only when asked ([`Analytics::answer_with`])
//!   and only where `store::merge::plan` says they answer it; they are never kept.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::civil::Date;
use tikv_jemalloc_ctl::{Access, AsName};

use super::merge::{self, Imports};
use super::{DIM_AGENT, DIM_SOURCE, OTHER_DIM, PartsWanted, SegmentSource, StoreError, rollups};
use crate::core::day::SiteZone;
use crate::core::dims::{AgentDims, SourceDims};
use crate::core::ids::SiteId;
use crate::core::query::{self, Answer, DayInput, Evaluator, Extra, Invalid, Query};
use crate::core::segment::{self, Decoded, Events, Segment};

/// Default budget of kept segment parts and question states together, bytes.
pub const DEFAULT_BUDGET_BYTES: usize = 64 << 20;

/// Days read and evaluated at a time.
pub const CHUNK_DAYS: usize = 31;

/// Budget of dictionary entries per store, estimated bytes.
const DICTIONARY_BUDGET: usize = 32 << 20;

/// Attempts of one answer whose days changed under it.
const ATTEMPTS: usize = 3;

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
    /// Shared with every question's interned values, never copied per read.
    pages: HashMap<u32, Arc<str>>,
    srcs: HashMap<u32, SourceDims>,
    agents: HashMap<u32, AgentDims>,
    /// Estimated bytes of the entries.
    bytes: usize,
}

impl query::Dictionary for SiteDict {
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

/// Which part of a day is kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Part {
    Visits,
    Events,
}

type PartKey = (String, Date, Part);

/// A kept part.
#[derive(Clone)]
enum KeptPart {
    Visits(Arc<Segment>),
    Events(Arc<Events>),
}

impl KeptPart {
    fn size(&self) -> usize {
        match self {
            KeptPart::Visits(s) => s.size(),
            KeptPart::Events(e) => e.size(),
        }
    }
}

#[derive(Default)]
struct Kept {
    parts: HashMap<PartKey, (i64, KeptPart)>,
    /// Kept parts in the order they were kept (the oldest go first).
    order: VecDeque<PartKey>,
    bytes: usize,
    dicts: HashMap<String, Arc<SiteDict>>,
    dict_bytes: usize,
}

impl Kept {
    /// Drop the oldest kept parts until they hold at most `room` bytes.
    fn evict_to(&mut self, room: usize) {
        while self.bytes > room {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, gone)) = self.parts.remove(&old) {
                self.bytes -= gone.size();
            }
        }
    }
}

/// The analytics of every site of one store.
pub struct Analytics {
    source: Arc<dyn SegmentSource>,
    kept: Mutex<Kept>,
    /// Bytes of kept parts and kept states together ([`Analytics::parts_room`]).
    budget: usize,
    partials: Mutex<Partials>,
    /// `Partials::bytes`, readable without the states' lock: parts may take what the states
    /// leave of the budget. Written under the states' lock, read under the parts' lock.
    states_bytes: std::sync::atomic::AtomicUsize,
    /// A turn per state key being counted over sealed days now: a read that misses a state
    /// another read is counting waits for it and takes the kept state, instead of counting
    /// the same days beside it (64 readers of one dashboard count it once). A cold read
    /// whose months are read beside its index takes its turns while it reads the index,
    /// and holds them from before it reads the months (nothing is counted yet).
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Question states counted over sealed days so far ([`Analytics::states_counted`]).
    counted: std::sync::atomic::AtomicU64,
    /// Sealed days counted so far, summed over questions ([`Analytics::days_counted`]).
    days: std::sync::atomic::AtomicU64,
}

/// Kept question states ([`Partials`]) may use one part in this many of the budget (and
/// parts what they leave); a single state at most half of that share.
const STATES_SHARE: usize = 2;

/// Each recent question's state over the sealed days of its range, by site, zone, range and
/// question, with the days and versions it counted: a repeated question counts only its open
/// days (sealed days change only by a new seal, which has a new version, so a state over the
/// same versions is the state those days give). The oldest kept go first.
#[derive(Default)]
struct Partials {
    states: HashMap<String, KeptState>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Partials {
    fn get(&self, key: &str, sealed: &[(Date, i64)]) -> Option<Arc<Evaluator>> {
        self.states
            .get(key)
            .filter(|(days, _, _)| days.as_slice() == sealed)
            .map(|(_, e, _)| Arc::clone(e))
    }

    /// A kept state over some of `sealed` (each of its days still sealed at the version it
    /// counted), and the days of `sealed` it lacks: counting only those and merging gives
    /// the state over `sealed` (visits never span two days).
    fn below(&self, key: &str, sealed: &[(Date, i64)]) -> Option<Below> {
        let (days, state, _) = self.states.get(key)?;
        let now: HashSet<(Date, i64)> = sealed.iter().copied().collect();
        if !days.iter().all(|d| now.contains(d)) {
            return None;
        }
        let had: HashSet<(Date, i64)> = days.iter().copied().collect();
        let lacking: Vec<(Date, i64)> = sealed
            .iter()
            .copied()
            .filter(|d| !had.contains(d))
            .collect();
        Some((Arc::clone(state), lacking))
    }

    /// Keep `state` (settled), within `budget` bytes.
    fn keep(&mut self, key: &str, sealed: &[(Date, i64)], state: &Arc<Evaluator>, budget: usize) {
        let size = state.size() + sealed.len() * 16 + key.len();
        tracing::debug!(
            bytes = size,
            held = self.bytes,
            days = sealed.len(),
            question = key.splitn(5, '\u{1f}').nth(4).unwrap_or(""),
            "keeping a question's state"
        );
        if size > budget / 2 {
            return;
        }
        if let Some((_, _, old)) = self.states.remove(key) {
            self.bytes -= old;
            self.order.retain(|k| k != key);
        }
        while self.bytes + size > budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, _, old)) = self.states.remove(&oldest) {
                self.bytes -= old;
            }
        }
        self.states
            .insert(key.to_owned(), (sealed.to_vec(), Arc::clone(state), size));
        self.order.push_back(key.to_owned());
        self.bytes += size;
    }
}

/// A kept state over some sealed days, and the sealed days it lacks ([`Partials::below`]).
type Below = (Arc<Evaluator>, Vec<(Date, i64)>);

/// A kept state: the sealed days (and versions) it counted, the state, its size.
type KeptState = (Vec<(Date, i64)>, Arc<Evaluator>, usize);

/// What names a question's state: the site, zone, range and how the question counts
/// ([`Evaluator::counting_key`]: another page, order or metric of the same sums shares it).
fn partial_key(site: &str, zone: &SiteZone, from: Date, to: Date, e: &Evaluator) -> String {
    format!(
        "{site}\u{1f}{}\u{1f}{from}\u{1f}{to}\u{1f}{}",
        zone.name(),
        e.counting_key()
    )
}

/// A day as evaluated.
struct DayParts {
    day: Date,
    seg: Arc<Segment>,
    events: Option<Arc<Events>>,
}

/// The questions of one read while its days are counted, on two threads: each question
/// twice, one state per thread, folded together exactly at the end (visits never span two
/// days, so sums add and visitor sets unite exactly, whichever state counted a day).
///
/// Each batch of days is shared out by question when the questions balance (a dashboard:
/// its page breakdown costs about what the other fourteen questions cost together), so each
/// question counts every day in one state: its visitor sets are built once, not once per
/// half, and the fold at the end has little to unite. Otherwise (one question, or one that
/// outweighs the rest) the days are split in two halves of about equal weight. Costs are
/// what each question took so far; a read's first day, counted on one thread, weighs them.
struct Counting {
    first: Vec<Evaluator>,
    /// The second thread's (empty when one thread counts every day).
    second: Vec<Evaluator>,
    /// Time each question has taken so far (its weight when the questions are shared out).
    spent: Vec<Duration>,
    /// How the questions are shared out now (`true`: on the second thread), kept while it
    /// stays balanced (a question that moves leaves a state on each thread to fold).
    shared: Option<Vec<bool>>,
}

/// The heavier of two shares of questions may take at most this part of their time for
/// the questions to be shared out rather than the days.
const SHARE_MAX: f64 = 0.6;

/// A share of the questions is kept while its heavier side takes at most this part.
const KEEP_MAX: f64 = 0.55;

impl Counting {
    /// Count into `evaluators` (fresh ones or states over other days).
    fn new(evaluators: Vec<Evaluator>) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let second = if threads >= 2 {
            evaluators.iter().map(Evaluator::fresh).collect()
        } else {
            Vec::new()
        };
        Self {
            spent: vec![Duration::ZERO; evaluators.len()],
            shared: None,
            first: evaluators,
            second,
        }
    }

    /// Count `days` (in day order), off the async runtime: a year of a large site is CPU work
    /// of a second or so.
    async fn count(self, days: Vec<DayParts>, dict: Arc<SiteDict>) -> Result<Self, StoreError> {
        yielding(move || self.count_now(&days, &dict)).await
    }

    fn count_now(mut self, days: &[DayParts], dict: &SiteDict) -> Self {
        // One day (an open day; the first day of a read, which weighs the questions) is
        // counted on one thread: two would each hold the day's columns and resolved
        // dictionary at once, which a day of 100,000 pages read by many at once cannot afford.
        if self.second.is_empty() || days.len() < 2 {
            let all = self.first.iter_mut().enumerate().collect();
            on_two(&mut self.spent, (all, days), (Vec::new(), &[]), dict);
            return self;
        }
        if self.spent.iter().all(Duration::is_zero) {
            // Weigh the questions on the first day; the rest is shared out by what they took.
            let (one, rest) = days.split_at(1);
            return self.count_now(one, dict).count_now(rest, dict);
        }
        let weights: Vec<f64> = self.spent.iter().map(Duration::as_secs_f64).collect();
        self.shared = match self.shared.take() {
            Some(kept) if heavier(&kept, &weights) <= KEEP_MAX => Some(kept),
            _ => share(&weights),
        };
        let pairs = self.first.iter_mut().zip(&mut self.second).enumerate();
        if let Some(on_second) = &self.shared {
            let (mut mine, mut other) = (Vec::new(), Vec::new());
            for (i, (a, b)) in pairs {
                if on_second[i] {
                    other.push((i, b));
                } else {
                    mine.push((i, a));
                }
            }
            on_two(&mut self.spent, (mine, days), (other, days), dict);
            return self;
        }
        // Two halves of about equal weight (visits and events).
        let weight = |d: &DayParts| d.seg.visit_count() + d.seg.pageview_count + d.seg.custom_count;
        let total: usize = days.iter().map(weight).sum();
        let (mut at, mut sum) = (0, 0);
        while at < days.len() - 1 && (sum + weight(&days[at])) * 2 <= total {
            sum += weight(&days[at]);
            at += 1;
        }
        let (first, second) = days.split_at(at.max(1));
        let (mine, other): (Vec<_>, Vec<_>) = pairs.map(|(i, (a, b))| ((i, a), (i, b))).unzip();
        on_two(&mut self.spent, (mine, first), (other, second), dict);
        self
    }

    /// Both halves folded into one answer per question, each half's visitors merged on its
    /// own thread first.
    async fn finish(self) -> Result<Vec<Evaluator>, StoreError> {
        yielding(move || {
            let Self {
                mut first,
                mut second,
                ..
            } = self;
            std::thread::scope(|s| {
                let other = &mut second;
                s.spawn(move || {
                    counting_thread();
                    other.iter_mut().for_each(Evaluator::settle);
                });
                first.iter_mut().for_each(Evaluator::settle);
            });
            for (e, other) in first.iter_mut().zip(second) {
                e.merge(other);
            }
            first
        })
        .await
    }
}

/// The nice value of counting threads (and of the SQLite stats lane): under contention the
/// collector's threads (nice 0) get ~90 % of a core against one of them, so a crowd of year
/// reads slows the reads more than live hits, and still progresses when the CPU is full.
/// `SCHED_IDLE` yielded more (64 dashboard readers left live hits 0.61–0.67 of their rate
/// alone, against 0.39–0.41 at nice 10) but starved every read while anything else kept the
/// CPU busy: a client looping on cheap requests kept another client's dashboard read waiting
/// over a minute.
pub(crate) const COUNTING_NICE: i32 = 10;

/// Run `f` off the async runtime on a thread of its own at a lower CPU priority
/// ([`COUNTING_NICE`]; the thread ends with `f`, so nothing else inherits it).
async fn yielding<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tally-count".into())
        .spawn(move || {
            counting_thread();
            let _ = tx.send(f());
        })
        .map_err(|e| StoreError::Invalid(format!("starting a counting thread failed: {e}")))?;
    rx.await
        .map_err(|_| StoreError::Invalid("evaluating a question failed".into()))
}

/// Make the calling thread a counting thread: its CPU priority lowered to [`COUNTING_NICE`]
/// (Linux sets nice per thread; where it cannot, the thread runs at the normal priority),
/// and its memory taken from the reads' own arena ([`reads_arena`]).
pub(crate) fn counting_thread() {
    #[cfg(target_os = "linux")]
    if let Err(e) =
        rustix::process::setpriority_process(Some(rustix::thread::gettid()), COUNTING_NICE)
    {
        tracing::debug!(error = %e, "could not lower a counting thread's priority");
    }
    if let Some(arena) = reads_arena()
        && let Err(e) = b"thread.arena\0".name().write(arena)
    {
        tracing::debug!(error = %e, "could not move a counting thread to the reads' arena");
    }
}

/// How long the reads' arena keeps memory freed by a read before it goes back to the
/// system, ms (jemalloc purges as the arena is next used: with no read at all, what the
/// last one freed stays until the next). A read over 100,000 pages frees ~50 MB at its end;
/// a read soon after reuses it (the arena is shared by every counting thread).
const READS_DECAY_MS: isize = 1000;

/// The jemalloc arena of counting threads (the SQLite stats lane's and those the analytics
/// start per read), made at the first call; `None` if jemalloc refused to make it. Where
/// jemalloc is linked but not the allocator (the library's tests), the arena is made and
/// serves nothing. By default jemalloc hands a new thread whichever arena has fewest
/// threads, so each read's fresh counting threads used a different arena and every arena
/// kept the dirty pages of the last read it served for 10 s; 64 readers over 100,000 pages
/// peaked past 200 MB on that alone. One arena of their own lets each read reuse what the
/// last one freed, and keeps reads' memory apart from the collector's.
fn reads_arena() -> Option<u32> {
    static ARENA: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *ARENA.get_or_init(|| {
        let arena: u32 = b"arenas.create\0".name().read().ok()?;
        // Only the dirty decay: pages past it are purged at once (jemalloc's muzzy decay is
        // 0 here), not first marked free for the kernel, which still counts them in RSS.
        let key = format!("arena.{arena}.dirty_decay_ms\0");
        if let Err(e) = key.as_bytes().name().write(READS_DECAY_MS) {
            tracing::debug!(error = %e, "could not set the reads' arena decay");
        }
        Some(arena)
    })
}

/// What the stored months of a range give ([`Analytics::stored_months`]): each question's
/// state over them, merged, and the sealed days left to count.
type StoredMonths = (Vec<Evaluator>, Vec<(Date, i64)>);

/// Questions (each with its index in the read) to count over days on one thread.
type Work<'a, 'd> = (Vec<(usize, &'a mut Evaluator)>, &'d [DayParts]);

/// Count `mine` on this thread and `other` (when it has questions) on a second one at the
/// counting priority, adding the time each question took to `spent`. A panic on the second
/// thread goes on in the caller: a question half counted must not be answered.
fn on_two(spent: &mut [Duration], mine: Work<'_, '_>, other: Work<'_, '_>, dict: &SiteDict) {
    let (mine, other) = std::thread::scope(|s| {
        let other = (!other.0.is_empty()).then(|| {
            s.spawn(move || {
                counting_thread();
                count(other, dict)
            })
        });
        let mine = count(mine, dict);
        let other = other.map(|t| match t.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        });
        (mine, other.unwrap_or_default())
    });
    for (i, t) in mine.into_iter().chain(other) {
        if let Some(s) = spent.get_mut(i) {
            *s += t;
        }
    }
}

/// Count the days of `work` in each of its questions, each day's columns decoded once;
/// returns the time each question took, by its index.
fn count((mut questions, days): Work<'_, '_>, dict: &SiteDict) -> Vec<(usize, Duration)> {
    let need_events = questions.iter().any(|(_, e)| e.needs_events());
    let mut spent: Vec<(usize, Duration)> = questions
        .iter()
        .map(|(i, _)| (*i, Duration::ZERO))
        .collect();
    let mut cols = Decoded::default();
    for d in days {
        let events = d.events.as_deref().filter(|_| need_events);
        cols.fill(&d.seg, events);
        let input = DayInput {
            day: d.day,
            seg: &d.seg,
            events,
            cols: &cols,
        };
        for ((_, e), (_, spent)) in questions.iter_mut().zip(&mut spent) {
            let started = Instant::now();
            e.add(&input, dict);
            *spent += started.elapsed();
        }
    }
    spent
}

/// Which questions go to the second thread when shared out by `weights` (heaviest first,
/// each to the lighter share); `None` when fewer than two or when the heavier share would
/// take more than [`SHARE_MAX`] of the time (then the days are split instead).
fn share(weights: &[f64]) -> Option<Vec<bool>> {
    if weights.len() < 2 {
        return None;
    }
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]));
    let mut on_second = vec![false; weights.len()];
    let (mut first, mut second) = (0.0, 0.0);
    for i in order {
        if second < first {
            second += weights[i];
            on_second[i] = true;
        } else {
            first += weights[i];
        }
    }
    (heavier(&on_second, weights) <= SHARE_MAX).then_some(on_second)
}

/// The part of all `weights` the heavier side of `on_second` takes (1 when all weigh 0).
fn heavier(on_second: &[bool], weights: &[f64]) -> f64 {
    let (mut first, mut second) = (0.0, 0.0);
    for (w, s) in weights.iter().zip(on_second) {
        if *s {
            second += w;
        } else {
            first += w;
        }
    }
    let total = first + second;
    if total > 0.0 {
        first.max(second) / total
    } else {
        1.0
    }
}

/// The parts of a sealed day at hand so far.
type Have = (Option<Arc<Segment>>, Option<Arc<Events>>);

/// The answer could not be read as indexed (a day changed under it): start over.
struct Changed;

impl Analytics {
    pub fn new(source: Arc<dyn SegmentSource>, budget: usize) -> Self {
        Self {
            source,
            kept: Mutex::default(),
            budget,
            partials: Mutex::default(),
            states_bytes: std::sync::atomic::AtomicUsize::new(0),
            turns: Mutex::default(),
            counted: std::sync::atomic::AtomicU64::new(0),
            days: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many question states were counted over sealed days since the start (every other
    /// answer over sealed days came from a kept state).
    pub fn states_counted(&self) -> u64 {
        self.counted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many sealed days were counted since the start, summed over the questions that
    /// counted them (a kept state extended by newly sealed days counts only those).
    pub fn days_counted(&self) -> u64 {
        self.days.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answer each query over `site`'s local days `from..=to` in `zone`, from one index: the
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
        let mut extras = Vec::with_capacity(queries.len());
        let mut said = Vec::with_capacity(queries.len());
        for q in queries {
            let (extra, imports) = if imports {
                merge::extras(&*self.source, site, from, to, q).await?
            } else {
                (Vec::new(), Imports::default())
            };
            extras.push(extra);
            said.push(imports);
        }
        for attempt in 1..=ATTEMPTS {
            match self
                .try_answer(site, zone, from, to, queries, &extras)
                .await?
            {
                Ok(answers) => return Ok(answers.into_iter().zip(said).collect()),
                Err(Changed) if attempt < ATTEMPTS => continue,
                Err(Changed) => break,
            }
        }
        Err(StoreError::Conflict(format!(
            "the days of {site} kept changing while they were read"
        ))
        .into())
    }

    async fn try_answer(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        from: Date,
        to: Date,
        queries: &[Query],
        extras: &[Vec<Extra>],
    ) -> Result<Result<Vec<Answer>, Changed>, AnalyticsError> {
        let mut evaluators = queries
            .iter()
            .map(|q| Evaluator::new(q, from, to, zone))
            .collect::<Result<Vec<_>, _>>()?;
        let name = site.as_str().to_owned();
        let keys: Vec<String> = evaluators
            .iter()
            .map(|e| partial_key(&name, zone, from, to, e))
            .collect();
        // A cold read (no question has a kept state) of questions the stored months answer,
        // over a range that holds a month's first day, takes its turns and reads and merges
        // those months while it reads the index (on PostgreSQL the index waits on the
        // database, the merge on the CPU); the index never waits for the turns. `early`: the
        // months so read (`None` inside: none used), kept only if the sealed days they were
        // checked against are the index's.
        let cold = |partials: &Partials| keys.iter().all(|k| !partials.states.contains_key(k));
        let mut turns = Vec::new();
        let mut early = None;
        let holds_month = from.day() == 1 || rollups::month_end(from) < to;
        let cold_now = holds_month && cold(&self.partials());
        let asked = || -> Vec<(Query, String)> {
            queries
                .iter()
                .zip(&evaluators)
                .map(|(q, e)| (q.clone(), rollups::key(zone, e)))
                .collect()
        };
        let index = if cold_now && rollups::answers(zone, &asked())? {
            let months = async {
                let held = self.turns(keys.iter().map(String::as_str)).await;
                // A read waited for may have kept a state: then no months, and no turns
                // held (they are taken again below for what is missed).
                if !cold(&self.partials()) {
                    return Ok((Vec::new(), None));
                }
                match self.months_ahead(site, zone, (from, to), asked()).await? {
                    // No sealed day: nothing of this read is kept, nobody need wait for it.
                    None => Ok((Vec::new(), None)),
                    ahead => Ok::<_, AnalyticsError>((held, ahead)),
                }
            };
            let (index, months) = tokio::join!(self.source.segment_index(site, from, to), months);
            let index = index?;
            let (held, ahead) = months?;
            turns = held;
            early = ahead.and_then(|(sealed, months)| (sealed == index.sealed).then_some(months));
            index
        } else {
            self.source.segment_index(site, from, to).await?
        };
        let mut dict: Arc<SiteDict> = self.kept().dicts.get(&name).cloned().unwrap_or_default();
        // Open days, built off the runtime.
        let zone_for_open = zone.clone();
        let open: Vec<DayParts> = yielding(move || {
            index
                .open
                .into_iter()
                .map(|(day, events)| {
                    let (start, _) = zone_for_open.span(day, day);
                    let (seg, evs) = segment::build(start.as_millisecond(), events);
                    DayParts {
                        day,
                        seg: Arc::new(seg),
                        events: Some(Arc::new(evs)),
                    }
                })
                .collect()
        })
        .await?;
        // The sealed days: each question's state over them as kept (same days at the same
        // versions), else counted now, chunk by chunk, and kept; shared with the kept one,
        // never copied. `evaluators` count the open days apart.
        let mut bases: Vec<Option<Arc<Evaluator>>> = vec![None; queries.len()];
        let mut missed = Vec::new();
        {
            let partials = self.partials();
            for (i, key) in keys.iter().enumerate() {
                match partials.get(key, &index.sealed) {
                    Some(kept) => bases[i] = Some(kept),
                    None => missed.push(i),
                }
            }
        }
        if !missed.is_empty() && !index.sealed.is_empty() {
            // Turns taken before the index hold every question's.
            if turns.is_empty() {
                turns.extend(self.turns(missed.iter().map(|&i| keys[i].as_str())).await);
            }
            // A read this one waited for may have kept them.
            let partials = self.partials();
            missed.retain(|&i| match partials.get(&keys[i], &index.sealed) {
                Some(kept) => {
                    bases[i] = Some(kept);
                    false
                }
                None => true,
            });
        }
        if !missed.is_empty() && !index.sealed.is_empty() {
            // Kept states over some of these days grow by the days they lack, when every
            // missed question lacks the same ones (once a day is sealed, all of them do).
            let (grown, lacking) = {
                let partials = self.partials();
                let below: Vec<Option<Below>> = missed
                    .iter()
                    .map(|&i| partials.below(&keys[i], &index.sealed))
                    .collect();
                let same = below
                    .first()
                    .and_then(Option::as_ref)
                    .map(|(_, l)| l.clone());
                match same {
                    Some(l)
                        if below
                            .iter()
                            .all(|b| b.as_ref().is_some_and(|(_, x)| *x == l)) =>
                    {
                        (
                            below.into_iter().map(|b| b.map(|(s, _)| s)).collect(),
                            Some(l),
                        )
                    }
                    _ => (vec![None; missed.len()], None),
                }
            };
            // Else the stored states of whole months ([`rollups`]), merged.
            let (grown, lacking) = match lacking {
                Some(l) => (grown, Some(l)),
                None => {
                    let stored = match early.take() {
                        // Read for every question, and all of them are missed.
                        Some(stored) if missed.len() == queries.len() => stored,
                        _ => {
                            let asked: Vec<(Query, String)> = missed
                                .iter()
                                .map(|&i| (queries[i].clone(), rollups::key(zone, &evaluators[i])))
                                .collect();
                            self.stored_months(site, zone, (from, to), &index.sealed, asked)
                                .await?
                        }
                    };
                    match stored {
                        Some((bases, l)) => (
                            bases.into_iter().map(|b| Some(Arc::new(b))).collect(),
                            Some(l),
                        ),
                        None => (grown, None),
                    }
                }
            };
            let days: &[(Date, i64)] = lacking.as_deref().unwrap_or(&index.sealed);
            self.counted
                .fetch_add(missed.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.days.fetch_add(
                (missed.len() * days.len()) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let fresh: Vec<Evaluator> = missed.iter().map(|&i| evaluators[i].fresh()).collect();
            let counted = match self.count_sealed(site, days, fresh, dict).await? {
                Ok((counted, grown_dict)) => {
                    dict = grown_dict;
                    counted
                }
                Err(Changed) => return Ok(Err(Changed)),
            };
            // Grown states: the kept one and the days it lacked. Time rows of sealed days keep
            // counts, not visitor sets (no open day adds to them).
            let sealed: HashSet<Date> = index.sealed.iter().map(|(d, _)| *d).collect();
            let counted: Vec<Evaluator> = yielding(move || {
                counted
                    .into_iter()
                    .zip(grown)
                    .map(|(e, base)| {
                        let mut e = match base {
                            Some(base) => {
                                // A kept state is shared: copied; a month's is this read's.
                                let mut whole = Arc::try_unwrap(base)
                                    .unwrap_or_else(|shared| Evaluator::clone(&shared));
                                whole.merge(e);
                                whole
                            }
                            None => e,
                        };
                        e.close_sealed(|d| sealed.contains(&d));
                        e
                    })
                    .collect()
            })
            .await?;
            {
                let mut partials = self.partials();
                for (i, e) in missed.into_iter().zip(counted) {
                    let e = Arc::new(e);
                    partials.keep(&keys[i], &index.sealed, &e, self.budget / STATES_SHARE);
                    self.states_bytes
                        .store(partials.bytes, std::sync::atomic::Ordering::Relaxed);
                    bases[i] = Some(e);
                }
            }
            // The states kept take their bytes from the parts'.
            let mut kept = self.kept();
            let room = self.parts_room();
            kept.evict_to(room);
        }
        // Then the open days, every question.
        if !open.is_empty() {
            dict = self.complete(site, dict, &open).await?;
            let counting = Counting::new(evaluators).count(open, dict).await?;
            evaluators = counting.finish().await?;
        }
        for (e, extra) in evaluators.iter_mut().zip(extras) {
            e.add_extra(extra)?;
        }
        // Finishing unites the open days' visitor sets with the kept state's and ranks the
        // rows: counting work too, so it yields to live hits like the rest.
        let answers = yielding(move || {
            evaluators
                .into_iter()
                .zip(bases)
                .map(|(e, base)| match base {
                    Some(base) => e.finish_over(&base),
                    None => e.finish(),
                })
                .collect()
        })
        .await?;
        Ok(Ok(answers))
    }

    /// [`Analytics::stored_months`] over the sealed days of `range` as they are now, read
    /// apart from the index (which reads them again in its snapshot), with those days: a
    /// caller uses the states only if the index's sealed days are the same. `None` when no
    /// day of the range is sealed.
    #[allow(clippy::type_complexity)]
    async fn months_ahead(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        (from, to): (Date, Date),
        asked: Vec<(Query, String)>,
    ) -> Result<Option<(Vec<(Date, i64)>, Option<StoredMonths>)>, AnalyticsError> {
        let mut sealed = self.source.sealed_through(site, to).await?;
        sealed.retain(|(d, _)| *d >= from);
        if sealed.is_empty() {
            return Ok(None);
        }
        let months = self
            .stored_months(site, zone, (from, to), &sealed, asked)
            .await?;
        Ok(Some((sealed, months)))
    }

    /// The states of the `asked` questions (each with its [`rollups::key`]) over the days
    /// `range` of `site` that stored month states ([`rollups`]) give, merged, and the days
    /// of `sealed` (the range's sealed days) they leave to count. A month is used only when
    /// every question has a state of it over exactly the range's sealed days of that month,
    /// at their versions; a month the range starts inside is not read. `None` when no month
    /// is used. The next month's states are read while a month is loaded and merged: at most
    /// two months' stored bytes are held at once.
    async fn stored_months(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        (from, to): (Date, Date),
        sealed: &[(Date, i64)],
        asked: Vec<(Query, String)>,
    ) -> Result<Option<StoredMonths>, AnalyticsError> {
        // A question no rollup answers (a filter, another kind of sums) reads nothing more.
        if !rollups::answers(zone, &asked)? {
            return Ok(None);
        }
        let keys: Vec<String> = asked.iter().map(|(_, k)| k.clone()).collect();
        let mut by_month: std::collections::BTreeMap<Date, Vec<(Date, i64)>> = Default::default();
        for d in sealed {
            by_month.entry(rollups::month_of(d.0)).or_default().push(*d);
        }
        let mut lacking = Vec::new();
        let mut months = Vec::new();
        for (month, days) in by_month {
            if month < from {
                lacking.extend(days);
            } else {
                months.push((month, days));
            }
        }
        // The next month's states are read while a month is loaded and merged.
        let mut months = months.into_iter();
        let mut next = match months.next() {
            Some((month, days)) => Some(self.month_states(site, month, &keys, days).await?),
            None => None,
        };
        let asked = Arc::new(asked);
        let mut bases: Option<Vec<Evaluator>> = None;
        while let Some((month, days, states)) = next.take() {
            let following = months.next();
            let read_next = async {
                match following {
                    Some((month, days)) => {
                        self.month_states(site, month, &keys, days).await.map(Some)
                    }
                    None => Ok(None),
                }
            };
            let Some(states) = states else {
                lacking.extend(days);
                next = read_next.await?;
                continue;
            };
            let (asked, zone) = (Arc::clone(&asked), zone.clone());
            let prior = bases.take();
            // All of the month's states loaded before any is merged: one that cannot be read
            // leaves the month to be counted (until `verify --repair` replaces it), never
            // half merged.
            let merge = yielding(move || {
                let loaded: Result<Vec<Evaluator>, query::StateError> = asked
                    .iter()
                    .zip(&states)
                    .map(|((q, _), state)| Evaluator::load(q, from, to, &zone, state))
                    .collect();
                match (loaded, prior) {
                    (Ok(loaded), None) => (Some(loaded), None),
                    (Ok(loaded), Some(mut prior)) => {
                        for (p, e) in prior.iter_mut().zip(loaded) {
                            p.merge(e);
                        }
                        (Some(prior), None)
                    }
                    (Err(e), prior) => (prior, Some(e)),
                }
            });
            let (merged, read) = tokio::join!(merge, read_next);
            let (merged, refused) = merged?;
            bases = merged;
            if let Some(e) = refused {
                tracing::warn!(site = %site, %month, error = %e, "a stored month state was refused; counting its days");
                lacking.extend(days);
            }
            next = read?;
        }
        Ok(bases.map(|b| (b, lacking)))
    }

    /// The stored states of `keys` (in their order) for `month` of `site`, with the month's
    /// sealed `days`; `None` when one of them is missing or counted other days.
    async fn month_states(
        &self,
        site: &SiteId,
        month: Date,
        keys: &[String],
        days: Vec<(Date, i64)>,
    ) -> Result<(Date, Vec<(Date, i64)>, Option<Vec<Vec<u8>>>), StoreError> {
        let stored: HashMap<String, Vec<u8>> = self
            .source
            .rollup_states(site, month, keys.to_vec())
            .await?
            .into_iter()
            .filter(|s| s.days == days)
            .map(|s| (s.key, s.state))
            .collect();
        // A key asked twice (two questions of one counting key) reads the same state.
        let states = keys.iter().map(|k| stored.get(k).cloned()).collect();
        Ok((month, days, states))
    }

    /// Store the state of every question of [`rollups::questions`] over each month of
    /// `site` whose sealed days up to `through` are not what its stored states counted (a
    /// day sealed since, a day sealed again, a question added by an upgrade); how many months
    /// were stored. A month one of whose days changed while it was counted is left for the
    /// next call.
    pub async fn roll_up(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        through: Date,
    ) -> Result<u64, AnalyticsError> {
        let sealed = self.source.sealed_through(site, through).await?;
        let mut stored: HashMap<Date, HashMap<String, Vec<(Date, i64)>>> = HashMap::new();
        for info in self.source.rollup_index(site).await? {
            stored
                .entry(info.month)
                .or_default()
                .insert(info.key, info.days);
        }
        let mut by_month: std::collections::BTreeMap<Date, Vec<(Date, i64)>> = Default::default();
        for d in sealed {
            by_month.entry(rollups::month_of(d.0)).or_default().push(d);
        }
        let keys = rollups::keys(zone)?;
        let mut rolled = 0;
        for (month, days) in by_month {
            let current = stored.get(&month).is_some_and(|have| {
                have.len() == keys.len() && keys.iter().all(|k| have.get(k) == Some(&days))
            });
            if current {
                continue;
            }
            let Some(states) = self.count_month(site, zone, month, &days).await? else {
                continue;
            };
            if self.source.put_rollups(site, month, states).await? {
                rolled += 1;
            }
        }
        Ok(rolled)
    }

    /// The state of every question of [`rollups::questions`] over the sealed `days` of the
    /// month that starts on `month`; `None` when one of them changed while it was counted.
    pub async fn count_month(
        &self,
        site: &SiteId,
        zone: &SiteZone,
        month: Date,
        days: &[(Date, i64)],
    ) -> Result<Option<Vec<rollups::RollupState>>, AnalyticsError> {
        let to = rollups::month_end(month);
        let fresh = rollups::questions()
            .iter()
            .map(|q| Evaluator::new(q, month, to, zone))
            .collect::<Result<Vec<_>, _>>()?;
        let keys: Vec<String> = fresh.iter().map(|e| rollups::key(zone, e)).collect();
        let dict = self
            .kept()
            .dicts
            .get(site.as_str())
            .cloned()
            .unwrap_or_default();
        let Ok((counted, _)) = self.count_sealed(site, days, fresh, dict).await? else {
            return Ok(None);
        };
        let days = days.to_vec();
        let states = yielding(move || {
            counted
                .into_iter()
                .zip(keys)
                .map(|(mut e, key)| {
                    e.close_sealed(|_| true);
                    rollups::RollupState {
                        key,
                        days: days.clone(),
                        state: e.save(),
                    }
                })
                .collect()
        })
        .await?;
        Ok(Some(states))
    }

    /// Recount every stored month state of `sites` ([`rollups`]) from the stored day
    /// segments at the versions it names, and report each that differs; with `repair`,
    /// replace a month that has one. A state over days that changed since (no read uses it;
    /// the next seal pass replaces it) or of a question or zone no longer asked is not
    /// checked.
    pub async fn verify_rollups(
        &self,
        sites: &[crate::core::site::Site],
        repair: bool,
    ) -> Result<super::VerifyReport, AnalyticsError> {
        let mut report = super::VerifyReport::default();
        let questions = rollups::questions();
        for site in sites {
            let mut months: std::collections::BTreeMap<Date, Vec<rollups::RollupInfo>> =
                Default::default();
            for info in self.source.rollup_index(&site.id).await? {
                months.entry(info.month).or_default().push(info);
            }
            for (month, infos) in months {
                let days = infos[0].days.clone();
                let Some(fresh) = self.count_month(&site.id, &site.zone, month, &days).await?
                else {
                    continue;
                };
                let keys = infos.iter().map(|i| i.key.clone()).collect();
                let stored = self.source.rollup_states(&site.id, month, keys).await?;
                let (zone, to) = (site.zone.clone(), rollups::month_end(month));
                let asked = questions.clone();
                let (checks, fresh) = yielding(move || {
                    let checks = stored
                        .into_iter()
                        .filter(|s| s.days == days)
                        .filter_map(|s| {
                            let i = fresh.iter().position(|f| f.key == s.key)?;
                            let load = |bytes: &[u8]| {
                                Evaluator::load(&asked[i], month, to, &zone, bytes).ok()
                            };
                            let mut recount = load(&fresh[i].state)?;
                            let same = load(&s.state).is_some_and(|mut e| e.same_as(&mut recount));
                            Some((i, same, s.state.len(), fresh[i].state.len()))
                        })
                        .collect::<Vec<_>>();
                    (checks, fresh)
                })
                .await?;
                let mut drifted = false;
                for (i, same, stored_len, recount_len) in checks {
                    report.checked += 1;
                    if !same {
                        drifted = true;
                        report.drift.push(super::Drift {
                            key: format!("{}/rollup/{month}/{i}", site.id.as_str()),
                            stored: (-1, stored_len as i64),
                            recounted: (-1, recount_len as i64),
                        });
                    }
                }
                // Stored only if the month's sealed days are still those recounted (a pass
                // may have rolled it anew meanwhile).
                if drifted && repair && self.source.put_rollups(&site.id, month, fresh).await? {
                    report.repaired = true;
                }
            }
        }
        Ok(report)
    }

    /// `evaluators` (fresh, or states over other days) with the sealed `days` counted in,
    /// settled, and `dict` grown by the ids those days use. Each chunk of days is read while
    /// the one before it is counted.
    async fn count_sealed(
        &self,
        site: &SiteId,
        days: &[(Date, i64)],
        evaluators: Vec<Evaluator>,
        mut dict: Arc<SiteDict>,
    ) -> Result<Result<(Vec<Evaluator>, Arc<SiteDict>), Changed>, AnalyticsError> {
        let need_events = evaluators.iter().any(Evaluator::needs_events);
        let mut counting = Counting::new(evaluators);
        let mut chunks = days.chunks(CHUNK_DAYS);
        let mut next = match chunks.next() {
            Some(chunk) => Some(self.sealed(site, chunk, need_events).await?),
            None => None,
        };
        while let Some(read) = next.take() {
            let Ok(days) = read else {
                return Ok(Err(Changed));
            };
            dict = self.complete(site, dict, &days).await?;
            let following = chunks.next();
            let (counted, read) = tokio::join!(counting.count(days, Arc::clone(&dict)), async {
                match following {
                    Some(chunk) => Some(self.sealed(site, chunk, need_events).await),
                    None => None,
                }
            });
            counting = counted?;
            next = read.transpose()?;
        }
        Ok(Ok((counting.finish().await?, dict)))
    }

    /// The turns of `keys` (each once, in key order, so two reads never wait on each
    /// other), held until the returned guards drop.
    async fn turns<'a>(
        &self,
        keys: impl Iterator<Item = &'a str>,
    ) -> Vec<tokio::sync::OwnedMutexGuard<()>> {
        let mut keys: Vec<&str> = keys.collect();
        keys.sort_unstable();
        keys.dedup();
        let locks: Vec<Arc<tokio::sync::Mutex<()>>> = {
            let mut turns = self
                .turns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Turns nobody holds or waits for are dropped.
            turns.retain(|_, t| Arc::strong_count(t) > 1);
            keys.iter()
                .map(|k| Arc::clone(turns.entry((*k).to_owned()).or_default()))
                .collect()
        };
        let mut held = Vec::with_capacity(locks.len());
        for lock in locks {
            held.push(lock.lock_owned().await);
        }
        held
    }

    fn partials(&self) -> std::sync::MutexGuard<'_, Partials> {
        self.partials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The parts of a chunk of sealed days: kept ones, and the rest read (and kept, within
    /// the budget). `Err(Changed)` when a day is no longer sealed at its indexed version.
    async fn sealed(
        &self,
        site: &SiteId,
        chunk: &[(Date, i64)],
        need_events: bool,
    ) -> Result<Result<Vec<DayParts>, Changed>, StoreError> {
        let name = site.as_str();
        let mut have: HashMap<Date, Have> = HashMap::new();
        let mut wanted = Vec::new();
        {
            let kept = self.kept();
            for &(day, version) in chunk {
                let get = |part| {
                    kept.parts
                        .get(&(name.to_owned(), day, part))
                        .filter(|(v, _)| *v == version)
                        .map(|(_, p)| p.clone())
                };
                let seg = match get(Part::Visits) {
                    Some(KeptPart::Visits(s)) => Some(s),
                    _ => None,
                };
                let events = match get(Part::Events) {
                    Some(KeptPart::Events(e)) if need_events => Some(e),
                    _ => None,
                };
                let missing_visits = seg.is_none();
                let missing_events = need_events && events.is_none();
                if missing_visits || missing_events {
                    wanted.push(PartsWanted {
                        day,
                        version,
                        visits: missing_visits,
                        events: missing_events,
                    });
                }
                have.insert(day, (seg, events));
            }
        }
        if !wanted.is_empty() {
            let read = self.source.segment_parts(site, wanted.clone()).await?;
            if read.len() != wanted.len() {
                return Ok(Err(Changed));
            }
            let mut fresh = Vec::new();
            for p in read {
                let slot = have.entry(p.day).or_default();
                if let Some(bytes) = p.visits {
                    let seg = Arc::new(Segment::decode(bytes).map_err(|e| {
                        StoreError::Invalid(format!("segment of {name} {}: {e}", p.day))
                    })?);
                    fresh.push((p.day, p.version, KeptPart::Visits(Arc::clone(&seg))));
                    slot.0 = Some(seg);
                }
                if let Some(bytes) = p.events {
                    let Some(seg) = &slot.0 else {
                        return Ok(Err(Changed));
                    };
                    let events = Arc::new(Events::decode(bytes, seg).map_err(|e| {
                        StoreError::Invalid(format!("segment events of {name} {}: {e}", p.day))
                    })?);
                    fresh.push((p.day, p.version, KeptPart::Events(Arc::clone(&events))));
                    slot.1 = Some(events);
                }
            }
            self.keep(name, fresh);
        }
        let mut days = Vec::with_capacity(chunk.len());
        for &(day, _) in chunk {
            match have.remove(&day) {
                Some((Some(seg), events)) if events.is_some() || !need_events => {
                    days.push(DayParts { day, seg, events })
                }
                _ => return Ok(Err(Changed)),
            }
        }
        Ok(Ok(days))
    }

    /// Bytes kept parts may hold now: the budget less what the kept states hold. Read it
    /// under the parts' lock: a state kept after the read then evicts under that lock too.
    fn parts_room(&self) -> usize {
        let states = self.states_bytes.load(std::sync::atomic::Ordering::Relaxed);
        self.budget.saturating_sub(states)
    }

    /// Bytes kept now: segment parts, question states and dictionaries (for `/metrics`).
    pub fn kept_bytes(&self) -> (usize, usize, usize) {
        let (parts, dicts) = {
            let kept = self.kept();
            (kept.bytes, kept.dict_bytes)
        };
        let states = self.states_bytes.load(std::sync::atomic::Ordering::Relaxed);
        (parts, states, dicts)
    }

    /// Keep freshly read parts, within what the kept states leave of the budget.
    fn keep(&self, site: &str, fresh: Vec<(Date, i64, KeptPart)>) {
        let mut kept = self.kept();
        let room = self.parts_room();
        for (day, version, part) in fresh {
            let bytes = part.size();
            if bytes > room {
                continue;
            }
            kept.evict_to(room - bytes);
            let which = match part {
                KeptPart::Visits(_) => Part::Visits,
                KeptPart::Events(_) => Part::Events,
            };
            let key = (site.to_owned(), day, which);
            match kept.parts.insert(key.clone(), (version, part)) {
                Some((_, old)) => kept.bytes -= old.size(),
                None => kept.order.push_back(key),
            }
            kept.bytes += bytes;
        }
    }

    /// `dict` with the ids these days use added (read from the store once, then kept).
    async fn complete(
        &self,
        site: &SiteId,
        dict: Arc<SiteDict>,
        days: &[DayParts],
    ) -> Result<Arc<SiteDict>, StoreError> {
        let mut pages: Vec<u32> = Vec::new();
        let mut dims: Vec<u32> = Vec::new();
        for d in days {
            pages.extend(d.seg.pages.iter().filter(|id| !dict.pages.contains_key(id)));
            dims.extend(
                d.seg
                    .srcs
                    .iter()
                    .filter(|id| *id != 0 && !dict.srcs.contains_key(id)),
            );
            dims.extend(
                d.seg
                    .agents
                    .iter()
                    .filter(|id| *id != 0 && !dict.agents.contains_key(id)),
            );
        }
        pages.sort_unstable();
        pages.dedup();
        dims.sort_unstable();
        dims.dedup();
        if pages.is_empty() && dims.is_empty() {
            return Ok(dict);
        }
        let rows = self.source.dictionary(site, pages, dims).await?;
        let mut grown = (*dict).clone();
        let mut added = 0;
        for (id, path) in rows.pages {
            added += path.len() + 48;
            grown.pages.insert(id, path.into());
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
                    grown.srcs.insert(id, v);
                }
                DIM_AGENT => {
                    let v = if value == OTHER_DIM {
                        other_agent()
                    } else {
                        AgentDims::decode(&value)
                    };
                    grown.agents.insert(id, v);
                }
                _ => {}
            }
        }
        grown.bytes += added;
        let grown = Arc::new(grown);
        let mut kept = self.kept();
        // The grown copy replaces the site's kept one (which another read may have grown).
        let replaced = kept.dicts.get(site.as_str()).map_or(0, |d| d.bytes);
        kept.dict_bytes = kept.dict_bytes.saturating_sub(replaced) + grown.bytes;
        if kept.dict_bytes > DICTIONARY_BUDGET {
            // Start over; this read keeps its own copy.
            kept.dicts.clear();
            kept.dict_bytes = grown.bytes;
        }
        kept.dicts
            .insert(site.as_str().to_owned(), Arc::clone(&grown));
        Ok(grown)
    }
}

#[cfg(test)]
mod tests {
    use jiff::civil::date;

    use super::*;
    use crate::core::query::{Metric, Value};

    fn state() -> Evaluator {
        let q = Query {
            metrics: vec![Metric::Visitors],
            dimensions: Vec::new(),
            filters: Vec::new(),
            order_by: Vec::new(),
            limit: 10,
            offset: 0,
        };
        let day = date(2026, 3, 2);
        Evaluator::new(&q, day, day, &SiteZone::utc()).expect("a valid question")
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn counting_runs_at_a_lower_priority_than_the_caller() {
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let caller = nice().expect("own priority");
        let counting = yielding(nice).await.expect("ran").expect("its priority");
        assert_eq!(counting, COUNTING_NICE.max(caller));
        assert_eq!(
            nice().expect("own priority"),
            caller,
            "the caller is left alone"
        );
    }

    #[test]
    fn questions_are_shared_out_only_when_they_balance() {
        // A dashboard: one heavy page breakdown and fourteen light questions.
        let mut dashboard = vec![14.0];
        dashboard.extend([1.0; 14]);
        let on_second = share(&dashboard).expect("they balance");
        let second: f64 = (0..15)
            .filter(|&i| on_second[i])
            .map(|i| dashboard[i])
            .sum();
        assert!(on_second.iter().any(|b| *b) && on_second.iter().any(|b| !*b));
        assert!(
            (13.0..=15.0).contains(&second),
            "{second} of 28 on the second"
        );
        assert!(share(&[1.0]).is_none(), "one question: the days are split");
        assert!(share(&[9.0, 1.0, 1.0]).is_none(), "one outweighs the rest");
        assert!(share(&[0.0, 0.0]).is_none(), "nothing measured to share");
    }

    /// Six days of a small site with every kind of event: visitors return across days,
    /// pages, sources and agents vary, some views report engagement, some events are custom.
    fn days(zone: &SiteZone) -> (Vec<DayParts>, SiteDict) {
        let mut rng: u64 = 7;
        let mut next = move |n: u64| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % n
        };
        let first = date(2026, 3, 2);
        let mut out = Vec::new();
        for d in 0..6 {
            let day = first
                .checked_add(jiff::Span::new().days(d))
                .expect("a date");
            let (start, _) = zone.span(day, day);
            let start = start.as_millisecond();
            let events: Vec<segment::DayEvent> = (0..400u32)
                .map(|i| segment::DayEvent {
                    visitor: next(150) as u32,
                    at_ms: start + next(86_000_000) as i64,
                    id: [(i % 251) as u8; 16],
                    name: (next(10) == 0).then(|| format!("signup-{}", next(3))),
                    page: 1 + next(12) as u32,
                    src: next(4) as u32,
                    agent: next(4) as u32,
                    engaged_ms: (next(3) as u32) * 7_000,
                    scroll: (next(2) == 0).then(|| next(101) as u8),
                })
                .collect();
            let (seg, evs) = segment::build(start, events);
            out.push(DayParts {
                day,
                seg: Arc::new(seg),
                events: Some(Arc::new(evs)),
            });
        }
        let mut dict = SiteDict::default();
        for p in 1..=12 {
            dict.pages.insert(p, format!("/p/{p}").into());
        }
        for i in 1..=3u32 {
            let source = SourceDims {
                source: format!("source-{i}"),
                ..SourceDims::default()
            };
            dict.srcs.insert(i, source);
            let agent = AgentDims {
                browser: format!("browser-{i}"),
                ..AgentDims::default()
            };
            dict.agents.insert(i, agent);
        }
        (out, dict)
    }

    #[test]
    fn sharing_out_questions_or_days_gives_the_answers_of_one_thread() {
        use crate::core::query::{Dimension, Grain, VisitDim};
        let zone = SiteZone::utc();
        let (days, dict) = days(&zone);
        let (from, to) = (days[0].day, days[days.len() - 1].day);
        let q = |metrics: &[Metric], dimensions: Vec<Dimension>| Query {
            metrics: metrics.to_vec(),
            dimensions,
            filters: Vec::new(),
            order_by: Vec::new(),
            limit: 100,
            offset: 0,
        };
        let questions = [
            q(
                &[
                    Metric::Visitors,
                    Metric::Visits,
                    Metric::Pageviews,
                    Metric::BounceRate,
                    Metric::VisitDuration,
                ],
                Vec::new(),
            ),
            q(&[Metric::Visitors], vec![Dimension::Time(Grain::Day)]),
            q(
                &[Metric::Visitors, Metric::Pageviews, Metric::TimeOnPage],
                vec![Dimension::Page],
            ),
            q(
                &[Metric::Visitors],
                vec![Dimension::Visit(VisitDim::Source)],
            ),
            q(
                &[Metric::Visitors],
                vec![Dimension::Visit(VisitDim::Browser)],
            ),
            q(&[Metric::Visitors, Metric::Events], vec![Dimension::Name]),
        ];
        let fresh = || -> Vec<Evaluator> {
            questions
                .iter()
                .map(|q| Evaluator::new(q, from, to, &zone).expect("valid"))
                .collect()
        };
        // Counted in two batches (as chunks are), then folded and answered.
        // Whether a state counted anything.
        let counted = |e: &Evaluator| {
            e.clone().finish().rows.iter().any(|r| {
                r.metrics
                    .iter()
                    .any(|m| matches!(m, Value::Int(n) if *n > 0))
            })
        };
        // The answers, and which thread's states counted something, per question.
        let answers = |mut counting: Counting, spent: Option<Vec<Duration>>| {
            if let Some(spent) = spent {
                counting.spent = spent;
            }
            let (a, b) = days.split_at(2);
            let counting = counting.count_now(a, &dict).count_now(b, &dict);
            let Counting { first, second, .. } = counting;
            let threads: Vec<(bool, bool)> = first
                .iter()
                .enumerate()
                .map(|(i, e)| (counted(e), second.get(i).is_some_and(counted)))
                .collect();
            let answers = first
                .into_iter()
                .zip(
                    second
                        .into_iter()
                        .map(Some)
                        .chain(std::iter::repeat_with(|| None)),
                )
                .map(|(mut e, other)| {
                    if let Some(other) = other {
                        e.settle();
                        e.merge(other);
                    }
                    e.finish()
                })
                .collect::<Vec<_>>();
            (answers, threads)
        };
        let (one_thread, _) = answers(
            Counting {
                spent: vec![Duration::ZERO; questions.len()],
                shared: None,
                second: Vec::new(),
                first: fresh(),
            },
            None,
        );
        assert!(one_thread[2].rows.len() > 5, "pages were counted");
        let two = || {
            let first = fresh();
            Counting {
                spent: vec![Duration::ZERO; first.len()],
                shared: None,
                second: first.iter().map(Evaluator::fresh).collect(),
                first,
            }
        };
        let ms = Duration::from_millis;
        // Balanced weights: each question counts every day on one thread.
        let (by_question, threads) = answers(two(), Some(vec![ms(5); questions.len()]));
        assert!(
            threads.iter().all(|(a, b)| a != b),
            "each question on one thread: {threads:?}"
        );
        assert!(threads.iter().any(|t| t.0) && threads.iter().any(|t| t.1));
        // One question outweighs the rest: the days are split.
        let mut heavy = vec![ms(1); questions.len()];
        heavy[2] = ms(100);
        let (by_day, threads) = answers(two(), Some(heavy));
        assert!(threads.iter().all(|(a, b)| *a && *b), "{threads:?}");
        // Weighed on the first day by what each question took, then shared out.
        let (weighed, _) = answers(two(), None);
        assert_eq!(by_question, one_thread);
        assert_eq!(by_day, one_thread);
        assert_eq!(weighed, one_thread);
    }

    #[test]
    fn kept_states_stay_within_their_budget_oldest_first_out() {
        let sealed = [(date(2026, 3, 2), 7)];
        let one = Arc::new(state());
        let size = one.size() + sealed.len() * 16 + "q-000".len();
        let budget = size * 10;
        let mut kept = Partials::default();
        // A flood of distinct questions (another filter value each).
        for i in 0..1_000 {
            kept.keep(&format!("q-{i:03}"), &sealed, &one, budget);
            assert!(kept.bytes <= budget, "{} > {budget}", kept.bytes);
        }
        assert_eq!(kept.states.len(), 10);
        assert_eq!(kept.order.len(), 10);
        assert!(kept.get("q-999", &sealed).is_some(), "the newest stays");
        assert!(
            kept.get("q-000", &sealed).is_none(),
            "the oldest went first"
        );
        // Another version of the same day is another state.
        assert!(kept.get("q-999", &[(date(2026, 3, 2), 8)]).is_none());
        // A state larger than half the budget is never kept.
        let mut small = Partials::default();
        small.keep("big", &sealed, &one, size);
        assert!(small.states.is_empty() && small.bytes == 0);
    }
}
