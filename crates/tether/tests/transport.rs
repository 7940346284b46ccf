//! The Streamable HTTP transport over real loopback HTTP, against the memory
//! and the SQLite store: sessions, streams, replay, routing, validation.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;
use tether_server::EngineConfig;
use tether_server::http::HttpConfig;

async fn each_backend<F, Fut>(app: AppKind, config: impl Into<Settings>, test: F)
where
    F: Fn(TestServer) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let config = config.into();
    for backend in BACKENDS {
        let server = TestServer::start(backend, app, config.clone()).await;
        eprintln!("-- backend {backend:?}");
        test(server).await;
    }
}

#[tokio::test]
async fn initialize_creates_a_session_and_negotiates_the_version() {
    each_backend(AppKind::Notebook, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        for (asked, expected) in [("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"), ("1999-01-01", "2025-11-25")] {
            let resp = c
                .post(
                    None,
                    &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let sid = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
            assert!(sid.len() >= 32 && sid.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{sid}");
            let events = SseReader::new(resp).all_events().await;
            let result = &events.last().unwrap().json()["result"];
            assert_eq!(result["protocolVersion"], expected);
            assert_eq!(result["capabilities"]["tools"]["listChanged"], false);
            assert_eq!(result["serverInfo"]["name"], "tether-notebook");
        }
        let sid = c.initialize().await;
        let other = c.initialize().await;
        assert_ne!(sid, other, "every initialize gets its own session");
        let pong = c.request(&sid, 7, "ping", json!({})).await;
        assert_eq!(pong.last().unwrap().json(), json!({"jsonrpc": "2.0", "id": 7, "result": {}}));
    })
    .await;
}

#[tokio::test]
async fn a_post_request_streams_priming_event_then_response_then_closes() {
    each_backend(AppKind::Notebook, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let resp = c
            .post(
                Some(&sid),
                &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "thought", "arguments": thought_args(1)}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let events = SseReader::new(resp).all_events().await;
        assert_eq!(events.len(), 2, "{events:?}");
        let prime = &events[0];
        assert!(prime.id.is_some() && prime.retry.is_some() && prime.data.is_empty(), "priming event: {prime:?}");
        let result = events[1].json();
        assert_eq!(result["id"], 1);
        assert_eq!(result["result"]["structuredContent"]["thoughtHistoryLength"], 1);
        assert_eq!(result["result"]["structuredContent"]["thoughtNumber"], 1);

        // A client whose connection dropped right after the priming event
        // resumes from it and gets the response, exactly once.
        let replay = SseReader::new(c.get(&sid, prime.id.as_deref()).send().await.unwrap()).all_events().await;
        let messages: Vec<_> = replay.iter().filter(|e| !e.data.is_empty()).collect();
        assert_eq!(messages.len(), 1, "{replay:?}");
        assert_eq!(messages[0].id, events[1].id);
        assert_eq!(messages[0].json(), result);
    })
    .await;
}

#[tokio::test]
async fn json_response_mode_answers_with_plain_json() {
    let config = Settings { engine: quick_config(), http: HttpConfig { json_response: true, ..HttpConfig::default() } };
    each_backend(AppKind::Notebook, config, |server| async move {
        let c = Client::new(&server.url);
        let resp = c
            .post(
                None,
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "application/json");
        let sid = resp.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["result"]["protocolVersion"], "2025-11-25");
        let resp = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["result"]["tools"][0]["name"], "thought");
        assert!(body["result"]["tools"][0]["outputSchema"].is_object());
    })
    .await;
}

#[tokio::test]
async fn notifications_and_responses_are_accepted_with_202() {
    each_backend(AppKind::Notebook, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let n =
            c.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})).send().await.unwrap();
        assert_eq!(n.status(), 202);
        assert!(n.text().await.unwrap().is_empty());
        let r = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": "x", "result": {}})).send().await.unwrap();
        assert_eq!(r.status(), 202);
    })
    .await;
}

