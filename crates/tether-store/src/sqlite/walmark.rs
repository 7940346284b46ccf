//! The WAL's high-water mark: `<db>-walmark`, how far the WAL went.
//!
//! A WAL cut exactly at a commit frame is a valid, shorter WAL: SQLite
//! opens it and the commits cut are gone in silence. SQLite records how far
//! the WAL goes only in its wal-index (`mxFrame`), which under `unix-excl`
//! lives in heap memory (no `-shm` file). So after each commit the writer
//! writes it down here: the WAL header's two salts (which name the WAL's
//! current generation: they change each time the WAL starts over) and the
//! frames committed, in one 32-byte record written at offset 0 with one
//! `pwrite`, never synced. [`super::check`] compares it with the WAL before
//! SQLite opens the file.
//!
//! Why it never claims more than the disk holds, under `--durability
//! strict`: it is written from SQLite's WAL hook, which runs after the
//! commit's fsync of the WAL (`sqlite3WalFrames` syncs before it returns);
//! a marker on disk is the one of some commit whose frames were synced, or
//! an older one (a lost write of the marker only makes it lag). Within one
//! generation the frame count only grows, and a new generation has new
//! salts, so an older marker is either smaller or of another generation.
//! A record torn by a power cut fails its checksum and is ignored. Under
//! `--durability normal` nothing is synced, and a marker ahead of the WAL
//! after a power cut is what that mode allows to be lost (a warning).
//!
//! The salts are read from the WAL header, but not on every commit: only
//! when the WAL may have started over since they were read. SQLite starts
//! it over in a write transaction that begins when every frame has been
//! copied back into the database, which only a checkpoint does; every
//! checkpoint counts itself in `checkpoints` before and after it runs (odd
//! while it runs, see [`super::checkpoint`]). A checkpoint that lets commit
//! N start the WAL over takes its snapshot after commit N-1 and finishes
//! before commit N, so the count the hooks of commits N-2, N-1 and N see
//! cannot be one even number three times: the salts are read again unless
//! it was. A wrong guess could only leave stale salts, which no WAL has:
//! the marker would be ignored, never taken for damage.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The record's length.
pub(super) const LEN: usize = 32;
/// Bytes 0..7; byte 7 is the version.
const MAGIC: &[u8; 7] = b"tethwm\0";
const VERSION: u8 = 1;
/// The WAL header's magic number (either byte order of its checksums).
const WAL_MAGIC: u32 = 0x377f_0682;

/// What a valid marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mark {
    /// Bytes 16..24 of the WAL header it was written for.
    pub salts: [u8; 8],
    /// Frames the WAL held after the last commit (SQLite's `mxFrame`).
    pub frames: u64,
}

/// The marker of the database at `db` (`<db>-walmark`).
pub(crate) fn path(db: &Path) -> PathBuf {
    let mut mark = db.as_os_str().to_owned();
    mark.push("-walmark");
    PathBuf::from(mark)
}

/// FNV-1a, 64 bits: enough to tell a torn or foreign record.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Magic and version, salts, frames (little-endian), checksum of the 24
/// bytes before it.
pub(super) fn encode(mark: Mark) -> [u8; LEN] {
    let mut record = [0u8; LEN];
    record[..7].copy_from_slice(MAGIC);
    record[7] = VERSION;
    record[8..16].copy_from_slice(&mark.salts);
    record[16..24].copy_from_slice(&mark.frames.to_le_bytes());
    let sum = checksum(&record[..24]);
    record[24..].copy_from_slice(&sum.to_le_bytes());
    record
}

/// The marker in `bytes`, if they hold a whole, valid one.
pub(super) fn decode(bytes: &[u8]) -> Option<Mark> {
    let record: &[u8; LEN] = bytes.get(..LEN)?.try_into().ok()?;
    if &record[..7] != MAGIC || record[7] != VERSION {
        return None;
    }
    let sum = u64::from_le_bytes(record[24..].try_into().ok()?);
    if sum != checksum(&record[..24]) {
        return None;
    }
    Some(Mark { salts: record[8..16].try_into().ok()?, frames: u64::from_le_bytes(record[16..24].try_into().ok()?) })
}

/// The marker of the database at `db`: `None` if it is absent, short,
/// torn or unreadable (unknown, which is not damage).
pub(super) fn read(db: &Path) -> Option<Mark> {
    let file = File::open(path(db)).ok()?;
    let mut record = [0u8; LEN];
    file.read_exact_at(&mut record, 0).ok()?;
    decode(&record)
}

