//! The stats lane: reads for dashboards and analytics (day segments, open days, ranges,
//! breakdowns) run on a few threads of their own, each with its own read-only connection, at
//! the counting threads' lower CPU priority (`store::analytics::counting_thread`).
//!
//! Contract:
//! - **Reads yield to live hits.** Lane threads run at nice 10: under contention for the
//!   CPU the collector's threads (the HTTP workers, the writer, the WAL syncer) get ~90 % of
//!   a core against each, so a crowd of dashboard readers slows the readers more than
//!   ingest, and reads still progress when the CPU is full. Where the priority cannot be
//!   lowered, the lane runs at the normal one. A lane thread holding one of SQLite's
//!   process-wide locks while it waits for the CPU could keep the writer waiting: SQLite is
//!   built without the two taken most often (memory statistics on every allocation, and one
//!   page-cache pool shared by every connection; `.cargo/config.toml`), so the locks a read
//!   still shares with the writer are the database file's own, taken once per transaction.
//! - **Bounded.** At most [`LANE_THREADS`] reads run at once, each on one connection with
//!   the readers' bounded page cache; more wait their turn in arrival order (the stats slots
//!   of the HTTP layer bound how many wait). A busy lane never opens more connections.
//! - Started at the first stats read (a CLI command that never reads stats starts no
//!   thread); the threads end when the last clone of the store is dropped.
//! - A read that panics fails alone (its caller gets an error); its thread and connection
//!   live on.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::Connection;

use super::{backend, guard::FileGuard, open_reader};
use crate::store::StoreError;

/// Threads (and connections) of the lane.
pub(super) const LANE_THREADS: usize = 4;

type Job = Box<dyn FnOnce(Result<&mut Connection, StoreError>) + Send>;

/// The lane of one store (shared by its clones).
pub(super) struct Lane {
    path: PathBuf,
    guard: Arc<FileGuard>,
    jobs: OnceLock<Mutex<Sender<Job>>>,
}

impl Lane {
    pub(super) fn new(path: PathBuf, guard: Arc<FileGuard>) -> Self {
        Self {
            path,
            guard,
            jobs: OnceLock::new(),
        }
    }

    /// Run `f` on a lane thread's connection and wait for it.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let guard = Arc::clone(&self.guard);
        let job: Job = Box::new(move |conn| {
            let out = conn.and_then(|conn| {
                guard.check_shm()?;
                f(conn)
            });
            let _ = tx.send(out);
        });
        self.sender()?
            .lock()
            .map_err(|_| backend("stats lane poisoned"))?
            .send(job)
            .map_err(|_| backend("the stats lane has stopped"))?;
        rx.await
            .map_err(|_| backend("a stats read failed (its thread panicked)"))?
    }

    fn sender(&self) -> Result<&Mutex<Sender<Job>>, StoreError> {
        if let Some(jobs) = self.jobs.get() {
            return Ok(jobs);
        }
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for i in 0..LANE_THREADS {
            let (rx, path) = (Arc::clone(&rx), self.path.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("tally-stats-{i}"))
                .spawn(move || serve(&rx, &path));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!(error = %e, "could not start a stats lane thread"),
            }
        }
        if started == 0 {
            return Err(backend("no stats lane thread could be started"));
        }
        // Two first reads at once: the loser's threads end with its dropped sender.
        Ok(self.jobs.get_or_init(|| Mutex::new(tx)))
    }
}

/// A lane thread: take jobs until the store is gone, opening its connection at the first
/// job (and again after a failed open).
fn serve(jobs: &Mutex<Receiver<Job>>, path: &std::path::Path) {
    crate::store::analytics::counting_thread();
    let mut conn: Option<Connection> = None;
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
            Err(_) => return,
        };
        if conn.is_none() {
            match open_reader(path) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    job(Err(e));
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        // A panic drops the job's answer channel (its caller sees the failure); the
        // connection holds no open statement or transaction past the job, so it stays usable.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok(c))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{SqliteStore, StoreOptions};

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("dir");
        let store =
            SqliteStore::open(&dir.path().join("t.sqlite"), StoreOptions::default()).expect("open");
        (dir, store)
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn stats_reads_run_at_the_counting_priority_and_leave_the_caller_alone() {
        let (_dir, store) = store();
        let nice = || rustix::process::getpriority_process(Some(rustix::thread::gettid()));
        let caller = nice().expect("own priority");
        let lane = store
            .read_stats(move |_| Ok(nice().expect("its priority")))
            .await
            .expect("read");
        assert_eq!(lane, crate::store::analytics::COUNTING_NICE.max(caller));
        let quick = store
            .read(move |_| Ok(nice().expect("its priority")))
            .await
            .expect("read");
        assert_eq!(quick, caller, "other reads keep the normal priority");
        assert_eq!(nice().expect("own priority"), caller);
    }

    /// Many reads at once share the lane's threads (no connection beyond them is opened),
    /// each answered with its own result, and a read that panics fails alone.
    #[tokio::test]
    async fn reads_share_the_bounded_threads_and_a_panic_fails_alone() {
        let (_dir, store) = store();
        let reads = (0..LANE_THREADS * 8).map(|i| {
            store.read_stats(move |conn| {
                let n: i64 = conn.query_row("SELECT ?1 * 2", [i as i64], |r| r.get(0))?;
                let thread = std::thread::current().name().map(str::to_owned);
                Ok((n, thread))
            })
        });
        let answers = futures_util::future::join_all(reads).await;
        let mut threads = std::collections::HashSet::new();
        for (i, answer) in answers.into_iter().enumerate() {
            let (n, thread) = answer.expect("answered");
            assert_eq!(n, i as i64 * 2);
            let thread = thread.expect("a named thread");
            assert!(thread.starts_with("tally-stats-"), "{thread}");
            threads.insert(thread);
        }
        assert!(threads.len() <= LANE_THREADS, "{threads:?}");

        let failed = store
            .read_stats(|_| -> Result<(), StoreError> { panic!("a read's bug") })
            .await;
        assert!(failed.is_err());
        for _ in 0..LANE_THREADS * 2 {
            let one: i64 = store
                .read_stats(|conn| Ok(conn.query_row("SELECT 1", [], |r| r.get(0))?))
                .await
                .expect("the lane lives on");
            assert_eq!(one, 1);
        }
    }
}
