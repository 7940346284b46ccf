//! Storage faults for tests (feature `fault-injection`, which only test
//! builds turn on; a release binary has none of this): the WAL writes,
//! syncs or reads of a chosen SQLite file fail with `SQLITE_FULL` or `SQLITE_IOERR`
//! from the Nth one on, until cleared (and the database file's own writes
//! and syncs, [`inject_database`]). The hook sits in the VFS every
//! connection writes through (`sqlite/wal_gather.rs`), so SQLite sees
//! exactly what a full disk or a failing device would show it, and tests
//! can watch the server's answer without a full filesystem.
//!
//! **Power loss** ([`track`], [`power_loss`]): while a file is tracked, every
//! WAL write since the WAL's last completed fsync is kept in an undo log
//! (the bytes it overwrote and the bytes it wrote). A power loss copies the
//! database and the WAL as the disk would hold them after the cut: the WAL
//! as of its last fsync, plus (if asked) the first few unsynced writes, the
//! last of them torn. From then on the tracked WAL takes no write and no
//! sync (the machine is off); the test opens the copy, as a restarted
//! machine would. The database file itself is copied as it is: SQLite
//! writes it only in checkpoints, which copy frames the WAL already synced,
//! so a page torn there is rebuilt from the WAL (what SQLite's design relies
//! on). WAL truncation is not tracked: it happens only past 256 MiB. The
//! WAL marker (`<db>-walmark`, see `sqlite/walmark.rs`) is copied as last
//! written, the newest and so the most demanding of the versions the disk
//! may hold (it is never synced).

use std::ffi::c_int;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use rusqlite::ffi;

/// Which file operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A write to the WAL (every commit writes its frames).
    Write,
    /// An fsync of the WAL (every commit under `--durability strict`, every checkpoint).
    Sync,
    /// A read of the WAL (a reader taking pages that are not in the database file yet).
    Read,
}

/// How it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `SQLITE_FULL`: the disk is full.
    Full,
    /// `SQLITE_IOERR_WRITE` / `SQLITE_IOERR_FSYNC`: the device failed.
    IoErr,
}

struct Plan {
    /// The file it fails: a WAL (`<db>-wal`) or a database file.
    file: PathBuf,
    op: Op,
    fault: Fault,
    /// Operations that still succeed before the fault starts.
    after: u64,
}

static PLANS: Mutex<Vec<Plan>> = Mutex::new(Vec::new());
/// Any plan at all: the VFS skips the lock otherwise.
static ANY: AtomicBool = AtomicBool::new(false);
/// Operations failed by a plan, in this process.
static FIRED: AtomicU64 = AtomicU64::new(0);

/// Operations failed by a plan, per WAL.
static FIRED_BY: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// How many WAL operations the plans failed so far (all files).
pub fn fired() -> u64 {
    FIRED.load(Ordering::Relaxed)
}

/// How many operations on the database at `db` and its WAL the plans
/// failed: a fault test's "faults injected" (tests run side by side, each
/// on its own file).
pub fn fired_for(db: &Path) -> u64 {
    let wal = wal_of(db);
    let fired = FIRED_BY.lock();
    fired.iter().filter(|(file, _)| *file == wal || file == db).map(|(_, n)| n).sum()
}

/// From the `after`+1-th `op` on the WAL of the database at `db` on, every
/// one fails with `fault`, until [`clear`]. Replaces an earlier plan for
/// the same file and operation.
pub fn inject(db: &Path, op: Op, fault: Fault, after: u64) {
    plan(wal_of(db), op, fault, after);
}

/// As [`inject`], for the database file at `db` itself, which SQLite
/// writes only when a checkpoint copies the WAL back into it (and syncs
/// after one).
pub fn inject_database(db: &Path, op: Op, fault: Fault, after: u64) {
    plan(db.to_path_buf(), op, fault, after);
}

fn plan(file: PathBuf, op: Op, fault: Fault, after: u64) {
    let mut plans = PLANS.lock();
    plans.retain(|p| !(p.file == file && p.op == op));
    plans.push(Plan { file, op, fault, after });
    ANY.store(true, Ordering::Release);
}

/// Ends every fault of the database at `db` and its WAL: writes succeed again.
pub fn clear(db: &Path) {
    let wal = wal_of(db);
    let mut plans = PLANS.lock();
    plans.retain(|p| p.file != wal && p.file != db);
    ANY.store(!plans.is_empty(), Ordering::Release);
}

