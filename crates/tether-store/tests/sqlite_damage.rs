//! Damaged files of a stopped store: a WAL damaged in its middle,
//! a database whose header is garbage or that was cut short are refused at
//! open with what to do, never a panic, and never opened as a silently
//! shorter history under `--durability strict`. A torn last frame (what a
//! crash mid-commit leaves) opens as before. The files are copies of a live
//! store's after its commits returned: what a `kill -9` leaves on disk.
//!
//! A WAL cut exactly at a commit frame is a valid, shorter WAL: only the WAL
//! marker (`<db>-walmark`, written after each commit) tells it from an
//! intact one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig, StoreError};

mod support {
    pub mod logs;
}

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

fn walmark(db: &Path) -> PathBuf {
    PathBuf::from(format!("{}-walmark", db.display()))
}

/// The files of an idle store, as a `kill -9` leaves them: the database,
/// its WAL and the WAL's marker.
fn copy(db: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let copy = to.join("tether.db");
    std::fs::copy(db, &copy).unwrap();
    if wal(db).exists() {
        std::fs::copy(wal(db), wal(&copy)).unwrap();
    }
    if walmark(db).exists() {
        std::fs::copy(walmark(db), walmark(&copy)).unwrap();
    }
    copy
}

/// Warnings logged in this process (every test's: filter by path).
fn logs() -> Arc<Mutex<Vec<u8>>> {
    support::logs::captured(tracing::Level::WARN)
}

/// The warnings logged so far that name `db`'s WAL.
fn warnings_about(db: &Path) -> Vec<String> {
    let logs = logs();
    let text = String::from_utf8_lossy(&logs.lock()).into_owned();
    let wal = wal(db).display().to_string();
    text.lines().filter(|line| line.contains(&wal)).map(str::to_owned).collect()
}

/// Byte offsets just past each commit frame of the WAL's current
/// generation (the frames that carry its header's salts).
fn commit_ends(db: &Path) -> Vec<u64> {
    let bytes = std::fs::read(wal(db)).unwrap_or_default();
    if bytes.len() < 32 {
        return Vec::new();
    }
    let frame = wal_frame_size(db);
    let salts = &bytes[16..24];
    let mut ends = Vec::new();
    let mut at = 32;
    while at + frame <= bytes.len() && &bytes[at + 8..at + 16] == salts {
        if bytes[at + 4..at + 8] != [0; 4] {
            ends.push((at + frame) as u64);
        }
        at += frame;
    }
    ends
}

/// Appends to stream "h" of `store` until the WAL's current generation
/// holds at least `commits` commits (a checkpoint may have started it over).
async fn commits_in_the_wal(store: &SqliteStore, db: &Path, commits: usize) {
    for i in 1..=200u64 {
        if commit_ends(db).len() >= commits {
            return;
        }
        store.append("s", "h", EventKind::Message, Bytes::from(format!("{i}:{}", "y".repeat(3000)))).await.unwrap();
    }
    panic!("the WAL never held {commits} commits");
}

/// Cuts the WAL at `db` just past its `n`-th last commit frame: a valid,
/// shorter WAL. Returns the frames left.
fn cut_wal_at_commit(db: &Path, from_the_end: usize) -> u64 {
    let ends = commit_ends(db);
    assert!(ends.len() > from_the_end, "{} commits in the WAL", ends.len());
    let at = ends[ends.len() - 1 - from_the_end];
    std::fs::OpenOptions::new().write(true).open(wal(db)).unwrap().set_len(at).unwrap();
    (at - 32) / wal_frame_size(db) as u64
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
    let (store, live) = live_store(dir.path(), true).await;
    // The commit under way at a crash has not written its marker yet (it
    // does after its fsync): the copy keeps the marker of the one before.
    let before = std::fs::read(walmark(&live)).unwrap();
    store.append("s", "g", EventKind::Message, Bytes::from("x".repeat(3000))).await.unwrap();
    let torn = copy(&live, &dir.path().join("torn"));
    std::fs::write(walmark(&torn), before).unwrap();
    let len = std::fs::metadata(wal(&torn)).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(wal(&torn)).unwrap();
    file.set_len(len - 1000).unwrap();
    let kept = events(&torn, true).await.unwrap();
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
    assert!(kept.len() >= EVENTS as usize, "only the torn last commit may go: {kept:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_cut_at_an_earlier_commit_is_refused_under_strict_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (store, live) = live_store(dir.path(), true).await;
    commits_in_the_wal(&store, &live, 4).await;
    let cut = copy(&live, &dir.path().join("cut"));
    let frames = cut_wal_at_commit(&cut, 2);

    let refused = events(&cut, true).await.expect_err("a WAL cut before acknowledged commits is refused");
    let message = refused.to_string();
    assert!(matches!(refused, StoreError::Corrupt(_)), "{refused:?}");
    let what = format!("ends at frame {frames} but commits up to frame");
    for needed in [what.as_str(), "--durability strict", "Restore", "delete", "-walmark", "sqlite3", "wal_checkpoint(TRUNCATE)"] {
        assert!(message.contains(needed), "{needed:?} missing from: {message}");
    }

    // The advice works: what the WAL still holds, in order.
    accept_the_loss(&cut);
    let kept = events(&cut, true).await.unwrap();
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_normal_durability_a_wal_cut_at_a_commit_opens_with_a_warning_that_names_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (store, live) = live_store(dir.path(), false).await;
    commits_in_the_wal(&store, &live, 4).await;
    let cut = copy(&live, &dir.path().join("cut"));
    let frames = cut_wal_at_commit(&cut, 2);
    logs();
    let kept = events(&cut, false).await.unwrap();
    assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>());
    let warnings = warnings_about(&cut);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains(&format!("ends at frame {frames} but commits up to frame")) && w.contains("power loss")),
        "no warning naming the loss: {warnings:?}"
    );
}

