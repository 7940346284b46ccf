//! Embedded backend on one SQLite file.
//!
//! Writes go through one writer ([`SqliteDb::write`], [`writer`]) that takes
//! every job queued at that moment and commits them in one transaction
//! (group commit): a burst of appends costs one commit. Each job runs inside its own
//! savepoint, so one failing job does not undo its neighbours. Its caller is
//! answered only after the commit, so "returned" means "durable".
//!
//! Reads use a small pool of read connections (WAL lets them run beside the
//! writer). The notebook keeps its tables in the same file through the same
//! [`SqliteDb`] handle, so there is one writer per file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::oneshot;

mod wal_gather;
mod writer;

use crate::{
    EventKind, SessionRecord, Store, StoreConfig, StoreError, StoreResult, StoredEvent, StreamSummary,
    VersionedValue, now_ms,
};

/// Jobs waiting for the writer; senders wait when it is full (back-pressure).
const WRITE_QUEUE: usize = 4096;
/// At most this many jobs share one commit.
const MAX_BATCH: usize = 512;
/// Read connections kept open; reads beyond this many at once wait for one
/// (opening a connection per read would cost more than waiting).
const READ_POOL: usize = 8;
/// Sequence-number cache entries (sessions) kept by the writer before it starts over.
const SEQ_CACHE_SESSIONS: usize = 10_000;
/// Streams per session in that cache before it starts over for the session.
const SEQ_CACHE_STREAMS: usize = 64;

