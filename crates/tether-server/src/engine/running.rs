//! The request streams this process is running ([`RunningStreams`]).
//!
//! A request's stream is entered when its work is started (or carried on
//! after a crash) and left once its final response was stored or given up;
//! the [`Running`] guard lives in the request's task, so leaving cannot be
//! forgotten.
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

/// Streams of this process whose request has not ended yet, by session.
#[derive(Default)]
pub(crate) struct RunningStreams {
    /// `(session, stream)`; stream names are unique, the session keeps the
    /// key readable in a debugger.
    streams: Mutex<HashSet<(String, String)>>,
}

impl RunningStreams {
    /// Marks `stream` of `session` as running here until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, session: &str, stream: &str) -> Running {
        let key = (session.to_owned(), stream.to_owned());
        self.streams.lock().insert(key.clone());
        Running { streams: self.clone(), key }
    }

    /// Whether this process is running the request of `stream`.
    pub(crate) fn contains(&self, session: &str, stream: &str) -> bool {
        // A borrowed lookup would need a second key type; the check runs on
        // resumes and keep-alives, not per event.
        self.streams.lock().contains(&(session.to_owned(), stream.to_owned()))
    }
}

/// A request stream running here; leaves [`RunningStreams`] when dropped.
pub(crate) struct Running {
    streams: Arc<RunningStreams>,
    key: (String, String),
}

impl Drop for Running {
    fn drop(&mut self) {
        self.streams.streams.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_runs_until_its_guard_drops() {
        let streams = Arc::new(RunningStreams::default());
        let running = streams.enter("s1", "r1");
        assert!(streams.contains("s1", "r1"));
        assert!(!streams.contains("s1", "r2") && !streams.contains("s2", "r1"));
        drop(running);
        assert!(!streams.contains("s1", "r1"));
    }
}