/// No false alarm: an intact store reopens silently after a `kill -9` and
/// after a clean close, and so does one whose WAL was emptied by hand
/// (what the advice does) or started over since its marker was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intact_store_reopens_without_a_word_after_a_kill_a_clean_close_or_a_checkpoint() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let (store, live) = live_store(dir.path(), true).await;
    assert!(commit_ends(&live).len() > 1);
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(walmark(&live)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the marker is the owner's alone");
    }

    let killed = copy(&live, &dir.path().join("killed"));
    assert_eq!(events(&killed, true).await.unwrap(), (1..=EVENTS).collect::<Vec<_>>());
    assert_eq!(warnings_about(&killed), Vec::<String>::new());

    let emptied = copy(&live, &dir.path().join("emptied"));
    accept_the_loss(&emptied);
    assert_eq!(events(&emptied, true).await.unwrap(), (1..=EVENTS).collect::<Vec<_>>());
    assert_eq!(warnings_about(&emptied), Vec::<String>::new());

    drop(store);
    let reopened = 'open: {
        for _ in 0..100 {
            match SqliteStore::open(&live, config(true)).await {
                Ok(store) => break 'open store,
                Err(StoreError::Config(_)) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                Err(e) => panic!("a cleanly closed store is refused: {e}"),
            }
        }
        panic!("the closed store stays locked");
    };
    let seqs: Vec<u64> = reopened.read_after("s", "g", 0, 1000).await.unwrap().into_iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=EVENTS).collect::<Vec<_>>());
    assert_eq!(warnings_about(&live), Vec::<String>::new());
}

/// A checkpoint lets the WAL start over (new salts, frame count from one):
/// the marker written before names the old generation and is ignored, even
/// claiming more frames than the new WAL holds; the writer reads the new
/// salts, so a cut in the new generation is caught again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_of_an_earlier_wal_generation_is_ignored_and_the_next_one_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, live) = live_store(dir.path(), true).await;
    let salts = |db: &Path| std::fs::read(wal(db)).unwrap()[16..24].to_vec();
    let old_salts = salts(&live);
    let old_mark = std::fs::read(walmark(&live)).unwrap();
    let frames_in = |db: &Path| commit_ends(db).last().map_or(0, |end| (end - 32) / wal_frame_size(db) as u64);
    let old_frames = frames_in(&live);
    // The checkpointer copies the WAL back 200 ms after the last commit; the
    // next commit then starts the WAL over.
    let mut restarted = false;
    for i in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        store.append("s", "h", EventKind::Message, Bytes::from(format!("{i}:{}", "z".repeat(3000)))).await.unwrap();
        if salts(&live) != old_salts {
            restarted = true;
            break;
        }
    }
    assert!(restarted, "the WAL never started over");
    assert!(frames_in(&live) < old_frames, "the new generation is shorter than the old marker says");

    // The old marker (its write after the restart lost, say): ignored.
    let stale = copy(&live, &dir.path().join("stale"));
    std::fs::write(walmark(&stale), &old_mark).unwrap();
    assert_eq!(events(&stale, true).await.unwrap(), (1..=EVENTS).collect::<Vec<_>>());

    // The new marker follows the new generation: a cut in it is refused.
    commits_in_the_wal(&store, &live, 4).await;
    let cut = copy(&live, &dir.path().join("cut"));
    let frames = cut_wal_at_commit(&cut, 1);
    let message = events(&cut, true).await.expect_err("a cut in the new generation is refused").to_string();
    assert!(message.contains(&format!("ends at frame {frames} but commits up to frame")), "{message}");
}

/// A marker torn by a power cut, or garbage, or cut short, is not evidence
/// of anything: the store opens (here with its WAL cut at a commit, which
/// only a valid marker could tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_or_garbage_marker_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (store, live) = live_store(dir.path(), true).await;
    commits_in_the_wal(&store, &live, 4).await;
    let mark = std::fs::read(walmark(&live)).unwrap();
    assert_eq!(mark.len(), 32);
    let mut torn = mark.clone();
    torn[20] ^= 0x01; // the frame count's high bytes, as a torn write leaves them
    let variants: [(&str, Vec<u8>); 4] = [
        ("torn", torn),
        ("short", mark[..20].to_vec()),
        ("empty", Vec::new()),
        ("garbage", b"not a marker at all, really!!!!!".to_vec()),
    ];
    for (name, bytes) in variants {
        let cut = copy(&live, &dir.path().join(name));
        cut_wal_at_commit(&cut, 2);
        std::fs::write(walmark(&cut), bytes).unwrap();
        let kept = events(&cut, true).await.unwrap_or_else(|e| panic!("{name}: refused: {e}"));
        assert_eq!(kept, (1..=kept.len() as u64).collect::<Vec<_>>(), "{name}");
    }
}
