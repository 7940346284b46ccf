//! Requests of the sessionless revision (2026-07-28): each request stands
//! alone with the caller it declares in its `_meta`. Nothing is stored and
//! nothing is resumable: the notifications of the request and then its
//! answer go to the one HTTP response waiting for it, and a response that
//! goes away (the client closed the stream) cancels the work.
//!
//! Results are shaped for the revision here, not by the application:
//! `resultType` (`complete` unless the application set another) and the
//! server's `serverInfo` in `_meta`, as the application describes itself in
//! [`McpApp::discover`](crate::app::McpApp::discover).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tether_wire::{RpcError, code, envelope, meta, revision};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::request::{self, RequestHead, Work};
use super::{Engine, EngineError, Inner};
use crate::app::{Authorized, Caller, McpApp, RawResult};
use crate::engine::RequestCtx;

/// Methods whose 2026-07-28 results say how long they may be cached
/// (`ttlMs`, `cacheScope`).
const CACHEABLE: &[&str] = &["tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"];

/// Notifications a sessionless request may have waiting for its response.
const OUTBOUND_BUFFER: usize = 64;

/// One sessionless request, its envelope read and its `_meta` checked.
pub struct SessionlessRequest {
    /// The endpoint it came to (`""`: `/mcp`).
    pub endpoint: String,
    /// Who asks, as its `_meta` declares.
    pub caller: Caller,
    /// Its JSON-RPC id.
    pub id: Value,
    /// Its method.
    pub method: String,
    /// Its params.
    pub params: Option<Map<String, Value>>,
    /// The verified token's principal, claims and decision, when authentication is on.
    pub authorized: Option<Authorized>,
    /// `_meta`'s log level: `notifications/message` at or above it go out; none without it.
    pub log_level: Option<String>,
    /// The request's `Mcp-Param-*` headers as sent (names lowercased), for
    /// an application that passes the request on.
    pub param_headers: Vec<(String, String)>,
}

/// What a sessionless request sends its response.
#[derive(Debug)]
pub enum Outbound {
    /// A notification of the request (progress, a log message).
    Notification(Bytes),
    /// The answer, the last message; `error` says what it refused, if it did.
    Answer {
        /// The JSON-RPC answer.
        body: Bytes,
        /// What it refused, if it is an error.
        error: Option<super::Refusal>,
    },
    /// Nothing to say for a while (a listen stream): an SSE comment.
    KeepAlive,
}

/// The response side of a running sessionless request: dropping it cancels
/// the work.
pub struct SessionlessReply {
    /// What goes to the client, in order; the answer last.
    pub messages: mpsc::Receiver<Outbound>,
    _cancel_on_drop: DropGuard,
}

/// Where a sessionless request's context sends its notifications.
#[derive(Clone)]
pub(crate) struct Sink {
    tx: mpsc::Sender<Outbound>,
    log_level: Option<u8>,
    /// The request's `_meta`: in this revision it carries what a session held.
    pub(crate) request_meta: Arc<Map<String, Value>>,
    /// Its `Mcp-Param-*` headers ([`SessionlessRequest::param_headers`]).
    pub(crate) param_headers: Arc<Vec<(String, String)>>,
    /// What this round of the request asked its client, and the answers it has.
    pub(crate) rounds: Arc<super::mrtr::Rounds>,
}

impl Sink {
    /// Sends a notification unless the client did not ask for it (log
    /// messages below its level, or any without a level); waits while the
    /// response is behind, and drops it once the response is gone.
    pub(crate) async fn notify(&self, method: &str, params: Option<&Value>) {
        if method == "notifications/message" {
            let level = params.and_then(|p| p.get("level")).and_then(Value::as_str).and_then(severity);
            match (self.log_level, level) {
                (Some(wanted), Some(level)) if level >= wanted => {}
                _ => return,
            }
        }
        let _ = self.tx.send(Outbound::Notification(envelope::outbound_message(None, method, params))).await;
    }
}

/// RFC 5424 severities as MCP names them, least severe first.
fn severity(level: &str) -> Option<u8> {
    ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
        .iter()
        .position(|l| *l == level)
        .and_then(|p| u8::try_from(p).ok())
}

impl Engine {
    /// What the application of `endpoint` says of itself for
    /// `server/discover` (asked once, then kept); `None` if it serves
    /// sessions only.
    pub async fn discover(&self, endpoint: &str) -> Result<Option<Arc<Map<String, Value>>>, EngineError> {
        self.inner.described(endpoint).await
    }

