//! A real crash: a child process appends as fast as it can and reports each
//! committed sequence number on stdout; the parent SIGKILLs it mid-stream,
//! reopens the file and checks that every reported event is there, in order,
//! and that appending continues after the last one.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use bytes::Bytes;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig, now_ms};

mod support {
    pub mod logs;
}

const CHILD_ENV: &str = "TETHER_STORE_CRASH_CHILD_DB";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_appends_until_killed() {
    let Ok(path) = std::env::var(CHILD_ENV) else { return };
    let store = SqliteStore::open(std::path::Path::new(&path), StoreConfig::default()).await.unwrap();
    store.create_session(&tether_store::conformance::session("crash", "p", 600_000)).await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..4 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let seq = store.append("crash", "g", EventKind::Message, Bytes::from(format!("{w}:{i}"))).await.unwrap();
                println!("committed {seq}");
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_append_loses_nothing_committed() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.sqlite");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_appends_until_killed", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut reported = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(seq) = line.strip_prefix("committed ") {
            reported.push(seq.parse::<u64>().unwrap());
            if reported.len() == 2_000 {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(reported.len(), 2_000, "child reported commits before the kill");

    let store = SqliteStore::open(&path, StoreConfig::default()).await.unwrap();
    assert!(store.get_session("crash", now_ms()).await.unwrap().is_some());
    let events = store.read_after("crash", "g", 0, 1_000_000).await.unwrap();
    let max_reported = *reported.iter().max().unwrap();
    assert!(events.len() as u64 >= max_reported, "every reported commit survived the kill");
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1), "the log has no holes");
    let next = store.append("crash", "g", EventKind::Message, Bytes::from_static(b"after")).await.unwrap();
    assert_eq!(next, events.len() as u64 + 1, "appending continues after the last committed event");
}

const HOLDER_ENV: &str = "TETHER_STORE_HOLDER_DB";
/// What the holder prints once it holds the store.
const HOLDING: &str = "holding the store";

/// The holder: opens the store, says so, and keeps it until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_the_store() {
    let Ok(path) = std::env::var(HOLDER_ENV) else { return };
    let _store = SqliteStore::open(std::path::Path::new(&path), StoreConfig::default()).await.unwrap();
    println!("{HOLDING}");
    // Until the parent kills this process or closes its stdin.
    let _ = std::io::stdin().read_line(&mut String::new());
}

/// A server restarted right after `kill -9` of the last one can find the
/// store's lock still held by a process that is exiting. Opening waits for
/// it (`lock_wait`) instead of refusing; with no wait, a held store is
/// refused at once with `InUse`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_held_by_a_killed_process_opens_once_the_process_is_gone() {
    if std::env::var(HOLDER_ENV).is_ok() || std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let logs = support::logs::captured(tracing::Level::INFO);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.sqlite");
    let mut holder = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_the_store", "--nocapture", "--test-threads=1"])
        .env(HOLDER_ENV, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = holder.stdout.take().unwrap();
    // libtest may print the test's name on the same line before it.
    let said_open = BufReader::new(stdout).lines().map_while(Result::ok).any(|line| line.contains(HOLDING));
    assert!(said_open, "the holder opened the store");

    let at_once = StoreConfig { lock_wait: std::time::Duration::ZERO, ..StoreConfig::default() };
    match SqliteStore::open(&path, at_once).await {
        Err(tether_store::StoreError::InUse(p)) => assert_eq!(p, path.display().to_string()),
        other => panic!("a held store is refused with InUse, got {:?}", other.map(|_| ())),
    }

    let waiting = StoreConfig { lock_wait: std::time::Duration::from_secs(120), ..StoreConfig::default() };
    let opening = tokio::spawn({
        let path = path.clone();
        async move { SqliteStore::open(&path, waiting).await }
    });
    // Kill the holder only once the open is waiting for its lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let needle = format!("{} is locked by another process", path.display());
    while !String::from_utf8_lossy(&logs.lock()).contains(&needle) {
        assert!(std::time::Instant::now() < deadline, "the open said it waits for the lock");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    holder.kill().unwrap(); // SIGKILL
    let store = opening.await.unwrap().expect("the store opens once its holder is gone");
    holder.wait().unwrap();
    store.create_session(&tether_store::conformance::session("after", "p", 600_000)).await.unwrap();
    assert!(store.get_session("after", now_ms()).await.unwrap().is_some());
}
