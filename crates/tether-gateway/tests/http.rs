//! The HTTP transport against a real Streamable HTTP server on loopback:
//! tether-server's own front serving a small tool application in-process
//! (memory store). Time limits here only stop a hung test.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_gateway::config::UrlSpec;
use tether_gateway::http;
use tether_gateway::upstream::{PeerMessage, PeerSink, Upstream, UpstreamError};
use tether_server::http::{ANONYMOUS, Auth};
use tether_server::rmcp_model::{CallToolResult, Implementation, Tool};
use tether_server::{Engine, EngineConfig, RequestCtx, RpcError, ToolApp, ToolRouter};
use tether_store::StoreConfig;
use tether_store::memory::MemoryStore;
use tether_wire::code;
use tokio::sync::mpsc;

const INIT_TIMEOUT: Duration = Duration::from_secs(20);

/// `hang` calls that ended (the engine drops a tool's future when its
/// request is cancelled).
static HANG_ENDED: AtomicBool = AtomicBool::new(false);

struct HangEnds;

impl Drop for HangEnds {
    fn drop(&mut self) {
        HANG_ENDED.store(true, Ordering::SeqCst);
    }
}

/// `echo`, `chatty` (a notification before its answer), `ask` (asks the
/// client `roots/list` and returns the answer), `hang` (says it started,
/// then runs until cancelled).
struct Tools;

#[async_trait::async_trait]
impl ToolApp for Tools {
    fn server_info(&self) -> Implementation {
        Implementation::new("http-upstream", "0")
    }

    fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(Map::new());
        ["echo", "chatty", "ask", "hang"].into_iter().map(|n| Tool::new(n, n, schema.clone())).collect()
    }

    async fn call_tool(&self, ctx: RequestCtx, name: &str, args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        match name {
            "echo" => Ok(CallToolResult::structured(Value::Object(args))),
            "chatty" => {
                ctx.notify("notifications/message", Some(json!({"level": "info", "data": "working"}))).await?;
                Ok(CallToolResult::structured(json!({"done": true})))
            }
            "ask" => {
                let roots = ctx.request_client("roots/list", None, Duration::from_secs(10)).await?;
                Ok(CallToolResult::structured(roots))
            }
            "hang" => {
                let _ends = HangEnds;
                ctx.notify("notifications/message", Some(json!({"level": "info", "data": "hanging"}))).await?;
                ctx.cancelled().cancelled().await;
                Ok(CallToolResult::structured(json!({"cancelled": true})))
            }
            other => Err(RpcError::invalid_params(format!("unknown tool {other}"))),
        }
    }
}

/// A server on 127.0.0.1:<random>; its engine, for looking behind the HTTP front.
async fn serve(auth: Auth) -> (UrlSpec, Engine) {
    let store = Arc::new(MemoryStore::new(StoreConfig::default()));
    let engine = Engine::new(store, Arc::new(ToolRouter::new(Tools)), EngineConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(tether_server::http::serve(listener, engine.clone(), auth, Default::default(), std::future::pending()));
    (UrlSpec::new(format!("http://{addr}/mcp")), engine)
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.unwrap_or_else(|_| panic!("hung: {what}"))
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"roots": {}},
        "clientInfo": {"name": "the-original-client", "version": "1.2.3"}
    })
}

/// A sink that keeps what the upstream sends for the test to read.
fn channel() -> (Arc<dyn PeerSink>, mpsc::Receiver<PeerMessage>) {
    let (tx, rx) = mpsc::channel(256);
    (Arc::new(tx), rx)
}

