//! Turns one stream's log into the frames of one SSE connection.
//!
//! A pump first catches up from the store (after the client's cursor), then
//! follows the live broadcast. The subscription is taken before the first
//! store read, so nothing committed in between is missed; sequence numbers
//! drop duplicates, and any gap or lag sends the pump back to the store.
//! That is how replay-to-live hands over without loss or duplicates.
//!
//! A pump is not a task of its own: it runs inside its [`Frames`], polled by
//! whoever reads them (hyper, through the SSE body). An open stream, most of
//! them idle for hours, then costs no task and no channel beside its
//! connection's (streams_10k in docs/benchmarks.md); the pump ends when the
//! body is dropped (the client went away), as it did when its channel closed.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tether_store::{EventKind, Store, StoreError, StoredEvent};
use tokio::sync::broadcast;

use super::EngineError;
use super::lifecycle::Lifecycle;
use super::live::{LiveEvent, Subscription};
use super::replicas::Replicas;
use super::session::Session;
use crate::ids::EventId;

/// Events read from the store per catch-up round.
const CATCHUP_PAGE: usize = 512;
/// Frames a pump produces before its reader takes them; beyond it the pump waits.
const FRAME_BUFFER: usize = 64;

/// What the HTTP layer writes, one SSE event (or comment) per frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// An event with an ID and empty data, plus the `retry` hint.
    Prime {
        /// The event's ID.
        id: EventId,
    },
    /// A JSON-RPC message.
    Event {
        /// The event's ID.
        id: EventId,
        /// The message.
        data: bytes::Bytes,
    },
    /// A comment that keeps proxies and clients from timing out.
    KeepAlive,
    /// Sent before the server closes the stream on purpose (shutdown).
    Reconnect,
}

/// Frames a pump produced that its reader has not taken yet (at most
/// [`FRAME_BUFFER`]). Shared by the pump, which pushes, and its [`Frames`],
/// which takes them; emptied, its buffer is freed, so an idle stream holds none.
#[derive(Clone, Default)]
struct Outbox(Arc<Mutex<VecDeque<Frame>>>);

impl Outbox {
    /// Waits for room, then queues `frame`. The wait needs no waker: the pump
    /// is only polled by its `Frames`, which empties the outbox before it
    /// returns the frames and polls the pump again on its next read.
    async fn send(&self, frame: Frame) {
        let mut frame = Some(frame);
        std::future::poll_fn(|_| {
            let mut queue = self.0.lock();
            if queue.len() >= FRAME_BUFFER {
                return Poll::Pending;
            }
            if let Some(frame) = frame.take() {
                queue.push_back(frame);
            }
            Poll::Ready(())
        })
        .await
    }
}

/// The frames of one stream, as its HTTP body reads them, and the pump that
/// makes them, run by [`Frames::poll_recv`]. Dropping it stops the pump.
pub struct Frames {
    outbox: Outbox,
    /// `None` once the pump ended (or for frames all known up front).
    pump: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Frames {
    /// Frames that are all known now (the stream has nothing more to send).
    pub(crate) fn ready(frames: impl IntoIterator<Item = Frame>) -> Frames {
        Frames { outbox: Outbox(Arc::new(Mutex::new(frames.into_iter().collect()))), pump: None }
    }

    /// The next frame, running the pump until it has one; `Ready(None)` when
    /// the pump ended and every frame was taken.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        if let Some(frame) = self.take() {
            return Poll::Ready(Some(frame));
        }
        if let Some(pump) = self.pump.as_mut()
            && pump.as_mut().poll(cx).is_ready()
        {
            self.pump = None;
        }
        match self.take() {
            Some(frame) => Poll::Ready(Some(frame)),
            None if self.pump.is_none() => Poll::Ready(None),
            None => Poll::Pending,
        }
    }

    fn take(&self) -> Option<Frame> {
        let mut queue = self.outbox.0.lock();
        let frame = queue.pop_front();
        if queue.is_empty() && queue.capacity() > 0 {
            // An idle stream keeps no buffer (one allocation per frame sent).
            *queue = VecDeque::new();
        }
        frame
    }

    /// The next frame; `None` when the pump ended.
    pub async fn recv(&mut self) -> Option<Frame> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

/// What every pump needs of the engine, one set shared by all of them (a
/// pointer per open stream): the store it replays from (and records a
/// standalone stream's cursor in), the engine's tasks and shutdown, the
/// keep-alive period, and this replica's hold of standalone streams.
pub(crate) struct Handles {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) life: Arc<Lifecycle>,
    pub(crate) keepalive: Duration,
    pub(crate) replicas: Replicas,
}

/// The one question a request stream's pump asks the engine, on a shared
/// store at each keep-alive: end this stream if nobody is left to (its
/// owner died, or ended it and the store lost the final). The engine
/// answers it (`recovery.rs`).
pub(crate) trait Orphans: Send + Sync {
    fn check(self: Arc<Self>, session: Arc<Session>, stream: String) -> BoxFuture<'static, Result<(), EngineError>>;
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
    pub attachment: Option<super::request_stream::Attachment>,
}

enum Step {
    Continue,
    End,
}

