//! The calls this process runs now, for operators ([`Calls`]): the admin
//! API's `GET /admin/calls` and its live stream `GET /admin/calls/stream`.
//!
//! A call is entered where the engine builds a request's work (a session's
//! request in `Engine::post`, a sessionless one in `call_sessionless`) and
//! left when its [`CallGuard`] drops: the guard lives inside the work's
//! future, so it goes when the work returns, panics, is cancelled or is
//! dropped unrun (a request refused before it ran). Each start and end is
//! also sent on a broadcast channel of [`EVENTS`] slots; a subscriber that
//! falls further behind than that is told it lagged and reads a fresh
//! snapshot instead (the admin stream does), so nothing here grows with a
//! slow reader. The registry itself holds one small entry per request
//! running, which the engine's own limits bound (requests in flight per
//! session, sessionless requests); a name longer than [`NAME_CHARS`] is cut.
//!
//! What it costs a request: one lock, one map insert and one removal, and a
//! broadcast only while someone watches.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::broadcast;

/// Starts and ends a subscriber may be behind before it is told it lagged.
pub const EVENTS: usize = 1024;
/// A tool's or prompt's name, or a resource's URI, is kept to this many characters.
pub const NAME_CHARS: usize = 256;

/// One request running in this process.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// This process's number for it (not the JSON-RPC id).
    pub id: u64,
    /// Its session; `None` for a sessionless (2026-07-28) request.
    pub session: Option<String>,
    /// Whose call it is.
    pub principal: String,
    /// The endpoint's name (`""`: `/mcp`).
    pub endpoint: String,
    /// Its JSON-RPC method.
    pub method: String,
    /// What it calls: the tool's or prompt's `name`, or the resource's `uri`.
    pub name: Option<String>,
    /// The client's JSON-RPC id.
    pub request_id: Value,
    /// When it started (ms since the epoch).
    pub started_ms: i64,
}

/// A call started or ended.
#[derive(Debug, Clone)]
pub enum CallEvent {
    /// A call started.
    Start(Arc<Call>),
    /// A call ended.
    End {
        /// The call's number ([`Call::id`]).
        id: u64,
        /// When it ended (ms since the epoch).
        ended_ms: i64,
    },
}

/// The calls running in this process.
pub struct Calls {
    running: Mutex<HashMap<u64, Arc<Call>>>,
    next: AtomicU64,
    events: broadcast::Sender<CallEvent>,
}

impl Default for Calls {
    fn default() -> Self {
        Self { running: Mutex::default(), next: AtomicU64::new(1), events: broadcast::channel(EVENTS).0 }
    }
}

/// What a request is about, from its params: `name` (tools, prompts) or `uri` (resources).
fn subject(params: Option<&Map<String, Value>>) -> Option<String> {
    let p = params?;
    let s = p.get("name").or_else(|| p.get("uri")).and_then(Value::as_str)?;
    Some(s.chars().take(NAME_CHARS).collect())
}

impl Calls {
    /// Notes a request running until the guard drops.
    pub fn enter(
        self: &Arc<Self>,
        session: Option<&str>,
        principal: &str,
        endpoint: &str,
        method: &str,
        request_id: &Value,
        params: Option<&Map<String, Value>>,
    ) -> CallGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let call = Arc::new(Call {
            id,
            session: session.map(str::to_owned),
            principal: principal.to_owned(),
            endpoint: endpoint.to_owned(),
            method: method.to_owned(),
            name: subject(params),
            request_id: request_id.clone(),
            started_ms: tether_store::now_ms(),
        });
        self.running.lock().insert(id, call.clone());
        if self.events.receiver_count() > 0 {
            let _ = self.events.send(CallEvent::Start(call));
        }
        CallGuard { calls: self.clone(), id }
    }

    /// [`Calls::enter`] for a request of `session`.
    pub(crate) fn enter_session(
        self: &Arc<Self>,
        session: &super::Session,
        method: &str,
        request_id: &Value,
        params: Option<&Map<String, Value>>,
    ) -> CallGuard {
        self.enter(Some(&session.id), &session.principal, &session.endpoint, method, request_id, params)
    }

    /// How many run now.
    pub fn len(&self) -> usize {
        self.running.lock().len()
    }

    /// Whether no call runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// At most `limit` of the calls running now, the longest running first,
    /// and how many run in all.
    pub fn snapshot(&self, limit: usize) -> (Vec<Arc<Call>>, usize) {
        let mut all: Vec<Arc<Call>> = self.running.lock().values().cloned().collect();
        let total = all.len();
        all.sort_unstable_by_key(|c| (c.started_ms, c.id));
        all.truncate(limit);
        (all, total)
    }

    /// Starts and ends from now on (see the module doc for a lagging one).
    pub fn subscribe(&self) -> broadcast::Receiver<CallEvent> {
        self.events.subscribe()
    }
}

/// A call running; leaves [`Calls`] when dropped.
pub struct CallGuard {
    calls: Arc<Calls>,
    id: u64,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let removed = self.calls.running.lock().remove(&self.id);
        if removed.is_some() && self.calls.events.receiver_count() > 0 {
            let _ = self.calls.events.send(CallEvent::End { id: self.id, ended_ms: tether_store::now_ms() });
        }
    }
}

impl super::Engine {
    /// The calls this process runs now (the admin API's `/admin/calls`).
    pub fn calls(&self) -> &Arc<Calls> {
        &self.inner.calls
    }

    /// SSE connections open in this process on any stream of session `id`.
    pub fn open_connections(&self, id: &str) -> usize {
        self.inner.hub.session_connections(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_call_runs_until_its_guard_drops_and_watchers_hear_both() {
        let calls = Arc::new(Calls::default());
        let mut events = calls.subscribe();
        let params = json!({"name": "x".repeat(1000)});
        let guard = calls.enter(Some("s1"), "alice", "gw", "tools/call", &json!(7), params.as_object());
        let (listed, total) = calls.snapshot(10);
        assert_eq!(total, 1);
        assert_eq!(listed[0].name.as_deref().map(str::len), Some(NAME_CHARS), "a long name is cut");
        assert_eq!(listed[0].session.as_deref(), Some("s1"));
        match events.recv().await {
            Ok(CallEvent::Start(call)) => assert_eq!(call.id, listed[0].id),
            other => panic!("a start, not {other:?}"),
        }
        drop(guard);
        assert!(calls.is_empty());
        match events.recv().await {
            Ok(CallEvent::End { id, .. }) => assert_eq!(id, listed[0].id),
            other => panic!("an end, not {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_snapshot_is_bounded_and_a_slow_watcher_is_told_it_lagged() {
        let calls = Arc::new(Calls::default());
        let mut slow = calls.subscribe();
        let guards: Vec<CallGuard> =
            (0..EVENTS + 10).map(|i| calls.enter(None, "p", "", "tools/call", &json!(i), None)).collect();
        let (listed, total) = calls.snapshot(100);
        assert_eq!((listed.len(), total), (100, EVENTS + 10));
        assert!(listed.windows(2).all(|w| (w[0].started_ms, w[0].id) <= (w[1].started_ms, w[1].id)), "oldest first");
        assert!(matches!(slow.recv().await, Err(broadcast::error::RecvError::Lagged(_))));
        drop(guards);
        assert!(calls.is_empty());
    }
}
