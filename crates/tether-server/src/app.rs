//! The seam between the engine and an MCP application (the notebook, later
//! the gateway).
//!
//! An application answers `initialize` and any request method with raw JSON,
//! hears client notifications (in order, one at a time per session) and the
//! end of sessions. It never sees HTTP, streams or event IDs: it talks to its
//! client through [`RequestCtx`] (progress, notifications, server-to-client
//! requests such as `roots/list`) and keeps per-session context in
//! [`SessionCtx::app_state`] (durable, stored with the session) and
//! [`SessionCtx::local`] (in memory, dropped when the session leaves memory).
//!
//! Applications made of tools implement [`ToolApp`](crate::tools::ToolApp)
//! instead and are served through [`ToolRouter`](crate::tools::ToolRouter).

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

pub use crate::authorized::Authorized;
pub use crate::engine::{OperationCtx, RequestCtx, SessionCtx};
pub use tether_wire::RpcError;

/// A request's result, passed to the client as it is (no typed model in
/// between that could drop fields it does not know).
pub type RawResult = Box<RawValue>;

/// The principal of every request while authentication is off.
pub const ANONYMOUS: &str = "anonymous";

/// Who sent a request: the authenticated principal and what the client
/// declared in `initialize` (or, later, in a sessionless request's `_meta`).
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// The principal the bearer token maps to (`anonymous` without auth).
    pub principal: String,
    /// Shared with the session's stored state: an idle session holds one copy.
    pub client: Arc<ClientDeclaration>,
}

/// What a client declared about itself in `initialize`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientDeclaration {
    /// The protocol revision of this exchange.
    pub protocol_version: String,
    /// `clientInfo` as the client sent it.
    #[serde(default)]
    pub client_info: Value,
    /// `capabilities` as the client declared them.
    #[serde(default)]
    pub client_capabilities: Value,
}

impl Caller {
    /// The protocol revision the client speaks.
    pub fn protocol_version(&self) -> &str {
        &self.client.protocol_version
    }

    /// `clientInfo` as the client sent it.
    pub fn client_info(&self) -> &Value {
        &self.client.client_info
    }

    /// The client's capabilities as it declared them.
    pub fn client_capabilities(&self) -> &Value {
        &self.client.client_capabilities
    }
}

/// An `initialize` as the application sees it: the caller, the params as
/// sent, and what the application wants the new (or resumed) session to start
/// with: durable app state and in-memory local state (for example a child
/// process started to answer this very `initialize`).
pub struct Initialize<'a> {
    /// Who initializes.
    pub caller: &'a Caller,
    /// The `initialize` params as sent.
    pub params: &'a Map<String, Value>,
    pub(crate) authorized: Option<&'a Authorized>,
    pub(crate) session_id: &'a str,
    pub(crate) app_state: Map<String, Value>,
    pub(crate) local: Option<Arc<dyn Any + Send + Sync>>,
}

impl<'a> Initialize<'a> {
    pub(crate) fn new(
        caller: &'a Caller,
        params: &'a Map<String, Value>,
        authorized: Option<&'a Authorized>,
        session_id: &'a str,
    ) -> Self {
        Self { caller, params, authorized, session_id, app_state: Map::new(), local: None }
    }

    /// The ID of the session this `initialize` makes. A client that presents
    /// a resume token may carry on an existing session instead; the
    /// application then learns that session's ID on its first request.
    pub fn session_id(&self) -> &str {
        self.session_id
    }

    /// What the HTTP front established about this `initialize` (its
    /// verified token and claims), if it came through the front.
    pub fn authorized(&self) -> Option<&Authorized> {
        self.authorized
    }

    /// Stored in the session's durable app state once the session exists
    /// (merged into it when a resume token re-attaches an existing session).
    pub fn set_app_state(&mut self, key: impl Into<String>, value: Value) {
        self.app_state.insert(key.into(), value);
    }

