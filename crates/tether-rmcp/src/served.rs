//! [`Served`]: one rmcp service running on an in-process channel, with the
//! calls it is answering and where each message it sends goes.
//!
//! rmcp drives a `ServerHandler` only through its own service loop (its
//! `Peer` cannot be made outside it), so the handler runs in that loop over a
//! [`Channel`], a transport whose far end is tether's engine:
//!
//! - a request from the engine goes in with an ID of ours; its answer comes
//!   back through [`Transport::send`] and completes the waiting call;
//! - `notifications/progress` goes on the stream of the call whose progress
//!   token it names, other notifications (logging, list changes) on the
//!   session's standalone stream; all of them are stored before they are sent;
//! - a server-to-client request (sampling, elicitation, roots) made from a
//!   handler goes on the stream of the call it was made from (rmcp marks it
//!   with the call's ID), and the client's answer is fed back into the loop.
//!
//! Bounds: the channel into the loop holds [`INBOUND_CAPACITY`] messages
//! (a sender waits beyond that); calls are the engine's requests, which the
//! engine bounds; a server-to-client request waits at most
//! [`CLIENT_ANSWER_WAIT`]. When the loop ends, every call still waiting ends
//! with an internal error.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rmcp::ServerHandler;
use rmcp::model::{
    ClientJsonRpcMessage, ErrorCode, ErrorData, GetExtensions, InitializeRequestParams, JsonRpcError, NumberOrString,
    ServerJsonRpcMessage,
};
use rmcp::service::{OriginatingRequestId, RoleServer, serve_directly};
use rmcp::transport::Transport;
use serde_json::{Map, Value, json};
use tether_server::{RawResult, RequestCtx, RpcError, SessionCtx};
use tokio::sync::{mpsc, oneshot};

use crate::guarded::Guarded;

/// Messages waiting to enter the service loop.
pub(crate) const INBOUND_CAPACITY: usize = 64;

/// How long a server-to-client request made by a handler waits for the
/// client's answer (the handler's own timeout, if shorter, ends it first).
pub(crate) const CLIENT_ANSWER_WAIT: Duration = Duration::from_secs(300);

/// One rmcp service and its routes. Dropping it stops the service loop.
pub(crate) struct Served {
    inbound: mpsc::Sender<ClientJsonRpcMessage>,
    routes: Arc<Routes>,
    /// The `RunningService`: the loop runs while it is held.
    _running: Box<dyn Any + Send + Sync>,
}

/// A call waiting for the handler's answer.
struct Call {
    answer: oneshot::Sender<Result<RawResult, RpcError>>,
    /// The engine's request, where its messages go (`None`: `initialize`).
    ctx: Option<RequestCtx>,
}

/// Where the messages of one service go; shared by [`Served`] and its [`Channel`].
struct Routes {
    calls: Mutex<HashMap<i64, Call>>,
    next_id: AtomicI64,
    /// The session the service serves, for messages related to no call
    /// (`None` for the sessionless service, and once the session has left
    /// this process: it is let go then, so no cycle outlives it).
    session: Mutex<Option<SessionCtx>>,
    /// Answers to the handler's own requests go back in here (weak: the
    /// loop ends when [`Served`] is dropped).
    inbound: mpsc::WeakSender<ClientJsonRpcMessage>,
}

impl Served {
    /// Starts `handler` in a service loop of its own. `peer` is the client's
    /// `initialize` for a session carried on after a restart (the handler is
    /// not asked to initialize again); `None` for a new session (its
    /// `initialize` comes as a request) and for sessionless requests.
    pub(crate) fn start<H: ServerHandler>(handler: H, peer: Option<InitializeRequestParams>) -> Self {
        let (inbound, rx) = mpsc::channel(INBOUND_CAPACITY);
        let routes = Arc::new(Routes {
            calls: Mutex::default(),
            next_id: AtomicI64::new(1),
            session: Mutex::default(),
            inbound: inbound.downgrade(),
        });
        let channel = Channel { rx, routes: routes.clone() };
        let running = serve_directly(Guarded(handler), channel, peer);
        Self { inbound, routes, _running: Box::new(running) }
    }

    /// Remembers the session for messages related to no call.
    pub(crate) fn attach(&self, session: SessionCtx) {
        let mut held = self.routes.session.lock();
        if held.is_none() {
            *held = Some(session);
        }
    }

    /// Lets the session go (it left this process) and ends every call still
    /// waiting.
    pub(crate) fn detach(&self) {
        self.routes.session.lock().take();
        self.routes.fail_all("the session ended while the handler was answering");
    }

