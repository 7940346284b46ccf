//! What a request's work sees ([`ToolCtx`]) and what a session's application
//! context sees ([`SessionCtx`]), plus the dispatch of MCP methods onto the
//! [`McpApp`](crate::app::McpApp).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tether_store::EventKind;
use tokio_util::sync::CancellationToken;

use super::request_stream::RequestStream;
use super::session::Session;
use super::{EngineError, Inner, WorkFuture};
use crate::app::RpcError;
use crate::protocol;

pub(crate) type Work = Box<dyn FnOnce(ToolCtx) -> WorkFuture + Send>;

/// Bounded retries of a state update racing with another writer.
const STATE_UPDATE_ATTEMPTS: usize = 8;

/// The key of a request id in the in-flight and pending maps.
pub(crate) fn request_key(id: &Value) -> String {
    id.to_string()
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
pub struct ToolCtx {
    inner: Arc<Inner>,
    session: Arc<Session>,
    stream: Option<Arc<RequestStream>>,
    request_id: Value,
    progress_token: Option<Value>,
    cancel: CancellationToken,
}

impl SessionCtx {
    pub(crate) fn new(inner: Arc<Inner>, session: Arc<Session>) -> Self {
        Self { inner, session }
    }

    pub fn session_id(&self) -> &str {
        &self.session.id
    }

    pub fn principal(&self) -> &str {
        &self.session.principal
    }

    pub fn protocol_version(&self) -> String {
        self.session.protocol_version()
    }

    /// The capabilities the client declared in `initialize`.
    pub async fn client_capabilities(&self) -> Value {
        self.session.durable.lock().await.state.client_capabilities.clone()
    }

    /// The application's durable per-session context.
    pub async fn app_state(&self) -> Map<String, Value> {
        self.session.durable.lock().await.state.app.clone()
    }

    /// Changes the application's per-session context with compare-and-set
    /// against the store; `f` may run more than once.
    pub async fn update_app_state(&self, mut f: impl FnMut(&mut Map<String, Value>) + Send) -> Result<Map<String, Value>, RpcError> {
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
                        .map_err(|e| RpcError::internal(format!("storage unavailable: {e}")))?
                        .ok_or_else(|| RpcError::internal("session ended while updating it"))?;
                    durable.revision = fresh.revision;
                    durable.state = serde_json::from_value(fresh.state)
                        .map_err(|e| RpcError::internal(format!("stored session state unreadable: {e}")))?;
                }
                Err(e) => return Err(RpcError::internal(format!("storage unavailable: {e}"))),
            }
        }
        Err(RpcError::internal("session state kept changing underneath; try again"))
    }

    /// A notification on the standalone stream (stored, delivered when a GET listens).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        let payload = protocol::outbound_message(None, method, params.as_ref());
        emit_related(&self.inner, &self.session, None, payload).await
    }

    /// A server-to-client request on the standalone stream.
    pub async fn request_client(&self, method: &str, params: Option<Value>, timeout: Duration) -> Result<Value, RpcError> {
        request_client(&self.inner, &self.session, None, method, params, timeout).await
    }
}

