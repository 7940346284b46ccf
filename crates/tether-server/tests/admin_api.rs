//! The admin API's routes for the admin page over real loopback HTTP:
//! every route refuses a missing or wrong token (401) and a foreign Origin
//! (403); `GET /admin/calls` lists the calls running, bounded; `GET
//! /admin/calls/stream` pushes a snapshot, then each call's start and end,
//! and holds at most 16 watchers; `GET /admin/audit` shows the audit log's
//! latest decisions, filtered; the session list is paged and tells each
//! session's requests in flight.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::Tools;
use tether_server::http::{Auth, HttpConfig};
use tether_server::policy::{AuditLog, Decision, Target};
use tether_server::{Engine, EngineConfig, ToolRouter};
use tether_store::StoreConfig;
use tether_store::memory::MemoryStore;

const TOKEN: &str = "admin-api-token-0123456789abcdef";
/// Longer than any wait here: reaching it means a hang.
const DEADLINE: Duration = Duration::from_secs(30);

struct Server {
    base: String,
    http: reqwest::Client,
}

async fn start(audit: Option<AuditLog>) -> Server {
    let engine = Engine::new(
        Arc::new(MemoryStore::new(StoreConfig::default())),
        Arc::new(ToolRouter::new(Tools)),
        EngineConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    let admin = tether_server::http::admin_router(engine.clone(), TOKEN, &["https://ops.example".to_owned()], audit);
    tokio::spawn(async move {
        let _ = tether_server::http::serve_with(
            listener,
            admin,
            engine,
            Auth::disabled(),
            HttpConfig::default(),
            std::future::pending(),
        )
        .await;
    });
    Server { base, http: reqwest::Client::new() }
}

impl Server {
    async fn admin(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(TOKEN).send().await.expect("the admin API answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A new session on `/mcp`: its ID.
    async fn session(&self) -> String {
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": support::PROTOCOL, "capabilities": {}, "clientInfo": {"name": "admin-test", "version": "1"}}});
        let r = self.mcp(None).json(&body).send().await.expect("initialize");
        assert_eq!(r.status(), 200);
        let sid = r.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("a session ID").to_owned();
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(self.mcp(Some(&sid)).json(&done).send().await.expect("initialized").status(), 202);
        sid
    }

    fn mcp(&self, session: Option<&str>) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(format!("{}/mcp", self.base))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", support::PROTOCOL);
        if let Some(sid) = session {
            r = r.header("mcp-session-id", sid);
        }
        r
    }

    /// Calls `sleep` for `ms` in the background; the handle ends with its answer.
    fn sleep_call(&self, session: &str, id: u64, ms: u64) -> tokio::task::JoinHandle<String> {
        let request = self.mcp(Some(session)).json(&support::call_body(id, "sleep", json!({"ms": ms})));
        tokio::spawn(async move { request.send().await.expect("the call").text().await.unwrap_or_default() })
    }
}

/// SSE events of a streaming response, read as they come.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

impl Events {
    /// The next `(event, data)`; comments are skipped.
    async fn next(&mut self) -> (String, Value) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if !event.is_empty() {
                    return (event, serde_json::from_str(&data).unwrap_or(Value::Null));
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk()).await.expect("an event within the deadline");
            let chunk = chunk.expect("the stream reads").expect("the stream stays open");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

async fn watch(server: &Server) -> reqwest::Response {
    server.http.get(format!("{}/admin/calls/stream", server.base)).bearer_auth(TOKEN).send().await.expect("the stream opens")
}

#[tokio::test]
async fn every_admin_route_refuses_a_missing_or_wrong_token_and_a_foreign_origin() {
    let server = start(None).await;
    for path in
        ["/admin/calls", "/admin/calls/stream", "/admin/audit", "/admin/sessions", "/admin/endpoints", "/admin/sessions/nope"]
    {
        let url = format!("{}{path}", server.base);
        let none = server.http.get(&url).send().await.unwrap();
        assert_eq!(none.status(), 401, "{path} without a token");
        assert_eq!(none.headers().get("www-authenticate").map(|v| v.as_bytes()), Some(&b"Bearer"[..]), "{path}");
        let wrong = server.http.get(&url).bearer_auth("admin-api-token-0123456789abcdeX").send().await.unwrap();
        assert_eq!(wrong.status(), 401, "{path} with a wrong token");
        // The Origin check comes first: a foreign page gets 403 even with the token.
        let foreign = server.http.get(&url).bearer_auth(TOKEN).header("origin", "https://evil.example").send().await.unwrap();
        assert_eq!(foreign.status(), 403, "{path} from a foreign origin");
        let body: Value = foreign.json().await.unwrap_or(Value::Null);
        assert!(body["error"].as_str().is_some_and(|e| e.contains("--allowed-origin")), "{path}: {body}");
        for origin in ["http://localhost:8080", "https://ops.example"] {
            let allowed = server.http.get(&url).bearer_auth(TOKEN).header("origin", origin).send().await.unwrap();
            assert_ne!(allowed.status(), 403, "{path} from {origin}");
            assert_ne!(allowed.status(), 401, "{path} from {origin}");
        }
    }
    // A state-changing request needs the token too.
    let delete = server.http.delete(format!("{}/admin/sessions/nope", server.base)).send().await.unwrap();
    assert_eq!(delete.status(), 401);
}

#[tokio::test]
async fn the_calls_stream_sends_a_snapshot_then_each_calls_start_and_end() {
    let server = start(None).await;
    let sid = server.session().await;
    let early = server.sleep_call(&sid, 1, 60_000);
    let deadline = Instant::now() + DEADLINE;
    while server.admin("/admin/calls").await.1["total"] != 1 {
        assert!(Instant::now() < deadline, "the first call runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut events = Events { response: watch(&server).await, buffer: String::new() };
    assert_eq!(events.response.status(), 200);
    let ty = events.response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(ty.starts_with("text/event-stream"), "{ty}");
    // The call started before the stream opened is in its snapshot.
    let (event, snapshot) = events.next().await;
    assert_eq!(event, "snapshot", "{snapshot}");
    assert!(snapshot["now_ms"].as_i64().is_some(), "{snapshot}");
    assert_eq!(snapshot["total"], 1, "{snapshot}");
    assert_eq!(snapshot["calls"][0]["name"], "sleep", "{snapshot}");

    let call = server.sleep_call(&sid, 2, 300);
    let (event, started) = events.next().await;
    assert_eq!(event, "start", "{started}");
    assert_eq!(started["name"], "sleep");
    assert_eq!(started["method"], "tools/call");
    assert_eq!(started["session"], sid.as_str());
    assert_eq!(started["request_id"], 2);
    assert_eq!(started["upstream"], "");
    let (_, listed) = server.admin(&format!("/admin/calls?session={sid}")).await;
    assert_eq!(listed["total"], 2, "{listed}");
    let (event, ended) = events.next().await;
    assert_eq!((event.as_str(), &ended["id"]), ("end", &started["id"]), "{ended}");
    assert!(call.await.unwrap().contains("\"result\""), "the call got its answer");
    let (_, listed) = server.admin("/admin/calls").await;
    assert_eq!(listed["total"], 1, "only the long call runs: {listed}");
    assert_eq!(listed["calls"][0]["request_id"], 1, "{listed}");
    assert!(listed["calls"][0]["running_ms"].as_i64().is_some_and(|ms| ms >= 0), "{listed}");

    // Cancelling ends it: the stream says so.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
    assert_eq!(server.mcp(Some(&sid)).json(&cancel).send().await.unwrap().status(), 202);
    let (event, ended) = events.next().await;
    assert_eq!((event.as_str(), &ended["id"]), ("end", &snapshot["calls"][0]["id"]), "{ended}");
    early.abort();
}

#[tokio::test]
async fn pages_and_watchers_are_bounded() {
    let server = start(None).await;
    let sid = server.session().await;
    let calls: Vec<_> = (1..=3).map(|id| server.sleep_call(&sid, id, 60_000)).collect();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (_, listed) = server.admin("/admin/calls").await;
        if listed["total"] == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "three calls running: {listed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, page) = server.admin("/admin/calls?limit=2").await;
    assert_eq!((page["calls"].as_array().map(Vec::len), &page["total"]), (Some(2), &json!(3)), "{page}");
    let (_, page) = server.admin("/admin/calls?limit=1000000").await;
    assert_eq!(page["calls"].as_array().map(Vec::len), Some(3));
    let (_, page) = server.admin("/admin/calls?principal=someone-else").await;
    assert_eq!(page["total"], 0);

    // The session list: paged, each with its requests in flight.
    for _ in 0..4 {
        server.session().await;
    }
    let (status, first) = server.admin("/admin/sessions?limit=2").await;
    assert_eq!(status, 200);
    assert_eq!(first["sessions"].as_array().map(Vec::len), Some(2), "{first}");
    let next = first["next"].as_str().expect("a next page").to_owned();
    let (_, second) = server.admin(&format!("/admin/sessions?limit=2&cursor={next}")).await;
    assert_eq!(second["sessions"].as_array().map(Vec::len), Some(2), "{second}");
    let (_, all) = server.admin("/admin/sessions?limit=100").await;
    let ours = all["sessions"].as_array().and_then(|s| s.iter().find(|s| s["id"] == sid.as_str())).cloned().unwrap_or_default();
    assert_eq!(ours["in_flight"], 3, "{ours}");
    assert!(ours["connections"].as_u64().is_some(), "{ours}");
    assert!(ours["created_at_ms"].as_i64().is_some() && ours["idle_ms"].as_i64().is_some(), "{ours}");

    // At most 16 watchers; one closed frees its place.
    let mut open = Vec::new();
    for _ in 0..16 {
        let r = watch(&server).await;
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let refused = watch(&server).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    drop(open.pop());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let again = watch(&server).await;
        if again.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "a closed watcher frees its place");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for call in calls {
        call.abort();
    }
}

#[tokio::test]
async fn the_audit_route_shows_the_latest_decisions_filtered_or_says_it_is_off() {
    let off = start(None).await;
    let (status, body) = off.admin("/admin/audit").await;
    assert_eq!((status, &body["enabled"]), (200, &json!(false)), "{body}");

    let dir = tempfile::tempdir().unwrap();
    let audit = AuditLog::open(&dir.path().join("audit.jsonl")).unwrap();
    let allow = Decision::Allow { rules: vec![] };
    let deny = Decision::Deny { rules: vec!["false".into()], scopes: vec![] };
    audit.record("gw", "tools/call", Target::Tool("read"), None, "alice", &allow);
    audit.record("gw", "tools/call", Target::Tool("<b>write</b>"), None, "bob", &deny);
    audit.record("", "tools/list", Target::Tool("secret"), None, "bob", &deny);
    let server = start(Some(audit)).await;
    let (_, all) = server.admin("/admin/audit").await;
    assert_eq!(all["enabled"], true);
    let names: Vec<&str> = all["decisions"].as_array().unwrap().iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, ["secret", "<b>write</b>", "read"], "newest first");
    let (_, denied) = server.admin("/admin/audit?principal=bob&decision=deny").await;
    assert_eq!(denied["decisions"].as_array().map(Vec::len), Some(1), "{denied}");
    assert_eq!(denied["decisions"][0]["endpoint"], "/mcp/gw");
    let (_, hidden) = server.admin("/admin/audit?decision=hidden&limit=5").await;
    assert_eq!(hidden["decisions"][0]["name"], "secret");
    let (status, _) = server.admin("/admin/audit?decision=maybe").await;
    assert_eq!(status, 400);
}
