//! The Tasks extension (`io.modelcontextprotocol/tasks`, 2026-07-28): a
//! resumable operation seen as a task. One record in the store serves both
//! eras: a session-era client follows it with resume tokens
//! (`engine/operations.rs`), a sessionless client with `tasks/get`,
//! `tasks/update` and `tasks/cancel` under the task ID (the operation's
//! random ID, which its partial results also name in `_meta`).
//!
//! Durable before answering: the record is committed before a
//! `CreateTaskResult` leaves, so any replica answers `tasks/get` at once. A
//! task whose process died is taken over by the `tasks/get` that finds it:
//! restartable work continues from its cursor, other work ends `failed`
//! with an "interrupted" error.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tether_store::now_ms;
use tether_wire::{RpcError, code, meta};

use super::operations::whole::assemble;
use super::operations::{self, NewOperation, OpRecord, OpRecords, OpState};
use super::{Inner, RequestCtx};
use crate::app::OperationRunner;

/// How often a client should ask `tasks/get` (the spec's `pollIntervalMs`).
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The error of a sessionless request that needs the extension undeclared.
pub(crate) fn extension_required(why: &str) -> RpcError {
    RpcError {
        code: code::MISSING_REQUIRED_CLIENT_CAPABILITY,
        message: format!(
            "{why}: declare the Tasks extension in _meta[\"{}\"].extensions[\"{}\"]",
            meta::CLIENT_CAPABILITIES,
            meta::TASKS_EXTENSION
        ),
        data: Some(json!({"requiredCapabilities": {"extensions": {(meta::TASKS_EXTENSION): {}}}})),
    }
}

/// Whether the request's caller declared the Tasks extension.
pub(crate) fn declared(ctx: &RequestCtx) -> bool {
    declares(ctx.caller().client_capabilities())
}

/// Whether client capabilities declare the Tasks extension.
pub(crate) fn declares(capabilities: &Value) -> bool {
    capabilities.get("extensions").and_then(|e| e.get(meta::TASKS_EXTENSION)).is_some()
}

fn not_found() -> RpcError {
    RpcError::invalid_params("Failed to retrieve task: no such task (it may have expired)")
}

fn iso8601(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_millis(at).to_string()
}

/// A `tools/call` of a tool that runs as an operation, from a sessionless
/// client that declared the Tasks extension (the decision is
/// `operations/whole.rs`'s): the work starts, and the answer is its result if
/// it finishes within `--resume-wait`, else a task (`resultType: "task"`).
pub(super) async fn call(ctx: &RequestCtx, runner: Arc<dyn OperationRunner>, new: NewOperation) -> Result<Value, RpcError> {
    let inner = ctx.inner().clone();
    let (raw, _) = operations::create(&inner, runner, new).await?;
    let id = hex::encode(raw);
    // `--resume-wait 0s`: always a task, however quick the work.
    let wait = inner.config.resume_wait;
    let finished = !wait.is_zero() && inner.operations.finished_by(&id, tokio::time::Instant::now() + wait).await;
    let record = inner.operations.records.load(&id).await?.ok_or_else(not_found)?;
    if finished {
        match record.state {
            OpState::Done => {
                let result = assemble(&inner.operations.records, &id, &record).await?;
                inner.operations.records.finish(&id, record.chunks).await;
                return Ok(result);
            }
            OpState::Failed => {
                inner.operations.records.finish(&id, record.chunks).await;
                return Err(RpcError::from_object(record.error.as_ref().unwrap_or(&Value::Null)));
            }
            _ => {}
        }
    }
    let mut created = task(&id, &record, inner.operations.records.ttl());
    created.insert("resultType".into(), json!("task"));
    Ok(Value::Object(created))
}

impl RequestCtx {
    /// Answers `tasks/get`, `tasks/update` or `tasks/cancel` of a
    /// sessionless client (`runner` restarts restartable work whose process
    /// died).
    pub async fn answer_tasks_method(
        &self,
        runner: Arc<dyn OperationRunner>,
        method: &str,
        params: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        handle(self, runner, method, params).await
    }
}

