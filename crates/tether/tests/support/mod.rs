//! Test support: a real server on a loopback port (in its own runtime, so a
//! test can "crash" it), a test MCP app with slow and chatty tools, and a
//! small raw HTTP + SSE client that shows exactly what went over the wire.
#![allow(dead_code)]

pub mod procs;
#[allow(unused_imports)]
pub use procs::*;
pub mod provider;
#[allow(unused_imports)]
pub use provider::*;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tether_notebook::{MemoryNotebook, Notebook, NotebookRepo, SqliteNotebook};
use tether_server::rmcp_model::{CallToolResult, ContentBlock, Implementation, Tool};
use tether_server::{Engine, EngineConfig, McpApp, RequestCtx, RpcError, ToolApp, ToolRouter};
use tether_store::memory::MemoryStore;
use tether_store::sqlite::SqliteStore;
use tether_store::{Store, StoreConfig};
use tether_wire::{headers, meta, sse};

pub const ACCEPT_BOTH: &str = headers::ACCEPT_POST;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backend {
    Memory,
    Sqlite,
    /// Real Redis (`TETHER_TEST_REDIS_URL`), under a prefix of its own.
    Redis,
}

/// The Redis for tests; scripts/test makes sure it answers.
pub fn redis_url() -> String {
    std::env::var("TETHER_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// The three-primary Redis Cluster scripts/test starts (scripts/redis-cluster).
#[allow(dead_code)]
pub fn redis_cluster_url() -> String {
    std::env::var("TETHER_TEST_REDIS_CLUSTER_URL")
        .unwrap_or_else(|_| "redis+cluster://127.0.0.1:7301,127.0.0.1:7302,127.0.0.1:7303/".into())
}

/// A prefix no other test run uses.
pub fn fresh_prefix() -> String {
    format!("tether-test:{}:{}:", std::process::id(), hex::encode(rand::random::<[u8; 4]>()))
}

pub const BACKENDS: [Backend; 3] = [Backend::Memory, Backend::Sqlite, Backend::Redis];

/// Which MCP application the server runs.
#[derive(Clone, Copy, PartialEq)]
pub enum AppKind {
    Notebook,
    Test,
}

/// `tag` arguments of `hang` calls that have ended: they end only when
/// cancelled (by the client, or with their session or the server).
pub static ENDED_HANGS: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

/// Records a `hang` call's tag when the call ends, however it ends (the
/// engine drops a tool's future when its request is cancelled).
struct HangEnds(Option<String>);

impl Drop for HangEnds {
    fn drop(&mut self) {
        if let Some(tag) = self.0.take() {
            ENDED_HANGS.lock().push(tag);
        }
    }
}

/// Tools for transport tests: `echo`, `chatty` (notifications between
/// pauses), `hang` (runs until cancelled; its `tag` goes to
/// [`ENDED_HANGS`]), `ask` (asks the client `roots/list`),
/// `announce` (a session-level notification on the standalone stream);
/// resumable: `count` (restartable: `n` chunks, `pause_ms` apart, progress),
/// `fragile` (not restartable: sleeps `pause_ms`, then one chunk, or fails
/// with `fail: true`).
pub struct TestApp;

#[async_trait::async_trait]
impl ToolApp for TestApp {
    fn server_info(&self) -> Implementation {
        Implementation::new("test-app", "0")
    }

    fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(json!({"type": "object"}).as_object().cloned().unwrap());
        ["echo", "chatty", "hang", "ask", "announce", "count", "fragile"]
            .into_iter()
            .map(|n| Tool::new(n, n, schema.clone()))
            .collect()
    }

    fn operation_spec(&self, tool: &str) -> Option<tether_server::OperationSpec> {
        match tool {
            "count" => Some(tether_server::OperationSpec { restartable: true, expected_duration_ms: 1000 }),
            "fragile" => Some(tether_server::OperationSpec { restartable: false, expected_duration_ms: 1000 }),
            _ => None,
        }
    }

    async fn run_operation(
        &self,
        ctx: tether_server::OperationCtx,
        tool: &str,
        args: Map<String, Value>,
    ) -> Result<(), RpcError> {
        let pause = Duration::from_millis(args.get("pause_ms").and_then(Value::as_u64).unwrap_or(0));
        match tool {
            "count" => {
                let n = args.get("n").and_then(Value::as_u64).unwrap_or(3);
                for i in ctx.resume_from()..n {
                    tokio::time::sleep(pause).await;
                    ctx.push(CallToolResult::success(vec![ContentBlock::text(format!("chunk {i};"))])).await?;
                    ctx.progress((i + 1) as f64, Some(n as f64), None);
                }
                Ok(())
            }
            "fragile" => {
                tokio::time::sleep(pause).await;
                if args.get("fail").and_then(Value::as_bool) == Some(true) {
                    return Err(RpcError::internal("fragile failed as asked"));
                }
                ctx.push(CallToolResult::structured(json!({"ok": true}))).await
            }
            other => Err(RpcError::invalid_params(format!("unknown operation {other}"))),
        }
    }

    async fn call_tool(&self, ctx: RequestCtx, name: &str, args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        match name {
            "echo" => Ok(CallToolResult::structured(Value::Object(args))),
            "chatty" => {
                let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(3);
                let pause = args.get("pause_ms").and_then(Value::as_u64).unwrap_or(50);
                for i in 0..steps {
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    ctx.notify("notifications/message", Some(json!({"level": "info", "data": format!("step {i}")}))).await?;
                }
                Ok(CallToolResult::structured(json!({"steps": steps})))
            }
            "announce" => {
                ctx.require_session()?.notify("notifications/tools/list_changed", None).await?;
                Ok(CallToolResult::structured(json!({"announced": true})))
            }
            "hang" => {
                let _ends = HangEnds(args.get("tag").and_then(Value::as_str).map(str::to_owned));
                ctx.cancelled().cancelled().await;
                Ok(CallToolResult::success(vec![ContentBlock::text("cancelled")]))
            }
            "ask" => {
                let delay = args.get("delay_ms").and_then(Value::as_u64).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let roots = ctx.request_client("roots/list", None, Duration::from_secs(10)).await?;
                Ok(CallToolResult::structured(roots))
            }
            other => Err(RpcError::invalid_params(format!("unknown tool {other}"))),
        }
    }
}

/// A server in its own thread and runtime on 127.0.0.1:<random>.
pub struct TestServer {
    pub url: String,
    pub base: String,
    pub backend: Backend,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::sync::mpsc::Receiver<()>>,
    pub dir: Arc<tempfile::TempDir>,
}

/// A test server's settings: the engine's and the HTTP front's.
#[derive(Clone, Default)]
pub struct Settings {
    pub engine: EngineConfig,
    pub http: tether_server::http::HttpConfig,
}

impl From<EngineConfig> for Settings {
    fn from(engine: EngineConfig) -> Self {
        Self { engine, http: Default::default() }
    }
}

pub fn quick_config() -> EngineConfig {
    EngineConfig { keepalive: Duration::from_millis(200), drain_timeout: Duration::from_secs(1), ..EngineConfig::default() }
}

impl TestServer {
    pub async fn start(backend: Backend, app: AppKind, config: impl Into<Settings>) -> Self {
        Self::start_in(Arc::new(tempfile::tempdir().unwrap()), backend, app, config).await
    }

    /// Starts on the data in `dir` (for restarts).
    pub async fn start_in(dir: Arc<tempfile::TempDir>, backend: Backend, app: AppKind, config: impl Into<Settings>) -> Self {
        Self::start_with_auth(dir, backend, app, config, tether_server::http::Auth::disabled()).await
    }

    /// A replica on Redis under `prefix` (replicas of one test share it).
    pub async fn start_replica(redis: &str, prefix: &str, app: AppKind, config: impl Into<Settings>) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        std::fs::write(dir.path().join("redis"), format!("{redis}\n{prefix}")).unwrap();
        Self::start_with_auth(dir, Backend::Redis, app, config, tether_server::http::Auth::disabled()).await
    }

    pub async fn start_with_auth(
        dir: Arc<tempfile::TempDir>,
        backend: Backend,
        app: AppKind,
        config: impl Into<Settings>,
        auth: tether_server::http::Auth,
    ) -> Self {
        let Settings { engine: config, http } = config.into();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let db = dir.path().join("tether.db");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let store_config = StoreConfig::default();
            let (store, repo): (Arc<dyn Store>, Arc<dyn NotebookRepo>) = match backend {
                Backend::Memory => (Arc::new(MemoryStore::new(store_config)), Arc::new(MemoryNotebook::new())),
                Backend::Sqlite => {
                    let mut attempt = 0;
                    let store = loop {
                        // A crashed predecessor releases the file lock when its threads wind down.
                        match SqliteStore::open(&db, store_config.clone()).await {
                            Ok(s) => break s,
                            Err(e) if attempt < 100 => {
                                attempt += 1;
                                let _ = e;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => panic!("cannot open store: {e}"),
                        }
                    };
                    let repo = SqliteNotebook::new(store.db().clone()).await.unwrap();
                    (Arc::new(store), Arc::new(repo))
                }
                Backend::Redis => {
                    // start_replica leaves "URL\nPREFIX" in the data dir; else a fresh prefix.
                    let (url, prefix) = std::fs::read_to_string(db.with_file_name("redis"))
                        .ok()
                        .and_then(|s| s.split_once('\n').map(|(u, p)| (u.to_owned(), p.to_owned())))
                        .unwrap_or_else(|| (redis_url(), fresh_prefix()));
                    let config = StoreConfig { redis_prefix: prefix.clone(), ..store_config };
                    let store = tether_store::redis::RedisStore::open(&url, config).await.unwrap_or_else(|e| {
                        panic!("Redis is needed and not reachable at {url}: {e}; run scripts/test (it starts Redis)")
                    });
                    let repo = tether_notebook::RedisNotebook::new(store.connection(), &prefix);
                    (Arc::new(store), Arc::new(repo))
                }
            };
            let app: Arc<dyn McpApp> = match app {
                AppKind::Notebook => Arc::new(ToolRouter::new(Notebook::new(repo))),
                AppKind::Test => Arc::new(ToolRouter::new(TestApp)),
            };
            let engine = Engine::new(store, app, config);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let _ = tether_server::http::serve(listener, engine, auth, http, async move {
                let _ = stop_rx.await;
            })
            .await;
            let _ = done_tx.send(());
        });
        let addr = addr_rx.await.unwrap();
        let base = format!("http://{addr}");
        Self { url: format!("{base}/mcp"), base, backend, runtime: Some(runtime), stop: Some(stop_tx), done: Some(done_rx), dir }
    }

    /// Graceful stop: streams are told to reconnect, the store is flushed.
    pub async fn stop(mut self) -> Arc<tempfile::TempDir> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = tokio::task::spawn_blocking(move || done.recv_timeout(Duration::from_secs(10))).await;
        }
        self.dir.clone()
    }

    /// Like `kill -9` for an in-process server: every task is dropped where it stands.
    pub fn crash(mut self) -> Arc<tempfile::TempDir> {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        self.dir.clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One SSE block as it came over the wire (or a block of comments only: a keep-alive).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
    pub comment: bool,
}

