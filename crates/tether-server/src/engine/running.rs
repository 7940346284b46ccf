//! The request streams this process is running ([`RunningStreams`]).
//!
//! A request's stream is entered when its work is started (or carried on
//! after a crash) and left once its final response was stored or given up;
//! the [`Running`] guard lives in the request's task, so leaving cannot be
//! forgotten. Keyed by stream name (random, unique), not by the JSON-RPC id
//! the session's in-flight slots use: a client may reuse an id once its
//! request ended, and a stream is what recovery looks at.
//!
//! Invariant: a stream that this process owns and has left is one it
//! ended. If the store shows no final response on it, the store lost that
//! response (a Redis failover under `normal` durability takes back what the
//! replica had not copied) and nothing would ever end the stream: recovery
//! ends it with [`super::LOST_MESSAGE`] (`engine/recovery.rs`). Guarded by
//! the `a_final_lost_in_a_failover_…` tests (`tests/redis_failover.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

/// Streams of this process whose request has not ended yet.
#[derive(Default)]
pub(crate) struct RunningStreams {
    streams: Mutex<HashSet<Arc<str>>>,
}

impl RunningStreams {
    /// Marks `stream` as running here until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, stream: &str) -> Running {
        let stream: Arc<str> = Arc::from(stream);
        self.streams.lock().insert(stream.clone());
        Running { streams: self.clone(), stream }
    }

    /// Whether this process is running the request of `stream`.
    pub(crate) fn contains(&self, stream: &str) -> bool {
        self.streams.lock().contains(stream)
    }
}

/// A request stream running here; leaves [`RunningStreams`] when dropped.
pub(crate) struct Running {
    streams: Arc<RunningStreams>,
    stream: Arc<str>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.streams.streams.lock().remove(&self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_runs_until_its_guard_drops() {
        let streams = Arc::new(RunningStreams::default());
        let running = streams.enter("r1");
        assert!(streams.contains("r1"));
        assert!(!streams.contains("r2"));
        drop(running);
        assert!(!streams.contains("r1"));
    }
}