impl ToolCtx {
    pub(crate) fn new(
        inner: Arc<Inner>,
        session: Arc<Session>,
        stream: Option<Arc<RequestStream>>,
        request_id: Value,
        progress_token: Option<Value>,
        cancel: CancellationToken,
    ) -> Self {
        Self { inner, session, stream, request_id, progress_token, cancel }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    pub fn session(&self) -> SessionCtx {
        SessionCtx::new(self.inner.clone(), self.session.clone())
    }

    pub fn request_id(&self) -> &Value {
        &self.request_id
    }

    /// Cancelled by `notifications/cancelled` or when the session ends.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// A notification related to this request (on its stream while the
    /// client listens there, else on the standalone stream if one listens).
    pub async fn notify(&self, method: &str, params: Option<Value>) -> Result<(), RpcError> {
        let payload = protocol::outbound_message(None, method, params.as_ref());
        emit_related(&self.inner, &self.session, self.stream.as_deref(), payload).await
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
        request_client(&self.inner, &self.session, self.stream.as_deref(), method, params, timeout).await
    }
}

/// Where a message related to a request goes (design brief, "Streams and
/// events"): its request's stream while a connection listens there, else the
/// standalone stream if one listens (here, or on another replica), else the
/// request's stream, for replay.
async fn related_stream(inner: &Inner, session: &Session, own: Option<&RequestStream>) -> String {
    let own = own.map(|s| (s.name.as_str(), s.is_attached()));
    match own {
        Some((s, attached)) if attached || inner.hub.connections(&session.id, s) > 0 => s.to_owned(),
        _ if inner.hub.connections(&session.id, &session.standalone_stream) > 0 => session.standalone_stream.clone(),
        Some(_) if inner.store.is_shared() && super::replicas::standalone_live_anywhere(inner, &session.id).await => {
            session.standalone_stream.clone()
        }
        Some((s, _)) => s.to_owned(),
        None => session.standalone_stream.clone(),
    }
}

async fn emit_related(inner: &Inner, session: &Session, own: Option<&RequestStream>, payload: Bytes) -> Result<(), RpcError> {
    let stream = related_stream(inner, session, own).await;
    if let Some(own) = own.filter(|own| own.name == stream) {
        // The priming event comes first on its stream.
        own.ensure_primed(inner, &session.id).await.map_err(|e| RpcError::internal(format!("storage unavailable: {e}")))?;
    }
    inner
        .emit(&session.id, &stream, EventKind::Message, payload)
        .await
        .map(|_| ())
        .map_err(|e| RpcError::internal(format!("storage unavailable: {e}")))
}

async fn request_client(
    inner: &Inner,
    session: &Session,
    own: Option<&RequestStream>,
    method: &str,
    params: Option<Value>,
    timeout: Duration,
) -> Result<Value, RpcError> {
    let n = session.next_server_request.fetch_add(1, Ordering::Relaxed);
    let id = Value::String(format!("tether-{}-{n}", inner.instance));
    let key = request_key(&id);
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Ok(mut pending) = session.pending.lock() {
        pending.insert(key.clone(), tx);
    }
    let payload = protocol::outbound_message(Some(&id), method, params.as_ref());
    if let Err(e) = emit_related(inner, session, own, payload).await {
        forget_pending(session, &key);
        return Err(e);
    }
    let answer = if inner.store.is_shared() {
        // The client may POST its answer to another replica.
        tokio::time::timeout(timeout, super::replicas::await_answer(inner, &session.id, &key, rx)).await.map(Ok)
    } else {
        tokio::time::timeout(timeout, rx).await
    };
    forget_pending(session, &key);
    match answer {
        Ok(Ok(Ok(result))) => Ok(result),
        Ok(Ok(Err(error))) => Err(RpcError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(protocol::INTERNAL_ERROR),
            message: error.get("message").and_then(Value::as_str).unwrap_or("client returned an error").to_owned(),
            data: error.get("data").cloned(),
        }),
        Ok(Err(_)) => Err(RpcError::internal("session ended before the client answered")),
        Err(_) => Err(RpcError::internal(format!("client did not answer {method} within {}s", timeout.as_secs_f32()))),
    }
}

fn forget_pending(session: &Session, key: &str) {
    if let Ok(mut pending) = session.pending.lock() {
        pending.remove(key);
    }
}

/// Runs `work`, racing cancellation, and renders the JSON-RPC response.
pub(crate) async fn run_work(ctx: ToolCtx, work: Work, cancel: CancellationToken) -> Bytes {
    let id = ctx.request_id.clone();
    let result = tokio::select! {
        r = work(ctx) => r,
        _ = cancel.cancelled() => Err(RpcError::new(-32800, "request cancelled")),
    };
    match result {
        Ok(v) => protocol::result_message(&id, &v),
        Err(e) => protocol::error_message(Some(&id), e.code, &e.message, e.data.as_ref()),
    }
}

/// Removes a finished request from the in-flight map.
pub(crate) fn finish(session: &Session, key: &str) {
    if let Ok(mut inflight) = session.inflight.lock() {
        inflight.remove(key);
    }
}