    /// Runs a sessionless request; its notifications and answer come on
    /// the reply's channel.
    pub async fn call_sessionless(&self, request: SessionlessRequest) -> Result<SessionlessReply, EngineError> {
        let inner = &self.inner;
        if inner.life.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let app =
            inner.apps.get(&request.endpoint).ok_or_else(|| EngineError::UnknownEndpoint(request.endpoint.clone()))?.clone();
        let permit = inner.sessionless.admit(&request.caller.principal).map_err(|r| EngineError::TooMany(r.message()))?;
        let server_info = self.discover(&request.endpoint).await?.and_then(|d| d.get("serverInfo").cloned());
        let SessionlessRequest { caller, id, method, mut params, authorized, log_level, param_headers, .. } = request;
        let span = crate::trace::rpc_span(&method, None, params.as_ref());
        let principal = caller.principal.clone();
        // An application that passes the rounds through gets them as sent.
        let repeated = !app.passes_input_through()
            && params.as_ref().is_some_and(|p| p.contains_key("inputResponses") || p.contains_key("requestState"));
        let rounds = match params.as_mut() {
            Some(p) if repeated => {
                let key = inner.key.get(inner.store.as_ref()).await.map_err(EngineError::Unavailable)?;
                match super::mrtr::take(&key, &principal, &method, p) {
                    Ok(rounds) => rounds,
                    Err(refused) => return Ok(SessionlessReply::answered(&id, refused)),
                }
            }
            _ => super::mrtr::Rounds::default(),
        };
        let rounds = Arc::new(rounds);
        let subject = params.as_ref().and_then(super::mrtr::subject);
        let method_name = method.clone();
        let progress_token = params.as_ref().and_then(|p| p.get("_meta")).and_then(|m| m.get(meta::PROGRESS_TOKEN)).cloned();
        let (tx, messages) = mpsc::channel(OUTBOUND_BUFFER);
        let request_meta = params.as_ref().and_then(|p| p.get("_meta")).and_then(Value::as_object).cloned().unwrap_or_default();
        let sink = Sink {
            tx: tx.clone(),
            log_level: log_level.as_deref().and_then(severity),
            request_meta: Arc::new(request_meta),
            param_headers: Arc::new(param_headers),
            rounds: rounds.clone(),
        };
        let cancel = CancellationToken::new();
        let head = RequestHead { id: id.clone(), progress_token, authorized };
        let ctx = RequestCtx::sessionless(inner.clone(), caller, head, cancel.clone(), sink);
        let cacheable = CACHEABLE.contains(&method.as_str());
        let call = inner.calls.enter(None, &principal, &request.endpoint, &method, &id, params.as_ref());
        let work: Work = Box::new(move |ctx| {
            Box::pin(async move {
                let _call = call;
                app.handle_request(ctx, &method, params).await
            })
        });
        let worker = inner.clone();
        let cancelled = cancel.clone();
        // Writes the work defers are waited for before the answer leaves
        // (it is not stored, so it cannot follow them through the writer).
        let timer = crate::metrics::request_started(&method_name);
        let task = tether_store::fence::scope(async move {
            // Both the server's slot and the principal's, for the work's whole life.
            let _permit: super::quota::Admitted = permit;
            let mut outcome = request::run_outcome(&worker, ctx, work, cancelled).await;
            if outcome.is_ok()
                && let Err(e) = tether_store::fence::committed().await
            {
                outcome = Err(RpcError::internal(format!("the request's changes were not stored: {e}")));
            }
            // The work asked its client something: this round ends there.
            if rounds.input_required(String::new).is_some() {
                outcome = match worker.key.get(worker.store.as_ref()).await {
                    Ok(key) => {
                        let state = || super::mrtr::seal(&key, &principal, &method_name, subject.clone(), &rounds.answers);
                        rounds.input_required(state).map_or(outcome, |required| crate::app::raw_result(&required))
                    }
                    Err(e) => Err(RpcError::internal(format!("storage unavailable: {e}"))),
                };
            }
            let answer = match outcome.and_then(|raw| shape_result(&raw, server_info.as_ref(), cacheable)) {
                Ok(raw) => Outbound::Answer { body: envelope::raw_result_message(&id, &raw), error: None },
                Err(e) => Outbound::Answer { body: envelope::error_message(Some(&id), &e), error: Some((&e).into()) },
            };
            timer.done();
            let _ = tx.send(answer).await;
        });
        span.in_scope(|| inner.life.spawn_request(task));
        Ok(SessionlessReply { messages, _cancel_on_drop: cancel.drop_guard() })
    }
}

impl SessionlessReply {
    pub(crate) fn new(messages: mpsc::Receiver<Outbound>, cancel: CancellationToken) -> Self {
        Self { messages, _cancel_on_drop: cancel.drop_guard() }
    }

    /// A reply whose answer is known before any work runs.
    pub(crate) fn answered(id: &Value, error: RpcError) -> Self {
        let (tx, messages) = mpsc::channel(1);
        let body = envelope::error_message(Some(id), &error);
        let _ = tx.try_send(Outbound::Answer { body, error: Some((&error).into()) });
        Self { messages, _cancel_on_drop: CancellationToken::new().drop_guard() }
    }
}