    /// Becomes the session's [`SessionCtx::local`] state of type `T` (dropped
    /// if the `initialize` fails after all).
    pub fn set_local<T: Send + Sync + 'static>(&mut self, local: Arc<T>) {
        self.local = Some(local);
    }

    /// The local state of type `T` this `initialize` gives the session,
    /// made with `T::default()` (replacing any other) on first use: for an
    /// application whose parts each put their piece in one shared value.
    pub fn local<T: Default + Send + Sync + 'static>(&mut self) -> Arc<T> {
        if let Some(found) = self.local.clone().and_then(|l| l.downcast::<T>().ok()) {
            return found;
        }
        let fresh = Arc::new(T::default());
        self.local = Some(fresh.clone());
        fresh
    }
}

/// The applications of one server by endpoint: the root one is served at
/// `/mcp`, the others at `/mcp/NAME`. A session belongs to the endpoint it
/// was initialized on. Clones share one table, so the binary can change it
/// while the engine serves (SIGHUP: upstreams added, removed, changed).
#[derive(Clone)]
pub struct Endpoints {
    apps: Arc<parking_lot::RwLock<std::collections::HashMap<String, Arc<dyn McpApp>>>>,
}

/// The name of the root endpoint (`/mcp`).
pub const ROOT_ENDPOINT: &str = "";

impl Endpoints {
    /// `root` served at `/mcp`, no other endpoint yet.
    pub fn new(root: Arc<dyn McpApp>) -> Self {
        let apps = std::collections::HashMap::from([(ROOT_ENDPOINT.to_owned(), root)]);
        Self { apps: Arc::new(parking_lot::RwLock::new(apps)) }
    }

    /// Adds `/mcp/NAME`.
    pub fn with(self, name: impl Into<String>, app: Arc<dyn McpApp>) -> Self {
        self.set(name, app);
        self
    }

    /// Serves `app` at `/mcp/NAME` from now on (replacing what was there).
    pub fn set(&self, name: impl Into<String>, app: Arc<dyn McpApp>) {
        self.apps.write().insert(name.into(), app);
    }

    /// Stops serving `/mcp/NAME` (never the root); its sessions are then "not found".
    pub fn remove(&self, name: &str) -> bool {
        name != ROOT_ENDPOINT && self.apps.write().remove(name).is_some()
    }

    /// The application at endpoint `name` (`""`: `/mcp`).
    pub fn get(&self, name: &str) -> Option<Arc<dyn McpApp>> {
        self.apps.read().get(name).cloned()
    }

    /// Every application served.
    pub fn all(&self) -> std::vec::IntoIter<Arc<dyn McpApp>> {
        self.apps.read().values().cloned().collect::<Vec<_>>().into_iter()
    }

    /// Every endpoint's name and application, by name.
    pub fn named(&self) -> Vec<(String, Arc<dyn McpApp>)> {
        let mut named: Vec<_> = self.apps.read().iter().map(|(name, app)| (name.clone(), app.clone())).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }
}

impl From<Arc<dyn McpApp>> for Endpoints {
    fn from(root: Arc<dyn McpApp>) -> Self {
        Self::new(root)
    }
}

/// Why a session left this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The client sent DELETE: the session and its stored data are gone.
    Deleted,
    /// Its TTL passed: the session and its stored data are gone.
    Expired,
    /// This process is shutting down; the session lives on in the store and
    /// another process (or this one, restarted) carries it on.
    Shutdown,
    /// Dropped from memory to stay under `--session-cache`, or because
    /// another replica ended it; its durable state is still in the store,
    /// and a later request loads it again (with fresh local state).
    Evicted,
}

/// A session that left this process, as told to [`McpApp::on_session_end`].
pub struct SessionEnd {
    /// The session that ended.
    pub session_id: String,
    /// Whose it was.
    pub principal: String,
    /// Why it ended.
    pub reason: EndReason,
    /// What the application kept in [`SessionCtx::local`], if anything.
    pub(crate) local: Option<Arc<dyn Any + Send + Sync>>,
}

impl SessionEnd {
    /// The session's in-memory state of type `T`, if it had one.
    pub fn local<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.local.clone().and_then(|l| l.downcast::<T>().ok())
    }
}

