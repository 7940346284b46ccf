//! The HTTP exchange both transports share: the client and its connect
//! limit, the URL check, POSTing one message (through [`plain_http`](super::plain_http)
//! when it can), and how a refusal or a failure becomes an error the caller
//! can act on.
//!
//! Invariant: every POST goes through [`Inner::post_with`], so every
//! refusal is sorted the same way (401/403: `Auth`, 404 on a session:
//! `SessionNotFound`, others: `Status` with the body's message and
//! JSON-RPC error), and an error body is read only up to
//! [`MAX_ERROR_BODY`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use tether_wire::RpcError;

use super::plain_http;
use super::{Inner, Kind};
use crate::error::{ClientError, ReqError};
use crate::sse::read_body;

/// Error bodies are read up to this size for their message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Connection establishment limit (the request itself has `request_timeout`).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn content_type(response: &reqwest::Response) -> String {
    response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase()
}

/// The message of an error body: a JSON-RPC error's message, a JSON
/// `error`/`message` field, or the start of the text.
pub(super) async fn error_message(response: reqwest::Response) -> String {
    refusal(response).await.0
}

/// A refusal's message, and the JSON-RPC error its body carries, if any.
async fn refusal(response: reqwest::Response) -> (String, Option<RpcError>) {
    let status = response.status();
    let body = read_body(response, MAX_ERROR_BODY).await.unwrap_or_default();
    let rpc = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.get("error").filter(|e| e.get("code").is_some()).map(RpcError::from_object));
    (refusal_message(status, &body), rpc)
}

fn refusal_message(status: StatusCode, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("error_description"))
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str);
        if let Some(m) = found {
            return m.to_owned();
        }
    }
    let text = text.trim();
    if text.is_empty() {
        return status.canonical_reason().unwrap_or("no details").to_owned();
    }
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace(['\n', '\r'], " ")
}

pub(super) fn http_client() -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| ClientError::Transport(format!("cannot set up the HTTP client: {e}")))
}

pub(super) fn check_url(url: &str) -> Result<reqwest::Url, ClientError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ClientError::Config(format!("{url:?} is not a valid URL ({e}); expected e.g. http://127.0.0.1:8787/mcp")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ClientError::Config(format!("{url}: only http:// and https:// URLs are supported")));
    }
    Ok(parsed)
}

pub(super) fn transport_error(url: &str, e: reqwest::Error) -> ClientError {
    let what = if e.is_connect() {
        "cannot connect"
    } else if e.is_timeout() {
        "timed out"
    } else {
        "request failed"
    };
    // reqwest's Display leaves out the cause ("connection refused" etc.).
    let mut cause = String::new();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        cause = s.to_string();
        source = s.source();
    }
    if cause.is_empty() {
        ClientError::Transport(format!("{what} to {url}: {e}"))
    } else {
        ClientError::Transport(format!("{what} to {url}: {cause}; is the server running there?"))
    }
}

impl Inner {
    fn has_session(&self) -> bool {
        self.session_id.get().is_some()
    }

    /// POSTs one message; refusals become errors (401/403: `Auth`, 404 on a
    /// session: `SessionNotFound`, others: `Status`).
    pub(super) async fn post(&self, url: &str, message: &Value) -> Result<reqwest::Response, ReqError> {
        self.post_with(url, message, &[]).await
    }

    /// [`Self::post`] with headers of this request's own (`Mcp-Param-*`).
    pub(super) async fn post_with(
        &self,
        url: &str,
        message: &Value,
        extra: &[(String, String)],
    ) -> Result<reqwest::Response, ReqError> {
        let headers = || {
            let mut headers = self.post_headers(message);
            for (name, value) in extra {
                if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
                    headers.insert(name, value);
                }
            }
            headers
        };
        let body = serde_json::to_vec(message).map_err(|e| ClientError::Transport(format!("cannot encode the message: {e}")))?;
        let body = bytes::Bytes::from(body);
        let plain = self.plain.as_ref().filter(|_| url == self.url);
        let response = match plain {
            Some(plain) => match plain.post(headers(), body.clone()).await {
                // reqwest follows redirects; this path does not.
                Ok(response) if response.status().is_redirection() => None,
                Ok(response) => Some(response),
                Err(plain_http::Failure::Connect(cause)) => {
                    return Err(ClientError::Transport(format!(
                        "cannot connect to {}: {cause}; is the server running there?",
                        self.url
                    ))
                    .into());
                }
                Err(plain_http::Failure::Request(cause)) => {
                    return Err(ClientError::Transport(format!("request failed to {}: {cause}", self.url)).into());
                }
            },
            None => None,
        };
        let response = match response {
            Some(response) => response,
            None => self.http.post(url).headers(headers()).body(body).send().await.map_err(|e| transport_error(&self.url, e))?,
        };
        self.check_status(response).await
    }

    async fn check_status(&self, response: reqwest::Response) -> Result<reqwest::Response, ReqError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let message = error_message(response).await;
            return Err(ReqError::Client(ClientError::Auth { status: status.as_u16(), message }));
        }
        let is_legacy = matches!(self.kind, Kind::Legacy(_));
        if status == StatusCode::NOT_FOUND && (self.has_session() || is_legacy) {
            return Err(ReqError::Client(ClientError::SessionNotFound));
        }
        let (message, rpc) = refusal(response).await;
        Err(ReqError::Status { status: status.as_u16(), message, url: self.url.clone(), rpc })
    }

    /// POSTs a notification or a response (answered 202, or 200 by some servers).
    pub(super) async fn send_one_way(&self, message: &Value) -> Result<(), ReqError> {
        let url = match &self.kind {
            Kind::Streamable => self.url.as_str(),
            Kind::Legacy(channel) => {
                if !channel.alive.load(Ordering::Acquire) {
                    return Err(ClientError::SessionNotFound.into());
                }
                channel.endpoint.as_str()
            }
        };
        let send = self.post(url, message);
        let response = tokio::time::timeout(self.options.request_timeout, send)
            .await
            .map_err(|_| ClientError::Transport(format!("no answer from {} to a notification", self.url)))??;
        drop(response);
        Ok(())
    }
}
