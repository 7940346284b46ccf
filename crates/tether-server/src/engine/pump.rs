//! Turns one stream's log into the frames of one SSE connection.
//!
//! A pump first catches up from the store (after the client's cursor), then
//! follows the live broadcast. The subscription is taken before the first
//! store read, so nothing committed in between is missed; sequence numbers
//! drop duplicates, and any gap or lag sends the pump back to the store.
//! That is how replay-to-live hands over without loss or duplicates.

use std::sync::Arc;

use tether_store::{EventKind, StoreError, StoredEvent};
use tokio::sync::{broadcast, mpsc};

use super::Inner;
use super::live::{LiveEvent, Subscription};
use super::session::Session;
use crate::ids::EventId;

/// Events read from the store per catch-up round.
const CATCHUP_PAGE: usize = 512;
/// Frames buffered between a pump and its HTTP body.
const FRAME_BUFFER: usize = 64;

/// What the HTTP layer writes, one SSE event (or comment) per frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// An event with an ID and empty data, plus the `retry` hint.
    Prime { id: EventId },
    /// A JSON-RPC message.
    Event { id: EventId, data: bytes::Bytes },
    /// A comment that keeps proxies and clients from timing out.
    KeepAlive,
    /// Sent before the server closes the stream on purpose (shutdown).
    Reconnect,
}

/// The frames of one pump, as its HTTP body reads them.
///
/// They travel boxed: a tokio mpsc channel allocates its slots in blocks of
/// 32 when it is made, whatever its capacity, and a `Frame` is 64 bytes, so
/// each open stream (most of them idle for hours) held a 2 KiB block; boxed,
/// a slot is 8 bytes. The box is one small allocation per frame sent.
pub struct Frames(mpsc::Receiver<Box<Frame>>);

impl Frames {
    /// Frames that are all known now (the stream has nothing more to send).
    pub(crate) fn ready(frames: impl IntoIterator<Item = Frame>) -> Frames {
        let frames: Vec<Frame> = frames.into_iter().collect();
        let (tx, rx) = mpsc::channel(frames.len().max(1));
        for frame in frames {
            // The channel has room for every frame.
            let _ = tx.try_send(Box::new(frame));
        }
        Frames(rx)
    }

    /// The next frame; `None` when the pump ended.
    pub async fn recv(&mut self) -> Option<Frame> {
        self.0.recv().await.map(|frame| *frame)
    }

    /// The next frame if one is ready now.
    pub fn try_recv(&mut self) -> Option<Frame> {
        self.0.try_recv().ok().map(|frame| *frame)
    }
}

pub(crate) struct PumpSpec {
    pub stream: String,
    /// Deliver events with `seq > after`.
    pub after: u64,
    /// Read the store before following the broadcast.
    pub catch_up: bool,
    /// End after the stream's final response (request streams).
    pub close_on_final: bool,
    /// Standalone stream: the takeover generation this connection owns.
    pub standalone_generation: Option<u64>,
    /// Sent before anything else.
    pub first: Option<Frame>,
    /// A request stream's POST connection: attached while this pump runs.
    #[allow(dead_code)] // held, never read: dropping it detaches
    pub attachment: Option<super::request_stream::Attachment>,
}

enum Step {
    Continue,
    End,
}

struct Pump {
    inner: Arc<Inner>,
    session: Arc<Session>,
    spec: PumpSpec,
    tx: mpsc::Sender<Box<Frame>>,
    cursor: u64,
}

impl Pump {
    async fn deliver(&mut self, seq: u64, kind: EventKind, payload: bytes::Bytes) -> Step {
        let id = EventId::new(&self.spec.stream, seq);
        let frame = match kind {
            EventKind::Prime => Frame::Prime { id },
            _ => Frame::Event { id, data: payload },
        };
        if self.tx.send(Box::new(frame)).await.is_err() {
            return Step::End;
        }
        self.cursor = seq;
        if kind == EventKind::Final && self.spec.close_on_final {
            return Step::End;
        }
        Step::Continue
    }

    fn remember_delivery(&self) {
        if self.spec.standalone_generation.is_some() {
            let store = self.inner.store.clone();
            let (session, stream, seq) = (self.session.id.clone(), self.spec.stream.clone(), self.cursor);
            self.inner.spawn(async move {
                if let Err(e) = store.set_cursor(&session, &stream, seq).await {
                    tracing::warn!(%session, error = %e, "could not record standalone stream cursor");
                }
            });
        }
    }

