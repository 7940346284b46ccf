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

/// `n` thoughts of 1,000 bytes each (multi-byte characters among them) in
/// the session's notebook session; their texts.
async fn thousand_byte_thoughts(c: &Client, sid: &str, n: u64) -> Vec<String> {
    let mut texts = Vec::new();
    for i in 1..=n {
        let text = format!("{i:04} ") + &"é∑x".repeat(165) + "yyyyy";
        let args = json!({"thought": text, "thoughtNumber": i, "totalThoughts": n, "nextThoughtNeeded": i < n});
        let r = c.call(sid, i, "thought", args).await;
        assert_eq!(r["result"]["isError"], false, "{r}");
        texts.push(text);
    }
    texts
}

fn texts_of(result: &serde_json::Value) -> Vec<String> {
    result["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str().map(str::to_owned)).collect()
}

#[tokio::test]
async fn a_session_era_client_that_did_not_ask_for_pages_gets_a_100_kb_export_whole_and_one_that_did_gets_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, url) = start_binary(&dir.path().join("t.db"), &[]);
    let c = Client::new(&url);
    let sid = c.initialize().await;
    let thoughts = thousand_byte_thoughts(&c, &sid, 100).await;
    let args = json!({"operation": "export", "format": "markdown"});

    let whole = c.call(&sid, 1000, "session", args.clone()).await;
    assert!(whole["result"]["_meta"]["nextResumeToken"].is_null(), "no pages for a client that did not ask");
    let texts = texts_of(&whole["result"]);
    assert_eq!(texts.len(), 1, "one text block, not a 64 KiB cut");
    let document = &texts[0];
    assert!(document.len() > 100_000, "the whole export: {} bytes", document.len());
    let mut at = 0;
    for t in &thoughts {
        at += document[at..].find(t.as_str()).expect("every thought, in order") + t.len();
    }

    let pages = c.resume_loop(&sid, "session", &args).await;
    let data = pages.iter().filter(|r| r["result"]["_meta"]["dev.tether/pending"] != true).count();
    assert!(data >= 2, "a client that asked for pages gets 64 KiB pages: {data}");
    assert!(pages[..pages.len() - 1].iter().all(|r| r["result"]["_meta"]["nextResumeToken"].is_string()));
    assert_eq!(&joined_text(&pages), document, "the pages join into the same document");
    let _ = server.kill();
}

/// A cut result: the text it kept (joined) and its last block, the note.
fn kept_and_note(result: &serde_json::Value) -> (String, String) {
    let mut texts = texts_of(result);
    let note = texts.pop().unwrap_or_default();
    assert!(note.starts_with("[tether: this result is incomplete"), "the result ends with the note: {note}");
    (texts.concat(), note)
}

#[tokio::test]
async fn a_result_over_max_result_bytes_ends_with_a_note_of_what_was_left_out_and_how_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let (mut server, url) = start_binary(&db, &["--max-result-bytes", "20KiB"]);
    let c = Client::new(&url);
    let sid = c.initialize().await;
    thousand_byte_thoughts(&c, &sid, 40).await;
    let args = json!({"operation": "export", "format": "markdown"});

    // The session era: the first 20 KiB, then the note.
    let cut = c.call(&sid, 1000, "session", args.clone()).await;
    let (kept, note) = kept_and_note(&cut["result"]);
    assert!(kept.len() <= 20 * 1024 && kept.len() > 20 * 1024 - 4, "cut at the cap: {}", kept.len());
    let document = joined_text(&c.resume_loop(&sid, "session", &args).await);
    let left_out = document.len() - kept.len();
    assert!(document.starts_with(kept.as_str()));
    assert!(note.contains("incomplete") && note.contains("20480 bytes"), "{note}");
    assert!(note.contains(&format!("{left_out} bytes were left out")), "{left_out}: {note}");
    assert!(note.contains("dev.tether/paging") && note.contains("nextResumeToken"), "says how to get the rest: {note}");

    // A sessionless client gets the same note.
    let notebook = document.lines().find_map(|l| l.strip_prefix("- session: ")).expect("the export names its session");
    let export = json!({"name": "session", "arguments": {"operation": "export", "sessionId": notebook}});
    let (_, plain) = send_sessionless(&c, &sessionless_request(1, "tools/call", export.clone()), Some("session"), &[]).await;
    let (plain, plain_note) = kept_and_note(&plain["result"]);
    assert_eq!(plain, kept);
    assert!(plain_note.contains(&format!("{left_out} bytes were left out")), "{plain_note}");
    let _ = server.kill();
    let _ = server.wait();

    // A task's result too (--resume-wait 0s: every call of `session` becomes one).
    let (mut server, url) = start_binary(&db, &["--max-result-bytes", "20KiB", "--resume-wait", "0s"]);
    let c = Client::new(&url);
    let mut with_tasks = sessionless_meta();
    with_tasks[tether_wire::meta::CLIENT_CAPABILITIES] = json!({"extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}});
    let mut call = export;
    call["_meta"] = with_tasks.clone();
    let (_, created) = send_sessionless(&c, &sessionless_request(2, "tools/call", call), Some("session"), &[]).await;
    let task = created["result"]["taskId"].as_str().expect("a task").to_owned();
    let mut done = serde_json::Value::Null;
    for _ in 0..100 {
        let get = sessionless_request(3, "tasks/get", json!({"taskId": task, "_meta": with_tasks}));
        done = send_sessionless(&c, &get, Some(&task), &[]).await.1["result"].clone();
        if done["status"] != "working" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(done["status"], "completed", "{done}");
    let (from_task, task_note) = kept_and_note(&done["result"]);
    assert_eq!(from_task, kept);
    assert!(task_note.contains(&format!("{left_out} bytes were left out")), "{task_note}");
    let _ = server.kill();
}
