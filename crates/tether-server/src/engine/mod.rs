//! The session engine: runs MCP sessions independent of HTTP.
//!
//! It creates and rehydrates sessions, starts each request on its own stream,
//! appends every outbound message to the store before publishing it
//! (invariant 1: stored before seen), decides which stream a related message
//! goes on, replays streams for `Last-Event-ID`, and closes requests that a
//! crash cut off when a session is rehydrated. The application behind it
//! ([`McpApp`]) answers `initialize` and every request method.
//!
//! Every task the engine starts is tracked, so [`Engine::shutdown`] can
//! drain: open streams are told to reconnect, requests in flight get
//! `drain_timeout` to finish and then end as interrupted, and the store is
//! flushed, once.

mod cache;
pub mod calls;
mod ctx;
mod events;
mod initialize;
mod keys;
mod lifecycle;
mod listen;
mod live;
pub mod mrtr;
mod notifications;
pub mod operations;
mod pump;
mod quota;
mod reaper;
mod recovery;
mod related;
mod replicas;
mod request;
mod request_stream;
pub mod resume;
mod running;
mod session;
mod sessionless;
pub(crate) mod tasks;

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use serde_json::{Value, json};
use tether_store::{EventKind, SessionRecord, Store, StoreError, now_ms};
use tether_wire::{Inbound, RpcError, code, envelope, meta};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use ctx::{RequestCtx, SessionCtx};
pub use operations::OperationCtx;
pub use pump::{Frame, Frames};
pub use request::PANICKED_MESSAGE;
pub use session::{Session, SessionState};

use crate::app::{Authorized, EndReason, Endpoints, McpApp, SessionEnd};
use crate::config::EngineConfig;
use crate::ids::{self, EventId};
pub use listen::filter as listen_filter;
use live::{LiveHub, StreamKind};
use pump::{PumpSpec, spawn_pump};
use request::RequestHead;
pub use sessionless::{Outbound, SessionlessReply, SessionlessRequest, discover_result, missing_capability};

/// Why the engine refused something; the HTTP layer maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No application is served at this endpoint (HTTP 404).
    #[error(
        "no MCP endpoint /mcp/{0} on this server; check the URL (the server's endpoints are /mcp and its configured upstreams)"
    )]
    UnknownEndpoint(String),
    /// Unknown, expired, deleted, or another principal's session (HTTP 404).
    #[error("session not found: it expired, was deleted, or never existed; send initialize without a session ID")]
    SessionNotFound,
    /// The message is well-formed but not acceptable here (HTTP 400).
    #[error("{message}")]
    BadRequest {
        /// The JSON-RPC code to answer with.
        code: i64,
        /// What is wrong.
        message: String,
        /// The request's id, when it could be read.
        id: Option<Value>,
    },
    /// A limit was reached (HTTP 429).
    #[error("{0}")]
    TooMany(String),
    /// The server is shutting down and takes no new work (HTTP 503).
    #[error("the server is shutting down; send this again in a moment (to this server after its restart, or another replica)")]
    ShuttingDown,
    /// The store did not answer (HTTP 503).
    #[error("storage unavailable: {0}")]
    Unavailable(#[from] StoreError),
    /// The store could not commit the request's answer, so it was not sent
    /// (HTTP 503 with Retry-After; the JSON-RPC error carries the request's id).
    #[error(
        "the server could not store its answer to this request, so it was not sent ({reason}); its store is failing (see /healthz): send the request again in a moment"
    )]
    NotStored {
        /// The request's id.
        id: Value,
        /// Why the store refused.
        reason: String,
    },
}

/// How the transport wants a request answered (its choice, e.g.
/// `--json-response`; the engine only follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// On a stream of the session: stored, resumable with `Last-Event-ID`.
    Stream,
    /// One JSON body when the work is done; nothing is stored, so nothing
    /// can be resumed.
    Json,
}