fn wal_of(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The VFS's question before an `op` on `file` (a WAL, or a database file
/// in these builds): the SQLite code to fail it with, if a plan says so.
pub(crate) fn check(file: &Path, op: Op) -> Option<c_int> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let mut plans = PLANS.lock();
    let plan = plans.iter_mut().find(|p| p.op == op && p.file == file)?;
    if plan.after > 0 {
        plan.after -= 1;
        return None;
    }
    FIRED.fetch_add(1, Ordering::Relaxed);
    {
        let mut fired = FIRED_BY.lock();
        match fired.iter_mut().find(|(w, _)| w == file) {
            Some((_, n)) => *n += 1,
            None => fired.push((file.to_path_buf(), 1)),
        }
    }
    Some(match (plan.fault, op) {
        (Fault::Full, _) => ffi::SQLITE_FULL,
        (Fault::IoErr, Op::Write) => ffi::SQLITE_IOERR_WRITE,
        (Fault::IoErr, Op::Sync) => ffi::SQLITE_IOERR_FSYNC,
        (Fault::IoErr, Op::Read) => ffi::SQLITE_IOERR_READ,
    })
}

/// One WAL write since the last fsync: enough to undo it and to redo it.
struct Undo {
    offset: u64,
    /// The bytes it overwrote (only those inside the file at the time).
    old: Vec<u8>,
    new: Vec<u8>,
}

struct Tracked {
    wal: PathBuf,
    /// Read side of the WAL, for the bytes a write overwrites.
    file: Option<std::fs::File>,
    /// The WAL's length at its last fsync (or when tracking began).
    synced_len: u64,
    since_sync: Vec<Undo>,
    syncs: u64,
    /// The power is off: no write or sync reaches the file any more.
    off: bool,
}

/// Tracked files. Held across a tracked file's write and sync, so a power
/// loss sees each as done or not begun.
static TRACKED: Mutex<Vec<Tracked>> = Mutex::new(Vec::new());
static ANY_TRACKED: AtomicBool = AtomicBool::new(false);

/// Starts tracking the WAL of `db` for a [`power_loss`]: what it holds now
/// counts as synced.
pub fn track(db: &Path) {
    let wal = wal_of(db);
    let synced_len = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    let mut tracked = TRACKED.lock();
    tracked.retain(|t| t.wal != wal);
    tracked.push(Tracked { wal, file: None, synced_len, since_sync: Vec::new(), syncs: 0, off: false });
    ANY_TRACKED.store(true, Ordering::Release);
}

/// Stops tracking `db` (its WAL takes writes again if the power was cut).
pub fn untrack(db: &Path) {
    let wal = wal_of(db);
    let mut tracked = TRACKED.lock();
    tracked.retain(|t| t.wal != wal);
    ANY_TRACKED.store(!tracked.is_empty(), Ordering::Release);
}

/// WAL fsyncs of `db` completed since [`track`]: a commit that returned
/// before the count moved past it survives a power loss.
pub fn syncs(db: &Path) -> u64 {
    let wal = wal_of(db);
    let tracked = TRACKED.lock();
    tracked.iter().find(|t| t.wal == wal).map_or(0, |t| t.syncs)
}

/// What a [`power_loss`] left on the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerLossReport {
    /// WAL writes since the last fsync.
    pub unsynced_writes: usize,
    /// Of those, how many reached the disk whole.
    pub kept: usize,
    /// The next one reached it torn, with this many of its bytes.
    pub torn: Option<usize>,
    /// WAL fsyncs completed before the cut.
    pub syncs: u64,
}

