//! A URL upstream that speaks only the sessionless revision (2026-07-28),
//! for session-era clients: the gateway keeps the client's tether session
//! and speaks to the upstream one request at a time, each carrying what the
//! client declared in `initialize` (its capabilities and info) in `_meta`.
//!
//! Found when the upstream refuses `initialize` and answers
//! `server/discover` naming a sessionless revision. Its `input_required`
//! rounds become server-to-client requests to the session's client (on the
//! gateway's [`PeerSink`], answered through [`Upstream::answer`]); a task it
//! answers with (the gateway declares the Tasks extension for its client) is
//! followed to its end, so the session-era client gets a plain result.
//! Nothing upstream is stateful: any replica, or a restart, just makes a new
//! one. With tether's own OAuth token, a request whose first round the
//! upstream refuses with HTTP 401 (it ran nothing) is sent once more with a
//! renewed token ([`Credentials::renew`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_client::{ClientError, Session};
use tether_wire::{RpcError, meta, revision};
use tokio::sync::oneshot;

use crate::config::UrlSpec;
use crate::credentials::Credentials;
use crate::upstream::{PeerMessage, PeerSink, Started, Upstream, UpstreamResult};

/// How long the session's client may take to answer an ask.
const ASK_WAIT: Duration = Duration::from_secs(600);

/// The upstream as a session-era server, if it speaks only the sessionless
/// revision (else `None`: the caller reports its own error).
pub(crate) async fn start(
    spec: &UrlSpec,
    upstream_name: &str,
    initialize_params: &Value,
    options: tether_client::ClientOptions,
    credentials: Option<Credentials>,
    init_timeout: Duration,
    sink: Arc<dyn PeerSink>,
) -> Option<Started> {
    let client_info = initialize_params.get("clientInfo").cloned().unwrap_or_else(|| json!({}));
    let mut capabilities = initialize_params.get("capabilities").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
    // The gateway follows the upstream's tasks for its session-era client.
    if !capabilities.get("extensions").is_some_and(Value::is_object) {
        capabilities["extensions"] = json!({});
    }
    capabilities["extensions"][meta::TASKS_EXTENSION] = json!({});
    let session = Session::sessionless(&spec.url, options, client_info, capabilities).ok()?;
    let result = discover(&session, init_timeout).await?;
    let initialize_result = serde_json::value::to_raw_value(&result).ok()?;
    // A sessionless server asks through results: only its notifications
    // come from the client runtime; its asks are put to the sink here.
    session.deliver_to(sink.clone()).await;
    tracing::info!(upstream = %upstream_name, url = %spec.url, "the upstream speaks only the sessionless revision; bridging");
    let upstream = Arc::new(SessionlessUrlUpstream {
        name: upstream_name.to_owned(),
        session,
        asks_to: sink,
        asks: Mutex::new(HashMap::new()),
        next_ask: AtomicU64::new(1),
        log_level: Mutex::new(None),
        credentials,
    });
    Some(Started { upstream, initialize_result, carry_on: None, resumed: false })
}

/// Asks a sessionless client's `server/discover` of the upstream: what it
/// says of itself in the shape of an `initialize` result (`capabilities`,
/// `serverInfo`, `instructions`), if it names a sessionless revision.
pub(crate) async fn discover(session: &Session, timeout: Duration) -> Option<serde_json::Map<String, Value>> {
    let discovered = tokio::time::timeout(timeout, session.request("server/discover", None)).await.ok()?.ok()?;
    let speaks_sessionless = discovered
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().filter_map(Value::as_str).any(revision::is_sessionless));
    if !speaks_sessionless {
        return None;
    }
    let mut result = serde_json::Map::new();
    result.insert("capabilities".into(), discovered.get("capabilities").cloned().unwrap_or_else(|| json!({})));
    if let Some(info) = discovered.get("_meta").and_then(|m| m.get(meta::SERVER_INFO)) {
        result.insert("serverInfo".into(), info.clone());
    }
    if let Some(instructions) = discovered.get("instructions") {
        result.insert("instructions".into(), instructions.clone());
    }
    Some(result)
}

/// A sessionless upstream, as the gateway's [`Upstream`] of one session.
struct SessionlessUrlUpstream {
    name: String,
    session: Session,
    asks_to: Arc<dyn PeerSink>,
    /// Asks of the upstream waiting for the session's client, by our ID.
    asks: Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>,
    next_ask: AtomicU64,
    /// The level the session's client set (`logging/setLevel`).
    log_level: Mutex<Option<Value>>,
    /// tether's own OAuth token for the upstream, refreshed before each request.
    credentials: Option<Credentials>,
}

