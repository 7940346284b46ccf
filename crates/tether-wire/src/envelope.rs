//! The JSON-RPC 2.0 envelope as MCP uses it: parsing one inbound message
//! strictly (never panicking; every rejection carries the JSON-RPC code and a
//! sentence a person can act on) and rendering outbound ones.

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::{RpcError, code};

/// One message a peer sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A request: it wants an answer under its `id`.
    Request {
        /// A string or an integer, never null.
        id: Value,
        /// The method, as sent.
        method: String,
        /// The params object; `None` when absent or null.
        params: Option<Map<String, Value>>,
    },
    /// A notification: no `id`, no answer.
    Notification {
        /// The method, as sent.
        method: String,
        /// The params object; `None` when absent or null.
        params: Option<Map<String, Value>>,
    },
    /// An answer: `Err` holds the error object as sent.
    Response {
        /// The id of the request it answers.
        id: Value,
        /// The `result`, or the `error` object.
        outcome: Result<Value, Value>,
    },
}

/// Why a body is not one valid JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvelopeError {
    /// The JSON-RPC code to answer with (`-32700`, `-32600` or `-32602`).
    pub code: i64,
    /// What is wrong, in a sentence a person can act on.
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

/// Parses one message (a POST body, a stdio line): the text is read once,
/// its members split off unparsed ([`Parts`]) and each then read for what
/// it is.
pub fn parse_message(body: &[u8]) -> Result<Inbound, EnvelopeError> {
    match Parts::read(body)? {
        Some(parts) => parts.into_message(),
        None => from_value(parse_json(body)?),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, EnvelopeError> {
    serde_json::from_slice(body).map_err(|e| not_json(&e))
}

fn not_json(e: &serde_json::Error) -> EnvelopeError {
    EnvelopeError { code: code::PARSE_ERROR, message: format!("body is not valid JSON: {e}"), id: None }
}

/// A message's members as the peer wrote them, each unparsed, read in one
/// scan of its text: what a reader tells a message's kind by before it
/// builds any of it (an answer's result can then be kept as text). A member
/// given twice is the last one, as in a parsed JSON object.
#[derive(Debug, Default)]
pub struct Parts<'a> {
    /// `jsonrpc`, which must be the string "2.0" ([`Parts::is_2_0`]).
    pub jsonrpc: Option<&'a RawValue>,
    /// `id`: a request's or an answer's.
    pub id: Option<&'a RawValue>,
    /// `method`: a request's or a notification's.
    pub method: Option<&'a RawValue>,
    /// `params`.
    pub params: Option<&'a RawValue>,
    /// `result`: a successful answer's.
    pub result: Option<&'a RawValue>,
    /// `error`: a failed answer's.
    pub error: Option<&'a RawValue>,
}

impl<'a> Parts<'a> {
    /// The members of the JSON object `body`; `None` when `body` is JSON
    /// but not an object (a batch, a string: [`parse_message`] says which).
    pub fn read(body: &'a [u8]) -> Result<Option<Self>, EnvelopeError> {
        match body.iter().find(|b| !b.is_ascii_whitespace()) {
            None => {
                Err(EnvelopeError { code: code::PARSE_ERROR, message: "empty body: send one JSON-RPC message".into(), id: None })
            }
            Some(b'{') => serde_json::from_slice(body).map(Some).map_err(|e| not_json(&e)),
            Some(_) => Ok(None),
        }
    }

    /// Whether `jsonrpc` is the string "2.0".
    pub fn is_2_0(&self) -> bool {
        self.jsonrpc.and_then(|v| serde_json::from_str::<std::borrow::Cow<'_, str>>(v.get()).ok()).as_deref() == Some("2.0")
    }

    /// The whole message, checked as [`from_value`] checks a parsed one.
    pub fn into_message(self) -> Result<Inbound, EnvelopeError> {
        // Each member is valid JSON (the scan checked it); one nested too
        // deep to be read as a value is refused as the whole text would be.
        let value = |raw: Option<&RawValue>| {
            raw.map(|raw| serde_json::from_str::<Value>(raw.get()).map_err(|e| not_json(&e))).transpose()
        };
        build(Members {
            jsonrpc_2_0: self.is_2_0(),
            id: value(self.id)?,
            method: value(self.method)?,
            params: value(self.params)?,
            result: value(self.result)?,
            error: value(self.error)?,
        })
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Parts<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Parts<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC message (a JSON object)")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Parts<'a>, M::Error> {
                let mut parts = Parts::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let member = match key.as_ref() {
                        "jsonrpc" => &mut parts.jsonrpc,
                        "id" => &mut parts.id,
                        "method" => &mut parts.method,
                        "params" => &mut parts.params,
                        "result" => &mut parts.result,
                        "error" => &mut parts.error,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                            continue;
                        }
                    };
                    *member = Some(map.next_value()?);
                }
                Ok(parts)
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

/// What a message's kind is decided by, each member read as a value.
struct Members {
    jsonrpc_2_0: bool,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
    result: Option<Value>,
    error: Option<Value>,
}

/// Reads an already parsed JSON value as one message.
pub fn from_value(value: Value) -> Result<Inbound, EnvelopeError> {
    let mut obj = match value {
        Value::Object(o) => o,
        Value::Array(_) => return Err(invalid("JSON-RPC batches are not supported: send one message per POST", None)),
        _ => return Err(invalid("a JSON-RPC message must be a JSON object", None)),
    };
    build(Members {
        jsonrpc_2_0: obj.get("jsonrpc").and_then(Value::as_str) == Some("2.0"),
        id: obj.remove("id"),
        method: obj.remove("method"),
        params: obj.remove("params"),
        result: obj.remove("result"),
        error: obj.remove("error"),
    })
}

/// The one place a message's members are judged.
fn build(members: Members) -> Result<Inbound, EnvelopeError> {
    let Members { jsonrpc_2_0, id, method, params, result, error } = members;
    let id_for_errors = id.clone().filter(valid_id);
    if !jsonrpc_2_0 {
        return Err(invalid("`jsonrpc` must be the string \"2.0\"", id_for_errors));
    }
    if let Some(id) = &id
        && !valid_id(id)
    {
        return Err(invalid("`id` must be a string or an integer (not null)", None));
    }
    if let Some(method) = method {
        let Value::String(method) = method else {
            return Err(invalid("`method` must be a string", id_for_errors));
        };
        let params = match params {
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
    match (result, error) {
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

/// An error response, serialized from borrowed parts.
#[derive(serde::Serialize)]
struct ErrorEnvelope<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    error: &'a RpcError,
}

/// Serialized error response (`id` null when unknown).
pub fn error_message(id: Option<&Value>, error: &RpcError) -> Bytes {
    serialize(&ErrorEnvelope { jsonrpc: "2.0", id: id.unwrap_or(&Value::Null), error })
}

/// A request or notification, serialized from borrowed parts (its params,
/// the largest part, are written where they are, not copied first).
#[derive(serde::Serialize)]
struct MessageEnvelope<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a Value>,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    params: Option<&'a Value>,
}

/// Serialized notification (`id` `None`) or request.
pub fn outbound_message(id: Option<&Value>, method: &str, params: Option<&Value>) -> Bytes {
    serialize(&MessageEnvelope { jsonrpc: "2.0", id, method, params })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn the_one_scan_reads_as_a_parsed_value_does() {
        // Every shape, read from text and from a parsed value, gives the same message or error.
        let cases: &[&[u8]] = &[
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a"}}}"#,
            br#"{"method":"ping","id":"x","jsonrpc":"2.0","extra":[1,{"a":2}]}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":null}"#,
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":3,"result":null}"#,
            br#"{"jsonrpc":"2.0","id":3,"error":"no"}"#,
            br#"{"jsonrpc":"2.0","id":3,"result":{},"error":{}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            br#"{"jsonrpc":2,"id":1,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":"p"}"#,
            br#"{}"#,
        ];
        for case in cases {
            let value: Value = serde_json::from_slice(case).unwrap();
            assert_eq!(parse_message(case), from_value(value), "{}", String::from_utf8_lossy(case));
        }
        // Duplicates: the last one counts, as in a parsed object.
        assert!(matches!(parse_message(cases[3]), Ok(Inbound::Request { id, .. }) if id == json!(2)));
        // Nested deeper than a value may be: refused as unparseable, never read as something else.
        let deep = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":{}{}}}}}"#, "[".repeat(200), "]".repeat(200));
        assert_eq!(parse_message(deep.as_bytes()).unwrap_err().code, code::PARSE_ERROR);
    }

    #[test]
    fn outbound_messages_read_back_as_what_was_sent() {
        let params = json!({"name": "echo", "arguments": {"text": "a\nb"}});
        let request = outbound_message(Some(&json!(4)), "tools/call", Some(&params));
        assert_eq!(
            parse_message(&request),
            Ok(Inbound::Request { id: json!(4), method: "tools/call".into(), params: params.as_object().cloned() })
        );
        let notification = outbound_message(None, "notifications/initialized", None);
        assert_eq!(&notification[..], br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        let error = error_message(None, &RpcError::new(code::INVALID_PARAMS, "bad").with_data(json!({"k": 1})));
        let error: Value = serde_json::from_slice(&error).unwrap();
        assert_eq!(
            error,
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": code::INVALID_PARAMS, "message": "bad", "data": {"k": 1}}})
        );
        let error = error_message(Some(&json!("a")), &RpcError::new(code::INTERNAL_ERROR, "x"));
        assert_eq!(&error[..], br#"{"jsonrpc":"2.0","id":"a","error":{"code":-32603,"message":"x"}}"#);
    }

    #[test]
    fn a_raw_result_passes_through_byte_for_byte() {
        let raw = serde_json::value::RawValue::from_string(r#"{"z":1,"a":{"unknownField":[1,2]}}"#.into()).unwrap();
        let body = raw_result_message(&json!(7), &raw);
        assert_eq!(&body[..], br#"{"jsonrpc":"2.0","id":7,"result":{"z":1,"a":{"unknownField":[1,2]}}}"#);
    }
}
