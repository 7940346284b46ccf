//! WAL upkeep: the checkpointer thread and what it shares with the writer
//! ([`WalRecycling`]) to keep the WAL small.
//!
//! A commit never pays for a checkpoint (`wal_autocheckpoint` is off): the
//! checkpointer copies the WAL back into the database on its own thread and
//! connection, and the writer, between two commits, copies the few frames
//! left so the WAL starts over in place. Both halves live here because
//! neither is right without the other (the reasons are on [`WalRecycling`]).

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::Connection;

use crate::{StoreError, StoreResult};

/// How long the checkpointer lets commits gather before copying the WAL
/// back into the database: a page written by many commits is copied once.
const CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
/// At most this many frames are left for the writer to copy when the WAL
/// starts over (the pause it causes between two commits, a few ms with the
/// fsync), unless the checkpointer cannot get there (below).
const CATCH_UP_FRAMES: i64 = 512;
/// Passes the checkpointer makes to get there before it leaves the rest to
/// the writer anyway.
const CATCH_UP_PASSES: u32 = 4;
/// How often the checkpointer looks at the WAL's size while it waits.
const CHECKPOINT_POLL: std::time::Duration = std::time::Duration::from_millis(5);
/// WAL frames after which the WAL should start over from its beginning.
/// Below [`WAL_SIZE_LIMIT_BYTES`], so it is rewritten in place, never
/// truncated and grown again (growing a file costs the kernel far more per
/// write than overwriting cached pages).
const WAL_RESTART_PAGES: i64 = 4_096;
/// WAL frames after which the writer copies the WAL back itself, waiting
/// for the checkpointer's pass if one runs: a bound on the WAL whatever the
/// write rate.
const WAL_LIMIT_PAGES: i64 = 4 * WAL_RESTART_PAGES;
/// The WAL file is truncated to this size if it ever grew past it.
pub(super) const WAL_SIZE_LIMIT_BYTES: i64 = 256 * 1024 * 1024;

/// What the checkpointer and the writer share to keep the WAL small.
///
/// A WAL starts over only once every frame in it has been copied back, and a
/// checkpoint on another connection never catches up with a busy writer
/// (a RESTART checkpoint there starves behind it: the WAL grew to gigabytes
/// under load, and every commit paid the kernel for growing a file). So the
/// checkpointer copies the WAL back in the background, early once it holds
/// [`WAL_RESTART_PAGES`], and then raises `restart_due`; the writer, between
/// two commits, copies the few frames written since, which lets its next
/// transaction start the WAL over from its beginning.
#[derive(Default)]
pub(super) struct WalRecycling {
    /// Frames in the WAL after the writer's last commit.
    frames: std::sync::atomic::AtomicI64,
    restart_due: std::sync::atomic::AtomicBool,
    /// Held while a checkpoint runs, so the two never wait on each other.
    checkpointing: Mutex<()>,
    /// Counted before and after each checkpoint (odd while one runs): the
    /// WAL marker reads the WAL's salts again when it moved (see
    /// [`super::walmark`]).
    checkpoints: std::sync::atomic::AtomicU64,
}

impl WalRecycling {
    fn is_full(&self) -> bool {
        self.frames.load(std::sync::atomic::Ordering::Relaxed) >= WAL_RESTART_PAGES
    }

    /// The WAL holds so many frames that the writer copies them itself.
    fn over_limit(&self) -> bool {
        self.frames.load(std::sync::atomic::Ordering::Relaxed) >= WAL_LIMIT_PAGES
    }

    /// The checkpointer asked for the catch-up ([`WalRecycling::catch_up`]),
    /// or the WAL is over its limit.
    pub(super) fn catch_up_due(&self) -> bool {
        self.restart_due.load(std::sync::atomic::Ordering::Acquire) || self.over_limit()
    }

    /// Runs the checkpoint `f`, counted (see `checkpoints`). Call it with
    /// `checkpointing` held: checkpoints never overlap, so the count is odd
    /// exactly while one runs.
    fn counted<T>(&self, f: impl FnOnce() -> T) -> T {
        use std::sync::atomic::Ordering;
        self.checkpoints.fetch_add(1, Ordering::SeqCst);
        let result = f();
        self.checkpoints.fetch_add(1, Ordering::SeqCst);
        result
    }

