//! One MCP session, the front the pool, the bridge and the commands use:
//! [`Session`] with its requests, notifications, answers to server
//! requests, cancellation of requests given up, and the messages the server
//! sends on its own (one bounded channel, `take_incoming`). What is common
//! to both transports lives here (headers, POST and its refusals, error
//! bodies, sorting what arrives); the transports themselves are
//! [`streamable`] (Streamable HTTP, tried first) and [`legacy_sse`] (the
//! 2024-11-05 HTTP+SSE fallback).

mod legacy_sse;
mod plain_http;
mod streamable;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use tether_wire::{Inbound, RpcError, code, envelope, headers, meta};
pub use tether_wire::{PeerMessage, PeerSink};

use crate::error::{ClientError, ReqError};
use crate::sse::read_body;
use legacy_sse::LegacyChannel;
use plain_http::PlainHttp;

/// Server messages buffered for `take_incoming`.
const INCOMING_BUFFER: usize = 256;
/// The sessionless revision a sessionless session speaks.
pub const SESSIONLESS_VERSION: &str = tether_wire::revision::FIRST_SESSIONLESS;
/// Error bodies are read up to this size for their message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Connection establishment limit (the request itself has `request_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A bearer token that may change while a session lives (one its owner
/// refreshes before it expires): each request sends the value it holds
/// when the request is sent. Cheap to clone; clones share the value.
#[derive(Clone, Default)]
pub struct Bearer(Arc<std::sync::RwLock<Option<HeaderValue>>>);

impl Bearer {
    /// The token every later request sends.
    pub fn set(&self, token: &str) -> Result<(), ClientError> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::Config("the bearer token contains characters not allowed in an HTTP header".into()))?;
        value.set_sensitive(true);
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(value);
        Ok(())
    }

    fn current(&self) -> Option<HeaderValue> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How to reach a server: credentials, extra headers, the time limit of one request.
#[derive(Clone)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// A bearer token that changes (sent instead of `bearer_token`).
    pub bearer: Option<Bearer>,
    /// Extra HTTP headers on every request.
    pub headers: Vec<(String, String)>,
    /// Limit for one request, from sending it to its response (default 60s).
    pub request_timeout: Duration,
    /// Longest message (a JSON body, one SSE event) taken from the server
    /// (default 32 MiB); a longer one ends its request with an error.
    pub max_message_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            bearer_token: None,
            bearer: None,
            headers: Vec::new(),
            request_timeout: Duration::from_secs(60),
            max_message_bytes: tether_wire::sse::DEFAULT_MAX_EVENT_BYTES,
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<redacted>"))
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
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
    /// POSTs to `url` when it is plain `http://` (see [`plain_http`]).
    plain: Option<PlainHttp>,
    /// The URL the caller gave (Streamable: where every message goes).
    url: String,
    options: ClientOptions,
    /// Authorization and the caller's extra headers.
    base_headers: HeaderMap,
    kind: Kind,
    session_id: OnceLock<String>,
    protocol_version: OnceLock<String>,
    /// A POST's headers once the session ID and protocol version are known
    /// (they do not change after): built once instead of per request.
    session_post_headers: OnceLock<HeaderMap>,
    /// Request IDs are `{id_prefix}{n}`: the prefix is random per session
    /// object, so no two sessions (of this process or any other, before or
    /// after a restart) send the same ID. A server that keys its streams by
    /// request ID (as the official SDKs' example event stores do) then
    /// cannot hand one session's stream to another.
    id_prefix: String,
    next_id: AtomicI64,
    incoming_tx: mpsc::Sender<PeerMessage>,
    incoming_rx: Mutex<Option<mpsc::Receiver<PeerMessage>>>,
    /// Where server messages go instead of the channel ([`Session::deliver_to`]).
    sink: std::sync::RwLock<Option<Arc<dyn PeerSink>>>,
    closed: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// A sessionless (2026-07-28) session: what every request's `_meta`
    /// declares (protocol version, capabilities, client info).
    sessionless: Option<serde_json::Map<String, Value>>,
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

