//! The reasoning notebook: the MCP application `tether serve` offers.
//!
//! Its `thought` tool accepts the sequential-thinking input and stores every
//! thought durably in a notebook session. The MCP session remembers which
//! notebook session is current (in its durable application state), so the
//! thoughts survive reconnects and restarts.
//!
//! - [`repo`]: the notebook repository trait and its backends.
//! - [`thought`]: validation and the sequential-thinking semantics.
//! - [`tools`]: tool definitions (schemas) offered to clients.
//! - [`roots`]: the client's MCP roots and the bound root.
//! - `ops`: the `init` and `session` tools.
//! - `sessionless`: `init` for a client without a session (2026-07-28).

mod export;
mod ops;
pub mod repo;
pub mod roots;
mod sessionless;
pub mod thought;
pub mod tools;

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, Tool};
use serde_json::{Map, Value};
use tether_server::tether_wire::meta;
use tether_server::{OperationCtx, OperationSpec, RequestCtx, RpcError, SessionCtx, ToolApp};

pub use repo::{
    NotebookRepo, NotebookSession, SessionFilter, memory::MemoryNotebook, redis::RedisNotebook, sqlite::SqliteNotebook,
};

/// Key of the current notebook session in the MCP session's app state.
pub(crate) const CURRENT_SESSION: &str = "notebookSessionId";

pub struct Notebook {
    pub(crate) repo: Arc<dyn NotebookRepo>,
    /// Serializes creating a current session in this process, so a burst of
    /// first calls does not start one notebook session each.
    creating: tokio::sync::Mutex<()>,
}

impl Notebook {
    pub fn new(repo: Arc<dyn NotebookRepo>) -> Self {
        Self { repo, creating: tokio::sync::Mutex::new(()) }
    }

    /// The notebook session the MCP session works in, created on first use.
    async fn current_session(&self, ctx: &RequestCtx) -> Result<NotebookSession, RpcError> {
        let session_ctx = ctx.require_session()?;
        let principal = session_ctx.principal().to_owned();
        if let Some(found) = self.stored_current(&session_ctx, &principal).await? {
            return Ok(found);
        }
        let _creating = self.creating.lock().await;
        if let Some(found) = self.stored_current(&session_ctx, &principal).await? {
            return Ok(found);
        }
        let bound = roots::ensure(ctx).await?.bound;
        let created = NotebookSession::new(&principal, None, Vec::new(), bound);
        self.repo.create_session(&created).await.map_err(repo_error)?;
        let id = created.id.clone();
        // Compare-and-set: if another replica set one first, theirs wins.
        let state = session_ctx
            .update_app_state(|app| {
                let stale = app.get(CURRENT_SESSION).and_then(Value::as_str).is_some_and(|current| current != id);
                if !stale {
                    app.insert(CURRENT_SESSION.into(), Value::String(id.clone()));
                }
            })
            .await?;
        let winner = state.get(CURRENT_SESSION).and_then(Value::as_str).unwrap_or(&id).to_owned();
        if winner != id
            && let Some(found) = self.repo.get_session(&principal, &winner).await.map_err(repo_error)?
        {
            return Ok(found);
        }
        tracing::info!(notebook_session = %created.id, "started a notebook session");
        Ok(created)
    }

    async fn stored_current(
        &self,
        ctx: &tether_server::SessionCtx,
        principal: &str,
    ) -> Result<Option<NotebookSession>, RpcError> {
        let state = ctx.app_state().await;
        match state.get(CURRENT_SESSION).and_then(Value::as_str) {
            Some(id) => self.repo.get_session(principal, id).await.map_err(repo_error),
            None => Ok(None),
        }
    }

    async fn thought(&self, ctx: &RequestCtx, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        let input = match thought::ThoughtInput::parse(&arguments) {
            Ok(input) => input,
            Err(message) => return Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
        };
        let principal = ctx.principal().to_owned();
        if let Some(request_meta) = ctx.request_meta() {
            return self.sessionless_thought(ctx, &principal, request_meta, &input).await;
        }
        // Fast path: append to the session the MCP session names (the append
        // checks it exists and belongs to the principal); else find or start one.
        let named = ctx.require_session()?.app_state().await.get(CURRENT_SESSION).and_then(Value::as_str).map(str::to_owned);
        if let Some(id) = named {
            match self.repo.append_thought(&principal, &id, &input).await {
                Ok(recorded) => return Ok(CallToolResult::structured(thought::output(&input, &recorded))),
                Err(repo::RepoError::NotFound(_)) => {}
                Err(e) => return Err(repo_error(e)),
            }
        }
        let session = self.current_session(ctx).await?;
        let recorded = self.repo.append_thought(&session.principal, &session.id, &input).await.map_err(repo_error)?;
        Ok(CallToolResult::structured(thought::output(&input, &recorded)))
    }

