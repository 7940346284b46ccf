//! Under writes that never pause, the WAL still starts over: it is copied
//! back into the database and rewritten from its beginning, so it neither
//! grows without end (it reached gigabytes before) nor makes every commit
//! pay for growing a file. However fast the writes come, it stays under its
//! limit (the writer copies it back itself, waiting for the checkpointer).

use std::sync::Arc;

use bytes::Bytes;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig};

/// Event payloads of this size take about two pages each in the WAL: a WAL
/// that never starts over ends up about twice the size of what was written.
const PAYLOAD: usize = 4_000;
const WRITERS: usize = 32;
/// 256 MB in all: when other work starves the checkpointer (two test suites
/// at once on two cores), the first start-over came after 146-220 MB of WAL.
const EVENTS_PER_WRITER: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_starts_over_while_writes_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.db");
    let store = Arc::new(SqliteStore::open(&path, StoreConfig::default()).await.unwrap());
    let wal = dir.path().join("busy.db-wal");
    let largest_wal = Arc::new(std::sync::atomic::AtomicU64::new(0));

    let watcher = {
        let (wal, largest_wal) = (wal.clone(), largest_wal.clone());
        tokio::spawn(async move {
            loop {
                let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
                largest_wal.fetch_max(size, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let payload = Bytes::from(vec![b'x'; PAYLOAD]);
                for _ in 0..EVENTS_PER_WRITER {
                    store.append(&format!("s{w}"), "g1", EventKind::Message, payload.clone()).await.unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    watcher.abort();

    let written = (WRITERS * EVENTS_PER_WRITER * PAYLOAD) as u64;
    let largest = largest_wal.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        largest < written,
        "the WAL grew to {largest} bytes while {written} bytes of events were written: it did not start over"
    );
    // The writer copies the WAL back itself once it holds 16,384 frames (~67 MB).
    assert!(largest < 128_000_000, "the WAL grew to {largest} bytes, past its limit of about 67 MB");
    let last = store.read_after("s0", "g1", EVENTS_PER_WRITER as u64 - 1, 10).await.unwrap();
    assert_eq!(last.len(), 1, "every event is readable after the WAL started over");
    assert_eq!(last[0].payload.len(), PAYLOAD);
}
