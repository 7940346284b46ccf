//! A SQLite VFS that writes a commit's WAL frames with one `pwrite`.
//!
//! SQLite appends each WAL frame with two writes, its 24-byte header and its
//! page, so a group commit of nine pages made eighteen system calls on the
//! writer (two per `tools_call`, more than the HTTP answers took). This VFS
//! is SQLite's own `unix-excl` with one change: the WAL file's appends are
//! gathered in memory and written at once when the commit frame is complete.
//!
//! What keeps it exactly as safe as the plain VFS (the rules are in
//! [`GatherFile::write`]):
//! - Nothing is held back past the end of a commit: the write that completes
//!   a commit frame (a header whose "database size" field is set, then its
//!   page) flushes, before SQLite publishes the commit to other connections
//!   and before the commit returns. A `kill -9` after a commit returned finds
//!   it in the file, as before.
//! - Order is kept: a write that does not continue the gathered bytes flushes
//!   them first and goes straight through (SQLite rewriting a frame it wrote
//!   earlier in the transaction, or the WAL header when the WAL starts over).
//! - Every other operation on the file (read, sync, size, truncate, file
//!   control, close) flushes first, so SQLite never sees a file without what
//!   it wrote; under `--durability strict` the commit's sync flushes.
//! - The buffer is bounded ([`MAX_GATHERED`]): a large transaction is written
//!   in pieces of that size.
//!
//! Only files SQLite opens as a WAL are wrapped; the database file and
//! everything else use `unix-excl`'s methods directly. (In test builds with
//! the `fault-injection` feature the database file is wrapped too, writing
//! straight through, so that its writes and syncs can be failed.)

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name connections open files with ([`super::open_connection`]).
pub const VFS_NAME: &CStr = c"tether-unix-excl";
/// The VFS this one wraps.
const INNER_VFS: &CStr = c"unix-excl";
/// Gathered bytes are written once they reach this size, in one write
/// (`unix-excl` writes at most 128 KiB per call).
const MAX_GATHERED: usize = 64 * 1024;
/// A WAL frame header: page number, database size after a commit (zero for
/// other frames), salts and checksums.
const FRAME_HEADER: usize = 24;

#[cfg(test)]
thread_local! {
    /// Writes that reached a WAL file from this thread (SQLite calls a VFS
    /// on the thread that uses the connection).
    static WAL_WRITES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Registers the VFS once per process; later calls return the first outcome.
pub fn register() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED.get_or_init(register_once).clone()
}

/// The wrapped VFS, set once by [`register_once`] before anything can open a file.
static INNER: OnceLock<InnerVfs> = OnceLock::new();

struct InnerVfs(*mut ffi::sqlite3_vfs);
// SAFETY: SQLite's VFS objects are process-wide and thread-safe by contract;
// the pointer is only handed back to SQLite.
unsafe impl Send for InnerVfs {}
unsafe impl Sync for InnerVfs {}

fn register_once() -> Result<(), String> {
    // SAFETY: sqlite3_vfs_find is thread-safe and initializes SQLite if needed.
    let inner = unsafe { ffi::sqlite3_vfs_find(INNER_VFS.as_ptr()) };
    if inner.is_null() {
        return Err("this SQLite build has no unix-excl VFS".into());
    }
    // SAFETY: a registered VFS lives for the process; we only read it.
    let inner_ref = unsafe { &*inner };
    let Ok(inner_size) = usize::try_from(inner_ref.szOsFile) else {
        return Err("the unix-excl VFS reports a negative file size".into());
    };
    let _ = INNER.set(InnerVfs(inner));
    let size = inner_offset() + inner_size;
    let vfs = Box::new(ffi::sqlite3_vfs {
        szOsFile: c_int::try_from(size).map_err(|_| "file object too large".to_string())?,
        pNext: std::ptr::null_mut(),
        zName: VFS_NAME.as_ptr(),
        xOpen: Some(open),
        // Everything else is the inner VFS's own, pAppData included (its
        // methods look there for their locking style).
        ..*inner_ref
    });
    // SAFETY: the VFS object is leaked, so it outlives every connection.
    let rc = unsafe { ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0) };
    if rc == ffi::SQLITE_OK { Ok(()) } else { Err(format!("sqlite3_vfs_register failed with code {rc}")) }
}

