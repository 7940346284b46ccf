//! What the files must look like before SQLite opens them.
//!
//! SQLite repairs nothing and complains late: a WAL damaged in its middle is
//! read up to the damage and the rest is dropped in silence (its recovery
//! cannot tell a torn last write from a damaged page further back), and a
//! database file cut short shows up as "malformed" on some later query.
//! Under `--durability strict` every commit a client saw was synced, so a
//! torn write can only be the last, unacknowledged one; damage followed by
//! further commits is damage to acknowledged data, and opening the file
//! would roll back past what clients saw. This check reads the files as
//! SQLite's recovery would (the WAL's frames and their running checksums,
//! the database's header and length) and refuses such a file with what to
//! do, instead of serving from a silently shorter history. Under
//! `--durability normal` a power loss may leave exactly that (commits are
//! not synced one by one), so there it is a warning that names the loss.
//!
//! It costs one sequential read of the WAL (at most a few tens of MB) and
//! of the database's first 100 bytes and the WAL marker's 32, once per open.
//!
//! A WAL cut exactly at a commit frame scans clean: it is a valid, shorter
//! WAL. SQLite's own record of how far it went (the wal-index's `mxFrame`,
//! the `-shm` file of other setups) lives in heap memory under `unix-excl`,
//! the VFS every connection uses (`sqlite::open_connection`), so the writer
//! keeps one on disk: the WAL marker (`<db>-walmark`, [`super::walmark`]),
//! the WAL's salts and its frames after the last commit, written after the
//! commit's fsync under strict. A valid marker with the WAL's salts that
//! names more frames than the WAL holds is the same loss as damage, refused
//! or warned about the same way. A marker that is absent, torn or of
//! another WAL generation (a checkpoint started the WAL over, or `PRAGMA
//! wal_checkpoint(TRUNCATE)` emptied it) says nothing: unknown is not
//! damage. Still not detected: a WAL removed altogether (or cut inside its
//! header), which leaves no salts to compare, and looks like the WAL a clean
//! stop deletes.

use std::io::Read;
use std::path::Path;

use super::walmark;
use crate::{StoreError, StoreResult};

const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;
const DB_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What the WAL holds, as SQLite's recovery reads it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct WalScan {
    /// Frames SQLite will use: up to the last commit frame before the first
    /// invalid frame.
    pub valid_frames: u64,
    pub valid_commits: u64,
    /// The database's size in pages after the last valid commit.
    pub db_pages: Option<u32>,
    /// Pages the valid frames hold (the database file may lack them).
    pub pages: std::collections::BTreeSet<u32>,
    /// The first frame SQLite stops at, if the WAL goes on after it.
    pub damaged_at: Option<u64>,
    /// Commit frames of the same WAL generation after the damage: commits
    /// SQLite would drop.
    pub commits_after_damage: u64,
}

fn word(bytes: &[u8], big_endian: bool) -> u32 {
    let b = [bytes[0], bytes[1], bytes[2], bytes[3]];
    if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) }
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// SQLite's WAL checksum (`walChecksumBytes`) over `data`, continuing `s`.
fn checksum(data: &[u8], big_endian: bool, s: (u32, u32)) -> (u32, u32) {
    let (mut s1, mut s2) = s;
    for pair in data.chunks_exact(8) {
        s1 = s1.wrapping_add(word(&pair[..4], big_endian)).wrapping_add(s2);
        s2 = s2.wrapping_add(word(&pair[4..], big_endian)).wrapping_add(s1);
    }
    (s1, s2)
}

