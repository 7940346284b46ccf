//! What an application sees: [`RequestCtx`] for one running request (its
//! caller, its session if it has one, progress, related messages) and
//! [`SessionCtx`] for a session's context (durable app state, in-memory
//! local state, messages on the standalone stream). Where a related message
//! goes, and a request to the client, is `related.rs`'s.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_wire::envelope;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::request::RequestHead;
use super::request_stream::RequestStream;
use super::session::Session;
use super::sessionless::Sink;
use crate::app::{Authorized, Caller, RpcError};

/// Bounded retries of a state update racing with another writer.
const STATE_UPDATE_ATTEMPTS: usize = 8;

/// The key of a request id in the in-flight and pending maps.
pub(crate) fn request_key(id: &Value) -> String {
    id.to_string()
}

pub(crate) fn storage_error(e: impl std::fmt::Display) -> RpcError {
    RpcError::internal(format!("storage unavailable: {e}"))
}

/// The context of one session, for application state and messages not
/// related to a request (they go on the standalone stream).
#[derive(Clone)]
pub struct SessionCtx {
    inner: Arc<Inner>,
    session: Arc<Session>,
}

/// The context of one running request.
#[derive(Clone)]
pub struct RequestCtx {
    inner: Arc<Inner>,
    caller: Caller,
    session: Option<Arc<Session>>,
    stream: Option<Arc<RequestStream>>,
    request_id: Value,
    progress_token: Option<Value>,
    cancel: CancellationToken,
    authorized: Option<Authorized>,
    /// A sessionless request's response, where its notifications go.
    sink: Option<Sink>,
}

impl SessionCtx {
    pub(crate) fn new(inner: Arc<Inner>, session: Arc<Session>) -> Self {
        Self { inner, session }
    }

    /// The session's ID.
    pub fn session_id(&self) -> &str {
        &self.session.id
    }

    /// Whose session it is.
    pub fn principal(&self) -> &str {
        &self.session.principal
    }

    /// The client as it declared itself in this session's `initialize`.
    pub fn caller(&self) -> Caller {
        self.session.caller()
    }

    /// The protocol revision the session speaks.
    pub fn protocol_version(&self) -> String {
        self.session.protocol_version()
    }

    /// The capabilities the client declared in `initialize`.
    pub fn client_capabilities(&self) -> Value {
        self.session.client().client_capabilities.clone()
    }

    /// The application's durable per-session context.
    pub async fn app_state(&self) -> Map<String, Value> {
        self.session.durable.lock().await.state.app.clone()
    }

    /// The application's in-memory per-session state of type `T`, created
    /// with `T::default()` on first use. It lives as long as the session is
    /// held in memory (see [`EndReason`](crate::app::EndReason)); what must
    /// survive belongs in [`SessionCtx::app_state`].
    pub fn local<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.session.local::<T>()
    }

    /// Changes the application's per-session context with compare-and-set
    /// against the store; `f` may run more than once.
    pub async fn update_app_state(
        &self,
        mut f: impl FnMut(&mut Map<String, Value>) + Send,
    ) -> Result<Map<String, Value>, RpcError> {
        self.update_state(|state| f(&mut state.app)).await.map(|s| s.app)
    }

    pub(crate) async fn update_state(
        &self,
        mut f: impl FnMut(&mut super::SessionState) + Send,
    ) -> Result<super::SessionState, RpcError> {
        let store = &self.inner.store;
        let mut durable = self.session.durable.lock().await;
        for _ in 0..STATE_UPDATE_ATTEMPTS {
            let mut next = durable.state.clone();
            f(&mut next);
            let value = serde_json::to_value(&next).map_err(|e| RpcError::internal(e.to_string()))?;
            match store.update_session_state(&self.session.id, durable.revision, &value).await {
                Ok(Some(revision)) => {
                    durable.revision = revision;
                    durable.state = next.clone();
                    return Ok(next);
                }
                Ok(None) => {
                    // Somebody else (another replica) wrote first: reload and retry.
                    let fresh = store
                        .get_session(&self.session.id, tether_store::now_ms())
                        .await
                        .map_err(storage_error)?
                        .ok_or_else(|| RpcError::internal("session ended while updating it"))?;
                    durable.revision = fresh.revision;
                    durable.state = serde_json::from_value(fresh.state)
                        .map_err(|e| RpcError::internal(format!("stored session state unreadable: {e}")))?;
                }
                Err(e) => return Err(storage_error(e)),
            }
        }
        Err(RpcError::internal("session state kept changing underneath; try again"))
    }

    /// Runs `task` as part of this session's work: the engine tracks it, so
    /// shutdown waits for it (bounded). It should end by [`SessionCtx::closed`].
    pub fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.inner.life.spawn(task);
    }

    /// Completes when the session ends (DELETE, expiry, another replica
    /// ended it) or the server shuts down: background work of the session
    /// stops then.
    pub async fn closed(&self) {
        tokio::select! {
            _ = self.session.closed.cancelled() => {}
            _ = self.inner.life.shutdown.cancelled() => {}
        }
    }

    /// A notification on the standalone stream (stored, delivered when a GET listens).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        let payload = envelope::outbound_message(None, method, params.as_ref());
        self.inner.related.emit(&self.session, None, payload).await
    }

    /// A server-to-client request on the standalone stream.
    pub async fn request_client(&self, method: &str, params: Option<Value>, timeout: Duration) -> Result<Value, RpcError> {
        self.inner.related.request_client(&self.session, None, method, params, timeout).await
    }
}

