//! One MCP session as this process holds it: a cache of the stored record
//! plus what only lives in memory (running requests, pending server-to-client
//! requests, which GET connection owns the standalone stream).
//!
//! The stored record is the truth (invariant 2): everything here except the
//! in-flight maps can be rebuilt from the store at any time.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::app::{Caller, ClientDeclaration};

/// The engine's part of a stored session (`SessionRecord::state`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionState {
    /// The revision, `clientInfo` and capabilities of the current `initialize`
    /// (stored as top-level fields, as before they were a struct of their own).
    #[serde(flatten)]
    pub client: Arc<ClientDeclaration>,
    /// The name of the session's standalone (GET) stream.
    pub standalone_stream: String,
    /// Whether `notifications/initialized` came.
    #[serde(default)]
    pub initialized: bool,
    /// Bumped by every resume; only tokens of the current generation resume.
    #[serde(default)]
    pub resume_generation: u64,
    /// Context the application keeps per session (e.g. the notebook's bound root).
    #[serde(default)]
    pub app: Map<String, Value>,
    /// The endpoint the session was initialized on (`""`: `/mcp`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
}

pub(crate) struct Durable {
    pub revision: u64,
    pub state: SessionState,
}

pub type ClientAnswer = Result<Value, Value>;

/// One live session in memory: its identity and a cache of its stored state.
pub struct Session {
    /// The session ID.
    pub id: String,
    /// Whose session it is.
    pub principal: String,
    /// The name of its standalone (GET) stream.
    pub standalone_stream: String,
    /// The endpoint (application) this session belongs to.
    pub endpoint: String,
    pub(crate) durable: tokio::sync::Mutex<Durable>,
    /// Expiry last written to the store (ms).
    pub(crate) expires_persisted: AtomicI64,
    /// Last request seen by this process (ms).
    pub(crate) last_seen: AtomicI64,
    /// Requests running in this process, by JSON-serialized request id.
    pub(crate) inflight: Mutex<HashMap<String, CancellationToken>>,
    /// Server-to-client requests waiting for an answer, by request id.
    pub(crate) pending: Mutex<HashMap<String, oneshot::Sender<ClientAnswer>>>,
    pub(crate) next_server_request: AtomicU64,
    /// Bumped whenever a GET takes over the standalone stream.
    pub(crate) standalone_owner: watch::Sender<u64>,
    /// The client as the current `initialize` declared it (replaced on
    /// resume); the same allocation as in `durable.state`.
    client: Mutex<Arc<ClientDeclaration>>,
    /// The application's in-memory state (`SessionCtx::local`).
    pub(crate) local: Mutex<super::ctx::Local>,
    /// Client notifications waiting for the application, in order (none
    /// allocated for a session that never had one waiting).
    pub(crate) notifications: Mutex<NotificationQueue>,
    /// Cancelled when the session ends (DELETE, expiry): its pumps stop.
    pub(crate) closed: CancellationToken,
}

/// A client notification for the application.
pub(crate) struct QueuedNotification {
    pub method: String,
    pub params: Option<Map<String, Value>>,
}

/// The notifications of one session waiting for the application, handled
/// one at a time by a drain task that exists only while some wait.
#[derive(Default)]
pub(crate) struct NotificationQueue {
    pub waiting: VecDeque<QueuedNotification>,
    /// A drain task is running (it clears this when it finds the queue empty).
    pub draining: bool,
}

impl Session {
    pub(crate) fn new(id: String, principal: String, revision: u64, state: SessionState, expires_at_ms: i64) -> Self {
        Self {
            client: Mutex::new(state.client.clone()),
            id,
            principal,
            standalone_stream: state.standalone_stream.clone(),
            endpoint: state.endpoint.clone(),
            local: Mutex::new(None),
            notifications: Mutex::new(NotificationQueue::default()),
            durable: tokio::sync::Mutex::new(Durable { revision, state }),
            expires_persisted: AtomicI64::new(expires_at_ms),
            last_seen: AtomicI64::new(tether_store::now_ms()),
            inflight: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            next_server_request: AtomicU64::new(1),
            standalone_owner: watch::channel(0).0,
            closed: CancellationToken::new(),
        }
    }

    /// The protocol revision the session speaks.
    pub fn protocol_version(&self) -> String {
        self.client().protocol_version.clone()
    }

    pub(crate) fn client(&self) -> Arc<ClientDeclaration> {
        self.client.lock().clone()
    }

    /// The caller of this session's requests.
    pub(crate) fn caller(&self) -> Caller {
        Caller { principal: self.principal.clone(), client: self.client() }
    }

    /// After the state changed (a resume): the caller follows it.
    pub(crate) fn set_caller_from(&self, state: &SessionState) {
        let client = state.client.clone();
        *self.client.lock() = client;
    }

    /// The application's in-memory state of type `T` (created on first use;
    /// state of another type is replaced).
    pub(crate) fn local<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut local = self.local.lock();
        if let Some(found) = local.clone().and_then(|l| l.downcast::<T>().ok()) {
            return found;
        }
        let fresh = Arc::new(T::default());
        *local = Some(fresh.clone() as Arc<dyn Any + Send + Sync>);
        fresh
    }

    /// Sets the application's in-memory state (from `initialize`).
    pub(crate) fn set_local(&self, local: Arc<dyn Any + Send + Sync>) {
        *self.local.lock() = Some(local);
    }

    /// Takes the application's in-memory state (the session is leaving).
    pub(crate) fn take_local(&self) -> super::ctx::Local {
        self.local.lock().take()
    }

    pub(crate) fn inflight_count(&self) -> usize {
        self.inflight.lock().len()
    }

    pub(crate) fn is_busy(&self) -> bool {
        self.inflight_count() > 0 || !self.pending.lock().is_empty() || self.notifications.lock().draining
    }

    /// Server-to-client requests waiting for the client's answer here.
    pub fn pending_client_requests(&self) -> usize {
        self.pending.lock().len()
    }

    pub(crate) fn last_seen(&self) -> i64 {
        self.last_seen.load(Ordering::Relaxed)
    }

    /// A copy of the stored state.
    pub async fn state(&self) -> SessionState {
        self.durable.lock().await.state.clone()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_stored_state_keeps_its_layout_so_earlier_sessions_load() {
        let stored = json!({
            "protocol_version": "2025-06-18", "standalone_stream": "gabc",
            "client_info": {"name": "c", "version": "1"}, "client_capabilities": {"roots": {}},
            "initialized": true, "resume_generation": 2, "app": {"k": 1}
        });
        let state: SessionState = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(state.client.protocol_version, "2025-06-18");
        assert_eq!(state.client.client_capabilities, json!({"roots": {}}));
        assert_eq!(state.endpoint, "", "sessions stored before endpoints belong to /mcp");
        assert_eq!(serde_json::to_value(&state).unwrap(), stored, "written back the same way");
    }
}
