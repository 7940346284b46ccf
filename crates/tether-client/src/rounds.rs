//! A request of the sessionless revision (2026-07-28) carried to its end:
//! `input_required` rounds answered by the caller's handler (the same
//! handler that answers a session's server-to-client requests), and a
//! `task` result followed with `tasks/get` until it ends.
//!
//! Invariant: [`ClientError::Auth`] from [`request_to_end`] means the server
//! refused its first round, so it ran nothing and the request may be sent
//! again (with other credentials); a refusal of a later round, or of
//! following a task, is a [`ClientError::Transport`] saying so.

use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_wire::{RpcError, code};

use crate::{ClientError, Session};

/// Rounds one request may take (a server that keeps asking is a bug).
const MAX_INPUT_ROUNDS: usize = 8;
/// Bounds on how often a task is polled, whatever `pollIntervalMs` says.
const TASK_POLL_MIN: Duration = Duration::from_millis(100);
const TASK_POLL_MAX: Duration = Duration::from_secs(5);

/// Sends `method` on the sessionless `session` until it has a final answer:
/// each `inputRequests` entry is answered by `answer` (given the request,
/// `{"method", "params"}`), and the request repeated with the answers and
/// the server's `requestState`; a task is followed to its end. The result
/// keeps the server's shape (`resultType` included).
pub async fn request_to_end<F, Fut>(
    session: &Session,
    method: &str,
    params: Option<Value>,
    mut answer: F,
) -> Result<Value, ClientError>
where
    F: FnMut(Value) -> Fut,
    Fut: Future<Output = Result<Value, ClientError>>,
{
    let mut params = params.unwrap_or_else(|| json!({}));
    for round in 0..MAX_INPUT_ROUNDS {
        let result = match session.request(method, Some(params.clone())).await {
            Err(refused @ ClientError::Auth { .. }) if round > 0 => return Err(begun(method, refused)),
            result => result?,
        };
        match result.get("resultType").and_then(Value::as_str) {
            Some("input_required") => {
                let asked = result.get("inputRequests").and_then(Value::as_object).cloned().unwrap_or_default();
                let mut answers = Map::new();
                for (key, request) in asked {
                    answers.insert(key, answer(request).await?);
                }
                params["inputResponses"] = Value::Object(answers);
                params["requestState"] = result.get("requestState").cloned().unwrap_or(Value::Null);
            }
            Some("task") => {
                return follow_task(session, &result).await.map_err(|e| match e {
                    refused @ ClientError::Auth { .. } => begun(method, refused),
                    other => other,
                });
            }
            _ => return Ok(result),
        }
    }
    Err(ClientError::Transport(format!("{method}: the server kept asking for input after {MAX_INPUT_ROUNDS} rounds")))
}

/// A refusal of the credentials once the server had taken the request.
fn begun(method: &str, refused: ClientError) -> ClientError {
    ClientError::Transport(format!("{method}: the request had begun when {refused}"))
}

/// Polls `tasks/get` (honouring `pollIntervalMs`, within bounds) until the
/// task `created` describes ends; its result, or its error.
pub async fn follow_task(session: &Session, created: &Value) -> Result<Value, ClientError> {
    let id = created
        .get("taskId")
        .and_then(Value::as_str)
        .ok_or_else(|| ClientError::Transport("the server answered with a task that has no taskId".into()))?
        .to_owned();
    let mut task = created.clone();
    loop {
        match task.get("status").and_then(Value::as_str) {
            Some("completed") => return Ok(task.get("result").cloned().unwrap_or_else(|| json!({"content": []}))),
            Some("failed") => {
                let error = task.get("error").cloned().unwrap_or(Value::Null);
                return Err(ClientError::Rpc(RpcError::from_object(&error)));
            }
            Some("cancelled") => {
                return Err(ClientError::Rpc(RpcError::new(code::REQUEST_CANCELLED, format!("task {id} was cancelled"))));
            }
            Some("input_required") => {
                return Err(ClientError::Transport(format!("task {id} needs input, which tether's client cannot give yet")));
            }
            _ => {}
        }
        let wait = task.get("pollIntervalMs").and_then(Value::as_u64).map_or(TASK_POLL_MIN, Duration::from_millis);
        tokio::time::sleep(wait.clamp(TASK_POLL_MIN, TASK_POLL_MAX)).await;
        task = session.request("tasks/get", Some(json!({"taskId": id}))).await?;
    }
}
