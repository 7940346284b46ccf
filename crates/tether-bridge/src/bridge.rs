//! The forwarding core: the host's JSON-RPC messages (one per stdin line) go
//! to the remote session, the remote's answers and its own messages go back.
//!
//! - The host's `initialize` becomes the remote `initialize`, with the resume
//!   token (if [`ResumeTokenStore`] has one) in `_meta`. The remote's result
//!   goes back without tether's `_meta` keys: the host never sees a token.
//! - A host request is forwarded on its own task (at most
//!   [`BridgeOptions::max_in_flight`] at once, as the server allows per
//!   session; beyond that it is refused) and answered with the host's
//!   original id.
//! - A request from the remote (e.g. `roots/list`) goes to the host under a
//!   bridge-assigned id; the host's answer goes back under the remote's id.
//! - When the remote forgets the session (404) the bridge initializes again
//!   with the current token (resumed, or fresh if refused) and retries the
//!   message once.
//! - The connector completes the handshake (`notifications/initialized`
//!   included), so the host's own `notifications/initialized` is not
//!   forwarded: the remote would run its on-initialized work twice.
//! - End of input ends the bridge once the requests in flight are answered
//!   (at most [`BridgeOptions::drain_timeout`]). The remote session is left
//!   alone (no DELETE): the next bridge of this host resumes it.
//!
//! One handler per message kind: `Host::request`, `Host::notification`,
//! `Host::response` (the host's lines, read in order by [`run`]), and
//! `Shared::relay` with `Shared::remote_request` / `Shared::answer_remote`
//! (the remote's messages and the host's answers to them).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tether_wire::meta::{RESUME_REFUSED, RESUMED, SESSION_RESUME_TOKEN, TETHER_PREFIX};
use tether_wire::{Inbound, RpcError, parse_message};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::stdio::Outgoing;
use crate::token_store::{ResumeTokenStore, log_lines};
use crate::upstream::{Connector, PeerMessage, UpstreamError, UpstreamSession};
use tether_wire::ndjson::Line;

/// Limits of one bridge.
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    /// Host requests forwarded at once (more are refused with an error).
    pub max_in_flight: usize,
    /// Remote requests waiting for the host's answer.
    pub max_pending_server_requests: usize,
    /// Longest accepted stdin line (for the error message).
    pub max_line: usize,
    /// After stdin closed, how long requests in flight may still finish.
    pub drain_timeout: std::time::Duration,
}

