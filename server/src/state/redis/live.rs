//! The live window on Redis: per-key sorted sets of visitors and per-second event counters,
//! written in shared pipelines by a flusher task.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::{OP_TIMEOUT, RedisLink, name_of};
use crate::core::classify::LiveEntry;
use crate::core::ids::{PagePath, SiteId};
use crate::core::live::LiveNumbers;
use crate::state::LiveState;
use crate::state::memory::MemoryLive;

/// Live records sent to Redis in one pipeline at most (the rest wait for the next one).
pub const LIVE_FLUSH_MAX: usize = 512;

/// Live pipelines of one collector in flight at once (more records wait and join the next).
const LIVE_IN_FLIGHT: usize = 4;

/// Live records waiting for a flush at most; a record finding the queue full waits for room
/// (within its deadline), so the queue's memory is bounded.
const LIVE_QUEUE: usize = 4096;

/// The live window on Redis.
///
/// Records are written by a flusher task per handle, like the ingest queue's group commit:
/// [`LiveState::record`] queues its entry and waits until a pipeline holding it has been
/// answered, and the flusher takes everything queued meanwhile (up to [`LIVE_FLUSH_MAX`]) into
/// one pipeline with, per visitor set, one `ZADD` of all its (second, visitor) pairs, one trim
/// and one TTL, and per event bucket one `INCRBY` and one TTL; up to [`LIVE_IN_FLIGHT`]
/// pipelines are in flight at once. So N concurrent views cost a few round trips and a few
/// commands per key touched instead of N round trips of ten commands. A record waits at most
/// 2 × [`OP_TIMEOUT`] (for room in the queue, then for its pipeline, which has its own
/// [`OP_TIMEOUT`]); a record that cannot reach Redis in that time counts as a fallback
/// ([`RedisHealth`]) and is only in this process's window.
pub struct RedisLive {
    link: Arc<RedisLink>,
    window_secs: i64,
    fallback: MemoryLive,
    /// The flusher's queue: started by the first record (a runtime exists then), started
    /// again if its task has ended (its runtime shut down).
    queue: std::sync::Mutex<Option<tokio::sync::mpsc::Sender<LiveJob>>>,
    flushes: Arc<FlushCount>,
}

/// One record waiting for the flusher.
struct LiveJob {
    entry: LiveEntry,
    now_ms: i64,
    done: tokio::sync::oneshot::Sender<()>,
}

/// Pipelines built so far (for tests); a pipeline built while Redis rests after a failure is
/// not sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushes {
    pub pipelines: u64,
    /// Records they carried.
    pub records: u64,
    /// Records in the largest one.
    pub largest: u64,
}

#[derive(Debug, Default)]
struct FlushCount {
    pipelines: AtomicU64,
    records: AtomicU64,
    largest: AtomicU64,
}

impl FlushCount {
    fn add(&self, records: usize) {
        let records = records as u64;
        self.pipelines.fetch_add(1, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.largest.fetch_max(records, Ordering::Relaxed);
    }

    fn get(&self) -> Flushes {
        Flushes {
            pipelines: self.pipelines.load(Ordering::Relaxed),
            records: self.records.load(Ordering::Relaxed),
            largest: self.largest.load(Ordering::Relaxed),
        }
    }
}

impl RedisLive {
    /// A window of `window_secs` seconds on `link`, with `fallback` for when Redis is gone.
    pub fn new(link: Arc<RedisLink>, window_secs: u32, fallback: MemoryLive) -> Self {
        Self {
            link,
            window_secs: i64::from(window_secs.max(1)),
            fallback,
            queue: std::sync::Mutex::new(None),
            flushes: Arc::default(),
        }
    }

    /// Pipelines built so far and the records they carried.
    pub fn flushes(&self) -> Flushes {
        self.flushes.get()
    }

    /// The flusher's queue, starting the flusher when there is none (or it has ended).
    fn queue(&self) -> tokio::sync::mpsc::Sender<LiveJob> {
        let mut slot = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = tokio::sync::mpsc::channel(LIVE_QUEUE);
        tokio::spawn(flush_live(
            rx,
            Arc::clone(&self.link),
            self.window_secs,
            Arc::clone(&self.flushes),
        ));
        *slot = Some(tx.clone());
        tx
    }
}

/// The visitor-set key and the event-bucket key prefix of a site or page.
fn live_keys(link: &RedisLink, site: &SiteId, page: Option<&PagePath>) -> (String, String) {
    let name = match page {
        Some(p) => name_of(&[site.as_str(), p.as_str()]),
        None => name_of(&[site.as_str()]),
    };
    (
        link.key(format_args!("live:v:{name}")),
        link.key(format_args!("live:e:{name}:")),
    )
}

/// The flusher of one [`RedisLive`]: runs until the handle (the queue's sender) is dropped.
async fn flush_live(
    mut rx: tokio::sync::mpsc::Receiver<LiveJob>,
    link: Arc<RedisLink>,
    window_secs: i64,
    count: Arc<FlushCount>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(LIVE_IN_FLIGHT));
    loop {
        // Wait for a free slot first: records arriving meanwhile join the next pipeline.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut jobs = Vec::with_capacity(LIVE_FLUSH_MAX);
        if rx.recv_many(&mut jobs, LIVE_FLUSH_MAX).await == 0 {
            return;
        }
        let pipe = live_pipeline(&link, window_secs, &jobs);
        count.add(jobs.len());
        let link = Arc::clone(&link);
        tokio::spawn(async move {
            link.run(|mut c| async move { pipe.query_async::<()>(&mut c).await })
                .await;
            drop(slot);
            // Answered (or fallen back: every record is in the in-process window too).
            for job in jobs {
                let _ = job.done.send(());
            }
        });
    }
}

