//! The session pool: callers say what to call, the pool handles sessions.
//!
//! - Sessions are keyed by (server URL, principal: token and headers) and
//!   reused; concurrent first calls share one `initialize`.
//! - `requires_session`: `auto` makes the first call without a session and
//!   initializes when the server answers that a session is required
//!   (only one caller probes; the others wait for the verdict); `true`
//!   initializes first; `false` never does and names the setting when a
//!   server insists.
//! - An established session answered with 404 is replaced by a new one
//!   (one `initialize`) and the request is sent once more; a second
//!   failure is reported.
//! - Sessions idle for `idle_timeout`, and all sessions at `shutdown`, are
//!   terminated with DELETE; failures there are logged, not raised.
//! - Server requests on pool sessions are answered by default handlers:
//!   `ping`, and `roots/list` from `PoolOptions::roots`; progress
//!   notifications reach the `call_tool` that asked for them.
//! - `protocol`: `auto` asks `server/discover` once per server and speaks
//!   the sessionless revision (2026-07-28) where it is offered: the same
//!   handlers answer its `input_required` rounds (MRTR), and a task is
//!   followed with `tasks/get` (at its `pollIntervalMs`) to its end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tether_wire::{RpcError, code};
use tokio::task::JoinHandle;

use crate::config::{Protocol, RequiresSession, ServerSpec};
use crate::error::ReqError;
use crate::resume::{self, Round};
use crate::session::{PeerMessage, Session};
use crate::{ClientError, DEFAULT_PROTOCOL_VERSION};

/// The client's roots, asked for each time a server sends `roots/list`:
/// objects like `{"uri": "file:///work", "name": "work"}`.
pub type RootsProvider = Arc<dyn Fn() -> Vec<Value> + Send + Sync>;
/// Called with (server URL, method, params) for server notifications.
pub type NotificationHandler = Arc<dyn Fn(&str, &str, Option<&Value>) + Send + Sync>;
/// Progress of one `call_tool`.
pub type ProgressHandler = Arc<dyn Fn(CallProgress) + Send + Sync>;

/// Pages of `tools/list` followed at most.
const MAX_LIST_PAGES: usize = 100;

/// How the pool behaves.
#[derive(Clone)]
pub struct PoolOptions {
    /// `clientInfo` sent in `initialize`.
    pub client_name: String,
    /// Its version.
    pub client_version: String,
    /// Protocol version asked for in `initialize` and sent by sessionless calls.
    pub protocol_version: String,
    /// A session unused this long is terminated (DELETE).
    pub idle_timeout: Duration,
    /// Answers `roots/list` (default: no roots).
    pub roots: RootsProvider,
    /// Sees every server notification (progress included).
    pub on_notification: Option<NotificationHandler>,
    /// Bound on resume rounds of one `call_tool`.
    pub max_resume_rounds: usize,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            client_name: "tether".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: DEFAULT_PROTOCOL_VERSION.into(),
            idle_timeout: Duration::from_secs(300),
            roots: Arc::new(Vec::new),
            on_notification: None,
            max_resume_rounds: resume::DEFAULT_MAX_ROUNDS,
        }
    }
}

/// What a long `call_tool` reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum CallProgress {
    /// A round of the resume loop finished.
    Round(Round),
    /// The server sent `notifications/progress` for this call.
    Progress {
        /// How far it is.
        progress: f64,
        /// Out of how much, when the server knows.
        total: Option<f64>,
        /// What it is doing.
        message: Option<String>,
    },
}

