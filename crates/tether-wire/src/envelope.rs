//! The JSON-RPC 2.0 envelope as MCP uses it: parsing one inbound message
//! strictly (never panicking; every rejection carries the JSON-RPC code and a
//! sentence a person can act on) and rendering outbound ones.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::error::{RpcError, code};

/// One message a peer sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Request {
        id: Value,
        method: String,
        params: Option<Map<String, Value>>,
    },
    Notification {
        method: String,
        params: Option<Map<String, Value>>,
    },
    /// An answer: `Err` holds the error object as sent.
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
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
    EnvelopeError { code: code::INVALID_REQUEST, message: message.into(), id }
}

/// A request id MCP allows: a string (bounded) or an integer, never null.
pub fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(s) => s.len() <= 256,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// Parses one message (a POST body, a stdio line).
pub fn parse_message(body: &[u8]) -> Result<Inbound, EnvelopeError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(EnvelopeError { code: code::PARSE_ERROR, message: "empty body: send one JSON-RPC message".into(), id: None });
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| EnvelopeError {
        code: code::PARSE_ERROR,
        message: format!("body is not valid JSON: {e}"),
        id: None,
    })?;
    from_value(value)
}

/// Reads an already parsed JSON value as one message.
pub fn from_value(value: Value) -> Result<Inbound, EnvelopeError> {
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
        && !valid_id(id)
    {
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
                    code: code::INVALID_PARAMS,
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
struct ResultEnvelope<'a, R: serde::Serialize + ?Sized> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: &'a R,
}

/// Serialized success response.
pub fn result_message(id: &Value, result: &Value) -> Bytes {
    serialize(&ResultEnvelope { jsonrpc: "2.0", id, result })
}

/// Serialized success response whose result is already JSON text (passed
/// through unparsed, so no field of it is lost or reordered).
pub fn raw_result_message(id: &Value, result: &serde_json::value::RawValue) -> Bytes {
    serialize(&ResultEnvelope { jsonrpc: "2.0", id, result })
}

fn serialize(envelope: &impl serde::Serialize) -> Bytes {
    // A `Value` (and valid raw JSON) always serializes: its map keys are strings.
    let mut body = serde_json::to_vec(envelope).unwrap_or_default();
    // Exact size: `Bytes` takes a full `Vec` over without a shared header.
    body.shrink_to_fit();
    Bytes::from(body)
}

/// Serialized error response (`id` null when unknown).
pub fn error_message(id: Option<&Value>, error: &RpcError) -> Bytes {
    Bytes::from(json!({"jsonrpc": "2.0", "id": id.unwrap_or(&Value::Null), "error": error.to_object()}).to_string())
}

/// Serialized notification (`id` `None`) or request.
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
        assert!(matches!(
            parse_message(br#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            Ok(Inbound::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            parse_message(br#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"x"}}"#),
            Ok(Inbound::Response { outcome: Err(_), .. })
        ));
    }

    #[test]
    fn rejects_with_the_right_code() {
        let code = |b: &[u8]| parse_message(b).unwrap_err().code;
        assert_eq!(code(b""), code::PARSE_ERROR);
        assert_eq!(code(b"{nope"), code::PARSE_ERROR);
        assert_eq!(code(&[b'['; 100_000]), code::PARSE_ERROR);
        assert_eq!(code(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#), code::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#), code::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#), code::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#), code::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1,"method":7}"#), code::INVALID_REQUEST);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#), code::INVALID_PARAMS);
        assert_eq!(code(br#"{"jsonrpc":"2.0","id":1}"#), code::INVALID_REQUEST);
        assert_eq!(code(br#""hello""#), code::INVALID_REQUEST);
    }

    #[test]
    fn a_raw_result_passes_through_byte_for_byte() {
        let raw = serde_json::value::RawValue::from_string(r#"{"z":1,"a":{"unknownField":[1,2]}}"#.into()).unwrap();
        let body = raw_result_message(&json!(7), &raw);
        assert_eq!(&body[..], br#"{"jsonrpc":"2.0","id":7,"result":{"z":1,"a":{"unknownField":[1,2]}}}"#);
    }
}
