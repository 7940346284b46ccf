//! A request's SSE stream, whose priming event is stored lazily.
//!
//! A quick request (the common case) stores its priming event and its
//! response in ONE commit and the client gets both at once. Work that runs
//! longer than `prime_delay`, or that sends a related message on its stream
//! first, stores the priming event on its own right then, so the client can
//! resume early. Either way the priming event is the stream's first event and
//! nothing is written to a socket before it is committed.

use bytes::Bytes;
use tether_store::{EventKind, StoreError};

use super::Inner;

pub(crate) struct RequestStream {
    pub name: String,
    /// What the priming event records for recovery (request id, method, owner).
    meta: Bytes,
    primed: tokio::sync::Mutex<bool>,
}

impl RequestStream {
    pub fn new(name: String, meta: Bytes) -> Self {
        Self { name, meta, primed: tokio::sync::Mutex::new(false) }
    }

    /// Stores (and publishes) the priming event unless that happened already.
    pub async fn ensure_primed(&self, inner: &Inner, session: &str) -> Result<(), StoreError> {
        let mut primed = self.primed.lock().await;
        if !*primed {
            inner.emit(session, &self.name, EventKind::Prime, self.meta.clone()).await?;
            *primed = true;
        }
        Ok(())
    }

    /// Stores the response, together with the priming event if it is still due.
    pub async fn finish(&self, inner: &Inner, session: &str, response: Bytes) -> Result<(), StoreError> {
        let mut primed = self.primed.lock().await;
        if *primed {
            inner.emit(session, &self.name, EventKind::Final, response).await?;
        } else {
            let events = vec![(EventKind::Prime, self.meta.clone()), (EventKind::Final, response)];
            inner.emit_batch(session, &self.name, events).await?;
            *primed = true;
        }
        Ok(())
    }
}