#[tokio::test]
async fn standalone_stream_keeps_alive_and_delivers_messages_raised_while_nobody_listened() {
    each_backend(AppKind::Test, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        // Raised while no GET is open: kept in the standalone log.
        c.call(&sid, 1, "announce", json!({})).await;

        let mut standalone = SseReader::new(c.get(&sid, None).send().await.unwrap());
        let prime = standalone.next_event().await.unwrap();
        assert!(prime.id.is_some() && prime.retry.is_some(), "{prime:?}");
        let queued = standalone.next_event().await.unwrap().json();
        assert_eq!(queued["method"], "notifications/tools/list_changed", "delivered when a GET opens");

        // A server request of a call whose connection is gone reaches the GET,
        // and the answer POSTed back completes the call.
        let ask = c
            .post(
                Some(&sid),
                &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "ask", "arguments": {"delay_ms": 300}}}),
            )
            .send()
            .await
            .unwrap();
        let mut ask_stream = SseReader::new(ask);
        let ask_prime = ask_stream.next_event().await.unwrap();
        drop(ask_stream);
        let request = standalone.next_event().await.unwrap().json();
        assert_eq!(request["method"], "roots/list");
        let answer = c
            .post(Some(&sid), &json!({"jsonrpc": "2.0", "id": request["id"], "result": {"roots": [{"uri": "file:///w"}]}}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 202);
        let mut resumed = SseReader::new(c.get(&sid, ask_prime.id.as_deref()).send().await.unwrap());
        let done = resumed.all_events().await.into_iter().rfind(|e| !e.data.is_empty()).unwrap().json();
        assert_eq!(done["result"]["structuredContent"]["roots"][0]["uri"], "file:///w");

        // Keep-alive comments flow while idle.
        let block = standalone.next_block(Duration::from_secs(2)).await.unwrap();
        assert!(block.comment, "keep-alive comment expected, got {block:?}");

        // A new GET takes over: the old connection is closed, and nothing
        // already delivered is delivered again.
        let mut second = SseReader::new(c.get(&sid, None).send().await.unwrap());
        let _ = second.next_event().await.unwrap();
        let mut ended = false;
        for _ in 0..20 {
            if standalone.next_block(Duration::from_secs(2)).await.is_none() {
                ended = true;
                break;
            }
        }
        assert!(ended, "the older GET must be closed when a new one opens");
        let next = second.next_block(Duration::from_secs(2)).await.unwrap();
        assert!(next.comment, "no re-delivery, got {next:?}");
    })
    .await;
}

#[tokio::test]
async fn last_event_id_replays_exactly_the_rest_of_that_stream_after_the_request_finished() {
    each_backend(AppKind::Test, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let events = c.request(&sid, 1, "tools/call", json!({"name": "chatty", "arguments": {"steps": 4, "pause_ms": 5}})).await;
        assert_eq!(events.len(), 6, "prime, 4 notifications, response: {events:?}");
        // Another stream in the same session, to prove nothing leaks across.
        let other = c.request(&sid, 2, "tools/call", json!({"name": "echo", "arguments": {"x": 1}})).await;

        for from in 0..events.len() {
            assert_replays_the_rest(&c, &sid, &events, from).await;
        }
        let other_ids: Vec<_> = other.iter().filter_map(|e| e.id.clone()).collect();
        assert!(events.iter().all(|e| !other_ids.contains(e.id.as_ref().unwrap())), "event IDs are unique in the session");
    })
    .await;
}

#[tokio::test]
async fn a_replay_longer_than_one_store_page_arrives_whole_and_in_order() {
    // The pump reads the store in pages of 512 events, the next page while it
    // delivers one: every page boundary must join without a gap or a duplicate.
    each_backend(AppKind::Test, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let events =
            c.request(&sid, 1, "tools/call", json!({"name": "chatty", "arguments": {"steps": 1300, "pause_ms": 0}})).await;
        assert_eq!(events.len(), 1302, "prime, 1300 notifications, response");
        for from in [0, 1, 510, 511, 512, 1023, 1024, 1300] {
            assert_replays_the_rest(&c, &sid, &events, from).await;
        }
    })
    .await;
}

