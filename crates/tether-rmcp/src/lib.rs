#![warn(missing_docs)]
//! Serve an rmcp [`ServerHandler`] on tether's engine, in-process: the
//! handler you wrote with rmcp (`#[tool_router]`, `#[tool]`, prompts,
//! resources) keeps its code, and its sessions live in a store instead of in
//! memory.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use rmcp::ServerHandler;
//! use rmcp::model::{ServerCapabilities, ServerConfig};
//!
//! #[derive(Clone)]
//! struct Hello;
//!
//! impl ServerHandler for Hello {
//!     fn get_info(&self) -> ServerConfig {
//!         ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let server = tether_rmcp::Server::builder()
//!     .store("sqlite:./sessions.db")
//!     .mount(Arc::new(tether_rmcp::RmcpApp::new(|| Hello)))
//!     .build()
//!     .await?;
//! server.serve("127.0.0.1:8080".parse()?, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```
//!
//! What the handler gets from the engine:
//!
//! - Every message it sends (results, progress, logging, its requests to the
//!   client) is stored before it is sent: a client that lost its stream
//!   replays what it missed with `Last-Event-ID`.
//! - After `kill -9` and a restart on the same store (or on another replica
//!   of a Redis store), the session answers without a new `initialize`: the
//!   handler is built anew with the factory and started with the client's
//!   stored `initialize` (it is not asked to initialize again). What a
//!   handler keeps in its own memory does not survive; what must, belongs in
//!   a store of its own.
//! - A call the crash cut off ends once, for its client, with the engine's
//!   `-32603` "interrupted" error, after the progress stored before the
//!   crash. A tool that is safe to run twice may opt in to running again
//!   instead: [`RmcpApp::rerun_after_restart`].
//! - 2025-11-25 sessions and 2026-07-28 sessionless requests reach the same
//!   handler code (each sessionless one with a handler of its own, as
//!   rmcp's stateless mode); `server/discover` answers with `get_info`.
//! - A handler that panics ends that request with an internal error; the
//!   session goes on. One that never answers is ended by
//!   [`RmcpApp::request_timeout`], and its work on the request is dropped.
//!
//! One handler is made per session (as rmcp's own HTTP server does), with
//! the factory given to [`RmcpApp::new`].

mod guarded;
mod served;

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;
use rmcp::ServerHandler;
use rmcp::model::InitializeRequestParams;
use serde_json::{Map, Value, json};
use tether_server::{CutOff, Initialize, McpApp, RawResult, RequestCtx, RpcError, SessionCtx, SessionEnd};
use tokio::sync::OnceCell;

use served::Served;

/// The embedding API, re-exported so that an rmcp server needs this crate
/// only: [`Server::builder`] opens the store, mounts the app and serves.
pub use tether_server::{Server, ServerBuilder, ServerError};

/// [`RmcpApp::request_timeout`]'s default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a session's part of the app state is kept.
const STATE_KEY: &str = "rmcp";

/// The layout of [`Stored`] this build writes and reads.
const STATE_VERSION: u32 = 1;

/// What a session keeps in the store for its handler: the client's
/// `initialize`, from which the handler is started again after a restart.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    version: u32,
    initialize: Map<String, Value>,
}

/// A session's handler while this process holds the session.
#[derive(Default)]
struct Local {
    served: OnceCell<Served>,
}

/// An rmcp handler as a tether application ([`McpApp`]): mount it with
/// [`tether_server::Server`] (or [`tether_server::Endpoints`]).
pub struct RmcpApp<H> {
    factory: Box<dyn Fn() -> H + Send + Sync>,
    rerun: HashSet<String>,
    timeout: Duration,
    /// `server/discover`'s answer: the handler's `get_info`.
    described: Map<String, Value>,
}

impl<H: ServerHandler> RmcpApp<H> {
    /// Serves the handlers `factory` makes: one per session, and one per
    /// sessionless request.
    pub fn new(factory: impl Fn() -> H + Send + Sync + 'static) -> Self {
        let info = factory().get_info();
        let mut described = match serde_json::to_value(&info) {
            Ok(Value::Object(object)) => object,
            _ => Map::new(),
        };
        described.retain(|key, _| matches!(key.as_str(), "capabilities" | "serverInfo" | "instructions"));
        Self { factory: Box::new(factory), rerun: HashSet::new(), timeout: DEFAULT_TIMEOUT, described }
    }