/// The events table in rowid order: every commit appends its events to the
/// same few pages at the table's end, instead of one page (and its splits)
/// per session. The index that finds a stream's events (`events_by_name`)
/// is ordered by stream name first: request streams are named by time, so
/// a commit's index entries land on the same few pages too (ordered by
/// session first, every call dirtied a page of its own session: that was
/// half of all pages written). Files written before this layout are
/// converted on open.
///
/// What needs a session's streams (rehydration closes its open requests,
/// deleting the session drops its open streams) finds them in
/// `tracked_streams`: a row for every stream that stayed open across a
/// commit (standalone streams, slow requests), never for a quick request,
/// whose first and final events are committed together. Finished streams
/// are dropped by age ([`Store::drop_finished_streams`]).
const EVENTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS events(
    id INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    payload BLOB NOT NULL
)";

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS sessions(
    id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_principal ON sessions(principal, expires_at_ms);
CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions(expires_at_ms);
CREATE UNIQUE INDEX IF NOT EXISTS events_by_name ON events(stream, session, seq);
CREATE TABLE IF NOT EXISTS tracked_streams(
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    finished_at_ms INTEGER,
    PRIMARY KEY(session, stream)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tracked_streams_by_finish ON tracked_streams(finished_at_ms)
    WHERE finished_at_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS cursors(
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY(session, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS kv(
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    expires_at_ms INTEGER,
    PRIMARY KEY(namespace, key)
) WITHOUT ROWID;
"#;

/// What the writer holds besides its connection.
pub struct WriterCtx {
    pub conn: Connection,
    /// session -> stream -> last assigned seq (a cache of `MAX(seq)`).
    seqs: HashMap<String, HashMap<String, u64>>,
    kv_revision: u64,
    max_events_per_stream: u64,
}

/// One caller's work in a group commit.
trait Job: Send {
    /// Runs the work in the open transaction; `isolated` wraps it in its own
    /// savepoint. `false` when it failed (its changes must be undone).
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool;
    /// Answers the caller once the commit's outcome is known.
    fn complete(self: Box<Self>, commit: StoreResult<()>);
}

struct WriteJob<T, F> {
    work: F,
    result: Option<StoreResult<T>>,
    answer: oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for WriteJob<T, F>
where
    T: Send,
    F: FnMut(&mut WriterCtx) -> StoreResult<T> + Send,
{
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool {
        let result = if isolated { run_in_savepoint(ctx, &mut self.work) } else { (self.work)(ctx) };
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn complete(self: Box<Self>, commit: StoreResult<()>) {
        let result = self.result.unwrap_or_else(|| Err(StoreError::Backend("the write did not run".into())));
        let _ = self.answer.send(commit.and(result));
    }
}

/// A write whose caller does not wait for its commit ([`SqliteDb::write_deferred`]).
struct DeferredJob<F> {
    work: F,
    ticket: crate::fence::Ticket,
    on_failure: Option<Box<dyn FnOnce() + Send>>,
}

impl<F> Job for DeferredJob<F>
where
    F: FnMut(&mut WriterCtx) -> StoreResult<()> + Send,
{
    fn run(&mut self, ctx: &mut WriterCtx, isolated: bool) -> bool {
        let result = if isolated { run_in_savepoint(ctx, &mut self.work) } else { (self.work)(ctx) };
        if let Err(e) = &result {
            tracing::error!(error = %e, "a deferred write failed; the response that depends on it is not stored");
        }
        self.ticket.ran(result.is_ok());
        result.is_ok()
    }

    fn complete(self: Box<Self>, commit: StoreResult<()>) {
        if let Err(e) = &commit {
            tracing::error!(error = %e, "the commit of a deferred write failed");
        }
        let ok = commit.is_ok() && crate::fence::check(std::slice::from_ref(&self.ticket)).is_ok();
        self.ticket.committed(ok);
        if !ok
            && let Some(on_failure) = self.on_failure {
                on_failure();
            }
    }
}

/// A SQLite file with one group-committing writer and a pool of readers.
/// Cheap to clone.
#[derive(Clone)]
pub struct SqliteDb {
    writer: Arc<writer::Writer>,
    readers: Arc<Mutex<Vec<Connection>>>,
    read_permits: Arc<tokio::sync::Semaphore>,
    path: Arc<PathBuf>,
    // Held for the life of the handle: a second process on the same file is refused.
    _lock: Arc<std::fs::File>,
}

/// Prepared statements kept per connection (the default 16 is fewer than the
/// store and the notebook use; an evicted statement is parsed again).
const STATEMENT_CACHE: usize = 128;
/// Page cache of the writer connection, in KiB (SQLite's default is 2 MiB).
const WRITER_CACHE_KIB: i64 = 16 * 1024;
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
const WAL_SIZE_LIMIT_BYTES: i64 = 256 * 1024 * 1024;

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
struct WalRecycling {
    /// Frames in the WAL after the writer's last commit.
    frames: std::sync::atomic::AtomicI64,
    restart_due: std::sync::atomic::AtomicBool,
    /// Held while a checkpoint runs, so the two never wait on each other.
    checkpointing: Mutex<()>,
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
    fn catch_up_due(&self) -> bool {
        self.restart_due.load(std::sync::atomic::Ordering::Acquire) || self.over_limit()
    }

    /// On the writer, between transactions: the catch-up checkpoint, if due
    /// and the checkpointer is not in the middle of one, or, when the WAL is
    /// over its limit (the checkpointer falls behind the writes, e.g. starved
    /// of CPU), after the checkpointer's pass: writes wait meanwhile. It ends
    /// with an fsync of the database file.
    fn catch_up(&self, conn: &Connection) {
        use std::sync::atomic::Ordering;
        if !self.catch_up_due() {
            return;
        }
        let _running = if self.over_limit() {
            self.checkpointing.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        } else {
            let Ok(running) = self.checkpointing.try_lock() else { return };
            running
        };
        self.restart_due.store(false, Ordering::Release);
        let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0));
        // The next transaction starts the WAL over.
        self.frames.store(0, Ordering::Relaxed);
        if let Err(e) = copied {
            tracing::warn!(error = %e, "sqlite WAL catch-up checkpoint failed; will retry");
        }
    }
}

/// Converts `table`, if it is still a `WITHOUT ROWID` table, into the rowid
/// table `create` describes, keeping its rows (`columns` are copied), in
/// one transaction (the caller's, if one is open). Returns whether it did.
/// For layouts of earlier versions.
pub fn rebuild_with_rowid(conn: &Connection, table: &str, create: &str, columns: &str) -> StoreResult<bool> {
    let sql: Option<String> = conn
        .query_row("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?1", [table], |r| r.get(0))
        .optional()?;
    if !sql.is_some_and(|sql| sql.to_ascii_uppercase().contains("WITHOUT ROWID")) {
        return Ok(false);
    }
    let old = format!("{table}_before_rowid");
    let steps = format!(
        "ALTER TABLE {table} RENAME TO {old};
         {create};
         INSERT INTO {table}({columns}) SELECT {columns} FROM {old};
         DROP TABLE {old};"
    );
    if conn.is_autocommit() {
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {steps} COMMIT;")).inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    } else {
        // Inside the caller's transaction (a writer job): atomic with it.
        conn.execute_batch(&steps)?;
    }
    tracing::info!(table, "converted to the rowid layout");
    Ok(true)
}

/// From the layout before `tracked_streams`: its index, and its open streams.
const TRACK_EARLIER_STREAMS: &str = "
    DROP INDEX IF EXISTS events_by_stream;
    INSERT OR IGNORE INTO tracked_streams(session, stream, finished_at_ms)
        SELECT session, stream, NULL FROM events GROUP BY session, stream HAVING MAX(kind = 2) = 0;";

fn table_exists(conn: &Connection, table: &str) -> StoreResult<bool> {
    Ok(conn
        .query_row("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1", [table], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Opens one of the process's connections to the file. Every connection
/// goes through SQLite's `unix-excl` VFS: the process takes the file's POSIX
/// lock once and its connections share the WAL index in heap memory, so a
/// transaction takes no `fcntl` locks on a `-shm` file (they were a tenth of
/// the writer's time under load). The file is this process's alone anyway
/// (see [`prepare_path`]); another process that opens it meanwhile is told
/// it is locked. `unix-excl` is wrapped by [`wal_gather`], which writes a
/// commit's WAL frames with one system call.
pub fn open_connection(path: &Path) -> StoreResult<Connection> {
    let vfs = match wal_gather::register() {
        Ok(()) => wal_gather::VFS_NAME,
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| tracing::warn!(error = %e, "sqlite: WAL write gathering unavailable; using unix-excl"));
            c"unix-excl"
        }
    };
    Ok(Connection::open_with_flags_and_vfs(path, rusqlite::OpenFlags::default(), vfs)?)
}

/// Settings every connection gets.
fn tune(conn: &Connection) -> StoreResult<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // A plan that may depend on bound values makes SQLite re-parse a cached
    // statement whenever they change (every call here); a stable plan does not.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn configure(conn: &Connection, strict: bool) -> StoreResult<()> {
    tune(conn)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", if strict { "FULL" } else { "NORMAL" })?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
    // Each job's savepoint journals the pages it changes; keep that in memory.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Checkpoints run on their own thread ([`checkpointer_loop`]), not inside a commit.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    Ok(())
}

/// Copies committed WAL pages back into the database file beside the
/// writer, so a commit never pays for a checkpoint. Woken by the writer
/// after commits; ends when the writer does.
fn checkpointer_loop(conn: Connection, db_file: Option<std::fs::File>, commits: std::sync::mpsc::Receiver<()>, wal: Arc<WalRecycling>) {
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
            let _running = wal.checkpointing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Columns: busy, frames in the WAL, frames copied back.
            let copied = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(2));
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
    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0));
}

#[cfg(unix)]
fn prepare_path(path: &Path) -> StoreResult<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
                StoreError::Config(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
    // Create the database file ourselves so it starts out 0600; SQLite gives
    // its -wal and -shm files the same mode.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", path.display())))?;
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", lock_path.display())))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Config(format!(
            "{} is in use by another tether process; stop it or choose another --store path",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(StoreError::Config(format!("cannot lock {}: {e}", lock_path.display())))
        }
    }
}

