//! One request from start to its one final response: its slot among the
//! session's requests in flight (bounded; freed however the work ends), its
//! stream (or a JSON answer), its work in a task of its own that outlives the
//! connection, and the rendering of the result. A panic in the application,
//! a cancellation, or a shutdown that cannot wait ends the request with an
//! error response that is stored like any other.

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tether_store::StoreError;
use tether_wire::{RpcError, envelope};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::ctx::{RequestCtx, request_key};
use super::pump::{PumpSpec, spawn_pump};
use super::request_stream::{self, RequestStream};
use super::session::Session;
use super::{EngineError, Frame, INTERRUPTED_MESSAGE, Inner, PostOutcome};
use crate::app::{Authorized, RawResult};
use crate::ids::{self, EventId};

/// A request's work: what the application does with its context.
pub(crate) type Work = Box<dyn FnOnce(RequestCtx) -> BoxFuture<'static, Result<RawResult, RpcError>> + Send>;

/// The answer to a request whose application code panicked.
pub const PANICKED_MESSAGE: &str =
    "the server failed while handling this request (a bug: see the server log); the session is still usable";

/// A request's place in its session's in-flight map, freed on drop: when
/// the work returns, panics, or its task is dropped.
struct InflightSlot {
    session: Arc<Session>,
    key: String,
}

impl InflightSlot {
    /// Takes a slot, or says why not (a running request has this id; too many run).
    fn take(session: &Arc<Session>, key: String, cancel: CancellationToken, limit: usize) -> Result<Self, EngineError> {
        let mut inflight = session.inflight.lock();
        if inflight.contains_key(&key) {
            return Err(EngineError::BadRequest {
                code: tether_wire::code::INVALID_REQUEST,
                message: format!("request id {key} is already in use by a running request of this session"),
                id: None,
            });
        }
        if inflight.len() >= limit {
            return Err(EngineError::TooMany(format!(
                "this session already runs {} requests; wait for one to finish",
                inflight.len()
            )));
        }
        inflight.insert(key.clone(), cancel);
        Ok(Self { session: session.clone(), key })
    }
}

impl Drop for InflightSlot {
    fn drop(&mut self) {
        self.session.inflight.lock().remove(&self.key);
    }
}

/// Runs `work`, racing cancellation and the end of the shutdown grace, and
/// renders the JSON-RPC response. A panic becomes `-32603`.
async fn run_work(inner: &Inner, ctx: RequestCtx, work: Work, cancel: CancellationToken) -> Bytes {
    let id = ctx.request_id().clone();
    match run_outcome(inner, ctx, work, cancel).await {
        Ok(raw) => envelope::raw_result_message(&id, &raw),
        Err(e) => envelope::error_message(Some(&id), &e),
    }
}

