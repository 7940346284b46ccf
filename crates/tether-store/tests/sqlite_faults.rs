//! The SQLite store while its commits fail (`tether_store::faults`): what
//! callers and the health check are told. Found by the fault tests under
//! load (`tether-server/tests/storage_chaos.rs`), each pinned down here.

use bytes::Bytes;
use tether_store::faults::{self, Fault, Op};
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig};

/// `ping` (behind `/healthz`) says what to do also when its empty commit
/// shares a group commit with appends that fail as the disk fills up: it
/// answered the bare "commit failed: database or disk is full" before.
/// And an append's error names the failure once, not wrapped twice
/// ("store backend error: store backend error: …").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_that_shares_a_failing_commit_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.db");
    let store = SqliteStore::open(&path, StoreConfig::default()).await.unwrap();
    store.create_session(&tether_store::conformance::session("s", "p", 600_000)).await.unwrap();
    let mut shared = 0;
    for round in 0..30 {
        faults::clear(&path);
        // Writes work again, and the store knows it (a ping probes).
        let _ = store.ping().await;
        store.append("s", "g", EventKind::Message, Bytes::from("ok")).await.unwrap();
        faults::inject(&path, Op::Write, Fault::Full, 0);
        let appends: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.append("s", "g", EventKind::Message, Bytes::from(format!("{round}:{i}"))).await })
            })
            .collect();
        let ping = store.ping().await;
        for append in appends {
            if let Err(e) = append.await.unwrap() {
                let message = e.to_string();
                assert_eq!(message.matches("store backend error").count(), 1, "{message}");
            }
        }
        if let Err(e) = ping {
            shared += 1;
            let message = e.to_string();
            assert!(message.contains("free disk space"), "round {round}: {message}");
        }
    }
    faults::clear(&path);
    assert!(shared > 0, "the ping never met the failure");
}
