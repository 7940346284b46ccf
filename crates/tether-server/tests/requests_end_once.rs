//! Every request ends exactly once and everything a peer can fill is
//! bounded: panics in the application, notification floods, pending
//! server-to-client requests, duplicate and excess requests, two resumes of
//! an orphaned operation, and shutdown with requests in flight. Driven
//! through the engine's own API (the HTTP mapping of each outcome is tested
//! in crates/tether/tests), on the memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tether_server::engine::{EngineError, Frame, PostOutcome, Reply, Session};
use tether_server::rmcp_model::{CallToolResult, ContentBlock, Implementation, Tool};
use tether_server::{
    EndReason, Engine, EngineConfig, OperationCtx, OperationSpec, RequestCtx, RpcError, SessionCtx, SessionEnd, ToolApp,
    ToolRouter,
};
use tether_store::memory::MemoryStore;
use tether_store::{EventKind, Store, StoreConfig};
use tether_wire::Inbound;

/// What the test application saw.
#[derive(Default)]
struct Seen {
    /// `seq` of every `test/seq` notification, in the order handled.
    notifications: Mutex<Vec<u64>>,
    /// How often the `count` operation's work was started.
    operation_starts: AtomicUsize,
    ended: Mutex<Vec<(String, EndReason, Option<usize>)>>,
}

/// Per-session in-memory state, to check it reaches `on_session_end`.
#[derive(Default)]
struct Local {
    touched: AtomicUsize,
}

struct TestTools(Arc<Seen>);

#[async_trait::async_trait]
impl ToolApp for TestTools {
    fn server_info(&self) -> Implementation {
        Implementation::new("requests-end-once", "0")
    }

    fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(Map::new());
        ["echo", "panic", "sleep", "hang", "ask_many", "touch_local", "count"]
            .into_iter()
            .map(|n| Tool::new(n, n, schema.clone()))
            .collect()
    }

    fn operation_spec(&self, tool: &str) -> Option<OperationSpec> {
        (tool == "count").then_some(OperationSpec { restartable: true, expected_duration_ms: 100 })
    }

    async fn run_operation(&self, ctx: OperationCtx, _tool: &str, _args: Map<String, Value>) -> Result<(), RpcError> {
        self.0.operation_starts.fetch_add(1, Ordering::SeqCst);
        for i in ctx.resume_from()..3 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            ctx.push(CallToolResult::success(vec![ContentBlock::text(format!("{i}"))])).await?;
        }
        Ok(())
    }

    async fn call_tool(&self, ctx: RequestCtx, name: &str, args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        match name {
            "echo" => Ok(CallToolResult::structured(Value::Object(args))),
            "panic" => panic!("the test tool panics as asked"),
            "sleep" => {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(CallToolResult::structured(json!({"slept": ms})))
            }
            "hang" => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            "ask_many" => {
                let n = args.get("n").and_then(Value::as_u64).unwrap_or(1) as usize;
                let asks = (0..n).map(|_| ctx.request_client("roots/list", None, Duration::from_millis(300)));
                let answers = futures::future::join_all(asks).await;
                let refused_at_once: Vec<String> = answers
                    .into_iter()
                    .filter_map(Result::err)
                    .map(|e| e.message)
                    .filter(|m| m.contains("already waiting"))
                    .collect();
                Ok(CallToolResult::structured(json!({"refused": refused_at_once.len()})))
            }
            "touch_local" => {
                ctx.require_session()?.local::<Local>().touched.fetch_add(1, Ordering::SeqCst);
                Ok(CallToolResult::structured(json!({})))
            }
            other => Err(RpcError::invalid_params(format!("unknown tool {other}"))),
        }
    }

    async fn on_notification(&self, _ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        if method == "test/seq" {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let seq = params.and_then(|p| p.get("seq").and_then(Value::as_u64)).unwrap_or(0);
            self.0.notifications.lock().push(seq);
        }
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        let touched = ended.local::<Local>().map(|l| l.touched.load(Ordering::SeqCst));
        self.0.ended.lock().push((ended.session_id.clone(), ended.reason, touched));
    }
}

struct Harness {
    engine: Engine,
    store: Arc<dyn Store>,
    seen: Arc<Seen>,
}

