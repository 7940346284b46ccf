//! The tools the notebook offers, with their input and output schemas.

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

pub const THOUGHT: &str = "thought";

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

pub fn all() -> Vec<Tool> {
    vec![thought()]
}