/// What a POST turns into.
pub enum PostOutcome {
    /// A notification or response was taken (HTTP 202).
    Accepted,
    /// A request answered on a new SSE stream.
    Stream {
        /// The stream's frames, as they come.
        frames: Frames,
        /// The session (for `Mcp-Session-Id`).
        session_id: String,
    },
    /// A quick request: its whole SSE stream (priming event and response),
    /// already committed, written as one body.
    Complete {
        /// The whole stream.
        frames: Vec<Frame>,
        /// The session (for `Mcp-Session-Id`).
        session_id: String,
    },
    /// A request answered with one JSON body (`--json-response`).
    Json {
        /// The body, once the work is done.
        body: oneshot::Receiver<Bytes>,
        /// The session (for `Mcp-Session-Id`).
        session_id: String,
    },
    /// An answer outside any session (a refused `initialize`): one JSON body.
    Sessionless {
        /// The JSON-RPC answer.
        body: Bytes,
        /// What it refused, to pick the status by.
        refusal: Refusal,
    },
}

/// What an error answer tells a transport about it, to pick a status by:
/// its code and whether the client may retry later
/// ([`RpcError::is_retry_later`]: a bound was reached, or something the
/// request needs cannot be reached now).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The error's JSON-RPC code.
    pub code: i64,
    /// Whether the client may send it again later (a bound, something unreachable now).
    pub retry_later: bool,
    /// The caller holds its own share of a bound (HTTP 429, not 503).
    pub principal_limit: bool,
}

impl From<&RpcError> for Refusal {
    fn from(error: &RpcError) -> Self {
        Self { code: error.code, retry_later: error.is_retry_later(), principal_limit: error.is_principal_limit() }
    }
}

/// The message that closes a request cut off by a crash (design brief,
/// "Requests cut off by a crash") or by a shutdown that could not wait.
pub const INTERRUPTED_MESSAGE: &str = "request interrupted by a server restart; it may or may not have taken effect";

/// The message that closes a request whose final response the store lost
/// after taking it (a Redis failover under `normal` durability): see
/// `engine/running.rs`.
pub const LOST_MESSAGE: &str = "the request's response was lost by the session store (a failover took back what its replica \
     had not copied yet); the request may or may not have taken effect";

/// The engine's parts, wired together. Each part owns its state in its own
/// type and module (the session cache, operations and tasks, quotas, the
/// lifecycle, live streams); the fields are private to the engine.
pub(crate) struct Inner {
    store: Arc<dyn Store>,
    apps: Endpoints,
    config: EngineConfig,
    hub: Arc<LiveHub>,
    /// Append, then publish: how everything is emitted (`events.rs`).
    events: events::Events,
    /// The sessions held in memory (`cache.rs`).
    cache: cache::SessionCache,
    /// Recorded as the owner of every request this process runs.
    instance: String,
    /// This replica's records and asks in a shared store (`replicas.rs`).
    replicas: replicas::Replicas,
    /// The request streams this process runs now (`running.rs`).
    running: Arc<running::RunningStreams>,
    /// The calls running now, for operators (`calls.rs`).
    calls: Arc<calls::Calls>,
    tokens: resume::ResumeTokens,
    key: keys::ServerKey,
    operations: operations::Operations,
    /// Every task the engine started, and the shutdown and interrupt signals.
    life: Arc<lifecycle::Lifecycle>,
    /// What the streams' pumps need of the engine (`pump.rs`).
    pumps: Arc<pump::Handles>,
    /// Where related messages go, and requests to the client (`related.rs`).
    related: related::Related,
    /// Sessionless requests running, and open `subscriptions/listen`
    /// streams: each under its ceiling and each principal's share.
    sessionless: quota::Admission,
    listeners: quota::Admission,
    /// What each endpoint's application says of itself (`server/discover`).
    described: sessionless::Descriptions,
}

/// Cheap to clone; all clones share one engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// What a stored priming event records for recovery: the request's id and
/// method, and the instance that runs it.
pub(crate) fn prime_meta(id: &Value, method: &str, owner: &str) -> Bytes {
    Bytes::from(json!({"id": id, "method": method, "owner": owner}).to_string())
}

fn unavailable(e: RpcError) -> EngineError {
    EngineError::Unavailable(StoreError::Backend(e.message))
}