impl SseEvent {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

impl From<sse::Event> for SseEvent {
    fn from(e: sse::Event) -> Self {
        SseEvent { id: e.id, event: e.event, data: e.data, retry: e.retry, comment: false }
    }
}

/// Reads SSE blocks from a streaming response, with the decoder the client
/// uses (`tether_wire::sse`), keep-alive comments included.
pub struct SseReader {
    stream: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
    decoder: sse::Decoder,
    ready: std::collections::VecDeque<SseEvent>,
    /// Comment-only blocks already handed out.
    comments: u64,
    pub ended: bool,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        Self {
            stream: resp.bytes_stream().boxed(),
            decoder: sse::Decoder::new(),
            ready: Default::default(),
            comments: 0,
            ended: false,
        }
    }

    /// The next block (event or comment), `None` at the end of the stream.
    /// Of one network read, its events come before its comments.
    pub async fn next_block(&mut self, timeout: Duration) -> Option<SseEvent> {
        loop {
            if let Some(block) = self.ready.pop_front() {
                if std::env::var_os("TETHER_TEST_DEBUG").is_some() {
                    eprintln!("SSE block: {block:?}");
                }
                return Some(block);
            }
            if self.comments < self.decoder.comments() {
                self.comments += 1;
                return Some(SseEvent { comment: true, ..SseEvent::default() });
            }
            match tokio::time::timeout(timeout, self.stream.next()).await {
                Ok(Some(Ok(bytes))) => {
                    let events = self.decoder.push(bytes).unwrap_or_else(|e| panic!("the SSE stream is broken: {e}"));
                    self.ready.extend(events.into_iter().map(SseEvent::from));
                }
                Ok(_) => {
                    self.ended = true;
                    return None;
                }
                Err(_) => panic!("no SSE block within {timeout:?}"),
            }
        }
    }

