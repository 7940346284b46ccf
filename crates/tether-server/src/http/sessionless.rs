//! The sessionless revision (2026-07-28) on the same endpoints as the
//! session era: telling a sessionless request from a session-era one, checking it in
//! the order the specification's validation suite expects, and turning the
//! engine's sessionless reply into JSON or an SSE stream.
//!
//! A request is sessionless when its `_meta` claims a protocol version, or its
//! `MCP-Protocol-Version` header names a sessionless one; everything else keeps
//! the session era's rules unchanged. Checks, in order: the required `_meta`
//! keys (-32602), the version header against `_meta` (-32020), a version
//! served (-32022), `Mcp-Method` / `Mcp-Name` against the body (-32020), a
//! method that exists in the revision (404, -32601). Sessionless GET and DELETE: 405.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value, json};
use tether_wire::{Inbound, RpcError, code, envelope, headers, meta, revision};

use super::{AppState, HttpError};
use crate::app::{Authorized, Caller, ClientDeclaration};
use crate::engine::{Outbound, SessionlessRequest, discover_result};

/// Methods of the session era that the sessionless revision removed.
const REMOVED: &[&str] = &["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];

/// Whether a POSTed message is for the sessionless revision.
pub fn is_sessionless(message: &Inbound, headers: &HeaderMap) -> bool {
    let params = match message {
        Inbound::Request { params, .. } | Inbound::Notification { params, .. } => params.as_ref(),
        Inbound::Response { .. } => None,
    };
    let claims =
        params.and_then(|p| p.get("_meta")).and_then(Value::as_object).is_some_and(|m| m.contains_key(meta::PROTOCOL_VERSION));
    let initialize = matches!(message, Inbound::Request { method, .. } if method == "initialize");
    claims || (!initialize && header_is_sessionless(headers))
}

/// Whether the `MCP-Protocol-Version` header names a sessionless revision.
pub(super) fn header_is_sessionless(headers: &HeaderMap) -> bool {
    headers.get(headers::PROTOCOL_VERSION).and_then(|v| v.to_str().ok()).is_some_and(revision::is_sessionless)
}

/// 405 for a GET or DELETE of the sessionless revision, which has neither.
pub(super) fn method_not_allowed() -> Response {
    let error = HttpError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        code::INVALID_REQUEST,
        "the 2026-07-28 revision has no GET stream and no sessions to DELETE: POST each request (subscriptions/listen for notifications)",
    );
    let mut response = error.into_response();
    response.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    response
}

fn refuse(status: StatusCode, id: &Value, error: RpcError) -> Response {
    let body = envelope::error_message(Some(id), &error);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn mismatch(id: &Value, message: String) -> Response {
    refuse(StatusCode::BAD_REQUEST, id, RpcError::new(code::HEADER_MISMATCH, message))
}

/// A header's value, `=?base64?…?=` decoded; `Err` when it cannot be read.
pub fn header_value(headers: &HeaderMap, name: &str) -> Result<Option<String>, String> {
    let Some(raw) = headers.get(name) else { return Ok(None) };
    let raw = raw.to_str().map_err(|_| format!("the {name} header is not visible ASCII"))?;
    match raw.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|e| format!("the {name} header's base64 value cannot be decoded: {e}"))?;
            String::from_utf8(bytes).map(Some).map_err(|_| format!("the {name} header's base64 value is not UTF-8"))
        }
        None => Ok(Some(raw.to_owned())),
    }
}

/// The body field `Mcp-Name` must repeat, for the methods that name something.
fn named(method: &str, params: &Map<String, Value>) -> Option<(&'static str, Option<String>)> {
    let field = headers::mcp_name_field(method)?;
    Some((field, params.get(field).and_then(Value::as_str).map(str::to_owned)))
}

