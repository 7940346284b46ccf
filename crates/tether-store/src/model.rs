//! Plain records that the store keeps.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, the store's only clock unit.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// One MCP session as stored. `state` belongs to the engine (negotiated
/// version, client capabilities, application context); the store only
/// compares its `revision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session ID (`Mcp-Session-Id`).
    pub id: String,
    /// Who the session belongs to.
    pub principal: String,
    /// When it was created, in Unix milliseconds.
    pub created_at_ms: i64,
    /// When it expires unless used, in Unix milliseconds.
    pub expires_at_ms: i64,
    /// Bumped by every change of `state`; compare-and-set compares it.
    pub revision: u64,
    /// The engine's state of the session, opaque to the store.
    pub state: serde_json::Value,
}

/// The part of a [`SessionRecord`] that says whether a copy of it is
/// current: its revision (bumped by every state change) and its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStamp {
    /// The record's revision.
    pub revision: u64,
    /// The record's expiry, in Unix milliseconds.
    pub expires_at_ms: i64,
}

/// What an event is, as far as replay cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum EventKind {
    /// The first event of a stream: carries only an ID for the client, and
    /// for the server the stream's metadata.
    Prime = 0,
    /// A notification or server-to-client request.
    Message = 1,
    /// The response that ends a request stream.
    Final = 2,
}

impl EventKind {
    /// The kind stored as `v`; `None` for a value no kind has.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Prime),
            1 => Some(Self::Message),
            2 => Some(Self::Final),
            _ => None,
        }
    }
}

/// One event of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Its place in the stream: 1 for the first event, then strictly increasing.
    pub seq: u64,
    /// What it is for replay.
    pub kind: EventKind,
    /// The JSON-RPC message as sent (a priming event: its metadata).
    pub payload: Bytes,
}

/// Shape of one stream's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The stream's name within its session.
    pub stream: String,
    /// The oldest event kept (older ones were trimmed).
    pub first_seq: u64,
    /// The newest event.
    pub last_seq: u64,
    /// Whether its final event is stored.
    pub finished: bool,
}

/// A key/value record and its revision for compare-and-set.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedValue {
    /// The value.
    pub value: Bytes,
    /// Its revision: what a compare-and-set names to replace it.
    pub revision: u64,
    /// When it expires, in Unix milliseconds; `None`: never.
    pub expires_at_ms: Option<i64>,
}
