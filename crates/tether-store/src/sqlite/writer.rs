//! The group-committing writer of one SQLite file, without a thread of its own.
//!
//! Callers queue jobs ([`Writer::submit`]). The first caller that finds
//! nobody committing starts a *leader* task; it takes every queued job, runs
//! them back to back in one transaction, commits, answers them, yields, and
//! goes on while jobs are waiting; when the queue is empty it ends. Jobs
//! queued while a commit runs share the next one (group commit).
//!
//! Why a task and not a thread: with a writer thread every commit woke it
//! across threads and every answer woke a task across threads, and on a
//! small machine the thread competed with the runtime's workers for a core.
//! The leader answers from the worker its callers run on. A commit only
//! writes to the page cache (`synchronous=NORMAL`, checkpoints on their own
//! thread), so it holds its worker about as long as any other CPU-bound
//! step; with `--durability strict` every commit waits for an fsync, and
//! the leader runs on the blocking pool instead. The WAL's catch-up
//! checkpoint (once per WAL cycle, ending with an fsync) runs on the
//! blocking pool while the leader waits for it. (Not `block_in_place`: it
//! moved a worker's role to a new thread each time, and every new thread
//! grew the allocators' per-thread arenas: idle_session on SQLite went from
//! ~850 to ~1,450 B per session.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::WriterCtx;
use super::checkpoint::WalRecycling;
use super::job::Job;
use crate::{StoreError, StoreResult};

/// Jobs waiting for the writer; senders wait when it is full (back-pressure).
const WRITE_QUEUE: usize = 4096;
/// At most this many jobs share one commit.
const MAX_BATCH: usize = 512;

/// How often the leader yields to its worker's other tasks between two
/// commits. Each `yield_now` lets the callers it just answered and the
/// requests that arrived meanwhile run (and queue their jobs) before it comes
/// back: the next group grows with the load, without a timer. Never yielding
/// was 10-25% slower (five alternating runs, all behind); twice gave +9% over
/// once (median of eleven alternating pairs, 8 ahead), four times no more.
const YIELDS_BETWEEN_COMMITS: usize = 2;

/// A job and its place in the bounded queue.
struct Queued {
    job: Box<dyn Job>,
    _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Queued>,
    /// A leader task is running or about to: it will take what is queued.
    leading: bool,
    /// A job panicked: the transaction's state is unknown, nothing more is written.
    stopped: bool,
}

pub(super) struct Writer {
    queue: Mutex<Queue>,
    /// Free places in the queue: callers wait for one when it is full (back-pressure).
    slots: Arc<Semaphore>,
    /// Taken only by the leader.
    ctx: Mutex<WriterCtx>,
    /// Wakes the checkpointer after commits.
    commits: std::sync::mpsc::SyncSender<()>,
    wal: Arc<WalRecycling>,
    /// Commits wait for an fsync: lead on the blocking pool.
    fsync_per_commit: bool,
    /// The last commit that wrote something failed (`failure` says why):
    /// a full disk, an I/O error. Read on every commit, hence the flag.
    failing: AtomicBool,
    failure: Mutex<Option<String>>,
    /// When a commit last failed (a request's or a probe's).
    failed_at: Mutex<Option<std::time::Instant>>,
    /// Counts the recoveries from a failure ([`Writer::writes_work`]).
    recoveries: tokio::sync::watch::Sender<u64>,
}

pub(super) fn stopped() -> StoreError {
    StoreError::Unavailable("sqlite writer has stopped".into())
}

