//! The sequential-thinking input and its semantics: `totalThoughts` is raised
//! to `thoughtNumber` when exceeded; a branch is recorded when both
//! `branchFromThought` and `branchId` are given.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// One validated `thought` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThoughtInput {
    pub thought: String,
    pub thought_number: u64,
    pub total_thoughts: u64,
    pub next_thought_needed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_revision: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revises_thought: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_from_thought: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs_more_thoughts: Option<bool>,
}

/// What the repository answers after storing a thought.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub thought_history_length: u64,
    pub branches: Vec<String>,
}

fn positive(args: &Map<String, Value>, key: &str, required: bool) -> Result<Option<u64>, String> {
    match args.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(format!("`{key}` is required (an integer of 1 or more)")),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!("`{key}` must be an integer of 1 or more, got {v}")),
        },
    }
}

fn boolean(args: &Map<String, Value>, key: &str, required: bool) -> Result<Option<bool>, String> {
    match args.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(format!("`{key}` is required (true or false)")),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(format!("`{key}` must be true or false, got {v}")),
    }
}

impl ThoughtInput {
    /// Validates the arguments; the error is a message for the caller.
    pub fn parse(args: &Map<String, Value>) -> Result<Self, String> {
        let thought = match args.get("thought") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(Value::String(_)) => return Err("`thought` must not be empty".into()),
            None | Some(Value::Null) => return Err("`thought` is required (the text of this thinking step)".into()),
            Some(v) => return Err(format!("`thought` must be a string, got {v}")),
        };
        let branch_id = match args.get("branchId") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 200 => Some(s.clone()),
            Some(v) => return Err(format!("`branchId` must be a non-empty string of at most 200 characters, got {v}")),
        };
        let input = Self {
            thought,
            thought_number: positive(args, "thoughtNumber", true)?.unwrap_or(1),
            total_thoughts: positive(args, "totalThoughts", true)?.unwrap_or(1),
            next_thought_needed: boolean(args, "nextThoughtNeeded", true)?.unwrap_or(false),
            is_revision: boolean(args, "isRevision", false)?,
            revises_thought: positive(args, "revisesThought", false)?,
            branch_from_thought: positive(args, "branchFromThought", false)?,
            branch_id,
            needs_more_thoughts: boolean(args, "needsMoreThoughts", false)?,
        };
        if input.branch_id.is_some() && input.branch_from_thought.is_none() {
            return Err("`branchId` needs `branchFromThought`: say which thought this branch starts from".into());
        }
        if input.revises_thought.is_some() && input.is_revision != Some(true) {
            return Err("`revisesThought` is only meaningful with `isRevision: true`".into());
        }
        Ok(input.normalized())
    }

    /// `totalThoughts` is raised to `thoughtNumber` when exceeded.
    fn normalized(mut self) -> Self {
        self.total_thoughts = self.total_thoughts.max(self.thought_number);
        self
    }

    /// The branch this thought records, if any.
    pub fn branch(&self) -> Option<(&str, u64)> {
        Some((self.branch_id.as_deref()?, self.branch_from_thought?))
    }
}

/// The tool's structured result.
pub fn output(input: &ThoughtInput, recorded: &Recorded) -> Value {
    json!({
        "thoughtNumber": input.thought_number,
        "totalThoughts": input.total_thoughts,
        "nextThoughtNeeded": input.next_thought_needed,
        "branches": recorded.branches,
        "thoughtHistoryLength": recorded.thought_history_length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn raises_total_to_number() {
        let input = ThoughtInput::parse(&args(
            json!({"thought": "t", "thoughtNumber": 5, "totalThoughts": 3, "nextThoughtNeeded": true}),
        ))
        .unwrap();
        assert_eq!(input.total_thoughts, 5);
    }

    #[test]
    fn branch_id_without_origin_is_refused_with_a_reason() {
        let err = ThoughtInput::parse(&args(
            json!({"thought": "t", "thoughtNumber": 2, "totalThoughts": 3, "nextThoughtNeeded": true, "branchId": "b"}),
        ))
        .unwrap_err();
        assert!(err.contains("branchFromThought"), "{err}");
    }

    #[test]
    fn wrong_types_are_named() {
        for (bad, field) in [
            (json!({"thought": 1, "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": true}), "thought"),
            (json!({"thought": "t", "thoughtNumber": 0, "totalThoughts": 1, "nextThoughtNeeded": true}), "thoughtNumber"),
            (json!({"thought": "t", "thoughtNumber": "1", "totalThoughts": 1, "nextThoughtNeeded": true}), "thoughtNumber"),
            (json!({"thought": "t", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": "yes"}), "nextThoughtNeeded"),
            (json!({"thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": true}), "thought"),
        ] {
            let err = ThoughtInput::parse(&args(bad)).unwrap_err();
            assert!(err.contains(field), "{err} should name {field}");
        }
    }
}
