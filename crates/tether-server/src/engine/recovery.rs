//! Rehydration (invariant 2: any process can serve any session) and the
//! requests a crash cut off (invariant 7: every primed request ends with
//! exactly one final response): closed as interrupted, or carried on by
//! their application from the note it left (`McpApp::recover_request`).

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::Value;
use tether_store::{EventKind, StoreError, now_ms};
use tether_wire::{RpcError, envelope};

use crate::app::CutOff;

use super::running::Known;
use super::session::{Session, SessionState};
use super::{EngineError, INTERRUPTED_MESSAGE, Inner, LOST_MESSAGE};

/// A request stream's pump asks, on a shared store: is anybody left to end it?
impl super::pump::Orphans for Inner {
    fn check(self: Arc<Self>, session: Arc<Session>, stream: String) -> BoxFuture<'static, Result<(), EngineError>> {
        Box::pin(async move { self.close_if_orphaned(&session, &stream, AskOwner::Yes).await })
    }
}

impl Inner {
    /// The cached session, or the stored one rehydrated (and its interrupted
    /// requests closed). `None` if the store does not have it.
    pub(crate) async fn load(self: &Arc<Self>, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let _guard = self.cache.loading.lock().await;
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
    /// that has none and whose request is not running anywhere (or carries
    /// it on, where its application left a note).
    async fn close_interrupted(self: &Arc<Self>, session: &Arc<Session>) -> Result<(), EngineError> {
        for stream in self.store.open_streams(&session.id).await? {
            if stream.stream.starts_with('r') {
                self.close_if_orphaned(session, &stream.stream, AskOwner::No).await?;
            }
        }
        Ok(())
    }

    /// Ends one unfinished request stream that nobody will end: its owner
    /// is gone (an earlier process of a single-node store, or a replica
    /// whose lease lapsed), or its owner is this process, which ran it to
    /// its end, and the store lost the final response (see `running.rs`).
    /// The owner is the process named by the stream's priming event, or the
    /// one that took it over last (the `closed` record). Processes race
    /// through a compare-and-set on that record, so one of them wins. The
    /// winner carries a gone owner's request on if its application left a
    /// note ([`RequestCtx::leave_recovery_note`](super::RequestCtx::leave_recovery_note)),
    /// else ends it with the "interrupted" error; a lost final is ended
    /// with [`LOST_MESSAGE`]. Either way the stream gets exactly one final
    /// response. An owner alive elsewhere is asked to look at its own
    /// stream when `ask` says so (a client waits on it here).
    pub(crate) async fn close_if_orphaned(
        self: &Arc<Self>,
        session: &Arc<Session>,
        stream: &str,
        ask: AskOwner,
    ) -> Result<(), EngineError> {
        if self.running.contains(stream) {
            return Ok(());
        }
        let prime = self.store.read_after(&session.id, stream, 0, 1).await?;
        if prime.is_empty() {
            // No such stream: on a shared store, one a failover took back
            // altogether (its priming event, which names its owner, too).
            // Only a replica that knows its request can end it (a client
            // resuming it asked already; a waiting one asks again).
            if self.store.is_shared() && !self.revive_own(session, stream).await? && ask == AskOwner::Yes {
                self.replicas.ask_anyone(&session.id, stream).await;
            }
            return Ok(());
        }
        let meta: Value = prime
            .first()
            .filter(|e| e.kind == EventKind::Prime)
            .and_then(|e| serde_json::from_slice(&e.payload).ok())
            .unwrap_or(Value::Null);
        let guard = format!("{}/{stream}", session.id);
        let taken = self.store.kv_get(TAKEN_NAMESPACE, &guard, now_ms()).await?;
        let (owner, expected) = match &taken {
            // Closed by a build that marked it so.
            Some(record) if record.value.as_ref() == CLOSED_MARK => return Ok(()),
            Some(record) => (String::from_utf8_lossy(&record.value).into_owned(), Some(record.revision)),
            None => (meta.get("owner").and_then(Value::as_str).unwrap_or("").to_owned(), None),
        };
        let id = meta.get("id").cloned().unwrap_or(Value::Null);
        if owner == self.instance {
            // It ended here (it is not running): the store lost its final.
            return self.end_lost(session, stream, &id).await;
        }
        if self.store.is_shared() && self.replicas.is_alive(&owner).await? {
            if ask == AskOwner::Yes {
                self.replicas.ask_to_check(&session.id, stream, &owner).await;
            }
            return Ok(());
        }
        let expires = Some(now_ms() + self.config.session_ttl.as_millis() as i64 * 2);
        let me = Bytes::from(self.instance.clone());
        if self.store.kv_compare_and_set(TAKEN_NAMESPACE, &guard, expected, me, expires).await?.is_none() {
            return Ok(()); // another process (or check) took it
        }
        let method = meta.get("method").and_then(Value::as_str).unwrap_or("").to_owned();
        let noted = match self.recovery_note(&session.id, stream).await? {
            Some(noted) => Some(noted),
            None if self.app_of(session).recovers_unnoted() => Some((Value::Null, None)),
            None => None,
        };
        if let Some((note, progress_token)) = noted {
            let sent = self.sent_on(&session.id, stream).await?;
            tracing::warn!(session = %session.id, %stream, %method, "carrying on a request cut off by a restart");
            let cut_off = CutOff { method, note, sent };
            self.clone().carry_on_request(session.clone(), stream, id, progress_token, cut_off);
            return Ok(());
        }
        let payload = envelope::error_message(Some(&id), &RpcError::internal(INTERRUPTED_MESSAGE));
        self.events.emit(&session.id, stream, EventKind::Final, payload).await?;
        tracing::warn!(session = %session.id, %stream, "closed a request interrupted by a restart");
        Ok(())
    }

    /// A request stream of `session` that this process runs or ran lately
    /// (`running.rs`), which the store may have lost in a failover: one
    /// whose request runs here and that the store lost altogether starts
    /// again with its priming event (its final response follows when the
    /// work ends); one whose request ended here but whose final the store
    /// does not show is ended with [`LOST_MESSAGE`]. False if this process
    /// does not know the stream.
    pub(crate) async fn revive_own(self: &Arc<Self>, session: &Arc<Session>, stream: &str) -> Result<bool, EngineError> {
        match self.running.known(&session.id, stream) {
            None => Ok(false),
            Some(Known::Running(running)) => {
                if running.prime_stored()
                    && self.store.restart_stream(&session.id, stream, running.prime_meta(&self.events)).await?
                {
                    tracing::warn!(session = %session.id, %stream, "started again a request stream the store lost (a failover?); its request runs on");
                }
                Ok(true)
            }
            Some(Known::Ended { request_id, .. }) => {
                self.end_lost(session, stream, &request_id).await?;
                Ok(true)
            }
        }
    }

    /// Ends request `id`'s stream, whose request ended here, with
    /// [`LOST_MESSAGE`] if the store shows no final response on it (or no
    /// stream at all), above every number the store gave it and started
    /// again if lost. Once per stream: one at a time in this process, and
    /// not if another process took the stream over.
    async fn end_lost(self: &Arc<Self>, session: &Arc<Session>, stream: &str, id: &Value) -> Result<(), EngineError> {
        let _one = self.running.ending_lost.lock().await;
        // Its final may have been stored since the caller looked (the
        // request ended here just before `running` was checked), or ended
        // by an earlier call.
        if self.running.contains(stream) || self.store.stream(&session.id, stream).await?.is_some_and(|s| s.finished) {
            return Ok(());
        }
        let guard = format!("{}/{stream}", session.id);
        let expected = match self.store.kv_get(TAKEN_NAMESPACE, &guard, now_ms()).await? {
            Some(record) if record.value.as_ref() != self.instance.as_bytes() => return Ok(()),
            Some(record) => Some(record.revision),
            None => None,
        };
        let expires = Some(now_ms() + self.config.session_ttl.as_millis() as i64 * 2);
        let me = Bytes::from(self.instance.clone());
        if self.store.kv_compare_and_set(TAKEN_NAMESPACE, &guard, expected, me, expires).await?.is_none() {
            return Ok(());
        }
        let floor = match self.running.known(&session.id, stream) {
            Some(Known::Ended { last_seq, .. }) => last_seq,
            _ => 0,
        };
        let payload = envelope::error_message(Some(id), &RpcError::internal(LOST_MESSAGE));
        let restart = super::prime_meta(id, "", &self.instance);
        self.events.continued(&session.id, stream, floor, restart, EventKind::Final, payload).await?;
        tracing::warn!(session = %session.id, %stream, "closed a request whose final response the store lost (a failover?)");
        Ok(())
    }

    /// Stores the note of a running request ([`RequestCtx::leave_recovery_note`](super::RequestCtx::leave_recovery_note)).
    pub(crate) async fn write_recovery_note(&self, session: &str, stream: &str, record: &Value) -> Result<(), StoreError> {
        let key = format!("{session}/{stream}");
        let value = Bytes::from(record.to_string());
        let expires = Some(now_ms() + self.config.session_ttl.as_millis() as i64 * 2);
        let current = self.store.kv_get(NOTE_NAMESPACE, &key, now_ms()).await?.map(|r| r.revision);
        if self.store.kv_compare_and_set(NOTE_NAMESPACE, &key, current, value, expires).await?.is_none() {
            return Err(StoreError::Backend("the request's recovery note changed while it was written".into()));
        }
        Ok(())
    }

    /// The note left for a request and its progress token, if any.
    async fn recovery_note(&self, session: &str, stream: &str) -> Result<Option<(Value, Option<Value>)>, StoreError> {
        let Some(record) = self.store.kv_get(NOTE_NAMESPACE, &format!("{session}/{stream}"), now_ms()).await? else {
            return Ok(None);
        };
        let Ok(mut record) = serde_json::from_slice::<Value>(&record.value) else {
            tracing::error!(%session, %stream, "a request's recovery note is unreadable; ending the request as interrupted");
            return Ok(None);
        };
        let token = record.get_mut("progressToken").map(Value::take).filter(|t| !t.is_null());
        Ok(Some((record.get_mut("note").map(Value::take).unwrap_or(Value::Null), token)))
    }

    /// The messages stored on a request's stream (not its priming event),
    /// parsed, at most [`MAX_SENT_HANDED_OVER`].
    async fn sent_on(&self, session: &str, stream: &str) -> Result<Vec<Value>, StoreError> {
        let events = self.store.read_after(session, stream, 0, MAX_SENT_HANDED_OVER).await?;
        Ok(events
            .iter()
            .filter(|e| e.kind == EventKind::Message)
            .filter_map(|e| serde_json::from_slice(&e.payload).ok())
            .collect())
    }
}

/// Whether [`Inner::close_if_orphaned`], finding the stream's owner alive on
/// another replica, asks it to look at the stream (a client waits on it
/// here), or leaves it (a session loaded here, its streams checked in passing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AskOwner {
    Yes,
    No,
}

/// Who carries a cut-off request on now: `session/stream` → the instance
/// that took it over (the first takeover is decided here too).
const TAKEN_NAMESPACE: &str = "closed";
/// What earlier builds stored in [`TAKEN_NAMESPACE`] for a closed request.
const CLOSED_MARK: &[u8] = b"1";
/// `session/stream` → a running request's recovery note.
const NOTE_NAMESPACE: &str = "recovery-note";
/// Messages of a cut-off request handed to its application.
const MAX_SENT_HANDED_OVER: usize = 10_000;