impl Engine {
    /// Starts the engine's background work (the reaper; with a shared store,
    /// the announcement listener and the lease). Needs a Tokio runtime.
    /// One application served at `/mcp`.
    pub fn new(store: Arc<dyn Store>, app: Arc<dyn McpApp>, config: EngineConfig) -> Self {
        Self::with_endpoints(store, Endpoints::new(app), config)
    }

    /// Several applications, one per endpoint.
    pub fn with_endpoints(store: Arc<dyn Store>, apps: Endpoints, config: EngineConfig) -> Self {
        let instance = ids::new_instance_id();
        let hub = Arc::new(LiveHub::default());
        let events = events::Events::new(store.clone(), hub.clone(), &instance);
        let records = operations::OpRecords::new(store.clone(), &instance, &config);
        let life = Arc::new(lifecycle::Lifecycle::default());
        let replicas = replicas::Replicas::new(store.clone(), &instance, &config);
        let pumps = Arc::new(pump::Handles {
            store: store.clone(),
            life: life.clone(),
            keepalive: config.keepalive,
            replicas: replicas.clone(),
        });
        let related = related::Related {
            hub: hub.clone(),
            events: events.clone(),
            replicas: store.is_shared().then(|| replicas.clone()),
            instance: Arc::from(instance.as_str()),
            max_pending: config.max_pending_client_requests,
            shutdown: life.shutdown.clone(),
        };
        let engine = Self {
            inner: Arc::new(Inner {
                replicas,
                pumps,
                related,
                store,
                apps,
                hub,
                events,
                cache: cache::SessionCache::default(),
                instance,
                running: Arc::default(),
                calls: Arc::default(),
                tokens: resume::ResumeTokens,
                key: keys::ServerKey::default(),
                operations: operations::Operations::new(
                    quota::Admission::new(
                        "tasks",
                        "runs",
                        ("max_tasks", config.max_tasks),
                        ("max_tasks_per_principal", config.max_tasks_per_principal),
                        "try again when one has ended",
                    ),
                    records,
                ),
                life,
                sessionless: quota::Admission::new(
                    "sessionless requests",
                    "runs",
                    ("max_sessionless_requests", config.max_sessionless_requests),
                    ("max_sessionless_requests_per_principal", config.max_sessionless_requests_per_principal),
                    "try again when one has ended",
                ),
                listeners: quota::Admission::new(
                    "listen streams",
                    "holds",
                    ("max_sessionless_requests", config.max_sessionless_requests),
                    ("max_listen_streams_per_principal", config.max_listen_streams_per_principal),
                    "close one first",
                ),
                described: sessionless::Descriptions::default(),
                config,
            }),
        };
        engine.inner.spawn_reaper();
        if engine.inner.store.is_shared() {
            replicas::start(&engine.inner);
        }
        engine
    }

    /// Whether an application is served at `endpoint`.
    pub fn serves(&self, endpoint: &str) -> bool {
        self.inner.apps.get(endpoint).is_some()
    }

    /// What the engine was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The store the engine keeps its sessions in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// `Ok` when the store answers.
    pub async fn health(&self) -> Result<(), StoreError> {
        self.inner.store.ping().await
    }

    // ---- sessions ----------------------------------------------------------------

    /// Finds a session of `endpoint` for `principal`, rehydrating it from the
    /// store if this process has not seen it. Another principal's session, or
    /// one of another endpoint, is "not found".
    pub async fn session(&self, endpoint: &str, id: &str, principal: &str) -> Result<Arc<Session>, EngineError> {
        let session = self.inner.load(id).await?.ok_or(EngineError::SessionNotFound)?;
        if session.principal != principal || session.endpoint != endpoint {
            return Err(EngineError::SessionNotFound);
        }
        if self.inner.store.is_shared() && !self.inner.replicas.refresh(&session).await? {
            self.inner.forget(&session);
            return Err(EngineError::SessionNotFound);
        }
        let now = now_ms();
        let ttl = self.inner.config.session_ttl.as_millis() as i64;
        if now >= session.last_seen() + ttl {
            self.inner.end_session(&session, EndReason::Expired).await?;
            return Err(EngineError::SessionNotFound);
        }
        self.inner.touch(&session, now);
        Ok(session)
    }

