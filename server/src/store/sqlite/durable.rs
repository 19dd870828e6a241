//! Durability of commits with `SyncMode::Full`, off the writer's critical path.
//!
//! SQLite's own `synchronous=FULL` runs an fsync of the WAL inside every `COMMIT`, so the one
//! writer waits for the disk before it can begin the next batch (measured here: ~370 µs of a
//! ~1.1 ms batch of 24 hits). Instead the writer connection runs `synchronous=NORMAL` (SQLite
//! still syncs the WAL before every checkpoint, the database after it, and the WAL header
//! when the WAL is reused) and this module syncs the WAL itself.
//!
//! Contract:
//! - A batch's answer ([`Durable`]) is handed to the syncer thread after its `COMMIT`
//!   returned. The syncer takes every answer waiting, runs ONE `fdatasync` of the WAL file,
//!   then calls them in commit order. A sync begun after a `COMMIT` returned covers that
//!   commit's frames (an fsync flushes the file, whichever descriptor wrote it), so an
//!   acknowledged batch survives power loss exactly as with `synchronous=FULL`; meanwhile the
//!   writer already commits the next batch, and one sync serves every batch committed during
//!   the previous one.
//! - Every other write transaction (sites, salts, maintenance, `EventSink::commit` outside the
//!   ingest queue) syncs inline before it returns.
//! - A failed sync is final: its batches are answered with an error, and every later write is
//!   refused (`Unavailable`) until a restart. After a failed fsync the kernel may have dropped
//!   the dirty pages, so nothing written since can be promised; a restart recovers from what
//!   the disk holds, and a client's retry is deduplicated by its event id.
//! - Readers may see a batch's counts up to one sync before its senders get their answer; the
//!   promise is about acknowledgements, which never come before the data is on disk. A batch
//!   whose sync failed was committed: it may be counted (until a restart, and after it if its
//!   pages did reach the disk) although its senders got an error; a sender that retries with
//!   the same event id gets `duplicate`, never a second count.
//! - `synchronous=NORMAL` plus this sync is as durable as `FULL` because SQLite is built with
//!   powersafe overwrite on (the bundled default): `FULL` would otherwise pad a commit's last
//!   frames to a sector, which `NORMAL` does not.

use std::fs::File;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;

use super::{Arc, Outcome, StoreError, backend};
use crate::store::Durable;

/// How the WAL is synced: `File::sync_data`, or in tests a disk that fails or stalls.
pub(super) type SyncFn = Box<dyn Fn(&File) -> std::io::Result<()> + Send + Sync>;

/// The WAL file of one store, synced by this store's own descriptor.
pub(super) struct Wal {
    file: File,
    sync: SyncFn,
    /// Held across each sync and the recording of its failure: one sync at a time. Linux
    /// reports a writeback error to one fsync of a descriptor only, so a sync overlapping a
    /// failing one could return `Ok` for pages that never reached the disk.
    syncing: Mutex<()>,
    /// Why a sync failed: then every later write is refused.
    failed: Mutex<Option<String>>,
}

impl Wal {
    /// Open the WAL beside `db` (it exists once a WAL-mode connection has read the file) and
    /// sync the directory once: SQLite syncs a WAL's directory entry on its own first sync of
    /// a new WAL, which with `synchronous=NORMAL` may be a checkpoint away.
    pub(super) fn open(db: &Path) -> std::io::Result<Self> {
        let mut name = db.as_os_str().to_owned();
        name.push("-wal");
        let file = File::open(name)?;
        let dir = match db.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
        Ok(Self::with_sync(file, Box::new(File::sync_data)))
    }

    pub(super) fn with_sync(file: File, sync: SyncFn) -> Self {
        Self {
            file,
            sync,
            syncing: Mutex::new(()),
            failed: Mutex::new(None),
        }
    }

    /// Refuse when an earlier sync failed (never waits for a sync in progress).
    pub(super) fn check(&self) -> Result<(), StoreError> {
        match &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(why) => Err(failed(why)),
            None => Ok(()),
        }
    }

    /// Sync the WAL: every commit that returned before this call is durable when it returns
    /// `Ok`.
    pub(super) fn sync(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        self.check()?;
        (self.sync)(&self.file).map_err(|e| {
            let why = e.to_string();
            tracing::error!(error = %why, "fsync of the SQLite WAL failed: every write is refused until tally restarts");
            *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
            failed(&why)
        })
    }
}