fn config() -> EngineConfig {
    EngineConfig { resume_wait: Duration::from_millis(50), drain_timeout: Duration::from_millis(600), ..EngineConfig::default() }
}

fn harness_on(store: Arc<dyn Store>, config: EngineConfig) -> Harness {
    let seen = Arc::new(Seen::default());
    let engine = Engine::new(store.clone(), Arc::new(ToolRouter::new(TestTools(seen.clone()))), config);
    Harness { engine, store, seen }
}

fn harness(config: EngineConfig) -> Harness {
    harness_on(Arc::new(MemoryStore::new(StoreConfig::default())), config)
}

/// The JSON-RPC message(s) a POST outcome carries, waiting for a streamed one to end.
async fn messages(outcome: PostOutcome) -> (Option<String>, Vec<Value>) {
    let frames = match outcome {
        PostOutcome::Complete { frames, .. } => frames,
        PostOutcome::Stream { mut frames, .. } => {
            let mut all = Vec::new();
            while let Some(f) = tokio::time::timeout(Duration::from_secs(10), frames.recv()).await.expect("the stream ends") {
                all.push(f);
            }
            all
        }
        PostOutcome::Sessionless { body, .. } => return (None, vec![serde_json::from_slice(&body).expect("JSON body")]),
        _ => panic!("unexpected outcome"),
    };
    let mut stream = None;
    let mut out = Vec::new();
    for f in frames {
        match f {
            Frame::Prime { id } => stream = Some(id.stream.clone()),
            Frame::Event { data, .. } => out.push(serde_json::from_slice(&data).expect("JSON event")),
            _ => {}
        }
    }
    (stream, out)
}

fn session_id(outcome: &PostOutcome) -> String {
    match outcome {
        PostOutcome::Complete { session_id, .. } | PostOutcome::Stream { session_id, .. } => session_id.clone(),
        _ => panic!("no session"),
    }
}

async fn open_session(h: &Harness) -> Arc<Session> {
    let params =
        json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}}, "clientInfo": {"name": "t", "version": "0"}});
    let outcome =
        h.engine.initialize("", "p", json!(0), params.as_object().cloned(), Reply::Stream, None).await.expect("initialize");
    let id = session_id(&outcome);
    h.engine.session("", &id, "p").await.expect("session")
}

fn call(id: u64, tool: &str, arguments: Value) -> Inbound {
    Inbound::Request {
        id: json!(id),
        method: "tools/call".into(),
        params: json!({"name": tool, "arguments": arguments}).as_object().cloned(),
    }
}

#[tokio::test]
async fn a_panicking_tool_ends_its_request_with_an_internal_error_that_replays_and_frees_its_slot() {
    let h = harness(EngineConfig { max_inflight_per_session: 2, ..config() });
    let session = open_session(&h).await;
    for n in 0..5 {
        let outcome = h.engine.post(session.clone(), call(n, "panic", json!({})), Reply::Stream, None).await.expect("accepted");
        let (stream, answers) = messages(outcome).await;
        assert_eq!(answers.len(), 1, "exactly one answer");
        assert_eq!(answers[0]["id"], json!(n));
        assert_eq!(answers[0]["error"]["code"], json!(-32603));
        // Stored: what the client saw replays from the store.
        let stored = h.store.read_after(&session.id, &stream.expect("a stream"), 0, 10).await.expect("read");
        assert_eq!(stored.last().map(|e| e.kind), Some(EventKind::Final));
        let replayed: Value = serde_json::from_slice(&stored.last().expect("final").payload).expect("json");
        assert_eq!(replayed, answers[0]);
    }
    // Five panics with a limit of two in flight: every slot was freed.
    let (_, answers) =
        messages(h.engine.post(session.clone(), call(9, "echo", json!({"ok": 1})), Reply::Stream, None).await.expect("accepted"))
            .await;
    assert_eq!(answers[0]["result"]["structuredContent"], json!({"ok": 1}), "the session is still usable");
}

