//! One MCP session, the front the pool, the bridge and the commands use:
//! [`Session`] with its requests, notifications, answers to server
//! requests, cancellation of requests given up, and the messages the server
//! sends on its own (one bounded channel, `take_incoming`). What is common
//! to both transports lives in modules of its own: [`options`] (the
//! caller's options and the headers built from them), [`http`] (POST and
//! its refusals, error bodies), [`incoming`] (sorting what arrives) and
//! [`in_flight`] (a request's track and its cancellation when given up);
//! the transports themselves are [`streamable`] (Streamable HTTP, tried
//! first) and [`legacy_sse`] (the 2024-11-05 HTTP+SSE fallback).
//!
//! Invariant: a request's ID is the session object's random prefix and a
//! counter, so no two sessions send the same ID; once the session is closed
//! or its last clone dropped, none of its background tasks runs on.

mod http;
mod in_flight;
mod incoming;
mod legacy_sse;
mod options;
mod plain_http;
mod streamable;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Mutex, RwLock};
use reqwest::header::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use tether_wire::{PeerMessage, PeerSink};
use tether_wire::{code, meta};

use crate::error::{ClientError, ReqError};
// Also the names the transports import from here (`super::…`).
use http::{CONNECT_TIMEOUT, check_url, content_type, error_message, http_client, transport_error};
use in_flight::CancelOnDrop;
pub use in_flight::RequestTrack;
use incoming::{Incoming, outcome_to_result, read_event, read_response, read_value, same_id};
use legacy_sse::LegacyChannel;
use options::build_base_headers;
pub use options::{Bearer, ClientOptions};
use plain_http::PlainHttp;

/// Server messages buffered for `take_incoming`.
const INCOMING_BUFFER: usize = 256;
/// The sessionless revision a sessionless session speaks.
pub const SESSIONLESS_VERSION: &str = tether_wire::revision::FIRST_SESSIONLESS;

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
    sink: RwLock<Option<Arc<dyn PeerSink>>>,
    closed: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// A sessionless (2026-07-28) session: what every request's `_meta`
    /// declares (protocol version, capabilities, client info).
    sessionless: Option<serde_json::Map<String, Value>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.closed.send(true);
        for t in self.tasks.get_mut().drain(..) {
            t.abort();
        }
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
                sink: RwLock::new(None),
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

    /// The `Mcp-Session-Id` the server gave, if any.
    pub fn session_id(&self) -> Option<String> {
        self.inner.session_id.get().cloned()
    }

    /// The protocol revision the session speaks (what `initialize` agreed on).
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

    /// Sends a notification.
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
        *self.inner.sink.write() = Some(sink.clone());
        if let Some(mut waiting) = waiting {
            while let Ok(message) = waiting.try_recv() {
                sink.deliver(message).await;
            }
        }
    }

    /// Server messages (from any stream). Can be taken once.
    pub fn take_incoming(&self) -> Option<mpsc::Receiver<PeerMessage>> {
        self.inner.incoming_rx.lock().take()
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
        for t in self.inner.tasks.lock().drain(..) {
            t.abort();
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
        for t in self.inner.tasks.lock().drain(..) {
            t.abort();
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
    /// Hands a server message to the sink ([`Session::deliver_to`]), else
    /// to `take_incoming`'s receiver. Before the receiver is taken, messages
    /// wait in the bounded buffer (dropped when it is full); after, the
    /// stream waits for room.
    async fn deliver(&self, message: PeerMessage) {
        let sink = self.sink.read().clone();
        if let Some(sink) = sink {
            return sink.deliver(message).await;
        }
        let taken = self.incoming_rx.lock().is_none();
        if taken {
            let _ = self.incoming_tx.send(message).await;
        } else if self.incoming_tx.try_send(message).is_err() {
            tracing::debug!(url = %self.url, "no one reads this session's server messages; dropping one");
        }
    }
}

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
