//! How a call of a tool that runs as an operation is answered (the one
//! place that decides it), and a finished operation's result as one
//! `CallToolResult`, cut at `--max-result-bytes` with a note that says so.
//!
//! A client that presents a resume token, or asks for pages with
//! `_meta["dev.tether/paging"]: true`, gets one chunk per answer with
//! `_meta.nextResumeToken` (`operations::call`). A sessionless client that
//! declared the Tasks extension may get a task (`tasks.rs`). Every other
//! client waits for the whole result, as long as the request may run.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use tether_store::now_ms;
use tether_wire::meta;

use super::{NewOperation, OpRecord, OpRecords, OpState, storage};
use crate::app::{OperationRunner, OperationSpec, RpcError};
use crate::engine::{Inner, RequestCtx};

/// How one call is answered.
#[derive(Debug, PartialEq)]
enum Delivery {
    /// One chunk per answer, from the start or from the token presented.
    Pages(Option<String>),
    /// A task (the Tasks extension).
    Task,
    /// The whole result, up to the cap.
    Whole,
}

/// The decision, from the request's `_meta` and what its client declared.
fn delivery(request_meta: Option<&Value>, sessionless_with_tasks: bool) -> Result<Delivery, RpcError> {
    let token = match request_meta.and_then(|m| m.get(meta::RESUME_TOKEN)) {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.clone()),
        Some(_) => return Err(RpcError::invalid_params("invalid resumeToken: it must be the string the server sent")),
    };
    let paging = request_meta.and_then(|m| m.get(meta::PAGING)) == Some(&Value::Bool(true));
    Ok(match token {
        Some(token) => Delivery::Pages(Some(token)),
        None if paging => Delivery::Pages(None),
        None if sessionless_with_tasks => Delivery::Task,
        None => Delivery::Whole,
    })
}

impl RequestCtx {
    /// Runs a `tools/call` of a tool whose calls are durable operations
    /// (`params` as the client sent them, `_meta` included) and answers it
    /// as its client can take it: in pages for a client that asked for
    /// them (or presents a resume token), as a task for a sessionless
    /// client that declared the Tasks extension (if the work outlasts
    /// `--resume-wait`), else whole once the work is done (the request
    /// waits for it, forwarding its progress).
    pub async fn call_operation(
        &self,
        runner: Arc<dyn OperationRunner>,
        mut params: Map<String, Value>,
        spec: OperationSpec,
    ) -> Result<Value, RpcError> {
        let request_meta = params.remove("_meta");
        let tool = match params.get("name") {
            Some(Value::String(n)) => n.clone(),
            _ => return Err(RpcError::invalid_params("tools/call needs params.name (the tool's name as a string)")),
        };
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(_) => return Err(RpcError::invalid_params("tools/call params.arguments must be an object")),
        };
        let session = self.session().map(|s| s.session_id().to_owned());
        let sessionless_with_tasks = session.is_none() && crate::engine::tasks::declared(self);
        let how = delivery(request_meta.as_ref(), sessionless_with_tasks)?;
        // A resume token is bound to everything but `_meta`.
        let binding = super::binding(self.principal(), "tools/call", &Value::Object(params));
        let config = &self.inner().config;
        let chunk_bytes = match how {
            Delivery::Pages(_) => config.result_chunk_bytes,
            Delivery::Task | Delivery::Whole => config.max_result_bytes,
        };
        let mut kept_meta = self.request_meta().cloned();
        if let Some(m) = kept_meta.as_mut() {
            m.remove(meta::RESUME_TOKEN);
        }
        let new = NewOperation {
            session: session.unwrap_or_default(),
            principal: self.principal().to_owned(),
            tool,
            arguments,
            binding,
            spec,
            chunk_bytes,
            request_meta: kept_meta,
        };
        match how {
            Delivery::Pages(token) => super::call(self, runner, new, token.as_deref()).await,
            Delivery::Task => crate::engine::tasks::call(self, runner, new).await,
            Delivery::Whole => whole(self, runner, new).await,
        }
    }
}

/// Stops an operation's work when the request that waits for it goes away
/// first (cancelled, or a sessionless client closed its stream): nobody
/// else can reach its result.
struct StopUnlessFinished<'a> {
    inner: &'a Inner,
    id: &'a str,
    finished: bool,
}