#[tokio::test]
async fn the_in_flight_limit_refuses_the_excess_and_a_running_id_cannot_be_reused() {
    let h = harness(EngineConfig { max_inflight_per_session: 2, ..config() });
    let session = open_session(&h).await;
    let _a = h.engine.post(session.clone(), call(1, "hang", json!({})), Reply::Stream, None).await.expect("first");
    let _b = h.engine.post(session.clone(), call(2, "hang", json!({})), Reply::Stream, None).await.expect("second");
    match h.engine.post(session.clone(), call(3, "echo", json!({})), Reply::Stream, None).await {
        Err(EngineError::TooMany(message)) => assert!(message.contains("already runs 2 requests"), "{message}"),
        Err(e) => panic!("expected TooMany, got {e}"),
        Ok(_) => panic!("expected TooMany, got an answer"),
    }
    match h.engine.post(session.clone(), call(1, "echo", json!({})), Reply::Stream, None).await {
        Err(EngineError::BadRequest { code, message, .. }) => {
            assert_eq!(code, -32600);
            assert!(message.contains("already in use"), "{message}");
        }
        Err(e) => panic!("expected BadRequest, got {e}"),
        Ok(_) => panic!("expected BadRequest, got an answer"),
    }
}

#[tokio::test]
async fn client_notifications_are_handled_in_order_through_a_bounded_queue() {
    let h = harness(EngineConfig { max_queued_notifications: 8, ..config() });
    let session = open_session(&h).await;
    let mut accepted = Vec::new();
    let mut refused = 0;
    for seq in 0..100u64 {
        let note = Inbound::Notification { method: "test/seq".into(), params: json!({"seq": seq}).as_object().cloned() };
        match h.engine.post(session.clone(), note, Reply::Stream, None).await {
            Ok(PostOutcome::Accepted) => accepted.push(seq),
            Err(EngineError::TooMany(_)) => refused += 1,
            Err(e) => panic!("unexpected refusal: {e}"),
            Ok(_) => panic!("a notification is answered with Accepted"),
        }
    }
    assert!(refused > 0, "a flood beyond the queue's bound is refused");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.seen.notifications.lock().len() < accepted.len() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*h.seen.notifications.lock(), accepted, "every accepted notification handled once, in order");
}

#[tokio::test]
async fn server_to_client_requests_waiting_per_session_are_bounded() {
    let h = harness(EngineConfig { max_pending_client_requests: 4, ..config() });
    let session = open_session(&h).await;
    let (_, answers) = messages(
        h.engine.post(session.clone(), call(1, "ask_many", json!({"n": 10})), Reply::Stream, None).await.expect("accepted"),
    )
    .await;
    let answer = answers.last().expect("an answer");
    assert_eq!(answer["result"]["structuredContent"]["refused"], json!(6), "{answer}");
    assert!(session.pending_client_requests() == 0, "nothing stays pending after the waits end");
}

