//! One MCP session over Streamable HTTP (protocol 2025-03-26 and later), or
//! over the 2024-11-05 HTTP+SSE transport when the server only speaks that.
//!
//! Streamable HTTP: every message is a POST (`Accept: application/json,
//! text/event-stream`); a request is answered with JSON or with an SSE stream
//! that may carry server requests and notifications before the response. A
//! response stream that drops before the response is resumed with `GET` +
//! `Last-Event-ID` after the server's `retry`. A background task keeps the
//! standalone GET stream open (reconnecting with `Last-Event-ID`, capped
//! backoff). `close` sends DELETE.
//!
//! HTTP+SSE: a GET opens the event stream, whose `endpoint` event names the
//! URL to POST messages to; every answer arrives on the event stream.
//!
//! Server-to-client messages from any stream go to one bounded channel
//! (`take_incoming`); requests among them are answered with `respond`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::{ClientError, ReqError};
use crate::sse::{Events, MAX_MESSAGE_BYTES, read_body};

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
const LAST_EVENT_ID: &str = "last-event-id";
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
/// Server messages buffered for `take_incoming`.
const INCOMING_BUFFER: usize = 256;
/// Reconnect delay when the server named none.
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between two reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Attempts to resume one response stream before giving up.
const MAX_RESUME_ATTEMPTS: u32 = 8;
/// Error bodies are read up to this size for their message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long `connect` waits for the standalone stream to open.
const STANDALONE_READY_WAIT: Duration = Duration::from_secs(1);
/// Connection establishment limit (the request itself has `request_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach a server: credentials, extra headers, the time limit of one request.
#[derive(Clone)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// Extra HTTP headers on every request.
    pub headers: Vec<(String, String)>,
    /// Limit for one request, from sending it to its response (default 60s).
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self { bearer_token: None, headers: Vec::new(), request_timeout: Duration::from_secs(60) }
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A message the server sent to the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerMessage {
    Request { id: Value, method: String, params: Option<Value> },
    Notification { method: String, params: Option<Value> },
}

/// One MCP session over Streamable HTTP (or the 2024-11-05 HTTP+SSE fallback).
/// Cheap to clone; all clones share the session.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

/// A handle that does not keep the session alive.
#[derive(Clone)]
pub(crate) struct WeakSession(Weak<Inner>);

impl WeakSession {
    pub(crate) fn upgrade(&self) -> Option<Session> {
        self.0.upgrade().map(|inner| Session { inner })
    }
}

enum Kind {
    Streamable,
    Legacy(Arc<LegacyChannel>),
}

struct Inner {
    http: reqwest::Client,
    /// The URL the caller gave (Streamable: where every message goes).
    url: String,
    options: ClientOptions,
    /// Authorization and the caller's extra headers.
    base_headers: HeaderMap,
    kind: Kind,
    session_id: OnceLock<String>,
    protocol_version: OnceLock<String>,
    next_id: AtomicI64,
    incoming_tx: mpsc::Sender<ServerMessage>,
    incoming_rx: Mutex<Option<mpsc::Receiver<ServerMessage>>>,
    closed: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.closed.send(true);
        if let Ok(tasks) = self.tasks.get_mut() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
    }
}

/// One JSON-RPC message from the server, sorted.
enum Incoming {
    Response { id: Value, outcome: Result<Value, Value> },
    Server(ServerMessage),
}

fn sort_message(v: Value) -> Option<Incoming> {
    let Value::Object(mut m) = v else { return None };
    let params = m.remove("params");
    match (m.remove("method"), m.remove("id")) {
        (Some(Value::String(method)), Some(id)) => Some(Incoming::Server(ServerMessage::Request { id, method, params })),
        (Some(Value::String(method)), None) => Some(Incoming::Server(ServerMessage::Notification { method, params })),
        (None, Some(id)) => {
            if let Some(error) = m.remove("error") {
                Some(Incoming::Response { id, outcome: Err(error) })
            } else {
                Some(Incoming::Response { id, outcome: Ok(m.remove("result").unwrap_or(Value::Null)) })
            }
        }
        _ => None,
    }
}