async fn call(upstream: &dyn Upstream, tool: &str, arguments: Value) -> Result<Value, RpcError> {
    let raw = within(tool, upstream.request("tools/call", Some(json!({"name": tool, "arguments": arguments})))).await?;
    Ok(serde_json::from_str(raw.get()).expect("JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_and_a_call_go_through_and_the_upstream_session_id_is_exposed() {
    let (spec, engine) = serve(Auth::disabled()).await;
    let (upstream, result) =
        within("connect", http::connect(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, channel().0))
            .await
            .unwrap();
    let result: Value = serde_json::from_str(result.get()).unwrap();
    assert_eq!(result["serverInfo"]["name"], "http-upstream");
    let sid = upstream.upstream_session_id().expect("a Streamable HTTP session ID");
    assert!(within("session", engine.session("", &sid, ANONYMOUS)).await.is_ok());

    let echoed = call(upstream.as_ref(), "echo", json!({"a": [1, "two"]})).await.unwrap();
    assert_eq!(echoed["structuredContent"], json!({"a": [1, "two"]}));
    let refused = call(upstream.as_ref(), "nope", json!({})).await.unwrap_err();
    assert_eq!(refused.code, code::INVALID_PARAMS, "the upstream's own JSON-RPC error: {refused:?}");
    // The client runtime sent `initialized` itself; the gateway's is not sent twice.
    upstream.notify("notifications/initialized", None).await.unwrap();
    assert!(upstream.is_alive());

    // `start` is the same, behind the seam.
    let started =
        within("start", http::start(&spec, "remote", "s-2", initialize_params(), INIT_TIMEOUT, None, None, channel().0))
            .await
            .unwrap();
    let echoed = call(started.upstream.as_ref(), "echo", json!({"b": 2})).await.unwrap();
    assert_eq!(echoed["structuredContent"], json!({"b": 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_notifications_and_requests_arrive_on_inbound_and_answers_get_back() {
    let (spec, _engine) = serve(Auth::disabled()).await;
    let (sink, mut inbound) = channel();
    let started =
        within("start", http::start(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, sink)).await.unwrap();
    let upstream = started.upstream;

    let done = call(upstream.as_ref(), "chatty", json!({})).await.unwrap();
    assert_eq!(done["structuredContent"]["done"], true);
    // What the upstream sent before its answer was delivered before the
    // answer came back: it is waiting already.
    let Ok(PeerMessage::Notification { method, params }) = inbound.try_recv() else { panic!("a notification") };
    assert_eq!((method.as_str(), params.unwrap()["data"].clone()), ("notifications/message", json!("working")));

    let up = upstream.clone();
    let asking = tokio::spawn(async move { call(up.as_ref(), "ask", json!({})).await });
    let Some(PeerMessage::Request { id, method, .. }) = within("server request", inbound.recv()).await else {
        panic!("a request")
    };
    assert_eq!(method, "roots/list");
    let roots = json!({"roots": [{"uri": "file:///work", "name": "work"}]});
    upstream.answer(id, Ok(roots.clone())).await.unwrap();
    let answered = within("ask", asking).await.unwrap().unwrap();
    assert_eq!(answered["structuredContent"], roots);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_before_its_answer_is_cancelled_upstream() {
    let (spec, _engine) = serve(Auth::disabled()).await;
    let (sink, mut inbound) = channel();
    let started =
        within("start", http::start(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, sink)).await.unwrap();
    let upstream = started.upstream;
    {
        let hang = upstream.request("tools/call", Some(json!({"name": "hang", "arguments": {}})));
        tokio::pin!(hang);
        tokio::select! {
            answered = &mut hang => panic!("hang answered: {answered:?}"),
            said = within("hanging", inbound.recv()) => assert!(said.is_some()),
        }
    }
    within("the upstream's tool ends", async {
        while !HANG_ENDED.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(upstream.is_alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_makes_the_upstream_dead_and_its_request_fails_saying_the_upstream_forgot_its_session() {
    let (spec, engine) = serve(Auth::disabled()).await;
    let (sink, mut inbound) = channel();
    let (upstream, _) =
        within("connect", http::connect(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, sink))
            .await
            .unwrap();
    let sid = upstream.upstream_session_id().unwrap();
    // The upstream forgets the session (as a restarted in-memory server would).
    let session = within("session", engine.session("", &sid, ANONYMOUS)).await.unwrap();
    within("delete", engine.delete(session)).await.unwrap();

    let echo = upstream.request("tools/call", Some(json!({"name": "echo", "arguments": {}})));
    let error = within("echo", echo).await.unwrap_err();
    assert_eq!(error, UpstreamError::ForgotSession);
    let error = RpcError::from(error);
    assert_eq!((error.code, error.message.as_str()), (code::INTERNAL_ERROR, "the upstream forgot its session (HTTP 404)"));
    assert!(!upstream.is_alive());
    assert!(within("inbound closes", inbound.recv()).await.is_none());
    let after = call(upstream.as_ref(), "echo", json!({})).await.unwrap_err();
    assert!(after.message.contains("has ended"), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_end_session_deletes_the_upstream_session_and_without_it_keeps_it() {
    let (spec, engine) = serve(Auth::disabled()).await;
    let (ended, _) =
        within("connect", http::connect(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, channel().0))
            .await
            .unwrap();
    let (kept, _) =
        within("connect", http::connect(&spec, "remote", "s-2", initialize_params(), INIT_TIMEOUT, None, None, channel().0))
            .await
            .unwrap();
    within("close", ended.close(true)).await;
    within("close", kept.close(false)).await;
    assert!(!ended.is_alive() && !kept.is_alive());
    let gone = within("session", engine.session("", &ended.upstream_session_id().unwrap(), ANONYMOUS)).await;
    assert!(gone.is_err(), "DELETEd");
    let still = within("session", engine.session("", &kept.upstream_session_id().unwrap(), ANONYMOUS)).await;
    assert!(still.is_ok(), "let go of, not ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_authorization_reaches_the_upstream_only_with_forward_auth() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "client-token-0123456789 alice\n").unwrap();
    let (mut spec, _engine) = serve(Auth::from_file(&tokens).unwrap()).await;
    let client = Some("Bearer client-token-0123456789".to_owned());

    let refused = within(
        "start",
        http::start(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, client.clone(), None, channel().0),
    )
    .await
    .err()
    .expect("the client's token is not forwarded by default");
    assert!(refused.message.contains("HTTP 401"), "{refused:?}");
    assert!(refused.message.contains("upstream remote at http://127.0.0.1"), "{refused:?}");

    spec.forward_auth = true;
    let started =
        within("start", http::start(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, client, None, channel().0))
            .await
            .unwrap();
    assert!(call(started.upstream.as_ref(), "echo", json!({})).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_fails_start_with_a_clear_error() {
    // A port that was just free: nothing listens there.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let spec = UrlSpec::new(format!("http://{addr}/mcp"));
    let error = within("start", http::start(&spec, "remote", "s-1", initialize_params(), INIT_TIMEOUT, None, None, channel().0))
        .await
        .err()
        .expect("nothing answers");
    assert_eq!(error.code, code::INTERNAL_ERROR);
    assert!(error.message.contains("upstream remote") && error.message.contains("cannot connect"), "{error:?}");
}