fn failed(why: &str) -> StoreError {
    StoreError::Unavailable(format!(
        "an fsync of the database's WAL failed ({why}); nothing is acknowledged until tally restarts"
    ))
}

/// Committed batches that may wait for a sync at most (besides the group being synced): then
/// the writer waits, the ingest queue fills and hits get `503 overloaded`, as they would with a
/// stalled disk under SQLite's own sync, instead of piling up committed but unanswered.
pub(super) const MAX_WAITING_BATCHES: usize = 64;

/// A committed (or failed) batch waiting for its sync.
type Waiting = (Result<Vec<Outcome>, StoreError>, Durable);

/// The thread that syncs the WAL and answers committed batches.
pub(super) struct Syncer {
    queue: Option<mpsc::SyncSender<Waiting>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Syncer {
    pub(super) fn start(wal: Arc<Wal>) -> Result<Self, StoreError> {
        Self::with_bound(wal, MAX_WAITING_BATCHES)
    }

    fn with_bound(wal: Arc<Wal>, bound: usize) -> Result<Self, StoreError> {
        let (queue, waiting) = mpsc::sync_channel::<Waiting>(bound);
        let thread = std::thread::Builder::new()
            .name("tally-wal-sync".into())
            .spawn(move || {
                while let Ok(first) = waiting.recv() {
                    let mut group = vec![first];
                    group.extend(waiting.try_iter());
                    // One sync for the group; a group of failed commits needs none.
                    let synced = if group.iter().any(|(r, _)| r.is_ok()) {
                        wal.sync()
                    } else {
                        Ok(())
                    };
                    for (result, done) in group {
                        done(match (&synced, result) {
                            (Err(e), Ok(_)) => Err(StoreError::Unavailable(e.to_string())),
                            (_, result) => result,
                        });
                    }
                }
            })
            .map_err(backend)?;
        Ok(Self {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Answer a batch once a sync begun after this call has finished (errors in order, too).
    /// Blocks while [`MAX_WAITING_BATCHES`] batches already wait.
    pub(super) fn after_commit(&self, result: Result<Vec<Outcome>, StoreError>, done: Durable) {
        let Some(queue) = &self.queue else {
            return done(result);
        };
        if let Err(mpsc::SendError((result, done))) = queue.send((result, done)) {
            // The thread is gone (it panicked): answer without a promise we cannot keep.
            done(result.and(Err(backend("the WAL sync thread stopped"))));
        }
    }

    /// Answer everything waiting, then stop the thread.
    pub(super) fn finish(mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the tests of this store use to stand in for a disk that stalls or fails.
#[cfg(test)]
pub(super) mod testing {
    use super::*;

    /// Long enough for any sync here; a test that waits longer has failed.
    pub(in crate::store::sqlite) const PATIENCE: std::time::Duration =
        std::time::Duration::from_secs(30);

    /// A batch's answer and where it arrives.
    pub(in crate::store::sqlite) fn answer()
    -> (Durable, mpsc::Receiver<Result<Vec<Outcome>, StoreError>>) {
        let (tx, rx) = mpsc::channel();
        (
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
            rx,
        )
    }

    /// A sync that waits until the test lets it go, then syncs the file: (the sync, "a sync
    /// began", "let one sync finish").
    pub(in crate::store::sqlite) fn stalled_sync() -> (SyncFn, mpsc::Receiver<()>, mpsc::Sender<()>)
    {
        let (began_tx, began) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let sync: SyncFn = Box::new(move |file| {
            let _ = began_tx.send(());
            let _ = released.lock().expect("lock").recv();
            file.sync_data()
        });
        (sync, began, release)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{PATIENCE, answer, stalled_sync};
    use super::*;
    use std::sync::mpsc::TryRecvError;

    fn scratch() -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = File::create(dir.path().join("x-wal")).expect("file");
        (dir, file)
    }

    /// A WAL on a disk whose every sync waits until the test lets it go.
    fn stalled() -> (tempfile::TempDir, Wal, mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (dir, file) = scratch();
        let (sync, began, release) = stalled_sync();
        (dir, Wal::with_sync(file, sync), began, release)
    }

    #[test]
    fn an_answer_waits_for_a_sync_begun_after_its_commit() {
        let (_dir, wal, began, release) = stalled();
        let syncer = Syncer::start(Arc::new(wal)).expect("syncer");
        let (done, first) = answer();
        syncer.after_commit(Ok(vec![Outcome::Accepted]), done);
        began.recv_timeout(PATIENCE).expect("the first sync began");
        // The sync is stalled: the answer has not come, and the writer is not held up.
        assert!(matches!(first.try_recv(), Err(TryRecvError::Empty)));
        let (done, second) = answer();
        syncer.after_commit(Ok(vec![Outcome::Duplicate]), done);
        release.send(()).expect("release the first sync");
        assert!(matches!(
            first
                .recv_timeout(PATIENCE)
                .expect("first answer")
                .as_deref(),
            Ok([Outcome::Accepted])
        ));
        // The second commit came after the first sync began: it needs a sync of its own.
        began.recv_timeout(PATIENCE).expect("a second sync began");
        assert!(matches!(second.try_recv(), Err(TryRecvError::Empty)));
        release.send(()).expect("release the second sync");
        assert!(matches!(
            second
                .recv_timeout(PATIENCE)
                .expect("second answer")
                .as_deref(),
            Ok([Outcome::Duplicate])
        ));
        syncer.finish();
    }

    #[test]
    fn a_failed_commit_is_answered_after_the_batches_before_it() {
        let (_dir, wal, began, release) = stalled();
        let syncer = Syncer::start(Arc::new(wal)).expect("syncer");
        let (done, first) = answer();
        syncer.after_commit(Ok(vec![Outcome::Accepted]), done);
        began.recv_timeout(PATIENCE).expect("the sync began");
        let (done, failed) = answer();
        syncer.after_commit(Err(StoreError::Conflict("lost a race".into())), done);
        // Not answered ahead of the batch still waiting for its sync.
        assert!(matches!(failed.try_recv(), Err(TryRecvError::Empty)));
        release.send(()).expect("release the sync");
        assert!(first.recv_timeout(PATIENCE).expect("first answer").is_ok());
        assert!(matches!(
            failed.recv_timeout(PATIENCE).expect("second answer"),
            Err(StoreError::Conflict(_))
        ));
        syncer.finish();
    }

    #[test]
    fn a_failed_sync_fails_its_batches_and_every_later_write() {
        let (_dir, file) = scratch();
        let wal = Arc::new(Wal::with_sync(
            file,
            Box::new(|_| Err(std::io::Error::other("disk gone"))),
        ));
        let syncer = Syncer::start(Arc::clone(&wal)).expect("syncer");
        let (done, first) = answer();
        syncer.after_commit(Ok(vec![Outcome::Accepted]), done);
        let err = first
            .recv_timeout(PATIENCE)
            .expect("answer")
            .expect_err("not durable");
        assert!(err.to_string().contains("disk gone"), "{err}");
        assert!(wal.check().is_err(), "later writes are refused");
        assert!(wal.sync().is_err());
        syncer.finish();
    }

    #[test]
    fn the_writer_waits_when_the_bound_of_waiting_batches_is_reached() {
        let (_dir, wal, began, release) = stalled();
        let syncer = Arc::new(Syncer::with_bound(Arc::new(wal), 1).expect("syncer"));
        let (done, _first) = answer();
        syncer.after_commit(Ok(Vec::new()), done);
        began.recv_timeout(PATIENCE).expect("the sync began");
        // One batch may wait beside the group being synced…
        let (done, _second) = answer();
        syncer.after_commit(Ok(Vec::new()), done);
        // …the next one holds its writer until the stalled sync ends.
        let (returned_tx, returned) = mpsc::channel();
        let writer = {
            let syncer = Arc::clone(&syncer);
            std::thread::spawn(move || {
                let (done, third) = answer();
                syncer.after_commit(Ok(Vec::new()), done);
                let _ = returned_tx.send(());
                third
            })
        };
        assert!(
            returned
                .recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "the writer was not held"
        );
        release.send(()).expect("release");
        returned.recv_timeout(PATIENCE).expect("the writer goes on");
        // The second and third batch take one sync or two, as they happen to be grouped.
        for _ in 0..2 {
            release.send(()).expect("release");
        }
        let third = writer.join().expect("writer");
        assert!(third.recv_timeout(PATIENCE).expect("third answer").is_ok());
        Arc::into_inner(syncer).expect("one owner").finish();
    }
}