/// One JSON-RPC message from the server, sorted. A result stays raw JSON:
/// a gateway passes it on as it came, without building it as a tree.
enum Incoming {
    Response { id: Value, outcome: Result<Box<RawValue>, Value> },
    Server(PeerMessage),
}

impl From<Inbound> for Incoming {
    fn from(message: Inbound) -> Self {
        match message {
            Inbound::Request { id, method, params } => {
                Incoming::Server(PeerMessage::Request { id, method, params: params.map(Value::Object) })
            }
            Inbound::Notification { method, params } => {
                Incoming::Server(PeerMessage::Notification { method, params: params.map(Value::Object) })
            }
            Inbound::Response { id, outcome } => {
                let outcome = match outcome {
                    Ok(result) => serde_json::value::to_raw_value(&result)
                        .map_err(|e| json!({"code": code::INTERNAL_ERROR, "message": e.to_string()})),
                    Err(error) => Err(error),
                };
                Incoming::Response { id, outcome }
            }
        }
    }
}

/// The shape of a response, read without building its result.
#[derive(serde::Deserialize)]
struct ResponseShape<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: Value,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
}

/// A response (the common case) read directly; anything else `None`, for
/// the full reading of [`envelope::parse_message`].
fn read_response(data: &[u8]) -> Option<Incoming> {
    let shape: ResponseShape<'_> = serde_json::from_slice(data).ok()?;
    if shape.jsonrpc != "2.0" || shape.method.is_some() {
        return None;
    }
    let outcome = match (shape.result, shape.error) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) if error.is_object() => Err(error),
        _ => return None,
    };
    Some(Incoming::Response { id: shape.id, outcome })
}

/// The message in an SSE event's data; what is not one valid JSON-RPC
/// message is logged and skipped (the server's next message may still be).
fn read_event(url: &str, data: &str) -> Option<Incoming> {
    if let Some(response) = read_response(data.as_bytes()) {
        return Some(response);
    }
    match envelope::parse_message(data.as_bytes()) {
        Ok(message) => Some(message.into()),
        Err(e) => {
            tracing::warn!(%url, "ignoring an SSE event that is not a JSON-RPC message: {}", e.message);
            None
        }
    }
}

/// One message of a JSON body (which may hold a batch of them), like [`read_event`].
fn read_value(url: &str, value: Value) -> Option<Incoming> {
    match envelope::from_value(value) {
        Ok(message) => Some(message.into()),
        Err(e) => {
            tracing::warn!(%url, "ignoring a message that is not JSON-RPC: {}", e.message);
            None
        }
    }
}

fn same_id(a: &Value, b: &Value) -> bool {
    a == b || matches!((a, b), (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) if s == &n.to_string())
}

fn outcome_to_result(outcome: Result<Box<RawValue>, Value>) -> Result<Box<RawValue>, ReqError> {
    outcome.map_err(|error| ReqError::Client(ClientError::Rpc(RpcError::from_object(&error))))
}

fn content_type(response: &reqwest::Response) -> String {
    response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase()
}

/// The message of an error body: a JSON-RPC error's message, a JSON
/// `error`/`message` field, or the start of the text.
async fn error_message(response: reqwest::Response) -> String {
    refusal(response).await.0
}

/// A refusal's message, and the JSON-RPC error its body carries, if any.
async fn refusal(response: reqwest::Response) -> (String, Option<RpcError>) {
    let status = response.status();
    let body = read_body(response, MAX_ERROR_BODY).await.unwrap_or_default();
    let rpc = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").filter(|e| e.get("code").is_some()).map(RpcError::from_object));
    (refusal_message(status, &body), rpc)
}

fn refusal_message(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
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

/// The headers of a sessionless request that mirror its body: `Mcp-Method`,
/// and `Mcp-Name` for the methods that name something (base64-wrapped when
/// the value is not plain visible ASCII, as the revision says).
fn sessionless_headers(headers: &mut HeaderMap, message: &Value) {
    let Some(method) = message.get("method").and_then(Value::as_str) else { return };
    if let Ok(v) = HeaderValue::from_str(method) {
        headers.insert(HeaderName::from_static(tether_wire::headers::MCP_METHOD), v);
    }
    let Some(field) = tether_wire::headers::mcp_name_field(method) else { return };
    let Some(name) = message.get("params").and_then(|p| p.get(field)).and_then(Value::as_str) else { return };
    let plain = !name.is_empty()
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && !(name.starts_with("=?base64?") && name.ends_with("?="));
    let value = if plain {
        name.to_owned()
    } else {
        use base64::Engine as _;
        format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(name))
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(tether_wire::headers::MCP_NAME), v);
    }
}