/// Routes one client request to the application.
pub(crate) async fn dispatch(mut ctx: ToolCtx, method: String, params: Option<Map<String, Value>>) -> Result<Value, RpcError> {
    let mut params = params.unwrap_or_default();
    match method.as_str() {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": advertised_tools(&ctx.inner)})),
        "tools/call" => {
            let name = match params.get("name") {
                Some(Value::String(n)) => n.clone(),
                _ => return Err(RpcError::invalid_params("tools/call needs params.name (the tool's name as a string)")),
            };
            let app = ctx.inner.app.clone();
            // A resume token is bound to everything but `_meta` (copied only
            // for the tools that run as operations).
            let operation = app.operation_spec(&name).map(|spec| {
                let mut unbound = params.clone();
                unbound.remove("_meta");
                (spec, unbound)
            });
            let arguments = match params.remove("arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(a)) => a,
                Some(_) => return Err(RpcError::invalid_params("tools/call params.arguments must be an object")),
            };
            let meta = params.get("_meta");
            ctx.progress_token = meta.and_then(|m| m.get("progressToken")).cloned();
            if let Some((spec, unbound)) = operation {
                let token = match meta.and_then(|m| m.get(super::operations::TOKEN_META)) {
                    None | Some(Value::Null) => None,
                    Some(Value::String(t)) => Some(t.clone()),
                    Some(_) => return Err(RpcError::invalid_params("invalid resumeToken: it must be the string the server sent")),
                };
                let binding = super::operations::binding(ctx.session.principal.as_str(), "tools/call", &Value::Object(unbound));
                return super::operations::call(&ctx, &name, arguments, binding, token.as_deref(), spec).await;
            }
            let result = app.call_tool(ctx, &name, arguments).await?;
            let mut value = serde_json::to_value(result).map_err(|e| RpcError::internal(e.to_string()))?;
            // Only the sessionless revision knows `resultType`; the ones served here do not.
            if let Some(obj) = value.as_object_mut() {
                obj.remove("resultType");
            }
            Ok(value)
        }
        other => Err(RpcError::method_not_found(other)),
    }
}

/// The app's tools; resumable ones carry `dev.tether/resumable` and an
/// expected-duration hint in their `_meta`.
fn advertised_tools(inner: &Inner) -> Vec<Value> {
    inner
        .app
        .tools()
        .into_iter()
        .map(|tool| {
            let spec = inner.app.operation_spec(&tool.name);
            let mut v = serde_json::to_value(tool).unwrap_or(Value::Null);
            if let (Some(spec), Some(obj)) = (spec, v.as_object_mut()) {
                let meta = obj.entry("_meta").or_insert_with(|| json!({}));
                if let Some(m) = meta.as_object_mut() {
                    m.insert("dev.tether/resumable".into(), json!(true));
                    m.insert("dev.tether/expectedDurationMs".into(), json!(spec.expected_duration_ms));
                    m.insert("dev.tether/restartable".into(), json!(spec.restartable));
                }
            }
            v
        })
        .collect()
}

/// Handles one client notification.
pub(crate) async fn on_notification(
    inner: Arc<Inner>,
    session: Arc<Session>,
    method: String,
    params: Option<Map<String, Value>>,
) -> Result<(), EngineError> {
    match method.as_str() {
        "notifications/initialized" => {
            let ctx = SessionCtx::new(inner.clone(), session.clone());
            let already = session.durable.lock().await.state.initialized;
            if !already {
                ctx.update_state(|s| s.initialized = true)
                    .await
                    .map_err(|e| EngineError::Unavailable(tether_store::StoreError::Backend(e.message)))?;
            }
            let app = inner.app.clone();
            tokio::spawn(async move { app.on_initialized(ctx).await });
        }
        "notifications/cancelled" => {
            if let Some(id) = params.as_ref().and_then(|p| p.get("requestId")) {
                let key = request_key(id);
                if let Some(token) = session.inflight.lock().ok().and_then(|m| m.get(&key).cloned()) {
                    tracing::info!(session = %session.id, request = %key, "request cancelled by client");
                    token.cancel();
                }
            }
        }
        _ => {
            let ctx = SessionCtx::new(inner.clone(), session);
            let app = inner.app.clone();
            tokio::spawn(async move { app.on_notification(ctx, &method, params).await });
        }
    }
    Ok(())
}