    /// How long the handler may take to answer one request (default 10
    /// minutes): then the request ends with an internal error for its
    /// client, and the handler's work on it is cancelled and dropped.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Tools that are safe to run twice (idempotent): a call of one that a
    /// crash cut off is run again, from the start, by the process that
    /// carries the session on, and its client gets that run's result on the
    /// same stream (after what the first run had sent). Other tools' cut
    /// calls end with the engine's "interrupted" error. For calls of a
    /// session answered on an SSE stream (a JSON answer or a sessionless
    /// request has nothing stored to carry on). Costs one store write per
    /// such call.
    pub fn rerun_after_restart<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        self.rerun.extend(tools.into_iter().map(Into::into));
        self
    }

    /// The session's handler, started again from its stored `initialize`
    /// when this process does not hold it yet (after a restart, on another
    /// replica, after eviction).
    async fn served<'s>(&self, session: &SessionCtx, local: &'s Local) -> Result<&'s Served, RpcError> {
        let served = local
            .served
            .get_or_try_init(|| async {
                let peer = stored_initialize(&session.app_state().await)?;
                Ok::<_, RpcError>(Served::start((self.factory)(), Some(peer)))
            })
            .await?;
        served.attach(session.clone());
        Ok(served)
    }

    fn reruns(&self, method: &str, params: Option<&Map<String, Value>>) -> bool {
        method == "tools/call"
            && params.and_then(|p| p.get("name")).and_then(Value::as_str).is_some_and(|name| self.rerun.contains(name))
    }
}

/// The client's `initialize` as the session stored it.
fn stored_initialize(app_state: &Map<String, Value>) -> Result<InitializeRequestParams, RpcError> {
    let stored = app_state
        .get(STATE_KEY)
        .ok_or_else(|| RpcError::internal("this session holds no rmcp handler state: it was not made by tether-rmcp"))?;
    let stored: Stored = serde_json::from_value(stored.clone())
        .map_err(|e| RpcError::internal(format!("this session's stored rmcp state is unreadable: {e}")))?;
    if stored.version != STATE_VERSION {
        return Err(RpcError::internal(format!(
            "this session was stored by a tether-rmcp with layout version {}; this build reads version {STATE_VERSION}: \
             serve it with that build, or start a new session",
            stored.version
        )));
    }
    serde_json::from_value(Value::Object(stored.initialize))
        .map_err(|e| RpcError::internal(format!("this session's stored initialize is unreadable: {e}")))
}

#[async_trait]
impl<H: ServerHandler> McpApp for RmcpApp<H> {
    async fn initialize(&self, init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        let served = Served::start((self.factory)(), None);
        let result = served.call(None, "initialize", Some(init.params.clone()), self.timeout).await?;
        let result: Map<String, Value> = serde_json::from_str(result.get())
            .map_err(|e| RpcError::internal(format!("the handler's initialize result is not an object: {e}")))?;
        let stored = Stored { version: STATE_VERSION, initialize: init.params.clone() };
        let stored = serde_json::to_value(&stored).map_err(|e| RpcError::internal(e.to_string()))?;
        init.set_app_state(STATE_KEY, stored);
        let local = init.local::<Local>();
        if local.served.set(served).is_err() {
            return Err(RpcError::internal("the session's handler was started twice"));
        }
        Ok(result)
    }

    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        let Some(session) = ctx.session() else {
            // A sessionless request gets a handler of its own, as in rmcp's
            // stateless mode: nothing a handler keeps crosses requests (or principals).
            let served = Served::start((self.factory)(), None);
            return served.call(Some(ctx), method, params, self.timeout).await;
        };
        let local = session.local::<Local>();
        let served = self.served(&session, &local).await?;
        if self.reruns(method, params.as_ref()) {
            ctx.leave_recovery_note(json!({"params": params})).await?;
        }
        served.call(Some(ctx), method, params, self.timeout).await
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        let local = ctx.local::<Local>();
        match self.served(&ctx, &local).await {
            Ok(served) => served.notify(method, params).await,
            Err(e) => tracing::warn!(method, error = %e.message, "a notification could not reach the session's handler"),
        }
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        if let Some(served) = ended.local::<Local>().as_ref().and_then(|local| local.served.get()) {
            served.detach();
        }
    }

    async fn discover(&self) -> Option<Map<String, Value>> {
        Some(self.described.clone())
    }

    async fn recover_request(&self, ctx: RequestCtx, cut_off: CutOff) -> Result<RawResult, RpcError> {
        let session = ctx.require_session()?;
        let params = match cut_off.note.get("params") {
            Some(Value::Object(params)) => Some(params.clone()),
            _ => None,
        };
        let local = session.local::<Local>();
        let served = self.served(&session, &local).await?;
        tracing::info!(method = cut_off.method, "running a cut-off call again (rerun_after_restart)");
        served.call(Some(ctx), &cut_off.method, params, self.timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(stored: Value) -> Map<String, Value> {
        Map::from_iter([(STATE_KEY.to_owned(), stored)])
    }

    #[test]
    fn the_stored_initialize_is_read_back_and_a_newer_layout_is_refused_clearly() {
        let initialize =
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}});
        let read = stored_initialize(&state(json!({"version": 1, "initialize": initialize}))).expect("version 1 reads");
        assert_eq!(read.client_info.name, "c");

        let newer = stored_initialize(&state(json!({"version": 2, "initialize": initialize}))).unwrap_err();
        assert!(newer.message.contains("layout version 2") && newer.message.contains("reads version 1"), "{}", newer.message);
        let foreign = stored_initialize(&Map::new()).unwrap_err();
        assert!(foreign.message.contains("not made by tether-rmcp"), "{}", foreign.message);
        let broken = stored_initialize(&state(json!({"version": 1}))).unwrap_err();
        assert!(broken.message.contains("unreadable"), "{}", broken.message);
    }
}