impl Writer {
    pub(super) fn new(
        ctx: WriterCtx,
        commits: std::sync::mpsc::SyncSender<()>,
        wal: Arc<WalRecycling>,
        fsync_per_commit: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue::default()),
            slots: Arc::new(Semaphore::new(WRITE_QUEUE)),
            ctx: Mutex::new(ctx),
            commits,
            wal,
            fsync_per_commit,
            failing: AtomicBool::new(false),
            failure: Mutex::new(None),
            failed_at: Mutex::new(None),
            recoveries: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Why commits fail, while they do: set by a failed commit, cleared by
    /// the next one that changed rows (an empty commit proves nothing: it
    /// writes no page) or by [`Writer::writes_work`].
    pub(super) fn failure(&self) -> Option<String> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().clone()
    }

    /// How long ago a commit last failed.
    pub(super) fn since_failure(&self) -> Option<std::time::Duration> {
        self.failed_at.lock().map(|at| at.elapsed())
    }

    fn commit_failed(&self, why: &StoreError) {
        *self.failed_at.lock() = Some(std::time::Instant::now());
        let mut failure = self.failure.lock();
        if failure.is_none() {
            tracing::error!(error = %why, "sqlite: commits fail; requests are refused with 503 until one succeeds (free disk space or fix the file system)");
        }
        *failure = Some(why.to_string());
        self.failing.store(true, Ordering::Release);
    }

    /// A commit that wrote pages succeeded: commits work again.
    pub(super) fn writes_work(&self) {
        let mut failure = self.failure.lock();
        if failure.take().is_some() {
            self.failing.store(false, Ordering::Release);
            tracing::info!("sqlite: commits succeed again");
            self.recoveries.send_modify(|n| *n += 1);
        }
    }

    /// See [`crate::Store::write_recoveries`].
    pub(super) fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// Queues `job` for the next group commit; it is answered through its
    /// own channel once that commit's outcome is known.
    pub(super) async fn submit(self: &Arc<Self>, job: Box<dyn Job>) -> StoreResult<()> {
        let slot = self.slots.clone().acquire_owned().await.map_err(|_| stopped())?;
        let start_leader = {
            let mut queue = self.queue.lock();
            if queue.stopped {
                return Err(stopped());
            }
            queue.jobs.push(Queued { job, _slot: slot });
            !std::mem::replace(&mut queue.leading, true)
        };
        if start_leader {
            self.start_leader();
        }
        Ok(())
    }

    fn start_leader(self: &Arc<Self>) {
        let mut leader = Leader { writer: self.clone(), batch: Vec::new(), done: false };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if self.fsync_per_commit => {
                runtime.spawn_blocking(move || leader.run());
            }
            Ok(runtime) => {
                runtime.spawn(async move {
                    while leader.writer.commit_next_batch(&mut leader.batch) {
                        if leader.writer.wal.catch_up_due() {
                            // It waits for an fsync; jobs queue up meanwhile.
                            let writer = leader.writer.clone();
                            let _ = tokio::task::spawn_blocking(move || writer.catch_up()).await;
                        } else {
                            for _ in 0..YIELDS_BETWEEN_COMMITS {
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                    leader.finish();
                });
            }
            // Polled outside a Tokio runtime: the caller commits.
            Err(_) => leader.run(),
        }
    }

    /// Commits what is queued, moved into `batch` (the leader's, reused).
    /// `false` when nothing was (the leader ends).
    fn commit_next_batch(&self, batch: &mut Vec<Queued>) -> bool {
        {
            let mut queue = self.queue.lock();
            if queue.jobs.is_empty() || queue.stopped {
                queue.leading = false;
                return false;
            }
            let take = queue.jobs.len().min(MAX_BATCH);
            batch.extend(queue.jobs.drain(..take));
        }
        let mut ctx = self.ctx.lock();
        let observer = crate::observe::observer();
        let started = observer.map(|_| std::time::Instant::now());
        let failing = self.failing.load(Ordering::Acquire);
        let changes_before = if failing { ctx.conn.total_changes() } else { 0 };
        let committed = commit(&mut ctx, batch).inspect_err(|_| {
            ctx.seqs.clear();
            let _ = ctx.conn.execute_batch("ROLLBACK");
        });
        match &committed {
            Err(e) => self.commit_failed(e),
            Ok(()) if failing && ctx.conn.total_changes() != changes_before => self.writes_work(),
            Ok(()) => {}
        }
        if let (Some(observer), Some(started)) = (observer, started) {
            observer.commit(started.elapsed(), batch.len());
            if committed.is_err() {
                observer.error();
            }
        }
        for queued in batch.drain(..) {
            queued.job.complete(committed.as_ref().map(|_| ()).map_err(StoreError::clone));
        }
        // Full means the checkpointer is already due to run.
        let _ = self.commits.try_send(());
        true
    }

    /// The WAL's catch-up checkpoint, between two commits (see [`WalRecycling`]).
    fn catch_up(&self) {
        self.wal.catch_up(&self.ctx.lock().conn);
    }
}

/// The one task (or thread) committing, while it runs.
struct Leader {
    writer: Arc<Writer>,
    /// The jobs of the commit under way (kept to reuse its allocation).
    batch: Vec<Queued>,
    /// It ended because the queue was empty.
    done: bool,
}

impl Leader {
    fn run(mut self) {
        while self.writer.commit_next_batch(&mut self.batch) {
            self.writer.catch_up();
        }
        self.finish();
    }

    /// It ended because the queue was empty (see [`Drop`]).
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Leader {
    /// A leader dropped before the queue was empty either panicked in a job
    /// (the transaction it left open is in an unknown state: the writer
    /// stops and queued callers are answered with an error) or was cancelled
    /// with its runtime (the next caller starts another).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let panicked = std::thread::panicking();
        let jobs = {
            let mut queue = self.writer.queue.lock();
            queue.leading = false;
            queue.stopped |= panicked;
            if panicked { std::mem::take(&mut queue.jobs) } else { Vec::new() }
        };
        if panicked {
            tracing::error!("a sqlite write panicked; the writer has stopped");
        }
        for queued in jobs {
            queued.job.complete(Err(stopped()));
        }
    }
}

/// The group commit. Jobs run one after the other in one transaction, with
/// no savepoint each (journalling every job's pages cost more than the job).
/// If one fails, the whole transaction is rolled back and every job of the
/// batch runs again, each in its own savepoint, so a failing job undoes only
/// itself. Callers are answered after the commit.
fn commit(ctx: &mut WriterCtx, batch: &mut [Queued]) -> StoreResult<()> {
    let kv_revision = ctx.kv_revision;
    begin(ctx)?;
    if !batch.iter_mut().all(|queued| queued.job.run(ctx, false)) {
        ctx.conn.prepare_cached("ROLLBACK")?.execute([])?;
        ctx.seqs.clear();
        ctx.kv_revision = kv_revision;
        begin(ctx)?;
        for queued in batch.iter_mut() {
            queued.job.run(ctx, true);
        }
    }
    ctx.conn.prepare_cached("COMMIT")?.execute([]).map_err(|e| StoreError::Backend(format!("commit failed: {e}")))?;
    Ok(())
}

fn begin(ctx: &mut WriterCtx) -> StoreResult<()> {
    ctx.conn
        .prepare_cached("BEGIN IMMEDIATE")?
        .execute([])
        .map_err(|e| StoreError::Backend(format!("cannot begin transaction: {e}")))?;
    Ok(())
}