fn same_id(a: &Value, b: &Value) -> bool {
    a == b || matches!((a, b), (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) if s == &n.to_string())
}

fn outcome_to_result(outcome: Result<Value, Value>) -> Result<Value, ReqError> {
    outcome.map_err(|error| ReqError::Client(ClientError::from_rpc_object(&error)))
}

fn backoff(retry: Option<Duration>, failures: u32) -> Duration {
    let base = retry.unwrap_or(DEFAULT_RETRY).min(MAX_BACKOFF);
    let factor = 1u32 << failures.saturating_sub(1).min(5);
    (base * factor).min(MAX_BACKOFF)
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// The message of an error body: a JSON-RPC error's message, a JSON
/// `error`/`message` field, or the start of the text.
async fn error_message(response: reqwest::Response) -> String {
    let status = response.status();
    let body = read_body(response, MAX_ERROR_BODY).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error_description"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str);
        if let Some(m) = found {
            return m.to_owned();
        }
    }
    let text = text.trim();
    if text.is_empty() {
        return status.canonical_reason().unwrap_or("no details").to_owned();
    }
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace(['\n', '\r'], " ")
}

fn build_base_headers(options: &ClientOptions) -> Result<HeaderMap, ClientError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &options.headers {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ClientError::Config(format!("header name {name:?} is not a valid HTTP header name")))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| ClientError::Config(format!("the value of header {name} is not a valid HTTP header value")))?;
        headers.append(n, v);
    }
    if let Some(token) = &options.bearer_token {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::Config("the bearer token contains characters not allowed in an HTTP header".into()))?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    Ok(headers)
}

pub(crate) fn http_client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| ClientError::Transport(format!("cannot set up the HTTP client: {e}")))
}

fn check_url(url: &str) -> Result<reqwest::Url, ClientError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ClientError::Config(format!("{url:?} is not a valid URL ({e}); expected e.g. http://127.0.0.1:8787/mcp")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ClientError::Config(format!("{url}: only http:// and https:// URLs are supported")));
    }
    Ok(parsed)
}

fn transport_error(url: &str, e: reqwest::Error) -> ClientError {
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "request failed"
    };
    // reqwest's Display leaves out the cause ("connection refused" etc.).
    let mut cause = String::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if cause.is_empty() {
        ClientError::Transport(format!("{what} to {url}: {e}"))
    } else {
        ClientError::Transport(format!("{what} to {url}: {cause}; is the server running there?"))
    }
}

impl Session {
    /// POST initialize with exactly these params (the caller may put `_meta` in them), then
    /// notifications/initialized; opens the standalone GET stream in the background
    /// (reconnecting with Last-Event-ID, honouring `retry`, capped backoff). Returns the
    /// session and the initialize RESULT object (including its `_meta`).
    ///
    /// A POST initialize answered 400, 404 or 405 is retried over the
    /// 2024-11-05 HTTP+SSE transport.
    pub async fn connect(url: &str, options: ClientOptions, initialize_params: Value) -> Result<(Session, Value), ClientError> {
        check_url(url)?;
        let http = http_client()?;
        let session = Session::build(http.clone(), url, options.clone(), Kind::Streamable)?;
        match session.initialize_streamable(initialize_params.clone()).await {
            Ok(result) => Ok((session, result)),
            Err(ReqError::Status { status: status @ (400 | 404 | 405), message, url: u }) => {
                drop(session);
                match Session::connect_legacy(http, url, options, initialize_params).await {
                    Ok(done) => Ok(done),
                    Err(legacy) => Err(ClientError::Transport(format!(
                        "the server at {u} answered initialize with HTTP {status}: {message} \
                         (and the 2024-11-05 HTTP+SSE fallback failed too: {legacy})"
                    ))),
                }
            }
            Err(e) => Err(e.into_client()),
        }
    }

    /// Like [`Session::connect`], straight over the 2024-11-05 HTTP+SSE
    /// transport (no Streamable HTTP probe): for a server known to speak only it.
    pub async fn connect_legacy_transport(url: &str, options: ClientOptions, initialize_params: Value) -> Result<(Session, Value), ClientError> {
        check_url(url)?;
        Session::connect_legacy(http_client()?, url, options, initialize_params).await
    }

