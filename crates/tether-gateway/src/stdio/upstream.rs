//! [`StdioUpstream`]: a running child as an [`Upstream`]. A request is one
//! exchange: its line written to the child's stdin by the request's own
//! task ([`Stdin`]: a shared writer, or frames to the keeper), its answer awaited
//! (bounded by `request_timeout`, but `initialize`), and, if the caller
//! stops waiting first, its waiting entry gone and the child told with
//! `notifications/cancelled` ([`InFlight`]). A kept child's requests are
//! tagged with their client request and outlive the engine (see
//! [`crate::stdio::kept`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tether_wire::shared_writer::{Message, SharedWriter};
use tether_wire::{RpcError, envelope};
use tokio::net::unix::pipe;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use super::{CLOSE_WAIT, Shared};
use crate::upstream::{PeerMessage, Upstream, UpstreamError, UpstreamResult};

/// A running child, as an [`Upstream`]. Dropping it stops the child.
pub struct StdioUpstream {
    pub(crate) shared: Arc<Shared>,
    pub(crate) stdin: Stdin,
    pub(crate) next_id: AtomicU64,
    pub(crate) kill: Arc<Notify>,
    /// How the child ended, once it has (`"exited (exit status: 3)"`).
    pub(crate) exited: watch::Receiver<Option<String>>,
    /// How long a request (but `initialize`) may wait for its answer.
    pub(crate) request_timeout: Duration,
}

/// Where the child's stdin lines go, written by the task that sends them
/// (no writer task between): the stdin pipe of a child of this process,
/// or numbered frames to the keeper for a child it holds.
pub(crate) enum Stdin {
    Pipe(SharedWriter<pipe::Sender>),
    Kept(Arc<crate::stdio::kept::KeptChild>),
}

/// Bytes of lines waiting for a child's stdin pipe, at most (plus one line):
/// a child that stops reading holds its callers here.
pub(crate) const STDIN_BYTES: usize = 1 << 20;

impl StdioUpstream {
    /// The keeper's part, for a child the keeper holds.
    fn kept(&self) -> Option<&Arc<crate::stdio::kept::KeptChild>> {
        match &self.stdin {
            Stdin::Kept(kept) => Some(kept),
            Stdin::Pipe(_) => None,
        }
    }
}

impl Stdin {
    /// Sends `line` (a kept child's request tagged `tag`: see
    /// [`crate::stdio::kept`]; else empty), waiting for room.
    async fn send(&self, line: Bytes, tag: Bytes) -> Result<(), String> {
        match self {
            Self::Pipe(writer) => writer.send(Message::line(line)).await.map_err(|e| e.to_string()),
            Self::Kept(kept) => kept.write(tag, line).await,
        }
    }

    /// Sends `line` if there is room now.
    fn try_send(&self, line: Bytes) -> Result<(), String> {
        match self {
            Self::Pipe(writer) => writer.try_send(Message::line(line)).map_err(|e| e.to_string()),
            Self::Kept(kept) => kept.try_write(line),
        }
    }
}

