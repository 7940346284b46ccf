//! A SQLite file written by an earlier version (events in a `WITHOUT ROWID`
//! table) is converted on open, and nothing in it is lost.

use bytes::Bytes;
use tether_store::sqlite::SqliteStore;
use tether_store::{EventKind, Store, StoreConfig};

const EARLIER_EVENTS: &str = "CREATE TABLE events(
    session TEXT NOT NULL,
    stream TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY(session, stream, seq)
) WITHOUT ROWID;";

#[tokio::test]
async fn events_of_an_earlier_layout_survive_the_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(EARLIER_EVENTS).unwrap();
        for seq in 1..=3i64 {
            let kind = if seq == 3 { EventKind::Final } else { EventKind::Message } as u8;
            conn.execute(
                "INSERT INTO events(session, stream, seq, kind, payload) VALUES ('s1', 'r1', ?1, ?2, ?3)",
                rusqlite::params![seq, kind, format!("event {seq}").into_bytes()],
            )
            .unwrap();
        }
    }

    let store = SqliteStore::open(&path, StoreConfig::default()).await.unwrap();
    let events = store.read_after("s1", "r1", 0, 10).await.unwrap();
    let seen: Vec<(u64, Bytes)> = events.into_iter().map(|e| (e.seq, e.payload)).collect();
    assert_eq!(
        seen,
        (1..=3u64).map(|s| (s, Bytes::from(format!("event {s}")))).collect::<Vec<_>>(),
        "every event, in order, with its payload"
    );
    let summary = store.stream("s1", "r1").await.unwrap().expect("the stream is known");
    assert_eq!((summary.first_seq, summary.last_seq, summary.finished), (1, 3, true));
    assert_eq!(store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"after")).await.unwrap(), 4, "numbering continues");
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let sql: String = conn.query_row("SELECT sql FROM sqlite_schema WHERE name = 'events'", [], |r| r.get(0)).unwrap();
    assert!(!sql.to_ascii_uppercase().contains("WITHOUT ROWID"), "converted: {sql}");
}
