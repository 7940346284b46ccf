//! Identifiers: session IDs, stream names and the event IDs clients see.
//!
//! Stream names are `[a-z0-9]+` only, so an event ID `<stream>.<seq>` splits
//! at its one `.` without ambiguity. Standalone and request streams both get
//! random names, so an event ID of one session is unknown in every other.

use std::fmt;

/// 192 random bits as 48 lowercase hex characters (visible ASCII).
pub fn new_session_id() -> String {
    hex::encode(rand::random::<[u8; 24]>())
}

/// A request stream's name: `r`, then the time in milliseconds (11 hex
/// digits), then 64 random bits. The time prefix puts new streams at the end
/// of the store's (stream, session, seq) order, so a commit's writes touch
/// the same few pages, and lets old finished streams be dropped by name
/// range; the random part keeps names unguessable.
pub fn new_request_stream() -> String {
    let ms = tether_store::now_ms().max(0) as u64 & 0xfff_ffff_ffff;
    format!("r{ms:011x}{}", hex::encode(rand::random::<[u8; 8]>()))
}

/// The request stream names (`[from, below)`) of requests started before `ms`.
pub fn request_streams_started_before(ms: i64) -> (&'static str, String) {
    ("r", format!("r{:011x}", ms.max(0) as u64 & 0xfff_ffff_ffff))
}

/// A session's standalone (GET) stream name: `g` + 64 random bits.
pub fn new_standalone_stream() -> String {
    format!("g{}", hex::encode(rand::random::<[u8; 8]>()))
}

/// Instance ID of this process, recorded as the owner of the requests it runs.
pub fn new_instance_id() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

/// What a client sends back in `Last-Event-ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventId {
    /// The stream's name.
    pub stream: String,
    /// The event's number in it.
    pub seq: u64,
}

impl EventId {
    /// The ID of event `seq` of `stream`.
    pub fn new(stream: &str, seq: u64) -> Self {
        Self { stream: stream.to_owned(), seq }
    }

    /// Parses `<stream>.<seq>`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        let (stream, seq) = s.split_once('.')?;
        if stream.len() < 2 || stream.len() > 64 || !stream.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return None;
        }
        if seq.is_empty() || seq.len() > 20 || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self { stream: stream.to_owned(), seq: seq.parse().ok()? })
    }

    /// Whether it names a request's stream (not the standalone one).
    pub fn is_request_stream(&self) -> bool {
        self.stream.starts_with('r')
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.stream, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_roundtrip_and_reject_junk() {
        let id = EventId::new(&new_request_stream(), 42);
        assert_eq!(EventId::parse(&id.to_string()), Some(id));
        for bad in ["", ".", "r1", "r1.", ".5", "R1.5", "r_1.5", "r1.5.6", "r1.-5", "r1.99999999999999999999999", "g.1"] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn request_streams_sort_by_the_time_they_started() {
        let named = new_request_stream();
        let now = tether_store::now_ms();
        let (from, below) = request_streams_started_before(now + 1);
        assert!(from <= named.as_str() && named.as_str() < below.as_str(), "{named} in [{from}, {below})");
        let (_, earlier) = request_streams_started_before(now - 1_000);
        assert!(named.as_str() >= earlier.as_str(), "{named} started after {earlier}");
        assert!(new_standalone_stream().as_str() < from, "standalone streams are outside the range");
    }

    #[test]
    fn session_ids_are_long_visible_ascii_and_distinct() {
        let a = new_session_id();
        assert_eq!(a.len(), 48);
        assert!(a.bytes().all(|b| (0x21..=0x7e).contains(&b)));
        assert_ne!(a, new_session_id());
    }
}