    /// A session without `initialize` for servers that need none
    /// (stateless Streamable HTTP): requests carry no `Mcp-Session-Id` and
    /// announce `protocol_version`.
    pub fn sessionless(url: &str, options: ClientOptions, protocol_version: &str) -> Result<Session, ClientError> {
        check_url(url)?;
        let session = Session::build(http_client()?, url, options, Kind::Streamable)?;
        let _ = session.inner.protocol_version.set(protocol_version.to_owned());
        Ok(session)
    }

    fn build(http: reqwest::Client, url: &str, options: ClientOptions, kind: Kind) -> Result<Session, ClientError> {
        let base_headers = build_base_headers(&options)?;
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_BUFFER);
        let (closed, _) = watch::channel(false);
        Ok(Session {
            inner: Arc::new(Inner {
                http,
                url: url.to_owned(),
                options,
                base_headers,
                kind,
                session_id: OnceLock::new(),
                protocol_version: OnceLock::new(),
                next_id: AtomicI64::new(0),
                incoming_tx,
                incoming_rx: Mutex::new(Some(incoming_rx)),
                closed,
                tasks: Mutex::new(Vec::new()),
            }),
        })
    }

    pub fn session_id(&self) -> Option<String> {
        self.inner.session_id.get().cloned()
    }

    pub fn protocol_version(&self) -> String {
        self.inner.protocol_version.get().cloned().unwrap_or_else(|| crate::DEFAULT_PROTOCOL_VERSION.to_owned())
    }

    /// The URL this session was opened on.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Whether this session runs over the 2024-11-05 HTTP+SSE transport.
    pub fn is_legacy(&self) -> bool {
        matches!(self.inner.kind, Kind::Legacy(_))
    }

    pub(crate) fn downgrade(&self) -> WeakSession {
        WeakSession(Arc::downgrade(&self.inner))
    }

    pub(crate) fn same_as(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A request; server-to-client requests/notifications that arrive on its SSE stream are
    /// delivered to `incoming`; returns the result or ClientError::Rpc.
    pub async fn request(&self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        self.request_raw(method, params, None).await.map_err(ReqError::into_client)
    }

    /// `request`, keeping the HTTP status of a refusal; `accepted` runs
    /// once the server accepted the request (2xx), before its answer.
    pub(crate) async fn request_raw(
        &self,
        method: &str,
        params: Option<Value>,
        accepted: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Value, ReqError> {
        let id = json!(self.inner.next_id.fetch_add(1, Ordering::Relaxed));
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            message["params"] = p;
        }
        let work = async {
            match &self.inner.kind {
                Kind::Streamable => self.inner.streamable_request(&message, &id, accepted).await,
                Kind::Legacy(channel) => self.inner.legacy_request(channel, &message, &id, accepted).await,
            }
        };
        // Dropped before the answer (the caller gave up, e.g. a bridge whose
        // host cancelled) or timed out: the server is told to stop the work.
        let mut cancel = CancelOnDrop { session: self, id: id.clone(), reason: (method != "initialize").then_some("cancelled by the caller") };
        let limit = self.inner.options.request_timeout;
        match tokio::time::timeout(limit, work).await {
            Ok(r) => {
                cancel.reason = None;
                r
            }
            Err(_) => {
                cancel.reason = cancel.reason.and(Some("client timeout"));
                Err(ReqError::Client(ClientError::Transport(format!(
                    "no answer to {method} from {} within {}; the server may be overloaded (raise the request timeout to wait longer)",
                    self.inner.url,
                    humantime::format_duration(limit)
                ))))
            }
        }
    }

    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), ClientError> {
        let mut message = json!({"jsonrpc": "2.0", "method": method});
        if let Some(p) = params {
            message["params"] = p;
        }
        self.inner.send_one_way(&message).await.map_err(ReqError::into_client)
    }

    /// Answer a server-to-client request (POST of a JSON-RPC response).
    pub async fn respond(&self, id: Value, result: Result<Value, Value>) -> Result<(), ClientError> {
        let message = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
        };
        self.inner.send_one_way(&message).await.map_err(ReqError::into_client)
    }

    /// Server messages (from any stream). Can be taken once.
    pub fn take_incoming(&self) -> Option<mpsc::Receiver<ServerMessage>> {
        self.inner.incoming_rx.lock().ok()?.take()
    }

    /// Whether [`Session::close`] has begun (requests in flight then fail).
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// DELETE (errors logged, not returned).
    pub async fn close(&self) {
        if self.inner.closed.send_replace(true) {
            return;
        }
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
        match &self.inner.kind {
            Kind::Legacy(channel) => {
                // Closing the event stream ends an HTTP+SSE session.
                channel.alive.store(false, Ordering::Release);
            }
            Kind::Streamable => {
                let Some(sid) = self.session_id() else { return };
                let request = self.inner.http.delete(&self.inner.url).headers(self.inner.headers(false));
                match tokio::time::timeout(Duration::from_secs(10), request.send()).await {
                    Ok(Ok(r)) if r.status().is_success() || r.status() == StatusCode::NOT_FOUND => {
                        tracing::debug!(url = %self.inner.url, "session {sid} terminated");
                    }
                    Ok(Ok(r)) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                        tracing::debug!(url = %self.inner.url, "the server does not allow DELETE; session left to expire");
                    }
                    Ok(Ok(r)) => {
                        let status = r.status();
                        let message = error_message(r).await;
                        tracing::warn!(url = %self.inner.url, "terminating the session: HTTP {status}: {message}");
                    }
                    Ok(Err(e)) => tracing::warn!(url = %self.inner.url, "terminating the session: {}", transport_error(&self.inner.url, e)),
                    Err(_) => tracing::warn!(url = %self.inner.url, "terminating the session: no answer to DELETE within 10s"),
                }
            }
        }
    }

    /// Stops this session's background work without telling the server
    /// (for a session the server already forgot).
    pub(crate) fn abandon(&self) {
        let _ = self.inner.closed.send_replace(true);
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            for t in tasks.drain(..) {
                t.abort();
            }
        }
        if let Kind::Legacy(channel) = &self.inner.kind {
            channel.alive.store(false, Ordering::Release);
        }
    }

    async fn initialize_streamable(&self, params: Value) -> Result<Value, ReqError> {
        let result = self.request_raw("initialize", Some(params), None).await?;
        self.finish_initialize(&result)?;
        self.notify("notifications/initialized", None).await?;
        if self.inner.session_id.get().is_some() {
            let weak = Arc::downgrade(&self.inner);
            let closed = self.inner.closed.subscribe();
            let (ready_tx, ready_rx) = oneshot::channel();
            let task = tokio::spawn(standalone_stream(weak, closed, ready_tx));
            if let Ok(mut tasks) = self.inner.tasks.lock() {
                tasks.push(task);
            }
            // Servers drop session-level messages (e.g. a `roots/list` asked
            // by the first tool call) while no standalone stream is open:
            // give it a moment to open before the caller's first request.
            let _ = tokio::time::timeout(STANDALONE_READY_WAIT, ready_rx).await;
        }
        Ok(result)
    }

    fn finish_initialize(&self, result: &Value) -> Result<(), ClientError> {
        let version = result.get("protocolVersion").and_then(Value::as_str).ok_or_else(|| {
            ClientError::Transport(format!("the initialize result from {} has no protocolVersion; is this an MCP server?", self.inner.url))
        })?;
        let _ = self.inner.protocol_version.set(version.to_owned());
        Ok(())
    }

    async fn connect_legacy(
        http: reqwest::Client,
        url: &str,
        options: ClientOptions,
        initialize_params: Value,
    ) -> Result<(Session, Value), ClientError> {
        let base = build_base_headers(&options)?;
        let mut headers = base.clone();
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        let response = tokio::time::timeout(options.request_timeout, http.get(url).headers(headers).send())
            .await
            .map_err(|_| ClientError::Transport(format!("no answer to GET {url}")))?
            .map_err(|e| transport_error(url, e))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ClientError::Auth { status: status.as_u16(), message: error_message(response).await });
        }
        if !status.is_success() || !content_type(&response).starts_with("text/event-stream") {
            return Err(ClientError::Transport(format!("GET {url} answered HTTP {status} without an event stream")));
        }
        let mut events = Events::new(response);
        let endpoint = tokio::time::timeout(options.request_timeout, async {
            while let Some(event) = events.next().await {
                match event {
                    Ok(e) if e.kind == "endpoint" => return Ok(e.data.trim().to_owned()),
                    Ok(_) => continue,
                    Err(e) => return Err(e),
                }
            }
            Err("the event stream ended before an `endpoint` event".to_owned())
        })
        .await
        .map_err(|_| ClientError::Transport(format!("GET {url}: no `endpoint` event")))?
        .map_err(|e| ClientError::Transport(format!("GET {url}: {e}")))?;
        let base_url = check_url(url)?;
        let post_url = base_url
            .join(&endpoint)
            .map_err(|e| ClientError::Transport(format!("the server's endpoint {endpoint:?} is not a URL: {e}")))?;
        if post_url.origin() != base_url.origin() {
            return Err(ClientError::Transport(format!(
                "the server's endpoint {post_url} is on another origin than {url}; refusing to send messages there"
            )));
        }
        let channel = Arc::new(LegacyChannel {
            endpoint: post_url.to_string(),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
        });
        let session = Session::build(http, url, options, Kind::Legacy(channel.clone()))?;
        let reader = tokio::spawn(legacy_reader(Arc::downgrade(&session.inner), channel, events));
        if let Ok(mut tasks) = session.inner.tasks.lock() {
            tasks.push(reader);
        }
        let result = session.request_raw("initialize", Some(initialize_params), None).await.map_err(ReqError::into_client)?;
        session.finish_initialize(&result)?;
        session.notify("notifications/initialized", None).await?;
        Ok((session, result))
    }
}