/// A store shared by replicas: the real Redis of the test command, under a
/// prefix of its own.
async fn shared_store() -> Arc<dyn Store> {
    let url = std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let prefix = format!("tether-test:{}:{}:", std::process::id(), rand::random::<u32>());
    let config = StoreConfig { redis_prefix: prefix, ..StoreConfig::default() };
    let store = tether_store::redis::RedisStore::open(&url, config)
        .await
        .unwrap_or_else(|e| panic!("Redis is needed and not reachable at {url}: {e}; run scripts/test (it starts Redis)"));
    Arc::new(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_resuming_an_orphaned_operation_restart_its_work_once() {
    let store = shared_store().await;
    let replica = || EngineConfig { replica_lease: Duration::from_millis(300), ..config() };
    // The first replica starts the operation and stops before it finishes
    // (its work is left running in the store, its lease released).
    let first = harness_on(store.clone(), replica());
    let session = open_session(&first).await;
    // A client that pages: the first answer comes after `resume_wait`, with a token.
    let paged = json!({"name": "count", "arguments": {}, "_meta": {"dev.tether/paging": true}});
    let first_call = Inbound::Request { id: json!(1), method: "tools/call".into(), params: paged.as_object().cloned() };
    let (_, answers) =
        messages(first.engine.post(session.clone(), first_call, Reply::Stream, None).await.expect("accepted")).await;
    let token = answers[0]["result"]["_meta"]["nextResumeToken"].as_str().expect("a pending answer with a token").to_owned();
    first.engine.shutdown().await;

    // Two other replicas see it orphaned; a resume reaches each at once.
    let (b, c) = (harness_on(store.clone(), replica()), harness_on(store, replica()));
    let resume = |h: &Harness, id: u64| {
        let (engine, token, session) = (h.engine.clone(), token.clone(), session.id.clone());
        async move {
            let session = engine.session("", &session, "p").await.expect("rehydrated");
            let params = json!({"name": "count", "arguments": {}, "_meta": {"resumeToken": token}});
            let request = Inbound::Request { id: json!(id), method: "tools/call".into(), params: params.as_object().cloned() };
            messages(engine.post(session, request, Reply::Stream, None).await.expect("accepted")).await.1
        }
    };
    let (from_b, from_c) = tokio::join!(resume(&b, 2), resume(&c, 3));
    assert!(from_b[0].get("result").is_some() && from_c[0].get("result").is_some(), "{from_b:?} {from_c:?}");
    let starts = b.seen.operation_starts.load(Ordering::SeqCst) + c.seen.operation_starts.load(Ordering::SeqCst);
    assert_eq!(starts, 1, "the orphaned work is restarted by one replica, once");
    b.engine.shutdown().await;
    c.engine.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_requests_in_flight_finish_and_ends_the_rest_as_interrupted_once() {
    let h = harness(config());
    let session = open_session(&h).await;
    let quick =
        h.engine.post(session.clone(), call(1, "sleep", json!({"ms": 200})), Reply::Stream, None).await.expect("accepted");
    let stuck = h.engine.post(session.clone(), call(2, "hang", json!({})), Reply::Stream, None).await.expect("accepted");
    // The client sees each request's priming event, then goes away.
    let primed = |outcome: PostOutcome| async move {
        let PostOutcome::Stream { mut frames, .. } = outcome else { panic!("a slow request streams") };
        match frames.recv().await {
            Some(Frame::Prime { id }) => id.stream,
            other => panic!("expected the priming event, got {other:?}"),
        }
    };
    let quick_stream = primed(quick).await;
    let stuck_stream = primed(stuck).await;

    // Both calls at once: the drain runs once and both wait for it.
    tokio::join!(h.engine.shutdown(), h.engine.shutdown());

    let finals = |stream: String| {
        let (store, session) = (h.store.clone(), session.id.clone());
        async move {
            let events = store.read_after(&session, &stream, 0, 100).await.expect("read");
            events
                .into_iter()
                .filter(|e| e.kind == EventKind::Final)
                .map(|e| serde_json::from_slice::<Value>(&e.payload).expect("json"))
                .collect::<Vec<_>>()
        }
    };
    let quick_finals = finals(quick_stream).await;
    assert_eq!(quick_finals.len(), 1);
    assert_eq!(quick_finals[0]["result"]["structuredContent"]["slept"], json!(200), "finished within the drain");
    let stuck_finals = finals(stuck_stream).await;
    assert_eq!(stuck_finals.len(), 1, "exactly one final response: {stuck_finals:?}");
    assert_eq!(stuck_finals[0]["error"]["code"], json!(-32603));
    assert!(stuck_finals[0]["error"]["message"].as_str().unwrap_or("").contains("interrupted"));

    match h.engine.post(session.clone(), call(3, "echo", json!({})), Reply::Stream, None).await {
        Err(EngineError::ShuttingDown) => {}
        _ => panic!("no new work after shutdown"),
    }
}

#[tokio::test]
async fn the_application_hears_when_a_session_ends_with_its_local_state() {
    let h = harness(config());
    let session = open_session(&h).await;
    let _ =
        messages(h.engine.post(session.clone(), call(1, "touch_local", json!({})), Reply::Stream, None).await.expect("accepted"))
            .await;
    let id = session.id.clone();
    h.engine.delete(session).await.expect("deleted");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.seen.ended.lock().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(*h.seen.ended.lock(), vec![(id, EndReason::Deleted, Some(1))]);
}

/// An application that refuses every client.
struct Refusing;

#[async_trait::async_trait]
impl tether_server::McpApp for Refusing {
    async fn initialize(&self, _init: &mut tether_server::Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        Err(RpcError::invalid_params("this server only talks to clients that declare roots"))
    }
    async fn handle_request(
        &self,
        _ctx: RequestCtx,
        method: &str,
        _params: Option<Map<String, Value>>,
    ) -> Result<tether_server::RawResult, RpcError> {
        Err(RpcError::method_not_found(method))
    }
}

#[tokio::test]
async fn a_refused_initialize_answers_the_error_and_leaves_no_session() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreConfig::default()));
    let engine = Engine::new(store.clone(), Arc::new(Refusing), config());
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}});
    let outcome = engine.initialize("", "p", json!(7), params.as_object().cloned(), Reply::Stream, None).await.expect("answered");
    let (_, answers) = messages(outcome).await;
    assert_eq!(
        answers,
        vec![
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "this server only talks to clients that declare roots"}})
        ]
    );
    assert_eq!(store.count_sessions("p", tether_store::now_ms()).await.expect("count"), 0, "no session stored");
    assert_eq!(engine.cached_sessions(), 0, "no session held");
}