/// The W3C trace context a request carries in `params._meta` (the gateway
/// puts its span's there), repeated as the `traceparent` and `tracestate`
/// headers, where an HTTP server looks for it first.
fn trace_headers(headers: &mut HeaderMap, message: &Value) {
    let Some(request_meta) = message.get("params").and_then(|p| p.get("_meta")) else { return };
    for (field, name) in [
        (tether_wire::meta::TRACEPARENT, tether_wire::headers::TRACEPARENT),
        (tether_wire::meta::TRACESTATE, tether_wire::headers::TRACESTATE),
    ] {
        if let Some(v) = request_meta.get(field).and_then(Value::as_str).and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
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
            // A server of the sessionless revision only: no older transport to try.
            Err(ReqError::Status { rpc: Some(refused), .. }) if refused.code == code::UNSUPPORTED_PROTOCOL_VERSION => {
                Err(ClientError::Rpc(refused))
            }
            Err(ReqError::Status { status: status @ (400 | 404 | 405), message, url: u, .. }) => {
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
    pub async fn connect_legacy_transport(
        url: &str,
        options: ClientOptions,
        initialize_params: Value,
    ) -> Result<(Session, Value), ClientError> {
        check_url(url)?;
        Session::connect_legacy(http_client()?, url, options, initialize_params).await
    }

    /// A session without `initialize` for servers that need none
    /// (stateless Streamable HTTP): requests carry no `Mcp-Session-Id` and
    /// announce `protocol_version`.
    pub fn stateless(url: &str, options: ClientOptions, protocol_version: &str) -> Result<Session, ClientError> {
        check_url(url)?;
        let session = Session::build(http_client()?, url, options, Kind::Streamable)?;
        let _ = session.inner.protocol_version.set(protocol_version.to_owned());
        Ok(session)
    }

    /// Carries on a Streamable HTTP session opened elsewhere (another process
    /// kept its `Mcp-Session-Id` and revision), without `initialize`: the
    /// standalone stream opens as after `initialize`. A server that forgot the
    /// session answers the first request with [`ClientError::SessionNotFound`].
    pub async fn attach(
        url: &str,
        options: ClientOptions,
        session_id: &str,
        protocol_version: &str,
    ) -> Result<Session, ClientError> {
        check_url(url)?;
        let session = Session::build(http_client()?, url, options, Kind::Streamable)?;
        let _ = session.inner.session_id.set(session_id.to_owned());
        let _ = session.inner.protocol_version.set(protocol_version.to_owned());
        // Requests of an earlier holder of this session may still run on the
        // server (see `resume_request`): this holder's IDs have a prefix of
        // their own, so they never meet those.
        session.open_standalone().await;
        Ok(session)
    }

    fn build(http: reqwest::Client, url: &str, options: ClientOptions, kind: Kind) -> Result<Session, ClientError> {
        let base_headers = build_base_headers(&options)?;
        let (incoming_tx, incoming_rx) = mpsc::channel(INCOMING_BUFFER);
        let (closed, _) = watch::channel(false);
        Ok(Session {
            inner: Arc::new(Inner {
                http,
                plain: PlainHttp::for_url(url, CONNECT_TIMEOUT),
                url: url.to_owned(),
                options,
                base_headers,
                kind,
                session_id: OnceLock::new(),
                protocol_version: OnceLock::new(),
                session_post_headers: OnceLock::new(),
                id_prefix: new_id_prefix(),
                next_id: AtomicI64::new(0),
                incoming_tx,
                incoming_rx: Mutex::new(Some(incoming_rx)),
                sink: std::sync::RwLock::new(None),
                closed,
                tasks: Mutex::new(Vec::new()),
                sessionless: None,
            }),
        })
    }

    /// A client of the sessionless revision (2026-07-28): no `initialize`;
    /// every request declares `client_info` and `capabilities` in its
    /// `_meta` and names itself in `Mcp-Method` / `Mcp-Name`.
    pub fn sessionless(
        url: &str,
        options: ClientOptions,
        client_info: Value,
        capabilities: Value,
    ) -> Result<Session, ClientError> {
        check_url(url)?;
        let mut session = Session::build(http_client()?, url, options, Kind::Streamable)?;
        let _ = session.inner.protocol_version.set(SESSIONLESS_VERSION.to_owned());
        let mut declared = serde_json::Map::new();
        declared.insert(meta::PROTOCOL_VERSION.into(), json!(SESSIONLESS_VERSION));
        declared.insert(meta::CLIENT_CAPABILITIES.into(), capabilities);
        declared.insert(meta::CLIENT_INFO.into(), client_info);
        if let Some(inner) = Arc::get_mut(&mut session.inner) {
            inner.sessionless = Some(declared);
        }
        Ok(session)
    }

    /// Whether this is a client of the sessionless revision.
    pub fn is_sessionless(&self) -> bool {
        self.inner.sessionless.is_some()
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

    /// [`Session::request`], its result as the raw JSON the server sent.
    pub async fn request_json(&self, method: &str, params: Option<Value>) -> Result<Box<RawValue>, ClientError> {
        self.request_with(method, params, Extras::default()).await.map_err(ReqError::into_client)
    }

    /// [`Session::request_json`], noting in `track` the request's ID and
    /// where its answer stream starts, so that another process can pick
    /// the answer up with [`Session::resume_request`] if this one dies.
    pub async fn request_json_tracked(
        &self,
        method: &str,
        params: Option<Value>,
        track: &RequestTrack,
    ) -> Result<Box<RawValue>, ClientError> {
        let extras = Extras { track: Some(track), ..Extras::default() };
        self.request_with(method, params, extras).await.map_err(ReqError::into_client)
    }

    /// [`Session::request_json`], with what the server sends on this
    /// request's own stream (its progress, log messages) going to `sink`, in
    /// order, before the answer is returned, instead of the session's
    /// incoming channel: one request's messages, with no guessing whose.
    /// `headers` go with this request alone (a 2026-07-28 client's
    /// `Mcp-Param-*` headers).
    pub async fn request_json_with_sink(
        &self,
        method: &str,
        params: Option<Value>,
        sink: &mpsc::Sender<PeerMessage>,
        headers: &[(String, String)],
    ) -> Result<Box<RawValue>, ClientError> {
        let extras = Extras { sink: Some(sink), headers, ..Extras::default() };
        self.request_with(method, params, extras).await.map_err(ReqError::into_client)
    }

    /// Picks up the answer of a request sent earlier (maybe by another
    /// process, on this same server session) from its stream, after
    /// `after_event_id` (from a [`RequestTrack`]): `GET` + `Last-Event-ID`.
    /// What the server sends on the stream before the answer goes to
    /// `messages`, in order. Dropped before the answer, the request is
    /// cancelled on the server. Streamable HTTP only.
    pub async fn resume_request(
        &self,
        request_id: Value,
        after_event_id: &str,
        messages: mpsc::Sender<PeerMessage>,
    ) -> Result<Box<RawValue>, ClientError> {
        if !matches!(self.inner.kind, Kind::Streamable) {
            return Err(ClientError::Transport("only a Streamable HTTP request can be resumed from its stream".into()));
        }
        let mut cancel = CancelOnDrop { session: self, id: request_id.clone(), reason: Some("cancelled by the caller") };
        let result = self.inner.resume_response_stream(&request_id, after_event_id, &messages).await;
        cancel.reason = None;
        result.map_err(ReqError::into_client)
    }

    /// `request`, keeping the HTTP status of a refusal; `accepted` runs
    /// once the server accepted the request (2xx), before its answer.
    pub(crate) async fn request_raw(
        &self,
        method: &str,
        params: Option<Value>,
        accepted: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<Value, ReqError> {
        let raw = self.request_with(method, params, Extras { accepted, ..Extras::default() }).await?;
        serde_json::from_str(raw.get()).map_err(|e| {
            ClientError::Transport(format!("the server at {} sent an unreadable result: {e}", self.inner.url)).into()
        })
    }

    async fn request_with(&self, method: &str, params: Option<Value>, extras: Extras<'_>) -> Result<Box<RawValue>, ReqError> {
        let Extras { accepted, track, sink, headers } = extras;
        let id = Value::String(format!("{}{}", self.inner.id_prefix, self.inner.next_id.fetch_add(1, Ordering::Relaxed)));
        if let Some(track) = track {
            track.begin(&id);
        }
        let mut message = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            message["params"] = p;
        }
        if let Some(declared) = &self.inner.sessionless {
            let params = message.as_object_mut().and_then(|m| m.entry("params").or_insert_with(|| json!({})).as_object_mut());
            if let Some(params) = params {
                let request_meta = params.entry("_meta").or_insert_with(|| json!({}));
                if let Some(request_meta) = request_meta.as_object_mut() {
                    for (k, v) in declared {
                        request_meta.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        let work = async {
            match &self.inner.kind {
                Kind::Streamable => self.inner.streamable_request(&message, &id, accepted, track, sink, headers).await,
                Kind::Legacy(channel) => self.inner.legacy_request(channel, &message, &id, accepted).await,
            }
        };
        // Dropped before the answer (the caller gave up, e.g. a bridge whose
        // host cancelled) or timed out: the server is told to stop the work.
        let mut cancel =
            CancelOnDrop { session: self, id: id.clone(), reason: (method != "initialize").then_some("cancelled by the caller") };
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

    /// From now on, server messages (from any stream) go to `sink`, each
    /// delivered before the stream is read on: what the server sent on a
    /// request's stream before its answer is delivered before the request
    /// returns. Messages that were waiting on the channel go first.
    pub async fn deliver_to(&self, sink: Arc<dyn PeerSink>) {
        let waiting = self.take_incoming();
        if let Ok(mut slot) = self.inner.sink.write() {
            *slot = Some(sink.clone());
        }
        if let Some(mut waiting) = waiting {
            while let Ok(message) = waiting.try_recv() {
                sink.deliver(message).await;
            }
        }
    }

    /// Server messages (from any stream). Can be taken once.
    pub fn take_incoming(&self) -> Option<mpsc::Receiver<PeerMessage>> {
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
            Kind::Streamable => self.inner.terminate().await,
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

    fn finish_initialize(&self, result: &Value) -> Result<(), ClientError> {
        let version = result.get("protocolVersion").and_then(Value::as_str).ok_or_else(|| {
            ClientError::Transport(format!(
                "the initialize result from {} has no protocolVersion; is this an MCP server?",
                self.inner.url
            ))
        })?;
        let _ = self.inner.protocol_version.set(version.to_owned());
        Ok(())
    }
}

impl Inner {
    /// Headers for a request: auth, the caller's, and the session's.
    fn headers(&self, post: bool) -> HeaderMap {
        let mut h = self.headers_without_bearer(post);
        if let Some(value) = self.options.bearer.as_ref().and_then(Bearer::current) {
            h.insert(reqwest::header::AUTHORIZATION, value);
        }
        h
    }

    fn headers_without_bearer(&self, post: bool) -> HeaderMap {
        if post && let Some(cached) = self.session_post_headers.get() {
            return cached.clone();
        }
        let mut h = self.base_headers.clone();
        if post {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static(headers::ACCEPT_POST));
            h.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        } else {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static(headers::EVENT_STREAM));
        }
        if let Kind::Streamable = self.kind {
            if let Some(v) = self.session_id.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(headers::SESSION_ID, v);
            }
            if let Some(v) = self.protocol_version.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(headers::PROTOCOL_VERSION, v);
            }
            if post && self.session_id.get().is_some() && self.protocol_version.get().is_some() {
                let _ = self.session_post_headers.set(h.clone());
            }
        }
        h
    }

    /// The headers of a POST carrying `message`.
    fn post_headers(&self, message: &Value) -> HeaderMap {
        let mut headers = self.headers(true);
        if self.sessionless.is_some() {
            sessionless_headers(&mut headers, message);
        }
        trace_headers(&mut headers, message);
        headers
    }

    fn has_session(&self) -> bool {
        self.session_id.get().is_some()
    }

    /// POSTs one message; refusals become errors (401/403: `Auth`, 404 on a
    /// session: `SessionNotFound`, others: `Status`).
    async fn post(&self, url: &str, message: &Value) -> Result<reqwest::Response, ReqError> {
        self.post_with(url, message, &[]).await
    }

    /// [`Self::post`] with headers of this request's own (`Mcp-Param-*`).
    async fn post_with(&self, url: &str, message: &Value, extra: &[(String, String)]) -> Result<reqwest::Response, ReqError> {
        let headers = || {
            let mut headers = self.post_headers(message);
            for (name, value) in extra {
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
                    headers.insert(name, value);
                }
            }
            headers
        };
        let body = serde_json::to_vec(message).map_err(|e| ClientError::Transport(format!("cannot encode the message: {e}")))?;
        let body = bytes::Bytes::from(body);
        let plain = self.plain.as_ref().filter(|_| url == self.url);
        let response = match plain {
            Some(plain) => match plain.post(headers(), body.clone()).await {
                // reqwest follows redirects; this path does not.
                Ok(response) if response.status().is_redirection() => None,
                Ok(response) => Some(response),
                Err(plain_http::Failure::Connect(cause)) => {
                    return Err(ClientError::Transport(format!(
                        "cannot connect to {}: {cause}; is the server running there?",
                        self.url
                    ))
                    .into());
                }
                Err(plain_http::Failure::Request(cause)) => {
                    return Err(ClientError::Transport(format!("request failed to {}: {cause}", self.url)).into());
                }
            },
            None => None,
        };
        let response = match response {
            Some(response) => response,
            None => self.http.post(url).headers(headers()).body(body).send().await.map_err(|e| transport_error(&self.url, e))?,
        };
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
        let (message, rpc) = refusal(response).await;
        Err(ReqError::Status { status: status.as_u16(), message, url: self.url.clone(), rpc })
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

    /// Hands a server message to the sink ([`Session::deliver_to`]), else
    /// to `take_incoming`'s receiver. Before the receiver is taken, messages
    /// wait in the bounded buffer (dropped when it is full); after, the
    /// stream waits for room.
    async fn deliver(&self, message: PeerMessage) {
        let sink = self.sink.read().ok().and_then(|s| s.clone());
        if let Some(sink) = sink {
            return sink.deliver(message).await;
        }
        let taken = self.incoming_rx.lock().map(|r| r.is_none()).unwrap_or(true);
        if taken {
            let _ = self.incoming_tx.send(message).await;
        } else if self.incoming_tx.try_send(message).is_err() {
            tracing::debug!(url = %self.url, "no one reads this session's server messages; dropping one");
        }
    }
}

/// Sends `notifications/cancelled` for a request when dropped with a
/// reason (the request was given up before its answer). `initialize` has
/// none: the protocol forbids cancelling it.
/// A request ID prefix no other session object has: `t`, 64 random bits
/// in hex, `-` (the counter follows).
fn new_id_prefix() -> String {
    format!("t{}-", hex::encode(rand::random::<[u8; 8]>()))
}

/// What a request may carry besides its method and params.
#[derive(Default)]
struct Extras<'a> {
    /// Runs once the server accepted the request (2xx), before its answer.
    accepted: Option<Box<dyn FnOnce() + Send>>,
    track: Option<&'a RequestTrack>,
    /// Where the server's messages on this request's own stream go (default:
    /// the session's incoming channel). Streamable HTTP only.
    sink: Option<&'a mpsc::Sender<PeerMessage>>,
    /// Headers of this request's own. Streamable HTTP only.
    headers: &'a [(String, String)],
}

/// Where a request in flight stands on its server: its JSON-RPC ID and the
/// first event ID of its answer stream (the point to resume it from), for
/// [`Session::resume_request`] by another process. Filled by
/// [`Session::request_json_tracked`].
#[derive(Clone, Default)]
pub struct RequestTrack(Arc<Mutex<TrackPoint>>);

#[derive(Default)]
struct TrackPoint {
    request_id: Option<Value>,
    first_event_id: Option<String>,
}

impl RequestTrack {
    pub fn new() -> Self {
        Self::default()
    }

    /// The request's ID and the first event ID of its answer stream, once
    /// the server sent one (a JSON answer, or a stream without IDs, has none).
    pub fn point(&self) -> Option<(Value, String)> {
        let point = self.0.lock().ok()?;
        Some((point.request_id.clone()?, point.first_event_id.clone()?))
    }

    fn begin(&self, id: &Value) {
        if let Ok(mut point) = self.0.lock() {
            *point = TrackPoint { request_id: Some(id.clone()), first_event_id: None };
        }
    }

    /// Notes the stream's first event ID (a later call changes nothing).
    pub(crate) fn saw_event_id(&self, event_id: &str) {
        if let Ok(mut point) = self.0.lock()
            && point.first_event_id.is_none()
        {
            point.first_event_id = Some(event_id.to_owned());
        }
    }
}

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
    fn a_trace_context_in_meta_is_repeated_as_w3c_headers_and_nothing_else_is() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = HeaderMap::new();
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t", "_meta": {"traceparent": parent, "tracestate": "k=v", "progressToken": 7}}});
        trace_headers(&mut headers, &message);
        assert_eq!(headers.get("traceparent").and_then(|v| v.to_str().ok()), Some(parent));
        assert_eq!(headers.get("tracestate").and_then(|v| v.to_str().ok()), Some("k=v"));
        assert_eq!(headers.len(), 2);
        let mut none = HeaderMap::new();
        trace_headers(&mut none, &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
        trace_headers(
            &mut none,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "x", "params": {"_meta": {"traceparent": "bad\nvalue"}}}),
        );
        assert!(none.is_empty());
    }

    #[test]
    fn a_response_is_read_with_its_result_kept_as_sent_and_anything_else_is_read_in_full() {
        let data = r#"{"jsonrpc":"2.0","id":7,"result":{"b": [1, 2.50],"a":"\u00e9"}}"#;
        match read_event("http://test", data) {
            Some(Incoming::Response { id, outcome: Ok(result) }) => {
                assert_eq!(id, json!(7));
                assert_eq!(result.get(), r#"{"b": [1, 2.50],"a":"\u00e9"}"#, "byte for byte");
            }
            _ => panic!("a response"),
        }
        let error = read_event("http://test", r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"no"}}"#);
        assert!(matches!(error, Some(Incoming::Response { outcome: Err(e), .. }) if e["code"] == -32601));
        for not_a_plain_response in [
            r#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"both"}}"#,
        ] {
            assert!(read_response(not_a_plain_response.as_bytes()).is_none(), "{not_a_plain_response}");
        }
        assert!(matches!(
            read_event("http://test", r#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#),
            Some(Incoming::Server(PeerMessage::Request { .. }))
        ));
    }

    #[test]
    fn messages_are_sorted_into_responses_requests_and_notifications() {
        let sort = |v: Value| read_value("http://test", v);
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": 3, "result": {"a": 1}})),
            Some(Incoming::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "x"}})),
            Some(Incoming::Response { outcome: Err(_), .. })
        ));
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": "a", "method": "roots/list"})),
            Some(Incoming::Server(PeerMessage::Request { params: None, .. }))
        ));
        assert!(matches!(
            read_event("http://test", r#"{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": 1}}"#),
            Some(Incoming::Server(PeerMessage::Notification { params: Some(_), .. }))
        ));
        assert!(sort(json!([1, 2])).is_none());
        assert!(read_event("http://test", "{not json").is_none());
        assert!(same_id(&json!(7), &json!("7")));
    }

    #[test]
    fn options_never_print_the_token() {
        let o = ClientOptions { bearer_token: Some("secret-token".into()), ..ClientOptions::default() };
        assert!(!format!("{o:?}").contains("secret-token"));
    }
}
