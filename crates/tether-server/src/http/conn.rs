//! The accept loop and what every connection is held to, so that slow or
//! abandoned clients cannot exhaust the server: a cap on open connections
//! (`--max-connections`) and two timeouts on a connection that has no
//! request in progress (`--header-timeout`, `--idle-timeout`). The third
//! timeout, for a request's body, is where the body is read
//! (`validate::read_body`), because only the handler knows when it is done.
//!
//! A connection is in one of three phases:
//! - **head**: it opened, or the first bytes of its next request arrived;
//!   the request line and headers must be complete within `header_timeout`;
//! - **busy**: hyper handed a request to the router; no connection timeout
//!   runs until its response body has ended. SSE streams (a GET's
//!   standalone stream, a POST's response stream) are busy for as long as
//!   they are open, so no timeout here cuts them;
//! - **idle**: the last response ended and nothing of the next request has
//!   arrived; after `idle_timeout` the connection is closed.
//!
//! hyper's own `header_read_timeout` is not used: it starts when hyper begins
//! waiting for a request head, which on a keep-alive connection is the
//! moment the previous response ended, so it cannot tell an idle connection
//! from a slow head and would close every idle keep-alive connection after
//! the header timeout. The deadline is checked where hyper reads
//! ([`TimedIo`]): a read that would wait past it fails with `TimedOut`, and
//! hyper closes the connection (no response: there is no request to answer).
//!
//! Every request carries its connection's peer address as axum's
//! `ConnectInfo<SocketAddr>`, for what is limited per client address.
//!
//! Beyond the cap the loop stops accepting: new connections wait in the
//! kernel's listen backlog and are served, in order, as soon as one closes.
//! Refusing them instead (accept, then close or a canned 503) would cost a
//! system call and a socket per attempt during a flood and turn every
//! legitimate client's short wait into an error it must retry.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response};
use axum::routing::future::RouteFuture;
use bytes::Bytes;
use futures::task::AtomicWaker;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

/// What every connection of one listener is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// The warning that the cap is reached is repeated at most this often.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting, lets every connection finish its response (idle ones close at
/// once) and returns when all have closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut warned: Option<Instant> = None;
    loop {
        if slots.available_permits() == 0 && warned.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
            tracing::warn!(
                max = limits.max_connections,
                "all connections are in use (--max-connections): new ones wait until one closes"
            );
            warned = Some(Instant::now());
        }
        // `shutdown` is polled no more once it has resolved: both arms break.
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
        };
        // SSE responses are written in several small pieces.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "could not set TCP_NODELAY");
        }
        let state = Arc::new(ConnState::default());
        let io = TokioIo::new(TimedIo::new(tcp, state.clone(), limits));
        let service = ConnService { app: app.clone(), state, peer };
        let conn = hyper::server::conn::http1::Builder::new()
            // The connection's timeouts are `TimedIo`'s (see the module's comment).
            .header_read_timeout(None)
            .serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A failed `accept`: a connection that went away before it was accepted is
/// skipped; anything else (out of file descriptors) is logged and retried
/// after a pause, as axum's own loop does.
async fn accept_failed(e: io::Error) {
    if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset) {
        return;
    }
    tracing::error!(
        error = %e,
        "cannot accept connections (out of file descriptors? raise the process's file limit or lower --max-connections); retrying in 1 s"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// What the connection's reader learns from its requests: whether one is in
/// progress, and how many have ended (a change starts an idle period).
#[derive(Default)]
struct ConnState {
    busy: AtomicBool,
    finished: AtomicU64,
    /// The connection's task as of its last read that had to wait. When a
    /// response ends, hyper does not read again by itself (it would only
    /// with its own header timer), so the reader is woken to arm the idle
    /// timer; a read left waiting while the request was busy armed none.
    reader: AtomicWaker,
}

/// Held from the moment hyper hands a request to the router until its
/// response body has ended or was dropped.
struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Release);
        self.0.busy.store(false, Ordering::Release);
        self.0.reader.wake();
    }
}

/// The router as hyper's service, marking each request busy until its
/// response ends, and putting the peer's address on each.
struct ConnService {
    app: Router,
    state: Arc<ConnState>,
    peer: SocketAddr,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<GuardedBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, mut request: Request<Incoming>) -> ResponseFuture {
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        self.state.busy.store(true, Ordering::Release);
        let guard = RequestGuard(self.state.clone());
        let future = tower::Service::call(&mut self.app.clone(), request);
        ResponseFuture { future, guard: Some(guard) }
    }
}

pin_project! {
    /// The router's answer, its body wrapped with the request's guard.
    struct ResponseFuture {
        #[pin]
        future: RouteFuture<Infallible>,
        guard: Option<RequestGuard>,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<GuardedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match ready!(this.future.poll(cx)) {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let guard = this.guard.take();
        Poll::Ready(Ok(response.map(|body| GuardedBody { body, _guard: guard })))
    }
}

pin_project! {
    /// A response body that keeps its connection busy until hyper drops it
    /// (at its end, or when the connection closes).
    struct GuardedBody {
        #[pin]
        body: Body,
        _guard: Option<RequestGuard>,
    }
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Idle,
}

/// The TCP stream as hyper reads it: a read that would wait past the
/// phase's deadline fails with `TimedOut` (see the module's comment).
struct TimedIo {
    tcp: TcpStream,
    state: Arc<ConnState>,
    limits: Limits,
    /// `ConnState::finished` when this reader last looked.
    seen_finished: u64,
    phase: Phase,
    deadline: Instant,
    /// Armed only when a read has to wait (a quick request never touches
    /// the timer wheel while its head and body arrive at once).
    timer: Pin<Box<Sleep>>,
}

impl TimedIo {
    fn new(tcp: TcpStream, state: Arc<ConnState>, limits: Limits) -> Self {
        // A new connection owes its first request's head within the header timeout.
        let deadline = Instant::now() + limits.header_timeout;
        Self {
            tcp,
            state,
            limits,
            seen_finished: 0,
            phase: Phase::Head,
            deadline,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    fn timed_out(&self) -> io::Error {
        let what = match self.phase {
            Phase::Head => {
                format!("no complete request head within {:?} (--header-timeout)", self.limits.header_timeout)
            }
            Phase::Idle => format!("idle for {:?} (--idle-timeout)", self.limits.idle_timeout),
        };
        io::Error::new(io::ErrorKind::TimedOut, what)
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let busy = this.state.busy.load(Ordering::Acquire);
        if !busy {
            let finished = this.state.finished.load(Ordering::Acquire);
            if finished != this.seen_finished {
                // A response ended since the last read: an idle period starts.
                this.seen_finished = finished;
                this.phase = Phase::Idle;
                this.deadline = Instant::now() + this.limits.idle_timeout;
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if !busy && this.phase == Phase::Idle && buf.filled().len() > before {
                    // The next request began: its head has the header timeout.
                    this.phase = Phase::Head;
                    this.deadline = Instant::now() + this.limits.header_timeout;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if busy => {
                this.state.reader.register(cx.waker());
                Poll::Pending
            }
            Poll::Pending => {
                if this.timer.deadline() != this.deadline {
                    this.timer.as_mut().reset(this.deadline);
                }
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(this.timed_out())),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, data)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}