/// One pipeline for `jobs`: per visitor set one `ZADD GT` of every (second, visitor), one trim
/// and one TTL; per event bucket (key and second) one `INCRBY` and one TTL. Keys in sorted
/// order, so a pipeline's content does not depend on hash order.
fn live_pipeline(link: &RedisLink, window_secs: i64, jobs: &[LiveJob]) -> redis::Pipeline {
    use std::collections::BTreeMap;
    let ttl_ms = (window_secs + 1) * 1000;
    // visitor-set key → (latest second, (second, visitor) pairs)
    let mut sets: BTreeMap<String, (i64, Vec<(i64, u64)>)> = BTreeMap::new();
    let mut buckets: BTreeMap<String, u64> = BTreeMap::new();
    for job in jobs {
        let sec = job.now_ms.div_euclid(1000);
        let entry = &job.entry;
        // The site, and the page when there is one.
        let scopes = std::iter::once(None).chain(entry.page.as_ref().map(Some));
        for (visitors, events) in scopes.map(|page| live_keys(link, &entry.site, page)) {
            let set = sets.entry(visitors).or_insert((sec, Vec::new()));
            set.0 = set.0.max(sec);
            set.1.push((sec, entry.visitor));
            *buckets.entry(format!("{events}{sec}")).or_default() += 1;
        }
    }
    let mut pipe = redis::pipe();
    for (visitors, (latest, members)) in &sets {
        pipe.cmd("ZADD").arg(visitors).arg("GT");
        for (sec, visitor) in members {
            pipe.arg(sec).arg(visitor);
        }
        pipe.ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(visitors)
            .arg("-inf")
            .arg(latest - window_secs)
            .ignore()
            .cmd("PEXPIRE")
            .arg(visitors)
            .arg(ttl_ms)
            .ignore();
    }
    for (bucket, n) in &buckets {
        pipe.cmd("INCRBY")
            .arg(bucket)
            .arg(n)
            .ignore()
            .cmd("PEXPIRE")
            .arg(bucket)
            .arg(ttl_ms)
            .ignore();
    }
    pipe
}

#[async_trait]
impl LiveState for RedisLive {
    async fn record(&self, entry: &LiveEntry, now_ms: i64) {
        self.fallback.record(entry, now_ms).await;
        let (done, flushed) = tokio::sync::oneshot::channel();
        let job = LiveJob {
            entry: entry.clone(),
            now_ms,
            done,
        };
        let queue = self.queue();
        let queued = async {
            queue.send(job).await.map_err(|_| "live flusher gone")?;
            flushed.await.map_err(|_| "live flusher gone")
        };
        // The pipeline answers within its own OP_TIMEOUT; this also bounds the wait for room.
        match tokio::time::timeout(2 * OP_TIMEOUT, queued).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.link.health.failed(e),
            Err(_) => self
                .link
                .health
                .failed("live records queued beyond their deadline"),
        }
    }

    async fn read(&self, site: &SiteId, page: Option<&PagePath>, now_ms: i64) -> LiveNumbers {
        let sec = now_ms.div_euclid(1000);
        let (visitors, events) = live_keys(&self.link, site, page);
        // An event of second `s` is in the window while `sec - s < window`.
        let buckets: Vec<String> = ((sec - self.window_secs + 1)..=sec)
            .map(|s| format!("{events}{s}"))
            .collect();
        let from = format!("({}", sec - self.window_secs);
        let answer = self
            .link
            .run(|mut c| async move {
                let mut pipe = redis::pipe();
                pipe.cmd("ZCOUNT").arg(&visitors).arg(&from).arg("+inf");
                pipe.cmd("MGET").arg(&buckets);
                pipe.query_async::<(u64, Vec<Option<u64>>)>(&mut c).await
            })
            .await;
        match answer {
            Some((visitors, counts)) => LiveNumbers {
                events: counts.into_iter().flatten().sum(),
                visitors,
                saturated: false,
            },
            None => self.fallback.read(site, page, now_ms).await,
        }
    }
}