    /// Handles a POSTed message other than `initialize` for an existing session.
    /// `authorized` is what the HTTP front established about the request,
    /// handed to the application with it (never stored).
    pub async fn post(
        &self,
        session: Arc<Session>,
        message: Inbound,
        reply: Reply,
        authorized: Option<Authorized>,
    ) -> Result<PostOutcome, EngineError> {
        match message {
            Inbound::Request { id, method, .. } if method == "initialize" => Err(EngineError::BadRequest {
                code: code::INVALID_REQUEST,
                message: "this session is already initialized; send initialize without an Mcp-Session-Id to start a new one"
                    .into(),
                id: Some(id),
            }),
            Inbound::Request { id, method, params } => {
                let progress_token =
                    params.as_ref().and_then(|p| p.get("_meta")).and_then(|m| m.get(meta::PROGRESS_TOKEN)).cloned();
                let span = crate::trace::rpc_span(&method, Some(&session.id), params.as_ref());
                let app = self.inner.app_of(&session);
                let owned = method.clone();
                let call = self.inner.calls.enter_session(&session, &method, &id, params.as_ref());
                let work: request::Work = Box::new(move |ctx| {
                    Box::pin(async move {
                        let _call = call;
                        app.handle_request(ctx, &owned, params).await
                    })
                });
                let head = RequestHead { id, progress_token, authorized };
                self.inner.clone().start_request(session, head, &method, reply, work).instrument(span).await
            }
            Inbound::Notification { method, params } => {
                notifications::receive(&self.inner, session, method, params).await?;
                Ok(PostOutcome::Accepted)
            }
            Inbound::Response { id, outcome } => {
                let key = ctx::request_key(&id);
                let waiter = session.pending.lock().remove(&key);
                match waiter {
                    Some(tx) => {
                        let _ = tx.send(outcome);
                    }
                    // The request may wait on another replica.
                    None if self.inner.store.is_shared() => self.inner.replicas.post_answer(&session.id, &key, outcome).await?,
                    None => tracing::debug!(session = %session.id, id = %key, "response to no pending request ignored"),
                }
                Ok(PostOutcome::Accepted)
            }
        }
    }

    /// A GET without `Last-Event-ID`: takes over the standalone stream and
    /// starts after the last event written to any earlier connection.
    pub async fn open_standalone(&self, session: Arc<Session>) -> Result<Frames, EngineError> {
        let stream = session.standalone_stream.clone();
        let sub = self.inner.hub.subscribe(&session.id, &stream, StreamKind::Standalone);
        let cursor = self.inner.store.cursor(&session.id, &stream).await?;
        Ok(self.inner.clone().standalone_pump(session, cursor, sub).await)
    }