impl SqliteDb {
    /// Opens (creating if needed) the file, applies the schema and starts the writer.
    pub async fn open(path: &Path, config: &StoreConfig) -> StoreResult<Self> {
        let path = path.to_path_buf();
        let strict = config.strict_durability;
        let max_events = config.max_events_per_stream.max(1);
        let (lock, conn, kv_revision, checkpoint_conn) = tokio::task::spawn_blocking({
            let path = path.clone();
            move || -> StoreResult<_> {
                let lock = prepare_path(&path)?;
                let conn = open_connection(&path)?;
                configure(&conn, strict)?;
                rebuild_with_rowid(&conn, "events", EVENTS_TABLE, "session, stream, seq, kind, payload")?;
                conn.execute(EVENTS_TABLE, [])?;
                let earlier_layout = table_exists(&conn, "events")? && !table_exists(&conn, "tracked_streams")?;
                conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} {} COMMIT;", if earlier_layout { TRACK_EARLIER_STREAMS } else { "" }))
                    .inspect_err(|_| {
                        let _ = conn.execute_batch("ROLLBACK");
                    })?;
                let kv_revision: u64 =
                    conn.query_row("SELECT COALESCE(MAX(revision), 0) FROM kv", [], |r| r.get::<_, i64>(0))? as u64;
                let checkpoint_conn = open_connection(&path)?;
                tune(&checkpoint_conn)?;
                Ok((lock, conn, kv_revision, checkpoint_conn))
            }
        })
        .await
        .map_err(|e| StoreError::Backend(format!("open task failed: {e}")))??;

        let (commits_tx, commits_rx) = std::sync::mpsc::sync_channel(1);
        // Only to sync what the checkpointer copied; without it SQLite's own syncs remain.
        let db_file = std::fs::File::open(&path).ok();
        let wal = Arc::new(WalRecycling::default());
        let checkpointer_wal = wal.clone();
        std::thread::Builder::new()
            .name("tether-sqlite-checkpoint".into())
            .spawn(move || checkpointer_loop(checkpoint_conn, db_file, commits_rx, checkpointer_wal))
            .map_err(|e| StoreError::Backend(format!("cannot start checkpoint thread: {e}")))?;