    /// A thought of a sessionless (2026-07-28) client, which has no MCP
    /// session to remember its notebook session in: it names one in
    /// `_meta["dev.tether/notebookSession"]`; else a client that declared
    /// roots is asked for them (one MRTR round) and goes on in its one root's
    /// latest session; else it gets a new one. The result names the session
    /// in its `_meta` under the same key for the next calls.
    async fn sessionless_thought(
        &self,
        ctx: &RequestCtx,
        principal: &str,
        request_meta: &Map<String, Value>,
        input: &thought::ThoughtInput,
    ) -> Result<CallToolResult, RpcError> {
        let id = match request_meta.get(meta::NOTEBOOK_SESSION) {
            Some(Value::String(id)) => id.clone(),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{}\"] must be the notebook session ID a result named",
                    meta::NOTEBOOK_SESSION
                )));
            }
            // A client with one root goes on in that root's latest session
            // (found again by project root, as sessions find theirs).
            None => match roots::sessionless_root(ctx).await? {
                Some(root) => match self.repo.latest_for_root(principal, &root).await.map_err(repo_error)? {
                    Some(found) => found.id,
                    None => self.start_sessionless(principal, Some(root)).await?,
                },
                None => self.start_sessionless(principal, None).await?,
            },
        };
        let recorded = match self.repo.append_thought(principal, &id, input).await {
            Ok(recorded) => recorded,
            Err(repo::RepoError::NotFound(_)) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "no notebook session {id} of yours: leave _meta[\"{}\"] out to start one",
                    meta::NOTEBOOK_SESSION
                ))]));
            }
            Err(e) => return Err(repo_error(e)),
        };
        let mut result = CallToolResult::structured(thought::output(input, &recorded));
        let mut result_meta = Map::new();
        result_meta.insert(meta::NOTEBOOK_SESSION.into(), Value::String(id));
        result.meta = Some(rmcp::model::MetaObject(result_meta));
        Ok(result)
    }
}

impl Notebook {
    async fn start_sessionless(&self, principal: &str, root: Option<String>) -> Result<String, RpcError> {
        let created = NotebookSession::new(principal, None, Vec::new(), root);
        self.repo.create_session(&created).await.map_err(repo_error)?;
        tracing::info!(notebook_session = %created.id, root = ?created.mcp_root_uri, "started a notebook session for a sessionless client");
        Ok(created.id)
    }
}

pub(crate) fn repo_error(e: repo::RepoError) -> RpcError {
    RpcError::internal(format!("notebook storage failed: {e}"))
}

#[async_trait]
impl ToolApp for Notebook {
    fn server_info(&self) -> Implementation {
        Implementation::new("tether-notebook", env!("CARGO_PKG_VERSION"))
    }

    fn instructions(&self) -> Option<String> {
        Some(
            "A durable reasoning notebook. Record each step with `thought`; your thoughts survive \
             reconnects and server restarts. After a context reset, call `init` with operation \
             `load_context` (no sessionId needed): it finds the latest session of this project's root \
             (a client without a session passes `root`, the project's directory as a file:// URI)."
                .into(),
        )
    }

    fn tools(&self) -> Vec<Tool> {
        tools::all()
    }

    fn operation_spec(&self, tool: &str) -> Option<OperationSpec> {
        // Reads of the notebook are resumable (exports are paged) and can be
        // re-run from their cursor after a crash.
        (tool == tools::SESSION).then_some(OperationSpec { restartable: true, expected_duration_ms: 500 })
    }

    async fn run_operation(&self, ctx: OperationCtx, tool: &str, arguments: Map<String, Value>) -> Result<(), RpcError> {
        match tool {
            tools::SESSION => self.session_operation(ctx, arguments).await,
            other => Err(RpcError::invalid_params(format!("unknown tool `{other}`"))),
        }
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, _params: Option<Map<String, Value>>) {
        if method == "notifications/initialized" || method == "notifications/roots/list_changed" {
            roots::refresh(ctx).await;
        }
    }

    async fn call_tool(&self, ctx: RequestCtx, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        match name {
            tools::THOUGHT => self.thought(&ctx, arguments).await,
            tools::INIT => self.init(&ctx, arguments).await,
            other => Err(RpcError::invalid_params(format!("unknown tool `{other}`; call tools/list for the tools offered"))),
        }
    }
}
