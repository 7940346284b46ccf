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

pub mod repo;
pub mod thought;
pub mod tools;

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, Tool};
use serde_json::{Map, Value};
use tether_server::{McpApp, RpcError, ToolCtx};

pub use repo::{NotebookRepo, NotebookSession, memory::MemoryNotebook, sqlite::SqliteNotebook};

/// Key of the current notebook session in the MCP session's app state.
const CURRENT_SESSION: &str = "notebookSessionId";

pub struct Notebook {
    repo: Arc<dyn NotebookRepo>,
}

impl Notebook {
    pub fn new(repo: Arc<dyn NotebookRepo>) -> Self {
        Self { repo }
    }

    /// The notebook session the MCP session works in, created on first use.
    async fn current_session(&self, ctx: &ToolCtx) -> Result<NotebookSession, RpcError> {
        let session_ctx = ctx.session();
        let principal = session_ctx.principal().to_owned();
        let state = session_ctx.app_state().await;
        if let Some(id) = state.get(CURRENT_SESSION).and_then(Value::as_str) {
            if let Some(found) = self.repo.get_session(&principal, id).await.map_err(repo_error)? {
                return Ok(found);
            }
        }
        let created = NotebookSession::new(&principal, None, Vec::new(), None);
        self.repo.create_session(&created).await.map_err(repo_error)?;
        let id = created.id.clone();
        session_ctx.update_app_state(|app| {
            app.insert(CURRENT_SESSION.into(), Value::String(id.clone()));
        })
        .await?;
        tracing::info!(notebook_session = %created.id, "started a notebook session");
        Ok(created)
    }

    async fn thought(&self, ctx: &ToolCtx, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        let input = match thought::ThoughtInput::parse(&arguments) {
            Ok(input) => input,
            Err(message) => return Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
        };
        let session = self.current_session(ctx).await?;
        let recorded = self.repo.append_thought(&session.principal, &session.id, &input).await.map_err(repo_error)?;
        Ok(CallToolResult::structured(thought::output(&input, &recorded)))
    }
}

fn repo_error(e: repo::RepoError) -> RpcError {
    RpcError::internal(format!("notebook storage failed: {e}"))
}

#[async_trait]
impl McpApp for Notebook {
    fn server_info(&self) -> Implementation {
        Implementation::new("tether-notebook", env!("CARGO_PKG_VERSION"))
    }

    fn instructions(&self) -> Option<String> {
        Some(
            "A durable reasoning notebook. Record each step with `thought`; your thoughts survive \
             reconnects and server restarts."
                .into(),
        )
    }

    fn tools(&self) -> Vec<Tool> {
        tools::all()
    }

    async fn call_tool(&self, ctx: ToolCtx, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError> {
        match name {
            tools::THOUGHT => self.thought(&ctx, arguments).await,
            other => Err(RpcError::invalid_params(format!("unknown tool `{other}`; call tools/list for the tools offered"))),
        }
    }
}
