//! How a session reaches its server: [`ClientOptions`] (credentials, extra
//! headers, limits), the [`Bearer`] that may change while a session lives,
//! and the HTTP headers built from them for every request: auth and the
//! caller's headers, the session's own (`Mcp-Session-Id`, the protocol
//! version), and those a message's body implies (the sessionless
//! `Mcp-Method` / `Mcp-Name`, the W3C trace context).
//!
//! Invariant: a token is never printed ([`ClientOptions`]'s `Debug` redacts
//! it) and a changing [`Bearer`] is sent as it stands when each request
//! goes out; a caller's header or token that is not a valid HTTP header
//! value is refused when the session is built, one taken from a message is
//! left out.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use tether_wire::headers;

use super::{Inner, Kind};
use crate::error::ClientError;

/// A bearer token that may change while a session lives (one its owner
/// refreshes before it expires): each request sends the value it holds
/// when the request is sent. Cheap to clone; clones share the value.
#[derive(Clone, Default)]
pub struct Bearer(Arc<RwLock<Option<HeaderValue>>>);

impl Bearer {
    /// The token every later request sends.
    pub fn set(&self, token: &str) -> Result<(), ClientError> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::Config("the bearer token contains characters not allowed in an HTTP header".into()))?;
        value.set_sensitive(true);
        *self.0.write() = Some(value);
        Ok(())
    }

    fn current(&self) -> Option<HeaderValue> {
        self.0.read().clone()
    }
}

/// How to reach a server: credentials, extra headers, the time limit of one request.
#[derive(Clone)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
    /// A bearer token that changes (sent instead of `bearer_token`).
    pub bearer: Option<Bearer>,
    /// Extra HTTP headers on every request.
    pub headers: Vec<(String, String)>,
    /// Limit for one request, from sending it to its response (default 60s).
    pub request_timeout: Duration,
    /// Longest message (a JSON body, one SSE event) taken from the server
    /// (default 32 MiB); a longer one ends its request with an error.
    pub max_message_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            bearer_token: None,
            bearer: None,
            headers: Vec::new(),
            request_timeout: Duration::from_secs(60),
            max_message_bytes: tether_wire::sse::DEFAULT_MAX_EVENT_BYTES,
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<redacted>"))
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

pub(super) fn build_base_headers(options: &ClientOptions) -> Result<HeaderMap, ClientError> {
    let mut headers = HeaderMap::new();
    for (name, value) in &options.headers {
        let n = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ClientError::Config(format!("header name {name:?} is not a valid HTTP header name")))?;
        let v = HeaderValue::from_str(value)
            .map_err(|_| ClientError::Config(format!("the value of header {name} is not a valid HTTP header value")))?;
        headers.append(n, v);
    }
    if let Some(token) = &options.bearer_token {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::Config("the bearer token contains characters not allowed in an HTTP header".into()))?;
        v.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    Ok(headers)
}

/// The headers of a sessionless request that mirror its body: `Mcp-Method`,
/// and `Mcp-Name` for the methods that name something (base64-wrapped when
/// the value is not plain visible ASCII, as the revision says).
fn sessionless_headers(headers: &mut HeaderMap, message: &Value) {
    let Some(method) = message.get("method").and_then(Value::as_str) else { return };
    if let Ok(v) = HeaderValue::from_str(method) {
        headers.insert(HeaderName::from_static(tether_wire::headers::MCP_METHOD), v);
    }
    let Some(field) = tether_wire::headers::mcp_name_field(method) else { return };
    let Some(name) = message.get("params").and_then(|p| p.get(field)).and_then(Value::as_str) else { return };
    let plain = !name.is_empty()
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && !(name.starts_with("=?base64?") && name.ends_with("?="));
    let value = if plain {
        name.to_owned()
    } else {
        use base64::Engine as _;
        format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(name))
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(tether_wire::headers::MCP_NAME), v);
    }
}

/// The W3C trace context a request carries in `params._meta` (the gateway
/// puts its span's there), repeated as the `traceparent` and `tracestate`
/// headers, where an HTTP server looks for it first.
fn trace_headers(headers: &mut HeaderMap, message: &Value) {
    let Some(request_meta) = message.get("params").and_then(|p| p.get("_meta")) else { return };
    for (field, name) in [
        (tether_wire::meta::TRACEPARENT, tether_wire::headers::TRACEPARENT),
        (tether_wire::meta::TRACESTATE, tether_wire::headers::TRACESTATE),
    ] {
        if let Some(v) = request_meta.get(field).and_then(Value::as_str).and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
}

impl Inner {
    /// Headers for a request: auth, the caller's, and the session's.
    pub(super) fn headers(&self, post: bool) -> HeaderMap {
        let mut h = self.headers_without_bearer(post);
        if let Some(value) = self.options.bearer.as_ref().and_then(Bearer::current) {
            h.insert(reqwest::header::AUTHORIZATION, value);
        }
        h
    }

    fn headers_without_bearer(&self, post: bool) -> HeaderMap {
        if post && let Some(cached) = self.session_post_headers.get() {
            return cached.clone();
        }
        let mut h = self.base_headers.clone();
        if post {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static(headers::ACCEPT_POST));
            h.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        } else {
            h.insert(reqwest::header::ACCEPT, HeaderValue::from_static(headers::EVENT_STREAM));
        }
        if let Kind::Streamable = self.kind {
            if let Some(v) = self.session_id.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(headers::SESSION_ID, v);
            }
            if let Some(v) = self.protocol_version.get().and_then(|s| HeaderValue::from_str(s).ok()) {
                h.insert(headers::PROTOCOL_VERSION, v);
            }
            if post && self.session_id.get().is_some() && self.protocol_version.get().is_some() {
                let _ = self.session_post_headers.set(h.clone());
            }
        }
        h
    }

    /// The headers of a POST carrying `message`.
    pub(super) fn post_headers(&self, message: &Value) -> HeaderMap {
        let mut headers = self.headers(true);
        if self.sessionless.is_some() {
            sessionless_headers(&mut headers, message);
        }
        trace_headers(&mut headers, message);
        headers
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_trace_context_in_meta_is_repeated_as_w3c_headers_and_nothing_else_is() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = HeaderMap::new();
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t", "_meta": {"traceparent": parent, "tracestate": "k=v", "progressToken": 7}}});
        trace_headers(&mut headers, &message);
        assert_eq!(headers.get("traceparent").and_then(|v| v.to_str().ok()), Some(parent));
        assert_eq!(headers.get("tracestate").and_then(|v| v.to_str().ok()), Some("k=v"));
        assert_eq!(headers.len(), 2);
        let mut none = HeaderMap::new();
        trace_headers(&mut none, &json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}));
        trace_headers(
            &mut none,
            &json!({"jsonrpc": "2.0", "id": 3, "method": "x", "params": {"_meta": {"traceparent": "bad\nvalue"}}}),
        );
        assert!(none.is_empty());
    }

    #[test]
    fn options_never_print_the_token() {
        let o = ClientOptions { bearer_token: Some("secret-token".into()), ..ClientOptions::default() };
        assert!(!format!("{o:?}").contains("secret-token"));
    }
}