impl Inner {
    /// Headers for a request: auth, the caller's, and the session's.
    fn headers(&self, post: bool) -> HeaderMap {
        let mut h = self.base_headers.clone();
        if post {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
            h.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        } else {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        }
        if let Kind::Streamable = self.kind {
            if let Some(v) = self.session_id.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(SESSION_HEADER, v);
            }
            if let Some(v) = self.protocol_version.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(VERSION_HEADER, v);
            }
        }
        h
    }

    fn has_session(&self) -> bool {
        self.session_id.get().is_some()
    }

    /// POSTs one message; refusals become errors (401/403: `Auth`, 404 on a
    /// session: `SessionNotFound`, others: `Status`).
    async fn post(&self, url: &str, message: &Value) -> Result<reqwest::Response, ReqError> {
        let body = serde_json::to_vec(message).map_err(|e| ClientError::Transport(format!("cannot encode the message: {e}")))?;
        let response = self
            .http
            .post(url)
            .headers(self.headers(true))
            .body(body)
            .send()
            .await
            .map_err(|e| transport_error(&self.url, e))?;
        self.check_status(response).await
    }

    async fn check_status(&self, response: reqwest::Response) -> Result<reqwest::Response, ReqError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let message = error_message(response).await;
            return Err(ReqError::Client(ClientError::Auth { status: status.as_u16(), message }));
        }
        let is_legacy = matches!(self.kind, Kind::Legacy(_));
        if status == StatusCode::NOT_FOUND && (self.has_session() || is_legacy) {
            return Err(ReqError::Client(ClientError::SessionNotFound));
        }
        let message = error_message(response).await;
        Err(ReqError::Status { status: status.as_u16(), message, url: self.url.clone() })
    }

    async fn streamable_request(
        &self,
        message: &Value,
        id: &Value,
        accepted: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Value, ReqError> {
        let initializing = message.get("method").and_then(Value::as_str) == Some("initialize");
        let response = self.post(&self.url, message).await?;
        if let Some(sid) = response.headers().get(SESSION_HEADER).filter(|_| initializing) {
            let sid = sid
                .to_str()
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b)))
                .ok_or_else(|| ClientError::Transport("the server sent an Mcp-Session-Id that is not visible ASCII".into()))?;
            let _ = self.session_id.set(sid.to_owned());
        }
        if let Some(f) = accepted {
            f();
        }
        if response.status() == StatusCode::ACCEPTED {
            return Err(ClientError::Transport(format!(
                "the server at {} accepted a request without answering it (HTTP 202)",
                self.url
            ))
            .into());
        }
        let ct = content_type(&response);
        if ct.starts_with("text/event-stream") {
            self.read_response_stream(Events::new(response), message, id).await
        } else if ct.starts_with("application/json") {
            let body = read_body(response, MAX_MESSAGE_BYTES).await.map_err(ClientError::Transport)?;
            let parsed: Value = serde_json::from_slice(&body)
                .map_err(|e| ClientError::Transport(format!("the server at {} sent invalid JSON: {e}", self.url)))?;
            let messages = match parsed {
                Value::Array(items) => items,
                single => vec![single],
            };
            let mut answer = None;
            for m in messages {
                match sort_message(m) {
                    Some(Incoming::Response { id: rid, outcome }) if same_id(&rid, id) => answer = Some(outcome),
                    Some(Incoming::Server(msg)) => self.deliver(msg).await,
                    _ => {}
                }
            }
            match answer {
                Some(outcome) => outcome_to_result(outcome),
                None => Err(ClientError::Transport(format!("the server at {} answered without a response to request {id}", self.url)).into()),
            }
        } else {
            Err(ClientError::Transport(format!(
                "the server at {} answered with content type {ct:?}; expected application/json or text/event-stream",
                self.url
            ))
            .into())
        }
    }

    /// Reads a request's SSE stream up to its response, resuming it with
    /// `GET` + `Last-Event-ID` when it drops first.
    async fn read_response_stream(&self, mut events: Events, message: &Value, id: &Value) -> Result<Value, ReqError> {
        let method = message.get("method").and_then(Value::as_str).unwrap_or("request");
        let mut failures = 0u32;
        loop {
            let mut broke = None;
            while let Some(item) = events.next().await {
                let event = match item {
                    Ok(e) => e,
                    Err(e) => {
                        broke = Some(e);
                        break;
                    }
                };
                if event.kind != "message" {
                    continue;
                }
                let Ok(value) = serde_json::from_str::<Value>(&event.data) else {
                    tracing::warn!(url = %self.url, "ignoring an SSE event that is not JSON");
                    continue;
                };
                match sort_message(value) {
                    Some(Incoming::Response { id: rid, outcome }) if same_id(&rid, id) => return outcome_to_result(outcome),
                    Some(Incoming::Server(msg)) => self.deliver(msg).await,
                    _ => {}
                }
            }
            if events.received_any {
                failures = 0;
            }
            let why = broke.map(|e| format!(" ({e})")).unwrap_or_default();
            let Some(last) = events.last_id.clone() else {
                return Err(ClientError::Transport(format!(
                    "the server at {} closed the stream of {method} before answering{why}, and gave no event ID to resume from",
                    self.url
                ))
                .into());
            };
            failures += 1;
            if failures > MAX_RESUME_ATTEMPTS {
                return Err(ClientError::Transport(format!(
                    "the stream of {method} from {} dropped {MAX_RESUME_ATTEMPTS} times before its answer{why}",
                    self.url
                ))
                .into());
            }
            let delay = backoff(events.retry, failures);
            tracing::debug!(url = %self.url, "the stream of {method} dropped{why}; resuming after event {last} in {delay:?}");
            tokio::time::sleep(delay).await;
            let retry = events.retry;
            let request = self.http.get(&self.url).headers(self.headers(false)).header(LAST_EVENT_ID, last.as_str());
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(url = %self.url, "resuming: {}", transport_error(&self.url, e));
                    // Try again from the same event.
                    events = Events::empty(Some(last), retry);
                    continue;
                }
            };
            let status = response.status();
            if !status.is_success() {
                let detail = error_message(response).await;
                return Err(ClientError::Transport(format!(
                    "the stream of {method} dropped before its answer and the server at {} refused to resume it (HTTP {status}: {detail})",
                    self.url
                ))
                .into());
            }
            let mut resumed = Events::new(response);
            resumed.last_id = Some(last);
            resumed.retry = retry;
            events = resumed;
        }
    }

    /// POSTs a notification or a response (answered 202, or 200 by some servers).
    async fn send_one_way(&self, message: &Value) -> Result<(), ReqError> {
        let url = match &self.kind {
            Kind::Streamable => self.url.as_str(),
            Kind::Legacy(channel) => {
                if !channel.alive.load(Ordering::Acquire) {
                    return Err(ClientError::SessionNotFound.into());
                }
                channel.endpoint.as_str()
            }
        };
        let send = self.post(url, message);
        let response = tokio::time::timeout(self.options.request_timeout, send)
            .await
            .map_err(|_| ClientError::Transport(format!("no answer from {} to a notification", self.url)))??;
        drop(response);
        Ok(())
    }

    async fn legacy_request(
        &self,
        channel: &LegacyChannel,
        message: &Value,
        id: &Value,
        accepted: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Value, ReqError> {
        if !channel.alive.load(Ordering::Acquire) {
            return Err(ClientError::SessionNotFound.into());
        }
        let (tx, rx) = oneshot::channel();
        let key = id.to_string();
        if let Ok(mut pending) = channel.pending.lock() {
            pending.insert(key.clone(), tx);
        }
        let posted = self.post(&channel.endpoint, message).await;
        if let Err(e) = posted {
            if let Ok(mut pending) = channel.pending.lock() {
                pending.remove(&key);
            }
            return Err(e);
        }
        if let Some(f) = accepted {
            f();
        }
        match rx.await {
            Ok(outcome) => outcome,
            Err(_) => Err(ClientError::Transport(format!(
                "the server at {} closed its event stream before answering",
                self.url
            ))
            .into()),
        }
    }

    /// Hands a server message to `take_incoming`'s receiver. Before the
    /// receiver is taken, messages wait in the bounded buffer (dropped
    /// when it is full); after, the stream waits for room.
    async fn deliver(&self, message: ServerMessage) {
        let taken = self.incoming_rx.lock().map(|r| r.is_none()).unwrap_or(true);
        if taken {
            let _ = self.incoming_tx.send(message).await;
        } else if self.incoming_tx.try_send(message).is_err() {
            tracing::debug!(url = %self.url, "no one reads this session's server messages; dropping one");
        }
    }
}