impl StdioUpstream {
    /// Sends request `id` (its line tagged `tag`) and waits for its answer,
    /// bounded by `request_timeout` (but `initialize`); with the hold on
    /// the answer's frame, for a kept child.
    /// `cancelled`: the client request's cancellation; with it, dropping the
    /// exchange tells the child only if the client cancelled (else the
    /// process is leaving the call to the next engine).
    async fn exchange(
        &self,
        id: u64,
        tag: Bytes,
        method: &str,
        mut params: Option<Value>,
        cancelled: Option<tokio_util::sync::CancellationToken>,
    ) -> Result<(Box<RawValue>, Option<crate::stdio::kept::FrameHold>), UpstreamError> {
        // The W3C trace context of this request's span (`--otlp-endpoint`):
        // a child has no headers, so it goes in `params._meta`.
        tether_server::trace::inject_meta(&mut params);
        let (tx, rx) = oneshot::channel();
        self.shared.register(id, tx)?;
        // `initialize` is bounded by the caller (`upstream_init_timeout`).
        let initialize = method == "initialize";
        let mut in_flight = InFlight {
            upstream: self,
            id,
            sent: false,
            done: false,
            cancellable: !initialize,
            reason: Cow::Borrowed("the gateway's client is no longer waiting for this request"),
            unless_left: cancelled,
        };
        let line = envelope::outbound_message(Some(&json!(id)), method, params.as_ref());
        // Queuing the line counts too: a child that stops reading its stdin
        // holds a request no longer than one that never answers.
        let exchange = async {
            self.write(line, tag).await?;
            in_flight.sent = true;
            let answer = rx.await;
            in_flight.done = true;
            // A dropped sender means the connection ended without a word.
            let answer = answer.unwrap_or(Err(UpstreamError::Restarted));
            let hold = self.shared.frames.as_ref().and_then(|frames| frames.take_hold(id));
            answer.map(|a| (a, hold))
        };
        if initialize {
            return exchange.await;
        }
        match tokio::time::timeout(self.request_timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => {
                let waited = humantime::format_duration(self.request_timeout);
                let shared = &self.shared;
                tracing::warn!(upstream = %shared.upstream, session = %shared.session, "request {id} ({method:?}) got no answer within {waited} (request_timeout); ending it and cancelling it upstream");
                in_flight.reason =
                    format!("no answer within {waited}, the request_timeout of tether's upstream {}", shared.upstream).into();
                in_flight.unless_left = None;
                // Dropping it removes the waiting entry and sends the cancellation.
                drop(in_flight);
                Err(self.timed_out(method).into())
            }
        }
    }

    /// The error of a request that got no answer within `request_timeout`.
    fn timed_out(&self, method: &str) -> RpcError {
        let (name, waited) = (&self.shared.upstream, humantime::format_duration(self.request_timeout));
        let message = format!(
            "upstream {name} did not answer {method} within {waited} (its request_timeout), so tether ended the request and cancelled it upstream; it may or may not have taken effect. If its calls take this long, raise request_timeout in [upstreams.{name}]"
        );
        let timeout_ms = u64::try_from(self.request_timeout.as_millis()).unwrap_or(u64::MAX);
        RpcError::internal(message).with_data(json!({"upstream": name, "timeout": "request_timeout", "timeout_ms": timeout_ms}))
    }

    async fn send_line(&self, line: Bytes) -> Result<(), RpcError> {
        if !self.is_alive() {
            return Err(self.shared.gone().into());
        }
        self.write(line, Bytes::new()).await.map_err(RpcError::from)
    }

    async fn write(&self, line: Bytes, tag: Bytes) -> Result<(), UpstreamError> {
        self.stdin.send(line, tag).await.map_err(|e| {
            let shared = &self.shared;
            tracing::debug!(upstream = %shared.upstream, session = %shared.session, "writing to the child's stdin failed: {e}");
            shared.gone()
        })
    }

    /// How the child ended ("exited (exit status: 3)"), waiting at most `limit`.
    pub(super) async fn wait_exit(&self, limit: Duration) -> String {
        let mut exited = self.exited.clone();
        match tokio::time::timeout(limit, exited.wait_for(Option::is_some)).await {
            Ok(Ok(description)) => description.clone().unwrap_or_default(),
            _ => "ended".to_owned(),
        }
    }
}

impl Drop for StdioUpstream {
    fn drop(&mut self) {
        // The supervisor holds the child; this is what tells it to stop.
        self.kill.notify_one();
    }
}

