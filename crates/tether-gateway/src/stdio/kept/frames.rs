//! Which of a kept child's stdout frames this engine still needs (see
//! [`super`]): each frame read is needed until it is dispatched, an
//! answer's until its request's final response is stored, a parked
//! message's until it is delivered; the keeper is told every frame up to
//! the first one still needed ([`Frames::release`] moves the watermark).
//! Memory: one entry per frame still needed, and the keeper sends no more
//! than the child's `hold_bytes` of frames unacknowledged.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// Which of a child's stdout frames are still needed (see the module doc).
pub(crate) struct Frames {
    state: Mutex<Book>,
    /// Answers' frames held for their requests (by upstream request ID).
    holds: Mutex<HashMap<u64, FrameHold>>,
    /// Requests this engine left to the next one (its drain ran out): their
    /// answers, when they come, stay unacknowledged for it.
    left: Mutex<std::collections::HashSet<u64>>,
    acks: watch::Sender<u64>,
}

#[derive(Default)]
struct Book {
    /// The highest frame read.
    read: u64,
    /// Frames still needed, and by how many holders.
    needed: BTreeMap<u64, u32>,
}

impl Frames {
    /// The book of a child whose acknowledgements go to `acks`.
    pub(super) fn new(acks: watch::Sender<u64>) -> Self {
        Self { state: Mutex::new(Book::default()), holds: Mutex::default(), left: Mutex::default(), acks }
    }

    pub(super) fn seen(&self, frame: u64) {
        let mut book = self.state.lock();
        book.read = book.read.max(frame);
        *book.needed.entry(frame).or_default() += 1;
    }

    /// One more holder of `frame`.
    pub(super) fn hold(self: &Arc<Self>, frame: u64) -> FrameHold {
        *self.state.lock().needed.entry(frame).or_default() += 1;
        FrameHold { _held: Arc::new(HoldInner { frames: self.clone(), frame }) }
    }

    pub(super) fn release(&self, frame: u64) {
        let upto = {
            let mut book = self.state.lock();
            if let Some(count) = book.needed.get_mut(&frame) {
                *count -= 1;
                if *count == 0 {
                    book.needed.remove(&frame);
                }
            }
            match book.needed.keys().next() {
                Some(first) => first - 1,
                None => book.read,
            }
        };
        self.acks.send_if_modified(|acked| {
            let advanced = upto > *acked;
            if advanced {
                *acked = upto;
            }
            advanced
        });
    }

    /// The frame being dispatched holds the answer of request `id`.
    pub(crate) fn hold_answer(self: &Arc<Self>, id: u64) {
        // Only the reader dispatches, one frame at a time: the frame is the last seen.
        let frame = self.state.lock().read;
        let hold = self.hold(frame);
        self.holds.lock().insert(id, hold);
    }

    /// Request `id` is left to the next engine (see [`Frames::left`]).
    pub(crate) fn leave_answer(&self, id: u64) {
        self.left.lock().insert(id);
    }

    /// Whether request `id` was left to the next engine.
    pub(crate) fn is_left(&self, id: u64) -> bool {
        self.left.lock().contains(&id)
    }

    /// The hold on request `id`'s answer, for its request to let go of.
    pub(crate) fn take_hold(&self, id: u64) -> Option<FrameHold> {
        self.holds.lock().remove(&id)
    }
}

/// Keeps a frame from being acknowledged while alive.
#[derive(Clone)]
pub(crate) struct FrameHold {
    _held: Arc<HoldInner>,
}

struct HoldInner {
    frames: Arc<Frames>,
    frame: u64,
}

impl Drop for HoldInner {
    fn drop(&mut self) {
        self.frames.release(self.frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> (Arc<Frames>, watch::Receiver<u64>) {
        let (acks, acked) = watch::channel(0);
        (Arc::new(Frames::new(acks)), acked)
    }

    #[test]
    fn a_frame_is_acknowledged_only_once_nothing_before_it_is_still_held() {
        let (frames, acked) = frames();
        // Frame 1: a notification, delivered (stored) at once.
        frames.seen(1);
        frames.release(1);
        assert_eq!(*acked.borrow(), 1);
        // Frame 2: an answer whose final response is not stored yet.
        frames.seen(2);
        frames.hold_answer(7);
        frames.release(2);
        assert_eq!(*acked.borrow(), 1, "the answer's frame waits for its request");
        // Frames 3 and 4 are done, but 2 is not: nothing past 1 is acknowledged.
        for f in [3, 4] {
            frames.seen(f);
            frames.release(f);
        }
        assert_eq!(*acked.borrow(), 1);
        // The request's final response is stored: everything up to 4 goes.
        drop(frames.take_hold(7));
        assert_eq!(*acked.borrow(), 4);
        assert!(frames.take_hold(7).is_none(), "a hold is taken once");
    }

    #[test]
    fn a_hold_shared_by_clones_goes_with_the_last_one() {
        let (frames, acked) = frames();
        frames.seen(1);
        let hold = frames.hold(1);
        let parked = hold.clone();
        frames.release(1);
        drop(hold);
        assert_eq!(*acked.borrow(), 0, "a parked copy still holds it");
        drop(parked);
        assert_eq!(*acked.borrow(), 1);
    }
}
