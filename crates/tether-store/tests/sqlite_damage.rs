//! Damaged files of a stopped store (issue 28): a WAL damaged in its middle,
//! a database whose header is garbage or that was cut short are refused at
//! open with what to do, never a panic, and never opened as a silently
//! shorter history under `--durability strict`. A torn last frame (what a
//! crash mid-commit leaves) opens as before. The files are copies of a live
//! store's after its commits returned: what a `kill -9` leaves on disk.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig, StoreError};

const EVENTS: u64 = 12;

fn config(strict: bool) -> StoreConfig {
    StoreConfig { strict_durability: strict, ..StoreConfig::default() }
}

fn wal(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", db.display()))
}

/// A store with `EVENTS` acknowledged appends, one commit each; returns its
/// path (the store stays open: the copies are what a crash would leave).
async fn live_store(dir: &Path, strict: bool) -> (SqliteStore, PathBuf) {
    let path = dir.join("live").join("tether.db");
    let store = SqliteStore::open(&path, config(strict)).await.unwrap();
    store.create_session(&tether_store::conformance::session("s", "p", 600_000)).await.unwrap();
    for i in 1..=EVENTS {
        // Pages of their own, so the WAL holds a frame or two per commit.
        let payload = Bytes::from(format!("{i}:{}", "x".repeat(3000)));
        assert_eq!(store.append("s", "g", EventKind::Message, payload).await.unwrap(), i);
    }
    (store, path)
}

fn copy(db: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let copy = to.join("tether.db");
    std::fs::copy(db, &copy).unwrap();
    if wal(db).exists() {
        std::fs::copy(wal(db), wal(&copy)).unwrap();
    }
    copy
}

async fn events(db: &Path, strict: bool) -> Result<Vec<u64>, StoreError> {
    let store = SqliteStore::open(db, config(strict)).await?;
    Ok(store.read_after("s", "g", 0, 1000).await?.into_iter().map(|e| e.seq).collect())
}

fn wal_frame_size(db: &Path) -> usize {
    let bytes = std::fs::read(wal(db)).unwrap();
    24 + u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
}

/// Flips a byte inside the page of WAL frame `n`.
fn damage_wal_frame(db: &Path, n: usize) {
    let mut bytes = std::fs::read(wal(db)).unwrap();
    let at = 32 + n * wal_frame_size(db) + 24 + 100;
    bytes[at] ^= 0x5a;
    std::fs::write(wal(db), bytes).unwrap();
}

/// What an operator does on the advice: SQLite's own recovery keeps what
/// comes before the damage and writes it back into the database.
fn accept_the_loss(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_damaged_before_acknowledged_commits_is_refused_under_strict_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, live) = live_store(dir.path(), true).await;

    let intact = copy(&live, &dir.path().join("intact"));
    assert_eq!(events(&intact, true).await.unwrap(), (1..=EVENTS).collect::<Vec<_>>());

    let damaged = copy(&live, &dir.path().join("damaged"));
    damage_wal_frame(&damaged, 3);
    let refused = events(&damaged, true).await.expect_err("a WAL damaged before acknowledged commits is refused");
    let message = refused.to_string();
    for needed in ["damaged at frame 3", "--durability strict", "Restore", "sqlite3", "wal_checkpoint(TRUNCATE)"] {
        assert!(message.contains(needed), "{needed:?} missing from: {message}");
    }

    // The advice works: the events before the damage, in order, no others.
    accept_the_loss(&damaged);
    let kept = events(&damaged, true).await.unwrap();
    assert!(kept.len() < EVENTS as usize, "{kept:?}");
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_normal_durability_a_damaged_wal_opens_with_the_prefix_before_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, live) = live_store(dir.path(), false).await;
    let damaged = copy(&live, &dir.path().join("damaged"));
    damage_wal_frame(&damaged, 3);
    // What a power loss may leave under normal: opened (with a warning in
    // the log), as the consistent prefix SQLite recovers.
    let kept = events(&damaged, false).await.unwrap();
    assert!(kept.len() < EVENTS as usize, "{kept:?}");
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_wal_frame_opens_like_after_any_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, live) = live_store(dir.path(), true).await;
    let torn = copy(&live, &dir.path().join("torn"));
    let len = std::fs::metadata(wal(&torn)).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(wal(&torn)).unwrap();
    file.set_len(len - 1000).unwrap();
    let kept = events(&torn, true).await.unwrap();
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
    assert!(kept.len() >= EVENTS as usize - 1, "only the torn last commit may go: {kept:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_a_damaged_header_or_cut_short_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, live) = live_store(dir.path(), true).await;

    let garbage = copy(&live, &dir.path().join("garbage"));
    accept_the_loss(&garbage); // everything in the database file, no WAL
    let mut bytes = std::fs::read(&garbage).unwrap();
    bytes[..16].copy_from_slice(b"not a database!!");
    std::fs::write(&garbage, bytes).unwrap();
    let message = events(&garbage, true).await.expect_err("a damaged header is refused").to_string();
    assert!(message.contains("not a SQLite database") && message.contains("restore it from a backup"), "{message}");

    for (name, keep) in [("half", 0.5), ("mid-page", 0.75)] {
        let cut = copy(&live, &dir.path().join(name));
        accept_the_loss(&cut);
        let len = std::fs::metadata(&cut).unwrap().len();
        let keep = if name == "mid-page" { (len as f64 * keep) as u64 + 100 } else { (len as f64 * keep) as u64 / 4096 * 4096 };
        std::fs::OpenOptions::new().write(true).open(&cut).unwrap().set_len(keep).unwrap();
        let message = events(&cut, true).await.expect_err("a database cut short is refused").to_string();
        assert!(message.contains("is truncated") && message.contains("Restore it from a backup"), "{name}: {message}");
        assert!(message.contains(".recover"), "{name}: {message}");
    }
}
