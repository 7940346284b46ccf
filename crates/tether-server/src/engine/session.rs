//! One MCP session as this process holds it: a cache of the stored record
//! plus what only lives in memory (running requests, pending server-to-client
//! requests, which GET connection owns the standalone stream).
//!
//! The stored record is the truth (invariant 2): everything here except the
//! in-flight maps can be rebuilt from the store at any time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

/// The engine's part of a stored session (`SessionRecord::state`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionState {
    pub protocol_version: String,
    pub standalone_stream: String,
    #[serde(default)]
    pub client_info: Value,
    #[serde(default)]
    pub client_capabilities: Value,
    #[serde(default)]
    pub initialized: bool,
    /// Bumped by every resume; only tokens of the current generation resume.
    #[serde(default)]
    pub resume_generation: u64,
    /// Context the application keeps per session (e.g. the notebook's bound root).
    #[serde(default)]
    pub app: Map<String, Value>,
}

pub(crate) struct Durable {
    pub revision: u64,
    pub state: SessionState,
}

pub type ClientAnswer = Result<Value, Value>;

pub struct Session {
    pub id: String,
    pub principal: String,
    pub standalone_stream: String,
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
    pub(crate) protocol_version: Mutex<String>,
    /// Cancelled when the session ends (DELETE, expiry): its pumps stop.
    pub(crate) closed: CancellationToken,
}

impl Session {
    pub(crate) fn new(id: String, principal: String, revision: u64, state: SessionState, expires_at_ms: i64) -> Self {
        Self {
            id,
            principal,
            standalone_stream: state.standalone_stream.clone(),
            protocol_version: Mutex::new(state.protocol_version.clone()),
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

    pub fn protocol_version(&self) -> String {
        self.protocol_version.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub(crate) fn inflight_count(&self) -> usize {
        self.inflight.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub(crate) fn is_busy(&self) -> bool {
        self.inflight_count() > 0 || self.pending.lock().map(|m| !m.is_empty()).unwrap_or(false)
    }

    pub(crate) fn last_seen(&self) -> i64 {
        self.last_seen.load(Ordering::Relaxed)
    }

    /// A copy of the stored state.
    pub async fn state(&self) -> SessionState {
        self.durable.lock().await.state.clone()
    }
}