    /// Sends `method` to the handler and waits for its answer, at most
    /// `timeout`. Ended early by `ctx`'s cancellation or by dropping the
    /// future; in every case the handler is told with
    /// `notifications/cancelled`, and its work is dropped ([`Guarded`]).
    pub(crate) async fn call(
        &self,
        ctx: Option<RequestCtx>,
        method: &str,
        params: Option<Map<String, Value>>,
        timeout: Duration,
    ) -> Result<RawResult, RpcError> {
        let id = self.routes.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = Map::with_capacity(4);
        message.insert("jsonrpc".into(), Value::from("2.0"));
        message.insert("id".into(), Value::from(id));
        message.insert("method".into(), Value::from(method));
        if let Some(params) = params {
            message.insert("params".into(), Value::Object(params));
        }
        let message: ClientJsonRpcMessage = serde_json::from_value(Value::Object(message))
            .map_err(|e| RpcError::invalid_params(format!("{method}: the params are not what the method takes: {e}")))?;
        let cancel = ctx.as_ref().map(|c| c.cancelled().clone());
        let (answer, rx) = oneshot::channel();
        self.routes.calls.lock().insert(id, Call { answer, ctx });
        let pending = Pending { served: self, id };
        let cancelled = async {
            match cancel {
                Some(cancel) => cancel.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // The wait for room in the loop's queue counts too.
        let exchange = async {
            self.inbound.send(message).await.map_err(|_| stopped())?;
            rx.await.unwrap_or_else(|_| Err(stopped()))
        };
        let answer = tokio::select! {
            answer = exchange => answer,
            _ = cancelled => return Err(RpcError::internal("the request was cancelled")),
            _ = tokio::time::sleep(timeout) => return Err(RpcError::internal(format!(
                "the handler did not answer {method} within {} s (RmcpApp::request_timeout); it was cancelled",
                timeout.as_secs()
            ))),
        };
        drop(pending);
        answer
    }

    /// Passes a client notification to the handler, in order (waiting for
    /// room in the loop's queue; dropped if the loop is gone or the
    /// notification is not one rmcp reads).
    pub(crate) async fn notify(&self, method: &str, params: Option<Map<String, Value>>) {
        let mut message = json!({"jsonrpc": "2.0", "method": method});
        if let Some(params) = params {
            message["params"] = Value::Object(params);
        }
        match serde_json::from_value::<ClientJsonRpcMessage>(message) {
            Ok(message) => {
                if self.inbound.send(message).await.is_err() {
                    tracing::debug!(method, "the handler's service is gone: notification dropped");
                }
            }
            Err(e) => tracing::debug!(method, error = %e, "a notification the handler does not know: dropped"),
        }
    }
}

fn stopped() -> RpcError {
    RpcError::internal("the handler's service stopped before it answered")
}

/// A call in flight: if its waiter goes away while the call is still
/// waiting (cancelled, timed out, dropped), its entry goes and the handler is
/// told with `notifications/cancelled`; an answered call's entry is already gone.
struct Pending<'a> {
    served: &'a Served,
    id: i64,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.served.routes.calls.lock().remove(&self.id).is_none() {
            return;
        }
        let cancelled = json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": self.id, "reason": "the request ended before the handler answered"}
        });
        let Ok(message) = serde_json::from_value::<ClientJsonRpcMessage>(cancelled) else { return };
        // Told at once where the queue has room, else as soon as it has (one
        // task per cancelled call, ending when the message is in or the loop gone).
        if let Err(mpsc::error::TrySendError::Full(message)) = self.served.inbound.try_send(message) {
            let inbound = self.served.inbound.clone();
            tokio::spawn(async move { inbound.send(message).await });
        }
    }
}

impl Routes {
    fn fail_all(&self, why: &str) {
        let calls: Vec<Call> = self.calls.lock().drain().map(|(_, call)| call).collect();
        for call in calls {
            let _ = call.answer.send(Err(RpcError::internal(why)));
        }
    }

    /// The context of the call `id` names, if it is still waiting.
    fn call_ctx(&self, id: &NumberOrString) -> Option<RequestCtx> {
        let NumberOrString::Number(n) = id else { return None };
        self.calls.lock().get(n).and_then(|call| call.ctx.clone())
    }

    /// The call whose progress token is `token`.
    fn by_progress_token(&self, token: &Value) -> Option<RequestCtx> {
        let calls = self.calls.lock();
        calls.values().filter_map(|call| call.ctx.as_ref()).find(|ctx| ctx.progress_token() == Some(token)).cloned()
    }