/// What each endpoint's application says of itself (`McpApp::discover`),
/// asked once per application (a replaced one is asked again); an
/// application that could not say is asked again next time.
#[derive(Default)]
pub(crate) struct Descriptions {
    #[allow(clippy::type_complexity)]
    by_endpoint: Mutex<HashMap<String, (Weak<dyn McpApp>, Arc<tokio::sync::OnceCell<Arc<Map<String, Value>>>>)>>,
}

impl Inner {
    pub(crate) async fn described(&self, endpoint: &str) -> Result<Option<Arc<Map<String, Value>>>, EngineError> {
        let app = self.apps.get(endpoint).ok_or_else(|| EngineError::UnknownEndpoint(endpoint.to_owned()))?.clone();
        let cell = {
            let mut described = self.described.by_endpoint.lock();
            let entry = described.entry(endpoint.to_owned()).or_insert_with(|| (Arc::downgrade(&app), Arc::default()));
            // The endpoint's application was replaced (SIGHUP): describe the new one.
            if !entry.0.upgrade().is_some_and(|kept| Arc::ptr_eq(&kept, &app)) {
                *entry = (Arc::downgrade(&app), Arc::default());
            }
            entry.1.clone()
        };
        // Only a description is kept: an application that could not say
        // (a gateway whose upstream is down) is asked again next time.
        let described = cell.get_or_try_init(|| async move { app.discover().await.map(Arc::new).ok_or(()) }).await;
        Ok(described.ok().cloned())
    }
}

/// The `server/discover` result of an application's description.
pub fn discover_result(described: &Map<String, Value>) -> Value {
    let mut result = described.clone();
    let server_info = result.remove("serverInfo");
    result.insert("resultType".into(), json!("complete"));
    result.insert("supportedVersions".into(), json!(revision::SESSIONLESS));
    result.entry("capabilities").or_insert_with(|| json!({}));
    // What an application describes does not change while it runs, and it
    // is the same for everyone: cacheable by anyone for a minute.
    result.insert("ttlMs".into(), json!(60_000));
    result.insert("cacheScope".into(), json!("public"));
    if let Some(info) = server_info {
        result.insert("_meta".into(), json!({ (meta::SERVER_INFO): info }));
    }
    Value::Object(result)
}

/// Adds `resultType` (unless the application set one) and the server's
/// `serverInfo` to a result's `_meta`; a `cacheable` one not said otherwise
/// by the application is fresh for no time and private.
fn shape_result(raw: &serde_json::value::RawValue, server_info: Option<&Value>, cacheable: bool) -> Result<RawResult, RpcError> {
    let mut result: Map<String, Value> = serde_json::from_str(raw.get())
        .map_err(|e| RpcError::internal(format!("the application's result is not a JSON object: {e}")))?;
    result.entry("resultType").or_insert_with(|| json!("complete"));
    if cacheable {
        result.entry("ttlMs").or_insert_with(|| json!(0));
        result.entry("cacheScope").or_insert_with(|| json!("private"));
    }
    if let Some(info) = server_info {
        let result_meta = result.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = result_meta {
            m.insert(meta::SERVER_INFO.into(), info.clone());
        }
    }
    crate::app::raw_result(&result)
}

/// The error of a request that needs a capability its caller did not declare.
pub fn missing_capability(capability: &str, why: &str) -> RpcError {
    RpcError {
        code: code::MISSING_REQUIRED_CLIENT_CAPABILITY,
        message: format!("{why}: declare `{capability}` in _meta[\"{}\"]", meta::CLIENT_CAPABILITIES),
        data: Some(json!({"requiredCapabilities": {capability: {}}})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_get_a_result_type_and_the_server_info() {
        let raw = serde_json::value::to_raw_value(&json!({"content": [], "_meta": {"k": 1}})).unwrap();
        let shaped = shape_result(&raw, Some(&json!({"name": "n", "version": "1"})), true).unwrap();
        let v: Value = serde_json::from_str(shaped.get()).unwrap();
        assert_eq!(v["resultType"], "complete");
        assert_eq!(v["_meta"]["k"], 1);
        assert_eq!(v["_meta"][meta::SERVER_INFO]["name"], "n");
        assert_eq!((v["ttlMs"].as_u64(), v["cacheScope"].as_str()), (Some(0), Some("private")));
        let own = serde_json::value::to_raw_value(&json!({"resultType": "input_required"})).unwrap();
        let v: Value = serde_json::from_str(shape_result(&own, None, false).unwrap().get()).unwrap();
        assert_eq!(v["resultType"], "input_required");
    }

    #[test]
    fn log_levels_order_by_severity() {
        assert!(severity("error") > severity("warning"));
        assert_eq!(severity("verbose"), None);
    }
}