/// Reads a WAL's bytes as SQLite's recovery does. An empty or headerless
/// WAL scans as empty (SQLite ignores it).
pub(super) fn scan_wal(wal: &[u8]) -> WalScan {
    let mut scan = WalScan::default();
    if wal.len() < WAL_HEADER {
        return scan;
    }
    let magic = be32(&wal[0..4]);
    if magic & !1 != 0x377f_0682 {
        return scan;
    }
    let big_endian = magic & 1 == 1;
    let page_size = be32(&wal[8..12]) as usize;
    if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
        return scan;
    }
    let salts = &wal[16..24];
    let header_ok = checksum(&wal[..24], big_endian, (0, 0)) == (be32(&wal[24..28]), be32(&wal[28..32]));
    let frame_size = FRAME_HEADER + page_size;
    let frames = (wal.len() - WAL_HEADER) / frame_size;
    let frame = |i: usize| &wal[WAL_HEADER + i * frame_size..WAL_HEADER + (i + 1) * frame_size];
    let mut running = (be32(&wal[24..28]), be32(&wal[28..32]));
    let mut pending_pages = Vec::new();
    let mut first_invalid = if header_ok { None } else { Some(0) };
    if header_ok {
        for i in 0..frames {
            let f = frame(i);
            let s = checksum(&f[FRAME_HEADER..], big_endian, checksum(&f[..8], big_endian, running));
            if &f[8..16] != salts || s != (be32(&f[16..20]), be32(&f[20..24])) {
                first_invalid = Some(i);
                break;
            }
            running = s;
            pending_pages.push(be32(&f[0..4]));
            let commit = be32(&f[4..8]);
            if commit != 0 {
                scan.valid_frames = i as u64 + 1;
                scan.valid_commits += 1;
                scan.db_pages = Some(commit);
                scan.pages.extend(pending_pages.drain(..));
            }
        }
    }
    if let Some(at) = first_invalid {
        // Frames of the same generation (its salts) that commit, after the
        // damage. The damaged frame itself counts if it claims to commit.
        let later = (at..frames).filter(|&i| &frame(i)[8..16] == salts && be32(&frame(i)[4..8]) != 0).count();
        if later > 0 {
            scan.damaged_at = Some(at as u64);
            scan.commits_after_damage = later as u64;
        }
    }
    scan
}

/// The advice to restore from a backup: the marker goes too, or it would
/// measure the restored WAL against the one it replaced.
fn restore(db: &Path) -> String {
    format!(
        "Restore {} and its -wal file from a backup and delete {} (it describes the WAL replaced)",
        db.display(),
        walmark::path(db).display()
    )
}