/// How a resumable tool runs (see [`ToolApp::operation_spec`](crate::tools::ToolApp::operation_spec)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationSpec {
    /// After a crash the operation continues from its stored cursor (the
    /// chunks already stored); otherwise its token reports an interruption.
    pub restartable: bool,
    /// Advertised to clients in the tool's `_meta`.
    pub expected_duration_ms: u64,
}

/// Runs the work of durable operations (resumable tool calls). The engine
/// calls it to start an operation and to restart one whose process died.
#[async_trait]
pub trait OperationRunner: Send + Sync + 'static {
    /// Pushes the result in chunks through `ctx` (skipping the first
    /// `ctx.resume_from()` chunks after a restart). The last chunk pushed
    /// before `Ok` is the final one.
    async fn run_operation(&self, ctx: OperationCtx, tool: &str, arguments: Map<String, Value>) -> Result<(), RpcError>;
}

/// An MCP server application served by the engine.
///
/// Every method may be called concurrently for different requests; a panic
/// in any of them ends only that request (JSON-RPC `-32603`) or that
/// notification, never the session or the server.
#[async_trait]
pub trait McpApp: Send + Sync + 'static {
    /// Answers `initialize`: `init.params` as the client sent them; returns
    /// the result object (`capabilities`, `serverInfo`, `instructions`…). The
    /// engine fills in `protocolVersion` when the result has none and adds
    /// its own `_meta` keys (the session resume token). An `Err` is sent to
    /// the client as the answer and leaves no session behind.
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError>;

    /// Answers one request (any method but `initialize`). `params` includes
    /// `_meta` as sent; the engine has already taken `progressToken` from it
    /// for [`RequestCtx::progress`].
    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError>;

    /// A client notification (including `notifications/initialized`; the
    /// engine handles `notifications/cancelled` itself). Notifications of
    /// one session arrive here one at a time, in the order they were posted.
    async fn on_notification(&self, _ctx: SessionCtx, _method: &str, _params: Option<Map<String, Value>>) {}

    /// A session left this process (see [`EndReason`]).
    async fn on_session_end(&self, _ended: SessionEnd) {}

    /// The process is shutting down: release what the application holds
    /// for the whole process (children, pooled connections, background
    /// tasks). Called once, after every request has drained and every held
    /// session has ended with [`EndReason::Shutdown`]; bounded by the engine.
    async fn shutdown(&self) {}

    /// What the application says of itself to sessionless (2026-07-28)
    /// clients' `server/discover`: `capabilities`, `serverInfo` and
    /// `instructions`, the same for every caller. `None` (the default): it
    /// serves sessions only, and sessionless requests are refused with the
    /// revisions it does serve.
    async fn discover(&self) -> Option<Map<String, Value>> {
        None
    }

    /// Whether this application takes a sessionless request's rounds itself
    /// (it passes them through to a server of its own): then the engine
    /// leaves `inputResponses` and `requestState` in the params and its own
    /// round-taking ([`RequestCtx::request_client`] as `input_required`)
    /// is not used. Asked for every sessionless request, after
    /// [`McpApp::discover`]. Default: no.
    fn passes_input_through(&self) -> bool {
        false
    }

    /// A refusal of every request to the endpoint for now (HTTP 503 with
    /// it), asked before each request reaches the engine: for an
    /// application that cannot serve at all while something it needs is
    /// down. Default: none.
    fn unavailable(&self) -> Option<RpcError> {
        None
    }

    /// What operators see of the application's part of one session (the
    /// admin API's `GET /admin/sessions/ID`): for example a gateway's
    /// upstream sessions and whether this process holds them. `app_state`
    /// is the session's durable app state; `local` its local state where
    /// this process holds the session. Default: nothing.
    fn describe_session(&self, _app_state: &Map<String, Value>, _local: Option<&(dyn Any + Send + Sync)>) -> Option<Value> {
        None
    }

    /// What operators see of the application as a whole (the admin API's
    /// `GET /admin/endpoints`): for example a virtual server's members and
    /// the names they contest. Default: nothing.
    fn describe(&self) -> Option<Value> {
        None
    }

    /// The application's list changes, for `subscriptions/listen` streams:
    /// each stream on the endpoint relays the methods it honours
    /// (`notifications/tools/list_changed` and the like) as they come. The
    /// stream honours a list only where [`McpApp::discover`] claims
    /// `listChanged` for it. Default: none (the lists never change).
    fn list_changes(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        None
    }

    /// Carries on a request whose process died while it ran (a crash, or a
    /// replica whose lease lapsed), for which the application left a note
    /// with [`RequestCtx::leave_recovery_note`]: `ctx` is the request's
    /// context again (same ID, same stream, its progress token), and the
    /// returned outcome is its one final response. The default, and any
    /// error, ends it like a request without a note: `-32603`
    /// "interrupted". Called at most once per cut-off request (replicas
    /// race for it in the store).
    async fn recover_request(&self, _ctx: RequestCtx, _cut_off: CutOff) -> Result<RawResult, RpcError> {
        Err(RpcError::internal(crate::engine::INTERRUPTED_MESSAGE))
    }

    /// Whether a request a crash cut off without a note
    /// ([`RequestCtx::leave_recovery_note`]) is still handed to
    /// [`McpApp::recover_request`] (with a `null` note): for an application
    /// that finds such requests again by themselves (a gateway whose stdio
    /// children a keeper kept, which knows the requests they were sent by
    /// their stream). Default: no (they end "interrupted").
    fn recovers_unnoted(&self) -> bool {
        false
    }

    /// Where the tools, prompts and resources this application serves come
    /// from when they are another endpoint's under names of its own (a
    /// virtual server's members), as this request sees them: a policy
    /// decides on the name the client sees and on the member's own, so a
    /// rule written for `/mcp/MEMBER` holds through every endpoint that
    /// serves the member. May read what it needs first (a virtual server
    /// its members' lists). Default: none (every name is its own).
    async fn origins(&self, _ctx: &RequestCtx) -> Option<Arc<dyn Origins>> {
        None
    }
}