        let wal_frames = wal.clone();
        let mut conn = conn;
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: std::ffi::c_int| {
            wal_frames.frames.store(i64::from(frames), std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }))?;
        let ctx = WriterCtx { conn, seqs: HashMap::new(), kv_revision, max_events_per_stream: max_events };
        let writer = writer::Writer::new(ctx, commits_tx, wal, strict);

        Ok(Self {
            writer,
            readers: Arc::new(Mutex::new(Vec::new())),
            read_permits: Arc::new(tokio::sync::Semaphore::new(READ_POOL)),
            path: Arc::new(path),
            _lock: Arc::new(lock),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the writer inside the next group commit and returns its
    /// value once that commit is durable. `f` must not block on anything but
    /// SQLite (it runs on a runtime worker), and may run twice (see [`writer`]): it must not change
    /// anything outside the transaction but the [`WriterCtx`] caches.
    pub async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnMut(&mut WriterCtx) -> StoreResult<T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(WriteJob { work: f, result: None, answer: tx });
        self.writer.submit(job).await?;
        rx.await.map_err(|_| writer::stopped())?
    }

    /// Queues `f` for the next group commit and returns without waiting for
    /// it, when the current task runs in a [`crate::fence::scope`]: the
    /// task's appends then check that it succeeded before they store
    /// anything (see [`crate::fence`]). `None` outside a scope: the caller
    /// uses [`SqliteDb::write`]. `on_failure` runs on the writer if
    /// `f` or its commit fails; it must not block. `f` may run twice, as
    /// with `write`.
    pub async fn write_deferred<F>(&self, f: F, on_failure: impl FnOnce() + Send + 'static) -> Option<StoreResult<()>>
    where
        F: FnMut(&mut WriterCtx) -> StoreResult<()> + Send + 'static,
    {
        if !crate::fence::in_scope() {
            return None;
        }
        let ticket = crate::fence::Ticket::default();
        let job: Box<dyn Job> = Box::new(DeferredJob { work: f, ticket: ticket.clone(), on_failure: Some(Box::new(on_failure)) });
        if let Err(e) = self.writer.submit(job).await {
            return Some(Err(e));
        }
        crate::fence::push(ticket);
        Some(Ok(()))
    }

    /// Runs `f` on a pooled read connection.
    pub async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let permit = self
            .read_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("sqlite reader pool closed".into()))?;
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = readers.lock().map_err(|_| StoreError::Backend("reader pool poisoned".into()))?.pop();
            let conn = match pooled {
                Some(c) => c,
                None => {
                    let c = open_connection(path.as_path())?;
                    tune(&c)?;
                    c
                }
            };
            let result = f(&conn);
            if let Ok(mut pool) = readers.lock()
                && pool.len() < READ_POOL {
                    pool.push(conn);
                }
            result
        })
        .await
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
    }
}

fn run_in_savepoint<T>(ctx: &mut WriterCtx, f: &mut impl FnMut(&mut WriterCtx) -> StoreResult<T>) -> StoreResult<T> {
    ctx.conn.prepare_cached("SAVEPOINT job")?.execute([])?;
    match f(ctx) {
        Ok(v) => {
            ctx.conn.prepare_cached("RELEASE job")?.execute([])?;
            Ok(v)
        }
        Err(e) => {
            // The job's cached sequence numbers may be ahead of its rolled-back rows.
            ctx.seqs.clear();
            let _ = ctx.conn.execute_batch("ROLLBACK TO job; RELEASE job");
            Err(e)
        }
    }
}

impl WriterCtx {
    fn next_seq(&mut self, session: &str, stream: &str) -> StoreResult<u64> {
        if self.seqs.len() > SEQ_CACHE_SESSIONS {
            self.seqs.clear();
        }
        let known = self.seqs.get(session).and_then(|m| m.get(stream)).copied();
        let last = match known {
            Some(v) => v,
            None => self
                .conn
                .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session = ?1 AND stream = ?2")?
                .query_row(params![session, stream], |r| r.get::<_, i64>(0))? as u64,
        };
        Ok(last + 1)
    }

    fn record_seq(&mut self, session: &str, stream: &str, seq: u64) {
        let streams = match self.seqs.get_mut(session) {
            Some(streams) => streams,
            None => self.seqs.entry(session.to_owned()).or_default(),
        };
        if streams.len() >= SEQ_CACHE_STREAMS {
            // Streams that never finished (their process stopped) are not
            // appended to again either.
            streams.clear();
        }
        match streams.get_mut(stream) {
            Some(last) => *last = seq,
            None => {
                streams.insert(stream.to_owned(), seq);
            }
        }
    }

    /// A stream that will not be appended to again (a later append would
    /// look its last number up).
    fn forget_stream(&mut self, session: &str, stream: &str) {
        if let Some(streams) = self.seqs.get_mut(session) {
            streams.remove(stream);
        }
    }