impl Default for BridgeOptions {
    fn default() -> Self {
        Self {
            max_in_flight: 64,
            max_pending_server_requests: 256,
            max_line: crate::stdio::DEFAULT_MAX_LINE,
            drain_timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// The remote session currently in use; `generation` counts initializations.
struct Remote {
    generation: u64,
    session: Arc<dyn UpstreamSession>,
}

/// Remote requests waiting for the host: bridge id -> (generation, remote id).
#[derive(Default)]
struct Pending {
    next_id: u64,
    map: HashMap<u64, (u64, Value)>,
}

struct Shared {
    connector: Arc<dyn Connector>,
    tokens: Mutex<ResumeTokenStore>,
    /// The host's `initialize` params (without tether keys), for re-initializing.
    init_params: Mutex<Option<Value>>,
    remote: Mutex<Option<Arc<Remote>>>,
    /// Serializes re-initializations (one per lost session, not one per request).
    reconnecting: tokio::sync::Mutex<()>,
    out: mpsc::Sender<Outgoing>,
    pending: Mutex<Pending>,
    /// The task relaying the current remote session's messages to the host.
    relays: Mutex<Vec<AbortHandle>>,
    options: BridgeOptions,
}

/// Runs the bridge until `input` ends; then tells the writer to close.
pub async fn run(
    connector: Arc<dyn Connector>,
    tokens: ResumeTokenStore,
    mut input: mpsc::Receiver<Line>,
    out: mpsc::Sender<Outgoing>,
    options: BridgeOptions,
) {
    let mut host = Host {
        permits: Arc::new(Semaphore::new(options.max_in_flight.max(1))),
        shared: Arc::new(Shared {
            connector,
            tokens: Mutex::new(tokens),
            init_params: Mutex::new(None),
            remote: Mutex::new(None),
            reconnecting: tokio::sync::Mutex::new(()),
            out: out.clone(),
            pending: Mutex::new(Pending::default()),
            relays: Mutex::new(Vec::new()),
            options,
        }),
        in_flight: HashMap::new(),
        tasks: JoinSet::new(),
    };
    loop {
        let line = tokio::select! {
            line = input.recv() => line,
            Some(done) = host.tasks.join_next(), if !host.tasks.is_empty() => {
                if let Ok(Some(key)) = done {
                    host.in_flight.remove(&key);
                }
                continue;
            }
        };
        match line {
            None => break,
            Some(Line::TooLong { len, head, tail }) => {
                // A request is answered under its id when that can be read; a
                // notification has nobody to answer.
                let salvaged = tether_wire::ndjson::salvage_id(&head, &tail);
                if salvaged.has_method && salvaged.id.is_none() {
                    tracing::warn!(
                        len,
                        "dropping a notification from the host longer than {} bytes",
                        host.shared.options.max_line
                    );
                    continue;
                }
                let message =
                    format!("message of {len} bytes, longer than {} bytes (--max-message-bytes)", host.shared.options.max_line);
                let id = salvaged.id.unwrap_or(Value::Null);
                host.shared.send(error_response(id, RpcError::invalid_request(message))).await;
            }
            Some(Line::Text(bytes)) => host.line(&bytes).await,
        }
    }
    host.drain().await;
    let _ = out.send(Outgoing::Close).await;
}

/// The host's side of the bridge: what it sent and what is still running for it.
struct Host {
    shared: Arc<Shared>,
    /// One per host request in flight ([`BridgeOptions::max_in_flight`]).
    permits: Arc<Semaphore>,
    /// Host requests in flight by id (for `notifications/cancelled`).
    in_flight: HashMap<String, AbortHandle>,
    /// Forwarded requests (yielding their `in_flight` key) and answers.
    tasks: JoinSet<Option<String>>,
}

impl Host {
    /// One stdin line: sorted by message kind.
    async fn line(&mut self, bytes: &[u8]) {
        let message = match parse_message(bytes) {
            Ok(message) => message,
            Err(e) => {
                let error = RpcError::new(e.code, e.message);
                self.shared.send(error_response(e.id.unwrap_or(Value::Null), error)).await;
                return;
            }
        };
        match message {
            Inbound::Request { id, method, params } if method == "initialize" => {
                self.shared.initialize(id, params.map(Value::Object)).await
            }
            Inbound::Request { id, method, params } => self.request(id, method, params.map(Value::Object)).await,
            Inbound::Notification { method, params } => self.notification(method, params.map(Value::Object)).await,
            Inbound::Response { id, outcome } => self.response(id, outcome),
        }
    }

    /// A host request: forwarded on its own task, answered under the host's id.
    async fn request(&mut self, id: Value, method: String, params: Option<Value>) {
        let shared = &self.shared;
        if shared.current().is_none() {
            let response = if method == "ping" {
                json!({"jsonrpc": "2.0", "id": id, "result": {}})
            } else {
                error_response(id, RpcError::invalid_request("not initialized: send initialize first"))
            };
            shared.send(response).await;
            return;
        }
        // Refused rather than waited for: a blocked stdin would also
        // hold back the host's answers that running requests wait on.
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let text = format!("too many requests in flight (at most {})", shared.options.max_in_flight);
            shared.send(error_response(id, RpcError::internal(text))).await;
            return;
        };
        let key = id.to_string();
        let done_key = key.clone();
        let task = shared.clone();
        let handle = self.tasks.spawn(async move {
            let result = task.with_retry(|s| {
                let params = params.clone();
                let method = method.clone();
                async move { s.request(&method, params).await }
            });
            let response = match result.await {
                Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err(e) => error_response(id, e.to_rpc_error()),
            };
            task.send(response).await;
            drop(permit);
            Some(done_key)
        });
        self.in_flight.insert(key, handle);
    }

    /// A host notification: forwarded in order (before the next line is read).
    async fn notification(&mut self, method: String, params: Option<Value>) {
        if method == "notifications/cancelled" {
            // The remote knows the request under the client runtime's
            // id, not the host's: aborting the task drops its upstream
            // request, and the client runtime tells the remote.
            let key = params.as_ref().and_then(|p| p.get("requestId")).map(Value::to_string);
            if let Some(handle) = key.and_then(|k| self.in_flight.remove(&k)) {
                handle.abort();
                debug!("host cancelled a request");
            }
            return;
        }
        if method == "notifications/initialized" {
            // The connector completed the handshake itself, before the
            // host saw the result; a second one would repeat the
            // server's on-initialized work (e.g. its roots/list).
            debug!("notifications/initialized was already sent to the remote");
            return;
        }
        if self.shared.current().is_none() {
            debug!("dropping notification {method} before initialize");
            return;
        }
        let sent = self.shared.with_retry(|s| {
            let params = params.clone();
            let method = method.clone();
            async move { s.notify(&method, params).await }
        });
        if let Err(e) = sent.await {
            warn!("forwarding {method} to the remote failed: {e}");
        }
    }

    /// The host's answer to a remote request: back to the session that
    /// asked, under the remote's id, or nowhere.
    fn response(&mut self, id: Value, answer: Result<Value, Value>) {
        let Some((generation, remote_id)) = id.as_u64().and_then(|bid| self.shared.pending.lock().map.remove(&bid)) else {
            debug!("dropping a host response to unknown id {id}");
            return;
        };
        let task = self.shared.clone();
        self.tasks.spawn(async move {
            task.answer_remote(generation, remote_id, answer).await;
            None
        });
    }

    /// After stdin closed: requests already sent still get their answers (a
    /// host may read stdout until the process exits), for a bounded time.
    async fn drain(mut self) {
        debug!("stdin closed; the bridge ends (the remote session stays for the next start)");
        let timeout = self.shared.options.drain_timeout;
        let drained = tokio::time::timeout(timeout, async { while self.tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            debug!("requests still running after {timeout:?} are abandoned");
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        for relay in self.shared.relays.lock().drain(..) {
            relay.abort();
        }
        *self.shared.remote.lock() = None;
    }
}

fn error_response(id: Value, error: RpcError) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error.to_object()})
}

/// Removes every `dev.tether/…` key from `value["_meta"]` (and `_meta` if
/// nothing is left).
pub fn strip_tether_meta(value: &mut Value) {
    let Some(object) = value.as_object_mut() else { return };
    let now_empty = match object.get_mut("_meta") {
        Some(Value::Object(meta)) => {
            meta.retain(|k, _| !k.starts_with(TETHER_PREFIX));
            meta.is_empty()
        }
        _ => false,
    };
    if now_empty {
        object.remove("_meta");
    }
}

impl Shared {
    fn current(&self) -> Option<Arc<Remote>> {
        self.remote.lock().clone()
    }

