//! The request streams this process runs now, and those it ended lately
//! ([`RunningStreams`]).
//!
//! A request's stream is entered when its work is started (or carried on
//! after a crash) and left once its final response was stored or given up;
//! the [`Running`] guard lives in the request's task, so leaving cannot be
//! forgotten. Keyed by stream name (random, unique), not by the JSON-RPC id
//! the session's in-flight slots use: a client may reuse an id once its
//! request ended, and a stream is what recovery looks at. A stream whose
//! priming event was stored (a client may hold its ID without the final
//! response) is kept as ended for a while ([`ENDED_KEPT`], at most
//! [`ENDED_FOR`]), with its request's id and the highest sequence number
//! the store gave it.
//!
//! Invariant: a stream that this process owns and has left is one it
//! ended. If the store shows no final response on it, or no stream at all,
//! the store lost what it was given (a Redis failover under `normal`
//! durability takes back what the replica had not copied) and nothing would
//! ever end the stream: recovery ends it with [`super::LOST_MESSAGE`]
//! (`engine/recovery.rs`). A stream the store lost altogether while its
//! request runs here is started again with its priming event. Guarded by
//! the `a_final_lost_in_a_failover_…`, `a_final_lost_with_its_priming_event_…`
//! and `a_request_whose_priming_event_was_lost_…` tests
//! (`tests/redis_failover.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use super::request_stream::RequestStream;

/// Ended streams kept at most (about 150 bytes each)...
const ENDED_KEPT: usize = 16_384;
/// ...and for at most this long: a failover takes back only what its
/// replica had not copied, and a client resumes a stream that broke at once.
const ENDED_FOR: Duration = Duration::from_secs(600);

/// Streams of this process whose request has not ended yet, and those it ended lately.
#[derive(Default)]
pub(crate) struct RunningStreams {
    registry: Mutex<Registry>,
    /// Held while this process ends a request whose final the store lost,
    /// so that two clients resuming it at once do not end it twice.
    pub(crate) ending_lost: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Registry {
    streams: HashMap<Arc<str>, Entry>,
    /// The streams kept as ended, oldest first.
    ended: VecDeque<(Instant, Arc<str>)>,
}

enum Entry {
    Running { stream: Arc<RequestStream>, session: u64 },
    Ended { request_id: Value, last_seq: u64, session: u64 },
}

/// What this process knows of a request stream of a session.
pub(crate) enum Known {
    /// Its request runs here.
    Running(Arc<RequestStream>),
    /// Its request ended here: the final response was stored after `last_seq`.
    Ended { request_id: Value, last_seq: u64 },
}

/// A session ID in a word, so an entry costs no copy of it: a stream is
/// only told about to a client of its own session.
fn session_tag(session: &str) -> u64 {
    session.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

impl RunningStreams {
    /// Marks `stream` (a request of `session`) as running here until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, stream: &Arc<RequestStream>, session: &str) -> Running {
        let name: Arc<str> = Arc::from(stream.name.as_str());
        let entry = Entry::Running { stream: stream.clone(), session: session_tag(session) };
        self.registry.lock().streams.insert(name.clone(), entry);
        Running { streams: self.clone(), name }
    }

    /// Whether this process is running the request of `stream`.
    pub(crate) fn contains(&self, stream: &str) -> bool {
        matches!(self.registry.lock().streams.get(stream), Some(Entry::Running { .. }))
    }

    /// Whether this process runs or ran lately the request of `stream` (of any session).
    pub(crate) fn knows(&self, stream: &str) -> bool {
        self.registry.lock().streams.contains_key(stream)
    }

    /// What this process knows of `stream` of `session`.
    pub(crate) fn known(&self, session: &str, stream: &str) -> Option<Known> {
        let tag = session_tag(session);
        match self.registry.lock().streams.get(stream)? {
            Entry::Running { stream, session } if *session == tag => Some(Known::Running(stream.clone())),
            Entry::Ended { request_id, last_seq, session } if *session == tag => {
                Some(Known::Ended { request_id: request_id.clone(), last_seq: *last_seq })
            }
            _ => None,
        }
    }
}

impl Registry {
    /// `name`'s request ended: kept if a client may hold an ID of it.
    fn leave(&mut self, name: &Arc<str>, now: Instant) {
        let Some(Entry::Running { stream, session }) = self.streams.remove(name) else { return };
        if stream.prime_stored() {
            let entry = Entry::Ended { request_id: stream.request_id().clone(), last_seq: stream.last_seq(), session };
            self.streams.insert(name.clone(), entry);
            self.ended.push_back((now, name.clone()));
        }
        while let Some((at, oldest)) = self.ended.front() {
            if self.ended.len() <= ENDED_KEPT && now.duration_since(*at) < ENDED_FOR {
                break;
            }
            if matches!(self.streams.get(oldest), Some(Entry::Ended { .. })) {
                self.streams.remove(oldest);
            }
            self.ended.pop_front();
        }
    }
}

/// A request stream running here; leaves [`RunningStreams`] when dropped.
pub(crate) struct Running {
    streams: Arc<RunningStreams>,
    name: Arc<str>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.streams.registry.lock().leave(&self.name, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stream(name: &str, id: u64) -> Arc<RequestStream> {
        RequestStream::new(name.to_owned(), json!(id), "tools/call").0
    }

    #[test]
    fn a_stream_runs_until_its_guard_drops() {
        let streams = Arc::new(RunningStreams::default());
        let running = streams.enter(&stream("r1", 1), "s");
        assert!(streams.contains("r1"));
        assert!(!streams.contains("r2"));
        assert!(matches!(streams.known("s", "r1"), Some(Known::Running(_))));
        assert!(streams.known("other", "r1").is_none(), "told only to a client of its session");
        drop(running);
        assert!(!streams.contains("r1"));
        assert!(!streams.knows("r1"), "a quick request's stream (never primed) is forgotten");
    }

    #[test]
    fn a_primed_stream_is_kept_as_ended_with_its_id_and_last_number() {
        let streams = Arc::new(RunningStreams::default());
        let primed = stream("r1", 7);
        primed.handed_out(1, true);
        primed.handed_out(3, false);
        drop(streams.enter(&primed, "s"));
        assert!(!streams.contains("r1"));
        match streams.known("s", "r1") {
            Some(Known::Ended { request_id, last_seq }) => assert_eq!((request_id, last_seq), (json!(7), 3)),
            _ => panic!("an ended primed stream is kept"),
        }
    }

    #[test]
    fn ended_streams_are_kept_within_their_bounds() {
        let mut registry = Registry::default();
        let start = Instant::now();
        for i in 0..ENDED_KEPT + 10 {
            let s = stream(&format!("r{i}"), i as u64);
            s.handed_out(1, true);
            let name: Arc<str> = Arc::from(s.name.as_str());
            registry.streams.insert(name.clone(), Entry::Running { stream: s, session: 0 });
            registry.leave(&name, start);
        }
        assert_eq!(registry.ended.len(), ENDED_KEPT);
        assert_eq!(registry.streams.len(), ENDED_KEPT);
        assert!(!registry.streams.contains_key("r0"), "the oldest goes first");
        // Time passes: the next end lets every old one go.
        let s = stream("late", 0);
        s.handed_out(1, true);
        let name: Arc<str> = Arc::from("late");
        registry.streams.insert(name.clone(), Entry::Running { stream: s, session: 0 });
        registry.leave(&name, start + ENDED_FOR + Duration::from_secs(1));
        assert_eq!(registry.streams.len(), 1);
        assert_eq!(registry.ended.len(), 1);
    }
}