    /// A GET with `Last-Event-ID`: replays the rest of exactly that event's
    /// stream of this session, then follows it live.
    pub async fn resume(&self, session: Arc<Session>, last_event_id: &str) -> Result<Frames, EngineError> {
        let unknown = |why: &str| EngineError::BadRequest {
            code: code::INVALID_REQUEST,
            message: format!("Last-Event-ID `{}` {why}", truncate(last_event_id, 80)),
            id: None,
        };
        let event = EventId::parse(last_event_id).ok_or_else(|| unknown("is not an event ID issued by this server"))?;
        let summary = self.inner.store.stream(&session.id, &event.stream).await?;
        if event.stream == session.standalone_stream {
            let head = summary.map(|s| s.last_seq).unwrap_or(0);
            // Past the end on a shared store: taken back by a failover (below).
            if event.seq > head && !self.inner.store.is_shared() {
                return Err(unknown("names an event this session never sent"));
            }
            let sub = self.inner.hub.subscribe(&session.id, &event.stream, StreamKind::Standalone);
            return Ok(self.inner.clone().standalone_pump(session, event.seq.min(head), sub).await);
        }
        if !event.is_request_stream() {
            return Err(unknown(if summary.is_some() {
                "names an event this session never sent"
            } else {
                "does not belong to this session"
            }));
        }
        let summary = match summary {
            Some(summary) => summary,
            // On a shared store, a request stream a failover took back
            // altogether (its priming event too): the replica that runs or
            // ran its request starts it again when asked (`replicas.rs`).
            None if self.inner.store.is_shared() => {
                replicas::find_lost_stream(&self.inner, &session, &event.stream).await?.ok_or_else(|| {
                    unknown(
                        "names a stream this session does not have, and no replica knows it: it never existed, it \
                         expired, or the session store lost it in a failover, with the request it answered; that \
                         request's outcome is unknown",
                    )
                })?
            }
            None => return Err(unknown("does not belong to this session")),
        };
        let mut event = event;
        if event.seq > summary.last_seq {
            // On a shared store, an event past the stream's end is one a
            // failover took back (`normal`: the replica had not copied it).
            // The client gets the stream from its end on (its final response
            // if stored: the last event), not a refusal it cannot get past.
            if !self.inner.store.is_shared() {
                return Err(unknown("names an event this session never sent"));
            }
            event.seq = if summary.finished { summary.last_seq.saturating_sub(1) } else { summary.last_seq };
        }
        if event.seq + 1 < summary.first_seq {
            return Err(unknown("is too old: later events of its stream were trimmed"));
        }
        if !summary.finished {
            // Its replica may have died since this one loaded the session,
            // or the store lost its final response (`running.rs`).
            self.inner.close_if_orphaned(&session, &event.stream, recovery::AskOwner::Yes).await?;
        }
        let sub = self.inner.hub.subscribe(&session.id, &event.stream, StreamKind::Request);
        let done = summary.finished && event.seq >= summary.last_seq;
        let spec = PumpSpec {
            stream: event.stream.clone(),
            after: event.seq,
            catch_up: !done,
            close_on_final: true,
            standalone_generation: None,
            first: Some(Frame::Prime { id: event.clone() }),
            attachment: None,
        };
        if done {
            // Everything was delivered already: just the priming event, then close.
            return Ok(Frames::ready([Frame::Prime { id: event }]));
        }
        Ok(spawn_pump(self.inner.pumps.clone(), self.inner.clone(), session, spec, sub))
    }

    /// DELETE: ends the session and everything it stored.
    pub async fn delete(&self, session: Arc<Session>) -> Result<(), EngineError> {
        self.inner.end_session(&session, EndReason::Deleted).await?;
        tracing::info!(session = %session.id, "session deleted by client");
        Ok(())
    }