/// `tasks/get`, `tasks/update`, `tasks/cancel` of a sessionless client.
async fn handle(
    ctx: &RequestCtx,
    runner: Arc<dyn OperationRunner>,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Value, RpcError> {
    if !declared(ctx) {
        return Err(extension_required(&format!("{method} is part of the Tasks extension")));
    }
    let id = params
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::invalid_params(format!("{method} needs params.taskId (a string)")))?;
    let inner = ctx.inner().clone();
    // Another principal's task is answered exactly as an unknown one.
    let record = inner.operations.records.load(id).await?.filter(|r| r.principal == ctx.principal()).ok_or_else(not_found)?;
    if record.expires_at_ms <= now_ms() {
        return Err(not_found());
    }
    match method {
        "tasks/get" => get(&inner, runner, id, record).await,
        // Nothing of tether asks a task's client for input yet: every
        // response is for a key that is not outstanding, which the spec
        // says to ignore.
        "tasks/update" => Ok(json!({})),
        "tasks/cancel" => {
            let cancelled = inner
                .operations
                .records
                .update_if(id, |r| {
                    let running = r.state == OpState::Running;
                    if running {
                        r.state = OpState::Cancelled;
                        r.updated_at_ms = now_ms();
                    }
                    running
                })
                .await?;
            if cancelled.is_some() {
                inner.operations.cancel(id);
                tracing::info!(task = %id, "task cancelled by its client");
            }
            Ok(json!({}))
        }
        other => Err(RpcError::method_not_found(other)),
    }
}

/// The task `id` of `principal` as `tasks/get` shows it now (no takeover of
/// an orphaned one: that is `tasks/get`'s); `None` if it is not theirs or
/// is gone.
pub(crate) async fn snapshot(records: &OpRecords, principal: &str, id: &str) -> Result<Option<Value>, RpcError> {
    let record = records.load(id).await?.filter(|r| r.principal == principal && r.expires_at_ms > now_ms());
    match record {
        Some(record) => Ok(Some(detailed(records, id, &record).await?)),
        None => Ok(None),
    }
}

async fn get(inner: &Arc<Inner>, runner: Arc<dyn OperationRunner>, id: &str, mut record: OpRecord) -> Result<Value, RpcError> {
    if operations::orphaned(inner, id, &record).await {
        if record.restartable {
            // Without room for it here, it stays orphaned for a later `tasks/get` to restart.
            if let Ok(slot) = inner.operations.slot(&record.principal)
                && let Some(claimed) = inner.operations.records.claim(id, &record.owner).await?
            {
                tracing::info!(task = %id, from_chunk = claimed.chunks, "restarting an interrupted task");
                inner.operations.start(inner.clone(), runner, id.to_owned(), &claimed, slot);
                record = claimed;
            }
        } else {
            record = inner
                .operations
                .records
                .update(id, |r| {
                    r.state = OpState::Interrupted;
                })
                .await?;
        }
    }
    detailed(&inner.operations.records, id, &record).await
}

/// A record as the spec's `DetailedTask`: the task, and its result, error
/// or nothing more, by status.
async fn detailed(records: &OpRecords, id: &str, record: &OpRecord) -> Result<Value, RpcError> {
    let mut detailed = task(id, record, records.ttl());
    match record.state {
        OpState::Done => {
            detailed.insert("result".into(), assemble(records, id, record).await?);
        }
        OpState::Failed => {
            let error = record.error.clone().unwrap_or_else(|| RpcError::internal("the task failed").to_object());
            detailed.insert("error".into(), error);
        }
        OpState::Interrupted => {
            detailed.insert("error".into(), RpcError::internal(operations::INTERRUPTED_MESSAGE).to_object());
        }
        OpState::Running | OpState::Cancelled => {}
    }
    Ok(Value::Object(detailed))
}

/// The task fields of a record (the spec's `Task`).
fn task(id: &str, record: &OpRecord, ttl: Duration) -> Map<String, Value> {
    let (status, message) = match record.state {
        OpState::Running => ("working", None),
        OpState::Done => ("completed", None),
        OpState::Failed => ("failed", Some("the tool's work ended with an error")),
        OpState::Interrupted => ("failed", Some("interrupted by a server restart")),
        OpState::Cancelled => ("cancelled", Some("cancelled by the client")),
    };
    let mut task = Map::new();
    task.insert("taskId".into(), json!(id));
    task.insert("status".into(), json!(status));
    if let Some(message) = message {
        task.insert("statusMessage".into(), json!(message));
    }
    let created = if record.created_at_ms > 0 { record.created_at_ms } else { now_ms() };
    task.insert("createdAt".into(), json!(iso8601(created)));
    task.insert("lastUpdatedAt".into(), json!(iso8601(record.updated_at_ms.max(created))));
    task.insert("ttlMs".into(), json!(ttl.as_millis() as u64));
    task.insert("pollIntervalMs".into(), json!(POLL_INTERVAL.as_millis() as u64));
    task
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_iso_8601_in_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_764_066_600_123), "2025-11-25T10:30:00.123Z");
    }
}
