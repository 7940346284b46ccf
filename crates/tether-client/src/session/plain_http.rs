//! POSTs to a plain `http://` server on kept-alive HTTP/1.1 connections of
//! our own, beside reqwest.
//!
//! A gateway sends every forwarded request through here, so the per-request
//! cost of the client matters as much as the server's: measured in the
//! `gateway_http` bench, reqwest's layers (URL parsing, the retry and
//! redirect services, the shared pool) cost about as much CPU as the rest
//! of the upstream hop. This keeps only what an MCP POST needs: one hyper
//! connection per request in flight, reused once its response has been read
//! to the end, at most [`MAX_IDLE`] kept idle.
//!
//! Everything else stays with reqwest: TLS, proxies (any proxy variable in
//! the environment turns this path off), redirects (a 3xx answer here is
//! re-sent through reqwest, which follows it), GET streams and DELETE. The
//! answer is handed back as a `reqwest::Response`, so reading it is the
//! same code for both.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use reqwest::header::{HOST, HeaderMap, HeaderValue};

/// Idle connections kept per session (more in flight at once is fine; the
/// extra ones close when done).
const MAX_IDLE: usize = 16;
/// What is read of a dropped body to reach its end; beyond it, the connection closes.
const DRAIN_LIMIT: usize = 64 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);
/// How long a request waits for a kept connection to finish its last
/// exchange before it opens another.
const READY_WAIT: Duration = Duration::from_millis(100);

/// Why a POST on this path failed.
pub(crate) enum Failure {
    /// No connection could be made (nothing was sent).
    Connect(String),
    /// The request went out on a connection that then failed.
    Request(String),
}

/// Where one server is, for connections of our own; see the module doc.
pub(crate) struct PlainHttp {
    host: String,
    port: u16,
    /// `Host` header value.
    authority: HeaderValue,
    /// The request target (origin form: path and query).
    target: hyper::Uri,
    connect_timeout: Duration,
    idle: Arc<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl PlainHttp {
    /// `Some` for an `http://` URL when no proxy is configured in the
    /// environment; `None` sends everything through reqwest.
    pub(crate) fn for_url(url: &str, connect_timeout: Duration) -> Option<Self> {
        if proxy_configured(|var| std::env::var_os(var).is_some()) {
            return None;
        }
        let uri: hyper::Uri = url.parse().ok()?;
        if uri.scheme_str() != Some("http") {
            return None;
        }
        let authority = uri.authority()?;
        let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
        let port = authority.port_u16().unwrap_or(80);
        let target = uri.path_and_query().map_or("/", |p| p.as_str()).parse().ok()?;
        Some(Self {
            host,
            port,
            authority: HeaderValue::from_str(authority.as_str()).ok()?,
            target,
            connect_timeout,
            idle: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// POSTs `body` with `headers`; the answer as reqwest would give it.
    pub(crate) async fn post(&self, mut headers: HeaderMap, body: Bytes) -> Result<reqwest::Response, Failure> {
        headers.insert(HOST, self.authority.clone());
        let mut request = hyper::Request::post(self.target.clone())
            .body(Full::new(body))
            .map_err(|e| Failure::Request(format!("cannot build the request: {e}")))?;
        *request.headers_mut() = headers;
        // A kept connection the server closed meanwhile gives the request
        // back unsent; it then goes on a new connection.
        while let Some(mut sender) = self.take_idle() {
            // Ready once the connection finished its last exchange (maybe
            // still draining the end of a stream its caller stopped reading).
            if !matches!(tokio::time::timeout(READY_WAIT, sender.ready()).await, Ok(Ok(()))) {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.answer(response, sender)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(Failure::Request(e.into_error().to_string())),
                },
            }
        }
        let mut sender = self.connect().await.map_err(Failure::Connect)?;
        let response = sender.send_request(request).await.map_err(|e| Failure::Request(e.to_string()))?;
        Ok(self.answer(response, sender))
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| format!("no connection within {}", humantime::format_duration(self.connect_timeout)))?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        // Ends when the server closes, or once every sender is dropped.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("an upstream connection ended: {e}");
            }
        });
        Ok(sender)
    }

    /// The connection goes back to the idle list once the body is read to
    /// its end (an HTTP/1 connection carries one exchange at a time).
    fn answer(&self, response: hyper::Response<Incoming>, sender: SendRequest<Full<Bytes>>) -> reqwest::Response {
        let (parts, inner) = response.into_parts();
        let mut body = Reusing { inner: Some(inner), sender: Some(sender), idle: Arc::downgrade(&self.idle) };
        if body.inner.as_ref().is_some_and(Body::is_end_stream) {
            body.give_back();
        }
        reqwest::Response::from(hyper::Response::from_parts(parts, reqwest::Body::wrap(body)))
    }
}

