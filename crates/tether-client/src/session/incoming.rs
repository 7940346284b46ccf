//! Sorting what arrives from the server, on either transport: a response
//! (for the request waiting on its ID) or a server message (a request or a
//! notification, for [`Session::deliver_to`](super::Session::deliver_to) or
//! `take_incoming`).
//!
//! Invariant: a result is kept as the raw JSON the server sent (read
//! without building a tree when the message is a plain response); what is
//! not a JSON-RPC message is logged and skipped, never an error of the
//! stream that carried it.

use serde_json::value::RawValue;
use serde_json::{Value, json};

use tether_wire::{Inbound, PeerMessage, RpcError, code, envelope};

use crate::error::{ClientError, ReqError};

/// One JSON-RPC message from the server, sorted. A result stays raw JSON:
/// a gateway passes it on as it came, without building it as a tree.
pub(super) enum Incoming {
    Response { id: Value, outcome: Result<Box<RawValue>, Value> },
    Server(PeerMessage),
}

impl From<Inbound> for Incoming {
    fn from(message: Inbound) -> Self {
        match PeerMessage::from_inbound(message) {
            Ok(message) => Incoming::Server(message),
            Err((id, outcome)) => {
                let outcome = match outcome {
                    Ok(result) => serde_json::value::to_raw_value(&result)
                        .map_err(|e| json!({"code": code::INTERNAL_ERROR, "message": e.to_string()})),
                    Err(error) => Err(error),
                };
                Incoming::Response { id, outcome }
            }
        }
    }
}

/// The shape of a response, read without building its result.
#[derive(serde::Deserialize)]
struct ResponseShape<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: Value,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
}

/// A response (the common case) read directly; anything else `None`, for
/// the full reading of [`envelope::parse_message`].
pub(super) fn read_response(data: &[u8]) -> Option<Incoming> {
    let shape: ResponseShape<'_> = serde_json::from_slice(data).ok()?;
    if shape.jsonrpc != "2.0" || shape.method.is_some() {
        return None;
    }
    let outcome = match (shape.result, shape.error) {
        (Some(result), None) => Ok(result),
        (None, Some(error)) if error.is_object() => Err(error),
        _ => return None,
    };
    Some(Incoming::Response { id: shape.id, outcome })
}

/// The message in an SSE event's data; what is not one valid JSON-RPC
/// message is logged and skipped (the server's next message may still be).
pub(super) fn read_event(url: &str, data: &str) -> Option<Incoming> {
    if let Some(response) = read_response(data.as_bytes()) {
        return Some(response);
    }
    match envelope::parse_message(data.as_bytes()) {
        Ok(message) => Some(message.into()),
        Err(e) => {
            tracing::warn!(%url, "ignoring an SSE event that is not a JSON-RPC message: {}", e.message);
            None
        }
    }
}

/// One message of a JSON body (which may hold a batch of them), like [`read_event`].
pub(super) fn read_value(url: &str, value: Value) -> Option<Incoming> {
    match envelope::from_value(value) {
        Ok(message) => Some(message.into()),
        Err(e) => {
            tracing::warn!(%url, "ignoring a message that is not JSON-RPC: {}", e.message);
            None
        }
    }
}

pub(super) fn same_id(a: &Value, b: &Value) -> bool {
    a == b || matches!((a, b), (Value::String(s), Value::Number(n)) | (Value::Number(n), Value::String(s)) if s == &n.to_string())
}

pub(super) fn outcome_to_result(outcome: Result<Box<RawValue>, Value>) -> Result<Box<RawValue>, ReqError> {
    outcome.map_err(|error| ReqError::Client(ClientError::Rpc(RpcError::from_object(&error))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_read_with_its_result_kept_as_sent_and_anything_else_is_read_in_full() {
        let data = r#"{"jsonrpc":"2.0","id":7,"result":{"b": [1, 2.50],"a":"\u00e9"}}"#;
        match read_event("http://test", data) {
            Some(Incoming::Response { id, outcome: Ok(result) }) => {
                assert_eq!(id, json!(7));
                assert_eq!(result.get(), r#"{"b": [1, 2.50],"a":"\u00e9"}"#, "byte for byte");
            }
            _ => panic!("a response"),
        }
        let error = read_event("http://test", r#"{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"no"}}"#);
        assert!(matches!(error, Some(Incoming::Response { outcome: Err(e), .. }) if e["code"] == -32601));
        for not_a_plain_response in [
            r#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"both"}}"#,
        ] {
            assert!(read_response(not_a_plain_response.as_bytes()).is_none(), "{not_a_plain_response}");
        }
        assert!(matches!(
            read_event("http://test", r#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#),
            Some(Incoming::Server(PeerMessage::Request { .. }))
        ));
    }

    #[test]
    fn messages_are_sorted_into_responses_requests_and_notifications() {
        let sort = |v: Value| read_value("http://test", v);
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": 3, "result": {"a": 1}})),
            Some(Incoming::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "x"}})),
            Some(Incoming::Response { outcome: Err(_), .. })
        ));
        assert!(matches!(
            sort(json!({"jsonrpc": "2.0", "id": "a", "method": "roots/list"})),
            Some(Incoming::Server(PeerMessage::Request { params: None, .. }))
        ));
        assert!(matches!(
            read_event("http://test", r#"{"jsonrpc": "2.0", "method": "notifications/progress", "params": {"p": 1}}"#),
            Some(Incoming::Server(PeerMessage::Notification { params: Some(_), .. }))
        ));
        assert!(sort(json!([1, 2])).is_none());
        assert!(read_event("http://test", "{not json").is_none());
        assert!(same_id(&json!(7), &json!("7")));
    }
}
