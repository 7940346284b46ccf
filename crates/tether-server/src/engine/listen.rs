//! `subscriptions/listen` (2026-07-28): the long-lived stream that replaced
//! the session era's standalone GET. The first message acknowledges the
//! subset of the requested notifications this server honours; then
//! `notifications/tasks` for each task the client named (its current state
//! first, then each change), keep-alive comments, and, when the server shuts
//! down, the request's empty result.
//!
//! Nothing a returning listener needs is lost while it is away: task
//! notifications are the task's state, read from the store, so the first
//! one after a reconnect is the state it missed. List-changed notifications
//! are honoured only where the application says its lists can change
//! (tether's notebook says they cannot), and relayed as the application
//! tells them ([`McpApp::list_changes`](crate::app::McpApp::list_changes)).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tether_wire::{RpcError, envelope, meta};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::operations::OpRecords;
use super::sessionless::{Outbound, SessionlessReply};
use super::{Engine, EngineError, tasks};
use crate::app::Caller;

/// Tasks one listen stream may follow.
const MAX_TASKS: usize = 100;
/// How often followed tasks are read again.
const TASK_POLL: Duration = Duration::from_millis(500);

impl Engine {
    /// Opens a listen stream for `caller` on `endpoint` with the request's
    /// `notifications` filter; `id` is the listen request's id (the
    /// subscription's ID on every message).
    pub async fn listen(
        &self,
        endpoint: &str,
        caller: Caller,
        id: Value,
        filter: &Map<String, Value>,
    ) -> Result<SessionlessReply, EngineError> {
        let inner = &self.inner;
        if inner.life.shutdown.is_cancelled() {
            return Err(EngineError::ShuttingDown);
        }
        let described = self.discover(endpoint).await?.unwrap_or_default();
        let capabilities = described.get("capabilities").cloned().unwrap_or(Value::Null);
        let mut honoured = Map::new();
        for (key, capability, flag) in [
            ("toolsListChanged", "tools", "listChanged"),
            ("promptsListChanged", "prompts", "listChanged"),
            ("resourcesListChanged", "resources", "listChanged"),
        ] {
            let can_change = capabilities.get(capability).and_then(|c| c.get(flag)).and_then(Value::as_bool) == Some(true);
            if filter.get(key).and_then(Value::as_bool) == Some(true) && can_change {
                honoured.insert(key.into(), json!(true));
            }
        }
        let mut followed = Vec::new();
        if let Some(ids) = filter.get("taskIds").and_then(Value::as_array) {
            if !tasks::declares(caller.client_capabilities()) {
                let refused = tasks::extension_required("notifications/tasks on subscriptions/listen");
                return Ok(SessionlessReply::answered(&id, refused));
            }
            for task in ids.iter().filter_map(Value::as_str).take(MAX_TASKS) {
                // Only the caller's own tasks; others are left out of the acknowledgement.
                if tasks::snapshot(&inner.operations.records, &caller.principal, task).await.ok().flatten().is_some() {
                    followed.push(task.to_owned());
                }
            }
            honoured.insert("taskIds".into(), json!(followed));
        }
        let changes = inner.apps.get(endpoint).and_then(|app| app.list_changes());
        let permit = inner.listeners.admit(&caller.principal).map_err(|r| EngineError::TooMany(r.message()))?;
        let (tx, messages) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let stream = Listener {
            records: inner.operations.records.clone(),
            keepalive: inner.config.keepalive,
            shutdown: inner.life.shutdown.clone(),
            tx,
            id: id.clone(),
            principal: caller.principal.clone(),
        };
        let stopped = cancel.clone();
        // One JSON-RPC span for the stream's life (`--otlp-endpoint`).
        let span = crate::trace::rpc_span("subscriptions/listen", None, None);
        inner.life.spawn(
            async move {
                let _permit = permit;
                stream.run(honoured, followed, changes, stopped).await;
            }
            .instrument(span),
        );
        Ok(SessionlessReply::new(messages, cancel))
    }
}

/// One listen stream, and what it needs of the engine: the tasks' records
/// (what it follows), the keep-alive period, the shutdown (its graceful end).
struct Listener {
    records: OpRecords,
    keepalive: Duration,
    shutdown: CancellationToken,
    tx: mpsc::Sender<Outbound>,
    id: Value,
    principal: String,
}