impl Events {
    /// A stream with nothing in it (to retry a resume from `last_id`).
    fn empty(last_id: Option<String>, retry: Option<Duration>) -> Events {
        let mut e = Events::with_limit(Box::pin(futures::stream::empty()), MAX_MESSAGE_BYTES);
        e.last_id = last_id;
        e.retry = retry;
        e
    }
}

/// The standalone GET stream of a Streamable HTTP session: open, deliver,
/// reconnect with `Last-Event-ID` after `retry` (capped backoff); ends when
/// the session closes or the server offers none (405) or forgot it (404).
async fn standalone_stream(weak: Weak<Inner>, mut closed: watch::Receiver<bool>, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut last_id: Option<String> = None;
    let mut retry: Option<Duration> = None;
    let mut failures = 0u32;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let url = inner.url.clone();
        let mut request = inner.http.get(&inner.url).headers(inner.headers(false));
        if let Some(id) = &last_id {
            request = request.header(LAST_EVENT_ID, id.as_str());
        }
        drop(inner);
        let response = tokio::select! {
            r = request.send() => r,
            _ = closed.changed() => return,
        };
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        match response {
            Ok(r) if r.status().is_success() && content_type(&r).starts_with("text/event-stream") => {
                let mut events = Events::new(r);
                events.last_id = last_id.clone();
                loop {
                    let item = tokio::select! {
                        item = events.next() => item,
                        _ = closed.changed() => return,
                    };
                    match item {
                        Some(Ok(event)) if event.kind == "message" => {
                            let Ok(value) = serde_json::from_str::<Value>(&event.data) else { continue };
                            if let Some(Incoming::Server(msg)) = sort_message(value) {
                                let Some(inner) = weak.upgrade() else { return };
                                inner.deliver(msg).await;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            tracing::debug!(%url, "standalone stream broke: {e}");
                            break;
                        }
                        None => break,
                    }
                }
                last_id = events.last_id.clone();
                retry = events.retry.or(retry);
                failures = if events.received_any { 1 } else { failures + 1 };
            }
            Ok(r) if r.status() == StatusCode::METHOD_NOT_ALLOWED => {
                tracing::debug!(%url, "the server offers no standalone stream");
                return;
            }
            Ok(r) if r.status() == StatusCode::NOT_FOUND => {
                tracing::debug!(%url, "standalone stream: the server forgot the session");
                return;
            }
            Ok(r) => {
                failures += 1;
                tracing::debug!(%url, "standalone stream: HTTP {}", r.status());
            }
            Err(e) => {
                failures += 1;
                tracing::debug!(%url, "standalone stream: {e}");
            }
        }
        let delay = backoff(retry, failures);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closed.changed() => return,
        }
    }
}