#[tokio::test]
async fn the_application_hears_of_expiry_and_of_eviction_from_memory() {
    let h = harness(EngineConfig { session_ttl: Duration::from_millis(200), session_cache: 1, ..config() });
    let expiring = open_session(&h).await;
    let id = expiring.id.clone();
    drop(expiring);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(h.engine.session("", &id, "p").await, Err(EngineError::SessionNotFound)));
    // With room for one session in memory, a second one pushes the idle first one out.
    let first = open_session(&h).await;
    let first_id = first.id.clone();
    drop(first);
    let _second = open_session(&h).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while h.seen.ended.lock().len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ended = h.seen.ended.lock().clone();
    assert!(ended.contains(&(id, EndReason::Expired, None)), "{ended:?}");
    assert!(ended.contains(&(first_id.clone(), EndReason::Evicted, None)), "{ended:?}");
    // Evicted is not ended: the session comes back from the store.
    assert!(h.engine.session("", &first_id, "p").await.is_ok(), "an evicted session is still in the store");
}

/// An application that keeps what its `initialize` started.
struct Remembering;

#[async_trait::async_trait]
impl tether_server::McpApp for Remembering {
    async fn initialize(&self, init: &mut tether_server::Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        init.set_app_state("clientName", init.caller.client_info()["name"].clone());
        init.set_local(Arc::new(Local { touched: AtomicUsize::new(7) }));
        Ok(Map::new())
    }
    async fn handle_request(
        &self,
        ctx: RequestCtx,
        _method: &str,
        _params: Option<Map<String, Value>>,
    ) -> Result<tether_server::RawResult, RpcError> {
        let session = ctx.require_session()?;
        let touched = session.local::<Local>().touched.load(Ordering::SeqCst);
        tether_server::raw_result(&json!({"clientName": session.app_state().await["clientName"], "touched": touched}))
    }
}

#[tokio::test]
async fn sessions_belong_to_their_endpoint_and_start_with_what_initialize_kept() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(StoreConfig::default()));
    let seen = Arc::new(Seen::default());
    let endpoints = tether_server::Endpoints::new(Arc::new(ToolRouter::new(TestTools(seen)))).with("kept", Arc::new(Remembering));
    let engine = Engine::with_endpoints(store, endpoints, config());
    let params = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c1", "version": "0"}});
    let outcome =
        engine.initialize("kept", "p", json!(0), params.as_object().cloned(), Reply::Stream, None).await.expect("initialize");
    let id = session_id(&outcome);
    let (_, answers) = messages(outcome).await;
    assert_eq!(answers[0]["result"]["protocolVersion"], "2025-11-25", "the engine fills in the revision");
    assert!(matches!(engine.session("", &id, "p").await, Err(EngineError::SessionNotFound)), "not a session of /mcp");
    let session = engine.session("kept", &id, "p").await.expect("a session of /mcp/kept");
    let request = Inbound::Request { id: json!(1), method: "anything/at/all".into(), params: None };
    let (_, answers) = messages(engine.post(session, request, Reply::Stream, None).await.expect("answered")).await;
    assert_eq!(answers[0]["result"], json!({"clientName": "c1", "touched": 7}));
    match engine.initialize("nowhere", "p", json!(0), params.as_object().cloned(), Reply::Stream, None).await {
        Err(EngineError::UnknownEndpoint(name)) => assert_eq!(name, "nowhere"),
        _ => panic!("an unknown endpoint is refused"),
    }
}
