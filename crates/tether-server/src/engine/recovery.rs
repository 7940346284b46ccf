//! Rehydration (invariant 2: any process can serve any session) and the
//! closing of requests a crash cut off (invariant 7: every primed request
//! ends with exactly one final response).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tether_store::{EventKind, now_ms};
use tether_wire::{RpcError, envelope};

use super::session::{Session, SessionState};
use super::{EngineError, INTERRUPTED_MESSAGE, Inner, replicas};

impl Inner {
    /// The cached session, or the stored one rehydrated (and its interrupted
    /// requests closed). `None` if the store does not have it.
    pub(crate) async fn load(self: &Arc<Self>, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let _guard = self.loading.lock().await;
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let Some(record) = self.store.get_session(id, now_ms()).await? else {
            return Ok(None);
        };
        let state: SessionState = match serde_json::from_value(record.state) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(session = %id, error = %e, "stored session state is unreadable; treating the session as gone");
                return Ok(None);
            }
        };
        let session = Arc::new(Session::new(record.id, record.principal, record.revision, state, record.expires_at_ms));
        self.close_interrupted(&session).await?;
        self.cache(session.clone());
        tracing::info!(session = %id, "session rehydrated from the store");
        Ok(Some(session))
    }

    /// Appends the final error response to every request stream of `session`
    /// that has none and whose request is not running anywhere.
    async fn close_interrupted(&self, session: &Session) -> Result<(), EngineError> {
        for stream in self.store.open_streams(&session.id).await? {
            if stream.stream.starts_with('r') {
                self.close_if_orphaned(session, &stream.stream).await?;
            }
        }
        Ok(())
    }

    /// Closes one unfinished request stream with the "interrupted" error if
    /// its owner is gone: an earlier process of a single-node store, or a
    /// replica whose lease lapsed. Replicas race through a compare-and-set
    /// guard, so the stream gets exactly one final response.
    pub(crate) async fn close_if_orphaned(&self, session: &Session, stream: &str) -> Result<(), EngineError> {
        let prime = self.store.read_after(&session.id, stream, 0, 1).await?;
        let meta: Value = prime
            .first()
            .filter(|e| e.kind == EventKind::Prime)
            .and_then(|e| serde_json::from_slice(&e.payload).ok())
            .unwrap_or(Value::Null);
        let owner = meta.get("owner").and_then(Value::as_str).unwrap_or("");
        if owner == self.instance || (self.store.is_shared() && replicas::is_alive(self, owner).await?) {
            return Ok(());
        }
        let guard = format!("{}/{stream}", session.id);
        let expires = Some(now_ms() + self.config.session_ttl.as_millis() as i64 * 2);
        if self.store.kv_compare_and_set("closed", &guard, None, Bytes::from_static(b"1"), expires).await?.is_none() {
            return Ok(()); // another replica closed it
        }
        let id = meta.get("id").cloned().unwrap_or(Value::Null);
        let payload = envelope::error_message(Some(&id), &RpcError::internal(INTERRUPTED_MESSAGE));
        self.emit(&session.id, stream, EventKind::Final, payload).await?;
        tracing::warn!(session = %session.id, %stream, "closed a request interrupted by a restart");
        Ok(())
    }
}
