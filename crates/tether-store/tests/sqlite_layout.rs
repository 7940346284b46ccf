//! The SQLite layout: files written by earlier versions (events in a
//! `WITHOUT ROWID` table, no `tracked_streams`) are converted on open and
//! lose nothing; finished request streams are dropped by age, open streams
//! with their session.

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
        // A request cut off by a crash: primed, never finished.
        conn.execute("INSERT INTO events(session, stream, seq, kind, payload) VALUES ('s1', 'r2', 1, 0, x'')", []).unwrap();
    }

    let store = SqliteStore::open(&path, StoreConfig::default()).await.unwrap();
    let open: Vec<String> = store.open_streams("s1").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(open, vec!["r2".to_string()], "the unfinished stream of the earlier file is found as open");
    let events = store.read_after("s1", "r1", 0, 10).await.unwrap();
    let seen: Vec<(u64, Bytes)> = events.into_iter().map(|e| (e.seq, e.payload)).collect();
    assert_eq!(
        seen,
        (1..=3u64).map(|s| (s, Bytes::from(format!("event {s}")))).collect::<Vec<_>>(),
        "every event, in order, with its payload"
    );
    let summary = store.stream("s1", "r1").await.unwrap().expect("the stream is known");
    assert_eq!((summary.first_seq, summary.last_seq, summary.finished), (1, 3, true));
    assert_eq!(
        store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"after")).await.unwrap(),
        4,
        "numbering continues"
    );
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let sql: String = conn.query_row("SELECT sql FROM sqlite_schema WHERE name = 'events'", [], |r| r.get(0)).unwrap();
    assert!(!sql.to_ascii_uppercase().contains("WITHOUT ROWID"), "converted: {sql}");
}

async fn stored(store: &SqliteStore, stream: &str) -> usize {
    store.read_after("s", stream, 0, 100).await.unwrap().len()
}

#[tokio::test]
async fn finished_request_streams_are_dropped_by_age_and_open_ones_with_their_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("t.db"), StoreConfig::default()).await.unwrap();
    let now = tether_store::now_ms();
    store
        .create_session(&tether_store::SessionRecord {
            id: "s".into(),
            principal: "p".into(),
            created_at_ms: now,
            expires_at_ms: now + 60_000,
            revision: 1,
            state: serde_json::json!({}),
        })
        .await
        .unwrap();
    let ev = |kind| (kind, Bytes::from_static(b"x"));
    // Named by time, as the engine names request streams: r1.. are old, r9 is new.
    store.start_stream("s", "r1quick", vec![ev(EventKind::Prime), ev(EventKind::Final)]).await.unwrap();
    store.start_stream("s", "r2slow", vec![ev(EventKind::Prime)]).await.unwrap();
    store.append("s", "r2slow", EventKind::Final, Bytes::from_static(b"late")).await.unwrap();
    store.start_stream("s", "r3open", vec![ev(EventKind::Prime)]).await.unwrap();
    store.start_stream("s", "r9quick", vec![ev(EventKind::Prime), ev(EventKind::Final)]).await.unwrap();
    store.append("s", "g1", EventKind::Message, Bytes::from_static(b"note")).await.unwrap();

    // Streams named before r5 that finished more than a second ago.
    let dropped = store.drop_finished_streams("r", "r5", now - 1_000, 100).await.unwrap();
    assert_eq!(dropped, 2, "only the old quick stream's two events");
    assert_eq!(stored(&store, "r1quick").await, 0);
    assert_eq!(stored(&store, "r2slow").await, 2, "a slow request is kept for as long after it finished");
    assert_eq!(stored(&store, "r3open").await, 1, "an open request is never dropped by age");
    assert_eq!(stored(&store, "r9quick").await, 2, "a newer stream is kept");
    assert_eq!(stored(&store, "g1").await, 1, "the standalone stream is outside the range");

    let dropped = store.drop_finished_streams("r", "r5", now + 60_000, 100).await.unwrap();
    assert_eq!(dropped, 2, "the slow request's events, once it finished long enough ago");
    assert_eq!(stored(&store, "r2slow").await, 0);
    assert_eq!(stored(&store, "r3open").await, 1);

    let open: Vec<String> = store.open_streams("s").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(open, vec!["g1".to_string(), "r3open".to_string()]);
    assert!(store.delete_session("s").await.unwrap());
    assert_eq!(stored(&store, "r3open").await, 0, "open streams go with their session");
    assert_eq!(stored(&store, "g1").await, 0);
    assert_eq!(stored(&store, "r9quick").await, 2, "finished ones wait for their age");
    assert_eq!(store.drop_finished_streams("r", "r~", now + 60_000, 100).await.unwrap(), 2);
    assert_eq!(stored(&store, "r9quick").await, 0);
}

#[tokio::test]
async fn a_store_file_others_can_read_is_refused_under_strict_and_made_private_otherwise() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    drop(SqliteStore::open(&path, StoreConfig::default()).await.unwrap());
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600, "a new store is private");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

    let strict = StoreConfig { strict_durability: true, ..StoreConfig::default() };
    let refused = SqliteStore::open(&path, strict).await.err().expect("strict refuses a store others can read");
    let message = refused.to_string();
    assert!(message.contains("chmod 600") && message.contains("644"), "{message}");
    assert_eq!(mode(&path), 0o644, "left as it was");

    drop(SqliteStore::open(&path, StoreConfig::default()).await.unwrap());
    assert_eq!(mode(&path), 0o600, "made private, with a warning");
}
