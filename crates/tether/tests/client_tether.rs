//! The client runtime (`tether-client`) against tether itself, a real
//! `tether serve` process on loopback: the session API (initialize result
//! with `_meta`, server requests delivered and answered, DELETE), a
//! response stream cut by a crash and resumed with `Last-Event-ID`, the
//! pool's session detection and recovery, and the resume loop joining a
//! paged notebook export back into exactly the unpaged document.

mod client_support;

use std::sync::Arc;
use std::time::Duration;

use client_support::*;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_client::{
    CallProgress, ClientError, ClientOptions, PeerMessage, Pool, Protocol, RequiresSession, ServerSpec, Session,
};
use tether_wire::{RpcError, code};

fn init_params(meta: Option<Value>) -> Value {
    let mut p = json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}}, "clientInfo": {"name": "client-tests", "version": "0"}});
    if let Some(m) = meta {
        p["_meta"] = m;
    }
    p
}

fn text(result: &Value) -> String {
    result["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_initializes_answers_server_requests_resumes_by_token_and_deletes() {
    let server = Server::start(&[]);
    let (session, result) = Session::connect(&server.url(), ClientOptions::default(), init_params(None)).await.unwrap();
    assert_eq!(session.protocol_version(), "2025-11-25");
    let sid = session.session_id().expect("tether gives a session ID");
    let token =
        result["_meta"]["dev.tether/sessionResumeToken"].as_str().expect("the initialize result keeps its _meta").to_owned();

    // The notebook asks for roots on the standalone stream after `initialized`.
    let mut incoming = session.take_incoming().unwrap();
    let asked = tokio::time::timeout(Duration::from_secs(10), incoming.recv()).await.expect("roots/list arrives").unwrap();
    let PeerMessage::Request { id, method, .. } = asked else { panic!("expected a request, got {asked:?}") };
    assert_eq!(method, "roots/list");
    session.respond(id, Ok(json!({"roots": [{"uri": "file:///proj", "name": "proj"}]}))).await.unwrap();
    let mut roots = Value::Null;
    for _ in 0..50 {
        let r =
            session.request("tools/call", Some(json!({"name": "init", "arguments": {"operation": "list_roots"}}))).await.unwrap();
        roots = r["structuredContent"]["roots"].clone();
        if roots.as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(roots, json!([{"uri": "file:///proj", "name": "proj"}]), "the answer reached the server");

    // initialize with the caller's `_meta` (a session resume token) is sent as given.
    let (again, result) = Session::connect(
        &server.url(),
        ClientOptions::default(),
        init_params(Some(json!({"dev.tether/sessionResumeToken": token}))),
    )
    .await
    .unwrap();
    assert_eq!(result["_meta"]["dev.tether/resumed"], true, "{result}");
    assert_eq!(again.session_id().as_deref(), Some(sid.as_str()));

    // close sends DELETE: the session is gone for everyone.
    session.close().await;
    let err = again.request("tools/list", None).await.unwrap_err();
    assert!(matches!(err, ClientError::SessionNotFound), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_stream_cut_by_a_crash_is_resumed_with_last_event_id() {
    let mut server = Server::start(&[]);
    // Declares roots but never answers: the `thought` call waits ~3 s for
    // them on its own stream, long enough to crash the server under it.
    let (session, _) = Session::connect(&server.url(), ClientOptions::default(), init_params(None)).await.unwrap();
    let caller = session.clone();
    let call = tokio::spawn(async move {
        caller
            .request("tools/call", Some(json!({"name": "thought", "arguments": {"thought": "t", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": false}})))
            .await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!call.is_finished(), "the call is still waiting for roots");
    server.crash_and_restart(None);
    let outcome = tokio::time::timeout(Duration::from_secs(60), call).await.expect("an answer").expect("task");
    // Only the resumed stream (GET + Last-Event-ID) carries this answer:
    // the restarted server closes the cut-off request with -32603.
    match outcome {
        Err(ClientError::Rpc(RpcError { code: code::INTERNAL_ERROR, message, .. })) => {
            assert!(message.contains("interrupted"), "{message}")
        }
        other => panic!("expected the interrupted error through the resumed stream, got {other:?}"),
    }
    // The session itself survived the crash (tether's store).
    session.request("tools/list", None).await.expect("same session after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_detects_that_tether_needs_a_session_and_recovers_a_forgotten_one() {
    let server = Server::start(&[]);
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session);
    let tools = pool.list_tools(&spec).await.unwrap();
    assert!(tools.iter().any(|t| t["name"] == "thought"));
    let sid = pool.session_id(&spec).await.expect("auto initialized after tether's 400");

    // The server forgets the session (here: someone DELETEs it).
    let deleted = reqwest::Client::new().delete(server.url()).header("mcp-session-id", &sid).send().await.unwrap();
    assert!(deleted.status().is_success());
    let r =
        pool.call_tool(&spec, "session", json!({"operation": "list"}), None).await.expect("recovered through a new initialize");
    assert_eq!(r["isError"], false);
    let new_sid = pool.session_id(&spec).await.unwrap();
    assert_ne!(new_sid, sid);

    let never = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Never);
    let err = pool.list_tools(&never).await.unwrap_err();
    assert!(matches!(err, ClientError::Config(ref m) if m.contains("requires_session")), "{err:?}");
    pool.shutdown().await;
    let after = reqwest::Client::new()
        .post(server.url())
        .header("mcp-session-id", &new_sid)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 404, "shutdown DELETEd the session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resume_loop_joins_a_paged_export_into_exactly_the_unpaged_document() {
    let mut server = Server::start(&["--result-chunk-bytes", "2KiB", "--resume-wait", "100ms"]);
    let pool = Pool::default();
    let spec = ServerSpec::new(server.url()).protocol(Protocol::Session).requires_session(RequiresSession::Always);
    let mut thoughts = Vec::new();
    for n in 1..=40u64 {
        let t = format!("{n:03} ") + &"é∑x".repeat(80) + " end";
        let r = pool
            .call_tool(
                &spec,
                "thought",
                json!({"thought": t, "thoughtNumber": n, "totalThoughts": 40, "nextThoughtNeeded": n < 40}),
                None,
            )
            .await
            .unwrap();
        assert_eq!(r["isError"], false, "{r}");
        thoughts.push(t);
    }
    let rounds = Arc::new(Mutex::new(Vec::new()));
    let seen = rounds.clone();
    let progress: tether_client::ProgressHandler = Arc::new(move |p| {
        if let CallProgress::Round(r) = p {
            seen.lock().push(r);
        }
    });
    let paged =
        pool.call_tool(&spec, "session", json!({"operation": "export", "format": "markdown"}), Some(progress)).await.unwrap();
    let rounds = rounds.lock().clone();
    let chunks = rounds.iter().filter(|r| !r.pending).count();
    assert!(chunks >= 10, "about 20 KB in 2 KiB chunks: {} data rounds of {}", chunks, rounds.len());
    assert!(rounds.last().is_some_and(|r| !r.more));
    assert!(paged["_meta"]["nextResumeToken"].is_null(), "the final result has no nextResumeToken");
    let document = text(&paged);
    let mut at = 0;
    for t in &thoughts {
        at += document[at..].find(t.as_str()).expect("every thought, in order, nothing lost") + t.len();
    }
    let notebook =
        document.lines().find_map(|l| l.strip_prefix("- session: ")).expect("the export names its notebook session").to_owned();

    // The CLI prints the same joined document.
    let home = tempfile::tempdir().unwrap();
    let args = json!({"operation": "export", "format": "markdown", "sessionId": notebook}).to_string();
    let out = tether(&["call", &server.url(), "session", "--json", &args], &[], home.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected_cli = if document.ends_with('\n') { document.clone() } else { format!("{document}\n") };
    assert_eq!(stdout(&out), expected_cli);
    assert_eq!(stderr(&out), "", "no progress bar when stderr is not a terminal");

    // One unpaged export of the same notebook (default 64 KiB chunks) is the same text.
    pool.shutdown().await;
    server.crash_and_restart(Some(&[]));
    let pool = Pool::default();
    let single = Arc::new(Mutex::new(0usize));
    let count = single.clone();
    let progress: tether_client::ProgressHandler = Arc::new(move |p| {
        if let CallProgress::Round(_) = p {
            *count.lock() += 1;
        }
    });
    let unpaged = pool
        .call_tool(&spec, "session", json!({"operation": "export", "format": "markdown", "sessionId": notebook}), Some(progress))
        .await
        .unwrap();
    assert_eq!(*single.lock(), 1, "one round without paging");
    assert_eq!(text(&unpaged), document, "paged and joined == unpaged, byte for byte");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_speaks_2026_07_28_where_offered_answering_roots_rounds_and_following_a_task() {
    let server = Server::start(&["--resume-wait", "0s"]);
    let roots: tether_client::RootsProvider = Arc::new(|| vec![json!({"uri": "file:///pool/project", "name": "project"})]);
    let pool = Pool::new(tether_client::PoolOptions { roots, ..Default::default() });
    let spec = ServerSpec::new(server.url());
    let tools = pool.list_tools(&spec).await.unwrap();
    assert!(tools.iter().any(|t| t["name"] == "thought"));
    assert_eq!(pool.session_id(&spec).await, None, "auto found server/discover: no session");
    let args = json!({"thought": "x", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": false});
    let first = pool.call_tool(&spec, "thought", args.clone(), None).await.unwrap();
    assert_eq!(first["resultType"], "complete", "{first}");
    let notebook = first["_meta"]["dev.tether/notebookSession"].clone();
    assert!(notebook.is_string(), "{first}");
    // The roots round was answered from the pool's roots: the notebook
    // session is that root's, found again by a second pool.
    let other = Pool::new(tether_client::PoolOptions {
        roots: Arc::new(|| vec![json!({"uri": "file:///pool/project"})]),
        ..Default::default()
    });
    let again = other.call_tool(&spec, "thought", args, None).await.unwrap();
    assert_eq!(again["_meta"]["dev.tether/notebookSession"], notebook, "{again}");
    assert_eq!(again["structuredContent"]["thoughtHistoryLength"], 2, "{again}");
    // `session` answers the pool in pages (it asks for them; --resume-wait 0s
    // makes the first one pending): followed to its result.
    let listed = pool.call_tool(&spec, "session", json!({"operation": "list"}), None).await.unwrap();
    assert!(text(&listed).contains("file:///pool/project"), "{listed}");
    let legacy = pool.call_tool(&spec.clone().protocol(Protocol::Session), "session", json!({"operation": "list"}), None).await;
    assert!(legacy.is_ok(), "the same pool still speaks the session era when told to: {legacy:?}");
}
