//! The JSON-RPC 2.0 envelope as MCP uses it, and the protocol revisions tether
//! speaks. Parsing is strict and never panics: every rejection carries the
//! JSON-RPC code and a sentence a person can act on.

use bytes::Bytes;
use serde_json::{Map, Value, json};

/// Revisions served with sessions (the "legacy era"), newest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];
/// Offered when a client asks for a revision we do not speak.
pub const LATEST_VERSION: &str = "2025-11-25";
/// Assumed when a request after initialize carries no `MCP-Protocol-Version`.
pub const ASSUMED_VERSION: &str = "2025-03-26";

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;

pub fn is_supported_version(v: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&v)
}

/// The revision to answer an `initialize` asking for `requested` with.
pub fn negotiate_version(requested: Option<&str>) -> &'static str {
    requested
        .and_then(|r| SUPPORTED_VERSIONS.iter().find(|v| **v == r).copied())
        .unwrap_or(LATEST_VERSION)
}

/// One message a client sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Request { id: Value, method: String, params: Option<Map<String, Value>> },
    Notification { method: String, params: Option<Map<String, Value>> },
    Response { id: Value, outcome: Result<Value, Value> },
}

/// Why a body is not one valid JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeError {
    pub code: i64,
    pub message: String,
    /// The request's id when it could be read, so the error can answer it.
    pub id: Option<Value>,
}

fn invalid(message: impl Into<String>, id: Option<Value>) -> EnvelopeError {
    EnvelopeError { code: INVALID_REQUEST, message: message.into(), id }
}

fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(s) => s.len() <= 256,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// Parses one POST body.
pub fn parse_message(body: &[u8]) -> Result<Inbound, EnvelopeError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(EnvelopeError { code: PARSE_ERROR, message: "empty body: send one JSON-RPC message".into(), id: None });
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| EnvelopeError {
        code: PARSE_ERROR,
        message: format!("body is not valid JSON: {e}"),
        id: None,
    })?;
    let mut obj = match value {
        Value::Object(o) => o,
        Value::Array(_) => return Err(invalid("JSON-RPC batches are not supported: send one message per POST", None)),
        _ => return Err(invalid("a JSON-RPC message must be a JSON object", None)),
    };
    let id = obj.remove("id");
    let id_for_errors = id.clone().filter(valid_id);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid("`jsonrpc` must be the string \"2.0\"", id_for_errors));
    }
    if let Some(id) = &id
        && !valid_id(id) {
            return Err(invalid("`id` must be a string or an integer (not null)", None));
        }
    if let Some(method) = obj.remove("method") {
        let Value::String(method) = method else {
            return Err(invalid("`method` must be a string", id_for_errors));
        };
        let params = match obj.remove("params") {
            None | Some(Value::Null) => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => {
                return Err(EnvelopeError {
                    code: INVALID_PARAMS,
                    message: "`params` must be an object".into(),
                    id: id_for_errors,
                });
            }
        };
        return Ok(match id {
            Some(id) => Inbound::Request { id, method, params },
            None => Inbound::Notification { method, params },
        });
    }
    let Some(id) = id else {
        return Err(invalid("message has neither `method` nor `id`", None));
    };
    match (obj.remove("result"), obj.remove("error")) {
        (Some(result), None) => Ok(Inbound::Response { id, outcome: Ok(result) }),
        (None, Some(error)) if error.is_object() => Ok(Inbound::Response { id, outcome: Err(error) }),
        _ => Err(invalid("a response needs exactly one of `result` or an `error` object", None)),
    }
}

/// A success response, serialized straight from borrowed parts (`json!`
/// would deep-copy the result first: the hot path's largest value).
#[derive(serde::Serialize)]
struct ResultEnvelope<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: &'a Value,
}

/// Serialized success response.
pub fn result_message(id: &Value, result: &Value) -> Bytes {
    let envelope = ResultEnvelope { jsonrpc: "2.0", id, result };
    // A `Value` always serializes (its map keys are strings).
    let mut body = serde_json::to_vec(&envelope).unwrap_or_default();
    // Exact size: `Bytes` takes a full `Vec` over without a shared header.
    body.shrink_to_fit();
    Bytes::from(body)
}

/// Serialized error response (`id` null when unknown).
pub fn error_message(id: Option<&Value>, code: i64, message: &str, data: Option<&Value>) -> Bytes {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data.clone();
    }
    Bytes::from(json!({"jsonrpc": "2.0", "id": id.unwrap_or(&Value::Null), "error": error}).to_string())
}

/// Serialized notification or server-to-client request.
pub fn outbound_message(id: Option<&Value>, method: &str, params: Option<&Value>) -> Bytes {
    let mut m = json!({"jsonrpc": "2.0", "method": method});
    if let Some(id) = id {
        m["id"] = id.clone();
    }
    if let Some(p) = params {
        m["params"] = p.clone();
    }
    Bytes::from(m.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_four_shapes() {
        assert!(matches!(
            parse_message(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Ok(Inbound::Request { method, .. }) if method == "ping"
        ));
        assert!(matches!(
            parse_message(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Ok(Inbound::Notification { .. })
        ));
        assert!(matches!(parse_message(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#), Ok(Inbound::Response { outcome: Ok(_), .. })));
        assert!(matches!(
            parse_message(br#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"x"}}"#),
            Ok(Inbound::Response { outcome: Err(_), .. })
        ));
    }

    #[test]
    fn rejects_with_the_right_code() {
        let code = |b: &[u8]| parse_message(b).unwrap_err().code;
        assert_eq!(code(b""), PARSE_ERROR);
        assert_eq!(code(b"{nope"), PARSE_ERROR);
        assert_eq!(code(&[b'['; 100_000]), PARSE_ERROR);
        assert_eq!(code(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#), INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#), INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#), INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#), INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1,"method":7}"#), INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#), INVALID_PARAMS);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1}"#), INVALID_REQUEST);
        assert_eq!(code(br#""hello""#), INVALID_REQUEST);
    }

    #[test]
    fn negotiates_known_versions_and_offers_latest_otherwise() {
        assert_eq!(negotiate_version(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate_version(Some("2099-01-01")), LATEST_VERSION);
        assert_eq!(negotiate_version(None), LATEST_VERSION);
    }
}
