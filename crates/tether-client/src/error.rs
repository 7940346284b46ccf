//! Errors of the client runtime. `ClientError` is the public type; `ReqError`
//! keeps the HTTP status of a refused request for the pool, which decides
//! from it whether a server wants a session (`requires_session = "auto"`).

use tether_wire::{RpcError, code};

/// What went wrong talking to an MCP server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// HTTP 404 on an established session: the server forgot it.
    #[error("the server no longer knows this session (HTTP 404): initialize a new session")]
    SessionNotFound,
    /// JSON-RPC error answered by the server.
    #[error("the server answered with JSON-RPC error {}: {}", .0.code, .0.message)]
    Rpc(RpcError),
    /// 401/403.
    #[error("the server refused the credentials (HTTP {status}): {message}")]
    Auth {
        /// 401 or 403.
        status: u16,
        /// What the server said.
        message: String,
    },
    /// Connection, HTTP status or protocol failure.
    #[error("{0}")]
    Transport(String),
    /// Session-required server while requires_session=false, etc.
    #[error("{0}")]
    Config(String),
}

/// A failed request before it became a `ClientError`: an HTTP status the
/// pool may want to look at, or anything else.
#[derive(Debug)]
pub(crate) enum ReqError {
    /// The server refused the POST with this status (not 401/403, not a 404 on a session).
    Status {
        status: u16,
        message: String,
        url: String,
        /// The JSON-RPC error the refusal's body carried, if any.
        rpc: Option<RpcError>,
    },
    Client(ClientError),
}

impl From<ClientError> for ReqError {
    fn from(e: ClientError) -> Self {
        ReqError::Client(e)
    }
}

impl ReqError {
    pub(crate) fn into_client(self) -> ClientError {
        match self {
            // A refusal that is a JSON-RPC error (a 2026-07-28 server answers
            // e.g. -32021 with 400 and -32601 with 404) is that error.
            ReqError::Status { status: 400..=499, rpc: Some(error), .. } => ClientError::Rpc(error),
            ReqError::Status { status, message, url, .. } => {
                ClientError::Transport(format!("the server at {url} answered HTTP {status}: {message}"))
            }
            ReqError::Client(e) => e,
        }
    }

    /// Does this refusal say that a session is needed? (A request sent
    /// without `Mcp-Session-Id` answered 400/404 with a body about a missing
    /// or invalid session or a missing `initialize`, or such a JSON-RPC
    /// error; or 405: POST is not offered here, as at the event-stream URL
    /// of a 2024-11-05 HTTP+SSE server, which `initialize` falls back to.)
    pub(crate) fn says_session_required(&self) -> bool {
        let mentions = |m: &str| {
            let m = m.to_ascii_lowercase();
            m.contains("session") || m.contains("initializ")
        };
        match self {
            ReqError::Status { status: 400 | 404, message, .. } => mentions(message),
            ReqError::Status { status: 405, .. } => true,
            // -32000 and -32001: the server-error codes other SDKs answer a missing session with.
            ReqError::Client(ClientError::Rpc(RpcError { code: code::INVALID_REQUEST | -32000 | -32001, message, .. })) => {
                mentions(message)
            }
            _ => false,
        }
    }
}