/// A pool of MCP sessions. Cheap to clone; clones share the sessions.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    options: PoolOptions,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    progress: Arc<Mutex<HashMap<String, ProgressHandler>>>,
    next_token: AtomicU64,
    reaper: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if let Some(t) = self.reaper.get_mut().take() {
            t.abort();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Mode {
    /// `auto` before the first answer.
    #[default]
    Unknown,
    Stateless,
    Session,
}

#[derive(Default)]
struct State {
    mode: Mode,
    session: Option<Session>,
    stateless: Option<Session>,
    /// The server answered over the 2024-11-05 HTTP+SSE transport: its next
    /// session goes there directly, without a Streamable HTTP probe first.
    legacy: bool,
    /// Whether the server speaks the sessionless revision (known after the
    /// `server/discover` of `auto`).
    speaks_sessionless: Option<bool>,
    /// The client of the sessionless revision, once one is needed.
    sessionless_client: Option<Session>,
}

/// One (URL, principal).
struct Entry {
    url: String,
    state: Arc<tokio::sync::Mutex<State>>,
    last_used: Mutex<Instant>,
    in_flight: AtomicUsize,
}

struct Busy<'a>(&'a Entry);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *self.0.last_used.lock() = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Entry {
    fn busy(&self) -> Busy<'_> {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }
}

fn key_of(server: &ServerSpec) -> String {
    let mut h = Sha256::new();
    if let Some(t) = &server.options.bearer_token {
        h.update(b"token\0");
        h.update(t.as_bytes());
    }
    for (k, v) in &server.options.headers {
        h.update(b"\0header\0");
        h.update(k.to_ascii_lowercase().as_bytes());
        h.update(b"\0");
        h.update(v.as_bytes());
    }
    format!("{} {}", server.url, hex::encode(&h.finalize()[..16]))
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(PoolOptions::default())
    }
}