/// Checks the database at `db` and its WAL before SQLite opens them; see
/// the module's documentation. `strict`: commits were synced one by one.
pub(super) fn before_open(db: &Path, strict: bool) -> StoreResult<()> {
    let wal_path = super::wal_path(db);
    let wal = match std::fs::read(&wal_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(StoreError::Config(format!("cannot read {}: {e}", wal_path.display()))),
    };
    let scan = scan_wal(&wal);
    if let Some(at) = scan.damaged_at {
        let what = format!(
            "{} is damaged at frame {at}: SQLite would drop the {} commit(s) after it",
            wal_path.display(),
            scan.commits_after_damage
        );
        // One commit after the damage may be the torn last one, which no
        // client saw (it was not synced yet); more cannot be, under strict.
        if strict && scan.commits_after_damage > 1 {
            return Err(StoreError::Corrupt(format!(
                "{what}, which clients saw acknowledged (--durability strict). {}; or, to accept the loss, stop \
                 tether and run `sqlite3 {} 'PRAGMA wal_checkpoint(TRUNCATE)'`, which keeps what comes before the \
                 damage, then start tether again",
                restore(db),
                db.display()
            )));
        }
        tracing::warn!(
            "{what} (a power loss under --durability normal can do this to the last moments before it); \
             if {} did not lose power, restore it from a backup",
            db.display()
        );
    }
    // A WAL cut exactly at a commit frame scans clean: only the marker
    // knows how far it went (when it names this WAL's generation).
    let marked = walmark::read(db).filter(|mark| walmark::wal_salts(&wal) == Some(mark.salts));
    if let Some(mark) = marked.filter(|mark| mark.frames > scan.valid_frames) {
        let what = format!(
            "{} ends at frame {} but commits up to frame {} were written to it (its marker {} says so): SQLite would \
             open it without them",
            wal_path.display(),
            scan.valid_frames,
            mark.frames,
            walmark::path(db).display()
        );
        if strict {
            return Err(StoreError::Corrupt(format!(
                "{what}, and clients saw them acknowledged (--durability strict). {}; or, to accept the loss, stop \
                 tether and run `sqlite3 {} 'PRAGMA wal_checkpoint(TRUNCATE)'`, which keeps what the WAL still holds, \
                 then start tether again",
                restore(db),
                db.display()
            )));
        }
        if scan.damaged_at.is_none() {
            tracing::warn!(
                "{what} (a power loss under --durability normal can do this to the last moments before it); \
                 if {} did not lose power, restore it from a backup",
                db.display()
            );
        }
    }

    let mut file = match std::fs::File::open(db) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::Config(format!("cannot open {}: {e}", db.display()))),
    };
    let len = file.metadata().map(|m| m.len()).map_err(|e| StoreError::Config(format!("cannot read {}: {e}", db.display())))?;
    if len == 0 {
        return Ok(()); // new, or everything is still in the WAL
    }
    let mut header = [0u8; 100];
    if len < 100 || file.read_exact(&mut header).is_err() || &header[..16] != DB_MAGIC {
        return Err(StoreError::Corrupt(format!(
            "{} is not a SQLite database, or its first page is damaged; if it is tether's store, restore it from a \
             backup (tether cannot repair it); otherwise choose another --store path",
            db.display()
        )));
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536u64,
        n => u64::from(n),
    };
    // The database's length in pages: the last valid commit's, else the
    // header's (valid only while the change counter matches).
    let header_pages = (header[24..28] == header[92..96]).then(|| be32(&header[28..32]));
    let Some(pages) = scan.db_pages.or(header_pages) else { return Ok(()) };
    if page_size == 0 {
        return Ok(());
    }
    let whole = len / page_size;
    let missing: Vec<u32> =
        (whole.saturating_add(1)..=u64::from(pages)).map(|p| p as u32).filter(|p| !scan.pages.contains(p)).take(1).collect();
    if len % page_size != 0 || !missing.is_empty() {
        return Err(StoreError::Corrupt(format!(
            "{} is truncated: {len} bytes, but it has {pages} pages of {page_size} bytes and its WAL does not hold the \
             rest (a copy taken while tether wrote to it? a full disk?). Restore it from a backup; `sqlite3 {} .recover` \
             saves what is left into a new file",
            db.display(),
            db.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAL as SQLite writes it, from a real file.
    fn wal_of_commits(dir: &Path, commits: usize) -> Vec<u8> {
        let path = dir.join("w.db");
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.pragma_update(None, "wal_autocheckpoint", 0).expect("no checkpoint");
        conn.execute_batch("CREATE TABLE t(v BLOB)").expect("table");
        for _ in 0..commits {
            conn.execute("INSERT INTO t VALUES (randomblob(3000))", []).expect("insert");
        }
        let wal = std::fs::read(super::super::wal_path(&path)).expect("read wal");
        drop(conn);
        wal
    }

    #[test]
    fn a_whole_wal_scans_clean_and_a_torn_tail_is_not_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = wal_of_commits(dir.path(), 5);
        let scan = scan_wal(&wal);
        assert_eq!(scan.valid_commits, 6, "{scan:?}"); // the table, then five rows
        assert_eq!(scan.damaged_at, None);
        // Cut inside the last frame: SQLite drops the last commit, legitimately.
        let torn = scan_wal(&wal[..wal.len() - 100]);
        assert_eq!(torn.valid_commits, 5);
        assert_eq!(torn.damaged_at, None, "{torn:?}");
    }

    #[test]
    fn damage_in_the_middle_counts_the_commits_sqlite_would_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = wal_of_commits(dir.path(), 5);
        let frame = FRAME_HEADER + be32(&wal[8..12]) as usize;
        // A byte of the third frame's page flipped.
        wal[WAL_HEADER + 2 * frame + FRAME_HEADER + 10] ^= 0xff;
        let scan = scan_wal(&wal);
        assert_eq!(scan.damaged_at, Some(2), "{scan:?}");
        assert!(scan.commits_after_damage >= 2, "{scan:?}");
        assert!(scan.valid_commits < 6);
    }
}