    /// An answer completes its call here; anything else is returned to be
    /// delivered (it may wait on the store or on the client).
    fn take(&self, message: ServerJsonRpcMessage) -> Option<Outgoing> {
        match message {
            ServerJsonRpcMessage::Response(response) => {
                let answer = serde_json::value::to_raw_value(&response.result)
                    .map_err(|e| RpcError::internal(format!("the handler's result could not be serialized: {e}")));
                self.answer(&response.id, answer);
                None
            }
            ServerJsonRpcMessage::Error(error) => {
                if let Some(id) = &error.id {
                    let ErrorData { code, message, data } = error.error;
                    self.answer(id, Err(RpcError { code: i64::from(code.0), message: message.into_owned(), data }));
                }
                None
            }
            ServerJsonRpcMessage::Notification(notification) => {
                let (method, params) = method_and_params(&notification.notification)?;
                let token = (method == "notifications/progress")
                    .then(|| params.as_ref().and_then(|p| p.get("progressToken")).and_then(|t| self.by_progress_token(t)))
                    .flatten();
                let to = match token {
                    Some(ctx) => To::Call(ctx),
                    None => To::Session(self.session.lock().clone()?),
                };
                Some(Outgoing::Notify { to, method, params })
            }
            ServerJsonRpcMessage::Request(request) => {
                let from_call = request.request.extensions().get::<OriginatingRequestId>().and_then(|o| self.call_ctx(&o.0));
                let to = match from_call {
                    Some(ctx) => Some(To::Call(ctx)),
                    None => self.session.lock().clone().map(To::Session),
                };
                let reply = self.inbound.upgrade()?;
                let asked = method_and_params(&request.request);
                Some(Outgoing::Ask { to, id: request.id, asked, reply })
            }
        }
    }

    fn answer(&self, id: &NumberOrString, answer: Result<RawResult, RpcError>) {
        let NumberOrString::Number(n) = id else { return };
        if let Some(call) = self.calls.lock().remove(n) {
            let _ = call.answer.send(answer);
        }
    }
}

/// Where a message from the handler goes.
enum To {
    /// On the stream of the call it belongs to.
    Call(RequestCtx),
    /// On the session's standalone stream.
    Session(SessionCtx),
}

/// A message from the handler still to be delivered.
enum Outgoing {
    Notify { to: To, method: String, params: Option<Value> },
    Ask { to: Option<To>, id: NumberOrString, asked: Option<(String, Option<Value>)>, reply: mpsc::Sender<ClientJsonRpcMessage> },
}

impl Outgoing {
    async fn deliver(self) {
        match self {
            Outgoing::Notify { to, method, params } => {
                let sent = match &to {
                    To::Call(ctx) => ctx.notify(&method, params).await,
                    To::Session(session) => session.notify(&method, params).await,
                };
                if let Err(e) = sent {
                    tracing::warn!(method, error = %e.message, "a notification of the handler could not be stored");
                }
            }
            Outgoing::Ask { to, id, asked, reply } => {
                let answer = match (to, asked) {
                    (_, None) => Err(RpcError::internal("the handler's request could not be serialized")),
                    (None, _) => Err(RpcError::internal(
                        "the handler asked the client outside any request, and the client has no session to be asked on",
                    )),
                    (Some(To::Call(ctx)), Some((method, params))) => {
                        ctx.request_client(&method, params, CLIENT_ANSWER_WAIT).await
                    }
                    (Some(To::Session(session)), Some((method, params))) => {
                        session.request_client(&method, params, CLIENT_ANSWER_WAIT).await
                    }
                };
                let message = match answer {
                    Ok(result) => {
                        serde_json::from_value::<ClientJsonRpcMessage>(json!({"jsonrpc": "2.0", "id": id, "result": result}))
                            .unwrap_or_else(|e| {
                                error_message(id, RpcError::internal(format!("the client's answer is not one rmcp reads: {e}")))
                            })
                    }
                    Err(e) => error_message(id, e),
                };
                let _ = reply.send(message).await;
            }
        }
    }
}

fn error_message(id: NumberOrString, e: RpcError) -> ClientJsonRpcMessage {
    let code = i32::try_from(e.code).unwrap_or(ErrorCode::INTERNAL_ERROR.0);
    ClientJsonRpcMessage::Error(JsonRpcError::new(Some(id), ErrorData::new(ErrorCode(code), e.message, e.data)))
}

/// A request's or notification's `method` and `params`, as rmcp writes them.
fn method_and_params(message: &impl serde::Serialize) -> Option<(String, Option<Value>)> {
    let Ok(Value::Object(mut object)) = serde_json::to_value(message) else {
        tracing::warn!("a message of the handler could not be serialized: dropped");
        return None;
    };
    let method = object.remove("method").and_then(|m| m.as_str().map(str::to_owned))?;
    Some((method, object.remove("params")))
}

/// The transport the service loop runs on: what the engine sends comes in
/// through `rx`; what the handler sends is routed by [`Routes`].
struct Channel {
    rx: mpsc::Receiver<ClientJsonRpcMessage>,
    routes: Arc<Routes>,
}

impl Transport<RoleServer> for Channel {
    type Error = std::io::Error;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outgoing = self.routes.take(item);
        async move {
            if let Some(outgoing) = outgoing {
                outgoing.deliver().await;
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ClientJsonRpcMessage>> + Send {
        self.rx.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rx.close();
        Ok(())
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.routes.fail_all("the handler's service stopped before it answered");
    }
}
