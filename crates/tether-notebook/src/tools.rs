//! The tools the notebook offers, with their input and output schemas.

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

pub const THOUGHT: &str = "thought";
pub const INIT: &str = "init";
pub const SESSION: &str = "session";

fn object(v: Value) -> Arc<Map<String, Value>> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

pub fn thought() -> Tool {
    let input = object(json!({
        "type": "object",
        "properties": {
            "thought": {"type": "string", "description": "Your current thinking step"},
            "thoughtNumber": {"type": "integer", "minimum": 1, "description": "Number of this thought"},
            "totalThoughts": {"type": "integer", "minimum": 1, "description": "Estimated total thoughts needed"},
            "nextThoughtNeeded": {"type": "boolean", "description": "Whether another thought step is needed"},
            "isRevision": {"type": "boolean", "description": "Whether this revises previous thinking"},
            "revisesThought": {"type": "integer", "minimum": 1, "description": "Which thought is being reconsidered"},
            "branchFromThought": {"type": "integer", "minimum": 1, "description": "Branching point thought number"},
            "branchId": {"type": "string", "description": "Branch identifier (needs branchFromThought)"},
            "needsMoreThoughts": {"type": "boolean", "description": "If more thoughts are needed"}
        },
        "required": ["thought", "thoughtNumber", "totalThoughts", "nextThoughtNeeded"]
    }));
    let output = object(json!({
        "type": "object",
        "properties": {
            "thoughtNumber": {"type": "integer"},
            "totalThoughts": {"type": "integer"},
            "nextThoughtNeeded": {"type": "boolean"},
            "branches": {"type": "array", "items": {"type": "string"}},
            "thoughtHistoryLength": {"type": "integer"}
        },
        "required": ["thoughtNumber", "totalThoughts", "nextThoughtNeeded", "branches", "thoughtHistoryLength"]
    }));
    Tool::new(
        THOUGHT,
        "Record one step of sequential thinking in the durable notebook. Thoughts may revise earlier \
         ones (isRevision + revisesThought) or branch (branchFromThought + branchId). They survive \
         reconnects and server restarts.",
        input,
    )
    .with_raw_output_schema(output)
    .with_annotations(ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(false))
}

pub fn init() -> Tool {
    let input = object(json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["list_roots", "bind_root", "start_new", "load_context", "list_sessions", "get_state"]},
            "rootUri": {"type": "string", "description": "bind_root: one of the client's roots; list_sessions: filter"},
            "title": {"type": "string", "description": "start_new: session title"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "start_new: tags"},
            "sessionId": {"type": "string", "description": "load_context: a specific session (else the latest of the bound root)"},
            "root": {"type": "string", "description": "load_context, start_new: your project's directory as a URI (file:///…), for a client without a session that does not report roots"},
            "tag": {"type": "string", "description": "list_sessions: only sessions with this tag"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 200}
        },
        "required": ["operation"]
    }));
    Tool::new(
        INIT,
        "Find or start your reasoning session. load_context without sessionId recovers the most recent \
         session of this project (MCP root) after a context reset; start_new begins a fresh one; \
         list_roots / bind_root choose the project when the client has several roots.",
        input,
    )
    .with_annotations(ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(false))
}

pub fn session() -> Tool {
    let input = object(json!({
        "type": "object",
        "properties": {
            "operation": {"type": "string", "enum": ["list", "get", "search", "export"]},
            "sessionId": {"type": "string", "description": "get/export: which session (default: the current one)"},
            "query": {"type": "string", "description": "search: text to find in thoughts"},
            "format": {"type": "string", "enum": ["markdown", "json"], "description": "export format (default markdown)"},
            "rootUri": {"type": "string"},
            "tag": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 200}
        },
        "required": ["operation"]
    }));
    Tool::new(
        SESSION,
        "Read your notebook: list sessions, get one with its thoughts, search thoughts, export as Markdown or JSON.",
        input,
    )
    .with_annotations(ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false))
}

pub fn all() -> Vec<Tool> {
    vec![thought(), init(), session()]
}
