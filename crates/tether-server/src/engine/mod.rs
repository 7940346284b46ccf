//! The session engine: runs MCP sessions independent of HTTP.
//!
//! It creates and rehydrates sessions, starts each request on its own stream,
//! appends every outbound message to the store before publishing it
//! (invariant 1: stored before seen), decides which stream a related message
//! goes on, replays streams for `Last-Event-ID`, and closes requests that a
//! crash cut off when a session is rehydrated.

mod ctx;
mod keys;
mod live;
pub mod operations;
mod pump;
mod replicas;
mod request_stream;
pub mod resume;
mod session;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tether_store::{EventKind, SessionRecord, Store, StoreError, now_ms};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use ctx::{SessionCtx, ToolCtx};
pub use operations::OperationCtx;
pub use pump::Frame;
pub use session::{Session, SessionState};

use crate::app::{McpApp, RpcError};
use crate::config::ServerConfig;
use crate::ids::{self, EventId};
use crate::protocol::{self, Inbound};
use live::{LiveEvent, LiveHub};
use pump::{PumpSpec, spawn_pump};

/// Why the engine refused something; the HTTP layer maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Unknown, expired, deleted, or another principal's session (HTTP 404).
    #[error("session not found: it expired, was deleted, or never existed; send initialize without a session ID")]
    SessionNotFound,
    /// The message is well-formed but not acceptable here (HTTP 400).
    #[error("{message}")]
    BadRequest { code: i64, message: String, id: Option<Value> },
    /// A limit was reached (HTTP 429).
    #[error("{0}")]
    TooMany(String),
    /// The store did not answer (HTTP 503).
    #[error("storage unavailable: {0}")]
    Unavailable(#[from] StoreError),
}

/// What a POST turns into.
pub enum PostOutcome {
    /// A notification or response was taken (HTTP 202).
    Accepted,
    /// A request answered on a new SSE stream.
    Stream { frames: mpsc::Receiver<Frame>, session_id: String },
    /// A quick request: its whole SSE stream (priming event and response),
    /// already committed, written as one body.
    Complete { frames: Vec<Frame>, session_id: String },
    /// A request answered with one JSON body (`--json-response`).
    Json { body: oneshot::Receiver<Bytes>, session_id: String },
}

/// The message that closes a request cut off by a crash (design brief,
/// "Requests cut off by a crash").
pub const INTERRUPTED_MESSAGE: &str =
    "request interrupted by a server restart; it may or may not have taken effect";

pub(crate) struct Inner {
    pub store: Arc<dyn Store>,
    pub app: Arc<dyn McpApp>,
    pub config: ServerConfig,
    pub hub: Arc<LiveHub>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    loading: tokio::sync::Mutex<()>,
    /// Live sessions per principal as last counted in the store, plus the
    /// ones created here since (refreshed every few seconds).
    principal_counts: Mutex<HashMap<String, (u64, i64)>>,
    /// Recorded as the owner of every request this process runs.
    pub instance: String,
    tokens: resume::ResumeTokens,
    pub(crate) key: keys::ServerKey,
    pub(crate) operations: operations::Operations,
    pub shutdown: CancellationToken,
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

impl Engine {
    pub fn new(store: Arc<dyn Store>, app: Arc<dyn McpApp>, config: ServerConfig) -> Self {
        let engine = Self {
            inner: Arc::new(Inner {
                store,
                app,
                config,
                hub: Arc::new(LiveHub::default()),
                sessions: Mutex::new(HashMap::new()),
                loading: tokio::sync::Mutex::new(()),
                principal_counts: Mutex::new(HashMap::new()),
                instance: ids::new_instance_id(),
                tokens: resume::ResumeTokens,
                key: keys::ServerKey::default(),
                operations: operations::Operations::default(),
                shutdown: CancellationToken::new(),
            }),
        };
        if engine.inner.store.is_shared() {
            replicas::start(&engine.inner);
        }
        engine
    }

    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// `Ok` when the store answers.
    pub async fn health(&self) -> Result<(), StoreError> {
        self.inner.store.ping().await
    }

    // ---- sessions ----------------------------------------------------------------