/// The state of an HTTP+SSE (2024-11-05) session.
struct LegacyChannel {
    /// Where messages are POSTed (from the `endpoint` event).
    endpoint: String,
    /// Requests waiting for their answer on the event stream.
    pending: Mutex<HashMap<String, oneshot::Sender<Result<Value, ReqError>>>>,
    /// The event stream is open.
    alive: AtomicBool,
}

async fn legacy_reader(weak: Weak<Inner>, channel: Arc<LegacyChannel>, mut events: Events) {
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("HTTP+SSE event stream broke: {e}");
                break;
            }
        };
        if event.kind != "message" {
            continue;
        }
        let Ok(value) = serde_json::from_str::<Value>(&event.data) else { continue };
        match sort_message(value) {
            Some(Incoming::Response { id, outcome }) => {
                let waiting = channel.pending.lock().ok().and_then(|mut p| p.remove(&id.to_string()));
                if let Some(tx) = waiting {
                    let _ = tx.send(outcome_to_result(outcome));
                }
            }
            Some(Incoming::Server(msg)) => {
                let Some(inner) = weak.upgrade() else { break };
                inner.deliver(msg).await;
            }
            None => {}
        }
    }
    channel.alive.store(false, Ordering::Release);
    if let Ok(mut pending) = channel.pending.lock() {
        pending.clear();
    }
}