impl SessionlessUrlUpstream {
    /// Puts one `inputRequests` entry to the session's client as a
    /// server-to-client request and waits for its answer.
    async fn ask(&self, request: Value) -> Result<Value, ClientError> {
        let method = request.get("method").and_then(Value::as_str).unwrap_or_default().to_owned();
        let params = request.get("params").cloned();
        let id = self.next_ask.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.asks.lock().insert(id, tx);
        let forget = Forget { asks: &self.asks, id };
        self.asks_to.deliver(PeerMessage::Request { id: json!(id), method: method.clone(), params }).await;
        let answer = tokio::time::timeout(ASK_WAIT, rx).await;
        drop(forget);
        match answer {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(refused))) => Err(ClientError::Rpc(refused)),
            Ok(Err(_)) => Err(ClientError::Transport(format!("{method}: the client's answer was lost"))),
            Err(_) => Err(ClientError::Transport(format!("{method}: the client did not answer in time"))),
        }
    }
}

/// Removes an ask however its wait ends.
struct Forget<'a> {
    asks: &'a Mutex<HashMap<u64, oneshot::Sender<Result<Value, RpcError>>>>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.asks.lock().remove(&self.id);
    }
}

#[async_trait]
impl Upstream for SessionlessUrlUpstream {
    async fn request(&self, method: &str, mut params: Option<Value>) -> UpstreamResult {
        match method {
            // The session's log level goes with every request from now on.
            "logging/setLevel" => {
                let level = params.as_ref().and_then(|p| p.get("level")).cloned();
                *self.log_level.lock() = level;
                return Ok(tether_server::raw_result(&json!({}))?);
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                return Err(RpcError::method_not_found(&format!(
                    "{method} (upstream {} speaks only the sessionless revision, whose subscriptions tether does not relay yet)",
                    self.name
                ))
                .into());
            }
            _ => {}
        }
        let level = self.log_level.lock().clone();
        if let Some(level) = level {
            let p = params.get_or_insert_with(|| json!({}));
            if !p.get("_meta").is_some_and(Value::is_object) {
                p["_meta"] = json!({});
            }
            p["_meta"][meta::LOG_LEVEL] = level;
        }
        tether_server::trace::inject_meta(&mut params);
        let sent = match &self.credentials {
            Some(credentials) => Some((credentials, credentials.refresh().await?)),
            None => None,
        };
        let again = sent.is_some().then(|| params.clone());
        // Dropping this future closes the request's HTTP response, which is
        // how a sessionless server hears of a cancellation.
        let mut result = tether_client::rounds::request_to_end(&self.session, method, params, |request| self.ask(request)).await;
        // Refused with 401 at its first round: the upstream ran nothing.
        if let (Err(ClientError::Auth { status: 401, .. }), Some((credentials, sent)), Some(params)) = (&result, &sent, again)
            && credentials.renew(sent).await?
        {
            tracing::info!(upstream = %self.name, "sending again with a renewed token");
            result = tether_client::rounds::request_to_end(&self.session, method, params, |request| self.ask(request)).await;
        }
        let mut result = result.map_err(|e| match e {
            ClientError::Rpc(error) => error,
            other => RpcError::internal(format!("upstream {}: {other}", self.name)),
        })?;
        // Only the sessionless revision knows `resultType`.
        if let Some(o) = result.as_object_mut() {
            o.remove("resultType");
        }
        serde_json::value::to_raw_value(&result)
            .map_err(|e| RpcError::internal(format!("upstream {}: unreadable result: {e}", self.name)).into())
    }

    /// A sessionless server takes no notifications from its clients
    /// (a cancellation is the request's response closing).
    async fn notify(&self, _method: &str, _params: Option<Value>) -> Result<(), RpcError> {
        Ok(())
    }

    async fn answer(&self, id: Value, outcome: Result<Value, RpcError>) -> Result<(), RpcError> {
        let waiting = id.as_u64().and_then(|id| self.asks.lock().remove(&id));
        match waiting {
            Some(tx) => {
                let _ = tx.send(outcome);
                Ok(())
            }
            None => Err(RpcError::internal("an answer to an ask nobody waits for any more")),
        }
    }

    fn is_alive(&self) -> bool {
        true
    }

    async fn close(&self, _end_session: bool) {}

    fn present(&self, client_authorization: Option<&str>) {
        if let Some(credentials) = &self.credentials {
            credentials.present(client_authorization);
        }
    }
}