/// A request in flight: if its future is dropped before the answer, the
/// waiting entry goes and the child is told with `notifications/cancelled`.
struct InFlight<'a> {
    upstream: &'a StdioUpstream,
    id: u64,
    /// The request line was queued for the child.
    sent: bool,
    /// Answered (or the connection ended): nothing to cancel.
    done: bool,
    /// The protocol forbids cancelling `initialize`.
    cancellable: bool,
    /// Why it is given up, as the child's `notifications/cancelled` says.
    reason: Cow<'static, str>,
    /// A kept child's call: cancelled upstream only when this token (the
    /// client's cancellation) was, or its time ran out.
    unless_left: Option<tokio_util::sync::CancellationToken>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped by a process that leaves a kept child's call to the next
        // engine (not by its client): the answer, when it comes, must stay
        // unacknowledged for that engine; noted before the request stops
        // waiting, so it cannot come in between.
        let left = self.unless_left.as_ref().is_some_and(|client| !client.is_cancelled());
        if left && let Some(frames) = &self.upstream.shared.frames {
            frames.leave_answer(self.id);
        }
        if !self.upstream.shared.give_up(self.id) || left {
            return;
        }
        if !self.sent || !self.cancellable || !self.upstream.is_alive() {
            return;
        }
        let params = json!({"requestId": self.id, "reason": self.reason});
        let line = envelope::outbound_message(None, "notifications/cancelled", Some(&params));
        // No await in drop: if the queue is full the child is far behind and
        // the answer, when it comes, is dropped as a late one.
        if let Err(e) = self.upstream.stdin.try_send(line) {
            let shared = &self.upstream.shared;
            tracing::debug!(upstream = %shared.upstream, session = %shared.session, "could not send notifications/cancelled for request {}: {e}", self.id);
        }
    }
}

#[async_trait]
impl Upstream for StdioUpstream {
    async fn request(&self, method: &str, params: Option<Value>) -> UpstreamResult {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // A kept child's answer is let go of at once: nobody stores it.
        self.exchange(id, Bytes::new(), method, params, None).await.map(|(answer, _)| answer)
    }

    fn keeps_calls(&self) -> bool {
        self.kept().is_some()
    }

    async fn request_for(
        &self,
        ctx: &tether_server::RequestCtx,
        method: &str,
        params: Option<Value>,
        progress: Option<&crate::progress::Progress>,
    ) -> UpstreamResult {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let Some(kept) = self.kept() else {
            return self.exchange(id, Bytes::new(), method, params, None).await.map(|(a, _)| a);
        };
        let tag = kept.tag_for(ctx, id, progress);
        // The call outlives this process: a drain that runs out leaves it
        // to the next engine, and the child is not told to cancel it then.
        ctx.outlives_process();
        let outcome = self.exchange(id, tag.clone(), method, params, Some(ctx.cancelled().clone())).await;
        let (answer, hold) = match outcome {
            Ok(answered) => answered,
            Err(e) => {
                kept.done(tag);
                return Err(e);
            }
        };
        kept.settle_after_final(ctx, hold, tag);
        Ok(answer)
    }

    fn cut_off_call(&self, key: &str) -> Option<crate::upstream::CutOffCall> {
        self.kept()?.cut_off_call(key)
    }

    async fn resume(&self, request_id: Value, _after: &str, messages: mpsc::Sender<PeerMessage>) -> UpstreamResult {
        let Some(kept) = self.kept() else { return Err(UpstreamError::Restarted) };
        kept.resume(&request_id, messages, self.request_timeout, &self.shared).await
    }

    async fn leave(&self) {
        if let Some(kept) = self.kept() {
            kept.leave();
        }
        self.close(false).await;
    }

    async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        self.send_line(envelope::outbound_message(None, method, params.as_ref())).await
    }

    async fn answer(&self, id: Value, outcome: Result<Value, RpcError>) -> Result<(), RpcError> {
        let line = match outcome {
            Ok(result) => envelope::result_message(&id, &result),
            Err(error) => envelope::error_message(Some(&id), &error),
        };
        self.send_line(line).await
    }

    fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    fn tag_session(&self, session: &str) {
        let mut tag = self.shared.session.0.write();
        if *tag != session {
            session.clone_into(&mut tag);
        }
    }

    /// Kills the child (and its process group) and waits for it, bounded.
    async fn close(&self, _end_session: bool) {
        self.kill.notify_one();
        let _ = self.wait_exit(CLOSE_WAIT).await;
    }
}
