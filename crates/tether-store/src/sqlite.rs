//! Embedded backend on one SQLite file.
//!
//! Writes go through one writer ([`SqliteDb::write`], `writer`) that takes
//! every job queued at that moment and commits them in one transaction
//! (group commit): a burst of appends costs one commit. Each job runs inside its own
//! savepoint, so one failing job does not undo its neighbours. Its caller is
//! answered only after the commit, so "returned" means "durable".
//!
//! Reads use a small pool of read connections (WAL lets them run beside the
//! writer). The notebook keeps its tables in the same file through the same
//! [`SqliteDb`] handle, so there is one writer per file.
//!
//! This module opens the file (its lock, its connections, their settings)
//! and wires the parts together; each part is a module of its own:
//! `schema` (tables and the conversion of earlier layouts), `writer` (the
//! group commit) and `job` (what it runs), `checkpoint` (WAL upkeep),
//! `readers` (the read pool), `store` (the [`Store`](crate::Store) on all
//! of it), `wal_gather` (the VFS every connection writes through),
//! `walmark` (how far the WAL went, written after each commit) and `check`
//! (the files as SQLite's recovery will read them, before it does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::oneshot;

mod check;
mod checkpoint;
mod job;
mod readers;
mod schema;
mod store;
// SQLite's C interface: the workspace's only `unsafe` code.
#[allow(unsafe_code)]
mod wal_gather;
mod walmark;
mod writer;

#[cfg(feature = "fault-injection")]
pub(crate) use walmark::path as walmark_path;

pub use schema::rebuild_with_rowid;

use job::{DeferredJob, Job, WriteJob};

use crate::{StoreConfig, StoreError, StoreResult};

/// What the writer holds besides its connection.
pub struct WriterCtx {
    /// The writer's own connection.
    pub conn: Connection,
    /// session -> stream -> last assigned seq (a cache of `MAX(seq)`).
    seqs: HashMap<String, HashMap<String, u64>>,
    kv_revision: u64,
    max_events_per_stream: u64,
}

/// A SQLite file with one group-committing writer and a pool of readers.
/// Cheap to clone.
#[derive(Clone)]
pub struct SqliteDb {
    writer: Arc<writer::Writer>,
    readers: readers::ReaderPool,
    path: Arc<PathBuf>,
    // Held for the life of the handle: a second process on the same file is refused.
    _lock: Arc<std::fs::File>,
}

/// Prepared statements kept per connection (the default 16 is fewer than the
/// store and the notebook use; an evicted statement is parsed again).
const STATEMENT_CACHE: usize = 128;
/// Page cache of the writer connection, in KiB (SQLite's default is 2 MiB).
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// Opens one of the process's connections to the file. Every connection
/// goes through SQLite's `unix-excl` VFS: the process takes the file's POSIX
/// lock once and its connections share the WAL index in heap memory, so a
/// transaction takes no `fcntl` locks on a `-shm` file (they were a tenth of
/// the writer's time under load). The file is this process's alone anyway
/// (see `prepare_path`); another process that opens it meanwhile is told
/// it is locked. `unix-excl` is wrapped by `wal_gather`, which writes a
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

/// The WAL file of the database at `db` (`<db>-wal`).
fn wal_path(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
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
    // Checkpoints run on their own thread ([`checkpoint`]), not inside a commit.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.pragma_update(None, "journal_size_limit", checkpoint::WAL_SIZE_LIMIT_BYTES)?;
    Ok(())
}

/// The store's files: the database, its WAL and shared memory, its lock
/// and its WAL marker.
fn store_files(path: &Path) -> Vec<PathBuf> {
    let with = |suffix: &str| PathBuf::from(format!("{}{suffix}", path.display()));
    vec![path.to_path_buf(), with("-wal"), with("-shm"), with(".lock"), walmark::path(path)]
}

/// A store file others may read holds the server key, session IDs and
/// every event: under `strict` it is refused, else made 0600 with a warning.
#[cfg(unix)]
fn private_files(path: &Path, strict: bool) -> StoreResult<()> {
    use std::os::unix::fs::PermissionsExt;
    for file in store_files(path) {
        let Ok(meta) = std::fs::metadata(&file) else { continue };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 == 0 {
            continue;
        }
        if strict {
            return Err(StoreError::Config(format!(
                "{} is open to group or others (mode {mode:o}); chmod 600 it (--durability strict uses no store others can read)",
                file.display()
            )));
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| StoreError::Config(format!("cannot make {} private (chmod 600): {e}", file.display())))?;
        tracing::warn!(file = %file.display(), was = format!("{mode:o}"), "a store file was open to group or others; made it 0600");
    }
    Ok(())
}