impl Drop for StopUnlessFinished<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.inner.operations.cancel(self.id);
        }
    }
}

/// Runs a new operation and answers with its whole result.
async fn whole(ctx: &RequestCtx, runner: Arc<dyn OperationRunner>, new: NewOperation) -> Result<Value, RpcError> {
    let inner = ctx.inner().clone();
    let (raw, _) = super::create(&inner, runner, new).await?;
    let id = hex::encode(raw);
    let mut stop = StopUnlessFinished { inner: &inner, id: &id, finished: false };
    super::wait_finished(ctx, &inner, &id).await;
    stop.finished = true;
    let record = inner
        .operations
        .records
        .load(&id)
        .await?
        .ok_or_else(|| RpcError::internal("the operation's record expired before its work ended"))?;
    match record.state {
        OpState::Done => {
            let result = assemble(&inner.operations.records, &id, &record).await?;
            inner.operations.records.finish(&id, record.chunks).await;
            Ok(result)
        }
        OpState::Failed => {
            inner.operations.records.finish(&id, record.chunks).await;
            Err(RpcError::from_object(record.error.as_ref().unwrap_or(&Value::Null)))
        }
        OpState::Cancelled => Err(RpcError::cancelled()),
        OpState::Interrupted | OpState::Running => Err(RpcError::internal(super::INTERRUPTED_MESSAGE)),
    }
}

/// The whole result of a finished operation: its chunks as one
/// `CallToolResult` (contents in order; the last structured content; an
/// error if any chunk was one), cut at `--max-result-bytes`.
pub(in crate::engine) async fn assemble(records: &OpRecords, id: &str, record: &OpRecord) -> Result<Value, RpcError> {
    let mut joined = Joined::new(records.max_result_bytes);
    for index in 0..record.chunks {
        let key = super::chunk_key(id, index);
        let stored = records
            .store
            .kv_get(super::CHUNK_NAMESPACE, &key, now_ms())
            .await
            .map_err(storage)?
            .ok_or_else(|| RpcError::internal("the operation's result was dropped (it expired)"))?;
        let chunk: Value = serde_json::from_slice(&stored.value).map_err(|e| RpcError::internal(e.to_string()))?;
        joined.add(chunk);
    }
    Ok(joined.finish(&record.tool, records.result_chunk_bytes))
}

/// Chunks joined into one result, up to a cap; what is past it is counted.
struct Joined {
    cap: usize,
    used: usize,
    content: Vec<Value>,
    structured: Option<Value>,
    is_error: bool,
    /// The cap was reached: every later block is left out.
    cut: bool,
    left_out_bytes: usize,
}

/// What a content block weighs: its text, or its JSON for other kinds.
fn weight(block: &Value) -> usize {
    match block.get("text").and_then(Value::as_str) {
        Some(text) => text.len(),
        None => serde_json::to_vec(block).map_or(0, |v| v.len()),
    }
}

/// A text block's first `room` bytes (never inside a character), if any.
fn head(block: &Value, room: usize) -> Option<(Value, usize)> {
    let text = block.get("text").and_then(Value::as_str)?;
    let mut end = room.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut cut = block.clone();
    cut["text"] = Value::String(text[..end].to_owned());
    Some((cut, end))
}

impl Joined {
    fn new(cap: usize) -> Self {
        Self { cap, used: 0, content: Vec::new(), structured: None, is_error: false, cut: false, left_out_bytes: 0 }
    }

    fn add(&mut self, mut chunk: Value) {
        self.is_error |= chunk.get("isError").and_then(Value::as_bool).unwrap_or(false);
        if let Some(s) = chunk.get_mut("structuredContent").map(Value::take) {
            self.structured = Some(s);
        }
        let blocks = match chunk.get_mut("content").map(Value::take) {
            Some(Value::Array(blocks)) => blocks,
            _ => Vec::new(),
        };
        for block in blocks {
            let size = weight(&block);
            if !self.cut && self.used + size <= self.cap {
                self.used += size;
                self.content.push(block);
                continue;
            }
            let kept = if self.cut { None } else { head(&block, self.cap - self.used) };
            self.cut = true;
            match kept {
                Some((kept, bytes)) => {
                    self.used += bytes;
                    self.left_out_bytes += size - bytes;
                    self.content.push(kept);
                }
                None => self.left_out_bytes += size,
            }
        }
    }