/// Resuming with the ID of `events[from]` delivers exactly the events after
/// it: same IDs, same data, in order, once.
async fn assert_replays_the_rest(c: &Client, sid: &str, events: &[SseEvent], from: usize) {
    let last = events[from].id.clone().unwrap();
    let mut replay = SseReader::new(c.get(sid, Some(&last)).send().await.unwrap());
    let replayed: Vec<SseEvent> = replay.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(replayed.len(), events.len() - from - 1, "replay after event {from}");
    assert!(replayed == events[from + 1..], "replay after event {from}: same IDs, same data, in order, once");
}

#[tokio::test]
async fn unknown_or_foreign_event_ids_are_refused() {
    each_backend(AppKind::Test, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let a = c.initialize().await;
        let b = c.initialize().await;
        let b_events = c.request(&b, 1, "tools/call", json!({"name": "echo", "arguments": {}})).await;
        let b_id = b_events[0].id.clone().unwrap();
        // B's own event works for B.
        assert_eq!(c.get(&b, Some(&b_id)).send().await.unwrap().status(), 200);
        for bad in [b_id.as_str(), "garbage", "r00.1", "", "g1.999999"] {
            if bad.is_empty() {
                continue;
            }
            let resp = c.get(&a, Some(bad)).send().await.unwrap();
            assert_eq!(resp.status(), 400, "Last-Event-ID {bad:?} presented with another session");
            let body: Value = resp.json().await.unwrap();
            assert!(body["error"]["message"].as_str().unwrap().contains("Last-Event-ID"), "{body}");
        }
    })
    .await;
}

#[tokio::test]
async fn related_messages_go_to_the_standalone_stream_when_the_request_connection_is_gone() {
    each_backend(AppKind::Test, quick_config(), |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let mut standalone = SseReader::new(c.get(&sid, None).send().await.unwrap());
        let _ = standalone.next_event().await.unwrap();

        let resp = c
            .post(
                Some(&sid),
                &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "chatty", "arguments": {"steps": 3, "pause_ms": 150}}}),
            )
            .send()
            .await
            .unwrap();
        let mut post_stream = SseReader::new(resp);
        let prime = post_stream.next_event().await.unwrap();
        drop(post_stream); // the tab refreshed
        let mut redirected = Vec::new();
        while redirected.len() < 3 {
            let e = standalone.next_event().await.expect("standalone stays open");
            let data = e.json()["params"]["data"].as_str().map(str::to_owned);
            redirected.push(data.unwrap_or_else(|| panic!("expected a redirected notification, got {e:?}")));
        }
        assert_eq!(redirected, vec!["step 0", "step 1", "step 2"]);
        // The response still waits in the request's own log.
        let mut resumed = SseReader::new(c.get(&sid, Some(prime.id.as_deref().unwrap())).send().await.unwrap());
        let events: Vec<_> = resumed.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
        let last = events.last().unwrap().json();
        assert_eq!(last["id"], 9);
        assert_eq!(last["result"]["structuredContent"]["steps"], 3);
        assert!(events.iter().all(|e| e.json()["method"].is_null()), "redirected notifications are not replayed twice");
    })
    .await;
}

#[tokio::test]
async fn sessions_expire_after_idle_ttl_and_end_on_delete() {
    let config = EngineConfig { session_ttl: Duration::from_millis(400), ..quick_config() };
    each_backend(AppKind::Notebook, config, |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        // Activity keeps it alive.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(c.request(&sid, 1, "ping", json!({})).await.len(), 2);
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        let resp = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).send().await.unwrap();
        assert_eq!(resp.status(), 404, "idle past the TTL");

        let sid = c.initialize().await;
        let del = c.http.delete(&c.url).header("mcp-session-id", &sid).send().await.unwrap();
        assert_eq!(del.status(), 200);
        let resp = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})).send().await.unwrap();
        assert_eq!(resp.status(), 404, "after DELETE");
        assert_eq!(c.get(&sid, None).send().await.unwrap().status(), 404);
    })
    .await;
}

