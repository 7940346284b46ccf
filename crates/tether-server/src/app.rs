//! The seam between the engine and an MCP application such as the notebook.
//!
//! An application lists its tools and answers calls. It never sees HTTP,
//! streams or event IDs: it talks to its client through [`ToolCtx`] (progress,
//! notifications, server-to-client requests such as `roots/list`) and keeps
//! per-session context through [`SessionCtx::app_state`], which the engine
//! stores durably with the session.

use async_trait::async_trait;
use rmcp::model::{CallToolResult, Implementation, Tool};
use serde_json::{Map, Value};

pub use crate::engine::{OperationCtx, SessionCtx, ToolCtx};
use crate::protocol::{INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND};

/// A JSON-RPC error an application can answer a request with.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, format!("method not found: {method}"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }
}

/// How a resumable tool runs (see [`McpApp::operation_spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationSpec {
    /// After a crash the operation continues from its stored cursor (the
    /// chunks already stored); otherwise its token reports an interruption.
    pub restartable: bool,
    /// Advertised to clients in the tool's `_meta`.
    pub expected_duration_ms: u64,
}

/// An MCP server application served by the engine.
#[async_trait]
pub trait McpApp: Send + Sync + 'static {
    fn server_info(&self) -> Implementation;

    fn instructions(&self) -> Option<String> {
        None
    }

    /// The tools offered (the same for every session).
    fn tools(&self) -> Vec<Tool>;

    /// Runs one `tools/call`. Unknown tools and malformed arguments that the
    /// protocol must reject are `Err`; failures the caller should read are
    /// `Ok` with `is_error: true`.
    async fn call_tool(&self, ctx: ToolCtx, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError>;

    /// `Some` for tools whose calls run as durable, resumable operations
    /// (`_meta.nextResumeToken` / `_meta.resumeToken`); those are run by
    /// [`McpApp::run_operation`] instead of [`McpApp::call_tool`].
    fn operation_spec(&self, _tool: &str) -> Option<OperationSpec> {
        None
    }

    /// Runs a resumable tool: pushes its result in chunks through `ctx`
    /// (skipping the first `ctx.resume_from()` chunks after a restart). The
    /// last chunk pushed before `Ok` is the final one.
    async fn run_operation(&self, _ctx: OperationCtx, tool: &str, _arguments: Map<String, Value>) -> Result<(), RpcError> {
        Err(RpcError::invalid_params(format!("unknown tool `{tool}`")))
    }

    /// After `notifications/initialized`.
    async fn on_initialized(&self, _ctx: SessionCtx) {}

    /// Any other client notification (e.g. `notifications/roots/list_changed`).
    async fn on_notification(&self, _ctx: SessionCtx, _method: &str, _params: Option<Map<String, Value>>) {}
}
