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
    pub id: String,
    pub principal: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub revision: u64,
    pub state: serde_json::Value,
}

/// The part of a [`SessionRecord`] that says whether a copy of it is
/// current: its revision (bumped by every state change) and its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStamp {
    pub revision: u64,
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
    pub seq: u64,
    pub kind: EventKind,
    pub payload: Bytes,
}

/// Shape of one stream's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    pub stream: String,
    pub first_seq: u64,
    pub last_seq: u64,
    pub finished: bool,
}

/// A key/value record and its revision for compare-and-set.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedValue {
    pub value: Bytes,
    pub revision: u64,
    pub expires_at_ms: Option<i64>,
}