/// Where the inner VFS's file object starts inside ours.
const fn inner_offset() -> usize {
    let align = std::mem::align_of::<u64>();
    std::mem::size_of::<GatherFile>().div_ceil(align) * align
}

/// A WAL file: our methods in front, the inner VFS's file object behind.
#[repr(C)]
struct GatherFile {
    /// What SQLite sees; must stay the first field.
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    gathered: Vec<u8>,
    /// File offset of `gathered[0]`.
    gathered_at: i64,
    /// End of the last write that reached the file (`None` before the first):
    /// a write starting there may begin a new gathering.
    written_to: Option<i64>,
    /// The last write was the header of a commit frame: the next completes it.
    commit_header_last: bool,
    /// A WAL's appends are gathered; a database file's writes go straight
    /// through (it is wrapped only for test faults).
    gathers: bool,
    /// The WAL's path, which test faults are planned for (`crate::faults`).
    #[cfg(feature = "fault-injection")]
    path: std::path::PathBuf,
}

static GATHER_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(close),
    xRead: Some(read),
    xWrite: Some(write),
    xTruncate: Some(truncate),
    xSync: Some(sync),
    xFileSize: Some(file_size),
    xLock: Some(lock),
    xUnlock: Some(unlock),
    xCheckReservedLock: Some(check_reserved_lock),
    xFileControl: Some(file_control),
    xSectorSize: Some(sector_size),
    xDeviceCharacteristics: Some(device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

impl GatherFile {
    fn inner_methods(&self) -> &ffi::sqlite3_io_methods {
        // SAFETY: `inner` was opened successfully in `open` and is closed only
        // in `close`, after which SQLite makes no more calls on this file.
        unsafe { &*(*self.inner).pMethods }
    }

    fn write_through(&mut self, data: *const c_void, len: c_int, offset: i64) -> c_int {
        #[cfg(test)]
        WAL_WRITES.with(|writes| writes.set(writes.get() + 1));
        let Some(x_write) = self.inner_methods().xWrite else { return ffi::SQLITE_IOERR_WRITE };
        let inner = self.inner;
        // SAFETY: `data` holds `len` bytes (from SQLite or our buffer).
        let write = || unsafe { x_write(inner, data, len, offset) };
        #[cfg(feature = "fault-injection")]
        let rc = {
            // SAFETY: as above; `len` is not negative (our callers checked).
            let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::try_from(len).unwrap_or(0)) };
            crate::faults::write(&self.path, offset, bytes, write)
        };
        #[cfg(not(feature = "fault-injection"))]
        let rc = write();
        if rc == ffi::SQLITE_OK {
            self.written_to = Some(offset + i64::from(len));
        }
        rc
    }

    /// Writes what was gathered. On failure it is dropped: SQLite fails the
    /// transaction and writes its frames again at the same offsets.
    fn flush(&mut self) -> c_int {
        if self.gathered.is_empty() {
            return ffi::SQLITE_OK;
        }
        let gathered = std::mem::take(&mut self.gathered);
        let mut rc = ffi::SQLITE_OK;
        let mut offset = self.gathered_at;
        // The last write may have taken the buffer past MAX_GATHERED.
        for piece in gathered.chunks(MAX_GATHERED) {
            // A piece is at most MAX_GATHERED bytes: it fits.
            let len = piece.len() as c_int;
            rc = self.write_through(piece.as_ptr().cast(), len, offset);
            if rc != ffi::SQLITE_OK {
                break;
            }
            offset += i64::from(len);
        }
        self.gathered = gathered;
        self.gathered.clear();
        rc
    }

    fn write(&mut self, data: &[u8], offset: i64) -> c_int {
        if !self.gathers {
            let Ok(len) = c_int::try_from(data.len()) else { return ffi::SQLITE_IOERR_WRITE };
            return self.write_through(data.as_ptr().cast(), len, offset);
        }
        let completes_commit = self.commit_header_last;
        self.commit_header_last = data.len() == FRAME_HEADER && data[4..8] != [0; 4];
        let continues = if self.gathered.is_empty() {
            self.written_to == Some(offset)
        } else {
            offset == self.gathered_at + self.gathered.len() as i64
        };
        if !continues {
            let rc = self.flush();
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let Ok(len) = c_int::try_from(data.len()) else { return ffi::SQLITE_IOERR_WRITE };
            return self.write_through(data.as_ptr().cast(), len, offset);
        }
        if self.gathered.is_empty() {
            self.gathered_at = offset;
        }
        self.gathered.extend_from_slice(data);
        if completes_commit || self.gathered.len() >= MAX_GATHERED {
            return self.flush();
        }
        ffi::SQLITE_OK
    }
}