/// Answers one sessionless POST.
pub(super) async fn post(
    state: &AppState,
    endpoint: &str,
    principal: String,
    authorized: Authorized,
    headers: &HeaderMap,
    message: Inbound,
) -> Result<Response, HttpError> {
    let (id, method, params) = match message {
        // The revision defines no client notifications over HTTP; taking
        // one does no harm.
        Inbound::Notification { .. } => return Ok(StatusCode::ACCEPTED.into_response()),
        Inbound::Response { .. } => {
            return Err(HttpError::bad_request(
                "a 2026-07-28 client sends no responses: input goes in the repeated request's inputResponses",
            ));
        }
        Inbound::Request { id, method, params } => (id, method, params.unwrap_or_default()),
    };
    let request_meta = params.get("_meta").and_then(Value::as_object);
    let version = request_meta.and_then(|m| m.get(meta::PROTOCOL_VERSION)).and_then(Value::as_str);
    let capabilities = request_meta.and_then(|m| m.get(meta::CLIENT_CAPABILITIES)).filter(|c| c.is_object());
    let (Some(version), Some(capabilities)) = (version, capabilities) else {
        return Ok(refuse(
            StatusCode::BAD_REQUEST,
            &id,
            RpcError::invalid_params(format!(
                "a 2026-07-28 request needs _meta[\"{}\"] (a string) and _meta[\"{}\"] (an object, {{}} for none)",
                meta::PROTOCOL_VERSION,
                meta::CLIENT_CAPABILITIES
            )),
        ));
    };
    match header_value(headers, headers::PROTOCOL_VERSION) {
        Ok(Some(h)) if h == version => {}
        Ok(Some(h)) => {
            return Ok(mismatch(&id, format!("Header mismatch: MCP-Protocol-Version `{h}` is not _meta's `{version}`")));
        }
        Ok(None) => {
            return Ok(mismatch(&id, "the MCP-Protocol-Version header is required and must equal _meta's version".into()));
        }
        Err(e) => return Ok(mismatch(&id, e)),
    }
    if !revision::SESSIONLESS.contains(&version) {
        let error = RpcError {
            code: code::UNSUPPORTED_PROTOCOL_VERSION,
            message: format!("protocol version `{version}` is not served; use one of {}", revision::SESSIONLESS.join(", ")),
            data: Some(json!({"supported": revision::SESSIONLESS, "requested": version})),
        };
        return Ok(refuse(StatusCode::BAD_REQUEST, &id, error));
    }
    match header_value(headers, headers::MCP_METHOD) {
        Ok(Some(h)) if h == method => {}
        Ok(Some(h)) => return Ok(mismatch(&id, format!("Header mismatch: Mcp-Method `{h}` is not the body's `{method}`"))),
        Ok(None) => return Ok(mismatch(&id, "the Mcp-Method header is required on every 2026-07-28 request".into())),
        Err(e) => return Ok(mismatch(&id, e)),
    }
    if let Some((field, body)) = named(&method, &params) {
        match (header_value(headers, headers::MCP_NAME), body) {
            (Ok(Some(h)), Some(b)) if h == b => {}
            (Ok(Some(h)), _) => {
                return Ok(mismatch(&id, format!("Header mismatch: Mcp-Name `{h}` is not the body's params.{field}")));
            }
            (Ok(None), _) => return Ok(mismatch(&id, format!("{method} needs the Mcp-Name header (its params.{field})"))),
            (Err(e), _) => return Ok(mismatch(&id, e)),
        }
    }
    if REMOVED.contains(&method.as_str()) {
        return Ok(refuse(
            StatusCode::NOT_FOUND,
            &id,
            RpcError::new(code::METHOD_NOT_FOUND, format!("{method} does not exist in protocol 2026-07-28")),
        ));
    }
    let engine = &state.engine;
    let Some(described) = engine.discover(endpoint).await? else {
        // An application of the session era only: name the revisions it speaks.
        let error = RpcError {
            code: code::UNSUPPORTED_PROTOCOL_VERSION,
            message: format!(
                "this endpoint serves protocol {} with sessions (send initialize), not {version}",
                revision::SUPPORTED.join(", ")
            ),
            data: Some(json!({"supported": revision::SUPPORTED, "requested": version})),
        };
        return Ok(refuse(StatusCode::BAD_REQUEST, &id, error));
    };
    if method == "subscriptions/listen" {
        let filter = match crate::engine::listen_filter(&params) {
            Ok(filter) => filter,
            Err(refused) => return Ok(refuse(StatusCode::OK, &id, refused)),
        };
        let caller = caller_of(principal, version, request_meta, capabilities);
        let reply = engine.listen(endpoint, caller, id, filter).await?;
        return answer(reply).await;
    }
    if method == "server/discover" {
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": discover_result(&described)});
        return Ok(axum::Json(answer).into_response());
    }
    let caller = caller_of(principal, version, request_meta, capabilities);
    let log_level = request_meta.and_then(|m| m.get(meta::LOG_LEVEL)).and_then(Value::as_str).map(str::to_owned);
    let param_headers = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with(headers::MCP_PARAM_PREFIX))
        .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
        .collect();
    let request = SessionlessRequest {
        endpoint: endpoint.to_owned(),
        caller,
        id,
        method,
        params: Some(params),
        authorized: Some(authorized),
        log_level,
        param_headers,
    };
    answer(engine.call_sessionless(request).await?).await
}

