//! POSTs to a plain `http://` server on kept-alive HTTP/1.1 connections of
//! our own, beside reqwest.
//!
//! A gateway sends every forwarded request through here, so the per-request
//! cost of the client matters as much as the server's: measured in the
//! `gateway_http` bench, reqwest's layers (URL parsing, the retry and
//! redirect services, the shared pool) cost about as much CPU as the rest
//! of the upstream hop. This keeps only what an MCP POST needs: one hyper
//! connection per request in flight, reused for the next one once its
//! answer is read (an answer its caller stopped reading is finished by the
//! next request first, bounded), at most [`MAX_IDLE`] kept idle.
//!
//! A connection has no task of its own: the request that holds it drives
//! it (sending, then reading the answer through the body), so an exchange
//! wakes one task instead of handing every step between two (measured:
//! one spawned task per connection cost several percent of a gateway's
//! CPU per call). An idle connection is driven by nobody; one the server
//! closed meanwhile is found when it is taken (it is not ready, or gives
//! the request back unsent) and dropped.
//!
//! Everything else stays with reqwest: TLS, proxies (any proxy variable in
//! the environment turns this path off), redirects (a 3xx answer here is
//! re-sent through reqwest, which follows it), GET streams and DELETE. The
//! answer is handed back as a `reqwest::Response`, so reading it is the
//! same code for both.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use reqwest::header::{HOST, HeaderMap, HeaderValue};
use tokio::net::TcpStream;

/// Idle connections kept per session (more in flight at once is fine; the
/// extra ones close when done).
const MAX_IDLE: usize = 16;
/// What is read of a dropped body to reach its end; beyond it, the connection closes.
const DRAIN_LIMIT: usize = 64 * 1024;
/// How long a kept connection may take to be ready for the next request
/// (the end of its last answer read) before another is opened.
const READY_WAIT: Duration = Duration::from_millis(100);

/// Why a POST on this path failed.
pub(crate) enum Failure {
    /// No connection could be made (nothing was sent).
    Connect(String),
    /// The request went out on a connection that then failed.
    Request(String),
}

type Idle = Arc<Mutex<Vec<Conn>>>;
/// hyper's I/O side of one connection.
type ConnectionIo = Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

/// One HTTP/1 connection: the handle requests go in by, and the I/O state
/// machine whoever uses the connection polls.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// The I/O state machine; `None` once it finished (the server closed, or
    /// an error). Dropped then, not kept: it holds the requests queued on
    /// the connection, and dropping them is what gives them back unsent.
    io: Option<ConnectionIo>,
    /// The end of the last answer, which its reader dropped before reading
    /// it all (it had what it wanted): read, within [`DRAIN_LIMIT`], before
    /// the connection carries the next request.
    leftover: Option<Incoming>,
    leftover_read: usize,
}

