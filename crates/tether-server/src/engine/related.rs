//! Messages related to a request, and the server's requests to the client.
//!
//! A message related to a request goes on its request's stream while a
//! connection listens there, else on the standalone stream if one listens
//! (here, or on another replica), else on the request's stream, for replay
//! (design brief, "Streams and events"). A request to the client goes the
//! same way and waits for the answer, bounded three ways: at most
//! `max_pending_client_requests` waiting per session, the caller's timeout,
//! and the engine's shutdown.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tether_store::EventKind;
use tether_wire::{RpcError, envelope};
use tokio_util::sync::CancellationToken;

use super::ctx::{request_key, storage_error};
use super::events::Events;
use super::live::LiveHub;
use super::replicas::Replicas;
use super::request_stream::RequestStream;
use super::session::Session;

/// What related messages need of the engine: who listens where (this
/// process's live connections; on a shared store, the other replicas),
/// how messages are stored and published, this process's name (in the ids
/// of its requests to the client), the bound on those waiting per session,
/// and the shutdown. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Related {
    pub(crate) hub: Arc<LiveHub>,
    pub(crate) events: Events,
    /// On a shared store: the other replicas' listeners and answers.
    pub(crate) replicas: Option<Replicas>,
    pub(crate) instance: Arc<str>,
    pub(crate) max_pending: usize,
    pub(crate) shutdown: CancellationToken,
}

impl Related {
    /// The stream a message related to `own` (or to none: the session's) goes on.
    async fn stream(&self, session: &Session, own: Option<&RequestStream>) -> String {
        let own = own.map(|s| (s.name.as_str(), s.is_attached()));
        match own {
            Some((s, attached)) if attached || self.hub.connections(&session.id, s) > 0 => s.to_owned(),
            _ if self.hub.connections(&session.id, &session.standalone_stream) > 0 => session.standalone_stream.clone(),
            Some(_) if self.standalone_live_elsewhere(&session.id).await => session.standalone_stream.clone(),
            Some((s, _)) => s.to_owned(),
            None => session.standalone_stream.clone(),
        }
    }

    async fn standalone_live_elsewhere(&self, session: &str) -> bool {
        match &self.replicas {
            Some(replicas) => replicas.standalone_live_anywhere(session).await,
            None => false,
        }
    }

    /// Stores `payload` on the stream it goes on, then publishes it.
    pub(crate) async fn emit(&self, session: &Session, own: Option<&RequestStream>, payload: Bytes) -> Result<(), RpcError> {
        let stream = self.stream(session, own).await;
        if let Some(own) = own.filter(|own| own.name == stream) {
            // The priming event comes first on its stream.
            own.ensure_primed(&self.events, &session.id).await.map_err(storage_error)?;
            return own.emit(&self.events, &session.id, EventKind::Message, payload).await.map(|_| ()).map_err(storage_error);
        }
        self.events.emit(&session.id, &stream, EventKind::Message, payload).await.map(|_| ()).map_err(storage_error)
    }

    /// Sends `method` to the client as a request related to `own` and
    /// waits at most `timeout` for its answer.
    pub(crate) async fn request_client(
        &self,
        session: &Session,
        own: Option<&RequestStream>,
        method: &str,
        params: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, RpcError> {
        let n = session.next_server_request.fetch_add(1, Ordering::Relaxed);
        let id = Value::String(format!("tether-{}-{n}", self.instance));
        let key = request_key(&id);
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut pending = session.pending.lock();
            let limit = self.max_pending;
            if pending.len() >= limit {
                return Err(RpcError::internal(format!(
                    "{limit} requests to the client are already waiting for its answers in this session; not sending {method}"
                )));
            }
            pending.insert(key.clone(), tx);
        }
        let _slot = PendingSlot { session, key: key.clone() };
        let payload = envelope::outbound_message(Some(&id), method, params.as_ref());
        self.emit(session, own, payload).await?;
        let answer = async {
            match &self.replicas {
                // The client may POST its answer to another replica.
                Some(replicas) => tokio::time::timeout(timeout, replicas.await_answer(&session.id, &key, rx)).await.map(Ok),
                None => tokio::time::timeout(timeout, rx).await,
            }
        };
        let answer = tokio::select! {
            answer = answer => answer,
            _ = self.shutdown.cancelled() => return Err(RpcError::internal(format!("the server is shutting down; {method} was not answered"))),
        };
        match answer {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(error))) => Err(RpcError::from_object(&error)),
            Ok(Err(_)) => Err(RpcError::internal("session ended before the client answered")),
            Err(_) => Err(RpcError::internal(format!("client did not answer {method} within {}s", timeout.as_secs_f32()))),
        }
    }
}

/// Removes a pending server-to-client request from its session's map however
/// the wait ends (answer, timeout, the waiting request being dropped).
struct PendingSlot<'a> {
    session: &'a Session,
    key: String,
}

impl Drop for PendingSlot<'_> {
    fn drop(&mut self) {
        self.session.pending.lock().remove(&self.key);
    }
}