/// # Safety
/// `file` is a file object SQLite allocated for this VFS (`szOsFile` bytes).
unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(InnerVfs(inner_vfs)) = INNER.get() else { return ffi::SQLITE_ERROR };
    let inner_vfs = *inner_vfs;
    // SAFETY: the inner VFS is registered for the process's lifetime.
    let Some(inner_open) = (unsafe { (*inner_vfs).xOpen }) else { return ffi::SQLITE_ERROR };
    let is_wal = flags & ffi::SQLITE_OPEN_WAL != 0;
    #[cfg(feature = "fault-injection")]
    let wrapped = is_wal || flags & ffi::SQLITE_OPEN_MAIN_DB != 0;
    #[cfg(not(feature = "fault-injection"))]
    let wrapped = is_wal;
    if !wrapped {
        // Not a WAL: the inner file object takes our whole allocation's
        // front and SQLite calls its methods directly.
        // SAFETY: our allocation is at least the inner VFS's szOsFile.
        return unsafe { inner_open(inner_vfs, name, file, flags, out_flags) };
    }
    // SAFETY: the allocation is `inner_offset() + inner szOsFile` bytes.
    let inner = unsafe { file.cast::<u8>().add(inner_offset()).cast::<ffi::sqlite3_file>() };
    // SAFETY: as above; `inner` points at zeroed memory of the inner's size.
    let rc = unsafe { inner_open(inner_vfs, name, inner, flags, out_flags) };
    // SAFETY: SQLite zeroes file objects before xOpen.
    let inner_opened = unsafe { !(*inner).pMethods.is_null() };
    if rc != ffi::SQLITE_OK {
        if inner_opened {
            // SAFETY: SQLite's rule: a file whose pMethods is set is closed.
            unsafe {
                if let Some(close) = (*(*inner).pMethods).xClose {
                    close(inner);
                }
            }
        }
        // SAFETY: with pMethods null SQLite will not call xClose on us.
        unsafe { (*file).pMethods = std::ptr::null() };
        return rc;
    }
    #[cfg(feature = "fault-injection")]
    let methods: &'static ffi::sqlite3_io_methods = if is_wal { &GATHER_METHODS } else { &DATABASE_METHODS };
    #[cfg(not(feature = "fault-injection"))]
    let methods: &'static ffi::sqlite3_io_methods = &GATHER_METHODS;
    let gather = GatherFile {
        base: ffi::sqlite3_file { pMethods: methods },
        inner,
        gathered: Vec::new(),
        gathered_at: 0,
        written_to: None,
        commit_header_last: false,
        gathers: is_wal,
        #[cfg(feature = "fault-injection")]
        path: if name.is_null() {
            std::path::PathBuf::new()
        } else {
            // SAFETY: SQLite passes the WAL's name as a NUL-terminated string.
            std::path::PathBuf::from(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
        },
    };
    // SAFETY: the allocation's front is ours and uninitialised as a GatherFile.
    unsafe { file.cast::<GatherFile>().write(gather) };
    ffi::SQLITE_OK
}