    async fn send(&self, message: Value) {
        if self.out.send(Outgoing::Message(message)).await.is_err() {
            debug!("stdout is closed; dropping a message for the host");
        }
    }

    /// The host's `initialize`: open the remote session (resuming if a token
    /// is kept) and answer with the remote's result.
    async fn initialize(self: &Arc<Self>, id: Value, params: Option<Value>) {
        if self.current().is_some() {
            self.send(error_response(id, RpcError::invalid_request("already initialized"))).await;
            return;
        }
        let mut params = params.unwrap_or_else(|| json!({}));
        strip_tether_meta(&mut params);
        match self.handshake(&params).await {
            Ok((session, result)) => {
                *self.init_params.lock() = Some(params);
                // The result first: the remote's own messages (already
                // buffered by the session) must not overtake it.
                self.send(json!({"jsonrpc": "2.0", "id": id, "result": result})).await;
                self.install(session, 1);
            }
            Err(e) => {
                warn!("initialize with the remote failed: {e}");
                self.send(error_response(id, e.to_rpc_error())).await;
            }
        }
    }

    /// `initialize` with the kept token; handles resumed/refused and keeps
    /// the rotated token. Returns the session and the host-facing result.
    async fn handshake(&self, host_params: &Value) -> Result<(Arc<dyn UpstreamSession>, Value), UpstreamError> {
        let token = self.tokens.lock().load();
        let mut params = host_params.clone();
        if let (Some(token), Some(object)) = (&token, params.as_object_mut()) {
            let meta = object.entry("_meta").or_insert_with(|| json!({}));
            if !meta.is_object() {
                *meta = json!({});
            }
            meta[SESSION_RESUME_TOKEN] = json!(token);
        }
        let (session, mut result) = self.connector.connect(params).await?;
        let meta = result.get("_meta");
        let resumed = meta.and_then(|m| m.get(RESUMED)).and_then(Value::as_bool) == Some(true);
        let new_token = meta.and_then(|m| m.get(SESSION_RESUME_TOKEN)).and_then(Value::as_str).map(str::to_owned);
        let refusal = meta.and_then(|m| m.get(RESUME_REFUSED)).map(Value::to_string).unwrap_or_default();
        {
            let mut tokens = self.tokens.lock();
            if token.is_some() {
                if resumed {
                    info!("{}", log_lines::RESUMED);
                } else {
                    warn!("{}", log_lines::REJECTED);
                    debug!("resume refused: {refusal}");
                    tokens.delete();
                }
            }
            if let Some(new_token) = new_token {
                tokens.store(&new_token);
            }
        }
        strip_tether_meta(&mut result);
        Ok((Arc::from(session), result))
    }

