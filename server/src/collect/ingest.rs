//! The ingest queue and its single writer: group commit.
//!
//! Contract:
//! - [`Ingest::submit`] puts a job (one or more records) on a bounded queue, or refuses at once
//!   with [`IngestError::QueueFull`] — it never waits for room, so overload becomes a quick
//!   503 with `Retry-After`, not a pile of hanging requests.
//! - One writer task takes jobs off the queue and commits them in batches: a batch closes when
//!   it holds `max_batch` records (size), when `max_delay` has passed since its first job
//!   (time; the default 0 means "commit what is queued as soon as the writer is free": jobs
//!   that arrive during a commit form the next batch — measured 2x the throughput of a 2 ms
//!   wait under 64 clients), or when the queue is closed (shutdown). Each job's answer is sent
//!   only once its batch is durable, so a 2xx always means "durably stored".
//! - The writer needs only the store's write job ([`EventSink`]). For a store with a
//!   [`BatchWriter`] (SQLite) it runs on a thread of its own and calls it there, so a batch
//!   costs no hand-off to the blocking pool (measured ~280 µs of wake-up per batch on 2 busy
//!   cores), and the store may answer a batch once it is durable while the writer already
//!   commits the next (SQLite's WAL sync runs beside the writer: `store::sqlite::durable`).
//!   Any other store (PostgreSQL) is awaited from an async task.
//! - When the commit fails, every job of the batch gets [`IngestError::Store`] and nothing of
//!   the batch is counted (the store's transaction rolled back) — except when SQLite's WAL
//!   sync fails after the commit: then the batch may be counted although it was not
//!   acknowledged, and a retry with the same event id is a duplicate, never a second count.
//! - The writer stops after the last sender is dropped and the queue is drained; `run` awaits it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::core::record::{Outcome, Record};
use crate::metrics::Metrics;
use crate::store::{BatchWriter, EventSink, StoreError};

/// Why a job was not stored.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the ingest queue is full")]
    QueueFull,
    #[error("the collector is shutting down")]
    Closed,
    #[error(transparent)]
    Store(Arc<StoreError>),
}

/// Batching settings.
#[derive(Debug, Clone, Copy)]
pub struct IngestConfig {
    /// Jobs the queue holds before refusing.
    pub capacity: usize,
    /// Records per batch at most.
    pub max_batch: usize,
    /// How long a batch may wait for more jobs after its first one.
    pub max_delay: Duration,
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            capacity: 8192,
            max_batch: 512,
            max_delay: Duration::ZERO,
        }
    }
}

/// Where a job's outcomes go.
type Reply = oneshot::Sender<Result<Vec<Outcome>, IngestError>>;

struct Job {
    records: Vec<Record>,
    reply: Reply,
    enqueued: Instant,
}

/// The sending side of the ingest queue; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Job>,
}

impl Ingest {
    /// Start the writer over `store`. Returns the queue and the writer's handle, which
    /// finishes after every `Ingest` clone is dropped, the queue is drained and every
    /// committed job has its answer. A store with a [`BatchWriter`] gets a thread of its own
    /// (a long-lived task on the blocking pool); any other store an async task.
    ///
    /// With a `BatchWriter` on a `current_thread` runtime: `max_delay > 0` needs the runtime's
    /// own thread to drive timers (`Handle::block_on` cannot), and paused time does not
    /// advance by itself while the writer's blocking task runs.
    pub fn start(
        store: Arc<dyn EventSink>,
        config: IngestConfig,
        metrics: Arc<Metrics>,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(config.capacity.max(1));
        let writer = match store.batch_writer() {
            Some(batch_writer) => {
                let runtime = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || {
                    let mut committer = Committer::Thread(batch_writer);
                    runtime.block_on(writer(rx, &mut committer, config, &metrics));
                    if let Committer::Thread(w) = committer {
                        w.finish();
                    }
                })
            }
            None => tokio::spawn(async move {
                writer(rx, &mut Committer::Task(store), config, &metrics).await;
            }),
        };
        (Self { tx }, writer)
    }

    /// Queue `records` and wait until they are committed; one outcome per record, in order.
    pub async fn submit(&self, records: Vec<Record>) -> Result<Vec<Outcome>, IngestError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            records,
            reply,
            enqueued: Instant::now(),
        };
        self.tx.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => IngestError::QueueFull,
            mpsc::error::TrySendError::Closed(_) => IngestError::Closed,
        })?;
        answer.await.map_err(|_| IngestError::Closed)?
    }

    /// Jobs waiting in the queue (`/metrics` reads it when rendered: `tally_queue_depth`).
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// How the writer commits a batch.
enum Committer {
    /// Await the store's commit (a network database).
    Task(Arc<dyn EventSink>),
    /// Call the store's writer on this thread; it answers when the batch is durable.
    Thread(Box<dyn BatchWriter>),
}

async fn writer(
    mut rx: mpsc::Receiver<Job>,
    committer: &mut Committer,
    config: IngestConfig,
    metrics: &Arc<Metrics>,
) {
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = rx.recv().await {
        let deadline = first.enqueued + config.max_delay;
        let mut size = first.records.len();
        jobs.push(first);
        // Take every job already queued, then (only with max_delay > 0) wait for more.
        while size < config.max_batch {
            let next = match rx.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) if Instant::now() >= deadline => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    tokio::time::timeout_at(deadline, rx.recv())
                        .await
                        .ok()
                        .flatten()
                }
            };
            let Some(job) = next else { break };
            size += job.records.len();
            jobs.push(job);
        }
        metrics
            .oldest_pending_seconds
            .set(jobs[0].enqueued.elapsed().as_secs_f64());
        let mut records = Vec::with_capacity(size);
        let mut replies = Vec::with_capacity(jobs.len());
        for job in jobs.drain(..) {
            replies.push((job.reply, job.records.len()));
            records.extend(job.records);
        }
        metrics.batch_records.observe(size as f64);
        let answer = Answer {
            replies,
            size,
            started: Instant::now(),
            metrics: Arc::clone(metrics),
        };
        match committer {
            Committer::Task(store) => answer.send(store.commit(records).await),
            Committer::Thread(w) => w.commit(records, Box::new(move |r| answer.send(r))),
        }
        // The writer is done with the batch (its answer may still wait for a sync).
        metrics.oldest_pending_seconds.set(0.0);
    }
}

/// The answers a batch owes its jobs, sent once it is durable.
struct Answer {
    /// Each job's reply and how many records it had.
    replies: Vec<(Reply, usize)>,
    size: usize,
    started: Instant,
    metrics: Arc<Metrics>,
}

impl Answer {
    fn send(self, result: Result<Vec<Outcome>, StoreError>) {
        // From the batch's start to its durability: what its senders waited for it.
        self.metrics
            .commit_seconds
            .observe(self.started.elapsed().as_secs_f64());
        match result {
            Ok(outcomes) => {
                let mut outcomes = outcomes.into_iter();
                for (reply, n) in self.replies {
                    let _ = reply.send(Ok(outcomes.by_ref().take(n).collect()));
                }
            }
            Err(e) => {
                let records = self.size;
                if matches!(e, StoreError::DiskFull { .. }) {
                    tracing::warn!(error = %e, records, "batch refused; not counted");
                } else {
                    tracing::error!(error = %e, records, "batch failed; not acknowledged");
                }
                let e = Arc::new(e);
                for (reply, _) in self.replies {
                    let _ = reply.send(Err(IngestError::Store(Arc::clone(&e))));
                }
            }
        }
    }
}