/// The salts of the WAL whose header starts `header`, if it is one.
pub(super) fn wal_salts(header: &[u8]) -> Option<[u8; 8]> {
    let magic = u32::from_be_bytes(header.get(..4)?.try_into().ok()?);
    if magic & !1 != WAL_MAGIC {
        return None;
    }
    header.get(16..24)?.try_into().ok()
}

/// Writes the marker after each commit; lives in the writer connection's
/// WAL hook (one thread at a time).
pub(super) struct MarkWriter {
    mark: File,
    wal_path: PathBuf,
    /// Opened at the first commit (the WAL exists then).
    wal: Option<File>,
    salts: Option<[u8; 8]>,
    /// The checkpoint count at the last hook, and how many hooks before
    /// that saw the same even count.
    seen: u64,
    same: u8,
}

impl MarkWriter {
    /// Opens (creating it 0600) the marker of the database at `db`. An
    /// earlier run's marker stays until the first commit replaces it: it
    /// may still describe the WAL.
    pub(super) fn open(db: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let mark = std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(path(db))?;
        Ok(Self { mark, wal_path: super::wal_path(db), wal: None, salts: None, seen: u64::MAX, same: 0 })
    }

    /// After a commit: the WAL holds `frames` frames; `checkpoints` is the
    /// checkpoint count now (see the module's documentation). One `pwrite`,
    /// plus a read of the WAL header when it may have started over.
    pub(super) fn committed(&mut self, frames: u64, checkpoints: u64) {
        if checkpoints == self.seen && checkpoints.is_multiple_of(2) {
            self.same = self.same.saturating_add(1);
        } else {
            self.seen = checkpoints;
            self.same = 0;
        }
        if self.same < 2 || self.salts.is_none() {
            self.salts = self.read_salts();
        }
        let Some(salts) = self.salts else { return };
        // A failed write leaves an older marker (it lags) or none: unknown.
        let _ = self.mark.write_all_at(&encode(Mark { salts, frames }), 0);
    }

    fn read_salts(&mut self) -> Option<[u8; 8]> {
        if self.wal.is_none() {
            self.wal = File::open(&self.wal_path).ok();
        }
        let mut header = [0u8; 24];
        match self.wal.as_ref()?.read_exact_at(&mut header, 0) {
            Ok(()) => wal_salts(&header),
            Err(_) => {
                self.wal = None; // opened again next time
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_round_trips_and_any_damage_or_short_read_is_ignored() {
        let mark = Mark { salts: [1, 2, 3, 4, 5, 6, 7, 8], frames: 4242 };
        let record = encode(mark);
        assert_eq!(decode(&record), Some(mark));
        for i in 0..LEN {
            let mut torn = record;
            torn[i] ^= 0x40;
            assert_eq!(decode(&torn), None, "byte {i} flipped");
        }
        for len in 0..LEN {
            assert_eq!(decode(&record[..len]), None, "{len} bytes");
        }
        assert_eq!(decode(&[0u8; LEN]), None);
        assert_eq!(wal_salts(&[0u8; 3]), None);
        assert_eq!(wal_salts(&[0u8; 24]), None);
    }

    /// The salts are read again while checkpoints may have let the WAL
    /// start over, and kept once three commits in a row saw none.
    #[test]
    fn the_salts_are_read_again_around_checkpoints_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("m.db");
        let header = |salt: u8| {
            let mut h = vec![0u8; 32];
            h[..4].copy_from_slice(&WAL_MAGIC.to_be_bytes());
            h[16..24].copy_from_slice(&[salt; 8]);
            std::fs::write(super::super::wal_path(&db), h).expect("wal");
        };
        let salts_now = || read(&db).expect("a marker").salts[0];
        header(1);
        let mut writer = MarkWriter::open(&db).expect("open");
        for _ in 0..3 {
            writer.committed(5, 4);
        }
        header(2); // started over with no checkpoint counted: not seen
        writer.committed(6, 4);
        assert_eq!(salts_now(), 1);
        writer.committed(7, 5); // a checkpoint runs
        assert_eq!(salts_now(), 2);
        header(3);
        writer.committed(8, 6); // it ended
        assert_eq!(salts_now(), 3);
        header(4);
        writer.committed(9, 6); // the commit after the one that saw it end
        assert_eq!(salts_now(), 4);
        header(5);
        writer.committed(10, 6);
        assert_eq!(salts_now(), 4, "three commits saw the same even count");
        assert_eq!(read(&db).expect("a marker").frames, 10);
    }
}