/// The power goes off: the WAL of `db` takes no more writes or syncs (they
/// fail with `SQLITE_IOERR`), and `to` (a database path) and `<to>-wal`
/// receive the files as the disk holds them: the WAL as of its last fsync
/// plus its first `keep` unsynced writes and, if `tear` is set, that many
/// bytes of the next one (clamped to what there is).
pub fn power_loss(db: &Path, to: &Path, keep: usize, tear: Option<usize>) -> io::Result<PowerLossReport> {
    let wal = wal_of(db);
    let mut tracked = TRACKED.lock();
    let Some(t) = tracked.iter_mut().find(|t| t.wal == wal) else {
        return Err(io::Error::other(format!("{} is not tracked", db.display())));
    };
    t.off = true;
    std::fs::copy(db, to)?;
    let mut bytes = match std::fs::read(&wal) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    // Back to the last fsync: undo in reverse, then cut what grew since.
    for undo in t.since_sync.iter().rev() {
        put(&mut bytes, undo.offset, &undo.old);
    }
    bytes.truncate(usize::try_from(t.synced_len).unwrap_or(usize::MAX).min(bytes.len()));
    let kept = keep.min(t.since_sync.len());
    for undo in &t.since_sync[..kept] {
        put(&mut bytes, undo.offset, &undo.new);
    }
    let torn = match (tear, t.since_sync.get(kept)) {
        (Some(n), Some(undo)) => {
            let n = n.min(undo.new.len().saturating_sub(1));
            put(&mut bytes, undo.offset, &undo.new[..n]);
            Some(n)
        }
        _ => None,
    };
    write_private(&wal_of(to), &bytes)?;
    // The WAL marker as last written: the writer never syncs it, so the
    // disk may hold it or an older one, and the newest is the one that
    // claims the most. It is written after its commit's WAL fsync under
    // strict (so it claims only synced frames: the restart must open),
    // after its WAL write under normal (a cut at the last sync may leave
    // it ahead of the WAL: the restart warns, and opens).
    let mark = crate::sqlite::walmark_path(db);
    match std::fs::read(&mark) {
        Ok(bytes) => write_private(&crate::sqlite::walmark_path(to), &bytes)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(PowerLossReport { unsynced_writes: t.since_sync.len(), kept, torn, syncs: t.syncs })
}

/// Writes a copy of a store file with the store's own mode (0600): the
/// disk keeps a file's mode through a power loss.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?.write_all(bytes)
}

/// Writes `data` at `offset` into `bytes`, growing it with zeros as a file would.
fn put(bytes: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let Ok(at) = usize::try_from(offset) else { return };
    if bytes.len() < at + data.len() {
        bytes.resize(at + data.len(), 0);
    }
    bytes[at..at + data.len()].copy_from_slice(data);
}

/// The VFS's WAL write: a planned fault fails it; on a tracked file it is
/// recorded for [`power_loss`] (or refused once the power is off); else
/// `write` does it.
pub(crate) fn write(file: &Path, offset: i64, data: &[u8], write: impl FnOnce() -> c_int) -> c_int {
    if let Some(rc) = check(file, Op::Write) {
        return rc;
    }
    if !ANY_TRACKED.load(Ordering::Acquire) {
        return write();
    }
    let mut tracked = TRACKED.lock();
    let Some(t) = tracked.iter_mut().find(|t| t.wal == file) else {
        drop(tracked);
        return write();
    };
    if t.off {
        return rusqlite::ffi::SQLITE_IOERR_WRITE;
    }
    let offset = u64::try_from(offset).unwrap_or(0);
    if t.file.is_none() {
        t.file = std::fs::File::open(&t.wal).ok();
    }
    let mut old = Vec::new();
    if let Some(f) = &t.file {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let n = len.saturating_sub(offset).min(data.len() as u64);
        old.resize(usize::try_from(n).unwrap_or(0), 0);
        if f.read_exact_at(&mut old, offset).is_err() {
            old.clear();
        }
    }
    let rc = write();
    if rc == rusqlite::ffi::SQLITE_OK {
        t.since_sync.push(Undo { offset, old, new: data.to_vec() });
    }
    rc
}

/// The VFS's WAL sync: a planned fault fails it; on a tracked file a
/// completed sync makes every write before it durable.
pub(crate) fn sync(file: &Path, sync: impl FnOnce() -> c_int) -> c_int {
    if let Some(rc) = check(file, Op::Sync) {
        return rc;
    }
    if !ANY_TRACKED.load(Ordering::Acquire) {
        return sync();
    }
    let mut tracked = TRACKED.lock();
    let Some(t) = tracked.iter_mut().find(|t| t.wal == file) else {
        drop(tracked);
        return sync();
    };
    if t.off {
        return rusqlite::ffi::SQLITE_IOERR_FSYNC;
    }
    let rc = sync();
    if rc == rusqlite::ffi::SQLITE_OK {
        t.since_sync.clear();
        t.synced_len = std::fs::metadata(&t.wal).map(|m| m.len()).unwrap_or(t.synced_len);
        t.syncs += 1;
    }
    rc
}