    fn finish(mut self, tool: &str, page_bytes: usize) -> Value {
        let mut structured_left_out = false;
        if let Some(s) = self.structured.take() {
            let size = serde_json::to_vec(&s).map_or(0, |v| v.len());
            if !self.cut && self.used + size <= self.cap {
                self.structured = Some(s);
            } else {
                structured_left_out = true;
                self.left_out_bytes += size;
            }
        }
        if self.left_out_bytes > 0 || structured_left_out {
            let what = if structured_left_out { ", the structured content among them" } else { "" };
            self.content.push(json!({"type": "text", "text": format!(
                "[tether: this result is incomplete. It was cut at the server's limit of {} bytes \
                 (--max-result-bytes); {} bytes were left out{what}. To get all of it, call `{tool}` \
                 again with the same arguments and `_meta` {{\"{}\": true}}: the result then comes in \
                 pages of at most {} bytes, each but the last with `_meta.{}`; repeat the call with \
                 `_meta.{}` set to that token until a result comes without one.]",
                self.cap, self.left_out_bytes, meta::PAGING, page_bytes, meta::NEXT_RESUME_TOKEN, meta::RESUME_TOKEN
            )}));
        }
        let mut result = json!({"content": self.content});
        if let Some(s) = self.structured {
            result["structuredContent"] = s;
        }
        if self.is_error {
            result["isError"] = json!(true);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &str) -> Value {
        json!({"type": "text", "text": t})
    }

    #[test]
    fn the_decision_follows_the_token_then_the_paging_flag_then_tasks() {
        let m = |v: Value| Some(v);
        assert_eq!(delivery(None, false).unwrap(), Delivery::Whole);
        assert_eq!(delivery(None, true).unwrap(), Delivery::Task);
        assert_eq!(delivery(m(json!({(meta::PAGING): true})).as_ref(), true).unwrap(), Delivery::Pages(None));
        assert_eq!(delivery(m(json!({(meta::PAGING): "yes"})).as_ref(), false).unwrap(), Delivery::Whole);
        let token = m(json!({(meta::RESUME_TOKEN): "t"}));
        assert_eq!(delivery(token.as_ref(), true).unwrap(), Delivery::Pages(Some("t".into())));
        assert_eq!(delivery(m(json!({(meta::RESUME_TOKEN): 4})).as_ref(), false).unwrap_err().code, -32602);
    }

    #[test]
    fn chunks_under_the_cap_join_whole_in_order() {
        let mut j = Joined::new(100);
        j.add(json!({"content": [text("ab")]}));
        j.add(json!({"content": [text("cd")], "structuredContent": {"n": 1}}));
        let r = j.finish("t", 10);
        assert_eq!(r, json!({"content": [text("ab"), text("cd")], "structuredContent": {"n": 1}}));
    }

    #[test]
    fn past_the_cap_the_result_ends_with_a_note_of_what_was_left_out() {
        let mut j = Joined::new(5);
        j.add(json!({"content": [text("abc"), text("dé")]}));
        j.add(json!({"content": [text("xyz")], "isError": true}));
        let r = j.finish("session", 64);
        let content = r["content"].as_array().unwrap();
        assert_eq!(content[0], text("abc"));
        assert_eq!(content[1], text("d"), "cut inside the text, never inside a character");
        let note = content[2]["text"].as_str().unwrap();
        assert!(note.contains("5 bytes") && note.contains("5 bytes were left out"), "{note}");
        assert!(note.contains("`session`"), "{note}");
        assert!(note.contains(meta::PAGING) && note.contains("nextResumeToken"), "{note}");
        assert_eq!(r["isError"], true);
        let mut j = Joined::new(4);
        j.add(json!({"content": [text("ab")], "structuredContent": {"k": "long"}}));
        let r = j.finish("t", 4);
        assert!(r.get("structuredContent").is_none());
        assert!(r["content"][1]["text"].as_str().unwrap().contains("the structured content"), "{r}");
    }
}