/// # Safety
/// `file` was opened by [`open`] and wrapped (its methods are [`GATHER_METHODS`],
/// or `DATABASE_METHODS` in fault-injection builds).
unsafe fn gather_file<'a>(file: *mut ffi::sqlite3_file) -> &'a mut GatherFile {
    // SAFETY: per the contract; SQLite calls a file's methods one at a time.
    unsafe { &mut *file.cast::<GatherFile>() }
}

unsafe extern "C" fn close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: called by SQLite on a file opened by `open`.
    let f = unsafe { gather_file(file) };
    let flushed = f.flush();
    let closed = match f.inner_methods().xClose {
        // SAFETY: the inner file is open; this is its last call.
        Some(close) => unsafe { close(f.inner) },
        None => ffi::SQLITE_OK,
    };
    // SAFETY: written in `open`; SQLite frees the memory after xClose.
    unsafe { std::ptr::drop_in_place(file.cast::<GatherFile>()) };
    if flushed != ffi::SQLITE_OK { flushed } else { closed }
}

unsafe extern "C" fn write(file: *mut ffi::sqlite3_file, data: *const c_void, len: c_int, offset: i64) -> c_int {
    // SAFETY: called by SQLite on a file opened by `open`.
    let f = unsafe { gather_file(file) };
    let Ok(len) = usize::try_from(len) else { return ffi::SQLITE_IOERR_WRITE };
    // SAFETY: SQLite passes `len` readable bytes.
    let data = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    f.write(data, offset)
}

/// A method that calls the inner file's: `flush` for the operations that
/// must see every byte SQLite has written, `pass` for those that do not
/// look at the bytes (locks, sizes of sectors, device traits).
macro_rules! forward {
    (flush $name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        forward!(@ $name, $method, ($($arg: $ty),*), $missing, true);
    };
    (pass $name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr) => {
        forward!(@ $name, $method, ($($arg: $ty),*), $missing, false);
    };
    (@ $name:ident, $method:ident, ($($arg:ident: $ty:ty),*), $missing:expr, $flush:expr) => {
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: called by SQLite on a file opened by `open`.
            let f = unsafe { gather_file(file) };
            if $flush {
                let rc = f.flush();
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
            }
            match f.inner_methods().$method {
                // SAFETY: same arguments, on the inner file.
                Some(method) => unsafe { method(f.inner, $($arg),*) },
                None => $missing,
            }
        }
    };
}

forward!(flush read_inner, xRead, (buf: *mut c_void, len: c_int, offset: i64), ffi::SQLITE_IOERR_READ);

/// `xRead`, where a test's planned fault may fail it (`crate::faults`).
unsafe extern "C" fn read(file: *mut ffi::sqlite3_file, buf: *mut c_void, len: c_int, offset: i64) -> c_int {
    #[cfg(feature = "fault-injection")]
    {
        // SAFETY: called by SQLite on a file opened by `open`.
        let f = unsafe { gather_file(file) };
        if let Some(rc) = crate::faults::check(&f.path, crate::faults::Op::Read) {
            return rc;
        }
    }
    // SAFETY: the same call, passed on.
    unsafe { read_inner(file, buf, len, offset) }
}
forward!(flush truncate, xTruncate, (size: i64), ffi::SQLITE_IOERR_TRUNCATE);
forward!(flush sync_inner, xSync, (flags: c_int), ffi::SQLITE_IOERR_FSYNC);