impl Pool {
    /// A pool; inside a tokio runtime it also starts the idle reaper.
    pub fn new(options: PoolOptions) -> Pool {
        let inner = Arc::new(PoolInner {
            options,
            entries: Mutex::new(HashMap::new()),
            progress: Arc::new(Mutex::new(HashMap::new())),
            next_token: AtomicU64::new(1),
            reaper: Mutex::new(None),
        });
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let task = handle.spawn(reap(Arc::downgrade(&inner)));
            *inner.reaper.lock() = Some(task);
        }
        Pool { inner }
    }

    /// What the pool was built with.
    pub fn options(&self) -> &PoolOptions {
        &self.inner.options
    }

    fn entry(&self, server: &ServerSpec) -> Arc<Entry> {
        let key = key_of(server);
        let mut entries = self.inner.entries.lock();
        entries
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Entry {
                    url: server.url.clone(),
                    state: Arc::default(),
                    last_used: Mutex::new(Instant::now()),
                    in_flight: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// The `initialize` params of pool sessions.
    pub fn initialize_params(&self) -> Value {
        let o = &self.inner.options;
        json!({
            "protocolVersion": o.protocol_version,
            "capabilities": {"roots": {"listChanged": false}},
            "clientInfo": {"name": o.client_name, "version": o.client_version},
        })
    }

    /// One request to `server`, with sessions handled as configured.
    pub async fn request(&self, server: &ServerSpec, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let entry = self.entry(server);
        let _busy = entry.busy();
        if let Some(sessionless) = self.sessionless_client(&entry, server).await? {
            return self.sessionless_request(&sessionless, method, params).await;
        }
        match server.requires_session {
            RequiresSession::Always => self.with_session(&entry, server, method, params).await,
            RequiresSession::Never => {
                let s = self.stateless(&entry, server).await?;
                match s.request_raw(method, params, None).await {
                    Err(e) if e.says_session_required() => Err(ClientError::Config(format!(
                        "the server at {} requires a session ({}), but requires_session = false for it; \
                         set requires_session = \"auto\" or \"true\" (--requires-session auto)",
                        server.url,
                        e.into_client()
                    ))),
                    r => r.map_err(ReqError::into_client),
                }
            }
            RequiresSession::Auto => self.auto(&entry, server, method, params).await,
        }
    }

    async fn auto(
        &self,
        entry: &Arc<Entry>,
        server: &ServerSpec,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ClientError> {
        let guard = entry.state.clone().lock_owned().await;
        match guard.mode {
            Mode::Session => {
                drop(guard);
                self.with_session(entry, server, method, params).await
            }
            Mode::Stateless => {
                drop(guard);
                let s = self.stateless(entry, server).await?;
                match s.request_raw(method, params.clone(), None).await {
                    Err(e) if e.says_session_required() => {
                        tracing::debug!(url = %server.url, "the server now wants a session: {}", e.into_client());
                        entry.state.lock().await.mode = Mode::Session;
                        self.with_session(entry, server, method, params).await
                    }
                    r => r.map_err(ReqError::into_client),
                }
            }
            Mode::Unknown => {
                // This caller probes; the others wait on the lock until the
                // server accepted the request (no session needed) or a
                // session exists.
                let mut guard = guard;
                let s = match &guard.stateless {
                    Some(s) => s.clone(),
                    None => {
                        let s = Session::stateless(&server.url, server.options.clone(), &self.inner.options.protocol_version)?;
                        guard.stateless = Some(s.clone());
                        s
                    }
                };
                let slot = Arc::new(Mutex::new(Some(guard)));
                let on_accept = slot.clone();
                let accepted: Box<dyn FnOnce() + Send> = Box::new(move || {
                    if let Some(mut g) = on_accept.lock().take() {
                        g.mode = Mode::Stateless;
                    }
                });
                let outcome = s.request_raw(method, params.clone(), Some(accepted)).await;
                let still_held = slot.lock().take();
                match outcome {
                    Err(e) if e.says_session_required() => {
                        tracing::debug!(url = %server.url, "the server wants a session: {}", e.into_client());
                        let mut g = match still_held {
                            Some(g) => g,
                            None => entry.state.clone().lock_owned().await,
                        };
                        g.mode = Mode::Session;
                        let session = self.open_session(&mut g, server).await;
                        drop(g);
                        session?;
                        self.with_session(entry, server, method, params).await
                    }
                    other => {
                        drop(still_held);
                        other.map_err(ReqError::into_client)
                    }
                }
            }
        }
    }

    /// The sessionless-revision client for `server`, if the pool speaks
    /// that revision to it (`protocol`; `auto` asks `server/discover` once).
    async fn sessionless_client(&self, entry: &Entry, server: &ServerSpec) -> Result<Option<Session>, ClientError> {
        if server.protocol == Protocol::Session {
            return Ok(None);
        }
        let mut g = entry.state.lock().await;
        if g.speaks_sessionless == Some(false) {
            return Ok(None);
        }
        let session = match &g.sessionless_client {
            Some(s) => s.clone(),
            None => {
                let o = &self.inner.options;
                let capabilities = json!({"roots": {}, "extensions": {(tether_wire::meta::TASKS_EXTENSION): {}}});
                let info = json!({"name": o.client_name, "version": o.client_version});
                let s = Session::sessionless(&server.url, server.options.clone(), info, capabilities)?;
                self.attach_handlers(&s);
                g.sessionless_client = Some(s.clone());
                s
            }
        };
        if g.speaks_sessionless.is_none() {
            let offered = match server.protocol {
                Protocol::Sessionless => true,
                _ => match session.request("server/discover", None).await {
                    Ok(found) => found
                        .get("supportedVersions")
                        .and_then(Value::as_array)
                        .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(crate::session::SESSIONLESS_VERSION))),
                    Err(e) => {
                        tracing::debug!(url = %server.url, "no server/discover ({e}); speaking the session era");
                        false
                    }
                },
            };
            g.speaks_sessionless = Some(offered);
        }
        Ok((g.speaks_sessionless == Some(true)).then_some(session))
    }

    /// A request of the sessionless revision: its `input_required` rounds
    /// answered by the pool's handlers, a task followed to its end.
    async fn sessionless_request(&self, session: &Session, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        crate::rounds::request_to_end(session, method, params, |request| std::future::ready(self.answer_input(&request))).await
    }

    /// What the pool answers an input request with: what its handlers
    /// answer the same request of a session.
    fn answer_input(&self, request: &Value) -> Result<Value, ClientError> {
        match request.get("method").and_then(Value::as_str) {
            Some("roots/list") => Ok(json!({"roots": (self.inner.options.roots)()})),
            Some("ping") => Ok(json!({})),
            other => Err(ClientError::Transport(format!(
                "the server asked for {} during the request; tether's client answers roots/list only",
                other.unwrap_or("an unnamed request")
            ))),
        }
    }

    async fn stateless(&self, entry: &Entry, server: &ServerSpec) -> Result<Session, ClientError> {
        let mut g = entry.state.lock().await;
        if let Some(s) = &g.stateless {
            return Ok(s.clone());
        }
        let s = Session::stateless(&server.url, server.options.clone(), &self.inner.options.protocol_version)?;
        g.stateless = Some(s.clone());
        Ok(s)
    }

    /// The entry's session, initializing one if there is none (under the
    /// entry's lock: concurrent callers share one `initialize`).
    async fn session_for(&self, entry: &Entry, server: &ServerSpec) -> Result<Session, ClientError> {
        let mut g = entry.state.lock().await;
        self.open_session(&mut g, server).await
    }

    async fn open_session(&self, state: &mut State, server: &ServerSpec) -> Result<Session, ClientError> {
        if let Some(s) = &state.session {
            return Ok(s.clone());
        }
        let (session, _result) = if state.legacy {
            Session::connect_legacy_transport(&server.url, server.options.clone(), self.initialize_params()).await?
        } else {
            Session::connect(&server.url, server.options.clone(), self.initialize_params()).await?
        };
        state.legacy = session.is_legacy();
        tracing::debug!(url = %server.url, session = ?session.session_id(), "initialized");
        self.attach_handlers(&session);
        state.session = Some(session.clone());
        Ok(session)
    }

    async fn with_session(
        &self,
        entry: &Entry,
        server: &ServerSpec,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, ClientError> {
        let s = self.session_for(entry, server).await?;
        match s.request_raw(method, params.clone(), None).await {
            Err(ReqError::Client(ClientError::SessionNotFound)) => {
                tracing::info!(url = %server.url, "the server forgot the session; initializing a new one and retrying once");
                {
                    let mut g = entry.state.lock().await;
                    if g.session.as_ref().is_some_and(|cur| cur.same_as(&s)) {
                        g.session = None;
                    }
                }
                s.abandon();
                let s2 = self.session_for(entry, server).await?;
                s2.request_raw(method, params, None).await.map_err(ReqError::into_client)
            }
            r => r.map_err(ReqError::into_client),
        }
    }

    /// Answers `ping` and `roots/list` and routes notifications for a pool session.
    fn attach_handlers(&self, session: &Session) {
        let Some(mut rx) = session.take_incoming() else { return };
        let weak = session.downgrade();
        let roots = self.inner.options.roots.clone();
        let on_notification = self.inner.options.on_notification.clone();
        let progress = self.inner.progress.clone();
        let url = session.url().to_owned();
        tokio::spawn(async move {
            while let Some(message) = rx.recv().await {
                match message {
                    PeerMessage::Request { id, method, .. } => {
                        let answer = match method.as_str() {
                            "ping" => Ok(json!({})),
                            "roots/list" => Ok(json!({"roots": roots()})),
                            other => {
                                Err(RpcError::new(code::METHOD_NOT_FOUND, format!("this client does not handle {other}"))
                                    .to_object())
                            }
                        };
                        let Some(s) = weak.upgrade() else { break };
                        let url = url.clone();
                        tokio::spawn(async move {
                            match s.respond(id, answer).await {
                                Ok(()) => {}
                                // Closed meanwhile (a CLI that got its answer exits): nothing to report.
                                Err(e) if s.is_closed() => tracing::debug!(%url, "answering the server's {method}: {e}"),
                                Err(e) => tracing::warn!(%url, "answering the server's {method}: {e}"),
                            }
                        });
                    }
                    PeerMessage::Notification { method, params } => {
                        if method == "notifications/progress" {
                            route_progress(&progress, params.as_ref());
                        }
                        if let Some(h) = &on_notification {
                            h(&url, &method, params.as_ref());
                        }
                    }
                }
            }
        });
    }

    /// `tools/list`, all pages.
    pub async fn list_tools(&self, server: &ServerSpec) -> Result<Vec<Value>, ClientError> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_LIST_PAGES {
            let params = cursor.take().map(|c| json!({"cursor": c}));
            let page = self.request(server, "tools/list", params).await?;
            if let Some(list) = page.get("tools").and_then(Value::as_array) {
                tools.extend(list.iter().cloned());
            } else {
                return Err(ClientError::Transport(format!("the tools/list result from {} has no tools array", server.url)));
            }
            match page.get("nextCursor") {
                Some(c) if !c.is_null() => cursor = Some(c.clone()),
                _ => return Ok(tools),
            }
        }
        Err(ClientError::Transport(format!("tools/list from {} still had more pages after {MAX_LIST_PAGES}", server.url)))
    }

    /// `tools/call`, following resume tokens to the complete result.
    /// `progress` (if any) sees each round and the server's progress
    /// notifications (a `progressToken` is sent for them).
    pub async fn call_tool(
        &self,
        server: &ServerSpec,
        name: &str,
        arguments: Value,
        progress: Option<ProgressHandler>,
    ) -> Result<Value, ClientError> {
        // This client follows `nextResumeToken`: it asks tether for pages
        // rather than a result cut at the server's cap.
        let mut params = json!({"name": name, "arguments": arguments, "_meta": {(tether_wire::meta::PAGING): true}});
        let route = progress.as_ref().map(|p| {
            let token = format!("tether-{}-{}", std::process::id(), self.inner.next_token.fetch_add(1, Ordering::Relaxed));
            self.inner.progress.lock().insert(token.clone(), p.clone());
            params["_meta"]["progressToken"] = json!(token);
            RouteGuard { routes: self.inner.progress.clone(), token }
        });
        let result = resume::follow(
            params,
            self.inner.options.max_resume_rounds,
            |p| self.request(server, "tools/call", Some(p)),
            |round| {
                if let Some(p) = &progress {
                    p(CallProgress::Round(round.clone()));
                }
            },
        )
        .await;
        drop(route);
        result
    }

    /// The current session ID for `server` (none before the first call,
    /// for stateless servers, or after the session was dropped).
    pub async fn session_id(&self, server: &ServerSpec) -> Option<String> {
        let entry = self.entry(server);
        let g = entry.state.lock().await;
        g.session.as_ref().and_then(Session::session_id)
    }

    /// Terminates every session (DELETE); errors are logged.
    pub async fn shutdown(&self) {
        let entries: Vec<Arc<Entry>> = self.inner.entries.lock().values().cloned().collect();
        for entry in entries {
            let taken = {
                let mut g = entry.state.lock().await;
                g.stateless = None;
                g.session.take()
            };
            if let Some(s) = taken {
                s.close().await;
            }
        }
    }
}