impl Conn {
    /// Makes progress on the connection's I/O; false once it has ended.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(io) = self.io.as_mut()
            && io.as_mut().poll(cx).is_ready()
        {
            self.io = None;
        }
        self.io.is_some()
    }

    /// Drives the connection while `work` runs (`work` needs it to move).
    async fn with<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            // The connection may have delivered what `work` waits for, or
            // ended (which hands `work` its request back).
            self.drive(cx);
            work.as_mut().poll(cx)
        })
        .await
    }

    /// Reads what is left of the last answer; false if the connection
    /// cannot be reused (it broke, or too much was left).
    fn poll_leftover(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut drove = false;
        while let Some(body) = self.leftover.as_mut() {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    self.leftover_read += frame.data_ref().map_or(0, Bytes::len);
                    if self.leftover_read > DRAIN_LIMIT {
                        return Poll::Ready(false);
                    }
                    drove = false;
                }
                Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                Poll::Ready(None) => self.leftover = None,
                Poll::Pending if !drove => {
                    drove = true;
                    if !self.drive(cx) {
                        return Poll::Ready(false);
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(true)
    }

    /// Whether the connection can take a request: the rest of the last
    /// answer read, then driven until its dispatcher says so (at once for
    /// one whose last answer was read to the end) or it ends.
    async fn ready(&mut self) -> bool {
        std::future::poll_fn(|cx| {
            match self.poll_leftover(cx) {
                Poll::Ready(true) => {}
                Poll::Ready(false) => return Poll::Ready(false),
                Poll::Pending => return Poll::Pending,
            }
            if let Poll::Ready(r) = self.sender.poll_ready(cx) {
                return Poll::Ready(r.is_ok());
            }
            let alive = self.drive(cx);
            match self.sender.poll_ready(cx) {
                Poll::Ready(r) => Poll::Ready(r.is_ok()),
                Poll::Pending if !alive => Poll::Ready(false),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
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
    idle: Idle,
    /// The URL reqwest's response carries, made once: without it, reqwest
    /// parses a placeholder URL for every response.
    response_url: hyper::http::Extensions,
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
        let response_url = {
            use reqwest::ResponseBuilderExt;
            let url = reqwest::Url::parse(url).ok()?;
            hyper::Response::builder().url(url).body(()).ok()?.into_parts().0.extensions
        };
        Some(Self {
            host,
            port,
            authority: HeaderValue::from_str(authority.as_str()).ok()?,
            target,
            connect_timeout,
            idle: Arc::new(Mutex::new(Vec::new())),
            response_url,
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
        while let Some(mut conn) = self.take_idle() {
            if !matches!(tokio::time::timeout(READY_WAIT, conn.ready()).await, Ok(true)) {
                continue;
            }
            let sent = conn.sender.try_send_request(request);
            match conn.with(sent).await {
                Ok(response) => return Ok(self.answer(response, conn)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(Failure::Request(e.into_error().to_string())),
                },
            }
        }
        let mut conn = self.connect().await.map_err(Failure::Connect)?;
        let sent = conn.sender.send_request(request);
        let response = conn.with(sent).await.map_err(|e| Failure::Request(e.to_string()))?;
        Ok(self.answer(response, conn))
    }

    fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock();
        idle.pop()
    }

    async fn connect(&self) -> Result<Conn, String> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect((self.host.as_str(), self.port)))
            .await
            .map_err(|_| format!("no connection within {}", humantime::format_duration(self.connect_timeout)))?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (sender, io) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        Ok(Conn { sender, io: Some(Box::pin(io)), leftover: None, leftover_read: 0 })
    }

    /// The connection goes back to the idle list once the body is read to
    /// its end (an HTTP/1 connection carries one exchange at a time).
    fn answer(&self, response: hyper::Response<Incoming>, conn: Conn) -> reqwest::Response {
        let (mut parts, inner) = response.into_parts();
        parts.extensions.extend(self.response_url.clone());
        let body = Reusing { inner: Some(inner), conn: Some(conn), idle: Arc::downgrade(&self.idle) };
        reqwest::Response::from(hyper::Response::from_parts(parts, reqwest::Body::wrap(body)))
    }
}

/// Whether the environment names a proxy (reqwest would use it; so must we).
fn proxy_configured(is_set: impl Fn(&str) -> bool) -> bool {
    ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"].iter().any(|var| is_set(var))
}

/// A response body that drives its connection while it is read and
/// returns it to the idle list once read to the end. Dropped before that (a
/// caller that stopped at the answer it wanted, with the stream's last
/// chunk still on its way), the connection goes back with the rest of the
/// body, which the next request reads first (see [`Conn::ready`]).
struct Reusing {
    /// `None` once read to its end.
    inner: Option<Incoming>,
    conn: Option<Conn>,
    idle: Weak<Mutex<Vec<Conn>>>,
}

fn keep_idle(idle: &Weak<Mutex<Vec<Conn>>>, conn: Conn) {
    let Some(idle) = idle.upgrade() else { return };
    if conn.io.is_none() || conn.sender.is_closed() {
        return;
    }
    let mut idle = idle.lock();
    if idle.len() < MAX_IDLE {
        idle.push(conn);
    }
}

impl Drop for Reusing {
    fn drop(&mut self) {
        let (Some(rest), Some(mut conn)) = (self.inner.take(), self.conn.take()) else { return };
        conn.leftover = Some(rest);
        conn.leftover_read = 0;
        keep_idle(&self.idle, conn);
    }
}

impl Body for Reusing {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else { return Poll::Ready(None) };
        let mut polled = Pin::new(&mut *inner).poll_frame(cx);
        if polled.is_pending()
            && let Some(conn) = this.conn.as_mut()
        {
            // It may have read more of the body, or ended (which ends the body).
            conn.drive(cx);
            polled = Pin::new(&mut *inner).poll_frame(cx);
        }
        if matches!(polled, Poll::Ready(None)) || inner.is_end_stream() {
            this.inner = None;
            if let Some(conn) = this.conn.take() {
                keep_idle(&this.idle, conn);
            }
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
