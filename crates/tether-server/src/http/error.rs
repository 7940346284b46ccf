//! HTTP error responses: a status plus a JSON-RPC error body whose message
//! tells the client what to do.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use tether_wire::code::{INTERNAL_ERROR, INVALID_REQUEST, SERVER_ERROR, SESSION_NOT_FOUND};
use tether_wire::{EnvelopeError, RpcError, envelope};

use crate::engine::EngineError;

/// An error answer: its HTTP status and its JSON-RPC error.
#[derive(Debug)]
pub struct HttpError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The JSON-RPC code.
    pub code: i64,
    /// What is wrong, and what to do next.
    pub message: String,
    /// The request's id, when it could be read.
    pub id: Option<Value>,
    /// The `WWW-Authenticate` challenge of a 401.
    pub www_authenticate: Option<String>,
    /// Seconds for a `Retry-After` header (503s the client should retry).
    pub retry_after: Option<u32>,
    /// The JSON-RPC error's `data`, if it has one.
    pub data: Option<Box<Value>>,
}

/// `Retry-After` of a 503 caused by the store: a failing store is probed on
/// every request, so a second is enough to see it recover.
const STORE_RETRY_AFTER_SECS: u32 = 1;

impl HttpError {
    /// An error with `status`, `code` and `message`, nothing else.
    pub fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), id: None, www_authenticate: None, retry_after: None, data: None }
    }
    /// 400, `-32600`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID_REQUEST, message)
    }
    /// 500, `-32603`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_ERROR, message)
    }
}

impl From<EnvelopeError> for HttpError {
    fn from(e: EnvelopeError) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: e.code,
            message: e.message,
            id: e.id,
            www_authenticate: None,
            retry_after: None,
            data: None,
        }
    }
}

/// `Retry-After` of a 429: a slot of the limit frees when a request ends.
const TOO_MANY_RETRY_AFTER_SECS: u32 = 1;

impl From<EngineError> for HttpError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::SessionNotFound => Self::new(StatusCode::NOT_FOUND, SESSION_NOT_FOUND, message),
            EngineError::UnknownEndpoint(_) => Self::new(StatusCode::NOT_FOUND, INVALID_REQUEST, message),
            EngineError::BadRequest { code, id, message } => {
                Self { status: StatusCode::BAD_REQUEST, code, message, id, www_authenticate: None, retry_after: None, data: None }
            }
            EngineError::TooMany(m) => {
                Self { retry_after: Some(TOO_MANY_RETRY_AFTER_SECS), ..Self::new(StatusCode::TOO_MANY_REQUESTS, SERVER_ERROR, m) }
            }
            EngineError::ShuttingDown => Self::new(StatusCode::SERVICE_UNAVAILABLE, SERVER_ERROR, message),
            EngineError::Unavailable(_) => Self {
                retry_after: Some(STORE_RETRY_AFTER_SECS),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, INTERNAL_ERROR, message)
            },
            EngineError::NotStored { id, .. } => Self {
                id: Some(id),
                retry_after: Some(STORE_RETRY_AFTER_SECS),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, INTERNAL_ERROR, message)
            },
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, message = %self.message, "request failed");
        } else {
            tracing::debug!(status = %self.status, message = %self.message, "request refused");
        }
        let mut error = RpcError::new(self.code, self.message);
        error.data = self.data.map(|d| *d);
        let body = envelope::error_message(self.id.as_ref(), &error);
        let mut response = (self.status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        if let Some(challenge) = self.www_authenticate.and_then(|c| header::HeaderValue::from_str(&c).ok()) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, challenge);
        }
        response
    }
}