    fn forget_session(&mut self, session: &str) {
        self.seqs.remove(session);
    }
}

/// The [`Store`] on SQLite.
#[derive(Clone)]
pub struct SqliteStore {
    db: SqliteDb,
}

impl SqliteStore {
    /// Appends in one job; `new_stream`: the stream has no events (a
    /// wrong claim fails on the unique index instead of overwriting).
    async fn append_events(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>, new_stream: bool) -> StoreResult<u64> {
        if events.is_empty() {
            return Err(StoreError::Backend("append_batch needs at least one event".into()));
        }
        let session = session.to_owned();
        let stream = stream.to_owned();
        let finishes = events.iter().any(|(kind, _)| *kind == EventKind::Final);
        let depends_on = crate::fence::pending(finishes);
        self.db
            .write(move |ctx| {
                crate::fence::check(&depends_on)?;
                let first = if new_stream { 1 } else { ctx.next_seq(&session, &stream)? };
                let mut seq = first;
                for (kind, payload) in &events {
                    ctx.conn
                        .prepare_cached("INSERT INTO events(session, stream, seq, kind, payload) VALUES (?1, ?2, ?3, ?4, ?5)")?
                        .execute(params![session, stream, seq as i64, *kind as u8, payload.as_ref()])?;
                    if seq > ctx.max_events_per_stream {
                        ctx.conn
                            .prepare_cached("DELETE FROM events WHERE session = ?1 AND stream = ?2 AND seq <= ?3")?
                            .execute(params![session, stream, (seq - ctx.max_events_per_stream) as i64])?;
                    }
                    seq += 1;
                }
                if finishes {
                    // Nothing follows a final response: a quick request's
                    // stream never enters the cache, a slow one's leaves it.
                    ctx.forget_stream(&session, &stream);
                } else {
                    ctx.record_seq(&session, &stream, seq - 1);
                }
                if finishes && first > 1 {
                    ctx.conn
                        .prepare_cached("UPDATE tracked_streams SET finished_at_ms = ?3 WHERE session = ?1 AND stream = ?2")?
                        .execute(params![session, stream, now_ms()])?;
                } else if !finishes && first == 1 {
                    ctx.conn
                        .prepare_cached("INSERT OR IGNORE INTO tracked_streams(session, stream) VALUES (?1, ?2)")?
                        .execute(params![session, stream])?;
                }
                Ok(first)
            })
            .await
    }

    pub async fn open(path: &Path, config: StoreConfig) -> StoreResult<Self> {
        Ok(Self { db: SqliteDb::open(path, &config).await? })
    }

    /// The shared file handle, for other repositories (the notebook) that keep
    /// their tables in the same file.
    pub fn db(&self) -> &SqliteDb {
        &self.db
    }
}

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, i64, i64, i64, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
}

fn to_record(row: (String, String, i64, i64, i64, String)) -> StoreResult<SessionRecord> {
    let (id, principal, created_at_ms, expires_at_ms, revision, state) = row;
    let state = serde_json::from_str(&state).map_err(|e| StoreError::Corrupt(format!("session {id} state: {e}")))?;
    Ok(SessionRecord { id, principal, created_at_ms, expires_at_ms, revision: revision as u64, state })
}

const SESSION_COLUMNS: &str = "id, principal, created_at_ms, expires_at_ms, revision, state";

/// Deletes a session with its cursors and tracked streams; its quick
/// request streams are left to [`Store::drop_finished_streams`].
fn delete_session_rows(conn: &Connection, id: &str) -> StoreResult<bool> {
    conn.prepare_cached(
        "DELETE FROM events WHERE (stream, session) IN (SELECT stream, session FROM tracked_streams WHERE session = ?1)",
    )?
    .execute(params![id])?;
    conn.prepare_cached("DELETE FROM tracked_streams WHERE session = ?1")?.execute(params![id])?;
    conn.prepare_cached("DELETE FROM cursors WHERE session = ?1")?.execute(params![id])?;
    Ok(conn.prepare_cached("DELETE FROM sessions WHERE id = ?1")?.execute(params![id])? > 0)
}

fn stream_summary(conn: &Connection, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
    let row = conn
        .prepare_cached(
            "SELECT MIN(seq), MAX(seq), MAX(kind = 2) FROM events WHERE stream = ?2 AND session = ?1 HAVING COUNT(*) > 0",
        )?
        .query_row(params![session, stream], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))
        .optional()?;
    Ok(row.map(|(first, last, finished)| StreamSummary {
        stream: stream.to_owned(),
        first_seq: first as u64,
        last_seq: last as u64,
        finished: finished != 0,
    }))
}