/// An application that refuses every request with one error: what answers
/// at an endpoint that serves nothing (a server that mounted only named
/// endpoints, a session whose endpoint is no longer configured).
pub(crate) struct Refuses(pub(crate) RpcError);

#[async_trait]
impl McpApp for Refuses {
    async fn initialize(&self, _init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        Err(self.0.clone())
    }

    async fn handle_request(
        &self,
        _ctx: RequestCtx,
        _method: &str,
        _params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        Err(self.0.clone())
    }
}

/// The endpoint that serves a tool, prompt or resource as its own, and its
/// name (a resource's URI) there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The endpoint's name (`/mcp/NAME`).
    pub endpoint: String,
    /// The name (or URI) that endpoint knows it by.
    pub name: String,
}

/// The origins of one application's names (see [`McpApp::origins`]).
pub trait Origins: Send + Sync {
    /// Where `target` comes from; `None` for a name the application does
    /// not know (a use of it is refused by the application itself).
    fn origin(&self, target: crate::policy::Target<'_>) -> Option<Origin>;
}

/// What a cut-off request left behind, for [`McpApp::recover_request`].
#[derive(Debug, Clone)]
pub struct CutOff {
    /// The request's method.
    pub method: String,
    /// The note the application left ([`RequestCtx::leave_recovery_note`]).
    pub note: Value,
    /// The messages already stored on the request's stream before the
    /// crash (notifications, server-to-client requests), in order: what the
    /// client has or can replay. An application that gets them again from
    /// elsewhere sends only what is not among them.
    pub sent: Vec<Value>,
}

/// Shorthand for a raw result from anything serializable.
pub fn raw_result<T: serde::Serialize + ?Sized>(value: &T) -> Result<RawResult, RpcError> {
    serde_json::value::to_raw_value(value).map_err(|e| RpcError::internal(format!("result could not be serialized: {e}")))
}