/// A pump's state: what of its [`PumpSpec`] it keeps (the first frame goes
/// to its outbox at once, not into the future it lives in for hours).
struct Pump {
    handles: Arc<Handles>,
    orphans: Arc<dyn Orphans>,
    session: Arc<Session>,
    stream: String,
    catch_up: bool,
    close_on_final: bool,
    standalone_generation: Option<u64>,
    #[allow(dead_code)] // held, never read: dropping it detaches
    attachment: Option<super::request_stream::Attachment>,
    out: Outbox,
    cursor: u64,
}

impl Pump {
    async fn deliver(&mut self, seq: u64, kind: EventKind, payload: bytes::Bytes) -> Step {
        let id = EventId::new(&self.stream, seq);
        let frame = match kind {
            EventKind::Prime => Frame::Prime { id },
            _ => Frame::Event { id, data: payload },
        };
        self.out.send(frame).await;
        self.cursor = seq;
        if kind == EventKind::Final && self.close_on_final {
            return Step::End;
        }
        Step::Continue
    }

    fn remember_delivery(&self) {
        if self.standalone_generation.is_some() {
            let store = self.handles.store.clone();
            let (session, stream, seq) = (self.session.id.clone(), self.stream.clone(), self.cursor);
            self.handles.life.spawn(async move {
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
        let store = self.handles.store.clone();
        let (session, stream) = (self.session.id.clone(), self.stream.clone());
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
        self.out.send(Frame::Reconnect).await;
        Step::End
    }

    async fn run(mut self, sub: Subscription) {
        let standalone_shared = self.standalone_generation.is_some() && self.handles.store.is_shared();
        // Held in the store already (`Inner::standalone_pump`); let go when the stream ends.
        let _mark = if standalone_shared {
            Some(StandaloneMark { handles: self.handles.clone(), session: self.session.id.clone() })
        } else {
            None
        };
        self.follow(sub, standalone_shared).await;
    }

    async fn follow(&mut self, mut sub: Subscription, standalone_shared: bool) {
        let mut owner = self.session.standalone_owner.subscribe();
        // A takeover before this subscription is seen at once.
        owner.mark_changed();
        // Not `interval(..)` + a first `tick().await`: that first tick goes
        // through the timer wheel and costs up to a millisecond per stream.
        let period = self.handles.keepalive;
        let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut catch_up = self.catch_up;
        let request_shared = self.close_on_final && self.standalone_generation.is_none() && self.handles.store.is_shared();
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
                _ = self.handles.life.shutdown.cancelled() => {
                    self.out.send(Frame::Reconnect).await;
                    return;
                }
                _ = self.session.closed.cancelled() => return,
                changed = owner.changed(), if self.standalone_generation.is_some() => {
                    if changed.is_err() || Some(*owner.borrow()) != self.standalone_generation {
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
                    self.out.send(Frame::KeepAlive).await;
                    if standalone_shared && !self.handles.replicas.renew_standalone(&self.session.id).await {
                        // Another replica's GET took over the standalone stream.
                        return;
                    }
                    if request_shared {
                        // Nobody may be left to end it: its owner died, or
                        // ended it and the store lost the final (boxed: the
                        // pump's future stays small).
                        let check = self.orphans.clone().check(self.session.clone(), self.stream.clone());
                        if let Err(e) = check.await {
                            tracing::warn!(session = %self.session.id, stream = %self.stream, error = %e, "could not check who ends a waited-on request");
                        }
                    }
                }
            }
        }
    }
}

/// This replica no longer holds the session's standalone stream when its
/// pump ends or is dropped (its client went away); the store is told in a
/// task of its own, since a drop cannot wait.
struct StandaloneMark {
    handles: Arc<Handles>,
    session: String,
}

impl Drop for StandaloneMark {
    fn drop(&mut self) {
        // Without a runtime (the process is exiting) the mark expires by itself.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (replicas, session) = (self.handles.replicas.clone(), std::mem::take(&mut self.session));
        self.handles.life.spawn(async move { replicas.unmark_standalone(&session).await });
    }
}

/// A pump for `session`, in the frames it produces: it runs as they are read.
pub(crate) fn spawn_pump(
    handles: Arc<Handles>,
    orphans: Arc<dyn Orphans>,
    session: Arc<Session>,
    spec: PumpSpec,
    sub: Subscription,
) -> Frames {
    let PumpSpec { stream, after, catch_up, close_on_final, standalone_generation, first, attachment } = spec;
    let out = Outbox(Arc::new(Mutex::new(first.into_iter().collect())));
    let pump = Pump {
        handles,
        orphans,
        session,
        stream,
        catch_up,
        close_on_final,
        standalone_generation,
        attachment,
        out: out.clone(),
        cursor: after,
    };
    Frames { outbox: out, pump: Some(Box::pin(pump.run(sub))) }
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

    /// A pump's future is allocated at its largest state for as long as its
    /// stream is open (boxed, in the stream's `Frames`). 944 bytes (catch-up
    /// boxed, the first frame not kept) fit mimalloc's 1,024-byte class;
    /// 1,304 took 1,536 bytes. A change to the pump's `select!` or its fields
    /// that crosses this line costs 256 bytes per open stream (streams_10k).
    #[test]
    fn an_idle_pump_stays_small() {
        let size = future_size(&super::Pump::run);
        assert!(size <= 1_024, "the pump's future grew to {size} bytes");
    }
}