#[async_trait]
impl Store for SqliteStore {
    async fn create_session(&self, s: &SessionRecord) -> StoreResult<()> {
        let s = s.clone();
        let state = serde_json::to_string(&s.state).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.db
            .write(move |ctx| {
                // An expired leftover with the same ID is replaced.
                let now = now_ms();
                let live: Option<i64> = ctx
                    .conn
                    .query_row("SELECT expires_at_ms FROM sessions WHERE id = ?1", params![s.id], |r| r.get(0))
                    .optional()?;
                match live {
                    Some(t) if t > now => return Err(StoreError::Conflict(format!("session {}", s.id))),
                    Some(_) => {
                        delete_session_rows(&ctx.conn, &s.id)?;
                        ctx.forget_session(&s.id);
                    }
                    None => {}
                }
                ctx.conn.execute(
                    "INSERT INTO sessions(id, principal, created_at_ms, expires_at_ms, revision, state)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![s.id, s.principal, s.created_at_ms, s.expires_at_ms, s.revision as i64, state],
                )?;
                Ok(())
            })
            .await
    }

    async fn get_session(&self, id: &str, now_ms: i64) -> StoreResult<Option<SessionRecord>> {
        let id = id.to_owned();
        self.db
            .read(move |conn| {
                let row = conn
                    .prepare_cached(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1 AND expires_at_ms > ?2"))?
                    .query_row(params![id, now_ms], session_from_row)
                    .optional()?;
                row.map(to_record).transpose()
            })
            .await
    }

    async fn update_session_state(&self, id: &str, expected: u64, state: &serde_json::Value) -> StoreResult<Option<u64>> {
        let id = id.to_owned();
        let state = serde_json::to_string(state).map_err(|e| StoreError::Backend(e.to_string()))?;
        self.db
            .write(move |ctx| {
                let n = ctx.conn.execute(
                    "UPDATE sessions SET state = ?1, revision = revision + 1 WHERE id = ?2 AND revision = ?3",
                    params![state, id, expected as i64],
                )?;
                Ok((n == 1).then_some(expected + 1))
            })
            .await
    }

    async fn touch_session(&self, id: &str, expires_at_ms: i64) -> StoreResult<bool> {
        let id = id.to_owned();
        self.db
            .write(move |ctx| {
                let n = ctx.conn.execute(
                    "UPDATE sessions SET expires_at_ms = MAX(expires_at_ms, ?1) WHERE id = ?2",
                    params![expires_at_ms, id],
                )?;
                Ok(n == 1)
            })
            .await
    }

    async fn delete_session(&self, id: &str) -> StoreResult<bool> {
        let id = id.to_owned();
        self.db
            .write(move |ctx| {
                ctx.forget_session(&id);
                delete_session_rows(&ctx.conn, &id)
            })
            .await
    }

    async fn list_sessions(&self, principal: &str, limit: usize) -> StoreResult<Vec<SessionRecord>> {
        let principal = principal.to_owned();
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {SESSION_COLUMNS} FROM sessions WHERE principal = ?1 AND expires_at_ms > ?2
                     ORDER BY expires_at_ms DESC, id LIMIT ?3"
                ))?;
                let rows = stmt.query_map(params![principal, now_ms(), limit as i64], session_from_row)?;
                rows.map(|r| to_record(r?)).collect()
            })
            .await
    }

    async fn count_sessions(&self, principal: &str, now_ms: i64) -> StoreResult<u64> {
        let principal = principal.to_owned();
        self.db
            .read(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT COUNT(*) FROM sessions WHERE principal = ?1 AND expires_at_ms > ?2")?
                    .query_row(params![principal, now_ms], |r| r.get::<_, i64>(0))? as u64)
            })
            .await
    }

    async fn expire_sessions(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<String>> {
        self.db
            .write(move |ctx| {
                let ids: Vec<String> = {
                    let mut stmt =
                        ctx.conn.prepare_cached("SELECT id FROM sessions WHERE expires_at_ms <= ?1 LIMIT ?2")?;
                    let rows = stmt.query_map(params![now_ms, limit as i64], |r| r.get(0))?;
                    rows.collect::<Result<_, _>>()?
                };
                for id in &ids {
                    delete_session_rows(&ctx.conn, id)?;
                    ctx.forget_session(id);
                }
                ctx.conn.execute(
                    "DELETE FROM kv WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ?1",
                    params![now_ms],
                )?;
                Ok(ids)
            })
            .await
    }

    async fn append(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> StoreResult<u64> {
        self.append_batch(session, stream, vec![(kind, payload)]).await
    }

    async fn append_batch(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, false).await
    }

    async fn start_stream(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> StoreResult<u64> {
        self.append_events(session, stream, events, true).await
    }

    async fn read_after(&self, session: &str, stream: &str, after: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq, kind, payload FROM events WHERE session = ?1 AND stream = ?2 AND seq > ?3
                     ORDER BY seq LIMIT ?4",
                )?;
                let rows = stmt.query_map(params![session, stream, after as i64, limit as i64], |r| {
                    Ok((r.get::<_, i64>(0)?, r.get::<_, u8>(1)?, r.get::<_, Vec<u8>>(2)?))
                })?;
                rows.map(|row| {
                    let (seq, kind, payload) = row?;
                    let kind =
                        EventKind::from_u8(kind).ok_or_else(|| StoreError::Corrupt(format!("event kind {kind}")))?;
                    Ok(StoredEvent { seq: seq as u64, kind, payload: Bytes::from(payload) })
                })
                .collect()
            })
            .await
    }

    async fn open_streams(&self, session: &str) -> StoreResult<Vec<StreamSummary>> {
        let session = session.to_owned();
        self.db
            .read(move |conn| {
                let names: Vec<String> = conn
                    .prepare_cached(
                        "SELECT stream FROM tracked_streams WHERE session = ?1 AND finished_at_ms IS NULL ORDER BY stream",
                    )?
                    .query_map(params![session], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                let mut open = Vec::with_capacity(names.len());
                for name in names {
                    open.extend(stream_summary(conn, &session, &name)?.filter(|s| !s.finished));
                }
                Ok(open)
            })
            .await
    }

    async fn drop_finished_streams(&self, from: &str, below: &str, finished_before_ms: i64, limit: usize) -> StoreResult<u64> {
        let (from, below) = (from.to_owned(), below.to_owned());
        self.db
            .write(move |ctx| {
                // Quick streams (never tracked) finished in the commit that named them.
                let mut dropped = ctx
                    .conn
                    .prepare_cached(
                        "DELETE FROM events WHERE id IN (
                            SELECT e.id FROM events e WHERE e.stream >= ?1 AND e.stream < ?2
                            AND NOT EXISTS (SELECT 1 FROM tracked_streams t WHERE t.session = e.session AND t.stream = e.stream)
                            LIMIT ?3)",
                    )?
                    .execute(params![from, below, limit as i64])?;
                let finished: Vec<(String, String)> = ctx
                    .conn
                    .prepare_cached(
                        "SELECT session, stream FROM tracked_streams WHERE finished_at_ms < ?3 AND stream >= ?1 AND stream < ?2 LIMIT ?4",
                    )?
                    .query_map(params![from, below, finished_before_ms, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                for (session, stream) in finished {
                    dropped += ctx
                        .conn
                        .prepare_cached("DELETE FROM events WHERE stream = ?2 AND session = ?1")?
                        .execute(params![session, stream])?;
                    ctx.conn
                        .prepare_cached("DELETE FROM tracked_streams WHERE session = ?1 AND stream = ?2")?
                        .execute(params![session, stream])?;
                }
                Ok(dropped as u64)
            })
            .await
    }

    async fn stream(&self, session: &str, stream: &str) -> StoreResult<Option<StreamSummary>> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db.read(move |conn| stream_summary(conn, &session, &stream)).await
    }

    async fn set_cursor(&self, session: &str, stream: &str, seq: u64) -> StoreResult<()> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .write(move |ctx| {
                ctx.conn.prepare_cached(
                    "INSERT INTO cursors(session, stream, seq) SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1)
                     ON CONFLICT(session, stream) DO UPDATE SET seq = MAX(seq, excluded.seq)",
                )?
                .execute(params![session, stream, seq as i64])?;
                Ok(())
            })
            .await
    }

    async fn cursor(&self, session: &str, stream: &str) -> StoreResult<u64> {
        let session = session.to_owned();
        let stream = stream.to_owned();
        self.db
            .read(move |conn| {
                let v: Option<i64> = conn
                    .prepare_cached("SELECT seq FROM cursors WHERE session = ?1 AND stream = ?2")?
                    .query_row(params![session, stream], |r| r.get(0))
                    .optional()?;
                Ok(v.unwrap_or(0) as u64)
            })
            .await
    }

    async fn kv_get(&self, namespace: &str, key: &str, now_ms: i64) -> StoreResult<Option<VersionedValue>> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .read(move |conn| {
                let row = conn
                    .prepare_cached(
                        "SELECT value, revision, expires_at_ms FROM kv WHERE namespace = ?1 AND key = ?2
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
                    )?
                    .query_row(params![namespace, key, now_ms], |r| {
                        Ok(VersionedValue {
                            value: Bytes::from(r.get::<_, Vec<u8>>(0)?),
                            revision: r.get::<_, i64>(1)? as u64,
                            expires_at_ms: r.get(2)?,
                        })
                    })
                    .optional()?;
                Ok(row)
            })
            .await
    }

    async fn kv_compare_and_set(
        &self,
        namespace: &str,
        key: &str,
        expected: Option<u64>,
        value: Bytes,
        expires_at_ms: Option<i64>,
    ) -> StoreResult<Option<u64>> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .write(move |ctx| {
                let now = now_ms();
                let current: Option<u64> = ctx
                    .conn
                    .prepare_cached(
                        "SELECT revision FROM kv WHERE namespace = ?1 AND key = ?2
                         AND (expires_at_ms IS NULL OR expires_at_ms > ?3)",
                    )?
                    .query_row(params![namespace, key, now], |r| r.get::<_, i64>(0))
                    .optional()?
                    .map(|v| v as u64);
                if current != expected {
                    return Ok(None);
                }
                let revision = ctx.kv_revision + 1;
                ctx.conn
                    .prepare_cached(
                        "INSERT INTO kv(namespace, key, value, revision, expires_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT(namespace, key) DO UPDATE SET value = excluded.value,
                         revision = excluded.revision, expires_at_ms = excluded.expires_at_ms",
                    )?
                    .execute(params![namespace, key, value.as_ref(), revision as i64, expires_at_ms])?;
                ctx.kv_revision = revision;
                Ok(Some(revision))
            })
            .await
    }

    async fn kv_delete(&self, namespace: &str, key: &str) -> StoreResult<bool> {
        let namespace = namespace.to_owned();
        let key = key.to_owned();
        self.db
            .write(move |ctx| {
                Ok(ctx.conn.execute("DELETE FROM kv WHERE namespace = ?1 AND key = ?2", params![namespace, key])? > 0)
            })
            .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.read(|conn| Ok(conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?)).await?;
        self.flush().await
    }

    async fn flush(&self) -> StoreResult<()> {
        self.db.write(|_| Ok(())).await
    }

    fn describe(&self) -> String {
        format!("sqlite:{}", self.db.path().display())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A job that panics stops the writer (its transaction is in an unknown
    /// state): its caller and every later one get an error instead of
    /// waiting forever for a leader that is gone.
    #[tokio::test]
    async fn a_panicking_job_stops_the_writer_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDb::open(&dir.path().join("t.db"), &StoreConfig::default()).await.unwrap();
        db.write(|ctx| Ok(ctx.conn.execute_batch("CREATE TABLE t(name TEXT PRIMARY KEY)")?)).await.unwrap();
        let panicked = db.write(|_| -> StoreResult<()> { panic!("on purpose") }).await;
        assert!(matches!(panicked, Err(StoreError::Unavailable(_))), "{panicked:?}");
        let later = tokio::time::timeout(Duration::from_secs(5), db.write(|ctx| Ok(ctx.conn.execute("INSERT INTO t VALUES ('x')", [])?)))
            .await
            .expect("a write after the panic is answered");
        assert!(matches!(later, Err(StoreError::Unavailable(_))), "{later:?}");
    }

    /// A job that fails in a group commit undoes only itself: its neighbours
    /// in the same commit run again in savepoints and are committed.
    ///
    /// On the current-thread runtime on purpose: `join!` polls the three
    /// writes in turn, each queues its job in its first poll, and the leader
    /// task the first one starts runs only once all three wait: one batch.
    #[tokio::test]
    async fn a_failing_job_undoes_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteDb::open(&dir.path().join("t.db"), &StoreConfig::default()).await.unwrap();
        db.write(|ctx| Ok(ctx.conn.execute_batch("CREATE TABLE t(name TEXT PRIMARY KEY)")?)).await.unwrap();

        let runs = Arc::new(AtomicUsize::new(0));
        let insert = |name: &'static str, fail: bool, runs: Arc<AtomicUsize>| {
            db.write(move |ctx| {
                runs.fetch_add(1, Ordering::SeqCst);
                ctx.conn.execute("INSERT INTO t(name) VALUES (?1)", [name])?;
                if fail { Err(StoreError::Conflict("on purpose".into())) } else { Ok(()) }
            })
        };
        let (a, b, c) = tokio::join!(
            insert("a", false, runs.clone()),
            insert("b", true, Arc::new(AtomicUsize::new(0))),
            insert("c", false, runs.clone())
        );
        assert!(a.is_ok());
        assert!(matches!(b, Err(StoreError::Conflict(_))));
        assert!(c.is_ok());

        let names: Vec<String> = db
            .read(|conn| {
                let mut stmt = conn.prepare("SELECT name FROM t ORDER BY name")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        assert_eq!(names, ["a", "c"], "the failed job's row is gone, its neighbours' rows are committed");
        assert!(runs.load(Ordering::SeqCst) >= 3, "the neighbours ran again after the batch was rolled back");
    }
}