#[cfg(unix)]
/// Creates the file and its directory private, and takes the store's lock
/// file, waiting up to `lock_wait` for a process that still holds it.
fn prepare_path(path: &Path, strict: bool, lock_wait: std::time::Duration) -> StoreResult<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::Config(format!("cannot create directory {}: {e}", dir.display())))?;
    }
    // Create the database file ourselves so it starts out 0600; SQLite gives
    // its -wal and -shm files the same mode.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", path.display())))?;
    private_files(path, strict)?;
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| StoreError::Config(format!("cannot open {}: {e}", lock_path.display())))?;
    let deadline = std::time::Instant::now() + lock_wait;
    let mut said = false;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                if !said {
                    said = true;
                    tracing::info!(
                        "{} is locked by another process; waiting up to {lock_wait:?} (a server stopped just now may still be exiting)",
                        path.display()
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(StoreError::InUse(path.display().to_string())),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Config(format!("cannot lock {}: {e}", lock_path.display())));
            }
        }
    }
}

impl SqliteDb {
    /// Opens (creating if needed) the file, applies the schema and starts the writer.
    pub async fn open(path: &Path, config: &StoreConfig) -> StoreResult<Self> {
        let path = path.to_path_buf();
        let strict = config.strict_durability;
        let max_events = config.max_events_per_stream.max(1);
        let lock_wait = config.lock_wait;
        let (lock, conn, kv_revision, checkpoint_conn) = tokio::task::spawn_blocking({
            let path = path.clone();
            move || -> StoreResult<_> {
                let lock = prepare_path(&path, strict, lock_wait)?;
                // Before SQLite's recovery reads a damaged WAL short in silence.
                check::before_open(&path, strict)?;
                let conn = open_connection(&path)?;
                configure(&conn, strict)?;
                schema::apply(&conn)?;
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
        let mut conn = conn;
        let mark = walmark::MarkWriter::open(&path)
            .inspect_err(
                |e| tracing::warn!(error = %e, "sqlite: cannot open the WAL marker; a WAL cut at a commit will not be detected"),
            )
            .ok();
        let wal = checkpoint::start(&mut conn, checkpoint_conn, &path, commits_rx, mark)?;
        let ctx = WriterCtx { conn, seqs: HashMap::new(), kv_revision, max_events_per_stream: max_events };
        let writer = writer::Writer::new(ctx, commits_tx, wal, strict);

        let path = Arc::new(path);
        Ok(Self { writer, readers: readers::ReaderPool::new(path.clone()), path, _lock: Arc::new(lock) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the writer inside the next group commit and returns its
    /// value once that commit is durable. `f` must not block on anything but
    /// SQLite (it runs on a runtime worker), and may run twice (see `writer`): it must not change
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

    /// Changes each time this file's commits succeed again after failing.
    pub fn write_recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.writer.recoveries()
    }

    /// Why this file's commits fail, while they do (a full disk, an I/O
    /// error); `None` once a commit that wrote something succeeded.
    pub fn write_failure(&self) -> Option<String> {
        self.writer.failure()
    }

    /// While commits fail, tries one that writes a page (the header's
    /// `user_version`, rewritten unchanged) and clears the failure if it
    /// succeeds and no other commit failed for [`FAILURE_MEMORY`]: a server
    /// with no traffic notices by itself that writes work again, while one
    /// whose requests' commits still fail (a disk with room for one page but
    /// not for a request's) keeps saying so. An error says why.
    pub async fn probe_writes(&self) -> StoreResult<()> {
        let Some(failure) = self.write_failure() else { return Ok(()) };
        let probed = self
            .write(|ctx| {
                let version: i64 = ctx.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
                ctx.conn.pragma_update(None, "user_version", version)?;
                Ok(())
            })
            .await;
        match probed {
            Ok(()) => {
                // The probe's commit succeeded, so a failure since was another's.
                if let Some(ago) = self.writer.since_failure().filter(|ago| *ago < FAILURE_MEMORY) {
                    return Err(StoreError::Unavailable(format!(
                        "a commit failed {} ms ago ({failure}): free disk space or fix the file system; tether tries again by itself",
                        ago.as_millis()
                    )));
                }
                self.writer.writes_work();
                Ok(())
            }
            Err(e) => Err(StoreError::Unavailable(format!(
                "commits fail ({e}; first: {failure}): free disk space or fix the file system; tether tries again by itself"
            ))),
        }
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
        self.readers.read(f).await
    }
}

/// How long a failed commit keeps the health checks at 503 after a probe
/// write succeeded (a commit that stores something clears it at once).
pub const FAILURE_MEMORY: std::time::Duration = std::time::Duration::from_secs(5);

/// The [`Store`](crate::Store) on SQLite.
#[derive(Clone)]
pub struct SqliteStore {
    db: SqliteDb,
}

impl SqliteStore {
    /// Opens (or creates) the store in the file at `path`; a file another
    /// process holds, or a damaged one, is refused saying what to do.
    pub async fn open(path: &Path, config: StoreConfig) -> StoreResult<Self> {
        Ok(Self { db: SqliteDb::open(path, &config).await? })
    }

    /// The shared file handle, for other repositories (the notebook) that keep
    /// their tables in the same file.
    pub fn db(&self) -> &SqliteDb {
        &self.db
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
        let later =
            tokio::time::timeout(Duration::from_secs(5), db.write(|ctx| Ok(ctx.conn.execute("INSERT INTO t VALUES ('x')", [])?)))
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