/// The caller a sessionless request declares in its `_meta`.
fn caller_of(principal: String, version: &str, request_meta: Option<&Map<String, Value>>, capabilities: &Value) -> Caller {
    Caller {
        principal,
        client: std::sync::Arc::new(ClientDeclaration {
            protocol_version: version.to_owned(),
            client_info: request_meta.and_then(|m| m.get(meta::CLIENT_INFO)).cloned().unwrap_or(Value::Null),
            client_capabilities: capabilities.clone(),
        }),
    }
}

/// JSON when the answer comes first (its status by its error), else an SSE stream.
async fn answer(mut reply: crate::engine::SessionlessReply) -> Result<Response, HttpError> {
    let mut first = reply.messages.recv().await;
    while matches!(first, Some(Outbound::KeepAlive)) {
        first = reply.messages.recv().await;
    }
    match first {
        Some(Outbound::Answer { body, error }) => Ok(super::answer_response(body, error, None)),
        Some(Outbound::Notification(first)) => Ok(super::sse::unnumbered(first, reply)),
        Some(Outbound::KeepAlive) | None => Err(HttpError::internal("the request's task ended without an answer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_sentinel_values_are_decoded() {
        let mut h = HeaderMap::new();
        h.insert("mcp-name", "=?base64?SGVsbG8sIOS4lueVjA==?=".parse().unwrap());
        assert_eq!(header_value(&h, "mcp-name").unwrap().as_deref(), Some("Hello, 世界"));
        h.insert("mcp-name", "=?base64?%%%?=".parse().unwrap());
        assert!(header_value(&h, "mcp-name").is_err());
    }

    #[test]
    fn a_request_is_sessionless_by_its_meta_claim_or_a_sessionless_version_header() {
        let claim = Inbound::Request {
            id: json!(1),
            method: "tools/list".into(),
            params: json!({"_meta": {(meta::PROTOCOL_VERSION): "2026-07-28"}}).as_object().cloned(),
        };
        assert!(is_sessionless(&claim, &HeaderMap::new()));
        let plain = Inbound::Request { id: json!(1), method: "tools/list".into(), params: None };
        assert!(!is_sessionless(&plain, &HeaderMap::new()));
        let mut sessionless_header = HeaderMap::new();
        sessionless_header.insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
        assert!(is_sessionless(&plain, &sessionless_header));
        let initialize = Inbound::Request { id: json!(1), method: "initialize".into(), params: None };
        assert!(!is_sessionless(&initialize, &sessionless_header), "initialize is the session era's");
    }
}
