//! A real crash: a child process appends as fast as it can and reports each
//! committed sequence number on stdout; the parent SIGKILLs it mid-stream,
//! reopens the file and checks that every reported event is there, in order,
//! and that appending continues after the last one.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use bytes::Bytes;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig, now_ms};

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
