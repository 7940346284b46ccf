//! Support for the tests that talk to a real server over loopback TCP with
//! raw sockets (`connections.rs`, `store_faults.rs`): the server on
//! 127.0.0.1:0 with a small tool app, and an HTTP/1.1 client that shows
//! exactly what came over the wire, with a generous bound on every read so
//! that a hang fails the test instead of stalling it.
#![allow(dead_code)]

pub mod history;
pub mod load;
pub mod proxy;
pub mod redis_server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_server::http::Auth;
use tether_server::http::HttpConfig;
use tether_server::rmcp_model::{CallToolResult, Implementation, Tool};
use tether_server::{Engine, EngineConfig, RequestCtx, RpcError, ToolApp, ToolRouter};
use tether_store::Store;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longer than any wait of these tests: reaching it means a hang.
pub const HANG: Duration = Duration::from_secs(10);

pub const PROTOCOL: &str = "2025-06-18";

/// `echo` answers at once; `sleep` answers after `ms` milliseconds;
/// `chatty` sends `n` log notifications on its stream, then answers;
/// `gated` waits for the test to open gate `before` (if named), sends one
/// log notification if `notify`, waits for gate `after` (if named), then
/// answers: a test places a fault between a request's events without timing.
pub struct Tools;

/// The gates `gated` waits on, by name (see [`open_gate`]).
fn gates() -> &'static parking_lot::Mutex<std::collections::HashMap<String, tokio::sync::watch::Sender<bool>>> {
    static GATES: std::sync::OnceLock<parking_lot::Mutex<std::collections::HashMap<String, tokio::sync::watch::Sender<bool>>>> =
        std::sync::OnceLock::new();
    GATES.get_or_init(Default::default)
}

fn gate(name: &str) -> tokio::sync::watch::Sender<bool> {
    gates().lock().entry(name.to_owned()).or_insert_with(|| tokio::sync::watch::channel(false).0).clone()
}

/// Lets every `gated` call waiting on gate `name` (or coming to it later) on.
pub fn open_gate(name: &str) {
    gate(name).send_replace(true);
}

async fn pass_gate(name: Option<&str>) {
    if let Some(name) = name {
        let mut open = gate(name).subscribe();
        // The sender lives in the map for the test's whole run.
        let _ = open.wait_for(|open| *open).await;
    }
}

#[async_trait::async_trait]
impl ToolApp for Tools {
    fn server_info(&self) -> Implementation {
        Implementation::new("raw-socket-tests", "0")
    }

    fn tools(&self) -> Vec<Tool> {
        let schema = Arc::new(Map::new());
        ["echo", "sleep", "chatty", "gated"].into_iter().map(|n| Tool::new(n, n, schema.clone())).collect()
    }

    async fn call_tool(&self, ctx: RequestCtx, name: &str, args: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        if name == "sleep" {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(100);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if name == "gated" {
            pass_gate(args.get("before").and_then(Value::as_str)).await;
            if args.get("notify").and_then(Value::as_bool).unwrap_or(false) {
                ctx.notify("notifications/message", Some(json!({"level": "info", "data": "gated"}))).await?;
            }
            pass_gate(args.get("after").and_then(Value::as_str)).await;
        }
        if name == "chatty" {
            for i in 0..args.get("n").and_then(Value::as_u64).unwrap_or(1) {
                ctx.notify("notifications/message", Some(json!({"level": "info", "data": i}))).await?;
            }
        }
        Ok(CallToolResult::structured(Value::Object(args)))
    }
}

/// Serves [`Tools`] on `store` at a loopback port until the test's runtime ends.
pub async fn serve(store: Arc<dyn Store>, config: EngineConfig) -> (SocketAddr, Engine) {
    serve_http(store, config, HttpConfig::default()).await
}

/// [`serve`] with the HTTP front's settings `http`.
pub async fn serve_http(store: Arc<dyn Store>, config: EngineConfig, http: HttpConfig) -> (SocketAddr, Engine) {
    let engine = Engine::new(store, Arc::new(ToolRouter::new(Tools)), config);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
    let addr = listener.local_addr().expect("the listener's address");
    let served = engine.clone();
    tokio::spawn(async move {
        let _ = tether_server::http::serve(listener, served, Auth::disabled(), http, std::future::pending()).await;
    });
    (addr, engine)
}

/// A response as it came: status, headers (names lower-cased), body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC message in a JSON body or in the SSE body's last `data:` line.
    pub fn message(&self) -> Value {
        let text = self.text();
        let data = text.lines().filter_map(|l| l.strip_prefix("data:")).rfind(|d| !d.trim().is_empty());
        serde_json::from_str(data.unwrap_or(&text).trim()).unwrap_or(Value::Null)
    }
}