    /// The next non-comment event.
    pub async fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            let block = self.next_block(Duration::from_secs(10)).await?;
            if !block.comment {
                return Some(block);
            }
        }
    }

    /// The next event that carries a message (priming events skipped).
    pub async fn next_message(&mut self) -> Option<Value> {
        loop {
            let e = self.next_event().await?;
            if !e.data.is_empty() {
                return Some(e.json());
            }
        }
    }

    /// All events until the server ends the stream.
    pub async fn all_events(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(e) = self.next_event().await {
            out.push(e);
        }
        out
    }
}

/// A raw client of one server.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
}

impl Client {
    pub fn new(url: &str) -> Self {
        Self { http: reqwest::Client::new(), url: url.to_owned() }
    }

    pub fn post(&self, session: Option<&str>, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .body(body.to_string());
        if let Some(s) = session {
            req = req.header(headers::SESSION_ID, s).header(headers::PROTOCOL_VERSION, tether_wire::revision::LATEST);
        }
        req
    }

    /// A POST with exactly these headers (nothing added).
    pub fn post_raw(&self, headers: &[(&str, &str)], body: String) -> reqwest::RequestBuilder {
        let mut req = self.http.post(&self.url).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req
    }

    pub fn get(&self, session: &str, last_event_id: Option<&str>) -> reqwest::RequestBuilder {
        let mut req = self.http.get(&self.url).header("accept", headers::EVENT_STREAM).header(headers::SESSION_ID, session);
        if let Some(id) = last_event_id {
            req = req.header(headers::LAST_EVENT_ID, id);
        }
        req
    }