/// [`run_work`]'s outcome before it is rendered.
pub(crate) async fn run_outcome(
    inner: &Inner,
    ctx: RequestCtx,
    work: Work,
    cancel: CancellationToken,
) -> Result<RawResult, RpcError> {
    let id = ctx.request_id().clone();
    let session = ctx.session().map(|s| s.session_id().to_owned()).unwrap_or_default();
    let guarded = std::panic::AssertUnwindSafe(work(ctx)).catch_unwind();
    let result = tokio::select! {
        r = guarded => r.unwrap_or_else(|panic| {
            let what = panic_message(&panic);
            tracing::error!(%session, request = %id, panic = %what, "the application panicked; the request ends with -32603");
            Err(RpcError::internal(PANICKED_MESSAGE))
        }),
        _ = cancel.cancelled() => Err(RpcError::cancelled()),
        _ = inner.life.interrupt.cancelled() => Err(RpcError::internal(INTERRUPTED_MESSAGE)),
    };
    if let Err(e) = &result {
        crate::trace::record_error(e);
    }
    result
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// What the engine keeps of a request's envelope and transport for its work.
pub(crate) struct RequestHead {
    pub id: Value,
    pub progress_token: Option<Value>,
    /// What the HTTP front established about it, for the application (never stored).
    pub authorized: Option<Authorized>,
}

impl Inner {
    /// Registers a request, opens its stream (unless JSON mode) and runs
    /// `work` in its own task, which outlives the connection.
    pub(crate) async fn start_request(
        self: Arc<Self>,
        session: Arc<Session>,
        head: RequestHead,
        method: &str,
        reply: super::Reply,
        work: Work,
    ) -> Result<PostOutcome, EngineError> {
        let RequestHead { id, progress_token, authorized } = head;
        if self.life.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let cancel = CancellationToken::new();
        let timer = crate::metrics::request_started(method);
        let slot = InflightSlot::take(&session, request_key(&id), cancel.clone(), self.config.max_inflight_per_session)?;
        let session_id = session.id.clone();
        if reply == super::Reply::Json {
            let (tx, rx) = oneshot::channel();
            let ctx =
                RequestCtx::new(self.clone(), session.clone(), None, id.clone(), progress_token, cancel.clone(), authorized);
            let inner = self.clone();
            self.life.spawn_request(async move {
                let _slot = slot;
                let body = run_work(&inner, ctx, work, cancel).await;
                timer.done();
                let _ = tx.send(body);
            });
            return Ok(PostOutcome::Json { body: rx, session_id });
        }

        let (stream, attachment, quick) = RequestStream::new(ids::new_request_stream(), id.clone(), method);
        let name = stream.name.clone();
        let running = self.running.enter(&stream, &session.id);
        let request_id = id.clone();
        let ctx =
            RequestCtx::new(self.clone(), session.clone(), Some(stream.clone()), id, progress_token, cancel.clone(), authorized);
        let prime_delay = self.config.prime_delay;
        let worker_session = session.clone();
        let inner = self.clone();
        let cancel_work = cancel.clone();
        let refused_id = request_id.clone();
        // A request's stream is where the work's deferred writes are
        // checked (`tether_store::fence`); JSON answers are not stored, so
        // JSON mode above defers nothing.
        self.life.spawn_request(tether_store::fence::scope(async move {
            // Both held until the final response is stored (or given up).
            let (_slot, _running) = (slot, running);
            let session = worker_session;
            let mut work = std::pin::pin!(run_work(&inner, ctx, work, cancel));
            let payload = tokio::select! {
                payload = &mut work => payload,
                _ = tokio::time::sleep(prime_delay) => {
                    // Slow work: give the client an event ID to resume from now.
                    // The work is polled meanwhile: it may be priming the
                    // stream itself (a notification), holding the stream's
                    // lock until its commit returns, and waiting for that
                    // lock without polling it would wait forever.
                    let prime = async {
                        if let Err(e) = stream.ensure_primed(&inner.events, &session.id).await {
                            // The POST was answered 503 ("not stored, send it
                            // again"): work nobody waits for is stopped.
                            tracing::warn!(session = %session.id, error = %e, "could not store a priming event; the request was refused with 503 and is cancelled");
                            cancel_work.cancel();
                        }
                    };
                    let ((), payload) = tokio::join!(prime, &mut work);
                    payload
                }
            };
            if left_to_next_process(&inner, &session, &stream) {
                return;
            }
            if !session.closed.is_cancelled() {
                store_final(&inner, &session, &stream, &request_id, payload).await;
            }
            timer.done();
        }));
        let mut primed = None;
        match quick.await {
            Ok(request_stream::Quick::Done { response_seq, response }) => {
                let frames = vec![
                    Frame::Prime { id: EventId::new(&name, response_seq.saturating_sub(1)) },
                    Frame::Event { id: EventId::new(&name, response_seq), data: response },
                ];
                return Ok(PostOutcome::Complete { frames, session_id });
            }
            // Nothing of the request was stored or sent: say so at once.
            Ok(request_stream::Quick::Failed(reason)) => return Err(EngineError::NotStored { id: refused_id, reason }),
            Ok(request_stream::Quick::Stream { prime_seq }) => primed = Some(prime_seq),
            Err(_) => {}
        }
        // Slow or chatty work: follow the stream from the store. The
        // priming event's ID (committed) goes first, before anything is read:
        // if the store cannot be read (a replica cut off from Redis), the
        // client still holds an ID to resume from elsewhere, instead of a
        // 200 stream that ends with nothing.
        let sub = self.hub.subscribe(&session.id, &name, super::live::StreamKind::Request);
        let spec = PumpSpec {
            after: primed.unwrap_or(0),
            first: primed.map(|seq| Frame::Prime { id: EventId::new(&name, seq) }),
            stream: name,
            catch_up: true,
            close_on_final: true,
            standalone_generation: None,
            attachment: Some(attachment),
        };
        let frames = spawn_pump(self.pumps.clone(), self.clone(), session, spec, sub);
        Ok(PostOutcome::Stream { frames, session_id })
    }
}

impl Inner {
    /// Runs [`McpApp::recover_request`](crate::McpApp::recover_request) for a
    /// request a crash cut off, in a task of its own, as the request's work:
    /// its slot among the session's requests (so the client can cancel it),
    /// its stream as it was, its one final response stored at the end.
    pub(crate) fn carry_on_request(
        self: Arc<Self>,
        session: Arc<Session>,
        stream: &str,
        id: Value,
        progress_token: Option<Value>,
        cut_off: crate::app::CutOff,
    ) {
        let cancel = CancellationToken::new();
        // No limit: the request was admitted once already.
        let slot = match InflightSlot::take(&session, request_key(&id), cancel.clone(), usize::MAX) {
            Ok(slot) => Some(slot),
            Err(e) => {
                tracing::warn!(session = %session.id, %stream, error = %e, "a carried-on request runs outside the in-flight map (the client cannot cancel it)");
                None
            }
        };
        let stream = RequestStream::recovered(stream.to_owned(), id.clone(), &cut_off.method);
        let running = self.running.enter(&stream, &session.id);
        let ctx = RequestCtx::new(
            self.clone(),
            session.clone(),
            Some(stream.clone()),
            id.clone(),
            progress_token,
            cancel.clone(),
            None,
        );
        let app = self.app_of(&session);
        let work: Work = Box::new(move |ctx| Box::pin(async move { app.recover_request(ctx, cut_off).await }));
        let inner = self.clone();
        self.life.spawn_request(tether_store::fence::scope(async move {
            let (_slot, _running) = (slot, running);
            let payload = run_work(&inner, ctx, work, cancel).await;
            if left_to_next_process(&inner, &session, &stream) {
                return;
            }
            if !session.closed.is_cancelled() {
                store_final(&inner, &session, &stream, &id, payload).await;
            }
        }));
    }
}

/// Whether a request the drain interrupted is left open for the next
/// process rather than ended (see [`RequestCtx::outlives_process`]).
fn left_to_next_process(inner: &Inner, session: &Session, stream: &RequestStream) -> bool {
    let left = inner.life.interrupt.is_cancelled() && stream.outlives_process();
    if left {
        tracing::info!(session = %session.id, stream = %stream.name, "the drain ran out: the request is left to the next process, which carries it on");
    }
    left
}

/// The longest pause between two attempts to store a primed request's final response.
const FINAL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Stores a request's final response (an error response instead when a
/// write it deferred failed). A request that was never primed and cannot be
/// stored was refused with 503 (its POST heard [`request_stream::Quick::Failed`]),
/// so nothing of it exists anywhere. A primed one may be followed by a
/// client holding its priming event's ID, and it must end with exactly one
/// stored final response: the store is asked again, with backoff, until it
/// takes it (a full disk that got space) or the server's drain ends (the
/// next start then closes the request as interrupted).
async fn store_final(inner: &Inner, session: &Arc<Session>, stream: &RequestStream, request_id: &Value, payload: Bytes) {
    let mut payload = payload;
    let mut stored = stream.finish(&inner.events, &session.id, payload.clone()).await;
    if let Err(StoreError::EarlierWriteFailed(why)) = &stored {
        let error = RpcError::internal(format!("the request's changes were not stored: {why}"));
        payload = envelope::error_message(Some(request_id), &error);
        stored = stream.finish(&inner.events, &session.id, payload.clone()).await;
    }
    let Err(first) = stored else { return };
    if !stream.is_primed().await {
        tracing::warn!(session = %session.id, error = %first, "could not store a response; the request was refused with 503 (nothing of it was stored or sent)");
        return;
    }
    tracing::error!(session = %session.id, error = %first, "could not store a final response; retrying until the store takes it (its stream waits meanwhile)");
    let mut pause = std::time::Duration::from_millis(100);
    // A store that tracks its failures says when commits work again: try
    // then, not up to a whole backoff later (the client waits meanwhile).
    let mut recovered = inner.store.write_recoveries();
    loop {
        let recovery = async {
            let changed = match recovered.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => false,
            };
            if !changed {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = recovery => {}
            () = inner.life.interrupt.cancelled() => {
                tracing::error!(session = %session.id, "a final response is still not stored at shutdown; the next start closes the request as interrupted");
                return;
            }
            () = session.closed.cancelled() => return,
        }
        match stream.finish(&inner.events, &session.id, payload.clone()).await {
            Ok(()) => {
                tracing::info!(session = %session.id, "the final response is stored after all");
                return;
            }
            Err(e) => tracing::debug!(session = %session.id, error = %e, "the final response is still not stored"),
        }
        pause = (pause * 2).min(FINAL_RETRY_MAX);
    }
}