    /// Makes `session` the current one and starts forwarding its messages.
    fn install(self: &Arc<Self>, session: Arc<dyn UpstreamSession>, generation: u64) -> Arc<Remote> {
        let remote = Arc::new(Remote { generation, session: session.clone() });
        let mut relays = self.relays.lock();
        for old in relays.drain(..) {
            old.abort();
        }
        if let Some(incoming) = session.take_incoming() {
            let shared = self.clone();
            relays.push(tokio::spawn(async move { shared.relay(generation, incoming).await }).abort_handle());
        }
        // The host's answers to an earlier session's requests would be
        // dropped anyway; they must not hold places the new session needs.
        self.pending.lock().map.retain(|_, (asked_by, _)| *asked_by == generation);
        *self.remote.lock() = Some(remote.clone());
        remote
    }

    /// Relays the remote's own messages to the host, in order.
    async fn relay(self: Arc<Self>, generation: u64, mut incoming: mpsc::Receiver<PeerMessage>) {
        while let Some(message) = incoming.recv().await {
            let message = match message {
                PeerMessage::Notification { method, params } => with_params(json!({"jsonrpc": "2.0", "method": method}), params),
                PeerMessage::Request { id, method, params } => match self.remote_request(generation, id, &method).await {
                    Some(bridge_id) => with_params(json!({"jsonrpc": "2.0", "id": bridge_id, "method": method}), params),
                    None => continue,
                },
            };
            if self.out.send(Outgoing::Message(message)).await.is_err() {
                return;
            }
        }
        debug!("the remote session's message stream ended");
    }

    /// A remote request for the host: the bridge id it goes out under, or
    /// `None` when too many wait already (the remote is refused at once).
    async fn remote_request(&self, generation: u64, id: Value, method: &str) -> Option<u64> {
        let bridge_id = {
            let mut pending = self.pending.lock();
            if pending.map.len() >= self.options.max_pending_server_requests {
                None
            } else {
                pending.next_id += 1;
                let bridge_id = pending.next_id;
                pending.map.insert(bridge_id, (generation, id.clone()));
                Some(bridge_id)
            }
        };
        if bridge_id.is_none() {
            warn!("too many remote requests waiting for the host; refusing {method}");
            if let Some(remote) = self.current() {
                let error = RpcError::internal("too many requests waiting for the host");
                let _ = remote.session.respond(id, Err(error.to_object())).await;
            }
        }
        bridge_id
    }

    /// The host's answer to the request `remote_id` of remote session
    /// `generation`.
    async fn answer_remote(self: &Arc<Self>, generation: u64, remote_id: Value, answer: Result<Value, Value>) {
        // The id belongs to the session that asked: another session never
        // sent it, so the answer is not retried there.
        let Some(remote) = self.current().filter(|r| r.generation == generation) else {
            debug!("dropping a host response for an earlier remote session");
            return;
        };
        match remote.session.respond(remote_id, answer).await {
            Ok(()) => {}
            Err(UpstreamError::SessionNotFound) => {
                debug!("the remote session that asked is gone; its answer is dropped");
                if let Err(e) = self.reconnect(generation).await {
                    warn!("initializing the remote session again failed: {e}");
                }
            }
            Err(e) => warn!("forwarding the host's answer to the remote failed: {e}"),
        }
    }

    /// Runs `op` on the current session; if the remote forgot the session,
    /// initializes again and runs it once more.
    async fn with_retry<T, F, Fut>(self: &Arc<Self>, op: F) -> Result<T, UpstreamError>
    where
        F: Fn(Arc<dyn UpstreamSession>) -> Fut,
        Fut: std::future::Future<Output = Result<T, UpstreamError>>,
    {
        let remote = self.current().ok_or(UpstreamError::SessionNotFound)?;
        match op(remote.session.clone()).await {
            Err(UpstreamError::SessionNotFound) => {
                let remote = self.reconnect(remote.generation).await?;
                op(remote.session.clone()).await
            }
            other => other,
        }
    }

    /// A new remote session after generation `seen` was lost (once, however
    /// many requests noticed it).
    async fn reconnect(self: &Arc<Self>, seen: u64) -> Result<Arc<Remote>, UpstreamError> {
        let _one_at_a_time = self.reconnecting.lock().await;
        if let Some(current) = self.current()
            && current.generation != seen
        {
            return Ok(current);
        }
        let params = self.init_params.lock().clone().ok_or(UpstreamError::SessionNotFound)?;
        warn!("The remote server does not know the session any more; initializing again");
        let (session, _) = self.handshake(&params).await?;
        Ok(self.install(session, seen + 1))
    }
}

fn with_params(mut message: Value, params: Option<Value>) -> Value {
    if let Some(params) = params {
        message["params"] = params;
    }
    message
}