impl RequestCtx {
    pub(crate) fn new(
        inner: Arc<Inner>,
        session: Arc<Session>,
        stream: Option<Arc<RequestStream>>,
        request_id: Value,
        progress_token: Option<Value>,
        cancel: CancellationToken,
        authorized: Option<Authorized>,
    ) -> Self {
        Self {
            caller: session.caller(),
            inner,
            session: Some(session),
            stream,
            request_id,
            progress_token,
            cancel,
            authorized,
            sink: None,
        }
    }

    /// A sessionless (2026-07-28) request's context.
    pub(crate) fn sessionless(
        inner: Arc<Inner>,
        caller: Caller,
        head: RequestHead,
        cancel: CancellationToken,
        sink: Sink,
    ) -> Self {
        let RequestHead { id, progress_token, authorized } = head;
        Self { inner, caller, session: None, stream: None, request_id: id, progress_token, cancel, authorized, sink: Some(sink) }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Who sent the request.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Who made the request.
    pub fn principal(&self) -> &str {
        &self.caller.principal
    }

    /// What the HTTP front established about this request (its verified
    /// token, claims and policy decision), if it came through the front.
    pub fn authorized(&self) -> Option<&Authorized> {
        self.authorized.as_ref()
    }

    /// The session the request belongs to; `None` for a request served
    /// without one.
    pub fn session(&self) -> Option<SessionCtx> {
        self.session.as_ref().map(|s| SessionCtx::new(self.inner.clone(), s.clone()))
    }

    /// The session, or the error a request that needs one answers with.
    pub fn require_session(&self) -> Result<SessionCtx, RpcError> {
        self.session().ok_or_else(|| RpcError::invalid_request("this request needs a session: send initialize first"))
    }

    /// The client's JSON-RPC id of the request.
    pub fn request_id(&self) -> &Value {
        &self.request_id
    }

    /// The `progressToken` of the request's `_meta`, if it had one.
    pub fn progress_token(&self) -> Option<&Value> {
        self.progress_token.as_ref()
    }

    /// A sessionless (2026-07-28) request's `_meta`, which carries what a
    /// session would hold (the client's declarations, an application's own
    /// keys); `None` for a request of a session.
    pub fn request_meta(&self) -> Option<&Map<String, Value>> {
        self.sink.as_ref().filter(|_| self.session.is_none()).map(|s| s.request_meta.as_ref())
    }

    /// A sessionless request's `Mcp-Param-*` headers as the client sent
    /// them (names lowercased): parameters it mirrored for intermediaries,
    /// for an application that passes the request on. Empty otherwise.
    pub fn param_headers(&self) -> &[(String, String)] {
        self.sink.as_ref().filter(|_| self.session.is_none()).map_or(&[], |s| s.param_headers.as_slice())
    }

    /// Whether this sessionless request has asked its client something it
    /// must answer in another round (MRTR): the work should stop, and the
    /// round ends `input_required` whatever it returns.
    pub fn awaits_input(&self) -> bool {
        self.sink.as_ref().is_some_and(|s| s.rounds.has_asked())
    }

    /// Cancelled by `notifications/cancelled` or when the session ends.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// A notification related to this request (on its stream while the
    /// client listens there, else on the standalone stream if one listens).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        if let Some(sink) = self.sink.as_ref().filter(|_| self.session.is_none()) {
            sink.notify(method, params.as_ref()).await;
            return Ok(());
        }
        let session = self.session.as_ref().ok_or_else(no_session)?;
        let payload = envelope::outbound_message(None, method, params.as_ref());
        self.inner.related.emit(session, self.stream.as_deref(), payload).await
    }

    /// Leaves a note from which this request's work can be carried on if
    /// this process dies while it runs (the gateway: where the upstream
    /// keeps the answer). The process that then finds the request cut off
    /// hands the note to [`crate::McpApp::recover_request`] instead of
    /// ending the request "interrupted". One note per request (a later one
    /// replaces it); for a request of a session answered on its SSE stream
    /// (one answered with JSON cannot be followed after a crash: nothing is
    /// stored). Stores the stream's priming event first if the request has
    /// not done so, so the note never names a request no client can follow.
    pub async fn leave_recovery_note(&self, note: Value) -> Result<(), RpcError> {
        let session = self.session.as_ref().ok_or_else(no_session)?;
        let Some(stream) = self.stream.as_ref() else { return Ok(()) };
        stream.ensure_primed(&self.inner.events, &session.id).await.map_err(storage_error)?;
        let record = json!({"note": note, "progressToken": self.progress_token});
        self.inner.write_recovery_note(&session.id, &stream.name, &record).await.map_err(storage_error)
    }

    /// The request's stream (`r…`), where it has one: with the session ID,
    /// what names this request in the store, across processes.
    pub fn stream_name(&self) -> Option<&str> {
        self.stream.as_deref().map(|s| s.name.as_str())
    }

    /// Runs `f` once this request's final response is stored (so that what
    /// could have carried the request on after a crash may be let go then).
    /// False, and `f` is dropped, if the request has no stored stream (a
    /// JSON answer, a sessionless request): nothing could carry it on.
    pub fn after_final_stored(&self, f: impl FnOnce() + Send + 'static) -> bool {
        match &self.stream {
            Some(stream) => {
                stream.after_final(Box::new(f));
                true
            }
            None => false,
        }
    }

    /// This request is carried on by its application in whatever process
    /// serves the session next (a gateway's call to a child the keeper
    /// keeps): if the drain of a shutdown runs out before it ends, it is
    /// left open for that process ([`McpApp::recovers_unnoted`](crate::McpApp::recovers_unnoted))
    /// instead of ending "interrupted". Only for a request whose stream a
    /// client can resume (primed); others end as usual.
    pub fn outlives_process(&self) {
        if let Some(stream) = &self.stream {
            stream.set_outlives_process();
        }
    }

    /// `notifications/progress`, if the client asked for progress.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) -> Result<(), RpcError> {
        let Some(token) = &self.progress_token else { return Ok(()) };
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        self.notify("notifications/progress", Some(params)).await
    }

    /// A server-to-client request related to this request (e.g. `roots/list`).
    pub async fn request_client(&self, method: &str, params: Option<Value>, timeout: Duration) -> Result<Value, RpcError> {
        let Some(session) = self.session.as_ref() else {
            // A sessionless client is asked through the request's result (MRTR).
            let sink = self.sink.as_ref().ok_or_else(no_session)?;
            return sink.rounds.ask(method, params, self.caller.client_capabilities());
        };
        self.inner.related.request_client(session, self.stream.as_deref(), method, params, timeout).await
    }
}

fn no_session() -> RpcError {
    RpcError::internal("this request has no session to send messages on")
}

/// A session's in-memory application state (see [`SessionCtx::local`]).
pub(crate) type Local = Option<Arc<dyn Any + Send + Sync>>;