/// Sends `notifications/cancelled` for a request when dropped with a
/// reason (the request was given up before its answer). `initialize` has
/// none: the protocol forbids cancelling it.
struct CancelOnDrop<'a> {
    session: &'a Session,
    id: Value,
    reason: Option<&'static str>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(reason) = self.reason else { return };
        // Without a runtime nothing can be sent; the server's own timeout ends the work.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let session = self.session.clone();
        let params = json!({"requestId": self.id.take(), "reason": reason});
        runtime.spawn(async move {
            if let Err(e) = session.notify("notifications/cancelled", Some(params)).await {
                tracing::debug!("could not tell the server a request was cancelled: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_sorted_into_responses_requests_and_notifications() {
        assert!(matches!(
            sort_message(json!({"jsonrpc": "2.0", "id": 3, "result": {"a": 1}})),
            Some(Incoming::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            sort_message(json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "x"}})),
            Some(Incoming::Response { outcome: Err(_), .. })
        ));
        assert!(matches!(
            sort_message(json!({"jsonrpc": "2.0", "id": "a", "method": "roots/list"})),
            Some(Incoming::Server(ServerMessage::Request { .. }))
        ));
        assert!(matches!(
            sort_message(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})),
            Some(Incoming::Server(ServerMessage::Notification { .. }))
        ));
        assert!(sort_message(json!([1, 2])).is_none());
        assert!(same_id(&json!(7), &json!("7")));
    }

    #[test]
    fn backoff_starts_at_the_servers_retry_and_is_capped() {
        assert_eq!(backoff(Some(Duration::from_millis(200)), 1), Duration::from_millis(200));
        assert_eq!(backoff(Some(Duration::from_millis(200)), 3), Duration::from_millis(800));
        assert_eq!(backoff(None, 50), MAX_BACKOFF);
    }

    #[test]
    fn options_never_print_the_token() {
        let o = ClientOptions { bearer_token: Some("secret-token".into()), ..ClientOptions::default() };
        assert!(!format!("{o:?}").contains("secret-token"));
    }
}
