//! The notebook over real HTTP: thoughts are durable and one MCP session
//! works in one notebook session, even under a burst of first calls.

mod support;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_first_thoughts_lands_in_one_notebook_session() {
    for backend in BACKENDS {
        let server = TestServer::start(backend, AppKind::Notebook, quick_config()).await;
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let mut calls = Vec::new();
        for i in 0..30u64 {
            let (c, sid) = (c.clone(), sid.clone());
            calls.push(tokio::spawn(async move { c.call(&sid, 10 + i, "thought", thought_args(i + 1)).await }));
        }
        let mut lengths = Vec::new();
        for call in calls {
            let result = call.await.unwrap();
            lengths.push(
                result["result"]["structuredContent"]["thoughtHistoryLength"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{backend:?}: {result}")),
            );
        }
        lengths.sort();
        assert_eq!(lengths, (1..=30).collect::<Vec<u64>>(), "{backend:?}: every thought in one history, none lost");
    }
}

#[tokio::test]
async fn thoughts_follow_sequential_thinking_semantics() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    let r = c
        .call(&sid, 1, "thought", json!({"thought": "a", "thoughtNumber": 4, "totalThoughts": 2, "nextThoughtNeeded": true}))
        .await;
    assert_eq!(r["result"]["structuredContent"]["totalThoughts"], 4, "total raised to the thought number");
    let r = c
        .call(
            &sid,
            2,
            "thought",
            json!({"thought": "b", "thoughtNumber": 5, "totalThoughts": 6, "nextThoughtNeeded": true,
            "branchFromThought": 4, "branchId": "alt"}),
        )
        .await;
    assert_eq!(r["result"]["structuredContent"]["branches"], json!(["alt"]));
    let r = c
        .call(
            &sid,
            3,
            "thought",
            json!({"thought": "c", "thoughtNumber": 6, "totalThoughts": 6, "nextThoughtNeeded": false,
            "isRevision": true, "revisesThought": 4}),
        )
        .await;
    let s = &r["result"]["structuredContent"];
    assert_eq!((s["thoughtHistoryLength"].as_u64(), s["nextThoughtNeeded"].as_bool()), (Some(3), Some(false)));
    assert_eq!(s["branches"], json!(["alt"]));
    // The text content carries the same JSON for clients without structured content.
    let text: serde_json::Value = serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_beyond_the_memory_cache_keep_their_notebook_context() {
    // A cache of 4 sessions and 12 sessions in use: most are dropped from
    // memory between calls and come back from the store with their context.
    for backend in BACKENDS {
        let config = tether_server::EngineConfig { session_cache: 4, ..quick_config() };
        let server = TestServer::start(backend, AppKind::Notebook, config).await;
        let c = Client::new(&server.url);
        let mut sessions = Vec::new();
        for _ in 0..12 {
            sessions.push(c.initialize().await);
        }
        for round in 1..=3u64 {
            for (i, sid) in sessions.iter().enumerate() {
                let result = c.call(sid, round * 100 + i as u64, "thought", thought_args(round)).await;
                assert_eq!(
                    structured(&result)["thoughtHistoryLength"],
                    json!(round),
                    "{backend:?}: session {i} round {round} continues its own notebook session: {result}"
                );
            }
        }
    }
}

/// A thought whose row cannot be stored is answered with an error, never with
/// a result that claims it (the response would otherwise share the row's
/// commit); the failed thought takes no number.
#[tokio::test]
async fn a_thought_that_cannot_be_stored_is_answered_with_an_error() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    let first = c.call(&sid, 1, "thought", thought_args(1)).await;
    assert_eq!(first["result"]["structuredContent"]["thoughtHistoryLength"], 1, "{first}");

    // The next thought's write fails in the server's writer (as a full disk would fail it).
    let file = rusqlite::Connection::open(server.dir.path().join("tether.db")).unwrap();
    file.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    file.execute_batch("CREATE TRIGGER fail_thoughts BEFORE INSERT ON nb_thoughts BEGIN SELECT RAISE(ABORT, 'injected'); END;")
        .unwrap();

    let failed = c.call(&sid, 2, "thought", thought_args(2)).await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
    assert!(failed["error"]["message"].as_str().is_some_and(|m| m.contains("not stored")), "{failed}");
    assert!(failed.get("result").is_none(), "{failed}");

    file.execute_batch("DROP TRIGGER fail_thoughts;").unwrap();
    drop(file);
    let next = c.call(&sid, 3, "thought", thought_args(2)).await;
    assert_eq!(next["result"]["structuredContent"]["thoughtHistoryLength"], 2, "the failed thought took no number: {next}");
}
