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

/// Splits `text` into pieces of at most `max` bytes, never inside a
/// character; joined back they are `text` byte for byte.
pub fn split(text: &str, max: usize) -> Vec<&str> {
    let max = max.max(4);
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (head, tail) = rest.split_at(end);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_keeps_characters_whole_and_joins_back() {
        let text = "ab€dé🙂xyz".repeat(50);
        for max in [4, 5, 7, 64, 10_000] {
            let parts = split(&text, max);
            assert!(parts.iter().all(|p| p.len() <= max && !p.is_empty()));
            assert_eq!(parts.concat(), text);
        }
        assert!(split("", 10).is_empty());
    }
}
