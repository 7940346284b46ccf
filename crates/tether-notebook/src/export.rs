//! Rendering a notebook session as Markdown or JSON.

use serde_json::json;

use crate::ops::iso;
use crate::repo::{NotebookSession, StoredThought};

pub fn render(session: &NotebookSession, thoughts: &[StoredThought], format: &str) -> String {
    if format == "json" {
        return json!({"session": session, "thoughts": thoughts}).to_string();
    }
    let mut out = format!("# {}\n\n", session.title);
    out.push_str(&format!("- session: {}\n", session.id));
    if let Some(root) = &session.mcp_root_uri {
        out.push_str(&format!("- root: {root}\n"));
    }
    if !session.tags.is_empty() {
        out.push_str(&format!("- tags: {}\n", session.tags.join(", ")));
    }
    out.push_str(&format!("- thoughts: {}, updated {}\n", session.thought_count, iso(session.updated_at_ms)));
    for t in thoughts {
        let i = &t.input;
        let mut heading = format!("\n## Thought {}/{}", i.thought_number, i.total_thoughts);
        if let Some(r) = i.revises_thought.filter(|_| i.is_revision == Some(true)) {
            heading.push_str(&format!(" (revises {r})"));
        }
        if let Some((b, from)) = i.branch() {
            heading.push_str(&format!(" (branch {b} from {from})"));
        }
        out.push_str(&heading);
        out.push_str("\n\n");
        out.push_str(&i.thought);
        out.push('\n');
    }
    out
}