/// `xSync`, where a test's planned fault may fail it (`crate::faults`).
unsafe extern "C" fn sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    #[cfg(feature = "fault-injection")]
    {
        // SAFETY: called by SQLite on a file opened by `open`.
        let f = unsafe { gather_file(file) };
        // Flushed before the faults' lock is taken: a tracked write takes it too.
        let rc = f.flush();
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let path = f.path.clone();
        // SAFETY: the same call, passed on.
        crate::faults::sync(&path, || unsafe { sync_inner(file, flags) })
    }
    // SAFETY: the same call, passed on.
    #[cfg(not(feature = "fault-injection"))]
    unsafe {
        sync_inner(file, flags)
    }
}
forward!(flush file_size, xFileSize, (size: *mut i64), ffi::SQLITE_IOERR_FSTAT);
forward!(flush file_control, xFileControl, (op: c_int, arg: *mut c_void), ffi::SQLITE_NOTFOUND);
forward!(pass lock, xLock, (level: c_int), ffi::SQLITE_OK);
forward!(pass unlock, xUnlock, (level: c_int), ffi::SQLITE_OK);
forward!(pass check_reserved_lock, xCheckReservedLock, (out: *mut c_int), ffi::SQLITE_OK);
forward!(pass sector_size, xSectorSize, (), 4096);
forward!(pass device_characteristics, xDeviceCharacteristics, (), 0);

/// A database file wrapped for test faults: the WAL's methods (writes go
/// straight through, see [`GatherFile::gathers`]) plus the shared-memory and
/// memory-map ones that a database in WAL mode needs, passed on.
#[cfg(feature = "fault-injection")]
static DATABASE_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xShmMap: Some(shm_map),
    xShmLock: Some(shm_lock),
    xShmBarrier: Some(shm_barrier),
    xShmUnmap: Some(shm_unmap),
    xFetch: Some(fetch),
    xUnfetch: Some(unfetch),
    ..GATHER_METHODS
};
#[cfg(feature = "fault-injection")]
forward!(pass shm_map, xShmMap, (page: c_int, page_size: c_int, extend: c_int, mapped: *mut *mut c_void), ffi::SQLITE_IOERR_SHMMAP);
#[cfg(feature = "fault-injection")]
forward!(pass shm_lock, xShmLock, (offset: c_int, n: c_int, flags: c_int), ffi::SQLITE_IOERR_SHMLOCK);
#[cfg(feature = "fault-injection")]
forward!(pass shm_unmap, xShmUnmap, (delete: c_int), ffi::SQLITE_OK);
#[cfg(feature = "fault-injection")]
forward!(pass fetch, xFetch, (offset: i64, amount: c_int, mapped: *mut *mut c_void), ffi::SQLITE_IOERR);
#[cfg(feature = "fault-injection")]
forward!(pass unfetch, xUnfetch, (offset: i64, mapped: *mut c_void), ffi::SQLITE_OK);

