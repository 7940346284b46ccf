//! In-process fan-out of committed events to the connections that stream
//! them, and the count of live connections per stream (which decides where a
//! related notification goes).
//!
//! Events are published here only after the store committed them, so a
//! subscriber may always fall back to reading the store: a gap or a lag in
//! the broadcast is repaired by a range read, never by guessing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tether_store::EventKind;
use tokio::sync::broadcast;

/// Events buffered per live request stream before a slow subscriber falls
/// back to the store. A tokio broadcast channel allocates all its slots (about
/// 80 bytes each) when it is made.
const REQUEST_BUFFER: usize = 64;
/// The same for a standalone stream, which a client keeps open for as long as
/// its session lives, mostly idle: 2 slots instead of 64 save about 5 KiB per
/// open stream (streams_10k in docs/benchmarks.md). Its messages come one at
/// a time (notifications, server-to-client requests); a burst beyond 2 before
/// the pump ran is read back from the store, as any lag is (one range read).
const STANDALONE_BUFFER: usize = 2;

/// Which kind of stream a subscription is for (it sizes the live buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Request,
    Standalone,
}

#[derive(Debug, Clone)]
pub struct LiveEvent {
    pub seq: u64,
    pub kind: EventKind,
    /// `None` for an append announced by another replica: read it from the store.
    pub payload: Option<Bytes>,
}

struct Live {
    tx: broadcast::Sender<LiveEvent>,
    connections: AtomicUsize,
}

type Key = (String, String);

#[derive(Default)]
pub struct LiveHub {
    streams: Mutex<HashMap<Key, Arc<Live>>>,
}

/// A connection attached to one stream. Dropping it detaches.
pub struct Subscription {
    pub rx: broadcast::Receiver<LiveEvent>,
    hub: Arc<LiveHub>,
    key: Key,
    live: Arc<Live>,
}

impl LiveHub {
    pub fn subscribe(self: &Arc<Self>, session: &str, stream: &str, kind: StreamKind) -> Subscription {
        let capacity = match kind {
            StreamKind::Request => REQUEST_BUFFER,
            StreamKind::Standalone => STANDALONE_BUFFER,
        };
        let key = (session.to_owned(), stream.to_owned());
        let mut map = self.streams.lock();
        let live = map
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Live { tx: broadcast::channel(capacity).0, connections: AtomicUsize::new(0) }))
            .clone();
        live.connections.fetch_add(1, Ordering::SeqCst);
        let rx = live.tx.subscribe();
        Subscription { rx, hub: self.clone(), key, live }
    }

    /// Hands a committed event to whoever streams it right now.
    pub fn publish(&self, session: &str, stream: &str, event: LiveEvent) {
        let map = self.streams.lock();
        if let Some(live) = map.get(&(session.to_owned(), stream.to_owned())) {
            let _ = live.tx.send(event);
        }
    }

    /// Another replica committed `seq` on this stream.
    pub fn nudge(&self, session: &str, stream: &str, seq: u64) {
        self.publish(session, stream, LiveEvent { seq, kind: EventKind::Message, payload: None });
    }

    /// Announcements were lost: every local stream re-reads the store.
    pub fn nudge_all(&self) {
        let map = self.streams.lock();
        for live in map.values() {
            let _ = live.tx.send(LiveEvent { seq: u64::MAX, kind: EventKind::Message, payload: None });
        }
    }

    /// Connections currently streaming this stream.
    pub fn connections(&self, session: &str, stream: &str) -> usize {
        let map = self.streams.lock();
        map.get(&(session.to_owned(), stream.to_owned())).map(|l| l.connections.load(Ordering::SeqCst)).unwrap_or(0)
    }

    /// Connections on any stream of the session.
    pub fn session_connections(&self, session: &str) -> usize {
        let map = self.streams.lock();
        map.iter().filter(|((s, _), _)| s == session).map(|(_, l)| l.connections.load(Ordering::SeqCst)).sum()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.hub.streams.lock();
        if self.live.connections.fetch_sub(1, Ordering::SeqCst) == 1 {
            map.remove(&self.key);
        }
    }
}
