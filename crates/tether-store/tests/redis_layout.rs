//! The key layout under a Redis prefix is checked when a store opens it: a
//! fresh prefix is marked with this version's layout (3); keys of a layout
//! only a pre-release build wrote (1: untagged, no marker; 2: per-stream
//! hashes) are refused with what to do instead, as are keys of a newer
//! version, and a refused prefix is left as it was.

use tether_store::redis::RedisStore;
use tether_store::{Store, StoreConfig, StoreError, now_ms};

fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis).")
    })
}

async fn open(url: &str, prefix: &str) -> Result<RedisStore, StoreError> {
    RedisStore::open(url, StoreConfig { redis_prefix: prefix.into(), ..StoreConfig::default() }).await
}

/// The keys under `prefix` with their values' types, in order.
async fn keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<(String, String)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(conn).await.unwrap();
    keys.sort();
    let mut typed = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(conn).await.unwrap();
        typed.push((key, kind));
    }
    typed
}

async fn clear(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) {
    for (key, _) in keys(conn, prefix).await {
        let _: i64 = redis::cmd("DEL").arg(key).query_async(conn).await.unwrap();
    }
}

/// Opening `prefix` fails with a configuration error that names the
/// layout found and says what to do, and leaves the keys as they were.
async fn assert_refused(url: &str, conn: &mut redis::aio::MultiplexedConnection, prefix: &str, layout: &str) {
    let before = keys(conn, prefix).await;
    let Err(StoreError::Config(message)) = open(url, prefix).await.map(|_| ()) else {
        panic!("keys of layout {layout} under {prefix} are refused as a configuration error")
    };
    for said in [&format!("key layout {layout}") as &str, "pre-release", "--store-prefix", "FLUSHDB", prefix] {
        assert!(message.contains(said), "the refusal says `{said}`: {message}");
    }
    assert_eq!(keys(conn, prefix).await, before, "a refused prefix is left as it was");
}

#[tokio::test]
async fn a_fresh_prefix_is_marked_with_the_current_layout_and_opens_again() {
    let url = redis_url();
    let p = format!("tether-test:{}:layout-fresh:", std::process::id());
    let mut conn = connect(&url).await;
    clear(&mut conn, &p).await;

    let store = open(&url, &p).await.unwrap();
    let marker: Option<i64> = redis::cmd("GET").arg(format!("{p}layout")).query_async(&mut conn).await.unwrap();
    assert_eq!(marker, Some(3));
    let session = tether_store::SessionRecord {
        id: "s1".into(),
        principal: "alice".into(),
        created_at_ms: now_ms(),
        expires_at_ms: now_ms() + 600_000,
        revision: 1,
        state: serde_json::json!({}),
    };
    store.create_session(&session).await.unwrap();
    drop(store);

    let again = open(&url, &p).await.expect("a prefix in the current layout opens");
    assert!(again.get_session("s1", now_ms()).await.unwrap().is_some());
    clear(&mut conn, &p).await;
}

#[tokio::test]
async fn keys_of_a_pre_release_layout_are_refused_with_what_to_do() {
    let url = redis_url();
    let mut conn = connect(&url).await;
    let q = |cmd: &str| redis::cmd(cmd);
    let expires = now_ms() + 600_000;

    // Layout 1 (no marker): a session under untagged keys, the by-expiry
    // index and the one shared revision counter.
    let p = format!("tether-test:{}:layout1:", std::process::id());
    clear(&mut conn, &p).await;
    let _: () = q("HSET")
        .arg(format!("{p}s:old1"))
        .arg(&["principal", "alice", "created", "1", "expires", &expires.to_string(), "revision", "3", "state", "{}"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = q("ZADD").arg(format!("{p}sx")).arg(expires).arg("old1").query_async(&mut conn).await.unwrap();
    let _: () = q("SET").arg(format!("{p}kvrev")).arg(7).query_async(&mut conn).await.unwrap();
    assert_refused(&url, &mut conn, &p, "1").await;
    // Its sessions gone, layout 1 still left its shared counter behind.
    let _: () = q("DEL").arg(format!("{p}s:old1")).arg(format!("{p}sx")).query_async(&mut conn).await.unwrap();
    assert_refused(&url, &mut conn, &p, "1").await;
    clear(&mut conn, &p).await;

    // Layout 2: marked, a stream's last seq and finished flag in hashes of their own.
    let p = format!("tether-test:{}:layout2:", std::process::id());
    clear(&mut conn, &p).await;
    let b = format!("{p}{{s2}}:");
    let _: () = q("HSET")
        .arg(format!("{b}s"))
        .arg(&["principal", "alice", "created", "1", "expires", &expires.to_string(), "revision", "1", "state", "{}"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = q("ZADD").arg(format!("{p}sx")).arg(expires).arg("s2").query_async(&mut conn).await.unwrap();
    let _: () = q("HSET").arg(format!("{b}q")).arg("r").arg(2).query_async(&mut conn).await.unwrap();
    let _: () = q("HSET").arg(format!("{b}f")).arg("r").arg(1).query_async(&mut conn).await.unwrap();
    let _: () = q("SET").arg(format!("{p}layout")).arg(2).query_async(&mut conn).await.unwrap();
    assert_refused(&url, &mut conn, &p, "2").await;
    clear(&mut conn, &p).await;

    // What the refusal advises works: the same prefix, its keys deleted, opens.
    open(&url, &p).await.expect("a prefix whose keys were deleted opens");
    clear(&mut conn, &p).await;
}

#[tokio::test]
async fn a_layout_newer_than_this_version_is_refused() {
    let url = redis_url();
    let p = format!("tether-test:{}:layout-newer:", std::process::id());
    let mut conn = connect(&url).await;
    clear(&mut conn, &p).await;
    let _: () = redis::cmd("SET").arg(format!("{p}layout")).arg(4).query_async(&mut conn).await.unwrap();

    let Err(StoreError::Config(message)) = open(&url, &p).await.map(|_| ()) else {
        panic!("a newer layout is refused as a configuration error")
    };
    assert!(message.contains("newer tether") && message.contains("key layout 4"), "{message}");
    let marker: i64 = redis::cmd("GET").arg(format!("{p}layout")).query_async(&mut conn).await.unwrap();
    assert_eq!(marker, 4, "the newer version's marker is left alone");
    clear(&mut conn, &p).await;
}