    /// Handles `initialize`: re-attaches to the session named by a valid
    /// resume token in `params._meta`, or creates a durable session; answers
    /// on a new stream of that session with a fresh resume token.
    pub async fn initialize(
        &self,
        principal: &str,
        id: Value,
        params: Option<Map<String, Value>>,
    ) -> Result<PostOutcome, EngineError> {
        let params = params.unwrap_or_default();
        let requested = match params.get("protocolVersion") {
            Some(Value::String(v)) => v.as_str(),
            _ => {
                return Err(EngineError::BadRequest {
                    code: protocol::INVALID_PARAMS,
                    message: "initialize needs params.protocolVersion (a string such as \"2025-11-25\")".into(),
                    id: Some(id),
                });
            }
        };
        let version = protocol::negotiate_version(Some(requested));
        let client_info = params.get("clientInfo").cloned().unwrap_or(Value::Null);
        let client_capabilities = params.get("capabilities").cloned().unwrap_or_else(|| json!({}));
        let presented = params.get("_meta").and_then(|m| m.get(resume::TOKEN_META)).and_then(Value::as_str);

        let mut meta = Map::new();
        let mut resumed = None;
        if let Some(token) = presented {
            match self.resume_session(principal, token).await? {
                Ok(session) => resumed = Some(session),
                Err(refusal) => {
                    tracing::info!(reason = refusal.as_str(), "resume token refused; starting a fresh session");
                    meta.insert(resume::REFUSED_META.into(), json!(refusal.as_str()));
                }
            }
        }
        let session = match resumed {
            Some(session) => {
                let ctx = SessionCtx::new(self.inner.clone(), session.clone());
                let state = ctx
                    .update_state(|s| {
                        s.protocol_version = version.to_owned();
                        s.client_info = client_info.clone();
                        s.client_capabilities = client_capabilities.clone();
                        s.initialized = false;
                        s.resume_generation += 1;
                    })
                    .await
                    .map_err(|e| EngineError::Unavailable(StoreError::Backend(e.message)))?;
                if let Ok(mut v) = session.protocol_version.lock() {
                    *v = state.protocol_version.clone();
                }
                tracing::info!(session = %session.id, version, "session resumed with a resume token");
                meta.insert(resume::RESUMED_META.into(), json!(true));
                session
            }
            None => {
                let session = self.create_session(principal, version, client_info, client_capabilities).await?;
                if presented.is_some() {
                    meta.insert(resume::RESUMED_META.into(), json!(false));
                }
                session
            }
        };
        let generation = session.durable.lock().await.state.resume_generation;
        let key = self.inner.key.get(self.inner.store.as_ref()).await?;
        let token = self.inner.tokens.issue(self.inner.store.as_ref(), &key, &session.id, principal, generation).await?;
        meta.insert(resume::TOKEN_META.into(), json!(token));

        let mut result = json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": self.inner.app.server_info(),
            "_meta": meta,
        });
        if let Some(instructions) = self.inner.app.instructions() {
            result["instructions"] = Value::String(instructions);
        }
        self.inner.clone().start_request(session, id, "initialize", Box::new(move |_| Box::pin(async move { Ok(result) }))).await
    }

    /// Spends a resume token and returns its session, or why not.
    async fn resume_session(&self, principal: &str, token: &str) -> Result<Result<Arc<Session>, resume::Refusal>, EngineError> {
        let key = self.inner.key.get(self.inner.store.as_ref()).await?;
        let redeemed = match self.inner.tokens.redeem(self.inner.store.as_ref(), &key, token, principal).await? {
            Ok(r) => r,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let session = match self.session(&redeemed.session, principal).await {
            Ok(s) => s,
            Err(EngineError::SessionNotFound) => return Ok(Err(resume::Refusal::Expired)),
            Err(e) => return Err(e),
        };
        if session.durable.lock().await.state.resume_generation != redeemed.generation {
            return Ok(Err(resume::Refusal::Used));
        }
        Ok(Ok(session))
    }

    async fn create_session(
        &self,
        principal: &str,
        version: &str,
        client_info: Value,
        client_capabilities: Value,
    ) -> Result<Arc<Session>, EngineError> {
        self.inner.admit_session(principal).await?;
        let state = SessionState {
            protocol_version: version.to_owned(),
            standalone_stream: ids::new_standalone_stream(),
            client_info,
            client_capabilities,
            initialized: false,
            resume_generation: 0,
            app: Map::new(),
        };
        let now = now_ms();
        let record = SessionRecord {
            id: ids::new_session_id(),
            principal: principal.to_owned(),
            created_at_ms: now,
            expires_at_ms: self.inner.expiry_from(now),
            revision: 0,
            state: serde_json::to_value(&state).map_err(|e| StoreError::Backend(e.to_string()))?,
        };
        self.inner.store.create_session(&record).await?;
        let session = Arc::new(Session::new(record.id.clone(), record.principal.clone(), 0, state, record.expires_at_ms));
        self.inner.cache(session.clone());
        tracing::info!(session = %session.id, version, "session created");
        Ok(session)
    }

    /// Finds a session for `principal`, rehydrating it from the store if this
    /// process has not seen it. Another principal's session is "not found".
    pub async fn session(&self, id: &str, principal: &str) -> Result<Arc<Session>, EngineError> {
        let session = self.inner.load(id).await?.ok_or(EngineError::SessionNotFound)?;
        if session.principal != principal {
            return Err(EngineError::SessionNotFound);
        }
        if self.inner.store.is_shared() && !replicas::refresh(&self.inner, &session).await? {
            self.inner.forget(&session);
            return Err(EngineError::SessionNotFound);
        }
        let now = now_ms();
        let ttl = self.inner.config.session_ttl.as_millis() as i64;
        if now >= session.last_seen() + ttl {
            self.inner.end_session(&session).await?;
            return Err(EngineError::SessionNotFound);
        }
        self.inner.touch(&session, now);
        Ok(session)
    }

    /// Handles a POSTed message other than `initialize` for an existing session.
    pub async fn post(&self, session: Arc<Session>, message: Inbound) -> Result<PostOutcome, EngineError> {
        match message {
            Inbound::Request { id, method, .. } if method == "initialize" => Err(EngineError::BadRequest {
                code: protocol::INVALID_REQUEST,
                message: "this session is already initialized; send initialize without an Mcp-Session-Id to start a new one"
                    .into(),
                id: Some(id),
            }),
            Inbound::Request { id, method, params } => {
                let inner = self.inner.clone();
                let owned = method.clone();
                let work: ctx::Work = Box::new(move |ctx| Box::pin(ctx::dispatch(ctx, owned, params)));
                inner.clone().start_request(session, id, &method, work).await
            }
            Inbound::Notification { method, params } => {
                ctx::on_notification(self.inner.clone(), session, method, params).await?;
                Ok(PostOutcome::Accepted)
            }
            Inbound::Response { id, outcome } => {
                let key = ctx::request_key(&id);
                let waiter = session.pending.lock().ok().and_then(|mut p| p.remove(&key));
                match waiter {
                    Some(tx) => {
                        let _ = tx.send(outcome);
                    }
                    // The request may wait on another replica.
                    None if self.inner.store.is_shared() => replicas::post_answer(&self.inner, &session.id, &key, outcome).await?,
                    None => tracing::debug!(session = %session.id, id = %key, "response to no pending request ignored"),
                }
                Ok(PostOutcome::Accepted)
            }
        }
    }

    /// A GET without `Last-Event-ID`: takes over the standalone stream and
    /// starts after the last event written to any earlier connection.
    pub async fn open_standalone(&self, session: Arc<Session>) -> Result<mpsc::Receiver<Frame>, EngineError> {
        let stream = session.standalone_stream.clone();
        let sub = self.inner.hub.subscribe(&session.id, &stream);
        let cursor = self.inner.store.cursor(&session.id, &stream).await?;
        Ok(self.inner.clone().standalone_pump(session, cursor, sub))
    }

    /// A GET with `Last-Event-ID`: replays the rest of exactly that event's
    /// stream of this session, then follows it live.
    pub async fn resume(&self, session: Arc<Session>, last_event_id: &str) -> Result<mpsc::Receiver<Frame>, EngineError> {
        let unknown = |why: &str| EngineError::BadRequest {
            code: protocol::INVALID_REQUEST,
            message: format!("Last-Event-ID `{}` {why}", truncate(last_event_id, 80)),
            id: None,
        };
        let event = EventId::parse(last_event_id).ok_or_else(|| unknown("is not an event ID issued by this server"))?;
        let summary = self.inner.store.stream(&session.id, &event.stream).await?;
        if event.stream == session.standalone_stream {
            let head = summary.map(|s| s.last_seq).unwrap_or(0);
            if event.seq > head {
                return Err(unknown("names an event this session never sent"));
            }
            let sub = self.inner.hub.subscribe(&session.id, &event.stream);
            return Ok(self.inner.clone().standalone_pump(session, event.seq, sub));
        }
        let summary = summary.ok_or_else(|| unknown("does not belong to this session"))?;
        if !event.is_request_stream() || event.seq > summary.last_seq {
            return Err(unknown("names an event this session never sent"));
        }
        if event.seq + 1 < summary.first_seq {
            return Err(unknown("is too old: later events of its stream were trimmed"));
        }
        if !summary.finished && self.inner.store.is_shared() {
            // Its replica may have died since this one loaded the session.
            self.inner.close_if_orphaned(&session, &event.stream).await?;
        }
        let sub = self.inner.hub.subscribe(&session.id, &event.stream);
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
            let (tx, rx) = mpsc::channel(1);
            let _ = tx.try_send(Frame::Prime { id: event });
            return Ok(rx);
        }
        Ok(spawn_pump(self.inner.clone(), session, spec, sub))
    }

    /// DELETE: ends the session and everything it stored.
    pub async fn delete(&self, session: Arc<Session>) -> Result<(), EngineError> {
        self.inner.end_session(&session).await?;
        tracing::info!(session = %session.id, "session deleted by client");
        Ok(())
    }

    /// Deletes expired sessions and drops idle ones from memory, every
    /// `reap_interval`, until shutdown.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(inner.config.reap_interval);
            loop {
                tokio::select! {
                    _ = inner.shutdown.cancelled() => return,
                    _ = tick.tick() => inner.reap().await,
                }
            }
        })
    }

    /// Tells every open stream to reconnect, then waits for the store to
    /// commit everything accepted so far.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        if let Err(e) = self.inner.store.flush().await {
            tracing::error!(error = %e, "store flush on shutdown failed");
        }
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Sessions currently held in memory (for tests and metrics).
    pub fn cached_sessions(&self) -> usize {
        self.inner.sessions.lock().map(|m| m.len()).unwrap_or(0)
    }
}