struct RouteGuard {
    routes: Arc<Mutex<HashMap<String, ProgressHandler>>>,
    token: String,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes.lock().remove(&self.token);
    }
}

fn route_progress(routes: &Mutex<HashMap<String, ProgressHandler>>, params: Option<&Value>) {
    let Some(p) = params else { return };
    let token = match p.get("progressToken") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => return,
    };
    let handler = routes.lock().get(&token).cloned();
    if let Some(h) = handler {
        h(CallProgress::Progress {
            progress: p.get("progress").and_then(Value::as_f64).unwrap_or(0.0),
            total: p.get("total").and_then(Value::as_f64),
            message: p.get("message").and_then(Value::as_str).map(str::to_owned),
        });
    }
}

/// Terminates sessions idle for longer than `idle_timeout`.
async fn reap(pool: Weak<PoolInner>) {
    loop {
        let tick = match pool.upgrade() {
            Some(p) => (p.options.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30)),
            None => return,
        };
        tokio::time::sleep(tick).await;
        let Some(p) = pool.upgrade() else { return };
        let idle = p.options.idle_timeout;
        let entries: Vec<Arc<Entry>> = p.entries.lock().values().cloned().collect();
        drop(p);
        for entry in entries {
            let quiet = entry.in_flight.load(Ordering::Acquire) == 0 && entry.last_used.lock().elapsed() >= idle;
            if !quiet {
                continue;
            }
            let taken = match entry.state.try_lock() {
                Ok(mut g) if entry.in_flight.load(Ordering::Acquire) == 0 => g.session.take(),
                _ => None,
            };
            if let Some(s) = taken {
                tracing::debug!(url = %entry.url, "terminating an idle session");
                s.close().await;
            }
        }
    }
}