impl Listener {
    /// A notification of this subscription (its ID in `_meta`).
    async fn send(&self, method: &str, mut params: Map<String, Value>) -> bool {
        let subscription = json!({(meta::SUBSCRIPTION_ID): self.id});
        match params.get_mut("_meta") {
            Some(Value::Object(m)) => m.extend(subscription.as_object().cloned().unwrap_or_default()),
            _ => {
                params.insert("_meta".into(), subscription);
            }
        }
        let body = envelope::outbound_message(None, method, Some(&Value::Object(params)));
        self.tx.send(Outbound::Notification(body)).await.is_ok()
    }

    async fn run(
        self,
        honoured: Map<String, Value>,
        mut followed: Vec<String>,
        mut changes: Option<broadcast::Receiver<String>>,
        stopped: CancellationToken,
    ) {
        let mut ack = Map::new();
        ack.insert("notifications".into(), Value::Object(honoured.clone()));
        if !self.send("notifications/subscriptions/acknowledged", ack).await {
            return;
        }
        let mut last_seen: HashMap<String, (Value, Value)> = HashMap::new();
        let mut keepalive = tokio::time::interval(self.keepalive);
        keepalive.tick().await;
        let mut poll = tokio::time::interval(TASK_POLL);
        loop {
            tokio::select! {
                _ = poll.tick(), if !followed.is_empty() => {
                    let mut still = Vec::with_capacity(followed.len());
                    for task in followed {
                        let Ok(Some(state)) = tasks::snapshot(&self.records, &self.principal, &task).await else { continue };
                        let marker = (state["status"].clone(), state["lastUpdatedAt"].clone());
                        if last_seen.get(&task) != Some(&marker) {
                            let terminal = !matches!(marker.0.as_str(), Some("working" | "input_required"));
                            last_seen.insert(task.clone(), marker);
                            let Value::Object(params) = state else { continue };
                            if !self.send("notifications/tasks", params).await {
                                return;
                            }
                            if terminal {
                                continue;
                            }
                        }
                        still.push(task);
                    }
                    followed = still;
                }
                change = next_change(&mut changes) => {
                    if let Some(method) = change
                        && LIST_CHANGES.iter().any(|(key, m)| *m == method && honoured.get(*key) == Some(&json!(true)))
                        && !self.send(&method, Map::new()).await
                    {
                        return;
                    }
                }
                _ = keepalive.tick() => {
                    if self.tx.send(Outbound::KeepAlive).await.is_err() {
                        return;
                    }
                }
                _ = self.tx.closed() => return,
                _ = stopped.cancelled() => return,
                _ = self.shutdown.cancelled() => {
                    // The graceful end: the listen request's (empty) result.
                    let result = json!({"resultType": "complete", "_meta": {(meta::SUBSCRIPTION_ID): self.id}});
                    if let Ok(raw) = crate::app::raw_result(&result) {
                        let body = envelope::raw_result_message(&self.id, &raw);
                        let _ = self.tx.send(Outbound::Answer { body, error: None }).await;
                    }
                    return;
                }
            }
        }
    }
}

/// The listen filter's keys of the list-changed notifications, and their methods.
const LIST_CHANGES: [(&str, &str); 3] = [
    ("toolsListChanged", "notifications/tools/list_changed"),
    ("promptsListChanged", "notifications/prompts/list_changed"),
    ("resourcesListChanged", "notifications/resources/list_changed"),
];

/// The application's next list change; `None` (and no more waiting) when
/// it has none to tell or stopped telling. A stream that fell behind goes
/// on with the next one.
async fn next_change(changes: &mut Option<broadcast::Receiver<String>>) -> Option<String> {
    loop {
        let Some(receiver) = changes.as_mut() else { return std::future::pending().await };
        match receiver.recv().await {
            Ok(method) => return Some(method),
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => *changes = None,
        }
    }
}

/// `params.notifications` of a listen request, or why it is unusable.
pub fn filter(params: &Map<String, Value>) -> Result<&Map<String, Value>, RpcError> {
    params
        .get("notifications")
        .and_then(Value::as_object)
        .ok_or_else(|| RpcError::invalid_params("subscriptions/listen needs params.notifications (an object of opt-ins)"))
}