/// A request's bytes: `headers` as given, `Content-Length` added for a body.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut text = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        text.push_str(&format!("Content-Length: {}\r\nContent-Type: application/json\r\n", body.len()));
    }
    text.push_str("\r\n");
    text.push_str(body);
    text
}

/// A JSON-RPC POST to /mcp (on the session `session`, if any).
pub fn post(body: &Value, session: Option<&str>, extra: &[(&str, &str)]) -> String {
    let mut headers = vec![("Accept", "application/json, text/event-stream"), ("MCP-Protocol-Version", PROTOCOL)];
    if let Some(session) = session {
        headers.push(("Mcp-Session-Id", session));
    }
    headers.extend_from_slice(extra);
    request("POST", "/mcp", &headers, &body.to_string())
}

pub fn initialize_body() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

pub fn call_body(id: u64, tool: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}})
}

/// Reads one response head; `None` if the connection closed (or was reset)
/// before one came.
pub async fn read_head(tcp: &mut TcpStream, buffered: &mut Vec<u8>) -> Option<(u16, Vec<(String, String)>)> {
    loop {
        if let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffered[..end]).into_owned();
            buffered.drain(..end + 4);
            let mut lines = head.lines();
            let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            return Some((status, headers));
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(HANG, tcp.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => buffered.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("no response head within {HANG:?}: the server hangs"),
        }
    }
}

/// Reads one whole response: a `Content-Length` body, a chunked one to its
/// last chunk, or else everything until the server closes.
pub async fn read_response(tcp: &mut TcpStream) -> Option<Response> {
    let mut buffered = Vec::new();
    let (status, headers) = read_head(tcp, &mut buffered).await?;
    let length = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse::<usize>().ok());
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(n) = length
            && buffered.len() >= n
        {
            break;
        }
        if chunked && let Some(body) = dechunk(&buffered) {
            buffered = body;
            break;
        }
        match tokio::time::timeout(HANG, tcp.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => buffered.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("no complete response body within {HANG:?}: the server hangs"),
        }
    }
    Some(Response { status, headers, body: buffered })
}

/// A chunked body's bytes, once its last chunk is in `raw`.
fn dechunk(raw: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = at + raw[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&raw[at..line_end]).ok()?.trim(), 16).ok()?;
        let start = line_end + 2;
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(raw.get(start..start + size)?);
        at = start + size + 2;
    }
}

/// Sends `text` on a new connection and reads the answer.
pub async fn exchange(addr: SocketAddr, text: &str) -> Response {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(text.as_bytes()).await.expect("send the request");
    read_response(&mut tcp).await.expect("a response before the connection closed")
}

/// Waits until the server closes `tcp` (EOF or reset); panics if it does
/// not within [`HANG`]. What arrived meanwhile is returned.
pub async fn closed_by_server(tcp: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout(HANG, tcp.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(n)) => seen.extend_from_slice(&chunk[..n]),
            Err(_) => panic!("the server kept the connection open for {HANG:?}"),
        }
    }
}

/// A new session's ID.
pub async fn initialize(addr: SocketAddr) -> String {
    let response = exchange(addr, &post(&initialize_body(), None, &[("Connection", "close")])).await;
    assert_eq!(response.status, 200, "initialize: {}", response.text());
    response.header("mcp-session-id").expect("initialize returns a session ID").to_owned()
}

/// A GET that replays `session`'s stream after `last_event_id` (the
/// connection closes when the server ends the stream).
pub fn replay_request(session: &str, last_event_id: &str) -> String {
    let headers = [
        ("Accept", "text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", PROTOCOL),
        ("Last-Event-ID", last_event_id),
        ("Connection", "close"),
    ];
    request("GET", "/mcp", &headers, "")
}

/// A fault test's seed: `TETHER_FAULT_SEED`, else a fresh one; printed
/// either way, so a failing run can be replayed.
pub fn fault_seed(test: &str) -> u64 {
    let seed = std::env::var("TETHER_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("{test}: TETHER_FAULT_SEED={seed}");
    seed
}

/// How long a fault test runs its load: `TETHER_FAULT_SECS`, else `default`
/// (`scripts/faults --minutes N` sets it).
pub fn fault_load_time(default: f64) -> Duration {
    let secs = std::env::var("TETHER_FAULT_SECS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(default);
    Duration::from_secs_f64(secs)
}