    /// initialize + notifications/initialized; returns the session ID.
    pub async fn initialize_with(&self, capabilities: Value) -> String {
        let resp = self
            .post(
                None,
                &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": capabilities,
                "clientInfo": {"name": "tether-tests", "version": "0"}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let sid = resp.headers().get(headers::SESSION_ID).expect("session header").to_str().unwrap().to_owned();
        let events = SseReader::new(resp).all_events().await;
        assert!(events.last().unwrap().json()["result"]["protocolVersion"].is_string());
        let r = self.post(Some(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
        assert_eq!(r.status(), 202);
        sid
    }

    pub async fn initialize(&self) -> String {
        self.initialize_with(json!({})).await
    }

    /// A request answered on SSE; returns every event of its stream.
    pub async fn request(&self, session: &str, id: u64, method: &str, params: Value) -> Vec<SseEvent> {
        let resp = self
            .post(Some(session), &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{method}");
        SseReader::new(resp).all_events().await
    }

    pub async fn call(&self, session: &str, id: u64, tool: &str, args: Value) -> Value {
        let events = self.request(session, id, "tools/call", json!({"name": tool, "arguments": args})).await;
        events.last().expect("a response").json()
    }
}

pub fn thought_args(n: u64) -> Value {
    json!({"thought": format!("thought {n}"), "thoughtNumber": n, "totalThoughts": 3, "nextThoughtNeeded": true})
}

/// The binary under test: `TETHER_BIN` (scripts/test points it at the
/// release build) or the one cargo built for this test run.
pub fn binary() -> String {
    std::env::var("TETHER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tether").to_owned())
}

/// What the binaries started on the SQLite file `db` have logged so far.
pub fn log_of(db: &std::path::Path) -> String {
    std::fs::read_to_string(db.with_extension("log")).unwrap_or_default()
}

/// Starts `tether serve` on a free port with a SQLite file; returns the
/// child and its /mcp URL.
pub fn start_binary(db: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    start_binary_on(&format!("sqlite:{}", db.display()), &db.with_extension("log"), extra)
}

/// [`start_binary`] on the store `store` (e.g. a Redis URL), its log also
/// written to `log`.
pub fn start_binary_on(store: &str, log: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    start_binary_with_env(store, log, extra, &[])
}

/// [`start_binary_on`] with `env` set for the server.
pub fn start_binary_with_env(
    store: &str,
    log: &std::path::Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let listen = if extra.contains(&"--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] };
    let mut child = std::process::Command::new(binary())
        .arg("serve")
        .args(listen)
        .args(["--store", store])
        .args(extra)
        .envs(env.iter().copied())
        .env("RUST_LOG", std::env::var("TETHER_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()))
        .env_remove("TETHER_JSON_RESPONSE")
        .env_remove("TETHER_AUTH_TOKENS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tether binary runs");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let line = lines.next().expect("server printed its address").unwrap();
        if let Some(i) = line.find("http://") {
            break line[i..].split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe
    // (shown with TETHER_TEST_SHOW_LOG=1, for a test being debugged).
    // Its log also goes to `<db>.log`, for tests that read it (`log_of`).
    let show = std::env::var_os("TETHER_TEST_SHOW_LOG").is_some();
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(log).ok();
    std::thread::spawn(move || {
        use std::io::Write;
        for line in lines.map_while(Result::ok) {
            if show {
                eprintln!("tether: {line}");
            }
            if let Some(file) = file.as_mut() {
                let _ = writeln!(file, "{line}");
            }
        }
    });
    (child, url)
}

impl Client {
    /// A client that sends `Authorization: Bearer <token>` on every request.
    pub fn with_token(url: &str, token: &str) -> Self {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
        Self { http: reqwest::Client::builder().default_headers(headers).build().unwrap(), url: url.to_owned() }
    }

    /// initialize with arbitrary params; returns (session ID header, result).
    pub async fn initialize_params(&self, params: Value) -> (String, Value) {
        let resp =
            self.post(None, &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params})).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let sid = resp.headers()[headers::SESSION_ID].to_str().unwrap().to_owned();
        let events = SseReader::new(resp).all_events().await;
        (sid, events.last().unwrap().json()["result"].clone())
    }
}

impl Client {
    /// A tools/call that answers any `roots/list` the server asks on the
    /// call's stream with `roots`; returns the call's response.
    pub async fn call_with_roots(&self, session: &str, id: u64, tool: &str, args: Value, roots: &Value) -> Value {
        let resp = self
            .post(
                Some(session),
                &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": args}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{tool}");
        let mut reader = SseReader::new(resp);
        while let Some(event) = reader.next_event().await {
            let message = event.json();
            if message["method"] == "roots/list" {
                let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"roots": roots}});
                assert_eq!(self.post(Some(session), &answer).send().await.unwrap().status(), 202);
            } else if message["id"] == json!(id) {
                return message;
            }
        }
        panic!("{tool}: stream ended without a response");
    }
}

/// The structured result of a tool response.
pub fn structured(response: &Value) -> &Value {
    &response["result"]["structuredContent"]
}

impl Client {
    /// A tools/call with `_meta` (e.g. a resumeToken); returns the response.
    pub async fn call_meta(&self, session: &str, id: u64, tool: &str, args: &Value, meta: Value) -> Value {
        let events = self.request(session, id, "tools/call", json!({"name": tool, "arguments": args, "_meta": meta})).await;
        events.last().expect("a response").json()
    }

    /// A call that asks for pages (`_meta["dev.tether/paging"]`), following
    /// `nextResumeToken` until the final result; returns every response in
    /// order (pending ones included).
    pub async fn resume_loop(&self, session: &str, tool: &str, args: &Value) -> Vec<Value> {
        let mut out = Vec::new();
        let mut resume = json!({(meta::PAGING): true});
        for round in 0..500u64 {
            let response = self.call_meta(session, 5000 + round, tool, args, resume.clone()).await;
            let next = response["result"]["_meta"][meta::NEXT_RESUME_TOKEN].as_str().map(str::to_owned);
            out.push(response);
            match next {
                Some(token) => resume = json!({(meta::RESUME_TOKEN): token}),
                None => return out,
            }
        }
        panic!("resume loop did not finish in 500 rounds");
    }
}

/// The text of every non-pending response, joined in order.
pub fn joined_text(responses: &[Value]) -> String {
    responses
        .iter()
        .filter(|r| r["result"]["_meta"][meta::PENDING] != true)
        .flat_map(|r| r["result"]["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(str::to_owned))
        .collect()
}

// The sessionless revision (2026-07-28).

pub const SESSIONLESS: &str = "2026-07-28";

pub fn sessionless_meta() -> Value {
    json!({
        (tether_wire::meta::PROTOCOL_VERSION): SESSIONLESS,
        (tether_wire::meta::CLIENT_CAPABILITIES): {},
        (tether_wire::meta::CLIENT_INFO): {"name": "sessionless-test", "version": "1.0.0"},
    })
}

pub fn sessionless_request(id: u64, method: &str, mut params: Value) -> Value {
    if params.get("_meta").is_none() {
        params["_meta"] = sessionless_meta();
    }
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

/// POSTs `body` (a 2026-07-28 request) with the headers a sessionless client sends (`name`: Mcp-Name), plus `extra`.
pub async fn send_sessionless(c: &Client, body: &Value, name: Option<&str>, extra: &[(&str, &str)]) -> (u16, Value) {
    let method = body["method"].as_str().unwrap_or("");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-protocol-version", SESSIONLESS),
        ("mcp-method", method),
    ];
    if let Some(name) = name {
        headers.push(("mcp-name", name));
    }
    for (k, v) in extra {
        headers.retain(|(h, _)| h != k);
        headers.push((k, v));
    }
    let resp = c.post_raw(&headers, body.to_string()).send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    // One JSON body, or an SSE stream whose last message is the answer.
    let answer = serde_json::from_str(&text).unwrap_or_else(|_| {
        let last = text.lines().filter_map(|l| l.strip_prefix("data: ")).next_back().unwrap_or("null");
        serde_json::from_str(last).unwrap_or(Value::Null)
    });
    (status, answer)
}
