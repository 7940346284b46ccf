//! The provided tool router: an [`McpApp`] for applications made of tools
//! (the notebook). It answers `initialize` with the tools capability,
//! `ping`, `tools/list` and `tools/call`, and runs the tools that are durable
//! operations through the engine's operations (whole, in pages or as tasks:
//! [`RequestCtx::call_operation`]).

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolResult, Implementation, Tool};
use serde_json::{Map, Value, json};
use tether_wire::meta;

use crate::app::{Initialize, McpApp, OperationRunner, OperationSpec, RawResult, RpcError, SessionEnd, raw_result};
use crate::engine::{OperationCtx, RequestCtx, SessionCtx};

/// An MCP application made of tools.
#[async_trait]
pub trait ToolApp: Send + Sync + 'static {
    /// `serverInfo` of `initialize`'s result.
    fn server_info(&self) -> Implementation;

    /// `instructions` of `initialize`'s result; none by default.
    fn instructions(&self) -> Option<String> {
        None
    }

    /// The tools offered (the same for every session).
    fn tools(&self) -> Vec<Tool>;

    /// Runs one `tools/call`. Unknown tools and malformed arguments that the
    /// protocol must reject are `Err`; failures the caller should read are
    /// `Ok` with `is_error: true`.
    async fn call_tool(&self, ctx: RequestCtx, name: &str, arguments: Map<String, Value>) -> Result<CallToolResult, RpcError>;

    /// `Some` for tools whose calls run as durable, resumable operations;
    /// those are run by [`ToolApp::run_operation`] instead of [`ToolApp::call_tool`].
    fn operation_spec(&self, _tool: &str) -> Option<OperationSpec> {
        None
    }

    /// Runs a resumable tool (see [`OperationRunner::run_operation`]).
    async fn run_operation(&self, _ctx: OperationCtx, tool: &str, _arguments: Map<String, Value>) -> Result<(), RpcError> {
        Err(RpcError::invalid_params(format!("unknown tool `{tool}`")))
    }

    /// Any client notification (see [`McpApp::on_notification`]).
    async fn on_notification(&self, _ctx: SessionCtx, _method: &str, _params: Option<Map<String, Value>>) {}

    /// A session left this process (see [`McpApp::on_session_end`]).
    async fn on_session_end(&self, _ended: SessionEnd) {}
}

/// Serves a [`ToolApp`] as an [`McpApp`].
pub struct ToolRouter<T> {
    tools: Arc<T>,
}

impl<T: ToolApp> ToolRouter<T> {
    /// A router over `tools`.
    pub fn new(tools: T) -> Self {
        Self { tools: Arc::new(tools) }
    }

    /// The tools; resumable ones carry `dev.tether/resumable` and an
    /// expected-duration hint in their `_meta`, and, for a sessionless
    /// client, `execution.taskSupport: "optional"`: a client that declared
    /// the Tasks extension may get a task, any other its result inline.
    fn advertised_tools(&self, sessionless: bool) -> Vec<Value> {
        self.tools
            .tools()
            .into_iter()
            .map(|tool| {
                let spec = self.tools.operation_spec(&tool.name);
                let mut v = serde_json::to_value(tool).unwrap_or(Value::Null);
                if let (Some(spec), Some(obj)) = (spec, v.as_object_mut()) {
                    let tool_meta = obj.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(m) = tool_meta.as_object_mut() {
                        m.insert(meta::RESUMABLE.into(), json!(true));
                        m.insert(meta::EXPECTED_DURATION_MS.into(), json!(spec.expected_duration_ms));
                        m.insert(meta::RESTARTABLE.into(), json!(spec.restartable));
                    }
                    if sessionless {
                        obj.insert("execution".into(), json!({"taskSupport": "optional"}));
                    }
                }
                v
            })
            .collect()
    }

    async fn call(&self, ctx: RequestCtx, mut params: Map<String, Value>) -> Result<RawResult, RpcError> {
        let name = match params.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(RpcError::invalid_params("tools/call needs params.name (the tool's name as a string)")),
        };
        if let Some(spec) = self.tools.operation_spec(&name) {
            // Pages, a task or the whole result, as the client can take it.
            let runner: Arc<dyn OperationRunner> = Arc::new(Runner(self.tools.clone()));
            return raw_result(&ctx.call_operation(runner, params, spec).await?);
        }
        let arguments = match params.remove("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a,
            Some(_) => return Err(RpcError::invalid_params("tools/call params.arguments must be an object")),
        };
        let mut result = self.tools.call_tool(ctx, &name, arguments).await?;
        // Only the sessionless revision knows `resultType`; the ones served here do not.
        result.result_type = None;
        raw_result(&result)
    }
}

impl<T: ToolApp> ToolRouter<T> {
    /// Capabilities, serverInfo and instructions: the same for `initialize` and `server/discover`.
    fn describe(&self) -> Map<String, Value> {
        let mut result = Map::new();
        result.insert("capabilities".into(), json!({"tools": {"listChanged": false}}));
        result.insert("serverInfo".into(), serde_json::to_value(self.tools.server_info()).unwrap_or(Value::Null));
        if let Some(instructions) = self.tools.instructions() {
            result.insert("instructions".into(), Value::String(instructions));
        }
        result
    }
}

/// The operations of a [`ToolApp`].
struct Runner<T>(Arc<T>);

#[async_trait]
impl<T: ToolApp> OperationRunner for Runner<T> {
    async fn run_operation(&self, ctx: OperationCtx, tool: &str, arguments: Map<String, Value>) -> Result<(), RpcError> {
        self.0.run_operation(ctx, tool, arguments).await
    }
}

#[async_trait]
impl<T: ToolApp> McpApp for ToolRouter<T> {
    async fn initialize(&self, _init: &mut Initialize<'_>) -> Result<Map<String, Value>, RpcError> {
        Ok(self.describe())
    }

    async fn discover(&self) -> Option<Map<String, Value>> {
        let mut described = self.describe();
        let has_operations = self.tools.tools().iter().any(|t| self.tools.operation_spec(&t.name).is_some());
        if let (true, Some(Value::Object(capabilities))) = (has_operations, described.get_mut("capabilities")) {
            capabilities.insert("extensions".into(), json!({(meta::TASKS_EXTENSION): {}}));
        }
        Some(described)
    }

    async fn handle_request(
        &self,
        ctx: RequestCtx,
        method: &str,
        params: Option<Map<String, Value>>,
    ) -> Result<RawResult, RpcError> {
        match method {
            "ping" => raw_result(&json!({})),
            "tools/list" => raw_result(&json!({"tools": self.advertised_tools(ctx.session().is_none())})),
            "tools/call" => self.call(ctx, params.unwrap_or_default()).await,
            // The Tasks extension is the sessionless revision's.
            "tasks/get" | "tasks/update" | "tasks/cancel" if ctx.session().is_none() => {
                let runner: Arc<dyn OperationRunner> = Arc::new(Runner(self.tools.clone()));
                raw_result(&ctx.answer_tasks_method(runner, method, &params.unwrap_or_default()).await?)
            }
            other => Err(RpcError::method_not_found(other)),
        }
    }

    async fn on_notification(&self, ctx: SessionCtx, method: &str, params: Option<Map<String, Value>>) {
        self.tools.on_notification(ctx, method, params).await
    }

    async fn on_session_end(&self, ended: SessionEnd) {
        self.tools.on_session_end(ended).await
    }
}
