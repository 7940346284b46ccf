//! A request's SSE stream, whose priming event is stored lazily, and the
//! quick answer that spares a quick request the streaming machinery.
//!
//! A quick request (the common case) stores only its response and hands it
//! straight to the POST that waits for it ([`Quick::Done`]): the HTTP layer
//! writes one complete body, the priming event (ID `<stream>.0`, the position
//! before the response) and the response, with no pump task, no live
//! subscription and no chunked encoding. That priming event needs no row of
//! its own: it leaves only after the response is committed, and resuming
//! from it replays the response. Work that runs longer than `prime_delay`,
//! or that sends a related message on its stream first, stores its priming
//! event on its own right then (with the request's id, method and owner, so
//! that a crash can close the request) and tells the POST to stream instead
//! ([`Quick::Stream`]): the POST then follows the stream from the store like
//! any other connection. Either way nothing reaches a client before what it
//! names is committed.
//!
//! On a shared store every later event of the stream is appended above the
//! highest sequence number the store gave it before
//! ([`tether_store::Store::append_continued`]): a failover under `normal`
//! durability may take back events a client already read, and the events
//! after them must not take their numbers (the client, resuming from one,
//! would skip them, its final response too); a stream lost altogether
//! starts again with its priming event.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use tether_store::{EventKind, StoreError};
use tokio::sync::oneshot;

use super::events::Events;

/// What the waiting POST learns from its request's work.
pub(crate) enum Quick {
    /// The response is committed as event `response_seq` of the stream
    /// (the first); the priming event to send before it is `response_seq - 1`.
    Done { response_seq: u64, response: Bytes },
    /// The work is slow or talks on its stream: follow the stream, whose
    /// priming event is committed as event `prime_seq`.
    Stream { prime_seq: u64 },
    /// The store could not commit the request's first event (its priming
    /// event or its response): nothing of it reached anyone, and the POST
    /// answers 503 with this reason at once rather than follow a stream
    /// that has nothing to give.
    Failed(String),
}

struct State {
    primed: bool,
    /// The priming event's sequence number, once it is stored on its own.
    prime_seq: u64,
    /// The POST waiting for a [`Quick`] answer, until it gets one.
    waiting: Option<oneshot::Sender<Quick>>,
}

pub(crate) struct RequestStream {
    pub name: String,
    /// The request, for the priming event's record (only a slow request
    /// stores one, so it is rendered then: `super::prime_meta`).
    request_id: serde_json::Value,
    method: String,
    state: tokio::sync::Mutex<State>,
    /// The POST that started the request is still connected (waiting for a
    /// quick answer or about to stream). Live subscriptions count apart.
    attached: Arc<AtomicBool>,
    /// The highest sequence number the store gave this stream.
    last_seq: AtomicU64,
    /// Its priming event is stored: a client may hold its ID.
    prime_stored: AtomicBool,
    /// Run once its final response is stored ([`RequestStream::after_final`]).
    after_final: parking_lot::Mutex<Vec<AfterFinal>>,
    /// Its application carries it on in the next process: a drain that
    /// runs out leaves it open rather than ending it interrupted.
    outlives_process: AtomicBool,
}

/// What to do once a request's final response is stored.
pub(crate) type AfterFinal = Box<dyn FnOnce() + Send>;

/// Keeps [`RequestStream::is_attached`] true while held by the POST (first
/// while it waits, then inside its pump); dropping it detaches. It does not
/// keep the stream alive: when the work's task ends, the waiting POST hears it.
pub(crate) struct Attachment(Arc<AtomicBool>);

impl Drop for Attachment {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl RequestStream {
    /// A new stream, attached to its POST, which waits on the returned receiver.
    pub fn new(name: String, request_id: serde_json::Value, method: &str) -> (Arc<Self>, Attachment, oneshot::Receiver<Quick>) {
        let (tx, rx) = oneshot::channel();
        let attached = Arc::new(AtomicBool::new(true));
        let stream = Arc::new(Self {
            name,
            request_id,
            method: method.to_owned(),
            state: tokio::sync::Mutex::new(State { primed: false, prime_seq: 0, waiting: Some(tx) }),
            attached: attached.clone(),
            last_seq: AtomicU64::new(0),
            prime_stored: AtomicBool::new(false),
            after_final: parking_lot::Mutex::default(),
            outlives_process: AtomicBool::new(false),
        });
        (stream, Attachment(attached), rx)
    }

    /// The stream of a request a crash cut off, whose priming event is
    /// stored (by the process that died) and whose work is carried on here:
    /// nobody waits for a quick answer; clients follow it with `GET`.
    pub fn recovered(name: String, request_id: serde_json::Value, method: &str) -> Arc<Self> {
        Arc::new(Self {
            name,
            request_id,
            method: method.to_owned(),
            state: tokio::sync::Mutex::new(State { primed: true, prime_seq: 0, waiting: None }),
            attached: Arc::new(AtomicBool::new(false)),
            last_seq: AtomicU64::new(0),
            prime_stored: AtomicBool::new(true),
            after_final: parking_lot::Mutex::default(),
            outlives_process: AtomicBool::new(false),
        })
    }

