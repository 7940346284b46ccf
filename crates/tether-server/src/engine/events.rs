//! [`Events`]: a stream's events appended to the store, then published to
//! this process's live connections: stored before seen. The one way the
//! engine emits anything; a cheap handle, held by the engine and given to
//! what emits (a request's stream, the ending of one a crash cut off).

use std::sync::Arc;

use bytes::Bytes;
use tether_store::{EventKind, Store, StoreError};

use super::live::{LiveEvent, LiveHub};

/// Appends, then publishes (see the module's doc). Clones share the store and the hub.
#[derive(Clone)]
pub(crate) struct Events {
    store: Arc<dyn Store>,
    hub: Arc<LiveHub>,
    /// This process, recorded as the owner of the request streams it primes.
    instance: Arc<str>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn Store>, hub: Arc<LiveHub>, instance: &str) -> Self {
        Self { store, hub, instance: instance.into() }
    }

    /// Whether other replicas share the store (a request stream's events
    /// then go through [`Events::continued`]).
    pub(crate) fn is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// This process's instance ID.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Appends the first events of a stream this process just named, in one
    /// commit, then publishes them.
    pub(crate) async fn first(&self, session: &str, stream: &str, events: Vec<(EventKind, Bytes)>) -> Result<u64, StoreError> {
        let first = self.store.start_stream(session, stream, events.clone()).await?;
        crate::metrics::events_appended(events.len());
        for (i, (kind, payload)) in events.into_iter().enumerate() {
            self.hub.publish(session, stream, LiveEvent { seq: first + i as u64, kind, payload: Some(payload) });
        }
        Ok(first)
    }

    /// Appends one event, then publishes it.
    pub(crate) async fn emit(&self, session: &str, stream: &str, kind: EventKind, payload: Bytes) -> Result<u64, StoreError> {
        let seq = self.store.append(session, stream, kind, payload.clone()).await?;
        crate::metrics::events_appended(1);
        self.hub.publish(session, stream, LiveEvent { seq, kind, payload: Some(payload) });
        Ok(seq)
    }

    /// [`Events::emit`] on a request stream this process runs or ran, above
    /// `floor` and started again with `restart` if the store lost it
    /// ([`Store::append_continued`]).
    pub(crate) async fn continued(
        &self,
        session: &str,
        stream: &str,
        floor: u64,
        restart: Bytes,
        kind: EventKind,
        payload: Bytes,
    ) -> Result<u64, StoreError> {
        let seq = self.store.append_continued(session, stream, floor, restart, vec![(kind, payload.clone())]).await?;
        crate::metrics::events_appended(1);
        self.hub.publish(session, stream, LiveEvent { seq, kind, payload: Some(payload) });
        Ok(seq)
    }
}