    /// Drains and stops, once (later calls wait for the first to finish):
    /// no new work is taken and every open stream is told to reconnect;
    /// requests in flight get `drain_timeout` to finish, then end as
    /// interrupted (stored, so a client that resumes sees it); background
    /// tasks are awaited (bounded); the store commits everything accepted.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.life.drain_once(inner.config.drain_timeout, inner.after_drain()).await;
    }

    /// Cancelled when the engine starts shutting down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.life.shutdown.clone()
    }

    /// A session by its ID alone, whoever it belongs to (the admin API);
    /// rehydrated from the store like any other.
    pub async fn session_by_id(&self, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        self.inner.load(id).await
    }

    /// When this process last saw activity on a session it holds in memory.
    pub fn last_seen(&self, id: &str) -> Option<i64> {
        self.inner.cached(id).map(|s| s.last_seen())
    }

    /// The endpoint's refusal of every request for now, if its application
    /// has one (see [`McpApp::unavailable`]).
    pub fn unavailable(&self, endpoint: &str) -> Option<RpcError> {
        self.inner.apps.get(endpoint)?.unavailable()
    }

    /// Every endpoint (`""`: `/mcp`) and its application's account of
    /// itself, for operators (see [`McpApp::describe`]).
    pub fn describe_endpoints(&self) -> Vec<(String, Option<Value>)> {
        self.inner.apps.named().into_iter().map(|(name, app)| (name, app.describe())).collect()
    }

    /// The application's account of a stored session, for operators (see
    /// [`McpApp::describe_session`]).
    pub fn describe_session(&self, record: &SessionRecord) -> Option<Value> {
        let endpoint = record.state.get("endpoint").and_then(Value::as_str).unwrap_or("");
        let app = self.inner.apps.get(endpoint)?;
        let app_state = record.state.get("app").and_then(Value::as_object).cloned().unwrap_or_default();
        let local = self.inner.cached(&record.id).and_then(|s| s.local.lock().clone());
        app.describe_session(&app_state, local.as_deref())
    }

    /// The ids of the requests this process runs for a session.
    pub fn in_flight(&self, id: &str) -> Vec<String> {
        let Some(session) = self.inner.cached(id) else { return Vec::new() };
        session.inflight.lock().keys().cloned().collect()
    }

    /// The operations (resumable calls, also tasks) a session started that
    /// are still stored, oldest first, for operators.
    pub async fn operations_of(&self, id: &str) -> Result<Vec<Value>, StoreError> {
        operations::of_session(self.inner.store.as_ref(), id, |op| self.inner.operations.runs_here(op)).await
    }

    /// Sends one notification to every session this process holds in memory
    /// that `keep` selects (the admin API's `POST /admin/notify`): stored on
    /// each one's standalone stream, then delivered to whoever streams it (or
    /// replayed to the next GET, like any other message not related to a
    /// request). Sessions only in the store are not loaded: an operator's
    /// announcement is for the sessions in use. All appends are started at
    /// once, so the group commit takes them in a few transactions. Returns
    /// (sessions notified, sessions whose append failed).
    pub async fn notify_held(&self, keep: impl Fn(&Session) -> bool, method: &str, params: Option<&Value>) -> (usize, usize) {
        use futures::StreamExt;
        let held: Vec<Arc<Session>> = self.inner.cache.sessions.lock().values().filter(|s| keep(s)).cloned().collect();
        let payload = envelope::outbound_message(None, method, params);
        let inner = &self.inner;
        let mut appends: futures::stream::FuturesUnordered<_> = held
            .iter()
            .map(|session| inner.events.emit(&session.id, &session.standalone_stream, EventKind::Message, payload.clone()))
            .collect();
        let (mut notified, mut failed) = (0, 0);
        while let Some(appended) = appends.next().await {
            match appended {
                Ok(_) => notified += 1,
                Err(e) => {
                    failed += 1;
                    if failed == 1 {
                        tracing::warn!(error = %e, method, "a notification to a session could not be stored; it was not sent");
                    }
                }
            }
        }
        (notified, failed)
    }

    /// Sessions currently held in memory (for tests and metrics).
    pub fn cached_sessions(&self) -> usize {
        self.inner.cache.sessions.lock().len()
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// How long the applications may take to let go of what they hold at
/// shutdown (a gateway stops its children: a few seconds each, in parallel).
const APPS_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Inner {
    /// The application of a session's endpoint (the root one if the endpoint
    /// is no longer configured: its requests then get "method not found").
    pub(crate) fn app_of(&self, session: &Session) -> Arc<dyn McpApp> {
        match self.apps.get(&session.endpoint) {
            Some(app) => app.clone(),
            // The sessions of an endpoint no longer configured (removed from the
            // config while sessions of it were stored): every request refused, saying so.
            None => Arc::new(crate::app::Refuses(RpcError::invalid_request(format!(
                "this session's endpoint /mcp/{} is no longer served; start a new session",
                session.endpoint
            )))),
        }
    }

    /// Tells the applications that sessions left this process.
    pub(crate) fn ended(&self, sessions: Vec<Arc<Session>>, reason: EndReason) {
        let ends: Vec<(Arc<dyn McpApp>, SessionEnd)> = sessions
            .into_iter()
            .map(|s| {
                let end = SessionEnd { session_id: s.id.clone(), principal: s.principal.clone(), reason, local: s.take_local() };
                (self.app_of(&s), end)
            })
            .collect();
        self.tell_ended(ends);
    }

    /// A session this process did not hold ended (the reaper expired it):
    /// every application hears of it, since its endpoint is not known here.
    pub(crate) fn ended_elsewhere(&self, session_id: String, reason: EndReason) {
        let ends = self
            .apps
            .all()
            .map(|app| {
                (app.clone(), SessionEnd { session_id: session_id.clone(), principal: String::new(), reason, local: None })
            })
            .collect();
        self.tell_ended(ends);
    }

    fn tell_ended(&self, ends: Vec<(Arc<dyn McpApp>, SessionEnd)>) {
        if ends.is_empty() {
            return;
        }
        self.life.spawn(async move {
            for (app, end) in ends {
                let id = end.session_id.clone();
                if std::panic::AssertUnwindSafe(app.on_session_end(end)).catch_unwind().await.is_err() {
                    tracing::error!(session = %id, "the application panicked hearing that a session ended");
                }
            }
        });
    }

    /// Once the tasks are drained: the applications let go, the lease is
    /// released, the store commits everything accepted.
    async fn after_drain(&self) {
        if tokio::time::timeout(APPS_SHUTDOWN_WAIT, self.shut_down_apps()).await.is_err() {
            tracing::warn!("the applications did not finish shutting down in time; exiting anyway");
        }
        if self.store.is_shared() {
            self.replicas.release_lease().await;
        }
        if let Err(e) = self.store.flush().await {
            tracing::error!(error = %e, "store flush on shutdown failed");
        }
    }

    /// Every session held here leaves this process ([`EndReason::Shutdown`];
    /// it lives on in the store), then every application shuts down. Runs
    /// after the requests drained, so nothing uses what they let go of.
    async fn shut_down_apps(&self) {
        let held: Vec<Arc<Session>> = self.cache.sessions.lock().values().cloned().collect();
        let ends = held.into_iter().map(|s| {
            let end = SessionEnd {
                session_id: s.id.clone(),
                principal: s.principal.clone(),
                reason: EndReason::Shutdown,
                local: s.take_local(),
            };
            let app = self.app_of(&s);
            async move {
                let id = end.session_id.clone();
                if std::panic::AssertUnwindSafe(app.on_session_end(end)).catch_unwind().await.is_err() {
                    tracing::error!(session = %id, "the application panicked hearing that a session ended");
                }
            }
        });
        futures::future::join_all(ends).await;
        let apps = self.apps.all().map(|app| async move {
            if std::panic::AssertUnwindSafe(app.shutdown()).catch_unwind().await.is_err() {
                tracing::error!("an application panicked shutting down");
            }
        });
        futures::future::join_all(apps).await;
    }

    /// The standalone stream's pump for a GET that takes it over: ends the
    /// one open here, and on a shared store records this replica as its
    /// holder and tells the others before the client sees a frame (so the
    /// holder in the store follows the order of the clients' GETs).
    async fn standalone_pump(self: Arc<Self>, session: Arc<Session>, after: u64, sub: live::Subscription) -> Frames {
        let mut generation = 0;
        session.standalone_owner.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        if self.store.is_shared() {
            self.replicas.take_standalone(&session.id).await;
            self.replicas.announce_takeover(&session.id, generation).await;
        }
        let stream = session.standalone_stream.clone();
        let spec = PumpSpec {
            stream: stream.clone(),
            after,
            catch_up: true,
            close_on_final: false,
            standalone_generation: Some(generation),
            first: Some(Frame::Prime { id: EventId::new(&stream, after) }),
            attachment: None,
        };
        spawn_pump(self.pumps.clone(), self, session, spec, sub)
    }
}

#[cfg(test)]
mod tests {
    /// The parts that live on their own (a stream's pump, a listen stream,
    /// related messages, a request's stream, the store-then-publish path,
    /// the running streams) are given handles, not the engine: none of
    /// them reaches a part it was not given. A source check, as
    /// rust-analyzer's tidy tests are: the boundary is a matter of names.
    #[test]
    fn the_parts_that_live_on_their_own_are_given_handles_not_the_engine() {
        let parts = [
            ("pump.rs", include_str!("pump.rs")),
            ("listen.rs", include_str!("listen.rs")),
            ("related.rs", include_str!("related.rs")),
            ("request_stream.rs", include_str!("request_stream.rs")),
            ("events.rs", include_str!("events.rs")),
            ("running.rs", include_str!("running.rs")),
        ];
        for (file, source) in parts {
            let code = source.lines().filter(|line| !line.trim_start().starts_with("//"));
            let named: Vec<&str> = code.filter(|line| line.contains("Inner")).collect();
            assert!(named.is_empty(), "engine/{file} names the engine's `Inner`; give it the handles it needs: {named:?}");
        }
    }
}
