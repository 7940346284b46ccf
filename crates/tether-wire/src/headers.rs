//! Header names of the Streamable HTTP transport (lower case, as `http`
//! stores them; header lookups are case-insensitive).

/// The session a request belongs to (set by the server on `initialize`).
pub const SESSION_ID: &str = "mcp-session-id";
/// The revision a request after `initialize` speaks.
pub const PROTOCOL_VERSION: &str = "mcp-protocol-version";
/// Resume a stream after this event (GET).
pub const LAST_EVENT_ID: &str = "last-event-id";
/// 2026-07-28: the request's `method`, on every POST.
pub const MCP_METHOD: &str = "mcp-method";
/// 2026-07-28: `params.name` (or `params.uri`, or a task's id) of the methods that name something.
pub const MCP_NAME: &str = "mcp-name";
/// 2026-07-28: the prefix of the headers that mirror a request's parameters
/// for intermediaries (`Mcp-Param-Region`, as a tool's schema declares).
pub const MCP_PARAM_PREFIX: &str = "mcp-param-";

/// The params field a 2026-07-28 request's `Mcp-Name` repeats, for the
/// methods that name something.
pub fn mcp_name_field(method: &str) -> Option<&'static str> {
    match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    }
}
/// W3C Trace Context: the caller's span (`--otlp-endpoint`).
pub const TRACEPARENT: &str = "traceparent";
/// W3C Trace Context: vendor state beside `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// The `Accept` of a POST: the answer may be JSON or an SSE stream.
pub const ACCEPT_POST: &str = "application/json, text/event-stream";
/// The content type of an SSE stream (and the `Accept` of a GET).
pub const EVENT_STREAM: &str = "text/event-stream";

/// The token of an `Authorization: Bearer TOKEN` value; the scheme is
/// matched without regard to case (RFC 7235), the token trimmed. `None`
/// for another scheme or an empty token.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod bearer_tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER abc "), Some("abc"));
        assert_eq!(bearer_token("bearer  abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }
}