    /// On the writer, between transactions: the catch-up checkpoint, if due
    /// and the checkpointer is not in the middle of one, or, when the WAL is
    /// over its limit (the checkpointer falls behind the writes, e.g. starved
    /// of CPU), after the checkpointer's pass: writes wait meanwhile. It ends
    /// with an fsync of the database file.
    pub(super) fn catch_up(&self, conn: &Connection) {
        use std::sync::atomic::Ordering;
        if !self.catch_up_due() {
            return;
        }
        let _running = if self.over_limit() {
            self.checkpointing.lock()
        } else {
            let Some(running) = self.checkpointing.try_lock() else { return };
            running
        };
        self.restart_due.store(false, Ordering::Release);
        let copied = self.counted(|| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0)));
        // The next transaction starts the WAL over.
        self.frames.store(0, Ordering::Relaxed);
        if let Err(e) = copied {
            tracing::warn!(error = %e, "sqlite WAL catch-up checkpoint failed; will retry");
        }
    }
}

/// Starts the checkpointer on `checkpoint_conn` (woken through `commits`)
/// and has the writer's connection report the WAL's frames after each
/// commit, and write them to `mark` (the WAL marker, if it could be
/// opened); returns what the checkpointer and the writer share.
pub(super) fn start(
    writer_conn: &mut Connection,
    checkpoint_conn: Connection,
    path: &Path,
    commits: std::sync::mpsc::Receiver<()>,
    mut mark: Option<super::walmark::MarkWriter>,
) -> StoreResult<Arc<WalRecycling>> {
    // Only to sync what the checkpointer copied; without it SQLite's own syncs remain.
    let db_file = std::fs::File::open(path).ok();
    let wal = Arc::new(WalRecycling::default());
    let checkpointer_wal = wal.clone();
    std::thread::Builder::new()
        .name("tether-sqlite-checkpoint".into())
        .spawn(move || checkpointer_loop(checkpoint_conn, db_file, commits, checkpointer_wal))
        .map_err(|e| StoreError::Backend(format!("cannot start checkpoint thread: {e}")))?;

    let wal_frames = wal.clone();
    // Runs after the commit (and, under strict, after its fsync of the WAL).
    // An error here would fail a commit that succeeded: there is none.
    writer_conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: std::ffi::c_int| {
        wal_frames.frames.store(i64::from(frames), std::sync::atomic::Ordering::Relaxed);
        if let (Some(mark), Ok(frames)) = (mark.as_mut(), u64::try_from(frames)) {
            mark.committed(frames, wal_frames.checkpoints.load(std::sync::atomic::Ordering::SeqCst));
        }
        Ok(())
    }))?;
    Ok(wal)
}

/// Copies committed WAL pages back into the database file beside the
/// writer, so a commit never pays for a checkpoint. Woken by the writer
/// after commits; ends when the writer does.
fn checkpointer_loop(
    conn: Connection,
    db_file: Option<std::fs::File>,
    commits: std::sync::mpsc::Receiver<()>,
    wal: Arc<WalRecycling>,
) {
    // Passes since the WAL reached its restart size.
    let mut passes = 0;
    while commits.recv().is_ok() {
        // Let commits gather, unless the WAL is due to start over already.
        let gather_until = std::time::Instant::now() + CHECKPOINT_PAUSE;
        while !wal.is_full() && std::time::Instant::now() < gather_until {
            std::thread::sleep(CHECKPOINT_POLL);
        }
        while commits.try_recv().is_ok() {}
        if wal.restart_due.load(std::sync::atomic::Ordering::Acquire) {
            continue; // the writer's turn: it catches up and starts the WAL over
        }
        let passive = {
            let _running = wal.checkpointing.lock();
            // Columns: busy, frames in the WAL, frames copied back.
            let copied = wal.counted(|| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(2)));
            // SQLite syncs the database only after a pass that caught up with
            // the writer, which under steady writes is the writer's catch-up:
            // the kernel would then write back every page copied since, on the
            // writer's thread. Syncing here leaves it the last few.
            if let (Ok(1..), Some(file)) = (&copied, &db_file)
                && let Err(e) = file.sync_data()
            {
                tracing::warn!(error = %e, "sqlite database sync after a checkpoint failed; will retry");
            }
            copied
        };
        match passive {
            Ok(copied) if copied >= WAL_RESTART_PAGES => {
                // Frames the writer added during this pass; once few (or if
                // passes do not catch up, e.g. behind a slow disk), the writer
                // copies them itself; else another pass, right away.
                // (Fewer frames than copied: the WAL has started over already.)
                passes += 1;
                let now = wal.frames.load(std::sync::atomic::Ordering::Relaxed);
                if now >= copied && (now - copied <= CATCH_UP_FRAMES || passes >= CATCH_UP_PASSES) {
                    wal.restart_due.store(true, std::sync::atomic::Ordering::Release);
                    passes = 0;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sqlite checkpoint failed; will retry"),
        }
    }
    // Last one, so a clean stop leaves little WAL behind.
    let _running = wal.checkpointing.lock();
    let _ = wal.counted(|| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0)));
}
