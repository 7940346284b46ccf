//! Storage faults for tests (feature `fault-injection`, which only test
//! builds turn on; a release binary has none of this): the WAL writes or
//! syncs of a chosen SQLite file fail with `SQLITE_FULL` or `SQLITE_IOERR`
//! from the Nth one on, until cleared. The hook sits in the VFS every
//! connection writes through (`sqlite/wal_gather.rs`), so SQLite sees
//! exactly what a full disk or a failing device would show it, and tests
//! can watch the server's answer without a full filesystem.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::ffi;

/// Which file operation fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A write to the WAL (every commit writes its frames).
    Write,
    /// An fsync of the WAL (every commit under `--durability strict`, every checkpoint).
    Sync,
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
    /// The database file; its WAL is `<db>-wal`.
    wal: PathBuf,
    op: Op,
    fault: Fault,
    /// Operations that still succeed before the fault starts.
    after: u64,
}

static PLANS: Mutex<Vec<Plan>> = Mutex::new(Vec::new());
/// Any plan at all: the VFS skips the lock otherwise.
static ANY: AtomicBool = AtomicBool::new(false);

/// From the `after`+1-th `op` on the WAL of the database at `db` on, every
/// one fails with `fault`, until [`clear`]. Replaces an earlier plan for
/// the same file and operation.
pub fn inject(db: &Path, op: Op, fault: Fault, after: u64) {
    let wal = wal_of(db);
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    plans.retain(|p| !(p.wal == wal && p.op == op));
    plans.push(Plan { wal, op, fault, after });
    ANY.store(true, Ordering::Release);
}

/// Ends every fault of the database at `db`: its writes succeed again.
pub fn clear(db: &Path) {
    let wal = wal_of(db);
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    plans.retain(|p| p.wal != wal);
    ANY.store(!plans.is_empty(), Ordering::Release);
}

fn wal_of(db: &Path) -> PathBuf {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// The VFS's question before an `op` on the WAL file `file`: the SQLite
/// code to fail it with, if a plan says so.
pub(crate) fn check(file: &Path, op: Op) -> Option<c_int> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    let plan = plans.iter_mut().find(|p| p.op == op && p.wal == file)?;
    if plan.after > 0 {
        plan.after -= 1;
        return None;
    }
    Some(match (plan.fault, op) {
        (Fault::Full, _) => ffi::SQLITE_FULL,
        (Fault::IoErr, Op::Write) => ffi::SQLITE_IOERR_WRITE,
        (Fault::IoErr, Op::Sync) => ffi::SQLITE_IOERR_FSYNC,
    })
}
