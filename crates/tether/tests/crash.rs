//! `kill -9` of the real binary in the middle of a burst of calls, then a
//! restart on the same SQLite file: the old session works without a new
//! initialize, every stream whose priming event a client saw ends with
//! exactly one final response, and everything a client saw replays.
//!
//! Uses the binary in `TETHER_BIN` (scripts/test points it at the release
//! build) or the one cargo built for this test.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Client, SseReader, start_binary, thought_args};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_burst_then_restart_resumes_everything() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tether.db");
    let (mut server, url) = start_binary(&db, &[]);
    let c = Client::new(&url);
    let sid = c.initialize().await;
    let mut standalone = SseReader::new(c.get(&sid, None).send().await.unwrap());
    let standalone_prime = standalone.next_event().await.unwrap();

    // A burst of calls; the server dies once a few have answered.
    let (answered_tx, mut answered) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut calls = Vec::new();
    for i in 0..40u64 {
        let c = c.clone();
        let sid = sid.clone();
        let answered_tx = answered_tx.clone();
        calls.push(tokio::spawn(async move {
            let resp = c
                .post(
                    Some(&sid),
                    &json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                    "params": {"name": "thought", "arguments": thought_args(i + 1)}}),
                )
                .send()
                .await;
            let Ok(resp) = resp else { return (i, Vec::new()) };
            let mut reader = SseReader::new(resp);
            let mut seen = Vec::new();
            while let Some(e) = reader.next_block(Duration::from_secs(10)).await {
                if !e.comment {
                    if !e.data.is_empty() {
                        let _ = answered_tx.send(i);
                    }
                    seen.push(e);
                }
            }
            (i, seen)
        }));
    }
    for _ in 0..8 {
        answered.recv().await.expect("calls answer before the kill");
    }
    server.kill().unwrap(); // SIGKILL, mid-burst
    server.wait().unwrap();
    let mut seen_by_call = Vec::new();
    for call in calls {
        seen_by_call.push(call.await.unwrap());
    }
    drop(standalone);

    let (mut server, url) = start_binary(&db, &[]);
    let c = Client::new(&url);
    // The old session, no initialize.
    assert_eq!(c.request(&sid, 1, "ping", json!({})).await.len(), 2, "old session answers after restart");

    let mut completed = 0;
    let mut interrupted = 0;
    for (i, seen) in &seen_by_call {
        let Some(prime) = seen.first() else { continue };
        let prime_id = prime.id.clone().expect("priming event has an ID");
        let mut replay = SseReader::new(c.get(&sid, Some(&prime_id)).send().await.unwrap());
        let replayed: Vec<_> = replay.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
        assert_eq!(replayed.len(), 1, "call {i}: exactly one final response, got {replayed:?}");
        let response = replayed[0].json();
        assert_eq!(response["id"], 100 + i, "call {i}");
        // What the client saw before the kill is what replays.
        let seen_messages: Vec<_> = seen.iter().filter(|e| !e.data.is_empty()).cloned().collect();
        if let Some(before) = seen_messages.first() {
            assert_eq!(before, &replayed[0], "call {i}: replay equals what was seen");
        }
        if response["result"].is_object() {
            completed += 1;
        } else {
            assert_eq!(response["error"]["code"], -32603, "call {i}: {response}");
            assert!(response["error"]["message"].as_str().unwrap().contains("interrupted"));
            interrupted += 1;
        }
    }
    assert!(completed > 0, "some calls completed before the kill");
    eprintln!("completed {completed}, interrupted {interrupted}");

    // The notebook kept exactly the completed thoughts, and continues.
    let next = c.call(&sid, 999, "thought", thought_args(41)).await;
    let history = next["result"]["structuredContent"]["thoughtHistoryLength"].as_u64().unwrap();
    assert!(history as usize > completed, "history {history} includes every completed thought ({completed})");

    // The standalone stream resumes from its pre-crash event ID.
    let resumed = c.get(&sid, standalone_prime.id.as_deref()).send().await.unwrap();
    assert_eq!(resumed.status(), 200);
    server.kill().unwrap();
    server.wait().unwrap();
}
