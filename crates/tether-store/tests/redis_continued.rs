//! Appends by a request stream's own process after a Redis failover took
//! back what it wrote (`Store::append_continued`, `Store::restart_stream`):
//! the loss is made here by hand (the stream's key deleted, or cut back to
//! its first entries), as the promoted replica would show it. The event
//! appended next is numbered above everything the caller was given, and a
//! stream lost altogether starts again with its priming event at 1.

use std::sync::Arc;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use tether_store::memory::MemoryStore;
use tether_store::redis::RedisStore;
use tether_store::{EventKind, SessionRecord, Store, StoreConfig, now_ms};

const PRIME: &[u8] = b"{\"id\":1,\"method\":\"tools/call\",\"owner\":\"me\"}";

/// A store on the test Redis under a prefix of this test's own, a plain
/// connection to its keys, and the key base of session `s1` (created).
async fn open(name: &str) -> (Arc<RedisStore>, MultiplexedConnection, String) {
    let url = std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let prefix = format!("tether-test:{}:{name}:{nanos}:", std::process::id());
    let config = StoreConfig { redis_prefix: prefix.clone(), ..StoreConfig::default() };
    let store = RedisStore::open(&url, config).await.unwrap_or_else(|e| {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis).")
    });
    let conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let session = SessionRecord {
        id: "s1".into(),
        principal: "alice".into(),
        created_at_ms: now_ms(),
        expires_at_ms: now_ms() + 600_000,
        revision: 1,
        state: serde_json::json!({}),
    };
    store.create_session(&session).await.unwrap();
    (Arc::new(store), conn, format!("{prefix}{{s1}}:"))
}

fn event(kind: EventKind, text: &str) -> (EventKind, Bytes) {
    (kind, Bytes::from(text.to_owned()))
}

/// The stream's events as (seq, kind), read back.
async fn events(store: &RedisStore, stream: &str) -> Vec<(u64, EventKind)> {
    store.read_after("s1", stream, 0, 100).await.unwrap().into_iter().map(|e| (e.seq, e.kind)).collect()
}

#[tokio::test]
async fn the_next_event_is_numbered_above_the_events_a_failover_took_back() {
    let (store, mut conn, base) = open("continued-cut").await;
    let prime = (EventKind::Prime, Bytes::from_static(PRIME));
    assert_eq!(store.start_stream("s1", "r1", vec![prime]).await.unwrap(), 1);
    assert_eq!(store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"m2")).await.unwrap(), 2);
    assert_eq!(store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"m3")).await.unwrap(), 3);
    // The failover kept the priming event only.
    let _: i64 = redis::cmd("DEL").arg(format!("{base}e:r1")).query_async(&mut conn).await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(format!("{base}e:r1"))
        .arg("0-1")
        .arg("k")
        .arg("0")
        .arg("p")
        .arg(PRIME)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        store.append_continued("s1", "r1", 3, Bytes::from_static(PRIME), vec![event(EventKind::Final, "f")]).await.unwrap(),
        4
    );
    assert_eq!(events(&store, "r1").await, vec![(1, EventKind::Prime), (4, EventKind::Final)]);
    let summary = store.stream("s1", "r1").await.unwrap().expect("the stream");
    assert_eq!((summary.first_seq, summary.last_seq, summary.finished), (1, 4, true));
    assert!(store.open_streams("s1").await.unwrap().is_empty(), "its final closes it");
}

#[tokio::test]
async fn a_stream_lost_altogether_starts_again_with_its_priming_event() {
    let (store, mut conn, base) = open("continued-lost").await;
    let prime = (EventKind::Prime, Bytes::from_static(PRIME));
    store.start_stream("s1", "r1", vec![prime.clone()]).await.unwrap();
    store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"m2")).await.unwrap();
    let _: i64 = redis::cmd("DEL").arg(format!("{base}e:r1")).query_async(&mut conn).await.unwrap();
    assert_eq!(
        store.append_continued("s1", "r1", 2, Bytes::from_static(PRIME), vec![event(EventKind::Final, "f")]).await.unwrap(),
        3
    );
    let stored = store.read_after("s1", "r1", 0, 10).await.unwrap();
    assert_eq!(stored.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(), vec![(1, EventKind::Prime), (3, EventKind::Final)]);
    assert_eq!(stored[0].payload.as_ref(), PRIME, "the priming event as the caller gave it (it names the owner)");

    // Restarting: only a stream the store does not have.
    store.start_stream("s1", "r2", vec![prime]).await.unwrap();
    assert!(!store.restart_stream("s1", "r2", Bytes::from_static(PRIME)).await.unwrap(), "it has it");
    let _: i64 = redis::cmd("DEL").arg(format!("{base}e:r2")).query_async(&mut conn).await.unwrap();
    assert!(store.restart_stream("s1", "r2", Bytes::from_static(PRIME)).await.unwrap());
    assert_eq!(events(&store, "r2").await, vec![(1, EventKind::Prime)]);
    let open: Vec<String> = store.open_streams("s1").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(open, vec!["r2".to_owned()], "open again, as its request runs");
    // The next append keeps to the floor it is given.
    assert_eq!(
        store.append_continued("s1", "r2", 5, Bytes::from_static(PRIME), vec![event(EventKind::Message, "m")]).await.unwrap(),
        6
    );
}

#[tokio::test]
async fn a_floor_below_the_streams_end_numbers_after_its_end() {
    let (store, _conn, _) = open("continued-below").await;
    store.start_stream("s1", "r1", vec![(EventKind::Prime, Bytes::from_static(PRIME))]).await.unwrap();
    for _ in 0..3 {
        store.append("s1", "r1", EventKind::Message, Bytes::from_static(b"m")).await.unwrap();
    }
    let batch = vec![event(EventKind::Message, "a"), event(EventKind::Final, "b")];
    assert_eq!(store.append_continued("s1", "r1", 2, Bytes::from_static(PRIME), batch).await.unwrap(), 5);
    let tail: Vec<(u64, EventKind)> = events(&store, "r1").await.into_iter().skip(4).collect();
    assert_eq!(tail, vec![(5, EventKind::Message), (6, EventKind::Final)]);
}

/// A store that loses nothing while its writer lives ignores the floor.
#[tokio::test]
async fn other_stores_append_as_usual() {
    let store = MemoryStore::new(StoreConfig::default());
    let session = SessionRecord {
        id: "s1".into(),
        principal: "alice".into(),
        created_at_ms: now_ms(),
        expires_at_ms: now_ms() + 600_000,
        revision: 1,
        state: serde_json::json!({}),
    };
    store.create_session(&session).await.unwrap();
    store.start_stream("s1", "r1", vec![(EventKind::Prime, Bytes::from_static(PRIME))]).await.unwrap();
    assert_eq!(
        store.append_continued("s1", "r1", 7, Bytes::from_static(PRIME), vec![event(EventKind::Final, "f")]).await.unwrap(),
        2
    );
    assert!(!store.restart_stream("s1", "r1", Bytes::from_static(PRIME)).await.unwrap());
}
