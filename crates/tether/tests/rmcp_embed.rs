#![allow(deprecated)] // logging and roots: deprecated in rmcp (SEP-2577), still what 2025-11-25 clients use
//! An rmcp handler embedded with tether-rmcp and `tether_server::Server`:
//! in-process over real HTTP on loopback (tools, progress, logging, the
//! handler's own requests, panics, a handler that never answers, sessionless
//! requests, a session carried on by another engine on the same store, the
//! router nested in an axum application), and the example
//! `examples/rmcp_server.rs` as a process killed with -9 in the middle of a
//! call.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    ListResourcesResult, LoggingLevel, LoggingMessageNotificationParam, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde_json::{Value, json};
use support::{Client, SseReader, send_sessionless, sessionless_request};
use tether_rmcp::RmcpApp;
use tether_server::Server;

/// Handlers made by the factories of this file's servers.
static MADE: AtomicUsize = AtomicUsize::new(0);

/// Calls of `hang` whose work is still held (nextest runs each test in a process of its own).
static HANGING: AtomicUsize = AtomicUsize::new(0);

/// Counts a call of `hang` while its work is held.
struct Hanging;

impl Hanging {
    fn new() -> Self {
        HANGING.fetch_add(1, Ordering::SeqCst);
        Self
    }
}