#[tokio::test]
async fn a_restart_keeps_sessions_and_streams_without_a_new_initialize() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    let first = c.request(&sid, 1, "tools/call", json!({"name": "thought", "arguments": thought_args(1)})).await;
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, Backend::Sqlite, AppKind::Notebook, quick_config()).await;
    let c = Client::new(&server.url);
    let second = c.call(&sid, 2, "thought", thought_args(2)).await;
    assert_eq!(second["result"]["structuredContent"]["thoughtHistoryLength"], 2, "the notebook session continued");
    let mut replay = SseReader::new(c.get(&sid, first[0].id.as_deref()).send().await.unwrap());
    let replayed: Vec<_> = replay.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(replayed, first[1..].to_vec(), "a pre-restart stream replays after the restart");
}

#[tokio::test]
async fn a_request_cut_off_by_a_crash_ends_with_an_interrupted_error() {
    let server = TestServer::start(Backend::Sqlite, AppKind::Test, quick_config()).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    let resp = c
        .post(
            Some(&sid),
            &json!({"jsonrpc": "2.0", "id": 44, "method": "tools/call", "params": {"name": "hang", "arguments": {}}}),
        )
        .send()
        .await
        .unwrap();
    let mut stream = SseReader::new(resp);
    let prime = stream.next_event().await.unwrap();
    let dir = server.crash();
    drop(stream);

    let server = TestServer::start_in(dir, Backend::Sqlite, AppKind::Test, quick_config()).await;
    let c = Client::new(&server.url);
    let mut resumed = SseReader::new(c.get(&sid, prime.id.as_deref()).send().await.unwrap());
    let events: Vec<_> = resumed.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(events.len(), 1, "exactly one final response: {events:?}");
    let response = events[0].json();
    assert_eq!(response["id"], 44);
    assert_eq!(response["error"]["code"], -32603);
    assert!(response["error"]["message"].as_str().unwrap().contains("interrupted by a server restart"));
    // Asking again replays the same single response.
    let mut again = SseReader::new(c.get(&sid, prime.id.as_deref()).send().await.unwrap());
    let again: Vec<_> = again.all_events().await.into_iter().filter(|e| !e.data.is_empty()).collect();
    assert_eq!(again, events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_client_runtime_gives_up_on_is_cancelled_at_the_server() {
    let server = TestServer::start(Backend::Memory, AppKind::Test, quick_config()).await;
    let init =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cancel-test", "version": "0"}});
    let options = tether_client::ClientOptions::default();
    let (session, _) = tether_client::Session::connect(&server.url, options, init).await.unwrap();
    let hang = json!({"name": "hang", "arguments": {"tag": "dropped"}});
    // The caller stops waiting (a bridge's host cancelled, a select! lost the race): the future is dropped.
    let gave_up = tokio::time::timeout(Duration::from_millis(300), session.request("tools/call", Some(hang))).await;
    assert!(gave_up.is_err(), "hang answered before it was cancelled: {gave_up:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ENDED_HANGS.lock().iter().any(|t| t == "dropped") {
        assert!(std::time::Instant::now() < deadline, "the server's tool was never cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A short request timeout cancels the same way.
    let options = tether_client::ClientOptions { request_timeout: Duration::from_millis(300), ..Default::default() };
    let init =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "cancel-test", "version": "0"}});
    let (session, _) = tether_client::Session::connect(&server.url, options, init).await.unwrap();
    let err = session.request("tools/call", Some(json!({"name": "hang", "arguments": {"tag": "timed-out"}}))).await.unwrap_err();
    assert!(err.to_string().contains("within"), "{err}");
    while !ENDED_HANGS.lock().iter().any(|t| t == "timed-out") {
        assert!(std::time::Instant::now() < deadline, "the timed-out tool was never cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn bad_requests_get_the_right_status_and_a_readable_message() {
    let http = HttpConfig { max_body: 1024, allowed_origins: vec!["https://app.example".into()], ..HttpConfig::default() };
    let config = Settings { engine: quick_config(), http };
    each_backend(AppKind::Notebook, config, |server| async move {
        let c = Client::new(&server.url);
        let sid = c.initialize().await;
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
        let cases: Vec<(&str, reqwest::RequestBuilder, u16, Option<i64>)> = vec![
            ("foreign origin", c.post(Some(&sid), &ping).header("origin", "https://evil.example"), 403, None),
            ("null origin", c.post(Some(&sid), &ping).header("origin", "null"), 403, None),
            (
                "no event-stream in Accept",
                c.post_raw(
                    &[("content-type", "application/json"), ("accept", "application/json"), ("mcp-session-id", &sid)],
                    ping.to_string(),
                ),
                406,
                None,
            ),
            (
                "text/plain body",
                c.post_raw(
                    &[("content-type", "text/plain"), ("accept", ACCEPT_BOTH), ("mcp-session-id", &sid)],
                    ping.to_string(),
                ),
                415,
                None,
            ),
            (
                "too large",
                c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x".repeat(2000)}})),
                413,
                None,
            ),
            ("unsupported version", c.post(Some(&sid), &ping).header("mcp-protocol-version", "1999-01-01"), 400, None),
            ("malformed JSON", c.post(Some(&sid), &ping).body("{\"jsonrpc\":"), 400, Some(-32700)),
            ("wrong jsonrpc", c.post(Some(&sid), &json!({"jsonrpc": "1.0", "id": 1, "method": "ping"})), 400, Some(-32600)),
            ("batch", c.post(Some(&sid), &json!([ping])), 400, Some(-32600)),
            ("no session header", c.post(None, &ping), 400, None),
            ("unknown session", c.post(Some("0000feedface"), &ping), 404, None),
            (
                "non-ASCII session",
                c.post(None, &ping)
                    .header("mcp-session-id", reqwest::header::HeaderValue::from_bytes(b"\xc3\xa9t\xc3\xa9").unwrap()),
                400,
                None,
            ),
            ("GET without session", c.http.get(&c.url).header("accept", "text/event-stream"), 400, None),
            (
                "GET without event-stream",
                c.http.get(&c.url).header("accept", "application/json").header("mcp-session-id", &sid),
                406,
                None,
            ),
            ("PUT", c.http.put(&c.url), 405, None),
        ];
        for (name, req, status, code) in cases {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), status, "{name}");
            if status != 405 {
                let body: Value = resp.json().await.unwrap_or_else(|e| panic!("{name}: body is JSON: {e}"));
                let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("{name}: message in {body}"));
                assert!(message.len() > 10, "{name}: {message}");
                if let Some(code) = code {
                    assert_eq!(body["error"]["code"], code, "{name}");
                }
            }
        }
        // Allowed: localhost origins, configured origins, no version header (2025-03-26 assumed).
        for (n, origin) in ["http://localhost:3000", "http://127.0.0.1", "https://app.example"].into_iter().enumerate() {
            let ping = json!({"jsonrpc": "2.0", "id": 100 + n, "method": "ping"});
            let resp = c.post(Some(&sid), &ping).header("origin", origin).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{origin}");
        }
        let no_version = c
            .http
            .post(&c.url)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .header("mcp-session-id", &sid)
            .body(json!({"jsonrpc": "2.0", "id": 200, "method": "ping"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(no_version.status(), 200);
        // Protocol-level errors are answered on the stream.
        let unknown = c.request(&sid, 3, "tools/call", json!({"name": "nope", "arguments": {}})).await;
        assert_eq!(unknown.last().unwrap().json()["error"]["code"], -32602);
        let no_method = c.request(&sid, 4, "resources/list", json!({})).await;
        assert_eq!(no_method.last().unwrap().json()["error"]["code"], -32601);
        let bad_args = c
            .call(
                &sid,
                5,
                "thought",
                json!({"thought": "x", "thoughtNumber": 2, "totalThoughts": 3, "nextThoughtNeeded": true, "branchId": "b"}),
            )
            .await;
        assert_eq!(bad_args["result"]["isError"], true);
        assert!(bad_args["result"]["content"][0]["text"].as_str().unwrap().contains("branchFromThought"));
        // And the server is still healthy.
        assert_eq!(reqwest::get(format!("{}/healthz", server.base)).await.unwrap().status(), 200);
    })
    .await;
}

#[tokio::test]
async fn sessions_per_principal_are_bounded() {
    let config = EngineConfig { max_sessions_per_principal: 3, ..quick_config() };
    each_backend(AppKind::Notebook, config, |server| async move {
        let c = Client::new(&server.url);
        let mut sessions = Vec::new();
        for _ in 0..3 {
            sessions.push(c.initialize().await);
        }
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
        let refused = c.post(None, &init).send().await.unwrap();
        assert_eq!(refused.status(), 429);
        let body: Value = refused.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("limit 3"), "{body}");
        // Ending one makes room again.
        let del = c.http.delete(&c.url).header("mcp-session-id", &sessions[0]).send().await.unwrap();
        assert_eq!(del.status(), 200);
        assert_eq!(c.post(None, &init).send().await.unwrap().status(), 200);
    })
    .await;
}

#[tokio::test]
async fn requests_in_flight_per_session_are_bounded_and_their_ids_unique_over_http() {
    let config = EngineConfig { max_inflight_per_session: 2, ..quick_config() };
    let server = TestServer::start(Backend::Memory, AppKind::Test, config).await;
    let c = Client::new(&server.url);
    let sid = c.initialize().await;
    let hang = |id: u64| json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "hang", "arguments": {}}});
    // Two running requests (their streams stay open) fill the session's slots.
    let first = c.post(Some(&sid), &hang(1)).send().await.unwrap();
    let second = c.post(Some(&sid), &hang(2)).send().await.unwrap();
    assert_eq!((first.status(), second.status()), (reqwest::StatusCode::OK, reqwest::StatusCode::OK));
    let third = c.post(Some(&sid), &hang(3)).send().await.unwrap();
    assert_eq!(third.status(), 429);
    let body: Value = third.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("already runs 2 requests"), "{body}");
    // A running request's id cannot be reused.
    let reused = c.post(Some(&sid), &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).send().await.unwrap();
    assert_eq!(reused.status(), 400);
    let body: Value = reused.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32600);
    assert!(body["error"]["message"].as_str().unwrap().contains("already in use"), "{body}");
    // Cancelling one frees its slot.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    assert_eq!(c.post(Some(&sid), &cancel).send().await.unwrap().status(), 202);
    let mut freed = false;
    for n in 0..50 {
        let ping = json!({"jsonrpc": "2.0", "id": 100 + n, "method": "ping"});
        if c.post(Some(&sid), &ping).send().await.unwrap().status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "a cancelled request gives its slot back");
    drop((first, second));
    server.stop().await;
}

#[tokio::test]
async fn a_flood_of_roots_list_changed_is_refused_beyond_the_sessions_queue() {
    let config = EngineConfig { max_queued_notifications: 4, max_pending_client_requests: 2, ..quick_config() };
    let server = TestServer::start(Backend::Memory, AppKind::Notebook, config).await;
    let c = Client::new(&server.url);
    // The client declares roots and never answers roots/list: each
    // list_changed makes the notebook ask and wait for the answer.
    let sid = c.initialize_with(json!({"roots": {"listChanged": true}})).await;
    let note = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
    let mut statuses = Vec::new();
    for _ in 0..200 {
        statuses.push(c.post(Some(&sid), &note).send().await.unwrap().status().as_u16());
    }
    assert!(statuses.contains(&429), "some of 200 notifications at once are refused: {statuses:?}");
    assert!(statuses.iter().all(|s| *s == 202 || *s == 429), "{statuses:?}");
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    assert!(accepted <= 6, "at most the queue (4), the one being handled and the initialized one wait: {accepted} accepted");
    assert_eq!(reqwest::get(format!("{}/healthz", server.base)).await.unwrap().status(), 200);
    server.stop().await;
}
