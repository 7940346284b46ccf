//! How the Redis store keeps event logs (layout 3): a quick answer (a stream
//! that starts with its final event) is one string kept for the finished-stream
//! TTL, not a Redis Stream (whose first node costs Redis about 4.7 KB); an
//! open stream is a Redis Stream that expires with its session.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use tether_store::redis::RedisStore;
use tether_store::{EventKind, SessionRecord, Store, StoreConfig, now_ms};

/// A store on the test Redis under a prefix of this test's own, and a
/// plain connection to look at its keys.
async fn open(name: &str, config: StoreConfig) -> (Arc<RedisStore>, String, MultiplexedConnection) {
    let url = std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let prefix = format!("tether-test:{}:{name}:", std::process::id());
    let config = StoreConfig { redis_prefix: prefix.clone(), ..config };
    let store = RedisStore::open(&url, config).await.unwrap_or_else(|e| {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis).")
    });
    let conn = redis::Client::open(url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    (Arc::new(store), prefix, conn)
}

/// Deletes the keys under the test's prefix.
async fn clean(conn: &mut MultiplexedConnection, prefix: &str) {
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(conn).await.unwrap();
    for key in keys {
        let _: i64 = redis::cmd("DEL").arg(key).query_async(conn).await.unwrap();
    }
}

#[tokio::test]
async fn a_quick_answer_is_one_string_kept_for_the_finished_stream_ttl() {
    let config = StoreConfig { finished_stream_ttl: Duration::from_secs(90), ..StoreConfig::default() };
    let (store, p, mut conn) = open("streams", config).await;
    let expires = now_ms() + 600_000;
    let session = SessionRecord {
        id: "s1".into(),
        principal: "alice".into(),
        created_at_ms: now_ms(),
        expires_at_ms: expires,
        revision: 1,
        state: serde_json::json!({}),
    };
    store.create_session(&session).await.unwrap();
    store.start_stream("s1", "quick", vec![(EventKind::Final, Bytes::from_static(b"{\"result\":{}}"))]).await.unwrap();
    store.start_stream("s1", "slow", vec![(EventKind::Prime, Bytes::new())]).await.unwrap();

    let q = |cmd: &str| redis::cmd(cmd);
    let b = format!("{p}{{s1}}:");
    let kind: String = q("TYPE").arg(format!("{b}d:quick")).query_async(&mut conn).await.unwrap();
    assert_eq!(kind, "string", "the quick answer is stored whole");
    let ttl: i64 = q("PTTL").arg(format!("{b}d:quick")).query_async(&mut conn).await.unwrap();
    assert!((80_000..=90_000).contains(&ttl), "kept for the finished-stream TTL, not the session's: {ttl} ms");
    let kind: String = q("TYPE").arg(format!("{b}e:slow")).query_async(&mut conn).await.unwrap();
    assert_eq!(kind, "stream", "an open stream is a Redis Stream");
    let ttl: i64 = q("PTTL").arg(format!("{b}e:slow")).query_async(&mut conn).await.unwrap();
    assert!(ttl > 590_000, "an open stream expires with its session: {ttl} ms");
    let open: Vec<String> = store.open_streams("s1").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(open, ["slow"]);

    clean(&mut conn, &p).await;
}

/// Appends that arrive together share one script call on a single server;
/// one that fails (here a key of the wrong type where its stream should
/// be) fails alone, and the others in its batch are stored and numbered.
#[tokio::test]
async fn a_failing_append_fails_alone_in_its_batch() {
    let (store, p, mut conn) = open("batch", StoreConfig::default()).await;
    let q = |cmd: &str| redis::cmd(cmd);
    let _: () = q("SET").arg(format!("{p}{{bad}}:e:g")).arg("not a stream").query_async(&mut conn).await.unwrap();

    let mut appends = Vec::new();
    for i in 0..40u32 {
        let (store, session) = (store.clone(), if i % 2 == 0 { "good" } else { "bad" });
        appends.push(tokio::spawn(async move {
            (session, store.append(session, "g", EventKind::Message, Bytes::from(i.to_string())).await)
        }));
    }
    let mut good_seqs = Vec::new();
    for append in appends {
        match append.await.unwrap() {
            ("good", Ok(seq)) => good_seqs.push(seq),
            ("bad", Err(e)) => assert!(e.to_string().contains("WRONGTYPE"), "the failure says why: {e}"),
            (session, outcome) => panic!("{session}: {outcome:?}"),
        }
    }
    good_seqs.sort();
    assert_eq!(good_seqs, (1..=20).collect::<Vec<u64>>(), "every append beside the failing ones is stored, once");
    assert_eq!(store.read_after("good", "g", 0, 100).await.unwrap().len(), 20);

    clean(&mut conn, &p).await;
}

/// The calls of every operation share one pipeline per batch. A script
/// Redis no longer knows (`SCRIPT FLUSH`, as after a restart) did not run:
/// it is loaded and its calls sent again, each stored once; the plain
/// commands beside it (sessions' stamps) are answered as they were.
#[tokio::test]
async fn after_a_script_flush_every_call_of_a_batch_runs_once() {
    let (store, p, mut conn) = open("noscript", StoreConfig::default()).await;
    let session = SessionRecord {
        id: "s".into(),
        principal: "alice".into(),
        created_at_ms: now_ms(),
        expires_at_ms: now_ms() + 600_000,
        revision: 1,
        state: serde_json::json!({}),
    };
    store.create_session(&session).await.unwrap();
    store.append("s", "g", EventKind::Message, Bytes::from_static(b"0")).await.unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();

    let mut appends = Vec::new();
    let mut stamps = Vec::new();
    for i in 1..=30u32 {
        let (a, b) = (store.clone(), store.clone());
        appends.push(tokio::spawn(async move { a.append("s", "g", EventKind::Message, Bytes::from(i.to_string())).await }));
        stamps.push(tokio::spawn(async move { b.session_stamp("s", now_ms()).await }));
    }
    let mut seqs = Vec::new();
    for append in appends {
        seqs.push(append.await.unwrap().expect("an append after the flush is stored"));
    }
    for stamp in stamps {
        let stamp = stamp.await.unwrap().expect("a stamp read beside the reloaded script");
        assert_eq!(stamp.map(|s| s.revision), Some(1));
    }
    seqs.sort();
    assert_eq!(seqs, (2..=31).collect::<Vec<u64>>(), "each append once, numbered after the first");
    assert_eq!(store.read_after("s", "g", 0, 100).await.unwrap().len(), 31, "no append stored twice");

    clean(&mut conn, &p).await;
}
