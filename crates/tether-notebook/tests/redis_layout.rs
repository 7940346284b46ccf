//! Notebook keys an earlier tether wrote on Redis (`Pnb:s:ID`, untagged) are
//! converted when the store finds that earlier layout: the session, its
//! thoughts and its place in the by-root index read back, and appending goes on.

use tether_notebook::thought::ThoughtInput;
use tether_notebook::{NotebookRepo, RedisNotebook};
use tether_store::StoreConfig;
use tether_store::redis::RedisStore;

#[tokio::test]
async fn an_earlier_notebook_is_found_again_after_the_conversion() {
    let url = std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let p = format!("tether-test:{}:nb-layout1:", std::process::id());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap_or_else(|e| {
        panic!("Redis is needed for this test and is not reachable at {url}: {e}. Run scripts/test (it starts Redis).")
    });
    let q = |cmd: &str| redis::cmd(cmd);
    let thought = serde_json::json!({"thought": "first", "thoughtNumber": 1, "totalThoughts": 2,
        "nextThoughtNeeded": true, "recordedAtMs": 5});
    let fields = [
        "principal",
        "alice",
        "title",
        "old",
        "tags",
        "[]",
        "root",
        "file:///proj",
        "created",
        "1",
        "updated",
        "5",
        "thoughts",
        "1",
        "branches",
        "0",
    ];
    let _: () = q("HSET").arg(format!("{p}nb:s:nb1")).arg(&fields[..]).query_async(&mut conn).await.unwrap();
    let _: () = q("RPUSH").arg(format!("{p}nb:t:nb1")).arg(thought.to_string()).query_async(&mut conn).await.unwrap();
    let _: () = q("ZADD").arg(format!("{p}nb:p:alice")).arg(5).arg("nb1").query_async(&mut conn).await.unwrap();
    let _: () = q("ZADD").arg(format!("{p}nb:r:alice\nfile:///proj")).arg(5).arg("nb1").query_async(&mut conn).await.unwrap();
    // Every earlier server left its shared revision counter behind.
    let _: () = q("SET").arg(format!("{p}kvrev")).arg(3).query_async(&mut conn).await.unwrap();

    let store = RedisStore::open(&url, StoreConfig { redis_prefix: p.clone(), ..StoreConfig::default() }).await.unwrap();
    assert!(store.upgraded_from_earlier_layout());
    let notebook = RedisNotebook::new(store.connection(), store.prefix());
    assert_eq!(notebook.upgrade_layout().await.unwrap(), 1);

    let found = notebook.latest_for_root("alice", "file:///proj").await.unwrap().expect("found again by its root");
    assert_eq!((found.id.as_str(), found.title.as_str(), found.thought_count), ("nb1", "old", 1));
    let thoughts = notebook.thoughts("alice", "nb1").await.unwrap();
    assert_eq!(thoughts.len(), 1);
    assert_eq!(thoughts[0].input.thought, "first");
    let next: ThoughtInput = serde_json::from_value(serde_json::json!({"thought": "second", "thoughtNumber": 2,
        "totalThoughts": 2, "nextThoughtNeeded": false}))
    .unwrap();
    assert_eq!(notebook.append_thought("alice", "nb1", &next).await.unwrap().thought_history_length, 2);

    let keys: Vec<String> = q("KEYS").arg(format!("{p}*")).query_async(&mut conn).await.unwrap();
    assert!(!keys.iter().any(|k| k.starts_with(&format!("{p}nb:s:"))), "nothing left under the old names: {keys:?}");
    for key in keys {
        let _: i64 = q("DEL").arg(key).query_async(&mut conn).await.unwrap();
    }
}