    /// Reads the store after the cursor; `End` when the stream is done or broken.
    /// While a full page is delivered the next one is read, so a long replay
    /// waits for the store about once, not once per page.
    async fn catch_up(&mut self) -> Step {
        let store = self.inner.store.clone();
        let (session, stream) = (self.session.id.clone(), self.spec.stream.clone());
        let mut page = match store.read_after(&session, &stream, self.cursor, CATCHUP_PAGE).await {
            Ok(page) => page,
            Err(e) => return self.read_failed(e).await,
        };
        loop {
            crate::metrics::events_replayed(page.len());
            let next_after = page.last().map(|event| event.seq).filter(|_| page.len() == CATCHUP_PAGE);
            let before = self.cursor;
            let (delivered, next) = match next_after {
                Some(after) => {
                    let (delivered, next) =
                        tokio::join!(self.deliver_page(page), store.read_after(&session, &stream, after, CATCHUP_PAGE));
                    (delivered, Some(next))
                }
                None => (self.deliver_page(page).await, None),
            };
            if let Step::End = delivered {
                return Step::End;
            }
            if self.cursor != before {
                self.remember_delivery();
            }
            page = match next {
                None => return Step::Continue,
                Some(Ok(page)) => page,
                Some(Err(e)) => return self.read_failed(e).await,
            };
        }
    }

    async fn deliver_page(&mut self, page: Vec<StoredEvent>) -> Step {
        for event in page {
            if let Step::End = self.deliver(event.seq, event.kind, event.payload).await {
                return Step::End;
            }
        }
        Step::Continue
    }

    async fn read_failed(&self, e: StoreError) -> Step {
        tracing::warn!(session = %self.session.id, error = %e, "replay read failed; asking client to reconnect");
        let _ = self.tx.send(Box::new(Frame::Reconnect)).await;
        Step::End
    }

    async fn run(mut self, sub: Subscription) {
        let standalone_shared = self.spec.standalone_generation.is_some() && self.inner.store.is_shared();
        if standalone_shared {
            super::replicas::mark_standalone(&self.inner, &self.session.id).await;
        }
        self.follow(sub, standalone_shared).await;
        if standalone_shared {
            super::replicas::unmark_standalone(&self.inner, &self.session.id).await;
        }
    }

    async fn follow(&mut self, mut sub: Subscription, standalone_shared: bool) {
        if let Some(first) = self.spec.first.take()
            && self.tx.send(Box::new(first)).await.is_err()
        {
            return;
        }
        let mut owner = self.session.standalone_owner.subscribe();
        // Not `interval(..)` + a first `tick().await`: that first tick goes
        // through the timer wheel and costs up to a millisecond per stream.
        let period = self.inner.config.keepalive;
        let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut catch_up = self.spec.catch_up;
        loop {
            if catch_up {
                // Boxed: a catch-up (store reads and a page in flight) is
                // the largest state of the pump, and a task's future is
                // allocated at its largest for as long as it lives; a stream
                // spends nearly all of it idle in the `select!` below.
                if let Step::End = Box::pin(self.catch_up()).await {
                    return;
                }
                catch_up = false;
            }
            tokio::select! {
                biased;
                _ = self.inner.shutdown.cancelled() => {
                    let _ = self.tx.send(Box::new(Frame::Reconnect)).await;
                    return;
                }
                _ = self.session.closed.cancelled() => return,
                _ = self.tx.closed() => return,
                changed = owner.changed(), if self.spec.standalone_generation.is_some() => {
                    if changed.is_err() || Some(*owner.borrow()) != self.spec.standalone_generation {
                        // A newer GET took over the standalone stream.
                        return;
                    }
                }
                received = sub.rx.recv() => match received {
                    Ok(LiveEvent { seq, .. }) if seq <= self.cursor => {}
                    Ok(LiveEvent { seq, kind, payload: Some(payload) }) if seq == self.cursor + 1 => {
                        if let Step::End = self.deliver(seq, kind, payload).await {
                            return;
                        }
                        self.remember_delivery();
                    }
                    // A gap, a lag, or an append by another replica: read the store.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => catch_up = true,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = keepalive.tick() => {
                    if self.tx.send(Box::new(Frame::KeepAlive)).await.is_err() {
                        return;
                    }
                    if standalone_shared {
                        super::replicas::mark_standalone(&self.inner, &self.session.id).await;
                    }
                }
            }
        }
    }
}

/// Starts a pump for `session` and returns the frames it produces.
pub(crate) fn spawn_pump(inner: Arc<Inner>, session: Arc<Session>, spec: PumpSpec, sub: Subscription) -> Frames {
    let (tx, rx) = mpsc::channel(FRAME_BUFFER);
    let cursor = spec.after;
    let pump = Pump { inner, session, spec, tx, cursor };
    let inner = pump.inner.clone();
    inner.spawn(pump.run(sub));
    Frames(rx)
}

#[cfg(test)]
mod tests {
    /// The size of the future an async fn of two arguments returns, without calling it.
    fn future_size<A, B, F, Fut>(_: &F) -> usize
    where
        F: FnOnce(A, B) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// A pump's task is allocated at its future's largest state for as long
    /// as its stream is open. 1,152 bytes (catch-up boxed) with tokio's task
    /// header fit mimalloc's 1,280-byte class; before, 1,304 took the
    /// 1,536-byte one. A change to the pump's `select!` that crosses this
    /// line costs about 256 bytes per open stream (streams_10k).
    #[test]
    fn an_idle_pump_task_stays_small() {
        let size = future_size(&super::Pump::run);
        assert!(size <= 1_152, "the pump's future grew to {size} bytes");
    }
}