/// Whether the environment names a proxy (reqwest would use it; so must we).
fn proxy_configured(is_set: impl Fn(&str) -> bool) -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"].iter().any(|var| is_set(var))
}

/// A response body that returns its connection when read to the end.
/// Dropped before that (a caller that stopped at the answer it wanted, with
/// the stream's last chunk still on its way), the connection is kept and
/// the rest is read in the background, within [`DRAIN_LIMIT`] and
/// [`DRAIN_TIME`] (beyond them the connection closes).
struct Reusing {
    /// `None` once handed to the drain.
    inner: Option<Incoming>,
    sender: Option<SendRequest<Full<Bytes>>>,
    idle: Weak<Mutex<Vec<SendRequest<Full<Bytes>>>>>,
}

impl Reusing {
    fn give_back(&mut self) {
        if let Some(sender) = self.sender.take() {
            keep_idle(&self.idle, sender);
        }
    }
}

fn keep_idle(idle: &Weak<Mutex<Vec<SendRequest<Full<Bytes>>>>>, sender: SendRequest<Full<Bytes>>) {
    let Some(idle) = idle.upgrade() else { return };
    let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
    if idle.len() < MAX_IDLE {
        idle.push(sender);
    }
}

impl Drop for Reusing {
    fn drop(&mut self) {
        let Some(mut body) = self.inner.take() else { return };
        if self.sender.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        // Kept at once: the next request waits (briefly) for the drain.
        self.give_back();
        runtime.spawn(async move {
            let mut read = 0;
            let _ = tokio::time::timeout(DRAIN_TIME, async {
                while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut body).await {
                    read += frame.data_ref().map_or(0, Bytes::len);
                    if read > DRAIN_LIMIT {
                        return;
                    }
                }
            })
            .await;
            // Dropping a body not read to its end closes its connection.
        });
    }
}

impl Body for Reusing {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || inner.is_end_stream() {
            self.give_back();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_without_a_proxy_takes_this_path() {
        let none = |_: &str| false;
        assert!(!proxy_configured(none));
        assert!(proxy_configured(|v: &str| v == "HTTP_PROXY"));
        assert!(proxy_configured(|v: &str| v == "all_proxy"));
        let timeout = Duration::from_secs(1);
        let plain = PlainHttp::for_url("http://127.0.0.1:8080/mcp/echo?x=1", timeout);
        if let Some(plain) = plain {
            assert_eq!(plain.port, 8080);
            assert_eq!(plain.host, "127.0.0.1");
            assert_eq!(plain.target, "/mcp/echo?x=1");
            assert_eq!(plain.authority, "127.0.0.1:8080");
        } else {
            // The test environment itself sets a proxy.
            assert!(proxy_configured(|v| std::env::var_os(v).is_some()));
        }
        assert!(PlainHttp::for_url("https://example.com/mcp", timeout).is_none());
        if let Some(v6) = PlainHttp::for_url("http://[::1]/mcp", timeout) {
            assert_eq!((v6.host.as_str(), v6.port), ("::1", 80));
        }
    }
}
