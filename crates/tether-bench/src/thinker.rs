//! The handler of the `rmcp` and `tether-rmcp` systems (`rmcp_ref` and
//! `rmcp_tether`): one tool, `thought`, with the input and the
//! structuredContent of tether's notebook tool, the thoughts kept in memory
//! per session; it asks a client that declares `roots` for `roots/list` after
//! `notifications/initialized` and on every `notifications/roots/list_changed`.

use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

/// One MCP session's server (the service factory makes one per session).
#[derive(Clone, Default)]
pub struct Thinker {
    /// The thoughts recorded in this session.
    history: Arc<Mutex<Vec<String>>>,
}

fn thought_tool() -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "thought": {"type": "string"},
            "thoughtNumber": {"type": "integer", "minimum": 1},
            "totalThoughts": {"type": "integer", "minimum": 1},
            "nextThoughtNeeded": {"type": "boolean"}
        },
        "required": ["thought", "thoughtNumber", "totalThoughts", "nextThoughtNeeded"]
    });
    let output = json!({
        "type": "object",
        "properties": {
            "thoughtNumber": {"type": "integer"},
            "totalThoughts": {"type": "integer"},
            "nextThoughtNeeded": {"type": "boolean"},
            "branches": {"type": "array", "items": {"type": "string"}},
            "thoughtHistoryLength": {"type": "integer"}
        },
        "required": ["thoughtNumber", "totalThoughts", "nextThoughtNeeded", "branches", "thoughtHistoryLength"]
    });
    let object = |v: Value| Arc::new(v.as_object().cloned().unwrap_or_default());
    Tool::new("thought", "Record one step of sequential thinking (kept in memory for this session).", object(input))
        .with_raw_output_schema(object(output))
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn positive(args: &Map<String, Value>, key: &str) -> Result<u64, String> {
    match args.get(key).and_then(Value::as_u64) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{key}` must be an integer of 1 or more")),
    }
}

impl Thinker {
    fn thought(&self, args: &Map<String, Value>) -> Result<Value, String> {
        let thought = match args.get("thought") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            _ => return Err("`thought` must be a non-empty string".into()),
        };
        let number = positive(args, "thoughtNumber")?;
        let total = positive(args, "totalThoughts")?.max(number);
        let next = args.get("nextThoughtNeeded").and_then(Value::as_bool).ok_or("`nextThoughtNeeded` must be true or false")?;
        let length = {
            let mut history = self.history.lock();
            history.push(thought);
            history.len()
        };
        Ok(json!({
            "thoughtNumber": number,
            "totalThoughts": total,
            "nextThoughtNeeded": next,
            "branches": [],
            "thoughtHistoryLength": length,
        }))
    }
}

/// Asks the client for its roots on the standalone stream, in the background.
fn ask_roots(context: &NotificationContext<RoleServer>) {
    let declares_roots = context.peer.peer_info().is_some_and(|info| info.capabilities.roots.is_some());
    if declares_roots {
        let peer = context.peer.clone();
        tokio::spawn(async move {
            // Deprecated by SEP-2577 for the 2026 revision; the sessions here speak 2025-11-25.
            #[allow(deprecated)]
            let _ = peer.list_roots().await;
        });
    }
}

impl ServerHandler for Thinker {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("tether-bench-rmcp-ref", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![thought_tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != "thought" {
            return Err(McpError::invalid_params(format!("unknown tool `{}`", request.name), None));
        }
        let args = request.arguments.unwrap_or_default();
        let result = match self.thought(&args) {
            Ok(structured) => CallToolResult::structured(structured),
            Err(message) => tool_error(message),
        };
        Ok(result.into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        ask_roots(&context);
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        ask_roots(&context);
    }
}