#[cfg(feature = "fault-injection")]
unsafe extern "C" fn shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: called by SQLite on a file opened by `open`.
    let f = unsafe { gather_file(file) };
    if let Some(barrier) = f.inner_methods().xShmBarrier {
        // SAFETY: the same call, on the inner file.
        unsafe { barrier(f.inner) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn wal_writes() -> u64 {
        WAL_WRITES.with(std::cell::Cell::get)
    }

    fn open(path: &std::path::Path) -> Connection {
        register().expect("register the VFS");
        let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), VFS_NAME).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("WAL");
        conn.pragma_update(None, "synchronous", "NORMAL").expect("synchronous");
        conn.pragma_update(None, "wal_autocheckpoint", 0).expect("no autocheckpoint");
        conn.execute_batch("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)").expect("table");
        conn
    }

    /// What `kill -9` leaves: the files as they are on disk right now,
    /// copied aside and opened by a fresh connection (plain VFS).
    fn reopen_copy(dir: &std::path::Path, name: &str) -> Connection {
        let copy = dir.join(format!("copy-{name}"));
        std::fs::copy(dir.join(name), &copy).expect("copy db");
        let wal = dir.join(format!("{name}-wal"));
        std::fs::copy(&wal, dir.join(format!("copy-{name}-wal"))).expect("copy wal");
        Connection::open(&copy).expect("open copy")
    }

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).expect("count")
    }

    #[test]
    fn a_commit_of_many_pages_reaches_the_file_in_one_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("a.db"));
        // Warm up: the WAL exists and its header is written.
        conn.execute("INSERT INTO t(v) VALUES (zeroblob(100))", []).expect("insert");
        for round in 0..20 {
            let before = wal_writes();
            let tx = conn.unchecked_transaction().expect("begin");
            // Rows of a page each: the commit writes several frames.
            for _ in 0..6 {
                tx.execute("INSERT INTO t(v) VALUES (zeroblob(3000))", []).expect("insert");
            }
            tx.commit().expect("commit");
            let writes = wal_writes() - before;
            assert!(writes >= 1, "round {round}: the commit never reached the WAL");
            // Without gathering: two writes per frame, >= 14 here.
            assert!(writes <= 2, "round {round}: {writes} writes for one commit");
        }
    }

    #[test]
    fn a_commit_larger_than_the_buffer_is_written_in_pieces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("d.db"));
        conn.execute("INSERT INTO t(v) VALUES (zeroblob(100))", []).expect("insert");
        let before = wal_writes();
        let tx = conn.unchecked_transaction().expect("begin");
        // ~2 MiB: hundreds of frames, many times MAX_GATHERED.
        for _ in 0..700 {
            tx.execute("INSERT INTO t(v) VALUES (randomblob(3000))", []).expect("insert");
        }
        tx.commit().expect("commit");
        let writes = wal_writes() - before;
        let frames_bytes = 700 * (FRAME_HEADER + 4096) as u64;
        assert!(writes >= frames_bytes / MAX_GATHERED as u64, "{writes} writes");
        assert!(writes <= frames_bytes / MAX_GATHERED as u64 * 2, "{writes} writes");
        let copy = reopen_copy(dir.path(), "d.db");
        assert_eq!(count(&copy), 701);
        let check: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("check");
        assert_eq!(check, "ok");
    }

    #[test]
    fn what_a_commit_returned_is_in_the_file_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("b.db"));
        let reader =
            Connection::open_with_flags_and_vfs(dir.path().join("b.db"), OpenFlags::default(), VFS_NAME).expect("reader");
        for n in 1..=30i64 {
            let tx = conn.unchecked_transaction().expect("begin");
            for _ in 0..n % 4 + 1 {
                tx.execute("INSERT INTO t(v) VALUES (randomblob(2000))", []).expect("insert");
            }
            tx.commit().expect("commit");
            let expected = count(&conn);
            // Another connection reads the WAL through its own descriptor.
            assert_eq!(count(&reader), expected);
            // The files alone, as a crash would leave them.
            let copy = reopen_copy(dir.path(), "b.db");
            assert_eq!(count(&copy), expected, "commit {n} not in the files");
            let check: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("check");
            assert_eq!(check, "ok");
        }
    }

    #[test]
    fn a_transaction_larger_than_the_cache_survives_in_the_files() {
        // A tiny page cache spills pages mid-transaction and rewrites frames
        // it wrote earlier in the same transaction (SQLite then rewrites the
        // frames' checksums in place): those writes must reach the file too.
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("c.db"));
        conn.pragma_update(None, "cache_size", 10).expect("small cache");
        conn.execute_batch("CREATE INDEX IF NOT EXISTS t_v ON t(v)").expect("index");
        for round in 0..3 {
            let tx = conn.unchecked_transaction().expect("begin");
            for _ in 0..400 {
                tx.execute("INSERT INTO t(v) VALUES (randomblob(600))", []).expect("insert");
            }
            tx.execute("UPDATE t SET v = randomblob(500) WHERE id % 7 = ?1", [round]).expect("update");
            tx.commit().expect("commit");
            let copy = reopen_copy(dir.path(), "c.db");
            assert_eq!(count(&copy), count(&conn), "round {round}");
            let check: String = copy.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("check");
            assert_eq!(check, "ok", "round {round}");
        }
    }
}