/// Drops the least recently seen idle sessions from memory until `target`
/// remain (or no idle one is left). Idle means nothing but the map holds it:
/// no request, pump or handler uses it, so no in-memory state is lost; the
/// next request rehydrates it from the store. Checked under the map's lock,
/// which every lookup takes too, so no one can pick it up meanwhile.
fn evict_idle(map: &mut HashMap<String, Arc<Session>>, target: usize) {
    let excess = map.len().saturating_sub(target);
    let mut idle: Vec<(i64, String)> =
        map.iter().filter(|(_, s)| Arc::strong_count(s) == 1).map(|(id, s)| (s.last_seen(), id.clone())).collect();
    if idle.len() > excess && excess > 0 {
        idle.select_nth_unstable(excess - 1);
        idle.truncate(excess);
    }
    for (_, id) in idle {
        map.remove(&id);
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

impl Inner {
    /// Expiry written to the store: the TTL plus a tenth of slack, because
    /// activity only touches the store when the expiry drifted that much.
    fn expiry_from(&self, now: i64) -> i64 {
        let ttl = self.config.session_ttl.as_millis() as i64;
        now + ttl + ttl / 10
    }

    fn cache(&self, session: Arc<Session>) {
        if let Ok(mut map) = self.sessions.lock() {
            map.insert(session.id.clone(), session);
            let capacity = self.config.session_cache.max(1);
            if map.len() > capacity {
                // Down to 7/8 at once, so the scan runs once per capacity/8 insertions.
                evict_idle(&mut map, capacity - capacity / 8);
            }
        }
    }

    /// Drops a session from memory only (another replica ended it).
    fn forget(&self, session: &Session) {
        session.closed.cancel();
        if let Ok(mut map) = self.sessions.lock() {
            map.remove(&session.id);
        }
    }

    pub(crate) fn cached(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().ok().and_then(|m| m.get(id).cloned())
    }

    fn touch(&self, session: &Arc<Session>, now: i64) {
        session.last_seen.store(now, Ordering::Relaxed);
        let ttl = self.config.session_ttl.as_millis() as i64;
        let persisted = session.expires_persisted.load(Ordering::Relaxed);
        let wanted = self.expiry_from(now);
        if wanted - persisted > ttl / 10 {
            session.expires_persisted.store(wanted, Ordering::Relaxed);
            let store = self.store.clone();
            let id = session.id.clone();
            tokio::spawn(async move {
                if let Err(e) = store.touch_session(&id, wanted).await {
                    tracing::warn!(session = %id, error = %e, "could not extend session expiry");
                }
            });
        }
    }

    /// The cached session, or the stored one rehydrated (and its interrupted
    /// requests closed). `None` if the store does not have it.
    async fn load(self: &Arc<Self>, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let _guard = self.loading.lock().await;
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let Some(record) = self.store.get_session(id, now_ms()).await? else {
            return Ok(None);
        };
        let state: SessionState = match serde_json::from_value(record.state) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(session = %id, error = %e, "stored session state is unreadable; treating the session as gone");
                return Ok(None);
            }
        };
        let session =
            Arc::new(Session::new(record.id, record.principal, record.revision, state, record.expires_at_ms));
        self.close_interrupted(&session).await?;
        self.cache(session.clone());
        tracing::info!(session = %id, "session rehydrated from the store");
        Ok(Some(session))
    }

    /// Appends the final error response to every request stream of `session`
    /// that has none and whose request is not running anywhere.
    async fn close_interrupted(&self, session: &Session) -> Result<(), EngineError> {
        for stream in self.store.open_streams(&session.id).await? {
            if stream.stream.starts_with('r') {
                self.close_if_orphaned(session, &stream.stream).await?;
            }
        }
        Ok(())
    }

    /// Closes one unfinished request stream with the "interrupted" error if
    /// its owner is gone: an earlier process of a single-node store, or a
    /// replica whose lease lapsed. Replicas race through a compare-and-set
    /// guard, so the stream gets exactly one final response.
    async fn close_if_orphaned(&self, session: &Session, stream: &str) -> Result<(), EngineError> {
        let prime = self.store.read_after(&session.id, stream, 0, 1).await?;
        let meta: Value = prime
            .first()
            .filter(|e| e.kind == EventKind::Prime)
            .and_then(|e| serde_json::from_slice(&e.payload).ok())
            .unwrap_or(Value::Null);
        let owner = meta.get("owner").and_then(Value::as_str).unwrap_or("");
        if owner == self.instance || (self.store.is_shared() && replicas::is_alive(self, owner).await?) {
            return Ok(());
        }
        let guard = format!("{}/{stream}", session.id);
        let expires = Some(now_ms() + self.config.session_ttl.as_millis() as i64 * 2);
        if self.store.kv_compare_and_set("closed", &guard, None, Bytes::from_static(b"1"), expires).await?.is_none() {
            return Ok(()); // another replica closed it
        }
        let id = meta.get("id").cloned().unwrap_or(Value::Null);
        let payload = protocol::error_message(Some(&id), protocol::INTERNAL_ERROR, INTERRUPTED_MESSAGE, None);
        self.emit(&session.id, stream, EventKind::Final, payload).await?;
        tracing::warn!(session = %session.id, %stream, "closed a request interrupted by a restart");
        Ok(())
    }

    /// Appends the first events of a stream this process just named, in one
    /// commit, then publishes them.
    pub(crate) async fn emit_first(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> Result<u64, StoreError> {
        let first = self.store.start_stream(session, stream, events.clone()).await?;
        for (i, (kind, payload)) in events.into_iter().enumerate() {
            self.hub.publish(session, stream, LiveEvent { seq: first + i as u64, kind, payload: Some(payload) });
        }
        Ok(first)
    }

    /// Appends to the store, then publishes: stored before seen.
    pub(crate) async fn emit(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> Result<u64, StoreError> {
        let seq = self.store.append(session, stream, kind, payload.clone()).await?;
        self.hub.publish(session, stream, LiveEvent { seq, kind, payload: Some(payload) });
        Ok(seq)
    }

    fn standalone_pump(self: Arc<Self>, session: Arc<Session>, after: u64, sub: live::Subscription) -> mpsc::Receiver<Frame> {
        let mut generation = 0;
        session.standalone_owner.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        if self.store.is_shared() {
            let (inner, id) = (self.clone(), session.id.clone());
            tokio::spawn(async move { replicas::announce_takeover(&inner, &id, generation).await });
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
        spawn_pump(self, session, spec, sub)
    }

    /// Registers a request, opens its stream (unless JSON mode) and runs
    /// `work` in its own task, which outlives the connection.
    async fn start_request(
        self: Arc<Self>,
        session: Arc<Session>,
        id: Value,
        method: &str,
        work: ctx::Work,
    ) -> Result<PostOutcome, EngineError> {
        let key = ctx::request_key(&id);
        let cancel = CancellationToken::new();
        {
            let mut inflight = session.inflight.lock().map_err(|_| StoreError::Backend("inflight lock poisoned".into()))?;
            if inflight.contains_key(&key) {
                return Err(EngineError::BadRequest {
                    code: protocol::INVALID_REQUEST,
                    message: format!("request id {key} is already in use by a running request of this session"),
                    id: None,
                });
            }
            if inflight.len() >= self.config.max_inflight_per_session {
                return Err(EngineError::TooMany(format!(
                    "this session already runs {} requests; wait for one to finish",
                    inflight.len()
                )));
            }
            inflight.insert(key.clone(), cancel.clone());
        }
        let session_id = session.id.clone();
        let progress_token = None;
        if self.config.json_response {
            let (tx, rx) = oneshot::channel();
            let ctx = ToolCtx::new(self.clone(), session.clone(), None, id.clone(), progress_token, cancel.clone());
            tokio::spawn(async move {
                let body = ctx::run_work(ctx, work, cancel).await;
                let _ = tx.send(body);
                ctx::finish(&session, &key);
            });
            return Ok(PostOutcome::Json { body: rx, session_id });
        }

        let (stream, attachment, quick) =
            request_stream::RequestStream::new(ids::new_request_stream(), id.clone(), method);
        let name = stream.name.clone();
        let request_id = id.clone();
        let ctx = ToolCtx::new(self.clone(), session.clone(), Some(stream.clone()), id, progress_token, cancel.clone());
        let prime_delay = self.config.prime_delay;
        let worker_session = session.clone();
        // A request's stream is where the work's deferred writes are
        // checked (`tether_store::fence`); JSON answers are not stored, so
        // JSON mode above defers nothing.
        tokio::spawn(tether_store::fence::scope(async move {
            let session = worker_session;
            let inner = ctx.inner().clone();
            let mut work = std::pin::pin!(ctx::run_work(ctx, work, cancel));
            let payload = tokio::select! {
                payload = &mut work => payload,
                _ = tokio::time::sleep(prime_delay) => {
                    // Slow work: give the client an event ID to resume from now.
                    if let Err(e) = stream.ensure_primed(&inner, &session.id).await {
                        tracing::error!(session = %session.id, error = %e, "could not store a priming event");
                    }
                    work.await
                }
            };
            if !session.closed.is_cancelled() {
                let mut stored = stream.finish(&inner, &session.id, payload).await;
                if let Err(StoreError::EarlierWriteFailed(why)) = &stored {
                    let message = format!("the request's changes were not stored: {why}");
                    let error = protocol::error_message(Some(&request_id), protocol::INTERNAL_ERROR, &message, None);
                    stored = stream.finish(&inner, &session.id, error).await;
                }
                if let Err(e) = stored {
                    tracing::error!(session = %session.id, error = %e, "could not store a response; the client will see it as interrupted");
                }
            }
            ctx::finish(&session, &key);
        }));
        if let Ok(request_stream::Quick::Done { response_seq, response }) = quick.await {
            let frames = vec![
                Frame::Prime { id: EventId::new(&name, response_seq.saturating_sub(1)) },
                Frame::Event { id: EventId::new(&name, response_seq), data: response },
            ];
            return Ok(PostOutcome::Complete { frames, session_id });
        }
        // Slow or chatty work (or a store failure): follow the stream from the store.
        let sub = self.hub.subscribe(&session.id, &name);
        let spec = PumpSpec {
            stream: name,
            after: 0,
            catch_up: true,
            close_on_final: true,
            standalone_generation: None,
            first: None,
            attachment: Some(attachment),
        };
        let frames = spawn_pump(self.clone(), session, spec, sub);
        Ok(PostOutcome::Stream { frames, session_id })
    }

    /// Enforces `max_sessions_per_principal`. The count comes from the
    /// store at most every few seconds and is kept up to date locally in
    /// between, so it is exact on one node and close with replicas.
    async fn admit_session(&self, principal: &str) -> Result<(), EngineError> {
        const RECOUNT_MS: i64 = 5_000;
        let now = now_ms();
        let cached = self.principal_counts.lock().ok().and_then(|m| m.get(principal).copied());
        let count = match cached {
            Some((count, at)) if now - at < RECOUNT_MS => count,
            _ => self.store.count_sessions(principal, now).await?,
        };
        let max = self.config.max_sessions_per_principal as u64;
        if count >= max {
            return Err(EngineError::TooMany(format!(
                "this principal already has {count} live sessions (limit {max}); end some with DELETE or let them expire"
            )));
        }
        if let Ok(mut m) = self.principal_counts.lock() {
            let at = match cached {
                Some((_, at)) if now - at < RECOUNT_MS => at,
                _ => now,
            };
            m.insert(principal.to_owned(), (count + 1, at));
            if m.len() > 100_000 {
                m.clear();
            }
        }
        Ok(())
    }

    /// Forgets and deletes a session (DELETE or expiry).
    async fn end_session(&self, session: &Arc<Session>) -> Result<(), EngineError> {
        session.closed.cancel();
        if let Some(entry) = self.principal_counts.lock().ok().as_mut().and_then(|m| m.get_mut(&session.principal)) {
            entry.0 = entry.0.saturating_sub(1);
        }
        if let Ok(inflight) = session.inflight.lock() {
            inflight.values().for_each(CancellationToken::cancel);
        }
        if let Ok(mut map) = self.sessions.lock() {
            map.remove(&session.id);
        }
        self.store.delete_session(&session.id).await?;
        Ok(())
    }

    /// Finished request streams are kept for replay for one session TTL,
    /// then dropped (whether or not their session still exists).
    async fn drop_old_request_streams(&self) {
        let cutoff = now_ms() - self.config.session_ttl.as_millis() as i64;
        let (from, below) = crate::ids::request_streams_started_before(cutoff);
        for _ in 0..DROP_ROUNDS_PER_REAP {
            match self.store.drop_finished_streams(from, &below, cutoff, DROP_EVENTS_PER_ROUND).await {
                Ok(dropped) if dropped as usize >= DROP_EVENTS_PER_ROUND => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reaper could not drop old request streams");
                    break;
                }
            }
        }
    }

    async fn reap(&self) {
        match self.store.expire_sessions(now_ms(), 1000).await {
            Ok(expired) => {
                for id in expired {
                    if let Some(s) = self.sessions.lock().ok().and_then(|mut m| m.remove(&id)) {
                        s.closed.cancel();
                    }
                    tracing::info!(session = %id, "expired session removed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaper could not expire sessions"),
        }
        self.drop_old_request_streams().await;
        // Idle sessions leave memory; the store still has them.
        let idle_before = now_ms() - 60_000;
        let idle: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .map(|m| m.values().filter(|s| s.last_seen() < idle_before && !s.is_busy()).cloned().collect())
            .unwrap_or_default();
        for s in idle {
            if self.hub.session_connections(&s.id) == 0
                && let Ok(mut m) = self.sessions.lock() {
                    m.remove(&s.id);
                }
        }
    }
}

/// Old request streams dropped per store call (one short write), and calls per reap.
const DROP_EVENTS_PER_ROUND: usize = 10_000;
const DROP_ROUNDS_PER_REAP: usize = 20;

/// A type-erased unit of request work, for [`ctx::Work`].
pub(crate) type WorkFuture = BoxFuture<'static, Result<Value, RpcError>>;


#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, last_seen: i64) -> Arc<Session> {
        let state = SessionState {
            protocol_version: "2025-11-25".into(),
            standalone_stream: ids::new_standalone_stream(),
            client_info: Value::Null,
            client_capabilities: json!({}),
            initialized: true,
            resume_generation: 0,
            app: Map::new(),
        };
        let s = Session::new(id.into(), "p".into(), 0, state, i64::MAX);
        s.last_seen.store(last_seen, Ordering::Relaxed);
        Arc::new(s)
    }

    #[test]
    fn eviction_drops_the_oldest_idle_sessions_and_never_one_in_use() {
        let mut map = HashMap::new();
        let mut held = Vec::new();
        for i in 0..10 {
            let s = session(&format!("s{i}"), i);
            if i < 3 {
                held.push(s.clone()); // in use: a request or pump holds it
            }
            map.insert(s.id.clone(), s);
        }
        evict_idle(&mut map, 6);
        let mut left: Vec<&str> = map.keys().map(String::as_str).collect();
        left.sort();
        assert_eq!(left, ["s0", "s1", "s2", "s7", "s8", "s9"], "oldest idle ones go, held ones stay");

        evict_idle(&mut map, 0);
        let mut left: Vec<&str> = map.keys().map(String::as_str).collect();
        left.sort();
        assert_eq!(left, ["s0", "s1", "s2"], "sessions in use are never dropped");
        drop(held);
    }
}