impl Drop for Hanging {
    fn drop(&mut self) {
        HANGING.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Echo {
    text: String,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Steps {
    steps: u32,
}

#[derive(Clone)]
struct Probe {
    tool_router: ToolRouter<Self>,
    /// Calls of `count` this handler answered: what a handler keeps in its own memory.
    counted: Arc<AtomicUsize>,
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

#[tool_router]
impl Probe {
    fn new() -> Self {
        MADE.fetch_add(1, Ordering::SeqCst);
        Self { tool_router: Self::tool_router(), counted: Arc::default() }
    }

    #[tool(description = "How many times this handler was asked")]
    fn count(&self) -> String {
        (self.counted.fetch_add(1, Ordering::SeqCst) + 1).to_string()
    }

    #[tool(description = "Returns its text")]
    fn echo(&self, Parameters(Echo { text }): Parameters<Echo>) -> String {
        text
    }

    #[tool(description = "One progress notification per step, then a result")]
    async fn slow(
        &self,
        Parameters(Steps { steps }): Parameters<Steps>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<String, ErrorData> {
        for step in 1..=steps {
            if let Some(token) = ctx.meta.get_progress_token() {
                ctx.peer.notify_progress(ProgressNotificationParam::new(token, f64::from(step))).await.map_err(internal)?;
            }
        }
        Ok(format!("done after {steps} steps"))
    }

    #[tool(description = "Panics")]
    fn boom(&self) -> String {
        panic!("boom on purpose")
    }

    #[tool(description = "Never answers")]
    async fn hang(&self) -> String {
        let _held = Hanging::new();
        std::future::pending().await
    }

    #[tool(description = "Sends a log message, then answers")]
    async fn log(&self, ctx: RequestContext<RoleServer>) -> Result<String, ErrorData> {
        let message = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!("hello from the handler"));
        ctx.peer.notify_logging_message(message).await.map_err(internal)?;
        Ok("logged".into())
    }

    #[tool(description = "Asks the client for its roots")]
    async fn roots(&self, ctx: RequestContext<RoleServer>) -> Result<String, ErrorData> {
        let roots = ctx.peer.list_roots().await.map_err(internal)?;
        Ok(roots.roots.iter().map(|r| r.uri.as_str()).collect::<Vec<_>>().join(","))
    }

    #[tool(description = "The client's name as its initialize gave it")]
    fn client(&self, ctx: RequestContext<RoleServer>) -> String {
        ctx.peer.peer_info().map(|info| info.client_info.name.clone()).unwrap_or_default()
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Probe {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().enable_resources().build())
            .with_instructions("the probe of tests/rmcp_embed.rs")
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![Resource::new("probe://notes/1", "note one")]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match request.uri.as_str() {
            "probe://notes/1" => {
                Ok(ReadResourceResult::new(vec![ResourceContents::text("the first note", request.uri.clone())]).into())
            }
            other => Err(ErrorData::resource_not_found(format!("no resource {other}"), None)),
        }
    }
}

fn probe_app() -> RmcpApp<Probe> {
    RmcpApp::new(Probe::new)
}

/// Serves `server` on a loopback port until the test ends; its /mcp URL.
async fn serve(server: Server) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(server.serve_on(listener, std::future::pending()));
    format!("http://{addr}/mcp")
}

async fn probe_server(app: RmcpApp<Probe>) -> String {
    serve(Server::builder().store("memory").mount(Arc::new(app)).build().await.expect("the server builds")).await
}

/// A tools/call's response stream: every message, the response last.
async fn call_stream(c: &Client, session: &str, id: u64, tool: &str, args: Value, meta: Option<Value>) -> Vec<Value> {
    let mut params = json!({"name": tool, "arguments": args});
    if let Some(meta) = meta {
        params["_meta"] = meta;
    }
    let resp = c
        .post(Some(session), &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{tool}");
    let mut reader = SseReader::new(resp);
    let mut messages = Vec::new();
    while let Some(message) = reader.next_message().await {
        messages.push(message);
    }
    messages
}

fn text_of(response: &Value) -> &str {
    response["result"]["content"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_are_listed_and_called_with_progress_on_the_calls_stream() {
    let c = Client::new(&probe_server(probe_app()).await);
    let session = c.initialize().await;
    let listed = c.request(&session, 1, "tools/list", json!({})).await;
    let tools = listed.last().unwrap().json()["result"]["tools"].clone();
    let mut names: Vec<&str> = tools.as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["boom", "client", "count", "echo", "hang", "log", "roots", "slow"]);

    let echo = c.call(&session, 2, "echo", json!({"text": "hello"})).await;
    assert_eq!(text_of(&echo), "hello", "{echo}");

    let messages = call_stream(&c, &session, 3, "slow", json!({"steps": 3}), Some(json!({"progressToken": "p-3"}))).await;
    let progress: Vec<f64> = messages
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .inspect(|m| assert_eq!(m["params"]["progressToken"], "p-3"))
        .filter_map(|m| m["params"]["progress"].as_f64())
        .collect();
    assert_eq!(progress, [1.0, 2.0, 3.0], "{messages:?}");
    let last = messages.last().unwrap();
    assert_eq!((last["id"].clone(), text_of(last)), (json!(3), "done after 3 steps"), "{messages:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_are_listed_and_read_and_an_unknown_one_is_a_clear_error() {
    let c = Client::new(&probe_server(probe_app()).await);
    let session = c.initialize().await;
    let listed = c.request(&session, 1, "resources/list", json!({})).await.last().unwrap().json();
    assert_eq!(listed["result"]["resources"][0]["uri"], "probe://notes/1", "{listed}");
    let read = c.request(&session, 2, "resources/read", json!({"uri": "probe://notes/1"})).await.last().unwrap().json();
    assert_eq!(read["result"]["contents"][0]["text"], "the first note", "{read}");
    let unknown = c.request(&session, 3, "resources/read", json!({"uri": "probe://notes/2"})).await.last().unwrap().json();
    assert!(unknown["error"]["message"].as_str().unwrap_or_default().contains("no resource probe://notes/2"), "{unknown}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_handler_ends_only_its_call_and_the_session_goes_on() {
    let c = Client::new(&probe_server(probe_app()).await);
    let session = c.initialize().await;
    let boom = c.call(&session, 1, "boom", json!({})).await;
    assert_eq!(boom["error"]["code"], -32603, "{boom}");
    let message = boom["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("boom on purpose"), "{boom}");
    let echo = c.call(&session, 2, "echo", json!({"text": "still here"})).await;
    assert_eq!(text_of(&echo), "still here", "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handler_that_never_answers_is_ended_by_the_request_timeout() {
    let c = Client::new(&probe_server(probe_app().request_timeout(Duration::from_secs(1))).await);
    let session = c.initialize().await;
    let hang = c.call(&session, 1, "hang", json!({})).await;
    assert_eq!(hang["error"]["code"], -32603, "{hang}");
    assert!(hang["error"]["message"].as_str().unwrap_or_default().contains("did not answer"), "{hang}");
    // The handler was told, and its work on the call dropped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while HANGING.load(Ordering::SeqCst) > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the handler's work on the timed-out call is still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let echo = c.call(&session, 2, "echo", json!({"text": "after the timeout"})).await;
    assert_eq!(text_of(&echo), "after the timeout", "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_log_message_goes_on_the_standalone_stream() {
    let c = Client::new(&probe_server(probe_app()).await);
    let session = c.initialize().await;
    let listen = c.get(&session, None).send().await.unwrap();
    assert_eq!(listen.status(), 200);
    let mut standalone = SseReader::new(listen);
    let logged = c.call(&session, 1, "log", json!({})).await;
    assert_eq!(text_of(&logged), "logged", "{logged}");
    let message = loop {
        let message = standalone.next_message().await.expect("the standalone stream stays open");
        if message["method"] == "notifications/message" {
            break message;
        }
    };
    assert_eq!(message["params"]["data"], "hello from the handler", "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_handlers_own_request_goes_on_its_calls_stream_and_the_answer_comes_back() {
    let c = Client::new(&probe_server(probe_app()).await);
    let session = c.initialize_with(json!({"roots": {"listChanged": true}})).await;
    let roots = json!([{"uri": "file:///work/a", "name": "a"}, {"uri": "file:///work/b"}]);
    let answer = c.call_with_roots(&session, 1, "roots", json!({}), &roots).await;
    assert_eq!(text_of(&answer), "file:///work/a,file:///work/b", "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessionless_call_and_discover_reach_the_same_handler() {
    let c = Client::new(&probe_server(probe_app()).await);
    let (status, discovered) = send_sessionless(&c, &sessionless_request(1, "server/discover", json!({})), None, &[]).await;
    assert_eq!(status, 200, "{discovered}");
    assert_eq!(discovered["result"]["instructions"], "the probe of tests/rmcp_embed.rs", "{discovered}");
    assert!(discovered["result"]["capabilities"]["tools"].is_object(), "{discovered}");

    let body = sessionless_request(2, "tools/call", json!({"name": "echo", "arguments": {"text": "no session"}}));
    let (status, echo) = send_sessionless(&c, &body, Some("echo"), &[]).await;
    assert_eq!(status, 200, "{echo}");
    assert_eq!(text_of(&echo), "no session", "{echo}");

    // Each sessionless request has a handler of its own (nothing it keeps
    // crosses requests); a session keeps its one handler.
    for id in [3, 4] {
        let (_, counted) =
            send_sessionless(&c, &sessionless_request(id, "tools/call", json!({"name": "count"})), Some("count"), &[]).await;
        assert_eq!(text_of(&counted), "1", "{counted}");
    }
    let session = c.initialize().await;
    assert_eq!(text_of(&c.call(&session, 5, "count", json!({})).await), "1");
    assert_eq!(text_of(&c.call(&session, 6, "count", json!({})).await), "2");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_engine_on_the_same_store_carries_the_session_on_from_its_stored_initialize() {
    let store = tether_store::open_store(&tether_store::StoreUrl::Memory, Default::default()).await.unwrap();
    let first = Server::builder().store_handle(store.clone()).mount(Arc::new(probe_app())).build().await.unwrap();
    let engine = first.engine().clone();
    let c = Client::new(&serve(first).await);
    let session = c.initialize().await;
    assert_eq!(text_of(&c.call(&session, 1, "client", json!({})).await), "tether-tests");
    engine.shutdown().await;

    let made = MADE.load(Ordering::SeqCst);
    let second = Server::builder().store_handle(store).mount(Arc::new(probe_app())).build().await.unwrap();
    let c = Client::new(&serve(second).await);
    // No initialize: the new engine finds the session in the store, and the
    // handler it starts for it knows the client from the stored initialize.
    let who = c.call(&session, 2, "client", json!({})).await;
    assert_eq!(text_of(&who), "tether-tests", "{who}");
    assert!(MADE.load(Ordering::SeqCst) > made, "the second engine made no handler of its own");
    let echo = c.call(&session, 3, "echo", json!({"text": "carried on"})).await;
    assert_eq!(text_of(&echo), "carried on", "{echo}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_router_nests_in_an_application_with_routes_of_its_own() {
    let server = Server::builder().store("memory").mount_at("probe", Arc::new(probe_app())).build().await.unwrap();
    let app =
        axum::Router::new().route("/hello", axum::routing::get(|| async { "hello from the application" })).merge(server.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let hello = reqwest::get(format!("http://{addr}/hello")).await.unwrap().text().await.unwrap();
    assert_eq!(hello, "hello from the application");
    let health = reqwest::get(format!("http://{addr}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    let c = Client::new(&format!("http://{addr}/mcp/probe"));
    let session = c.initialize().await;
    assert_eq!(text_of(&c.call(&session, 1, "echo", json!({"text": "nested"})).await), "nested");
    // Only /mcp/probe is mounted: /mcp says so.
    let root = Client::new(&format!("http://{addr}/mcp"));
    let refused = root
        .post(
            None,
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(refused.contains("nothing is served at /mcp; this server serves /mcp/probe"), "{refused}");
    let metrics = reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tether_http_requests_total{"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_the_builder_cannot_open_is_a_clear_error() {
    let Err(e) = Server::builder().store("postgres://nowhere").mount(Arc::new(probe_app())).build().await else {
        panic!("an unknown store was accepted");
    };
    assert!(e.to_string().contains("unknown store `postgres://nowhere`"), "{e}");
    let Err(e) = Server::builder().mount(Arc::new(probe_app())).build().await else { panic!("no store was accepted") };
    assert!(e.to_string().contains("no store"), "{e}");
}

// ---- examples/rmcp_server.rs as a process, killed with -9 ----------------------------

/// The example, as cargo built it beside this test (examples are built with the tests).
fn example() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe.parent().and_then(|deps| deps.parent()).expect("target/PROFILE/deps/TEST");
    profile.join("examples").join("rmcp_server")
}

/// Starts the example on `listen` with the SQLite file `db`; the child and its /mcp URL.
fn start_example(db: &std::path::Path, listen: &str, extra: &[&str]) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let program = example();
    let mut child = std::process::Command::new(&program)
        .args(["--listen", listen, "--store", &format!("sqlite:{}", db.display())])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not run ({e}): cargo builds it with the package's tests (or: cargo build -p tether --example rmcp_server)", program.display()));
    let mut lines = BufReader::new(child.stderr.take().expect("its stderr")).lines();
    let url = loop {
        let line = lines.next().expect("the example printed its address").expect("a line");
        if let Some(at) = line.find("http://") {
            break line[at..].split_whitespace().next().expect("the URL").to_owned();
        }
    };
    // Keep draining its log, so the example never blocks on a full pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    (child, url)
}

/// Starts `slow` with a progress token and reads its stream until `seen`
/// progress notifications came; the stream's first event ID (to resume from)
/// and the progress seen.
async fn slow_until(c: &Client, session: &str, id: u64, steps: u32, seen: usize) -> (String, Vec<f64>) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"steps": steps}, "_meta": {"progressToken": "cut"}}});
    let resp = c.post(Some(session), &body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let first = reader.next_event().await.expect("the priming event").id.expect("an event ID");
    let mut progress = Vec::new();
    while progress.len() < seen {
        let message = reader.next_message().await.expect("progress before the end");
        assert_eq!(message["method"], "notifications/progress", "{message}");
        progress.push(message["params"]["progress"].as_f64().expect("a number"));
    }
    (first, progress)
}

fn kill_9(mut child: std::process::Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// The messages of a request's stream resumed from `last_event_id`, to its end.
async fn resume(c: &Client, session: &str, last_event_id: &str) -> Vec<Value> {
    let resp = c.get(session, Some(last_event_id)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let mut messages = Vec::new();
    while let Some(message) = reader.next_message().await {
        messages.push(message);
    }
    messages
}

fn progress_of(messages: &[Value]) -> Vec<f64> {
    messages.iter().filter(|m| m["method"] == "notifications/progress").filter_map(|m| m["params"]["progress"].as_f64()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_killed_with_9_carries_its_session_on_and_ends_the_cut_call_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rmcp.db");
    let (child, url) = start_example(&db, "127.0.0.1:0", &[]);
    let c = Client::new(&url);
    let session = c.initialize().await;
    assert_eq!(text_of(&c.call(&session, 1, "echo", json!({"text": "before"})).await), "before");
    let (first, seen) = slow_until(&c, &session, 2, 400, 2).await;
    assert_eq!(seen, [1.0, 2.0]);
    kill_9(child);

    let listen = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let (child, _) = start_example(&db, &listen, &[]);
    // The cut call's stream: the progress stored before the kill, then one final answer.
    let messages = resume(&c, &session, &first).await;
    let progress = progress_of(&messages);
    assert!(progress.len() >= 2 && progress.windows(2).all(|w| w[1] == w[0] + 1.0) && progress[0] == 1.0, "{messages:?}");
    let answers: Vec<&Value> = messages.iter().filter(|m| m["id"] == 2).collect();
    assert_eq!(answers.len(), 1, "{messages:?}");
    assert_eq!(answers[0]["error"]["code"], -32603, "{messages:?}");
    assert!(answers[0]["error"]["message"].as_str().unwrap_or_default().contains("interrupted"), "{messages:?}");
    assert_eq!(messages.last(), Some(answers[0]), "the answer ends the stream");
    // The session answers without a new initialize.
    assert_eq!(text_of(&c.call(&session, 3, "echo", json!({"text": "after"})).await), "after");
    // And a 2026-07-28 client reaches the same handler without a session.
    let body = sessionless_request(4, "tools/call", json!({"name": "echo", "arguments": {"text": "modern"}}));
    let (status, echo) = send_sessionless(&c, &body, Some("echo"), &[]).await;
    assert_eq!((status, text_of(&echo)), (200, "modern"), "{echo}");
    kill_9(child);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_that_opted_in_runs_again_after_the_kill_and_answers_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rmcp.db");
    let (child, url) = start_example(&db, "127.0.0.1:0", &["--rerun", "slow"]);
    let c = Client::new(&url);
    let session = c.initialize().await;
    let (first, _) = slow_until(&c, &session, 1, 12, 2).await;
    kill_9(child);

    let listen = url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let (child, _) = start_example(&db, &listen, &["--rerun", "slow"]);
    let messages = resume(&c, &session, &first).await;
    let answers: Vec<&Value> = messages.iter().filter(|m| m["id"] == 1).collect();
    assert_eq!(answers.len(), 1, "{messages:?}");
    assert_eq!(text_of(answers[0]), "done after 12 steps", "{messages:?}");
    // What the first run sent, then the whole second run.
    let progress = progress_of(&messages);
    let rerun_from = progress.iter().rposition(|p| *p == 1.0).expect("the second run's first step");
    assert!(rerun_from >= 2, "the progress of the first run is not replayed first: {progress:?}");
    assert_eq!(progress[rerun_from..], (1..=12).map(f64::from).collect::<Vec<_>>()[..], "{progress:?}");
    kill_9(child);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_and_policies_given_to_the_builder_hold_for_the_handler() {
    use tether_server::http::{Auth, TokenTable};
    use tether_server::policy::{Policy, PolicyConfig};
    let table = TokenTable::parse("alice-token-0123456789 alice\nbob-token-0123456789ab bob\n").unwrap();
    let rules: PolicyConfig = toml::from_str("[[policies]]\ntools = [\"echo\"]\nallow = 'principal == \"alice\"'\n").unwrap();
    let auth = Auth::from_tokens(table).with_policy(Policy::from_config(rules).unwrap());
    let server = Server::builder().store("memory").auth(auth).mount(Arc::new(probe_app())).build().await.unwrap();
    let url = serve(server).await;

    let nobody = Client::new(&url).post(
        None,
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
    );
    assert_eq!(nobody.send().await.unwrap().status(), 401);

    let alice = Client::with_token(&url, "alice-token-0123456789");
    let session = alice.initialize().await;
    assert_eq!(text_of(&alice.call(&session, 1, "echo", json!({"text": "allowed"})).await), "allowed");

    let bob = Client::with_token(&url, "bob-token-0123456789ab");
    let session = bob.initialize().await;
    let listed = bob.request(&session, 1, "tools/list", json!({})).await;
    let tools = listed.last().unwrap().json()["result"]["tools"].clone();
    assert!(tools.as_array().unwrap().iter().all(|t| t["name"] != "echo"), "bob sees echo: {tools}");
    let refused = bob.post(
        Some(&session),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "refused"}}}),
    );
    assert_eq!(refused.send().await.unwrap().status(), 403);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_on_one_redis_serve_one_handlers_session() {
    let prefix = support::fresh_prefix();
    let replica = || async {
        let config = tether_store::StoreConfig { redis_prefix: prefix.clone(), ..Default::default() };
        let server = Server::builder().store(support::redis_url()).store_config(config).mount(Arc::new(probe_app())).build();
        serve(server.await.expect("Redis answers (scripts/test starts it)")).await
    };
    let (a, b) = (Client::new(&replica().await), Client::new(&replica().await));
    let session = a.initialize().await;
    // The other replica starts a handler of its own for the session, from its stored initialize.
    assert_eq!(text_of(&b.call(&session, 1, "client", json!({})).await), "tether-tests");
    let messages = call_stream(&b, &session, 2, "slow", json!({"steps": 2}), Some(json!({"progressToken": "on-b"}))).await;
    assert_eq!(progress_of(&messages), [1.0, 2.0], "{messages:?}");
    assert_eq!(text_of(messages.last().unwrap()), "done after 2 steps");
    assert_eq!(text_of(&a.call(&session, 3, "echo", json!({"text": "back on a"})).await), "back on a");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oauth_access_token_of_a_real_authorization_server_opens_a_handlers_session_bound_to_its_subject() {
    use tether_server::http::Auth;
    use tether_server::http::oauth::{OAuthConfig, ResourceServer};
    let dir = tempfile::tempdir().unwrap();
    let provider = support::provider::start_provider(dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let config =
        OAuthConfig { issuers: vec![provider.issuer.clone()], public_url: base.clone(), scopes: vec![], introspection: None };
    let auth = Auth::disabled().with_oauth(ResourceServer::new(config).unwrap());
    let server = Server::builder().store("memory").auth(auth).mount(Arc::new(probe_app())).build().await.unwrap();
    tokio::spawn(server.serve_on(listener, std::future::pending()));
    let mcp = format!("{base}/mcp");

    let nobody = Client::new(&mcp).post(
        None,
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
    );
    let refused = nobody.send().await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(refused.headers()["www-authenticate"].to_str().unwrap().contains("oauth-protected-resource/mcp"));

    let svc = Client::with_token(&mcp, &provider.token("svc", &mcp, "tools:read").await);
    let session = svc.initialize().await;
    assert_eq!(text_of(&svc.call(&session, 1, "echo", json!({"text": "with a token"})).await), "with a token");
    let other = Client::with_token(&mcp, &provider.token("reader", &mcp, "tools:read").await);
    let foreign = other.post(Some(&session), &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).send().await.unwrap();
    assert_eq!(foreign.status(), 404, "a handler's session is bound to its token's subject");
}