    /// The request's JSON-RPC id.
    pub fn request_id(&self) -> &serde_json::Value {
        &self.request_id
    }

    /// The highest sequence number the store gave this stream (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Acquire)
    }

    /// Whether its priming event is stored (a client may hold its ID).
    pub fn prime_stored(&self) -> bool {
        self.prime_stored.load(Ordering::Acquire)
    }

    /// The store gave this stream `seq` (for its priming event, if `prime`).
    pub(crate) fn handed_out(&self, seq: u64, prime: bool) {
        self.last_seq.fetch_max(seq, Ordering::AcqRel);
        if prime {
            self.prime_stored.store(true, Ordering::Release);
        }
    }

    /// The priming event's record: the request's id and method, and the
    /// instance that runs it (for recovery: `super::prime_meta`).
    pub(crate) fn prime_meta(&self, events: &Events) -> bytes::Bytes {
        super::prime_meta(&self.request_id, &self.method, events.instance())
    }

    /// Appends a later event of this stream (not its first) and publishes
    /// it: on a shared store above every number the stream was given
    /// before, starting the stream again if the store lost it (see the
    /// module's documentation).
    pub async fn emit(&self, events: &Events, session: &str, kind: EventKind, payload: Bytes) -> Result<u64, StoreError> {
        let seq = if events.is_shared() {
            let restart = self.prime_meta(events);
            events.continued(session, &self.name, self.last_seq(), restart, kind, payload).await?
        } else {
            events.emit(session, &self.name, kind, payload).await?
        };
        self.handed_out(seq, false);
        Ok(seq)
    }

    /// Whether the POST that started the request still listens.
    pub fn is_attached(&self) -> bool {
        self.attached.load(Ordering::Acquire)
    }

    /// Stores (and publishes) the priming event unless that happened already;
    /// a waiting POST is then told to stream, or, if the store failed, to
    /// answer 503.
    pub async fn ensure_primed(&self, events: &Events, session: &str) -> Result<(), StoreError> {
        let mut state = self.state.lock().await;
        if !state.primed {
            let meta = self.prime_meta(events);
            match events.first(session, &self.name, vec![(EventKind::Prime, meta)]).await {
                Ok(seq) => {
                    state.prime_seq = seq;
                    self.handed_out(seq, true);
                }
                Err(e) => {
                    if let Some(waiting) = state.waiting.take() {
                        let _ = waiting.send(Quick::Failed(e.to_string()));
                    }
                    return Err(e);
                }
            }
            state.primed = true;
        }
        if let Some(waiting) = state.waiting.take() {
            let _ = waiting.send(Quick::Stream { prime_seq: state.prime_seq });
        }
        Ok(())
    }

    /// Whether the priming event is stored: a client may hold its ID, so
    /// the request owes it a stored final response.
    pub async fn is_primed(&self) -> bool {
        self.state.lock().await.primed
    }

    /// Stores the response and hands it to a waiting POST. A stream that
    /// was never primed gets no priming row: the response is its first event.
    /// If the commit fails, a waiting POST is told so ([`Quick::Failed`]),
    /// except when a write the request deferred failed: the caller then
    /// stores an error response instead, which the POST still waits for.
    /// See [`crate::RequestCtx::outlives_process`].
    pub fn set_outlives_process(&self) {
        self.outlives_process.store(true, Ordering::Release);
    }

    /// Whether a drain that runs out leaves it to the next process.
    pub fn outlives_process(&self) -> bool {
        self.outlives_process.load(Ordering::Acquire) && self.prime_stored()
    }

    /// Runs `f` once the final response is stored (never if it is not: a
    /// crash, a store that never took it).
    pub fn after_final(&self, f: AfterFinal) {
        self.after_final.lock().push(f);
    }

    /// Stores the final response; then runs what waited for it.
    pub async fn finish(&self, events: &Events, session: &str, response: Bytes) -> Result<(), StoreError> {
        self.store_final(events, session, response).await?;
        let waiting = std::mem::take(&mut *self.after_final.lock());
        for f in waiting {
            f();
        }
        Ok(())
    }

    async fn store_final(&self, events: &Events, session: &str, response: Bytes) -> Result<(), StoreError> {
        let mut state = self.state.lock().await;
        if state.primed {
            self.emit(events, session, EventKind::Final, response).await?;
            return Ok(());
        }
        let response_seq = match events.first(session, &self.name, vec![(EventKind::Final, response.clone())]).await {
            Ok(seq) => seq,
            Err(e) => {
                if !matches!(e, StoreError::EarlierWriteFailed(_))
                    && let Some(waiting) = state.waiting.take()
                {
                    let _ = waiting.send(Quick::Failed(e.to_string()));
                }
                return Err(e);
            }
        };
        self.handed_out(response_seq, false);
        let waiting = state.waiting.take();
        state.primed = true;
        if let Some(waiting) = waiting {
            let _ = waiting.send(Quick::Done { response_seq, response });
        }
        Ok(())
    }
}
