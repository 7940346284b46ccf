//! JSON-RPC error codes and [`RpcError`], the error object of a JSON-RPC
//! answer: what an application answers a request with, what a client gets
//! back, what the bridge forwards.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The JSON-RPC and MCP error codes tether uses.
pub mod code {
    /// The text is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// The JSON is not a valid JSON-RPC message (or not one this server takes).
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method here.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// The method exists, its params are wrong.
    pub const INVALID_PARAMS: i64 = -32602;
    /// The server failed; the message says how.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// MCP: the request was cancelled (`notifications/cancelled`).
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// Generic server-side refusal (a limit was reached).
    pub const SERVER_ERROR: i64 = -32000;
    /// What MCP SDKs use for "session not found" (with HTTP 404).
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// 2026-07-28: an HTTP header disagrees with the body, or a required one is missing.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// 2026-07-28: the request needs a client capability it did not declare.
    pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
    /// 2026-07-28: the request's protocol version is not served.
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// A JSON-RPC error object: `{"code", "message", "data"?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// The JSON-RPC code ([`code`]).
    pub code: i64,
    /// What happened, and what to do next.
    pub message: String,
    /// Anything a client can act on by program (a limit's name, a timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with `code` and `message`, no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }
    /// The same error with `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
    /// `-32600` with `message`.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_REQUEST, message)
    }
    /// `-32602` with `message`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }
    /// `-32601`, naming `method`.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(code::METHOD_NOT_FOUND, format!("method not found: {method}"))
    }
    /// `-32603` with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(code::INTERNAL_ERROR, message)
    }
    /// `-32800`: the request was cancelled.
    pub fn cancelled() -> Self {
        Self::new(code::REQUEST_CANCELLED, "request cancelled")
    }

    /// A refusal because a bound was reached: `-32000` with `data.limit`
    /// naming the bound (a config key such as `max_processes`) beside what
    /// else `data` says. The client may retry later; over HTTP it is a 503.
    pub fn limit_reached(limit: &str, message: impl Into<String>, mut data: serde_json::Map<String, Value>) -> Self {
        data.insert("limit".into(), Value::String(limit.to_owned()));
        Self::new(code::SERVER_ERROR, message).with_data(Value::Object(data))
    }

    /// A refusal because the caller holds its share of a bound already
    /// ([`RpcError::limit_reached`] with `data.scope` = `"principal"`): the
    /// caller may retry once one of its own ends; over HTTP it is a 429.
    pub fn principal_limit_reached(limit: &str, message: impl Into<String>) -> Self {
        let mut data = serde_json::Map::new();
        data.insert("scope".into(), Value::String("principal".into()));
        Self::limit_reached(limit, message, data)
    }

    /// Whether this is [`RpcError::principal_limit_reached`]'s refusal.
    pub fn is_principal_limit(&self) -> bool {
        self.is_retry_later() && self.data.as_ref().and_then(|d| d.get("scope")).and_then(Value::as_str) == Some("principal")
    }

    /// A refusal because something the request needs cannot be reached now
    /// (`-32000` with `data.unavailable` naming it). The client may retry
    /// later; over HTTP it is a 503.
    pub fn unavailable(message: impl Into<String>, what: &str) -> Self {
        Self::new(code::SERVER_ERROR, message).with_data(json!({"unavailable": what}))
    }

    /// Whether this is a refusal to retry later: [`RpcError::limit_reached`]
    /// or [`RpcError::unavailable`].
    pub fn is_retry_later(&self) -> bool {
        let names = |key: &str| self.data.as_ref().and_then(|d| d.get(key)).is_some_and(Value::is_string);
        self.code == code::SERVER_ERROR && (names("limit") || names("unavailable"))
    }

    /// Reads an error object a peer sent; what is missing or malformed is
    /// filled in (`-32603`, "(no message)") rather than refused, because the
    /// caller still has to answer someone.
    pub fn from_object(error: &Value) -> Self {
        Self {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(code::INTERNAL_ERROR),
            message: error.get("message").and_then(Value::as_str).unwrap_or("(no message)").to_owned(),
            data: error.get("data").filter(|d| !d.is_null()).cloned(),
        }
    }

    /// The error object as JSON.
    pub fn to_object(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)
    }
}

impl std::error::Error for RpcError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_objects_round_trip_and_fill_in_what_a_peer_left_out() {
        let e = RpcError::invalid_params("no").with_data(json!({"k": 1}));
        assert_eq!(RpcError::from_object(&e.to_object()), e);
        let partial = RpcError::from_object(&json!({"message": 7}));
        assert_eq!((partial.code, partial.message.as_str()), (code::INTERNAL_ERROR, "(no message)"));
    }
}
