//! Keys an earlier tether wrote on Redis (layout 1: untagged session keys,
//! one shared revision counter) are converted when this version opens the
//! prefix: sessions, their events and cursors, and key/value records read
//! back as they were, and no revision is handed out twice.

use bytes::Bytes;
use tether_store::redis::RedisStore;
use tether_store::{EventKind, Store, StoreConfig, now_ms};

fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis).")
    })
}

#[tokio::test]
async fn keys_of_the_untagged_layout_are_converted_at_open() {
    let url = redis_url();
    let p = format!("tether-test:{}:layout1:", std::process::id());
    let mut conn = connect(&url).await;
    let expires = now_ms() + 600_000;
    // What layout 1 wrote for one session with one stream of two events, a
    // cursor, and a lease record at revision 7 of the shared counter.
    let q = |cmd: &str| redis::cmd(cmd);
    let state = r#"{"initialized":true}"#;
    let _: () = q("HSET")
        .arg(format!("{p}s:old1"))
        .arg(&["principal", "alice", "created", "1", "expires", &expires.to_string(), "revision", "3", "state", state][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = q("PEXPIREAT").arg(format!("{p}s:old1")).arg(expires).query_async(&mut conn).await.unwrap();
    let _: () = q("ZADD").arg(format!("{p}sx")).arg(expires).arg("old1").query_async(&mut conn).await.unwrap();
    let _: () = q("ZADD").arg(format!("{p}sp:alice")).arg(expires).arg("old1").query_async(&mut conn).await.unwrap();
    for seq in 1..=2 {
        let _: String = q("XADD")
            .arg(format!("{p}e:old1:r1"))
            .arg(format!("0-{seq}"))
            .arg("k")
            .arg(1)
            .arg("p")
            .arg(format!("event {seq}"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let _: () = q("SADD").arg(format!("{p}ss:old1")).arg("r1").query_async(&mut conn).await.unwrap();
    let _: () = q("HSET").arg(format!("{p}q:old1")).arg("r1").arg(2).query_async(&mut conn).await.unwrap();
    let _: () = q("HSET").arg(format!("{p}c:old1")).arg("r1").arg(1).query_async(&mut conn).await.unwrap();
    let _: () = q("HSET")
        .arg(format!("{p}kv:lease:replica-a"))
        .arg(&["v", "1", "r", "7", "x", ""][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = q("SET").arg(format!("{p}kvrev")).arg(7).query_async(&mut conn).await.unwrap();

    let store = RedisStore::open(&url, StoreConfig { redis_prefix: p.clone(), ..StoreConfig::default() }).await.unwrap();
    let session = store.get_session("old1", now_ms()).await.unwrap().expect("the session is found under the new layout");
    assert_eq!((session.principal.as_str(), session.revision), ("alice", 3));
    assert_eq!(session.state["initialized"], true);
    let events = store.read_after("old1", "r1", 0, 10).await.unwrap();
    assert_eq!(
        events.iter().map(|e| (e.seq, e.payload.clone())).collect::<Vec<_>>(),
        [(1, Bytes::from_static(b"event 1")), (2, Bytes::from_static(b"event 2"))]
    );
    assert_eq!(store.cursor("old1", "r1").await.unwrap(), 1);
    assert_eq!(
        store.append("old1", "r1", EventKind::Message, Bytes::from_static(b"event 3")).await.unwrap(),
        3,
        "numbering goes on"
    );
    assert_eq!(store.list_sessions("alice", 10).await.unwrap().len(), 1);
    let lease = store.kv_get("lease", "replica-a", now_ms()).await.unwrap().expect("the record is converted");
    assert_eq!(lease.revision, 7);
    let next = store.kv_compare_and_set("lease", "replica-a", Some(7), Bytes::from_static(b"2"), None).await.unwrap();
    assert!(next.is_some_and(|r| r > 7), "a revision after the old counter's: {next:?}");
    let old_keys: Vec<String> = q("KEYS").arg(format!("{p}s:*")).query_async(&mut conn).await.unwrap();
    assert!(old_keys.is_empty(), "nothing left under the old names: {old_keys:?}");

    // Opening again converts nothing twice.
    drop(store);
    let again = RedisStore::open(&url, StoreConfig { redis_prefix: p.clone(), ..StoreConfig::default() }).await.unwrap();
    assert_eq!(again.read_after("old1", "r1", 0, 10).await.unwrap().len(), 3);

    let keys: Vec<String> = q("KEYS").arg(format!("{p}*")).query_async(&mut conn).await.unwrap();
    for key in keys {
        let _: i64 = q("DEL").arg(key).query_async(&mut conn).await.unwrap();
    }
}

/// Layout 2 listed every stream of a session in `ss`, with its last seq in
/// `q` and its finished flag in `f`; layout 3 lists open streams only and
/// numbers from the event stream itself.
#[tokio::test]
async fn per_stream_hashes_of_layout_2_are_folded_at_open() {
    let url = redis_url();
    let p = format!("tether-test:{}:layout2:", std::process::id());
    let mut conn = connect(&url).await;
    let q = |cmd: &str| redis::cmd(cmd);
    let expires = now_ms() + 600_000;
    let b = format!("{p}{{s2}}:");
    let _: () = q("HSET")
        .arg(format!("{b}s"))
        .arg(&["principal", "alice", "created", "1", "expires", &expires.to_string(), "revision", "1", "state", "{}"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = q("ZADD").arg(format!("{p}sx")).arg(expires).arg("s2").query_async(&mut conn).await.unwrap();
    // `g` open with two events, `r` finished (its second event final).
    for (stream, last_kind) in [("g", 1), ("r", 2)] {
        for (seq, kind) in [(1, 1), (2, last_kind)] {
            let _: String = q("XADD")
                .arg(format!("{b}e:{stream}"))
                .arg(format!("0-{seq}"))
                .arg("k")
                .arg(kind)
                .arg("p")
                .arg(format!("{stream}{seq}"))
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let _: () = q("SADD").arg(format!("{b}ss")).arg(stream).query_async(&mut conn).await.unwrap();
        let _: () = q("HSET").arg(format!("{b}q")).arg(stream).arg(2).query_async(&mut conn).await.unwrap();
    }
    let _: () = q("HSET").arg(format!("{b}f")).arg("r").arg(1).query_async(&mut conn).await.unwrap();
    let _: () = q("SET").arg(format!("{p}layout")).arg(2).query_async(&mut conn).await.unwrap();

    let store = RedisStore::open(&url, StoreConfig { redis_prefix: p.clone(), ..StoreConfig::default() }).await.unwrap();
    assert!(!store.upgraded_from_earlier_layout(), "layout 2 is not the untagged layout");
    let open: Vec<String> = store.open_streams("s2").await.unwrap().into_iter().map(|s| s.stream).collect();
    assert_eq!(open, ["g"], "only the stream without a final event is open");
    let r = store.stream("s2", "r").await.unwrap().expect("the finished stream is kept");
    assert_eq!((r.first_seq, r.last_seq, r.finished), (1, 2, true));
    assert_eq!(store.append("s2", "g", EventKind::Final, Bytes::from_static(b"g3")).await.unwrap(), 3, "numbering goes on");
    assert!(store.open_streams("s2").await.unwrap().is_empty());
    for gone in ["q", "f"] {
        let exists: i64 = q("EXISTS").arg(format!("{b}{gone}")).query_async(&mut conn).await.unwrap();
        assert_eq!(exists, 0, "{gone} is folded away");
    }
    let layout: i64 = q("GET").arg(format!("{p}layout")).query_async(&mut conn).await.unwrap();
    assert_eq!(layout, 3);

    let keys: Vec<String> = q("KEYS").arg(format!("{p}*")).query_async(&mut conn).await.unwrap();
    for key in keys {
        let _: i64 = q("DEL").arg(key).query_async(&mut conn).await.unwrap();
    }
}
